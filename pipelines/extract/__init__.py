"""Statements from reviews: an LLM extracts statement-topic-sentiment triplets (seed 000)
or candidates that a second pass verifies (seed 002, STAR); strict output models with
repair and bounded retries; an LLM judge rates extraction quality (seed 002, Table 2);
and seed 000's rule-based ground-truth explanations built from the triplets."""
