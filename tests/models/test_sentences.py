"""Review sentence splitting (models/sentences.py), as EXTRA and SummaC use it."""
from __future__ import annotations

import sys

import pytest

from rexeval.models import sentences as sn


def test_split_sentences_review_text():
    """Punkt splits the review; "!"/"?" runs and line breaks end sentences too."""
    text = "Good Job ! Great quality toy. I bought it for my son... He loves it!!!"
    assert sn.split_sentences(text) == [
        "Good Job !", "Great quality toy.", "I bought it for my son...", "He loves it!!!"]
    assert sn.split_sentences("Works great! it really does.\nFive stars") == [
        "Works great!", "it really does.", "Five stars"]
    assert sn.split_sentences("Is it loud?? no.") == ["Is it loud??", "no."]


def test_split_sentences_glued_ends_and_abbreviations():
    """A missing space after a sentence end is common in reviews; "e.g." ends nothing."""
    assert sn.split_sentences("Quite affordable.It fits well. wow!!great") == [
        "Quite affordable.", "It fits well.", "wow!!", "great"]
    assert sn.split_sentences("Strings, picks, etc. are in the box. Fits e.g. a No. 5 bag.") == [
        "Strings, picks, etc.", "are in the box.", "Fits e.g. a No. 5 bag."]
    assert sn.split_sentences("") == [] and sn.split_sentences(None) == []
    assert sn.split_sentences("  \n\n ") == []


def test_split_sentences_fallback_without_punkt(monkeypatch):
    """Without the punkt package a regex splitter is used, with a warning."""
    monkeypatch.setitem(sys.modules, "punkt", None)  # import punkt -> ImportError
    with pytest.warns(RuntimeWarning, match="regex splitter"):
        assert sn._punkt_tokenizer.__wrapped__() is None
    monkeypatch.setattr(sn, "_punkt_tokenizer", lambda: None)
    assert sn.split_sentences("Good Job ! Great quality toy. Nice\nsecond line") == [
        "Good Job !", "Great quality toy.", "Nice", "second line"]
