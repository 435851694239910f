"""Ingest: review files in the Amazon layouts (2014/2018 JSON lines, 2023 JSONL, the
Kaggle CSV) or any table -> validated REVIEWS shards and error rows; item titles from
metadata; iterative k-core and the splits (seed 000's temporal 80/10/10, seed 002's
leave-last-two); dataset statistics in seed 000's Table II layout."""
