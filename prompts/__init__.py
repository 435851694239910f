"""Prompt templates and domain topic tables as data files, plus their loader."""
