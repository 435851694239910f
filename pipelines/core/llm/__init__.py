"""The LLM side of every LLM-backed job: its settings (`job`), bounded-retry calls
(`calls`), where each model runs (`placement`) and its plan (`calls_plan`), the engines a
job starts once (`engines`), the one streaming path every LLM job's rows go through
(`stream`), jobs in resumable chunks on that path (`chunks`), and the call cache (`cache`).
Part of core: it imports no capability package."""
