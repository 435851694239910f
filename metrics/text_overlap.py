"""Surface-overlap metrics for generated explanations (seed 000, II-B/C).

The metrics that explainable-recommendation papers report next to the semantic ones:
BLEU-1/4, ROUGE-1/2/L and METEOR (the unique sentence ratio and the feature metrics
FMR, FCR, DIV are in `metrics/features.py`). Pure functions on Python strings; nothing
here imports Ray or a model.

Tokenisation (`tokenize`, the default everywhere): lowercase, then every run of word
characters (`\\w+`: letters, digits, underscore) is one token and every other
non-space character is a token of its own, so "It's great!" -> it ' s great !.
Punctuation therefore counts in BLEU, ROUGE and USR. Every text function takes
`tokenizer=` to use another one. No stemming, no stop-word removal.

BLEU (Papineni et al., 2002) is computed here, not by a package (nltk and
rouge-score are not dependencies of the project). Modified n-gram precision clips
each hypothesis n-gram count at its largest count in any one reference; the brevity
penalty is exp(1 - r/c) when c <= r (c: hypothesis length, r: the reference length
closest to c, the shorter one on a tie), else 1. BLEU-N is the penalty times the
geometric mean of p_1..p_N with uniform weights 1/N.
  * `corpus_bleu` pools the clipped counts, the n-gram totals, c and r over the whole
    corpus before dividing (the standard corpus BLEU); default smoothing "none".
  * `sentence_bleu` scores one hypothesis; default smoothing "method1" (Chen &
    Cherry, 2014, method 1: a p_n whose clipped count is 0 becomes 0.1 / total), as
    single sentences very often have no matching 4-gram.
  With smoothing "none", any p_n = 0 gives BLEU 0. Under both, a hypothesis with no
  matching unigram at all scores 0, and an n-gram total of 0 (hypothesis shorter
  than n) is taken as 1 so that p_n = 0 rather than undefined. Sentence values are
  those of NLTK's `sentence_bleu` on the same tokens (checked on random texts).
  Corpus values are too, except that NLTK adds one phantom n-gram to the total for
  every hypothesis shorter than n; here the totals are the true counts, as in
  multi-bleu.perl, sacreBLEU and the BLEU script of the PETER code.

ROUGE (Lin, 2004), also computed here: sentence level against one reference, with
the values `rouge-score` gives without stemming on the same tokens (checked on random
texts): ROUGE-N counts overlapping n-grams with multiplicity (sum of
min(hyp count, ref count)); ROUGE-L uses the longest common subsequence of tokens.
P = overlap / hypothesis units, R = overlap / reference units, F = 2PR / (P + R)
(beta = 1); 0 when a side is empty. Corpus values are the means of the
per-example ones.

METEOR uses NLTK's implementation, which needs the package *and* the WordNet corpus
(data, not on PyPI). `meteor_unavailable_reason()` says why it cannot run;
`meteor` raises `MetricUnavailable` (whose message starts with "unavailable: ")
rather than returning a number, so callers can report the metric as skipped.

Registered names: corpus "bleu-1", "bleu-4"; per example "sentence-bleu-1",
"sentence-bleu-4", "rouge-{1,2,l}-{f,p,r}" and "meteor". Per-example functions return
float64 arrays, NaN where a value is undefined, ready for `metrics.ranking.summarise`.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from rexeval.metrics.registry import register_metric

Tokenizer = Callable[[str], list[str]]

_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercased word runs and single punctuation characters (see module docstring)."""
    return _TOKEN.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _as_reference_list(refs: str | Sequence[str]) -> list[str]:
    if isinstance(refs, str):
        return [refs]
    refs = list(refs)
    if not refs:
        raise ValueError("each hypothesis needs at least one reference")
    return refs


