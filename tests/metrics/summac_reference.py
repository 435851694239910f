"""Run the `summac` package (0.0.4) offline on a local NLI checkpoint, for equality tests.

The package cannot run here as shipped: its model names point at the hub, it calls the
tokenizer method `batch_encode_plus` (gone in transformers 5), and it splits with NLTK's
`sent_tokenize` (needs NLTK data we do not have). `patch_summac` fixes the three for one
test only, through pytest's monkeypatch, and leaves the package's own math untouched
(its length filter on sentences included).
"""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace


class PairTokenizer:
    """Stands in for the loaded tokenizer: `batch_encode_plus(list of (premise,
    hypothesis))` becomes a call with two text lists; other attributes pass through.
    transformers 4 ignored `truncation_strategy` when `truncation=True` was given (the
    package passes both), so the shim drops it too."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def batch_encode_plus(self, pairs, truncation_strategy=None, **kwargs):
        premises = [p for p, _ in pairs]
        hypotheses = [h for _, h in pairs]
        return self._tokenizer(premises, hypotheses, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def patch_summac(monkeypatch, name: str, model_dir, *, entailment_idx: int,
                 contradiction_idx: int, split: Callable[[str], list[str]], double: bool = False):
    """Register `model_dir` as summac model `name` and make the package runnable offline.

    `split` replaces NLTK's `sent_tokenize`; the package still drops sentences of 10
    characters or fewer after it. Returns the patched `summac.model_summac` module.
    `double` runs its NLI model in float64: a test comparing it with ours (also float64)
    then cannot see batching or thread order move a probability across a histogram bin.
    """
    import summac.model_summac as ms

    monkeypatch.setitem(ms.model_map, name, {"model_card": str(model_dir),
                                             "entailment_idx": entailment_idx,
                                             "contradiction_idx": contradiction_idx})
    monkeypatch.setattr(ms, "nltk", SimpleNamespace(tokenize=SimpleNamespace(sent_tokenize=split)))
    load_nli = ms.SummaCImager.load_nli

    def load_nli_offline(self):
        load_nli(self)
        self.tokenizer = PairTokenizer(self.tokenizer)
        if double:
            self.model = self.model.double()

    monkeypatch.setattr(ms.SummaCImager, "load_nli", load_nli_offline)
    return ms
