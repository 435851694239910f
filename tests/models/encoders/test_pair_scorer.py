"""Pair scorers on tiny random checkpoints, checked against manual forward passes."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rexeval.models.encoders.pair_scorer import (
    PAIR_SCORERS,
    CrossEncoderScorer,
    PairScorer,
    RerankerLLMScorer,
    _positive_index,
    build_pair_scorer,
    detect_pair_scorer_kind,
    pair_scorer_class,
    register_pair_scorer,
)
from rexeval.models.refs import ModelUnavailable
from rexeval.prompts import load_prompt

PAIRS = [
    ("the product is loud", "the product makes a lot of noise"),
    ("the tuner holds pitch well", "the cable is cheap"),
    ("yes", "no"),
    ("the product is loud and the strings sound bright and the tuner clips on firmly",
     "the product makes a lot of noise"),
    ("the cable broke after two weeks", "the cable is cheap, noisy and broke after two weeks"),
    ("the strings sound bright", "the strings sound bright"),
    ("no", "the product is loud and the strings sound bright"),
]


def one_by_one(scorer: PairScorer) -> np.ndarray:
    return np.array([scorer.score([p], batch_size=1)[0] for p in PAIRS], dtype=np.float32)


# --- cross-encoder ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def ce1(tiny_bert):
    return build_pair_scorer(str(tiny_bert[1]), device="cpu")


@pytest.fixture(scope="module")
def ce2(tiny_bert):
    return build_pair_scorer(str(tiny_bert[2]), device="cpu")


def test_cross_encoder_one_label_is_sigmoid_of_the_logit(ce1, tiny_bert):
    assert isinstance(ce1, CrossEncoderScorer) and ce1.name == "cross_encoder"
    scores = ce1.score(PAIRS, batch_size=3)
    assert scores.dtype == np.float32 and scores.shape == (len(PAIRS),)
    assert ((scores >= 0) & (scores <= 1)).all() and scores.std() > 1e-3  # not constant
    np.testing.assert_allclose(scores, one_by_one(ce1), atol=1e-5)  # padding is harmless
    for (a, b), got in zip(PAIRS, scores):
        enc = ce1.tokenizer(a, b, return_tensors="pt")
        assert "token_type_ids" in enc  # the second segment is marked
        with torch.inference_mode():
            logit = ce1.model(**enc).logits[0, 0]
        assert abs(float(torch.sigmoid(logit)) - float(got)) < 1e-5


def test_cross_encoder_two_labels_reads_the_positive_one(ce2):
    assert ce2.num_labels == 2 and ce2.positive_index == 1  # "duplicate"
    scores = ce2.score(PAIRS, batch_size=4)
    np.testing.assert_allclose(scores, one_by_one(ce2), atol=1e-5)
    a, b = PAIRS[0]
    with torch.inference_mode():
        logits = ce2.model(**ce2.tokenizer(a, b, return_tensors="pt")).logits[0]
    assert abs(float(torch.softmax(logits, -1)[1]) - float(scores[0])) < 1e-5


def test_positive_label_names():
    assert _positive_index({0: "not_duplicate", 1: "duplicate"}, None) == 1
    assert _positive_index({0: "paraphrase", 1: "other"}, None) == 0
    assert _positive_index({"0": "LABEL_0", "1": "LABEL_1"}, None) == 1
    assert _positive_index({0: "Yes", 1: "No"}, None) == 0
    assert _positive_index({0: "a", 1: "b"}, None) == 1  # unknown names: index 1
    assert _positive_index({0: "a", 1: "b"}, "a") == 0 and _positive_index({0: "a", 1: "b"}, 0) == 0
    with pytest.raises(ValueError, match="positive_label 'c'"):
        _positive_index({0: "a", 1: "b"}, "c")


def test_three_labels_are_refused(tiny_bert):
    with pytest.raises(ValueError, match=r"3-way classifier.*NLI.*paraphrase / duplicate"):
        build_pair_scorer(str(tiny_bert[3]), device="cpu")


def test_cross_encoder_truncates_to_max_length(tiny_bert):
    scorer = build_pair_scorer(str(tiny_bert[1]), device="cpu", max_length=16)
    long = " ".join(["the product is loud"] * 50)
    assert len(scorer._encode([(long, long)])[0]["input_ids"]) == 16
    assert 0.0 <= scorer.score([(long, long)])[0] <= 1.0


# --- causal-LM reranker ----------------------------------------------------------------

@pytest.fixture(scope="module")
def reranker(tiny_reranker):
    return build_pair_scorer(str(tiny_reranker), device="cpu")


def manual_yes_probability(scorer: RerankerLLMScorer, a: str, b: str) -> float:
    """Render the prompt file with the chat template and run one unpadded forward pass."""
    messages = load_prompt("paraphrase_rerank").render(statement_a=a, statement_b=b)
    text = scorer.tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
    ids = torch.tensor([scorer.tokenizer(text, add_special_tokens=False)["input_ids"]])
    yes = scorer.tokenizer.convert_tokens_to_ids("yes")
    no = scorer.tokenizer.convert_tokens_to_ids("no")
    with torch.inference_mode():
        last = scorer.model(input_ids=ids).logits[0, -1]
    return float(torch.softmax(torch.stack([last[yes], last[no]]), -1)[0])


@pytest.mark.slow
def test_reranker_is_the_yes_probability(reranker):
    assert isinstance(reranker, RerankerLLMScorer) and reranker.name == "reranker_llm"
    assert reranker.prompt_version.startswith("paraphrase_rerank/v1-")
    scores = reranker.score(PAIRS, batch_size=3)
    assert scores.dtype == np.float32 and ((scores >= 0) & (scores <= 1)).all()
    assert scores.std() > 1e-4
    np.testing.assert_allclose(scores, one_by_one(reranker), atol=1e-5)  # left padding
    for (a, b), got in zip(PAIRS, scores):
        assert abs(manual_yes_probability(reranker, a, b) - float(got)) < 1e-5


def test_reranker_prompt(reranker):
    text = reranker.render("the product is\nloud", "<Document>: it makes noise")
    assert "<Query>: the product is loud\n" in text  # one line per statement
    assert "<Document>: <Document>: it makes noise" in text
    assert "paraphrases" in text and text.endswith("<|im_start|>assistant\n")
    custom = RerankerLLMScorer(reranker.location, device="cpu", instruction="Same meaning?",
                               assistant_prefix="<think>\n\n</think>\n\n")
    text = custom.render("a", "b")
    assert "<Instruct>: Same meaning?\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reranker_think_block_follows_the_chat_template(reranker, monkeypatch):
    qwen_like = reranker.tokenizer.chat_template.replace(
        "<|im_start|>assistant\n{% endif %}",
        "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
        "<think>\n\n</think>\n\n{% endif %}{% endif %}")
    monkeypatch.setattr(reranker.tokenizer, "chat_template", qwen_like)
    text = reranker.render("a", "b")
    assert text.endswith("assistant\n<think>\n\n</think>\n\n") and text.count("<think>") == 1
    # A template that mentions think blocks but does not write the empty one: we add it.
    silent = qwen_like.replace("enable_thinking is defined and enable_thinking is false",
                               "false")
    monkeypatch.setattr(reranker.tokenizer, "chat_template", silent)
    text = reranker.render("a", "b")
    assert text.endswith("assistant\n<think>\n\n</think>\n\n") and text.count("<think>") == 1


def test_reranker_clips_long_statements(tiny_reranker):
    scorer = RerankerLLMScorer(str(tiny_reranker), device="cpu", max_statement_tokens=8)
    long = " ".join(["the product is loud"] * 40)
    clipped = scorer._clip(long)
    assert len(scorer.tokenizer.encode(clipped, add_special_tokens=False)) <= 8
    assert 0.0 <= scorer.score([(long, long)])[0] <= 1.0
    tight = RerankerLLMScorer(str(tiny_reranker), device="cpu", max_length=20)
    with pytest.raises(ValueError, match="exceed max_length=20"):
        tight.score(PAIRS[:1])


def test_reranker_needs_single_token_answers(tiny_reranker):
    with pytest.raises(ValueError, match=r"'zyzzyva quux' is \d+ tokens.*yes_token="):
        RerankerLLMScorer(str(tiny_reranker), device="cpu", yes_token="zyzzyva quux")


# --- kinds, registry, errors -----------------------------------------------------------

def test_auto_kind_detection(tiny_bert, tiny_reranker, tmp_path):
    assert detect_pair_scorer_kind(str(tiny_bert[2])) == "cross_encoder"
    assert detect_pair_scorer_kind(str(tiny_reranker)) == "reranker_llm"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match=r"config\.json.*BertModel.*ForSequenceClassification"):
        detect_pair_scorer_kind(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty/config\.json not found"):
        build_pair_scorer(str(empty))
    # an explicit kind skips detection (and fails on what the class cannot load)
    with pytest.raises(ValueError, match="3-way"):
        build_pair_scorer(str(tiny_bert[3]), kind="cross_encoder", device="cpu")


def test_missing_checkpoint_says_how_to_supply_one(tmp_path):
    with pytest.raises(ModelUnavailable) as err:
        build_pair_scorer(str(tmp_path / "no" / "such" / "ckpt"))
    msg = str(err.value)
    assert "cross_encoder" in msg and "No PyPI package ships a cross-encoder" in msg
    assert "bi-encoder-only" in msg and "--model cross_encoder=/path/to/checkpoint" in msg
    with pytest.raises(ModelUnavailable, match="cannot get its config.json"):
        build_pair_scorer("some-org/not-a-cached-model")  # hub id, offline in tests
    with pytest.raises(ModelUnavailable, match="empty reference"):
        build_pair_scorer(" ")


def test_registry(tiny_bert):
    assert {"cross_encoder", "reranker_llm"} <= set(PAIR_SCORERS)
    assert pair_scorer_class("cross_encoder") is CrossEncoderScorer
    with pytest.raises(ValueError, match="unknown pair scorer kind 'nli'.*reranker_llm"):
        pair_scorer_class("nli")
    assert pair_scorer_class(f"{__name__}:ConstantScorer") is ConstantScorer

    @register_pair_scorer("constant_test")
    class Registered(ConstantScorer):
        pass

    try:
        scorer = build_pair_scorer(str(tiny_bert[1]), kind="constant_test", device="cpu")
        assert isinstance(scorer, Registered) and scorer.name == "constant_test"
        assert scorer.score(PAIRS).tolist() == [0.5] * len(PAIRS)
        assert scorer.score([]).shape == (0,)
        with pytest.raises(TypeError, match="pair 0 must be two strings"):
            scorer.score([("only one",)])
    finally:
        PAIR_SCORERS.pop("constant_test")


class ConstantScorer(PairScorer):
    """A scorer of our own: 0.5 for everything (checks the base class's batching)."""

    def _encode(self, pairs):
        return [{"input_ids": list(range(len(a) + len(b)))} for a, b in pairs]

    def _forward(self, batch):
        return np.full(len(batch), 0.5, dtype=np.float32)