def check_pairs(hyps: Sequence, refs: Sequence) -> None:
    """One reference (or list of references) per hypothesis, or a ValueError."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")


# -------------------------------------------------------------------------- BLEU

SMOOTHINGS = ("none", "method1")
_METHOD1_EPSILON = 0.1


class _BleuStats:
    """Sufficient statistics of BLEU: clipped matches and totals per order, c and r."""

    def __init__(self, max_n: int):
        self.matches = [0] * max_n
        self.totals = [0] * max_n
        self.hyp_len = 0
        self.ref_len = 0

    def add(self, hyp: list[str], refs: list[list[str]]) -> None:
        for n in range(1, len(self.matches) + 1):
            hyp_counts = _ngrams(hyp, n)
            most = _ngrams(refs[0], n)
            for ref in refs[1:]:
                most |= _ngrams(ref, n)  # | keeps the larger count per n-gram
            self.matches[n - 1] += sum((hyp_counts & most).values())  # clipped counts
            self.totals[n - 1] += sum(hyp_counts.values())
        c = len(hyp)
        self.hyp_len += c
        # Closest reference length; the shorter one wins a tie.
        self.ref_len += min((abs(len(r) - c), len(r)) for r in refs)[1]

    def score(self, smoothing: str) -> float:
        if self.matches[0] == 0:
            return 0.0
        log_p = 0.0
        for m, t in zip(self.matches, self.totals):
            t = max(t, 1)
            if m == 0:
                if smoothing == "none":
                    return 0.0
                log_p += math.log(_METHOD1_EPSILON / t)
            else:
                log_p += math.log(m / t)
        c, r = self.hyp_len, self.ref_len
        log_bp = 0.0 if c > r else 1.0 - r / c
        return math.exp(log_bp + log_p / len(self.matches))


def _check_bleu_args(max_n: int, smoothing: str) -> None:
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    if smoothing not in SMOOTHINGS:
        raise ValueError(f"unknown smoothing {smoothing!r}; expected one of {SMOOTHINGS}")


def sentence_bleu(
    hypothesis: str,
    references: str | Sequence[str],
    *,
    max_n: int = 4,
    smoothing: str = "method1",
    tokenizer: Tokenizer = tokenize,
) -> float:
    """BLEU-`max_n` of one hypothesis against one or more references, in [0, 1]."""
    _check_bleu_args(max_n, smoothing)
    stats = _BleuStats(max_n)
    stats.add(tokenizer(hypothesis), [tokenizer(r) for r in _as_reference_list(references)])
    return stats.score(smoothing)


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str | Sequence[str]],
    *,
    max_n: int = 4,
    smoothing: str = "none",
    tokenizer: Tokenizer = tokenize,
) -> float:
    """Corpus BLEU-`max_n` (statistics pooled before dividing), in [0, 1].

    references[i] is the reference text of hypotheses[i], or a list of them. NaN for
    an empty corpus.
    """
    _check_bleu_args(max_n, smoothing)
    check_pairs(hypotheses, references)
    if len(hypotheses) == 0:
        return float("nan")
    stats = _BleuStats(max_n)
    for hyp, refs in zip(hypotheses, references):
        stats.add(tokenizer(hyp), [tokenizer(r) for r in _as_reference_list(refs)])
    return stats.score(smoothing)


def sentence_bleu_scores(
    hypotheses: Sequence[str],
    references: Sequence[str | Sequence[str]],
    *,
    max_n: int = 4,
    smoothing: str = "method1",
    tokenizer: Tokenizer = tokenize,
) -> np.ndarray:
    """`sentence_bleu` of every pair, as a float64 array (one value per interaction)."""
    check_pairs(hypotheses, references)
    return np.array(
        [
            sentence_bleu(h, r, max_n=max_n, smoothing=smoothing, tokenizer=tokenizer)
            for h, r in zip(hypotheses, references)
        ],
        dtype=np.float64,
    )


_TEXT_INPUTS = ("generated_explanations", "reference_explanations")


@register_metric(
    "bleu-1",
    group="corpus",
    kind="corpus",
    inputs=_TEXT_INPUTS,
    description="corpus BLEU with unigrams only: clipped unigram precision x brevity penalty",
)
def bleu_1(hypotheses: Sequence[str], references: Sequence[str | Sequence[str]], **kw) -> float:
    """Corpus BLEU-1 (no smoothing unless `smoothing=` says so)."""
    return corpus_bleu(hypotheses, references, max_n=1, **kw)


@register_metric(
    "bleu-4",
    group="corpus",
    kind="corpus",
    inputs=_TEXT_INPUTS,
    description="corpus BLEU, geometric mean of 1..4-gram clipped precisions x brevity penalty",
)
def bleu_4(hypotheses: Sequence[str], references: Sequence[str | Sequence[str]], **kw) -> float:
    """Corpus BLEU-4 (no smoothing unless `smoothing=` says so)."""
    return corpus_bleu(hypotheses, references, max_n=4, **kw)


@register_metric(
    "sentence-bleu-1",
    group="overlap",
    inputs=_TEXT_INPUTS,
    description="BLEU-1 of each explanation against its reference (Chen & Cherry method 1)",
)
def sentence_bleu_1(
    hypotheses: Sequence[str], references: Sequence[str | Sequence[str]], **kw
) -> np.ndarray:
    """Sentence BLEU-1 per interaction."""
    return sentence_bleu_scores(hypotheses, references, max_n=1, **kw)


@register_metric(
    "sentence-bleu-4",
    group="overlap",
    inputs=_TEXT_INPUTS,
    description="BLEU-4 of each explanation against its reference (Chen & Cherry method 1)",
)
def sentence_bleu_4(
    hypotheses: Sequence[str], references: Sequence[str | Sequence[str]], **kw
) -> np.ndarray:
    """Sentence BLEU-4 per interaction."""
    return sentence_bleu_scores(hypotheses, references, max_n=4, **kw)


# ------------------------------------------------------------------------- ROUGE


class PRF(NamedTuple):
    precision: float
    recall: float
    fmeasure: float


def _prf(overlap: int, n_hyp: int, n_ref: int) -> PRF:
    p = overlap / n_hyp if n_hyp else 0.0
    r = overlap / n_ref if n_ref else 0.0
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return PRF(p, r, f)


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists.

    Bit-parallel (Allison & Dix 1986; Crochemore et al. 2001): bit i of `v` is 0 where
    the LCS of a[:i+1] and the prefix of b read so far grew; one big-int step per
    token of b, so about len(b) * len(a) / 64 machine operations.
    """
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, tok in enumerate(a):
        masks[tok] = masks.get(tok, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for tok in b:
        u = v & masks.get(tok, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - v.bit_count()


def rouge_n(
    hypothesis: str, reference: str, n: int, *, tokenizer: Tokenizer = tokenize
) -> PRF:
    """ROUGE-N precision, recall and F1 of one hypothesis against one reference."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    h = _ngrams(tokenizer(hypothesis), n)
    r = _ngrams(tokenizer(reference), n)
    overlap = sum((h & r).values())  # & keeps the smaller count per n-gram
    return _prf(overlap, sum(h.values()), sum(r.values()))


def rouge_l(hypothesis: str, reference: str, *, tokenizer: Tokenizer = tokenize) -> PRF:
    """Sentence-level ROUGE-L precision, recall and F1 (LCS over tokens)."""
    h, r = tokenizer(hypothesis), tokenizer(reference)
    return _prf(lcs_length(h, r), len(h), len(r))


ROUGE_VARIANTS = ("1", "2", "l")
_PARTS = {"p": 0, "r": 1, "f": 2}


def rouge_metric_names() -> list[str]:
    """The keys of `rouge_scores`, e.g. "rouge-1-f", "rouge-l-p"."""
    return [f"rouge-{v}-{part}" for v in ROUGE_VARIANTS for part in ("f", "p", "r")]


def _rouge_one(hyp: list[str], ref: list[str], variant: str) -> PRF:
    if variant == "l":
        return _prf(lcs_length(hyp, ref), len(hyp), len(ref))
    n = int(variant)
    h, r = _ngrams(hyp, n), _ngrams(ref, n)
    return _prf(sum((h & r).values()), sum(h.values()), sum(r.values()))


def rouge_scores(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    variants: Iterable[str] = ROUGE_VARIANTS,
    tokenizer: Tokenizer = tokenize,
) -> dict[str, np.ndarray]:
    """Per-interaction ROUGE P/R/F for each variant ("1", "2", "l"), texts tokenised once.

    Keys as in `rouge_metric_names`; values are float64 arrays, one entry per pair.
    """
    check_pairs(hypotheses, references)
    variants = [str(v).lower() for v in variants]
    for v in variants:
        if v != "l" and not (v.isdigit() and int(v) >= 1):
            raise ValueError(f"unknown ROUGE variant {v!r}; expected 'l' or an n >= 1")
    rows: dict[str, list[float]] = {
        f"rouge-{v}-{part}": [] for v in variants for part in ("f", "p", "r")
    }
    for hyp_text, ref_text in zip(hypotheses, references):
        hyp, ref = tokenizer(hyp_text), tokenizer(ref_text)
        for v in variants:
            prf = _rouge_one(hyp, ref, v)
            rows[f"rouge-{v}-p"].append(prf.precision)
            rows[f"rouge-{v}-r"].append(prf.recall)
            rows[f"rouge-{v}-f"].append(prf.fmeasure)
    return {k: np.asarray(v, dtype=np.float64) for k, v in rows.items()}


def _rouge_metric(variant: str, part: str) -> Callable[..., np.ndarray]:
    """The registered per-interaction function for one ROUGE variant and one of P/R/F."""
    name = f"rouge-{variant}-{part}"

    def metric(hypotheses: Sequence[str], references: Sequence[str], **kw) -> np.ndarray:
        return rouge_scores(hypotheses, references, variants=(variant,), **kw)[name]

    label = {"1": "unigram", "2": "bigram", "l": "LCS"}[variant]
    what = {"p": "precision", "r": "recall", "f": "F1"}[part]
    metric.__name__ = metric.__qualname__ = name.replace("-", "_")
    metric.__doc__ = f"ROUGE-{variant.upper()} {what} per interaction ({label} overlap)."
    return register_metric(
        name,
        group="overlap",
        inputs=_TEXT_INPUTS,
        description=f"ROUGE-{variant.upper()} {what} against the reference ({label} overlap)",
    )(metric)


rouge_1_f = _rouge_metric("1", "f")
rouge_1_p = _rouge_metric("1", "p")
rouge_1_r = _rouge_metric("1", "r")
rouge_2_f = _rouge_metric("2", "f")
rouge_2_p = _rouge_metric("2", "p")
rouge_2_r = _rouge_metric("2", "r")
rouge_l_f = _rouge_metric("l", "f")
rouge_l_p = _rouge_metric("l", "p")
rouge_l_r = _rouge_metric("l", "r")


# ------------------------------------------------------------------------ METEOR


class MetricUnavailable(RuntimeError):
    """A metric cannot be computed on this machine; str() starts with "unavailable: "."""

    def __init__(self, metric: str, reason: str):
        self.metric = metric
        self.reason = reason
        super().__init__(f"unavailable: {reason}")


_METEOR_PROBE: dict[str, str | None] = {}


def _probe_meteor() -> str | None:
    """None when NLTK's METEOR can run here, else why not (uncached)."""
    try:
        from nltk.corpus import wordnet
        from nltk.translate.meteor_score import meteor_score  # noqa: F401
    except ImportError as exc:
        return f"METEOR needs the nltk package, which is not installed ({exc})"
    try:
        wordnet.synsets("good")  # loads the corpus; LookupError when its data is missing
    except LookupError:
        return (
            "METEOR needs NLTK's WordNet corpus (nltk_data/corpora/wordnet), which is "
            "not installed; it is data, not a PyPI package"
        )
    except Exception as exc:  # noqa: BLE001  (a broken or partial corpus: report, do not crash)
        return f"NLTK's WordNet corpus could not be loaded ({type(exc).__name__}: {exc})"
    return None


def meteor_unavailable_reason(*, refresh: bool = False) -> str | None:
    """None if `meteor` can run, else a one-line reason. Probed once per process."""
    if refresh or "meteor" not in _METEOR_PROBE:
        _METEOR_PROBE["meteor"] = _probe_meteor()
    return _METEOR_PROBE["meteor"]


def meteor_available() -> bool:
    return meteor_unavailable_reason() is None


def meteor(
    hypothesis: str, references: str | Sequence[str], *, tokenizer: Tokenizer = tokenize
) -> float:
    """NLTK METEOR (alpha 0.9, beta 3, gamma 0.5; exact, Porter-stem and WordNet
    synonym matches) of one hypothesis on our tokens. Raises MetricUnavailable."""
    reason = meteor_unavailable_reason()
    if reason is not None:
        raise MetricUnavailable("meteor", reason)
    from nltk.translate.meteor_score import meteor_score

    refs = [tokenizer(r) for r in _as_reference_list(references)]
    return float(meteor_score(refs, tokenizer(hypothesis)))


@register_metric(
    "meteor",
    group="meteor",
    inputs=_TEXT_INPUTS,
    description="NLTK METEOR per explanation; needs nltk and its WordNet data (else skipped)",
)
def meteor_scores(
    hypotheses: Sequence[str],
    references: Sequence[str | Sequence[str]],
    *,
    tokenizer: Tokenizer = tokenize,
) -> np.ndarray:
    """METEOR per interaction; raises MetricUnavailable before any work if it cannot run."""
    check_pairs(hypotheses, references)
    reason = meteor_unavailable_reason()
    if reason is not None:
        raise MetricUnavailable("meteor", reason)
    return np.array(
        [meteor(h, r, tokenizer=tokenizer) for h, r in zip(hypotheses, references)],
        dtype=np.float64,
    )
