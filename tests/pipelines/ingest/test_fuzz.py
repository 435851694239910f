"""Fuzzing ingest: malformed review files never end in a traceback and lose nothing.

Hypothesis writes review files from records it builds (tests/doubles/review_fuzz.py):
JSON lines and CSV, valid records in their accepted spellings and records broken in
known ways (bad JSON, wrong types, extreme numbers, NUL bytes, lone surrogates, deep
nesting, unclosed and stray quotes, wrong field counts, invalid UTF-8, random bytes),
with byte order marks, CRLF line ends, blank lines, gzip cut short and binary tails,
cut into parse tasks of a few dozen bytes or read whole. Each file goes through the
pure functions (detect_layout -> plan_file -> parse_chunk -> normalise), without Ray.

What is asserted (`review_fuzz.check`, falsifiable, and counted without asking the
parser what the input held): no exception escapes; rows in = reviews + error rows;
every error row names the file, a line >= 1 and a message; every record written whole
and valid comes out as a review with the values and line written (unless it follows
the end of what a cut gzip stream yields, or a CSV quote that may swallow the records
after it, which a newline inside quotes makes legal); no review comes from a record
written broken; clean JSON lines give one row in per non-blank line and a cut gzip
file exactly one "reading stopped" row; auto-detection agrees with the explicit
format or refuses with a message naming the file, and must agree on a clean file
whose first record is valid. benchmarks/bench_ingest_fuzz.py runs thousands.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.doubles.review_fuzz import check, fuzz_files

FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _run(ff) -> None:
    with tempfile.TemporaryDirectory(prefix="rexeval-fuzz-") as folder:
        outcome = check(ff, Path(folder))
    assert not outcome.problems, f"{ff.describe()}\n" + "\n".join(outcome.problems)


@pytest.mark.slow
@FUZZ
@given(fuzz_files("json"))
def test_fuzzed_json_lines_lose_nothing(ff):
    _run(ff)


@pytest.mark.slow
@FUZZ
@given(fuzz_files("csv"))
def test_fuzzed_csv_loses_nothing(ff):
    _run(ff)
