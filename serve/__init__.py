"""Ray Serve deployments wrapping models/ (NLI, LLM judge, embedder)."""
