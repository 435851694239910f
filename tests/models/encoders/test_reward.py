"""RewardScorer on tiny random reward models built here (no reward model ships on PyPI):
a BERT pair classifier (no chat template) and a Llama classifier with a chat template."""
import functools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rexeval.models.encoders.reward import RewardScorer, build_reward_scorer, model_limit
from rexeval.models.refs import ModelUnavailable

PROMPT = "decide whether the query and the document are paraphrases"
PAIRS = [
    (PROMPT, "the product is loud and the strings sound bright"),
    ("answer yes or no", "yes"),
    (PROMPT, "the cable is cheap, noisy and broke after two weeks " * 3),
    ("the tuner holds pitch well", "no"),
    (PROMPT, "the product is loud and the strings sound bright"),  # a repeat
]


def build_tiny_chat_reward(folder: Path, num_labels: int = 1, *, seed: int = 0) -> Path:
    """The LLM tests' tiny chat tokenizer (with its chat template) under a 2-layer
    LlamaForSequenceClassification, the architecture of ArmoRM-like reward models."""
    from transformers import AutoConfig, LlamaForSequenceClassification

    from tests.doubles.tiny_llm import build_tiny_chat_model

    build_tiny_chat_model(folder, seed=seed, max_positions=512)
    config = AutoConfig.from_pretrained(folder)
    config.num_labels = num_labels
    config.architectures = ["LlamaForSequenceClassification"]
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_chat_reward(tmp_path_factory) -> Path:
    return build_tiny_chat_reward(tmp_path_factory.mktemp("tiny-chat-reward") / "model")


@functools.lru_cache(maxsize=4)
def _load(folder):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    return AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder).eval()


def _direct_pair(folder, prompt, response, index=0):
    tok, model = _load(folder)
    with torch.no_grad():
        return float(model(**tok(prompt, response, return_tensors="pt")).logits[0, index])


def _direct_chat(folder, prompt, response):
    tok, model = _load(folder)
    text = tok.apply_chat_template([{"role": "user", "content": prompt},
                                    {"role": "assistant", "content": response}], tokenize=False)
    assert text.startswith("<|im_start|>user\n") and response in text
    ids = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_pair_model_scores_equal_a_direct_forward_pass(tiny_bert):
    scorer = RewardScorer(str(tiny_bert[1]), device="cpu")
    assert not scorer.chat
    got = scorer.score(PAIRS)
    assert got.dtype == np.float32 and got.shape == (len(PAIRS),)
    want = [_direct_pair(tiny_bert[1], p, r) for p, r in PAIRS]
    assert np.allclose(got, want, atol=1e-5)
    assert scorer.last_stats.unique_pairs == len(PAIRS) - 1


def test_chat_model_scores_equal_a_direct_forward_pass(tiny_chat_reward):
    scorer = RewardScorer(str(tiny_chat_reward), device="cpu")
    assert scorer.chat
    got = scorer.score(PAIRS)
    want = [_direct_chat(tiny_chat_reward, p, r) for p, r in PAIRS]
    assert np.allclose(got, want, atol=1e-5)
    assert len(set(np.round(got, 5))) > 2  # random weights still tell inputs apart


@pytest.mark.parametrize("which", ["bert", "chat"])
def test_batching_and_order_do_not_change_scores(which, tiny_bert, tiny_chat_reward):
    folder = tiny_bert[1] if which == "bert" else tiny_chat_reward
    scorer = RewardScorer(str(folder), device="cpu")
    one = scorer.score(PAIRS, batch_size=1)
    many = scorer.score(PAIRS, batch_size=16)
    assert np.allclose(one, many, atol=1e-5)
    assert scorer.last_stats.pad_tokens > 0  # the batch really was padded
    order = [3, 0, 4, 2, 1]
    shuffled = scorer.score([PAIRS[i] for i in order], batch_size=2)
    assert np.allclose(shuffled, one[order], atol=1e-5)
    assert scorer.score([]).shape == (0,)


def test_multi_output_head_needs_output_index(tiny_bert):
    with pytest.raises(ValueError, match="output_index"):
        RewardScorer(str(tiny_bert[3]), device="cpu")
    with pytest.raises(ValueError, match="outside"):
        RewardScorer(str(tiny_bert[3]), device="cpu", output_index=3)
    scorer = RewardScorer(str(tiny_bert[3]), device="cpu", output_index=2)
    got = scorer.score(PAIRS[:2])
    assert np.allclose(got, [_direct_pair(tiny_bert[3], p, r, index=2) for p, r in PAIRS[:2]], atol=1e-5)


def test_a_score_attribute_wins_over_logits(tiny_bert):
    scorer = RewardScorer(str(tiny_bert[1]), device="cpu")

    def custom(**inputs):  # what ArmoRM-style remote code returns
        n = inputs["input_ids"].shape[0]
        return SimpleNamespace(score=torch.arange(n, dtype=torch.float32)[:, None] + 10,
                               logits=torch.zeros(n, 19))

    scorer.model = custom
    assert sorted(scorer.score(PAIRS[:2], batch_size=2).tolist()) == [10.0, 11.0]  # batch rows by length

    def several(**inputs):
        return SimpleNamespace(score=None, logits=torch.ones(inputs["input_ids"].shape[0], 19))

    scorer.model = several
    with pytest.raises(ValueError, match="19 values"):
        scorer.score(PAIRS[:1])


@pytest.mark.parametrize("which", ["bert", "chat"])
def test_long_prompts_lose_their_start_never_the_response(which, tiny_bert, tiny_chat_reward):
    folder = tiny_bert[1] if which == "bert" else tiny_chat_reward
    scorer = RewardScorer(str(folder), device="cpu", max_length=48)
    response = "the strings sound bright"
    prompt = " ".join(f"the tuner holds pitch well {k}" for k in range(30))
    full = scorer.row(prompt, response)["input_ids"]
    cut = scorer.fitted_row(prompt, response)["input_ids"]
    assert len(full) > 48 >= len(cut)
    tail = len(scorer.tokenizer(response, add_special_tokens=False)["input_ids"]) + 3
    assert cut[-tail:] == full[-tail:]  # the response and what follows it are intact
    got = scorer.score([(prompt, response)])[0]
    assert scorer.truncated == 1
    row = scorer.fitted_row(prompt, response)
    with torch.no_grad():
        want = scorer.model(**{k: torch.tensor([v]) for k, v in row.items()}).logits[0, 0]
    assert got == pytest.approx(float(want), abs=1e-5)
    with pytest.raises(ValueError, match="does not fit"):
        scorer.score([("short", "the strings sound bright " * 30)])


def test_model_limit_and_missing_checkpoint(tiny_bert, tmp_path):
    scorer = RewardScorer(str(tiny_bert[1]), device="cpu")
    assert scorer.max_length == 512 == model_limit(scorer.tokenizer, scorer.model.config)
    with pytest.raises(ModelUnavailable, match="reward"):
        build_reward_scorer(str(tmp_path / "nowhere"))
