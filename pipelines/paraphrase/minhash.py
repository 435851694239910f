"""MinHash LSH grouping of near-duplicate sentences, as the EXTRA baseline does it (seed 002,
Table 3), with its representatives and reduction figure. `pipelines/paraphrase/extra.py`
picks the candidate sentences; this module groups them. Our reading of EXTRA's recipe,
written from its description, not from its code.

Words (`words`)
    Lowercased runs of letters/digits with inner apostrophes (curly ones -> '), so
    "it's" is one word.

MinHash LSH clustering (`minhash_lsh_clusters`)
    Texts are lowercased and cut into words (as above); texts with the same word
    sequence (so identical normalised texts) are one node. Shingles are word
    `ngram`-grams (default bigrams), plus the unigrams when a text has fewer than
    `ngram` words; with `char_ngrams=True` they are character `ngram`-grams of the
    space-joined words (the whole string when shorter). Each distinct text gets a
    datasketch MinHash (default scheme "affine32", datasketch's SHA-1 32-bit hash,
    `num_perm` permutations from `seed`), computed in NumPy for all texts at once with
    the same arithmetic as `MinHash.update_batch` (identical hash values, checked in
    the tests), and is indexed in a datasketch `MinHashLSH(threshold, num_perm)`
    (bands and rows chosen by datasketch). Every pair of texts that shares a bucket
    is confirmed by the *exact* Jaccard similarity of their shingle sets
    (>= threshold): cheap, deterministic, and free of MinHash estimation error; the
    LSH only decides which pairs are looked at. Clusters are the connected
    components of the confirmed pairs (single linkage, as near-duplicate chains are
    transitive in EXTRA's grouping too); labels are numbered by each cluster's
    smallest text index (label 0 holds text 0). Texts with no word get their own
    cluster, shared only with identical texts.

Representatives (`extra_representatives`)
    Per cluster, the member text with the most occurrences (`counts`, default: how
    often that exact text appears in `texts`); ties go to the shorter text, then the
    lexicographically smaller. The index returned is the text's first position.

Reduction (`cluster_summary`)
    reduction % = 100 * (distinct word sequences - clusters) / distinct word sequences:
    repeats of one sentence, and variants that differ only in case or punctuation
    ("so far so good" / "so far, so good"), are one text to begin with, so the figure
    measures what the LSH grouping merges beyond that. `reduction_pct_strings` is the
    same over distinct normalised strings (punctuation variants then count as merges).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np


WORD_PATTERN = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")



def words(text: str) -> list[str]:
    """Lowercased words: letter/digit runs with inner apostrophes (curly ones -> ')."""
    return WORD_PATTERN.findall(text.lower().replace("\u2019", "'"))



def _shingles(ws: list[str], ngram: int, char_ngrams: bool) -> set[str]:
    """Word n-grams (unigrams when shorter), or character n-grams of the joined words."""
    if char_ngrams:
        s = " ".join(ws)
        if len(s) <= ngram:
            return {s}
        return {s[i:i + ngram] for i in range(len(s) - ngram + 1)}
    if len(ws) < ngram:
        return set(ws)
    return {" ".join(ws[i:i + ngram]) for i in range(len(ws) - ngram + 1)}



def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser, the pre-mix of datasketch's "affine32" scheme."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))



@lru_cache(maxsize=16)
def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed).permutations
    return a.astype(np.uint32), b.astype(np.uint32)



