"""Reference-based semantic similarity: BERTScore and STS (seed 000, section IV.A.4).

Both compare a generated explanation with its ground-truth explanation, one value per
interaction (float64 arrays, ready for `metrics.ranking.summarise` and paired tests).
The seed reports them to show that similarity metrics stay high while factual
consistency is low: "the strings are bright" and "the strings are not bright" are
near neighbours for both.

Model-backed metrics
--------------------
Unlike the pure metrics of `text_overlap`, these need a model. They never pick one:
BERTScore takes a model *location* (a local folder or a hub id, e.g. what
`models.refs.resolve(profile.ref("bertscore_model")).location` gives) plus the layer to
read, and STS takes an encoder *object* (anything with `.encode(texts) -> unit rows`,
normally `models.encoders.embedder.Embedder`). The caller owns where the model lives, so
the same function runs in a unit test, inside a Ray Data batch function, or later behind
a Serve deployment that holds the model between requests. This module is the maths;
the BERTScore model (bert-score's `BERTScorer`: loaded once per process and kept, its
tokenizer length fixed, its default layer) lives in `models.encoders.bertscore_model`.

BERTScore (Zhang et al., 2020)
------------------------------
Computed by the `bert-score` package on the hidden states of layer `num_layers`
(`bertscore_num_layers` in the profiles: 6 for all-MiniLM-L6-v2, 17 for roberta-large).
Every token embedding is L2-normalised; P is the mean over candidate tokens of the
largest cosine with any reference token, R the mean over reference tokens of the largest
cosine with any candidate token, F1 = 2PR / (P + R). Details that follow the package:
- The special tokens ([CLS]/[SEP], <s>/</s>) get weight 0 in the means but remain in the
  other side's candidates for the max: a token may be matched to the other sentence's
  [CLS] or [SEP]. Dropping them from both sides changes scores (by up to ~0.05 on short
  texts with MiniLM), so our tests check the package's exact convention.
- `idf=False` (default, as in the seed's evaluate-metric setup): uniform weights.
  `idf=True`: weights idf(w) = log((N + 1) / (df(w) + 1)) computed from the *references
  of this call*. When a corpus is scored in batches (Ray Data), per-batch idf differs
  from corpus idf; compute it once with `bertscore_idf(all_references, location)` and
  pass the returned `IdfWeights` as `idf=` to every batch.
- No baseline rescaling by default: values are the raw cosines, hence high for any two
  fluent English sentences (about 0.8-0.9). `rescale_with_baseline=True` maps x to
  (x - b) / (1 - b) with the baseline b of the layer used, read from `baseline_path`
  (bert-score's TSV format: columns LAYER,P,R,F, one row per layer). A path is
  required: for a local model folder the package cannot know which of its shipped
  baselines (if any) applies, and nothing is downloaded. Rescaled and raw values are
  not comparable; report which one a table holds.
- Tokeniser length: over-long texts are truncated to the model's position table, also
  for checkpoints that name no usable `model_max_length` (the fix is
  `models.encoders.bertscore_model`'s, applied to the cached model and to the tokenizer
  `bertscore_idf` loads).
- Texts are stripped by the package; a pair whose candidate or reference is empty (or
  only whitespace) gets P = R = F1 = 0 (bert-score's own convention, applied here
  without running the model), so an empty explanation is scored as matching nothing,
  not dropped from the mean.

STS
---
Cosine similarity of the L2-normalised sentence embeddings of candidate and reference
(the seed uses all-MiniLM-L6-v2, role `sts`). Rows are re-normalised here in case an
encoder returns vectors that are not exactly unit length, each distinct text is encoded
once, and values are clipped to [-1, 1]. A pair with an empty side scores 0, as for
BERTScore.

Registered names (all per example, higher is better): "bertscore-p", "bertscore-r",
"bertscore-f1" and "sts". The three BERTScore functions each compute all three values;
call `bertscore` once when a run reports all of them.
"""
from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rexeval.metrics.registry import register_metric
from rexeval.models.encoders.bertscore_model import (
    fix_model_max_length,
    default_num_layers,
    get_bertscorer,
)

BERTSCORE_KEYS = ("bertscore_p", "bertscore_r", "bertscore_f1")
_TEXT_INPUTS = ("generated_explanations", "reference_explanations")


# --------------------------------------------------------------------------- inputs

def _check_texts(name: str, texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of strings, not one string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] is {type(t).__name__}, expected str")
    return texts


