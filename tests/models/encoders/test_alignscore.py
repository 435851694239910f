"""The AlignScore engine on tiny random checkpoints in the AlignScore package's format:
loading without lightning, finding the base config, and the ALIGNED probability checked
against a manual forward pass."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rexeval.models.encoders.alignscore import (
    AlignScorer,
    build_alignscore,
    read_alignscore_checkpoint,
)
from rexeval.models.refs import ModelUnavailable
from tests.doubles.tiny_alignscore import (
    SENTENCES,
    build_tiny_alignscore,
    build_tiny_roberta_base,
    long_text,
)

PREMISES = [long_text(3, 0), long_text(40, 2), "It works!!!!", long_text(3, 0), "short."]
HYPOTHESES = [SENTENCES[0], SENTENCES[4], "What more could you ask for?!", SENTENCES[0],
              long_text(4, 1)]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_tiny_roberta_base(tmp_path_factory.mktemp("as-base") / "roberta-tiny")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, base) -> Path:
    """Written with plain torch (same keys as the package's; see test_builder_keys)."""
    return build_tiny_alignscore(tmp_path_factory.mktemp("as-ckpt") / "tiny.ckpt", base,
                                 use_package=False)


@pytest.fixture(scope="module")
def scorer(ckpt, base) -> AlignScorer:
    return build_alignscore(str(ckpt), device="cpu", base_model=str(base))


def manual_aligned(ckpt: Path, base: Path, premise: str, hypothesis: str) -> float:
    """softmax(tri_layer(pooler(RoBERTa(pair))))[0], one unpadded pair at a time."""
    from transformers import AutoConfig, AutoTokenizer, RobertaModel

    state = torch.load(ckpt, weights_only=True)["state_dict"]
    config = AutoConfig.from_pretrained(base)
    model = RobertaModel(config)
    model.load_state_dict({k[len("base_model."):]: v for k, v in state.items()
                           if k.startswith("base_model.")})
    model.eval()
    tok = AutoTokenizer.from_pretrained(base)
    enc = tok(premise, hypothesis, truncation="only_first", max_length=tok.model_max_length,
              return_tensors="pt")
    with torch.inference_mode():
        pooled = model(**enc).pooler_output
        logits = pooled @ state["tri_layer.weight"].T + state["tri_layer.bias"]
    return float(torch.softmax(logits[0], -1)[0])


def test_aligned_prob_matches_manual_forward(scorer, ckpt, base):
    got = scorer.aligned_prob(PREMISES, HYPOTHESES)
    assert got.dtype == np.float32 and got.shape == (len(PREMISES),)
    want = [manual_aligned(ckpt, base, p, h) for p, h in zip(PREMISES, HYPOTHESES)]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert 0 < got.min() and got.max() < 1
    assert len(set(np.round(got, 6))) >= 3  # random heads, but not a constant


def test_truncation_is_premise_first(scorer):
    rows = scorer.encode([long_text(40, 2)], [SENTENCES[4]])
    assert len(rows[0]["input_ids"]) == scorer.max_length == 128
    tail = scorer.tokenizer(SENTENCES[4], add_special_tokens=False)["input_ids"]
    assert rows[0]["input_ids"][-len(tail) - 1:-1] == tail  # hypothesis intact


def test_each_distinct_pair_once_in_input_order(scorer):
    ref = scorer.aligned_prob(PREMISES, HYPOTHESES)
    assert scorer.last_stats.pairs == 5 and scorer.last_stats.unique_pairs == 4
    np.testing.assert_array_equal(ref[0], ref[3])
    order = [4, 2, 0, 1, 3]
    small = scorer.aligned_prob([PREMISES[i] for i in order], [HYPOTHESES[i] for i in order],
                                batch_size=2)
    assert scorer.last_stats.batches == 2
    np.testing.assert_allclose(small, ref[order], atol=1e-6)
    assert scorer.aligned_prob([], []).shape == (0,)
    with pytest.raises(ValueError, match="differ in length"):
        scorer.aligned_prob(["a"], ["b", "c"])


def test_checkpoint_read_without_lightning(ckpt, base):
    state, hparams = read_alignscore_checkpoint(ckpt)
    assert hparams["model"] == str(base)
    assert {"tri_layer.weight", "base_model.pooler.dense.weight", "mlm_head.bias"} <= set(state)
    # no base_model=: the local folder the checkpoint's hyper-parameters name
    assert build_alignscore(str(ckpt), device="cpu").base_model == str(base)


# --- where the base config comes from ------------------------------------------------------

def _copy_ckpt(ckpt: Path, dest: Path, model_name: str) -> Path:
    obj = torch.load(ckpt, weights_only=True)
    obj["hyper_parameters"] = {**obj["hyper_parameters"], "model": model_name}
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, dest)
    return dest