@lru_cache(maxsize=16)
def _lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """datasketch's (bands, rows) for the threshold; its grid search runs once per pair."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return lsh.b, lsh.r



def minhash_signatures(shingle_sets: Sequence[Collection[str]], *, num_perm: int = 128,
                       seed: int = 1, chunk_shingles: int = 1 << 16) -> np.ndarray:
    """(n, num_perm) uint32 MinHash values, equal to datasketch's `MinHash.update_batch`.

    Each distinct shingle is hashed once with datasketch's default hash (`sha1_hash32`:
    the first 4 bytes of the SHA-1 of its UTF-8 bytes, little-endian); the permutations
    run in NumPy over chunks of `chunk_shingles` shingles. Every set must be non-empty.
    """
    import pandas as pd

    a, b = _permutations(num_perm, seed)
    n = len(shingle_sets)
    lengths = np.fromiter(map(len, shingle_sets), dtype=np.int64, count=n)
    if n and lengths.min() == 0:
        raise ValueError(f"shingle set {int(np.argmin(lengths))} is empty")
    flat = np.empty(int(lengths.sum()), dtype=object)
    flat[:] = list(chain.from_iterable(shingle_sets))
    codes, uniques = pd.factorize(flat)
    digests = b"".join([hashlib.sha1(s.encode("utf-8")).digest()[:4] for s in uniques])
    hv = _fmix32(np.frombuffer(digests, dtype="<u4").astype(np.uint32))
    flat_hv = hv[codes]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty((len(shingle_sets), num_perm), dtype=np.uint32)
    t0 = 0
    while t0 < n:
        # texts [t0, t1) with at most chunk_shingles shingles (at least one text)
        t1 = max(t0 + 1, int(np.searchsorted(ends, starts[t0] + chunk_shingles, "right")))
        seg = flat_hv[starts[t0]:ends[t1 - 1]]
        # (num_perm, shingles): uint32 arithmetic wraps mod 2^32 as datasketch intends;
        # reducing along the contiguous axis is ~4x faster than along axis 0
        phv = a[:, None] * seg[None, :] + b[:, None]
        out[t0:t1] = np.minimum.reduceat(phv, starts[t0:t1] - starts[t0], axis=1).T
        t0 = t1
    return out



def _pairs_from_codes(codes: list[np.ndarray], n: int) -> np.ndarray:
    if not codes:
        return np.empty((0, 2), dtype=np.int64)
    u = np.unique(np.concatenate(codes))
    return np.stack([u // n, u % n], axis=1)



def lsh_candidate_pairs(sig: np.ndarray, threshold: float, *, seed: int = 1,
                        index: str = "numpy") -> np.ndarray:
    """(m, 2) pairs (i < j, sorted) of signature rows that share an LSH bucket.

    Bands and rows are those datasketch's `MinHashLSH` picks for `threshold` and the
    signature width. `index="datasketch"` inserts LeanMinHash objects into a
    `MinHashLSH` and reads its buckets; `index="numpy"` (default, ~10x faster) does
    the same banding in NumPy: a band's r values are folded into one 64-bit key and
    rows with equal keys share a bucket. Equal bands give equal keys, so its pairs are
    a superset of datasketch's (a 64-bit key collision adds a pair, which the exact
    Jaccard check in `minhash_lsh_clusters` then judges).
    """
    if index not in ("numpy", "datasketch"):
        raise ValueError(f"index must be 'numpy' or 'datasketch', got {index!r}")
    n, num_perm = sig.shape
    bands, rows = _lsh_params(threshold, num_perm)
    if index == "datasketch":
        return _datasketch_pairs(sig, bands, rows, seed)
    mult = np.random.default_rng(0x5EED).integers(1, 1 << 63, size=rows, dtype=np.uint64) | 1
    codes: list[np.ndarray] = []
    with np.errstate(over="ignore"):
        for k in range(bands):
            band = sig[:, k * rows:(k + 1) * rows].astype(np.uint64)
            key = (band * mult[None, :]).sum(axis=1, dtype=np.uint64)
            order = np.argsort(key, kind="stable")
            sk = key[order]
            brk = np.flatnonzero(np.diff(sk)) + 1
            starts = np.concatenate([[0], brk])
            sizes = np.diff(np.concatenate([starts, [n]]))
            for st, sz in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist()):
                m = np.sort(order[st:st + sz])
                i, j = np.triu_indices(sz, 1)
                codes.append(m[i] * n + m[j])
    return _pairs_from_codes(codes, n)



def _datasketch_pairs(sig: np.ndarray, bands: int, rows: int, seed: int) -> np.ndarray:
    from datasketch import LeanMinHash, MinHashLSH

    n, num_perm = sig.shape
    lsh = MinHashLSH(num_perm=num_perm, params=(bands, rows))
    with lsh.insertion_session() as session:
        for j in range(sig.shape[0]):
            session.insert(j, LeanMinHash(seed=seed, hashvalues=sig[j], scheme="affine32"),
                           check_duplication=False)
    codes: list[np.ndarray] = []
    for table in lsh.hashtables:
        for key in table.keys():  # noqa: SIM118 (a datasketch storage, not a dict)
            members = table.get(key)
            if len(members) < 2:
                continue
            m = np.sort(np.fromiter(members, dtype=np.int64, count=len(members)))
            i, j = np.triu_indices(len(m), 1)
            codes.append(m[i] * n + m[j])
    return _pairs_from_codes(codes, n)



def minhash_lsh_clusters(texts: Sequence[str], *, threshold: float = 0.9, num_perm: int = 128,
                         ngram: int = 2, char_ngrams: bool = False, seed: int = 1,
                         index: str = "numpy") -> np.ndarray:
    """Cluster labels (int64, numbered by smallest member index) by MinHash LSH.

    Pairs in a common LSH bucket are merged when the exact Jaccard similarity of their
    shingle sets is >= `threshold`; clusters are connected components. Texts with the
    same word sequence always share a cluster. See the module doc for the details.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(texts)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    if ngram < 1:
        raise ValueError("ngram must be >= 1")
    node_of: dict[Any, int] = {}
    node = np.empty(n, dtype=np.int64)
    for i, t in enumerate(texts):
        ws = words(t)
        key = tuple(ws) if ws else ("\x00", t.strip().lower())
        node[i] = node_of.setdefault(key, len(node_of))
    # nodes with words get shingles; `idx` maps a shingled set back to its node
    idx_list: list[int] = []
    sets: list[set[str]] = []
    for k, key in enumerate(node_of):
        if key[0] != "\x00":
            idx_list.append(k)
            sets.append(_shingles(list(key), ngram, char_ngrams))
    idx = np.asarray(idx_list, dtype=np.int64)
    u = len(node_of)
    rows: np.ndarray = np.empty(0, dtype=np.int64)
    cols: np.ndarray = np.empty(0, dtype=np.int64)
    if len(sets) >= 2:
        sig = minhash_signatures(sets, num_perm=num_perm, seed=seed)
        pairs = lsh_candidate_pairs(sig, threshold, seed=seed, index=index)
        keep = [len(sets[p] & sets[q]) >= threshold * len(sets[p] | sets[q])
                for p, q in pairs.tolist()]
        confirmed = pairs[np.asarray(keep, dtype=bool)] if len(keep) else pairs
        rows, cols = idx[confirmed[:, 0]], idx[confirmed[:, 1]]
    graph = coo_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(u, u))
    _, comp = connected_components(graph, directed=False)
    text_comp = comp[node]
    _, first, inv = np.unique(text_comp, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inv.ravel()]



