"""The NLI engine on tiny random 3-label checkpoints, checked against manual forward passes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rexeval.models.encoders.nli import (
    CON,
    ENT,
    NEU,
    NLI_LABELS,
    NLIScorer,
    build_nli,
    label_class,
    nli_columns,
)
from rexeval.models.encoders.pair_batching import BatchStats, dedupe, length_batches
from rexeval.models.refs import ModelUnavailable
from tests.doubles.tiny_encoders import build_tiny_bert

PREMISES = [
    "the product is loud and the strings sound bright and the tuner clips on firmly",
    "yes",
    "the cable is cheap, noisy and broke after two weeks",
    "the tuner holds pitch well",
    "no",
    "the product makes a lot of noise",
]
HYPOTHESES = [
    "the product makes a lot of noise",
    "no",
    "the cable broke",
    "the tuner holds pitch well and clips on firmly and the strings sound bright",
    "yes no yes no",
    "the product is loud",
]


def manual_probs(location, premise: str, hypothesis: str) -> np.ndarray:
    """Softmax of one unpadded forward pass, in the model's own output order."""
    tok = AutoTokenizer.from_pretrained(location)
    model = AutoModelForSequenceClassification.from_pretrained(location).eval()
    with torch.inference_mode():
        logits = model(**tok(premise, hypothesis, return_tensors="pt")).logits[0]
    return torch.softmax(logits.float(), -1).numpy()


@pytest.fixture(scope="module")
def nli(tiny_bert) -> NLIScorer:
    return build_nli(str(tiny_bert[3]), device="cpu")


@pytest.fixture(scope="module")
def permuted(tmp_path_factory) -> str:
    """A tiny 3-label model with its labels in the order of the MNLI checkpoints."""
    folder = tmp_path_factory.mktemp("nli-permuted") / "model"
    return str(build_tiny_bert(folder, 3, id2label={0: "CONTRADICTION", 1: "NEUTRAL",
                                                    2: "ENTAILMENT"}))