def test_base_found_in_checkpoint_folder(tmp_path, ckpt, base, scorer):
    folder = tmp_path / "alignscore-tiny"
    shutil.copytree(base, folder)
    _copy_ckpt(ckpt, folder / "AlignScore-tiny.ckpt", "nowhere/roberta-tiny")
    model = build_alignscore(str(folder), device="cpu")
    assert model.base_model == str(folder.resolve())
    np.testing.assert_allclose(model.aligned_prob(PREMISES[:2], HYPOTHESES[:2]),
                               scorer.aligned_prob(PREMISES[:2], HYPOTHESES[:2]), atol=1e-6)


def test_base_found_as_sibling_then_clear_error_offline(tmp_path, ckpt, base):
    path = _copy_ckpt(ckpt, tmp_path / "AlignScore-tiny.ckpt", "someorg/roberta-tiny")
    shutil.copytree(base, tmp_path / "roberta-tiny")
    assert build_alignscore(str(path), device="cpu").base_model == str(tmp_path / "roberta-tiny")
    shutil.rmtree(tmp_path / "roberta-tiny")
    # no local folder: the hub id from the checkpoint, which fails offline (HF_HUB_OFFLINE)
    with pytest.raises(ModelUnavailable, match="base_model=") as err:
        build_alignscore(str(path), device="cpu")
    assert "someorg/roberta-tiny" in str(err.value)
    with pytest.raises(ModelUnavailable, match="no such folder"):
        build_alignscore(str(path), device="cpu", base_model=str(tmp_path / "missing"))


def test_checkpoint_reference_errors(tmp_path, ckpt):
    with pytest.raises(ModelUnavailable, match="no such file"):
        build_alignscore(str(tmp_path / "AlignScore-large.ckpt"))
    with pytest.raises(ModelUnavailable, match="no .ckpt file"):
        build_alignscore(str(tmp_path))
    (tmp_path / "a.ckpt").write_bytes(b"")
    (tmp_path / "b.ckpt").write_bytes(b"")
    with pytest.raises(ModelUnavailable, match="2 .ckpt files"):
        build_alignscore(str(tmp_path))
    with pytest.raises(ValueError, match="cannot read it"):
        build_alignscore(str(tmp_path / "a.ckpt"))
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"classifier.weight": torch.zeros(2)}}, other)
    with pytest.raises(ValueError, match="no AlignScore weights"):
        build_alignscore(str(other))


def test_incomplete_checkpoint_refused(tmp_path, ckpt, base):
    obj = torch.load(ckpt, weights_only=True)
    del obj["state_dict"]["base_model.pooler.dense.weight"]
    torch.save(obj, tmp_path / "cut.ckpt")
    with pytest.raises(ValueError, match="1 weights missing.*pooler"):
        build_alignscore(str(tmp_path / "cut.ckpt"), device="cpu", base_model=str(base))


# --- checkpoints that pickle more than tensors --------------------------------------------

TRAP_CALLS: list[str] = []


def _trap(note: str) -> dict:
    TRAP_CALLS.append(note)
    return {}


class HParams(dict):
    """Like lightning's AttributeDict; unpickling it must run none of this file's code."""

    def __reduce__(self):
        return (_trap, ("unpickled with the original code",))


def test_foreign_objects_read_as_inert_placeholders(tmp_path, ckpt, base, scorer):
    obj = torch.load(ckpt, weights_only=True)
    obj["hyper_parameters"] = HParams(model="roberta-tiny")
    obj["callbacks"] = {"ModelCheckpoint": {"best_model_score": np.float32(0.5)}}
    torch.save(obj, tmp_path / "rich.ckpt")
    TRAP_CALLS.clear()
    state, hparams = read_alignscore_checkpoint(tmp_path / "rich.ckpt")
    assert TRAP_CALLS == []
    assert "tri_layer.weight" in state
    model = build_alignscore(str(tmp_path / "rich.ckpt"), device="cpu", base_model=str(base))
    assert TRAP_CALLS == []
    np.testing.assert_allclose(model.aligned_prob(PREMISES[:2], HYPOTHESES[:2]),
                               scorer.aligned_prob(PREMISES[:2], HYPOTHESES[:2]), atol=1e-6)


def test_builder_keys_match_the_package_model(base):
    """The plain-torch test checkpoint has the keys of the package's BERTAlignModel."""
    pytest.importorskip("pytorch_lightning")
    model_mod = pytest.importorskip("alignscore.model")
    package_keys = set(model_mod.BERTAlignModel(model=str(base),
                                                using_pretrained=False).state_dict())
    path = build_tiny_alignscore(base.parent / "plain.ckpt", base, use_package=False)
    assert set(torch.load(path, weights_only=True)["state_dict"]) == package_keys
