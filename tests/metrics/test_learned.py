"""BARTScore and BLEURT on tiny random checkpoints built here (no hub access).

The models score nonsense, but the plumbing (tokenising, shifting the target, masking
padding, reading the regression head) is what a real checkpoint goes through, and it is
checked exactly against manual forward passes.
"""
from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from rexeval.metrics.learned import bartscore_pairs, bartscore_scores, bleurt_scores
from rexeval.metrics.registry import get_metric
from rexeval.models.encoders import bart_bleurt
from rexeval.models.refs import ModelUnavailable
from tests.doubles.tiny_encoders import build_tiny_bert

# Scores of one pair computed inside batches of different shapes: float32 sums are
# reordered with the shape (and by the CPU's kernels), so they agree to ~1e-6 of their
# size, not to a fixed number of digits; a padding leak moves them by O(1).
ACROSS_SHAPES = {"rel": 1e-4, "abs": 1e-5}
ACROSS_SHAPES_NP = {"rtol": 1e-4, "atol": 1e-5}

CORPUS = [
    "the user would appreciate this product because the strings sound bright",
    "the user may dislike the cable because it is noisy and broke after two weeks",
    "the tuner holds pitch well and clips on firmly",
    "the pedal is cheap but the sound is thin",
    "great guitar for the price, the neck feels smooth",
    "the user seems indifferent to the color of the case",
] * 10

CANDS = [
    "the strings sound bright",
    "the cable is noisy and broke after two weeks, the user may dislike it",
    "great price",
    "",
    "the strings sound bright",
]
REFS = [
    "the user would appreciate this product because the strings sound bright",
    "the user may dislike the cable",
    "the tuner holds pitch well and clips on firmly, the neck feels smooth",
    "the pedal is cheap",
    "the user would appreciate this product because the strings sound bright",
]


def build_tiny_bart(folder: Path, *, seed: int = 0) -> Path:
    """Byte-level BPE tokenizer (<s> $A </s>) + 2-layer BART, saved as an HF folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3, as in BART's vocabulary
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", bos), ("</s>", eos)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                     pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = BartConfig(vocab_size=len(hf_tok), d_model=32, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                        pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2, forced_eos_token_id=2, init_std=0.3,
                        dropout=0.0, attention_dropout=0.0)
    model = BartForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


def build_tiny_bert_regressor(folder: Path, num_labels: int = 1, *, seed: int = 0) -> Path:
    """The encoder tests' tiny BertForSequenceClassification with a 128-token limit."""
    return build_tiny_bert(folder, num_labels, seed=seed, max_length=128)


@pytest.fixture(scope="module")
def tiny_bart(tmp_path_factory) -> str:
    return str(build_tiny_bart(tmp_path_factory.mktemp("tiny-bart") / "model"))


@pytest.fixture(scope="module")
def tiny_bleurt(tmp_path_factory) -> str:
    return str(build_tiny_bert_regressor(tmp_path_factory.mktemp("tiny-bleurt") / "model"))


# ------------------------------------------------------------------------ BARTScore

