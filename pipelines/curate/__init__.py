"""Curate: a selection step between ingest and the generators; seed 004's ALERT dataset
(section 3.1: 5-star purchases, titled items, users with 5-20 purchases, a seeded sample
of at most 200 users per category)."""