def test_scores_are_softmax_in_fixed_column_order(nli, tiny_bert):
    assert (ENT, NEU, CON) == (0, 1, 2) and NLI_LABELS == ("entailment", "neutral",
                                                           "contradiction")
    assert nli.columns == (0, 1, 2) and nli.device == "cpu"
    probs = nli.score(PREMISES, HYPOTHESES)
    assert probs.dtype == np.float32 and probs.shape == (len(PREMISES), 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert probs.std(axis=0).max() > 1e-3  # random weights, yet not constant
    for i in (0, 3):
        np.testing.assert_allclose(probs[i], manual_probs(tiny_bert[3], PREMISES[i],
                                                          HYPOTHESES[i]), atol=1e-5)
    np.testing.assert_array_equal(nli.score_pairs(list(zip(PREMISES, HYPOTHESES))), probs)


def test_label_order_is_read_from_the_config(permuted):
    scorer = build_nli(permuted, device="cpu")
    assert scorer.columns == (2, 1, 0)
    probs = scorer.score(PREMISES, HYPOTHESES)
    for i, (p, h) in enumerate(zip(PREMISES, HYPOTHESES)):
        raw = manual_probs(permuted, p, h)  # model order: contradiction, neutral, entailment
        np.testing.assert_allclose(probs[i], raw[[2, 1, 0]], atol=1e-5)
    # An explicit label_order overrides id2label: declared as (ent, neu, con), the
    # columns come out reversed.
    forced = NLIScorer(permuted, device="cpu", label_order=NLI_LABELS)
    np.testing.assert_allclose(forced.score(PREMISES, HYPOTHESES), probs[:, ::-1], atol=1e-6)


def test_label_names_and_aliases():
    assert nli_columns({0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"}) == (0, 1, 2)
    assert nli_columns({"0": "contradiction", "1": "entailment", "2": "neutral"}) == (1, 2, 0)
    assert nli_columns({0: "Contra", 1: "Neutr", 2: "Entail"}) == (2, 1, 0)
    assert nli_columns({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"},
                       ["contradict", "neutral", "entails"]) == (2, 1, 0)
    assert label_class(" Not-Entailment ") is None and label_class("ENTAILMENT") == ENT
    for labels in ({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"},
                   {0: "entailment", 1: "entailment", 2: "contradiction"},
                   {0: "not_entailment", 1: "neutral", 2: "contradiction"}, None):
        with pytest.raises(ValueError, match=r"cannot tell which outputs.*label_order="):
            nli_columns(labels, model_ref="ckpt")
    with pytest.raises(ValueError, match="label_order must name the class of each"):
        nli_columns({}, ("entailment", "neutral"))
    with pytest.raises(ValueError, match=r"label_order=\('a', 'neutral', 'entailment'\)"):
        nli_columns({}, ("a", "neutral", "entailment"))


def test_models_that_are_not_3_way_nli_are_refused(tiny_bert, tmp_path):
    with pytest.raises(ValueError, match=r"2-label classifier.*not a 3-way NLI model"):
        build_nli(str(tiny_bert[2]), device="cpu")
    with pytest.raises(ValueError, match=r"1-label classifier"):
        NLIScorer(str(tiny_bert[1]), device="cpu")
    unnamed = build_tiny_bert(tmp_path / "unnamed", 3)  # LABEL_0..LABEL_2
    with pytest.raises(ValueError, match=r"unnamed.*cannot tell which outputs.*'LABEL_0'"):
        build_nli(str(unnamed), device="cpu")
    # ... unless the order is given.
    assert build_nli(str(unnamed), device="cpu",
                     label_order=("neutral", "entailment", "contradiction")).columns == (1, 0, 2)


def test_a_model_without_a_trained_head_is_refused(tmp_path, tiny_bert):
    from transformers import AutoConfig, BertModel

    config = AutoConfig.from_pretrained(tiny_bert[3])
    folder = tmp_path / "base"
    BertModel(config).save_pretrained(folder)  # encoder only, architectures BertModel
    with pytest.raises(ValueError, match=r"\['BertModel'\].*ForSequenceClassification"):
        NLIScorer(str(folder), device="cpu")


def test_duplicates_are_scored_once_and_mapped_back(nli):
    pairs = list(zip(PREMISES, HYPOTHESES))
    order = [0, 1, 0, 2, 0, 1, 3, 4, 5, 5, 2]
    probs = nli.score_pairs([pairs[i] for i in order], batch_size=4)
    stats = nli.last_stats
    assert isinstance(stats, BatchStats)
    assert (stats.pairs, stats.unique_pairs, stats.batches) == (11, 6, 2)
    assert stats.real_tokens <= stats.padded_tokens and stats.pad_tokens >= 0
    assert 0.0 <= stats.padding_fraction < 1.0
    assert set(stats.as_dict()) >= {"pairs", "unique_pairs", "batches", "real_tokens",
                                    "padded_tokens", "pad_tokens", "padding_fraction"}
    once = nli.score(PREMISES, HYPOTHESES)
    np.testing.assert_allclose(probs, once[order], atol=1e-5)
    # Same pair, same row, bit for bit (one forward result copied).
    np.testing.assert_array_equal(probs[0], probs[2])
    np.testing.assert_array_equal(probs[0], probs[4])


def test_batched_equals_one_at_a_time_in_input_order(nli):
    batched = nli.score(PREMISES, HYPOTHESES, batch_size=3)
    single = np.stack([nli.score([p], [h], batch_size=1)[0]
                       for p, h in zip(PREMISES, HYPOTHESES)])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    # Input order is kept although the batches ran in length order; reversing the input
    # reverses the output.
    lengths = [len(row["input_ids"]) for row in nli.encode(PREMISES, HYPOTHESES)]
    assert lengths != sorted(lengths)
    reverse = nli.score(PREMISES[::-1], HYPOTHESES[::-1], batch_size=3)
    np.testing.assert_allclose(reverse, batched[::-1], atol=1e-5)
    # Length bucketing: less padding than batching in input order would give.
    assert nli.last_stats.padded_tokens < sum(
        len(chunk) * max(chunk) for chunk in (lengths[i:i + 3] for i in range(0, 6, 3)))


def test_the_overlapped_gpu_loop_gives_the_same_rows_in_input_order(tiny_bert, monkeypatch):
    """The CUDA loop (tokenising chunk k+1 in a thread while chunk k's batches are queued,
    one copy back) forced on here on the CPU: the same probabilities as the plain loop,
    over several chunks and with duplicates."""
    import rexeval.models.encoders.pair_batching as pb

    monkeypatch.setattr(pb, "OVERLAP_CHUNK_BATCHES", 2)  # 2 batches of 2: chunks of 4 pairs
    plain = NLIScorer(str(tiny_bert[3]), device="cpu", overlap=False)
    over = NLIScorer(str(tiny_bert[3]), device="cpu", overlap=True)
    assert over.overlaps() and not plain.overlaps()
    order = [5, 0, 1, 0, 2, 3, 4, 5, 1, 2, 3]
    prem, hyp = [PREMISES[i] for i in order], [HYPOTHESES[i] for i in order]
    want = plain.score(prem, hyp, batch_size=2)
    got = over.score(prem, hyp, batch_size=2)
    assert got.dtype == np.float32 and got.shape == (11, 3)
    # Other batches (sorted within a chunk) than the plain loop's: float rounding only,
    # where rows differ from each other by up to ~0.6.
    np.testing.assert_allclose(got, want, atol=1e-5)
    stats = over.last_stats
    assert (stats.pairs, stats.unique_pairs) == (11, 6)
    assert stats.batches == 3  # chunks of 4 and 2 distinct pairs: 2 + 1 batches
    assert over.score([], []).shape == (0, 3)


def test_overlap_is_chosen_on_cuda_only_for_large_models_that_launch(tiny_bert, monkeypatch):
    import rexeval.models.encoders.pair_batching as pb
    from rexeval.models.encoders.pair_batching import BatchedPairModel

    nli = NLIScorer(str(tiny_bert[3]), device="cpu")
    assert nli.overlap == "auto" and not nli.overlaps()
    nli.device = "cuda:0"  # what the choice reads; nothing runs
    assert not nli.overlaps()  # a small model: the CPU is the bottleneck, the plain loop wins
    size = sum(p.numel() for p in nli.model.parameters())
    monkeypatch.setattr(pb, "OVERLAP_MIN_PARAMETERS", size)
    assert nli.overlaps()
    nli.overlap = False
    assert not nli.overlaps()

    class NoLaunch(BatchedPairModel):
        def _encode(self, pairs):
            return []

        def _forward(self, batch):
            return np.ones(len(batch))

    other = NoLaunch(str(tiny_bert[3]), device="cpu", overlap=True)
    assert not other.overlaps()  # no _launch of its own: the plain loop, whatever is asked
    assert other._launch([{}, {}]).tolist() == [1.0, 1.0]  # the default wraps _forward
    with pytest.raises(ValueError, match="overlap"):
        NLIScorer(str(tiny_bert[3]), device="cpu", overlap="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_scores_match_the_cpu_with_either_loop(tiny_bert):
    cpu = NLIScorer(str(tiny_bert[3]), device="cpu").score(PREMISES * 3, HYPOTHESES[::-1] * 3)
    for dtype, tol in (("float32", 1e-4), ("bfloat16", 0.05)):
        gpu = NLIScorer(str(tiny_bert[3]), device="cuda", dtype=dtype, batch_size=4)
        assert next(gpu.model.parameters()).dtype == getattr(torch, dtype)
        for overlap in (False, True):
            gpu.overlap = overlap
            got = gpu.score(PREMISES * 3, HYPOTHESES[::-1] * 3)
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, cpu, atol=tol)


def test_forward_batches_give_the_same_probabilities(nli):
    batches = nli.prepare_batches(PREMISES + PREMISES[:2], HYPOTHESES + HYPOTHESES[:2],
                                  batch_size=4)
    assert len(batches) == 2 and all(b["input_ids"].shape[0] <= 4 for b in batches)
    got = np.concatenate(nli.forward_batches(batches))
    assert got.shape == (6, 3) and got.dtype == np.float32  # duplicates dropped
    lengths = [len(r["input_ids"]) for r in nli.encode(PREMISES, HYPOTHESES)]
    order = [i for chunk in length_batches(lengths, 4) for i in chunk]
    np.testing.assert_allclose(got, nli.score(PREMISES, HYPOTHESES)[order], atol=1e-5)


def test_empty_and_malformed_input(nli):
    empty = nli.score([], [])
    assert empty.shape == (0, 3) and empty.dtype == np.float32
    assert nli.last_stats.pairs == 0 and nli.last_stats.batches == 0
    assert nli.score_pairs([]).shape == (0, 3)
    with pytest.raises(ValueError, match=r"differ in length \(2 vs 1\)"):
        nli.score(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="premises must be a sequence of strings"):
        nli.score("a premise", "a hypothesis")
    with pytest.raises(TypeError, match="pair 1 must be two strings"):
        nli.score(["a", None], ["b", "c"])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        nli.score(["a"], ["b"], batch_size=-1)


def test_long_premises_are_cut_first(tiny_bert):
    scorer = NLIScorer(str(tiny_bert[3]), device="cpu", max_length=24)
    long = " ".join(["the product is loud"] * 30)
    short = "the cable broke"
    rows = scorer.encode([long, short, long, "yes"], [short, long, long, "no"])
    assert [len(r["input_ids"]) for r in rows][:3] == [24, 24, 24]
    assert len(rows[3]["input_ids"]) < 24  # short pairs are left alone
    hyp = scorer.tokenizer(short, add_special_tokens=False)["input_ids"]
    # premise first: the whole hypothesis survives at the end of the pair
    assert rows[0]["input_ids"][-len(hyp) - 1:-1] == hyp
    assert rows[0]["token_type_ids"].count(1) == len(hyp) + 1
    # a hypothesis longer than max_length on its own: both sides are cut
    assert 0 < rows[1]["token_type_ids"].count(0) and 0 < rows[1]["token_type_ids"].count(1)
    probs = scorer.score([long, short, long], [short, long, long])
    assert probs.shape == (3, 3) and np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="leaves no room"):
        NLIScorer(str(tiny_bert[3]), device="cpu", max_length=3)


def test_missing_checkpoint_says_how_to_supply_one(tmp_path):
    with pytest.raises(ModelUnavailable) as err:
        build_nli(str(tmp_path / "no" / "such" / "ckpt"))
    msg = str(err.value)
    assert "No PyPI package ships an NLI model" in msg and "--model nli=" in msg
    assert "StEnt" in msg
    with pytest.raises(ModelUnavailable, match="cannot get its config.json"):
        build_nli("some-org/not-a-cached-nli-model")  # hub id, offline in tests
    with pytest.raises(ModelUnavailable, match="empty reference"):
        build_nli("")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty/config\.json not found.*NLI"):
        build_nli(str(empty))


def test_shared_helpers():
    items, inverse = dedupe([("a", "b"), ("c", "d"), ("a", "b")])
    assert items == [("a", "b"), ("c", "d")] and inverse.tolist() == [0, 1, 0]
    assert length_batches([5, 1, 3, 1], 2) == [[1, 3], [2, 0]]
    with pytest.raises(ValueError):
        length_batches([1], 0)
