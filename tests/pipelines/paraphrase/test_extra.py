"""EXTRA baseline (seed 002, Table 3): sentence candidates, recurrence (extra.py), MinHash LSH
groups (minhash.py)."""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from rexeval.pipelines.paraphrase import extra as eb
from rexeval.pipelines.paraphrase import minhash as mh
from rexeval.pipelines.core.ids import statement_id

# -- normalisation -------------------------------------------------------


@pytest.mark.parametrize("raw,norm", [
    ("Good Job !", "good job"),
    ("great toy !!", "great toy"),
    ("Great quality toy.", "great quality toy"),
    ("  \"Works   great?!\" ", "works great"),
    ("Well made , sturdy..", "well made, sturdy"),
    ("so far... so good", "so far... so good"),
    ("*** Five stars ***", "five stars"),
    ("It\u2019s GREAT :)", "it\u2019s great"),
])
def test_normalise_candidate(raw, norm):
    assert eb.normalise_candidate(raw) == norm


# -- candidate filter ---------------------------------------------------------------------


@pytest.mark.parametrize("sentence,reason", [
    ("Great quality toy.", "ok"),
    ("It works great", "ok"),  # "it" is the product
    ("Its sound is warm and clear", "ok"),
    ("great!", "too_short"),
    ("I love this toy", "pronoun"),
    ("My son plays with it daily", "pronoun"),
    ("Highly recommended to you all", "pronoun"),
    ("They're great strings", "pronoun"),
    ("im happy with it", "pronoun"),
    ("Gave it to her as a gift", "pronoun"),
    ("Send us a photo", "pronoun"),
    ("Made in the US", "ok"),
    ("No ill effects so far", "ok"),
    ("12345 678", "no_letter"),
    (":) :)", "empty"),
    ("!!!", "empty"),
    ("See http://example.org/x for specs", "url"),
    ("cheaper at amazon.com now", "url"),
    (" ".join(["word"] * 21), "too_long"),
])
def test_is_candidate_reasons(sentence, reason):
    ok, why = eb.is_candidate(sentence)
    assert (ok, why) == (reason == "ok", reason)


def test_is_candidate_word_range_is_inclusive():
    """min_words and max_words are both allowed; one outside is not."""
    assert eb.is_candidate(" ".join(["good"] * 20)) == (True, "ok")
    assert eb.is_candidate("good sound", min_words=2) == (True, "ok")
    assert eb.is_candidate("good sound", min_words=3) == (False, "too_short")
    assert eb.is_candidate("a b c d", max_words=3) == (False, "too_long")


# -- recurrence -----------------------------------------------------------------------------


def _reviews(spec: list[tuple[str, int]]) -> list[dict]:
    """One review per (text, copy): the same text written in `count` distinct reviews."""
    out = []
    for text, count in spec:
        for _ in range(count):
            k = len(out)
            out.append({"review_id": f"r{k}", "user_id": f"u{k}", "item_id": f"i{k % 3}",
                        "text": text})
    return out


@pytest.mark.parametrize("recurrence", ["exact", "lsh"])
def test_min_count_keeps_recurring_sentences(recurrence):
    """In 5 distinct reviews a sentence is kept, in 4 it is dropped as rare."""
    reviews = _reviews([
        ("Great quality toy. I bought it for my son!", 5),
        ("Works fine for the price. Fine.", 4),
        ("Great quality toy. Great, quality toy!!", 1),  # twice in one review (up to a comma)
    ])
    table, stats = eb.extra_candidates(reviews, min_count=5, recurrence=recurrence)
    assert table.schema.equals(eb.STATEMENTS)
    assert set(table.column("statement").to_pylist()) == {"great quality toy"}
    assert table.num_rows == 6  # five reviews + the one that repeats it
    rows = table.to_pylist()
    for r in rows:
        assert r["stage"] == "extra" and r["sentiment"] is None
        assert r["statement_id"] == statement_id(r["review_id"], "extra", r["statement"], None)
    assert len({r["statement_id"] for r in rows}) == table.num_rows
    assert stats["sentences"] == 5 * 2 + 4 * 2 + 2
    assert stats["kept"] == 6
    assert stats["dropped"] == {"pronoun": 5, "rare": 4, "too_short": 4,
                                "duplicate_in_review": 1}
    assert stats["sentences"] == stats["kept"] + sum(stats["dropped"].values())


