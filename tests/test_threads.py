"""rexeval/threads.py: the cap on a process's torch and FAISS threads."""
from __future__ import annotations

import pytest

from rexeval.threads import MAX_THREADS_ENV, cpu_threads, max_threads


def test_without_a_cap_a_process_gets_what_it_was_given_and_at_least_one(monkeypatch):
    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    assert max_threads() is None
    assert [cpu_threads(n) for n in (0, 0.5, 1, 2, 3.0, 16)] == [1, 1, 1, 2, 3, 16]


def test_the_cap_lowers_what_is_above_it_only(monkeypatch):
    monkeypatch.setenv(MAX_THREADS_ENV, " 2 ")
    assert max_threads() == 2
    assert [cpu_threads(n) for n in (0, 1, 2, 3, 16)] == [1, 1, 2, 2, 2]


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_cap_that_is_not_a_positive_whole_number_is_refused_by_name(monkeypatch, bad):
    monkeypatch.setenv(MAX_THREADS_ENV, bad)
    with pytest.raises(ValueError, match=f"{MAX_THREADS_ENV}='{bad}'"):
        cpu_threads(2)
