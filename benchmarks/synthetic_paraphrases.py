"""Synthetic paraphrase data with known truth, for measuring the clustering pipeline.

Two generators:
- `planted_vectors`: unit vectors in families around random centres (members' mutual
  cosine about 0.93-0.98), split into polarity groups, with a share of "confusable"
  family chains whose centres are close enough that their members link across families,
  so components are non-cohesive and Algorithm 1 has work to do. Used by the 1M-vector
  benchmark (`bench_paraphrase.py`), where only speed and agreement with the reference matter.
- `paraphrase_families`: product statements written from templates, in families that
  say the same thing about the same aspect in different words (synonyms, reordering,
  "the product has ..." rewrites), with near-miss families (same aspect, other opinion;
  same opinion, other aspect) as hard negatives. Embedded with the real local encoder,
  they measure pairwise precision/recall and ARI against the known truth
  (`eval_paraphrase_clustering.py`).
"""
from __future__ import annotations

import itertools
import random

import numpy as np

# -- vectors ----------------------------------------------------------------------------


def planted_vectors(n: int, d: int = 384, *, max_family: int = 8, singleton_share: float = 0.3,
                    confusable_share: float = 0.1, group_shares=(0.5, 0.35, 0.15), seed: int = 0):
    """(emb float32 [n, d] unit rows, groups int64 [n], truth int64 [n]) in random order."""
    rng = np.random.default_rng(seed)
    sizes = []
    total = 0
    while total < n:
        s = 1 if rng.random() < singleton_share else int(rng.integers(2, max_family + 1))
        s = min(s, n - total)
        sizes.append(s)
        total += s
    n_fam = len(sizes)
    centres = rng.standard_normal((n_fam, d), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    # Confusable chains: family 3m+1 is pulled towards 3m and 3m+2 towards 3m+1 (centre
    # cosines ~0.95), so members link across the chain while its two ends are far apart
    # (centre cosine ~0.8): a non-cohesive component that Algorithm 1 must split.
    conf = rng.random(n_fam // 3) < confusable_share
    for m in np.flatnonzero(conf):
        for a, b in ((3 * m, 3 * m + 1), (3 * m + 1, 3 * m + 2)):
            mixed = 0.95 * centres[a] + np.sqrt(1 - 0.95 ** 2) * centres[b]
            centres[b] = mixed / np.linalg.norm(mixed)
    fam_group = rng.choice(len(group_shares), size=n_fam, p=np.asarray(group_shares) / sum(group_shares))
    for m in np.flatnonzero(conf):  # a chain stays within one polarity
        fam_group[3 * m + 1:3 * m + 3] = fam_group[3 * m]
    truth = np.repeat(np.arange(n_fam), sizes)
    sigma = rng.uniform(0.12, 0.26, size=n_fam).astype(np.float32)
    emb = np.empty((n, d), dtype=np.float32)
    step = 200_000
    for lo in range(0, n, step):  # chunked: bounded temporaries at 1M x 384
        hi = min(n, lo + step)
        t = truth[lo:hi]
        noise = rng.standard_normal((hi - lo, d), dtype=np.float32) / np.sqrt(d, dtype=np.float32)
        block = centres[t] + sigma[t, None] * noise
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        emb[lo:hi] = block
    groups = fam_group[truth].astype(np.int64)
    order = rng.permutation(n)
    return emb[order], groups[order], truth[order]


# -- text -------------------------------------------------------------------------------

# aspect -> its wordings; opinion concept -> (polarity, wordings as predicates on the aspect)
ASPECTS = {
    "sound": ["sound", "tone", "audio quality"],
    "strings": ["strings", "string set"],
    "cable": ["cable", "cord", "lead"],
    "tuner": ["tuner", "tuning device"],
    "case": ["case", "carrying case", "gig bag"],
    "stand": ["stand", "holder"],
    "pedal": ["pedal", "effects pedal"],
    "strap": ["strap", "shoulder strap"],
}
OPINIONS = {
    "durable": ("positive", ["is sturdy", "is durable", "is built to last", "is solid and well made"]),
    "fragile": ("negative", ["is flimsy", "breaks easily", "is fragile", "falls apart quickly"]),
    "cheap_price": ("positive", ["is affordable", "is inexpensive", "is good value for the money",
                                 "is reasonably priced"]),
    "overpriced": ("negative", ["is overpriced", "costs too much", "is too expensive"]),
    "easy": ("positive", ["is easy to use", "is simple to use", "is straightforward to use"]),
    "noisy": ("negative", ["is noisy", "makes a buzzing noise", "produces unwanted hum"]),
    "light": ("positive", ["is lightweight", "is light", "weighs very little"]),
    "heavy": ("negative", ["is heavy", "weighs too much", "is too bulky and heavy"]),
    "looks": ("positive", ["looks great", "looks beautiful", "has a nice look"]),
    "works": ("neutral", ["works as described", "does what it says", "functions as advertised"]),
}
FRAMES = ["the {aspect} {pred}", "the product's {aspect} {pred}", "its {aspect} {pred}",
          "the {aspect} of the product {pred}"]


def paraphrase_families(n_families: int = 60, members: int = 6, seed: int = 0) -> list[dict]:
    """Statements with `family` (truth), `sentiment` and a unique `statement_id`.

    A family is one (aspect, opinion) pair; its members vary the aspect's wording, the
    predicate's wording and the sentence frame. Families share aspects and opinions with
    others, which makes near misses ("the cable is flimsy" vs "the case is flimsy").
    """
    rng = random.Random(seed)
    combos = list(itertools.product(sorted(ASPECTS), sorted(OPINIONS)))
    rng.shuffle(combos)
    rows = []
    for fam, (aspect, opinion) in enumerate(combos[:n_families]):
        polarity, preds = OPINIONS[opinion]
        variants = [f.format(aspect=a, pred=p) for f in FRAMES for a in ASPECTS[aspect] for p in preds]
        rng.shuffle(variants)
        for text in variants[:members]:
            rows.append({"family": fam, "statement": text, "sentiment": polarity,
                         "aspect": aspect, "opinion": opinion})
    for i, r in enumerate(rows):
        r["statement_id"] = f"s{i:06d}"
    return rows


def pairwise_scores(truth: np.ndarray, labels: np.ndarray) -> dict:
    """Pairwise precision, recall, F1 (pairs put together vs pairs that belong together) and ARI."""
    from sklearn.metrics import adjusted_rand_score
    from sklearn.metrics.cluster import pair_confusion_matrix

    (tn, fp), (fn, tp) = pair_confusion_matrix(truth, labels)  # counts ordered pairs
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return {"pair_precision": float(p), "pair_recall": float(r), "pair_f1": float(f1),
            "ari": float(adjusted_rand_score(truth, labels)),
            "true_pairs": int((tp + fn) // 2), "predicted_pairs": int((tp + fp) // 2)}
