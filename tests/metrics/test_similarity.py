"""BERTScore and STS (metrics/similarity.py, BERTScore's model in models/encoders/bertscore_model.py)
with the packaged all-MiniLM-L6-v2."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rexeval.metrics.registry import get_metric
from rexeval.metrics.similarity import (
    BERTSCORE_KEYS,
    IdfWeights,
    bertscore,
    bertscore_f1,
    bertscore_idf,
    sts,
)
from rexeval.models.encoders import bertscore_model
from rexeval.models.encoders.bertscore_model import get_bertscorer

LAYERS = 6  # all-MiniLM-L6-v2 has 6 layers; the local profile's bertscore_num_layers

PAIRS = [
    ("the strings are bright and the tuning holds well",
     "these strings sound bright; tuning stays stable"),
    ("great value for the price", "the price is a bargain for what you get"),
    ("the pedal hums when plugged into my amp", "no noise at all from this pedal"),
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These tiny batches run ~20x faster on one intra-op thread than on two busy cores
    (each op otherwise waits for the second thread); restored after the module."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def minilm() -> str:
    pytest.importorskip("bert_score")
    from rexeval.models.refs import ModelUnavailable, resolve

    try:
        return resolve("all-MiniLM-L6-v2").location
    except ModelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def embedder(minilm):
    from rexeval.models.encoders.embedder import build_embedder

    return build_embedder("all-MiniLM-L6-v2", device="cpu")


class FakeEncoder:
    """Fixed, deliberately non-unit vectors per text; counts what it was asked."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = table
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return np.array([self.table[t] for t in texts], dtype=np.float32)


# ------------------------------------------------------------------------ BERTScore

def test_identical_texts_score_one(minilm):
    texts = [p[0] for p in PAIRS]
    out = bertscore(texts, texts, minilm, LAYERS)
    assert set(out) == set(BERTSCORE_KEYS)
    for key in BERTSCORE_KEYS:
        assert out[key].dtype == np.float64 and out[key].shape == (3,)
        np.testing.assert_allclose(out[key], 1.0, atol=1e-5)


def _layer_embeddings(model, tokenizer, text: str, layer: int):
    import torch

    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc, output_hidden_states=True).hidden_states[layer][0]
    return (hidden / hidden.norm(dim=-1, keepdim=True)).double().numpy()


def test_greedy_matching_by_hand(minilm):
    """P = mean over candidate tokens of the best cosine with a reference token, R the
    other way round, F = 2PR/(P+R), on layer-6 hidden states. As in bert-score, [CLS]
    and [SEP] are left out of the means but stay available as best matches."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm)
    model = AutoModel.from_pretrained(minilm).eval()
    got = bertscore([c for c, _ in PAIRS], [r for _, r in PAIRS], minilm, LAYERS)
    for i, (cand, ref) in enumerate(PAIRS):
        c = _layer_embeddings(model, tokenizer, cand, LAYERS)
        r = _layer_embeddings(model, tokenizer, ref, LAYERS)
        sim = c @ r.T                       # rows: candidate tokens, cols: reference tokens
        p = sim[1:-1, :].max(axis=1).mean()  # candidate tokens without [CLS]/[SEP]
        rec = sim[:, 1:-1].max(axis=0).mean()
        f = 2 * p * rec / (p + rec)
        assert got["bertscore_p"][i] == pytest.approx(p, abs=1e-4)
        assert got["bertscore_r"][i] == pytest.approx(rec, abs=1e-4)
        assert got["bertscore_f1"][i] == pytest.approx(f, abs=1e-4)


def test_sentiment_flip_barely_noticed(minilm, embedder):
    """The seed's point: similarity metrics stay high when the opinion is reversed."""
    cand, ref = ["the strings are bright"], ["the strings are not bright"]
    f1 = bertscore(cand, ref, minilm, LAYERS)["bertscore_f1"][0]
    assert 0.8 < f1 < 1.0
    assert 0.8 < sts(cand, ref, embedder)[0] < 1.0


def test_registered_functions_and_cache(minilm):
    for name in ("bertscore-p", "bertscore-r", "bertscore-f1", "sts"):
        info = get_metric(name)
        assert info.higher_is_better and info.kind == "per_example"
    cands, refs = [c for c, _ in PAIRS], [r for _, r in PAIRS]
    np.testing.assert_array_equal(bertscore_f1(cands, refs, minilm, LAYERS),
                                  bertscore(cands, refs, minilm, LAYERS)["bertscore_f1"])
    assert get_bertscorer(minilm, LAYERS, "cpu") is get_bertscorer(minilm, LAYERS, "cpu")


def test_empty_inputs_and_empty_texts(minilm):
    # No pairs: empty arrays and no model is loaded (a bogus location is never opened).
    out = bertscore([], [], "/no/such/model", LAYERS)
    assert all(out[k].shape == (0,) and out[k].dtype == np.float64 for k in BERTSCORE_KEYS)
    assert bertscore(["", "  "], ["a reference", ""], "/no/such/model", LAYERS)[
        "bertscore_f1"].tolist() == [0.0, 0.0]
    # Mixed: empty sides score 0, the others as if scored alone.
    mixed = bertscore(["", PAIRS[0][0]], ["text", PAIRS[0][1]], minilm, LAYERS)
    alone = bertscore([PAIRS[0][0]], [PAIRS[0][1]], minilm, LAYERS)
    for key in BERTSCORE_KEYS:
        assert mixed[key][0] == 0.0
        assert mixed[key][1] == pytest.approx(alone[key][0], abs=1e-6)