def _check_pairs(candidates: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
    cands = _check_texts("candidates", candidates)
    refs = _check_texts("references", references)
    if len(cands) != len(refs):
        raise ValueError(f"{len(cands)} candidates but {len(refs)} references")
    return cands, refs


def _non_empty_pairs(cands: list[str], refs: list[str]) -> np.ndarray:
    """Indices of the pairs where both sides hold some non-space text."""
    return np.array([i for i, (c, r) in enumerate(zip(cands, refs)) if c.strip() and r.strip()],
                    dtype=np.int64)


# ------------------------------------------------------------------------ BERTScore

@dataclass(frozen=True)
class IdfWeights:
    """Corpus idf weights for BERTScore: token id -> log((N + 1) / (df + 1)); tokens never
    seen get log(N + 1). A plain, picklable object, so it can travel to Ray workers."""

    weights: dict[int, float]
    num_docs: int

    def as_lookup(self) -> defaultdict:
        unseen = math.log(self.num_docs + 1)
        table: defaultdict = defaultdict(lambda: unseen)
        table.update(self.weights)
        return table


def _idf_from_tokenizer(references: Sequence[str], tokenizer) -> IdfWeights:
    from bert_score.utils import sent_encode

    df: Counter = Counter()
    for text in references:
        df.update(set(sent_encode(tokenizer, text)))
    n = len(references)
    return IdfWeights({int(t): math.log((n + 1) / (c + 1)) for t, c in df.items()}, n)


def bertscore_idf(references: Sequence[str], model_location: str) -> IdfWeights:
    """Idf weights of a whole reference corpus with the model's tokenizer (loaded alone,
    without the model). Pass the result as `bertscore(..., idf=weights)`."""
    from bert_score.utils import get_tokenizer
    from transformers import AutoConfig

    refs = _check_texts("references", references)
    tokenizer = get_tokenizer(str(model_location))
    fix_model_max_length(tokenizer, AutoConfig.from_pretrained(str(model_location)))
    return _idf_from_tokenizer(refs, tokenizer)


def _read_baseline(path: str, num_layers: int) -> np.ndarray:
    import pandas as pd

    if not os.path.isfile(path):
        raise FileNotFoundError(f"BERTScore baseline file not found: {path}")
    table = pd.read_csv(path)
    missing = [c for c in ("P", "R", "F") if c not in table.columns]
    if missing:
        raise ValueError(f"baseline {path} lacks columns {missing} (expected LAYER,P,R,F)")
    if "LAYER" in table.columns:
        rows = table[table["LAYER"] == num_layers]
    else:
        rows = table.iloc[num_layers:num_layers + 1]
    if len(rows) != 1:
        raise ValueError(f"baseline {path} has no row for layer {num_layers}")
    return rows[["P", "R", "F"]].to_numpy(dtype=np.float64)[0]


def _no_baseline_error(model_location: str, lang: str | None) -> ValueError:
    hint = ""
    try:
        import bert_score

        name = os.path.basename(os.path.normpath(str(model_location)))
        shipped = os.path.join(os.path.dirname(bert_score.__file__), "rescale_baseline",
                               lang or "en", f"{name}.tsv")
        if os.path.isfile(shipped):
            hint = f" bert-score ships one that may fit this model: {shipped}"
    except ImportError:
        pass
    return ValueError(
        "rescale_with_baseline=True needs baseline_path= (a bert-score baseline TSV for "
        "this model and language); none is looked up or downloaded automatically." + hint
    )


def bertscore(candidates: Sequence[str], references: Sequence[str], model_location: str,
              num_layers: int | None, batch_size: int = 64, device: str = "cpu",
              idf: bool | IdfWeights = False, lang: str | None = None, *,
              rescale_with_baseline: bool = False,
              baseline_path: str | None = None) -> dict[str, np.ndarray]:
    """BERTScore P/R/F1 of each candidate against its reference.

    model_location: a local folder (e.g. `resolve("all-MiniLM-L6-v2").location`) or a
    hub id; num_layers: the layer whose hidden states are compared (None: bert-score's
    default for a known model name). idf: False, True (idf of these references) or an
    `IdfWeights` from `bertscore_idf`. lang is only used to point at a shipped baseline
    when rescaling is asked for without `baseline_path`. Returns {"bertscore_p",
    "bertscore_r", "bertscore_f1"}: float64 arrays in input order.
    """
    cands, refs = _check_pairs(candidates, references)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if rescale_with_baseline and baseline_path is None:
        raise _no_baseline_error(model_location, lang)

    out = np.zeros((len(cands), 3), dtype=np.float64)
    keep = _non_empty_pairs(cands, refs)
    if len(keep):
        from bert_score.utils import bert_cos_score_idf

        scorer = get_bertscorer(model_location, num_layers, device)
        tokenizer = scorer._tokenizer
        if isinstance(idf, IdfWeights):
            weights = idf.as_lookup()
        elif idf:
            weights = _idf_from_tokenizer([refs[i] for i in keep], tokenizer).as_lookup()
        else:
            weights = defaultdict(lambda: 1.0)
            weights[tokenizer.sep_token_id] = 0.0
            weights[tokenizer.cls_token_id] = 0.0
        scores = bert_cos_score_idf(
            scorer._model, [refs[i] for i in keep], [cands[i] for i in keep], tokenizer,
            weights, verbose=False, batch_size=int(batch_size), device=scorer.device,
        )
        out[keep] = scores.cpu().double().numpy()
    if rescale_with_baseline:
        layers = default_num_layers(model_location) if num_layers is None else int(num_layers)
        base = _read_baseline(str(baseline_path), layers)
        out = (out - base) / (1.0 - base)
    return {key: np.ascontiguousarray(out[:, j]) for j, key in enumerate(BERTSCORE_KEYS)}


@register_metric(
    "bertscore-p",
    group="bertscore",
    inputs=_TEXT_INPUTS,
    description="BERTScore precision: mean over explanation tokens of the best cosine "
                "with a reference token (contextual embeddings, greedy matching)",
)
def bertscore_p(candidates: Sequence[str], references: Sequence[str], model_location: str,
                num_layers: int | None, **kw) -> np.ndarray:
    """BERTScore precision per interaction (see `bertscore`)."""
    return bertscore(candidates, references, model_location, num_layers, **kw)["bertscore_p"]


@register_metric(
    "bertscore-r",
    group="bertscore",
    inputs=_TEXT_INPUTS,
    description="BERTScore recall: mean over reference tokens of the best cosine with "
                "an explanation token (contextual embeddings, greedy matching)",
)
def bertscore_r(candidates: Sequence[str], references: Sequence[str], model_location: str,
                num_layers: int | None, **kw) -> np.ndarray:
    """BERTScore recall per interaction (see `bertscore`)."""
    return bertscore(candidates, references, model_location, num_layers, **kw)["bertscore_r"]


@register_metric(
    "bertscore-f1",
    group="bertscore",
    inputs=_TEXT_INPUTS,
    description="BERTScore F1: harmonic mean of BERTScore precision and recall",
)
def bertscore_f1(candidates: Sequence[str], references: Sequence[str], model_location: str,
                 num_layers: int | None, **kw) -> np.ndarray:
    """BERTScore F1 per interaction (see `bertscore`)."""
    return bertscore(candidates, references, model_location, num_layers, **kw)["bertscore_f1"]


# ------------------------------------------------------------------------------ STS

@register_metric(
    "sts",
    group="sts",
    inputs=_TEXT_INPUTS,
    description="semantic textual similarity: cosine of the L2-normalised sentence "
                "embeddings of explanation and reference",
)
def sts(candidates: Sequence[str], references: Sequence[str], encoder: Any) -> np.ndarray:
    """Cosine similarity per pair, from `encoder.encode(texts)` (rows for the texts in
    order, e.g. an `Embedder`). Each distinct text is encoded once, in one call."""
    from rexeval.models.encoders.embedder import l2_normalise

    cands, refs = _check_pairs(candidates, references)
    out = np.zeros(len(cands), dtype=np.float64)
    keep = _non_empty_pairs(cands, refs)
    if not len(keep):
        return out
    texts: list[str] = []
    position: dict[str, int] = {}
    for i in keep:
        for t in (cands[i], refs[i]):
            if t not in position:
                position[t] = len(texts)
                texts.append(t)
    vectors = np.asarray(encoder.encode(texts))
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"encoder returned shape {vectors.shape} for {len(texts)} texts")
    vectors = l2_normalise(vectors).astype(np.float64)
    a = vectors[[position[cands[i]] for i in keep]]
    b = vectors[[position[refs[i]] for i in keep]]
    out[keep] = np.clip(np.einsum("ij,ij->i", a, b), -1.0, 1.0)
    return out