def test_extra_candidates_accepts_an_arrow_table():
    reviews = _reviews([("Great quality toy.", 5), ("Nice strings.", 2)])
    from_dicts, s1 = eb.extra_candidates(reviews)
    from_table, s2 = eb.extra_candidates(pa.Table.from_pylist(reviews))
    assert from_dicts.equals(from_table) and s1 == s2
    with pytest.raises(ValueError, match="lacks columns"):
        eb.extra_candidates(pa.table({"review_id": ["r"]}))


def test_lsh_recurrence_counts_the_group():
    """Punctuation variants recur together under "lsh" but not one by one under "exact"."""
    reviews = _reviews([("So far so good.", 3), ("So far, so good!", 2)])
    exact, s_exact = eb.extra_candidates(reviews, recurrence="exact")
    lsh, s_lsh = eb.extra_candidates(reviews, recurrence="lsh")
    assert exact.num_rows == 0 and s_exact["dropped"] == {"rare": 5}
    assert sorted(set(lsh.column("statement").to_pylist())) == [
        "so far so good", "so far, so good"]
    assert s_lsh["kept"] == 5 and s_lsh["dropped"] == {}
    with pytest.raises(ValueError, match="recurrence"):
        eb.extra_candidates(reviews, recurrence="fuzzy")


# -- MinHash LSH --------------------------------------------------------------------------------


def test_signatures_equal_datasketch_minhash():
    """The NumPy signatures are datasketch's own MinHash values, bit for bit."""
    from datasketch import MinHash

    sets = [{"great toy"}, {"good job", "job great", "great toy"}, {"\u00e9t\u00e9 chaud"},
            {f"w{i} w{i + 1}" for i in range(300)}]
    for num_perm, seed in ((128, 1), (64, 7)):
        sig = mh.minhash_signatures(sets, num_perm=num_perm, seed=seed, chunk_shingles=50)
        for row, s in zip(sig, sets):
            m = MinHash(num_perm=num_perm, seed=seed)
            m.update_batch([x.encode("utf-8") for x in s])
            np.testing.assert_array_equal(row, m.hashvalues)
    with pytest.raises(ValueError, match="empty"):
        mh.minhash_signatures([{"a"}, set()])


def test_numpy_banding_matches_datasketch_lsh():
    """The NumPy bucketing finds the pairs datasketch's MinHashLSH finds."""
    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(vocab, 8)) for _ in range(150)]
    texts += [t.rsplit(" ", 1)[0] + " zz" for t in texts[:60]]  # near-duplicates
    sets = [mh._shingles(eb.words(t), 2, False) for t in texts]
    sig = mh.minhash_signatures(sets)
    for threshold in (0.5, 0.8):
        ours = mh.lsh_candidate_pairs(sig, threshold, index="numpy")
        theirs = mh.lsh_candidate_pairs(sig, threshold, index="datasketch")
        assert len(theirs) > 0
        np.testing.assert_array_equal(ours, theirs)


LONG = ("the tuner clips on the headstock and reads every string quickly even in a loud "
        "room with the band playing")


def test_one_word_change_merges_at_a_lower_threshold():
    """A long sentence with one word swapped (Jaccard ~0.8) is grouped at 0.7, not 0.9."""
    near = LONG.replace("quickly", "fast")
    assert mh.minhash_lsh_clusters([LONG, near], threshold=0.9).tolist() == [0, 1]
    assert mh.minhash_lsh_clusters([LONG, near], threshold=0.7).tolist() == [0, 0]


def test_paraphrases_with_other_words_do_not_merge():
    """EXTRA's known limitation: the same opinion in other words is never grouped."""
    texts = ["the product breaks after a few uses", "it fell apart after some months"]
    for threshold in (0.9, 0.5, 0.2):
        assert mh.minhash_lsh_clusters(texts, threshold=threshold).tolist() == [0, 1]


def test_identical_texts_always_share_a_cluster():
    texts = ["great toy", "Great toy!", "good job", "great toy", "great", "great", "", "!!", "!!"]
    labels = mh.minhash_lsh_clusters(texts)
    assert labels.tolist() == [0, 0, 1, 0, 2, 2, 3, 4, 4]
    assert labels.dtype == np.int64


