"""What every pipeline stands on: the stage contract and its Ray wiring, the table
schemas and stable ids, Parquet IO with resumable sharded outputs, the inputs several
capabilities read, and the LLM settings every LLM-backed job shares. Nothing in core
imports another pipelines package."""