def test_input_errors(minilm):
    with pytest.raises(ValueError, match="2 candidates but 1 references"):
        bertscore(["a", "b"], ["a"], minilm, LAYERS)
    with pytest.raises(ValueError, match="candidates but"):
        sts(["a"], [], FakeEncoder({}))
    with pytest.raises(TypeError, match="not one string"):
        bertscore("a text", ["a"], minilm, LAYERS)
    with pytest.raises(TypeError, match=r"references\[0\]"):
        sts(["a"], [None], FakeEncoder({}))
    with pytest.raises(ValueError, match="no default layer"):
        bertscore(["a"], ["b"], "/some/local/checkpoint", None)
    assert bertscore_model.default_num_layers("roberta-large") == 17


def test_rescaling_needs_a_baseline_path(minilm, tmp_path):
    with pytest.raises(ValueError, match="baseline_path"):
        bertscore(["a"], ["b"], minilm, LAYERS, rescale_with_baseline=True)
    with pytest.raises(FileNotFoundError):
        bertscore(["a"], ["b"], minilm, LAYERS, rescale_with_baseline=True,
                  baseline_path=str(tmp_path / "missing.tsv"))
    base = tmp_path / "minilm.tsv"
    rows = ["LAYER,P,R,F"] + [f"{i},0.{i}1,0.{i}2,0.{i}3" for i in range(7)]
    base.write_text("\n".join(rows) + "\n")
    cands, refs = [c for c, _ in PAIRS], [r for _, r in PAIRS]
    raw = bertscore(cands, refs, minilm, LAYERS)
    scaled = bertscore(cands, refs, minilm, LAYERS, rescale_with_baseline=True,
                       baseline_path=str(base))
    for key, b in zip(BERTSCORE_KEYS, (0.61, 0.62, 0.63)):
        np.testing.assert_allclose(scaled[key], (raw[key] - b) / (1 - b), atol=1e-12)


def test_idf_weights_match_the_package(minilm):
    import bert_score

    cands, refs = [c for c, _ in PAIRS], [r for _, r in PAIRS]
    ours = bertscore(cands, refs, minilm, LAYERS, idf=True)
    corpus = bertscore_idf(refs, minilm)
    assert isinstance(corpus, IdfWeights) and corpus.num_docs == 3
    again = bertscore(cands, refs, minilm, LAYERS, idf=corpus)
    p, r, f = bert_score.score(cands, refs, model_type=minilm, num_layers=LAYERS, idf=True,
                               nthreads=0, device="cpu")
    for key, theirs in zip(BERTSCORE_KEYS, (p, r, f)):
        np.testing.assert_allclose(ours[key], theirs.numpy(), atol=1e-5)
        np.testing.assert_array_equal(ours[key], again[key])


def test_tokenizer_without_max_length_is_fixed(minilm, tmp_path):
    """transformers reports 1e30 when a checkpoint names no model_max_length; the Rust
    tokenizer then fails on every text (OverflowError) unless the limit is set."""
    for name in os.listdir(minilm):
        if name != "tokenizer_config.json":
            os.symlink(os.path.join(minilm, name), tmp_path / name)
    with open(os.path.join(minilm, "tokenizer_config.json")) as fh:
        config = json.load(fh)
    config.pop("model_max_length", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    try:
        scorer = get_bertscorer(str(tmp_path), LAYERS, "cpu")
        assert scorer._tokenizer.model_max_length == 512
        long = " ".join(["guitar"] * 700)  # longer than the model's 512 positions
        out = bertscore([long, "bright strings"], ["guitar", "bright strings"],
                        str(tmp_path), LAYERS)
        assert np.isfinite(out["bertscore_f1"]).all()
        assert out["bertscore_f1"][1] == pytest.approx(1.0, abs=1e-5)
    finally:
        bertscore_model._SCORERS.pop((str(tmp_path), LAYERS, "cpu"), None)


# ------------------------------------------------------------------------------ STS

def test_sts_equals_manual_cosine(embedder):
    cands, refs = [c for c, _ in PAIRS], [r for _, r in PAIRS]
    got = sts(cands, refs, embedder)
    a, b = embedder.encode(cands), embedder.encode(refs)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got, np.sum(a.astype(np.float64) * b, axis=1), atol=1e-5)
    assert got.dtype == np.float64
    np.testing.assert_allclose(sts(cands, cands, embedder), 1.0, atol=1e-5)


def test_sts_normalises_deduplicates_and_handles_empty():
    enc = FakeEncoder({"x": [3.0, 4.0], "y": [0.0, 2.0], "z": [-1.0, 0.0]})
    got = sts(["x", "x", "", "z", "y"], ["y", "x", "y", "x", "  "], enc)
    np.testing.assert_allclose(got, [0.8, 1.0, 0.0, -0.6, 0.0], atol=1e-6)
    assert len(enc.calls) == 1 and sorted(enc.calls[0]) == ["x", "y", "z"]
    empty = sts([], [], enc)
    assert empty.shape == (0,) and empty.dtype == np.float64
    assert len(enc.calls) == 1  # nothing to encode, no call
