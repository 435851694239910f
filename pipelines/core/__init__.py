"""What every pipeline stands on: the stage contract and its Ray wiring, the table
schemas and stable ids, Parquet IO with resumable sharded outputs, the inputs several
capabilities read, and (in `llm/`) the LLM side every LLM-backed job shares. Nothing in
core imports another pipelines package."""
