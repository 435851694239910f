"""Seed 003's Table 1 baselines: text-overlap metrics of each explanation against its
item's reviews, to be correlated with the human ratings beside ExpScore's heads.

The paper keeps each item's human reviews as the reference corpus for BLEU and the
like (section 2.1, source data preparation) and sets BLEU, ROUGE and METEOR beside
ExpScore against the ratings (section 4, Table 1). It does not say which n-gram order or ROUGE variant, nor how several reviews
are combined; our choices:
- BLEU-4 per explanation (`text_overlap.sentence_bleu`, method-1 smoothing), every
  review of the item a reference (BLEU is defined on several references);
- ROUGE-1, ROUGE-2 and ROUGE-L F1 against the best-matching review (ROUGE compares two
  texts; the highest F1 over the item's reviews, as multi-reference ROUGE usually does);
- METEOR by NLTK with every review a reference (NLTK keeps the best), when NLTK and its
  WordNet data are installed; otherwise it is reported unavailable, with the reason.
The reviews are the ones the factors read (at most `max_reviews_per_item` per item).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rexeval.metrics.text_overlap import meteor, meteor_unavailable_reason, rouge_scores, sentence_bleu

BASELINES = ("BLEU-4", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR")
_ROUGE = {"ROUGE-1": "1", "ROUGE-2": "2", "ROUGE-L": "l"}  # name -> `rouge_scores` variant


def available_baselines() -> tuple[list[str], dict[str, str]]:
    """The baselines this machine can compute, and why the others cannot run."""
    why = meteor_unavailable_reason()
    return ([b for b in BASELINES if b != "METEOR" or why is None],
            {} if why is None else {"METEOR": why})


def baseline_values(explanations: Sequence[str], reviews: Sequence[Sequence[str]],
                    names: Sequence[str]) -> dict[str, np.ndarray]:
    """Each named baseline per explanation (float64 arrays); NaN where the item has no
    review to compare with."""
    out = {name: np.full(len(explanations), np.nan) for name in names}
    rouge = [n for n in names if n in _ROUGE]
    for i, (text, refs) in enumerate(zip(explanations, reviews)):
        refs = [r for r in refs if r and r.strip()]
        if not refs:
            continue
        if "BLEU-4" in out:
            out["BLEU-4"][i] = sentence_bleu(text, refs, max_n=4)
        if rouge:
            per_ref = rouge_scores([text] * len(refs), refs, variants=[_ROUGE[n] for n in rouge])
            for n in rouge:
                out[n][i] = float(per_ref[f"rouge-{_ROUGE[n]}-f"].max())
        if "METEOR" in out:
            out["METEOR"][i] = meteor(text, refs)
    return out