def manual_bartscore(location: str, source: str, target: str) -> float:
    """Mean log p(target token | previous target tokens, source): one pair, no padding."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(location)
    model = AutoModelForSeq2SeqLM.from_pretrained(location).eval()
    src = tok(source, return_tensors="pt")
    tgt = tok(target)["input_ids"]
    decoder_in = [model.config.decoder_start_token_id] + tgt[:-1]
    with torch.no_grad():
        logits = model(input_ids=src["input_ids"], attention_mask=src["attention_mask"],
                       decoder_input_ids=torch.tensor([decoder_in])).logits[0]
        logp = torch.log_softmax(logits.double(), dim=-1)
        by_hand = logp[torch.arange(len(tgt)), torch.tensor(tgt)].mean().item()
        # transformers' own teacher-forced loss (mean token NLL) says the same
        loss = model(input_ids=src["input_ids"], labels=torch.tensor([tgt])).loss.item()
    assert by_hand == pytest.approx(-loss, abs=1e-5)
    return by_hand


def test_bartscore_equals_hand_computation(tiny_bart):
    got = bartscore_scores(CANDS[:2], REFS[:2], tiny_bart)
    assert got.shape == (2,) and got.dtype == np.float64
    for i in range(2):
        want = manual_bartscore(tiny_bart, CANDS[i], REFS[i])  # gen_to_ref: p(ref | gen)
        assert got[i] == pytest.approx(want, **ACROSS_SHAPES)
    assert np.all(got < 0)


def test_bartscore_directions(tiny_bart):
    g2r = bartscore_scores(CANDS, REFS, tiny_bart)
    r2g = bartscore_scores(CANDS, REFS, tiny_bart, direction="ref_to_gen")
    f = bartscore_scores(CANDS, REFS, tiny_bart, direction="f")
    assert np.allclose(r2g, bartscore_scores(REFS, CANDS, tiny_bart), atol=1e-6)
    assert np.allclose(r2g, bartscore_pairs(REFS, CANDS, tiny_bart), atol=1e-6)
    assert np.allclose(f, (g2r + r2g) / 2, atol=1e-6)
    assert not np.allclose(g2r, r2g)
    assert r2g[1] == pytest.approx(manual_bartscore(tiny_bart, REFS[1], CANDS[1]), **ACROSS_SHAPES)
    assert np.all(np.isfinite(g2r)) and np.all(np.isfinite(r2g))
    assert g2r[0] == g2r[4]  # duplicate pair, computed once
    with pytest.raises(ValueError, match="direction"):
        bartscore_scores(CANDS, REFS, tiny_bart, direction="precision")


def test_bartscore_batching_and_padding_do_not_change_scores(tiny_bart):
    one_by_one = bartscore_scores(CANDS, REFS, tiny_bart, batch_size=1)
    batched = bartscore_scores(CANDS, REFS, tiny_bart, batch_size=16)
    assert np.allclose(one_by_one, batched, **ACROSS_SHAPES_NP)
    # shuffled order: the same scores, shuffled
    order = [3, 0, 4, 2, 1]
    shuffled = bartscore_scores([CANDS[i] for i in order], [REFS[i] for i in order], tiny_bart)
    assert np.allclose(shuffled, batched[order], **ACROSS_SHAPES_NP)
    # a short pair padded up to a long one in the same batch scores as alone
    long_src = " ".join(CORPUS[:3])
    long_tgt = " ".join(CORPUS[3:6])
    alone = bartscore_scores([CANDS[2]], [REFS[2]], tiny_bart)
    with_long = bartscore_scores([CANDS[2], long_src], [REFS[2], long_tgt], tiny_bart,
                                 batch_size=2)
    assert bart_bleurt.get_bartscorer(tiny_bart).last_stats.pad_tokens > 0
    assert with_long[0] == pytest.approx(alone[0], **ACROSS_SHAPES)


def test_bartscore_inputs_and_truncation(tiny_bart):
    assert bartscore_scores([], [], tiny_bart).shape == (0,)
    with pytest.raises(ValueError, match="2 candidates but 1 references"):
        bartscore_scores(CANDS[:2], REFS[:1], tiny_bart)
    with pytest.raises(TypeError):
        bartscore_scores("one string", "another", tiny_bart)
    with pytest.raises(ValueError, match="batch_size"):
        bartscore_scores(CANDS, REFS, tiny_bart, batch_size=0)
    # texts beyond the 64 positions are truncated, not a crash
    huge = " ".join(CORPUS)
    out = bartscore_scores([huge], [huge], tiny_bart)
    assert np.isfinite(out).all()
    assert bart_bleurt.get_bartscorer(tiny_bart).max_length == 64


def test_bartscore_missing_checkpoint():
    with pytest.raises(ModelUnavailable, match="BARTScore"):
        bartscore_scores(["a"], ["b"], "/no/such/bart/folder")


def test_model_cache_is_shared_across_threads(tiny_bart):
    bart_bleurt.clear_learned_cache()
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(bart_bleurt.get_bartscorer(tiny_bart)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(m is got[0] for m in got)
    assert bart_bleurt.get_bartscorer(tiny_bart, "cpu") is got[0]


# --------------------------------------------------------------------------- BLEURT

def test_bleurt_equals_regression_logit(tiny_bleurt):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    got = bleurt_scores(CANDS, REFS, tiny_bleurt)
    assert got.shape == (len(CANDS),) and got.dtype == np.float64
    assert np.all(np.isfinite(got))
    tok = AutoTokenizer.from_pretrained(tiny_bleurt)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bleurt).eval()
    for i in (0, 1, 3):
        # reference first, then candidate; lists, so that an empty candidate still makes
        # a pair ([CLS] ref [SEP] [SEP]), as BLEURT encodes it
        enc = tok([REFS[i]], [CANDS[i]], return_tensors="pt")
        with torch.no_grad():
            want = model(**enc).logits[0, 0].item()
        assert got[i] == pytest.approx(want, **ACROSS_SHAPES)
    # the order inside the pair matters to the model: (candidate, reference) differs
    enc = tok([CANDS[1]], [REFS[1]], return_tensors="pt")
    with torch.no_grad():
        swapped = model(**enc).logits[0, 0].item()
    assert swapped != pytest.approx(got[1], abs=1e-4)


def test_bleurt_batch_and_padding_independent(tiny_bleurt):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    one = bleurt_scores(CANDS, REFS, tiny_bleurt, batch_size=1)
    many = bleurt_scores(CANDS, REFS, tiny_bleurt, batch_size=32)
    assert np.allclose(one, many, **ACROSS_SHAPES_NP)
    alone = bleurt_scores([CANDS[2]], [REFS[2]], tiny_bleurt)
    long_ref, long_cand = " ".join(CORPUS[4:8]), " ".join(CORPUS[:4])
    padded = bleurt_scores([CANDS[2], long_cand], [REFS[2], long_ref], tiny_bleurt, batch_size=2)
    assert padded[0] == pytest.approx(alone[0], **ACROSS_SHAPES)
    # the tolerance still catches a leak: the same batch run without its attention mask
    tok = AutoTokenizer.from_pretrained(tiny_bleurt)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bleurt).eval()
    enc = tok([REFS[2], long_ref], [CANDS[2], long_cand], return_tensors="pt", padding=True,
              truncation=True, max_length=model.config.max_position_embeddings)
    enc.pop("attention_mask")
    with torch.no_grad():
        leaked = model(**enc).logits[0, 0].item()
    assert leaked != pytest.approx(alone[0], **ACROSS_SHAPES)
    assert bleurt_scores([], [], tiny_bleurt).shape == (0,)


def test_bleurt_refuses_a_classifier(tmp_path):
    folder = build_tiny_bert_regressor(tmp_path / "nli-like", num_labels=3)
    with pytest.raises(ValueError, match=r"num_labels=3") as err:
        bleurt_scores(["a"], ["b"], str(folder))
    assert str(folder) in str(err.value)


def _as_bleurt_port(src: Path, dst: Path) -> Path:
    """A copy of a tiny BERT folder whose config claims to be a BLEURT-PyTorch model."""
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["model_type"] = "bleurt"
    config["architectures"] = ["BleurtForSequenceClassification"]
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_bleurt_port_without_package_is_explained(tiny_bleurt, tmp_path, monkeypatch):
    folder = _as_bleurt_port(Path(tiny_bleurt), tmp_path / "port")
    monkeypatch.setitem(sys.modules, "bleurt_pytorch", None)  # import fails
    with pytest.raises(ModelUnavailable, match="bleurt_pytorch"):
        bleurt_scores(["a"], ["b"], str(folder))


def test_bleurt_port_loads_through_the_package(tiny_bleurt, tmp_path, monkeypatch):
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    used: list[str] = []

    def tracking(cls, role: str):
        class Tracked(cls):
            @classmethod
            def from_pretrained(klass, *args, **kwargs):
                used.append(role)
                return cls.from_pretrained(*args, **kwargs)
        return Tracked

    fake = types.ModuleType("bleurt_pytorch")
    fake.BleurtConfig = tracking(BertConfig, "config")
    fake.BleurtForSequenceClassification = tracking(BertForSequenceClassification, "model")
    fake.BleurtTokenizer = tracking(PreTrainedTokenizerFast, "tokenizer")
    monkeypatch.setitem(sys.modules, "bleurt_pytorch", fake)
    folder = _as_bleurt_port(Path(tiny_bleurt), tmp_path / "port")
    got = bleurt_scores(CANDS[:2], REFS[:2], str(folder))
    assert sorted(used) == ["config", "model", "tokenizer"]
    assert np.allclose(got, bleurt_scores(CANDS[:2], REFS[:2], tiny_bleurt), atol=1e-5)


def test_registered():
    for name in ("bartscore", "bleurt"):
        info = get_metric(name)
        assert info.kind == "per_example" and info.higher_is_better
        assert info.inputs == ("generated_explanations", "reference_explanations")
        assert info.description
    assert bartscore_scores.metric_info.name == "bartscore"
    assert bleurt_scores.metric_info.name == "bleurt"
