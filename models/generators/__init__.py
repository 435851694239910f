"""Trained explanation generators (seed 000's NRT, Att2Seq, PETER and CER): torch
modules, their word-level vocabulary, and batched greedy / beam decoding. No Ray here."""

SCAN = ("rexeval.models.generators", "@register_generator")
"""Where the generators' registry finds its modules, and `--help` their names (read, not imported)."""

NORMALIZE = str.lower
"""How the generators' registry keys a name (so "PETER" is "peter"), and the source-read
facts (`models/generators/declared.py`) alike."""
