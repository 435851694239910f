"""Test doubles shared across the tests, and only here (never on a product path):
scripted LLM, NLI and pair scorers, a hashing sentence encoder, tiny randomly initialised
checkpoints of the real architectures, and planted datasets with a known answer."""
