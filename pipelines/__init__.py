"""Stages and their Ray Data wiring: schemas, IO, ingest, splits and the jobs' pipelines."""