def test_labels_are_deterministic_and_numbered_by_first_member():
    rng = np.random.default_rng(5)
    vocab = [f"w{i}" for i in range(30)]
    base = [" ".join(rng.choice(vocab, 10)) for _ in range(80)]
    texts = base + [t.rsplit(" ", 1)[0] + " zz" for t in base[::2]]
    rng.shuffle(texts)
    a = mh.minhash_lsh_clusters(texts, threshold=0.6, seed=3)
    b = mh.minhash_lsh_clusters(texts, threshold=0.6, seed=3)
    np.testing.assert_array_equal(a, b)
    _, first = np.unique(a, return_index=True)
    assert a[0] == 0 and np.all(np.diff(first) > 0)
    assert a.max() + 1 < len(set(texts))  # some near-duplicates were grouped


def test_character_ngrams_catch_spelling_variants():
    """Word bigrams miss a typo in a short sentence; character trigrams do not."""
    texts = ["great sound quality overall", "great sound qualty overall"]
    assert mh.minhash_lsh_clusters(texts, threshold=0.6).tolist() == [0, 1]
    assert mh.minhash_lsh_clusters(texts, threshold=0.6, ngram=3,
                                   char_ngrams=True).tolist() == [0, 0]


def test_empty_input():
    assert mh.minhash_lsh_clusters([]).shape == (0,)
    assert mh.extra_representatives([], []).shape == (0,)
    table, stats = eb.extra_candidates([])
    assert table.num_rows == 0 and stats["sentences"] == 0 and stats["dropped"] == {}


# -- representatives and summary ------------------------------------------------------------


def test_representative_is_the_most_frequent_member():
    texts = ["so far, so good", "so far so good", "so far so good", "good job",
             "great strings", "nice strings", "warm tone", "fine tone"]
    labels = np.array([0, 0, 0, 1, 2, 2, 3, 3])
    # ties: the shorter ("nice strings"), then the smaller ("fine tone")
    assert mh.extra_representatives(labels, texts).tolist() == [1, 3, 5, 7]
    counts = [5, 1, 1, 1, 2, 1, 1, 1]
    assert mh.extra_representatives(labels, texts, counts).tolist() == [0, 3, 4, 7]
    with pytest.raises(ValueError, match="0..2"):
        mh.extra_representatives([0, 2, 2], ["a", "b", "c"])


def test_cluster_summary_counts_merges_beyond_punctuation():
    texts = ["so far so good", "so far, so good", "so far so good", "good job", "good jobs"]
    s = mh.cluster_summary([0, 0, 0, 1, 1], texts)
    assert s["texts"] == 5 and s["distinct_texts"] == 4
    assert s["distinct_word_sequences"] == 3 and s["clusters"] == 2
    assert s["reduction_pct"] == pytest.approx(100 / 3)
    assert s["reduction_pct_strings"] == pytest.approx(50.0)


# -- shared real data -------------------------------------------------------------------------


def test_extra_on_shared_reviews(shared_csv):
    """On real Amazon reviews EXTRA keeps generic sentences and merges almost nothing."""
    pd = pytest.importorskip("pandas")
    from rexeval.pipelines.core.ids import review_ids

    cols = ["reviewerID", "asin", "reviewerName", "helpful", "reviewText", "overall",
            "summary", "unixReviewTime", "reviewTime"]
    df = pd.read_csv(shared_csv, header=None, names=cols, dtype=str, keep_default_na=False)
    reviews = pa.table({
        "review_id": review_ids(df["reviewerID"].tolist(), df["asin"].tolist(),
                                df["unixReviewTime"].tolist()),
        "user_id": df["reviewerID"].tolist(), "item_id": df["asin"].tolist(),
        "text": df["reviewText"].tolist()})
    t0 = time.perf_counter()
    table, stats = eb.extra_candidates(reviews, min_count=5)
    texts = table.column("statement").to_pylist()
    labels = mh.minhash_lsh_clusters(texts)
    summary = mh.cluster_summary(labels, texts)
    elapsed = time.perf_counter() - t0
    print(f"\nEXTRA on {shared_csv.name}: {stats}\n{summary}\n{elapsed:.1f} s")
    assert stats["reviews"] == len(df)
    assert stats["sentences"] == stats["kept"] + sum(stats["dropped"].values())
    assert stats["kept"] > 0 and stats["dropped"]["pronoun"] > 0
    assert "highly recommended" in texts  # frequent and generic
    assert summary["reduction_pct"] < 5.0
    reps = mh.extra_representatives(labels, texts)
    assert len(reps) == summary["clusters"]