def extra_representatives(labels: Sequence[int] | np.ndarray, texts: Sequence[str],
                          counts: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Per cluster label 0..k-1, the index of its representative text.

    The member text with the most occurrences (sum of `counts` over its positions;
    default one per position) wins; ties go to the shorter, then the smaller text.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) != len(texts):
        raise ValueError("labels and texts differ in length")
    if len(labels) == 0:
        return np.empty(0, dtype=np.int64)
    k = int(labels.max()) + 1
    cnt = np.ones(len(texts), dtype=np.int64) if counts is None else np.asarray(counts)
    total: dict[tuple[int, str], list] = {}
    for i, (lab, t) in enumerate(zip(labels.tolist(), texts)):
        entry = total.setdefault((lab, t), [0, i])
        entry[0] += cnt[i]
    best: dict[int, tuple] = {}
    for (lab, t), (c, first) in total.items():
        key = (-c, len(t), t)
        if lab not in best or key < best[lab][0]:
            best[lab] = (key, first)
    missing = [lab for lab in range(k) if lab not in best]
    if missing:
        raise ValueError(f"labels are not 0..{k - 1}: {missing[:5]} unused")
    return np.asarray([best[lab][1] for lab in range(k)], dtype=np.int64)



def cluster_summary(labels: Sequence[int] | np.ndarray, texts: Sequence[str]) -> dict:
    """Table 3's counts for a clustering of `texts` (see "Reduction" in the module doc)."""
    labels = np.asarray(labels)
    strings = len(set(texts))
    sequences = len({tuple(words(t)) or ("\x00", t.strip().lower()) for t in texts})
    clusters = len(np.unique(labels))
    return {
        "texts": len(texts),
        "distinct_texts": strings,
        "distinct_word_sequences": sequences,
        "clusters": clusters,
        "reduction_pct": 100.0 * (sequences - clusters) / sequences if sequences else 0.0,
        "reduction_pct_strings": 100.0 * (strings - clusters) / strings if strings else 0.0,
    }
