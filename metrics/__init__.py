"""Pure metric functions and their registry; no Ray inside."""
