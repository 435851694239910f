"""Learned and likelihood-based reference metrics: BARTScore and BLEURT (seed 000, IV.A.5).

Both compare a generated explanation with its ground-truth explanation through a
pre-trained model, one float64 value per interaction (input order), higher is better.
Neither picks a model: the caller passes a *location* (a local Hugging Face folder, or a
hub id on machines with hub access; `models.refs` resolution). No PyPI package ships a
BART or BLEURT checkpoint, so the `local` profile has none and these metrics run only
when the user supplies one; the tests use tiny random models of the right architecture.
This module is the metrics (directions, input checks, registration); the models
(`BartScorer`, `BleurtScorer`: loading, batching, forward passes, and the per-process
cache `get_bartscorer` / `get_bleurt_scorer`) live in `models.encoders.bart_bleurt`.
Batches there are padded with a mask, so a pair's score does not depend on the batch it
lands in (equal up to float rounding, ~1e-6).

BARTScore (Yuan, Neubig & Liu, 2021)
------------------------------------
Text evaluation as text generation: with a sequence-to-sequence model (BART), the score
of a target y given a source x is the average per-token log-likelihood

    BARTScore(x -> y) = (1 / |y|) * sum_t log p(y_t | y_<t, x)

over the target's tokens as the tokenizer writes them (for BART: <s> ... </s>, both
special tokens included, as in the authors' scorer). The decoder reads the target shifted
right behind the model's `decoder_start_token_id` (teacher forcing); padding positions are
neither predicted nor counted. Values are <= 0 (around -3 to -4 for BART-large on the
seed's explanations, Table VI). Texts are truncated to the model's length limit (1024
tokens for BART).

`direction` (the paper's names in brackets; h = generated explanation, r = reference):
- "gen_to_ref" (default; recall, h -> r): log p(reference | generated). The seed reports
  BARTScore as "the generated text better predicts the reference", i.e. this direction.
- "ref_to_gen" (precision, r -> h): log p(generated | reference).
- "f" (F score, r <-> h): the paper defines it as the *arithmetic* mean of precision and
  recall, (gen_to_ref + ref_to_gen) / 2, not a harmonic mean (both are negative).
Empty texts are scored as they are (the model still reads or predicts the special
tokens), as the authors' scorer does; an empty *target* therefore scores only its
special tokens, which can be high: look at empty explanations separately.

BLEURT (Sellam, Das & Parikh, 2020)
-----------------------------------
A BERT-style encoder fine-tuned to regress human ratings: the model reads the pair
"[CLS] reference [SEP] candidate [SEP]" and its single regression output is the score
(raw logit, no squashing; BLEURT-20 gives roughly 0..1, older checkpoints may go below
0, as the seed's negative Table VI values show). Pairs longer than the model's limit are
truncated, the longer text first. Which checkpoints load, and how (the BLEURT-PyTorch
ports through the optional `bleurt_pytorch` package; classifiers refused with a
ValueError: BLEURT is a regression), is `models.encoders.bart_bleurt`'s docstring.
Empty texts are scored as they are.

Registered names (per example, higher is better): "bartscore", "bleurt".
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rexeval.metrics.registry import register_metric
from rexeval.metrics.similarity import _check_pairs
from rexeval.models.encoders.bart_bleurt import get_bartscorer, get_bleurt_scorer

BARTSCORE_DIRECTIONS = ("gen_to_ref", "ref_to_gen", "f")
_TEXT_INPUTS = ("generated_explanations", "reference_explanations")


def _check_batch_size(batch_size: int) -> int:
    size = int(batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return size


# ------------------------------------------------------------------------ BARTScore

def bartscore_pairs(sources: Sequence[str], targets: Sequence[str], model_location: str, *,
                    device: str = "cpu", batch_size: int = 16) -> np.ndarray:
    """BARTScore(source -> target) per pair: mean log p(target token | ...), float64."""
    srcs, tgts = _check_pairs(sources, targets)
    size = _check_batch_size(batch_size)
    if not srcs:
        return np.zeros(0, dtype=np.float64)
    return get_bartscorer(model_location, device).score_pairs(list(zip(srcs, tgts)), size)


@register_metric(
    "bartscore",
    group="bartscore",
    inputs=_TEXT_INPUTS,
    description="BARTScore: mean per-token log-likelihood of the reference given the "
                "explanation under a seq2seq BART model (direction configurable)",
)
def bartscore_scores(candidates: Sequence[str], references: Sequence[str], model_location: str,
                     *, direction: str = "gen_to_ref", device: str = "cpu",
                     batch_size: int = 16) -> np.ndarray:
    """BARTScore of each generated explanation against its reference, float64 [B].

    direction: "gen_to_ref" (log p(reference | generated), default), "ref_to_gen"
    (log p(generated | reference)) or "f" (their arithmetic mean, the paper's F score).
    """
    cands, refs = _check_pairs(candidates, references)
    if direction not in BARTSCORE_DIRECTIONS:
        raise ValueError(f"unknown BARTScore direction {direction!r}; "
                         f"expected one of {BARTSCORE_DIRECTIONS}")
    size = _check_batch_size(batch_size)
    n = len(cands)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    pairs: list[tuple[str, str]] = []
    if direction in ("gen_to_ref", "f"):
        pairs += list(zip(cands, refs))
    if direction in ("ref_to_gen", "f"):
        pairs += list(zip(refs, cands))
    scores = get_bartscorer(model_location, device).score_pairs(pairs, size)
    if direction == "f":
        return (scores[:n] + scores[n:]) / 2.0
    return scores


# --------------------------------------------------------------------------- BLEURT

@register_metric(
    "bleurt",
    group="bleurt",
    inputs=_TEXT_INPUTS,
    description="BLEURT: learned regression score of the (reference, explanation) pair "
                "by a fine-tuned BERT-style model (raw output)",
)
def bleurt_scores(candidates: Sequence[str], references: Sequence[str], model_location: str,
                  *, device: str = "cpu", batch_size: int = 32) -> np.ndarray:
    """BLEURT of each generated explanation against its reference, float64 [B]."""
    cands, refs = _check_pairs(candidates, references)
    size = _check_batch_size(batch_size)
    if not cands:
        return np.zeros(0, dtype=np.float64)
    return get_bleurt_scorer(model_location, device).score_pairs(list(zip(refs, cands)), size)
