"""Reward-model scores of (prompt, response) pairs: the scorer behind ALERT-Disc (seed 004).

A reward model reads an instruction and a candidate answer together and returns one
number, higher for an answer people would prefer. Seed 004 scores each recommendation
explanation this way (ArmoRM) and prefers the one with the higher score. Any Hugging
Face sequence-classification checkpoint given by a local path (or a hub id on machines
with hub access) works:

- Input: with a chat template, the conversation [user: prompt, assistant: response]
  rendered by the tokenizer's template (what chat reward models such as ArmoRM were
  trained on); without one, the tokenizer's own text-pair encoding of (prompt, response),
  e.g. "[CLS] prompt [SEP] response [SEP]" for BERT-like models (what pair reward models
  such as the OpenAssistant DeBERTa ones expect; a tokenizer without a pair format just
  joins the two token sequences).
- Score: the output's `.score` when the model returns one (ArmoRM-style custom code, its
  own aggregate of several objectives); else the single logit of a one-output head.
  A head with several outputs needs `output_index` (which output is the reward); without
  it the scorer refuses rather than guess. (`.score` with several columns is read the
  same way.)
- Length: a pair longer than `max_length` tokens loses tokens from the START of the
  prompt (the end of a conversation matters most to a reward model), never from the
  response; a response that alone does not fit is an error naming the pair. The default
  `max_length` is the model's own limit. `truncated` counts the prompts cut.
- Batching (shared with the NLI and pair scorers, `pair_batching.py`): each distinct
  pair is scored once, pairs are sorted by token length and padded on the right (so
  positions and the last-token readout of decoder models match an unbatched pass), run
  under inference mode; scores come back in input order.

Custom model code runs only when the user passes `trust_remote_code=True`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rexeval.models.encoders.pair_batching import (
    ROW_KEYS,
    BatchedPairModel,
    check_pairs,
    pad_rows,
    resolve_checkpoint,
)
from rexeval.models.refs import ModelUnavailable

ROLE = "reward"
DEFAULT_MAX_LENGTH = 4096
"""Used when neither the tokenizer nor the config states a length limit."""


class RewardScorer(BatchedPairModel):
    """Reward per (prompt, response) pair, as float32, in input order.

    Options: output_index (which output of a multi-output head is the reward),
    trust_remote_code (False), max_length (None: the model's limit), and the common ones
    (see `BatchedPairModel`): device ("auto" | "cpu" | "cuda[:N]"), batch_size (8),
    num_threads, dtype ("auto": float32 on CPU, bfloat16 on CUDA).
    """

    name = "reward"

    def __init__(self, location: str, *, output_index: int | None = None,
                 trust_remote_code: bool = False, max_length: int | None = None,
                 batch_size: int = 8, **options: Any):
        super().__init__(location, batch_size=batch_size, max_length=max_length or 1, **options)
        from transformers import (
            AutoConfig,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        remote = {"trust_remote_code": bool(trust_remote_code)}
        config = AutoConfig.from_pretrained(self.location, **remote)
        self.num_labels = int(config.num_labels)
        self.custom_code = bool(trust_remote_code and getattr(config, "auto_map", None))
        self.output_index = _check_output_index(output_index, self.num_labels, self.custom_code,
                                                self.model_ref)
        self.tokenizer = AutoTokenizer.from_pretrained(self.location, **remote)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"{self.model_ref!r}: the tokenizer has no pad, eos or unk token to pad with")
        self.model = AutoModelForSequenceClassification.from_pretrained(
            self.location, dtype=self.dtype, **remote).to(self.device).eval()
        if getattr(self.model.config, "pad_token_id", None) is None:
            # Decoder classifiers read the last non-pad token and need to know the pad id.
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.max_length = int(max_length) if max_length else model_limit(self.tokenizer, config)
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        self.truncated = 0

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> np.ndarray:
        """float32 rewards, one per (prompt, response) pair, in input order."""
        self.truncated = 0
        return self._run(check_pairs(pairs), batch_size)

    def row(self, prompt: str, response: str) -> dict[str, list[int]]:
        """The model input for one pair, untruncated (see the module docstring)."""
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
                tokenize=False)
            return {"input_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"]}
        enc = self.tokenizer(prompt, response)
        return {k: list(enc[k]) for k in ROW_KEYS if k in enc}

    def fitted_row(self, prompt: str, response: str) -> dict[str, list[int]]:
        """`row`, with tokens dropped from the start of the prompt until it fits."""
        row = self.row(prompt, response)
        over = len(row["input_ids"]) - self.max_length
        if over <= 0:
            return row
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        drop = 0
        for _ in range(8):  # decoding and re-encoding may shift a token or two
            drop += over
            if drop >= len(prompt_ids):
                break
            row = self.row(self.tokenizer.decode(prompt_ids[drop:]), response)
            over = len(row["input_ids"]) - self.max_length
            if over <= 0:
                self.truncated += 1
                return row
        raise ValueError(f"{self.model_ref!r}: the response ({len(response.split())} words) does not "
                         f"fit in max_length={self.max_length} tokens even with the prompt removed; "
                         "raise max_length or shorten the response")

    def _encode(self, pairs):
        return [self.fitted_row(p, r) for p, r in pairs]

    def _forward(self, batch):
        import torch

        inputs = pad_rows(self.tokenizer, batch, self.device)
        with torch.inference_mode():
            out = self.model(**inputs)
        score = getattr(out, "score", None)
        values = score if score is not None else out.logits
        values = values.float().reshape(len(batch), -1)
        if values.shape[1] == 1:
            return values[:, 0].cpu().numpy()
        if self.output_index is None:
            raise ValueError(f"{self.model_ref!r} returns {values.shape[1]} values per pair; pass "
                             "output_index= to say which one is the reward")
        if self.output_index >= values.shape[1]:
            raise ValueError(f"output_index={self.output_index} but the model returns "
                             f"{values.shape[1]} values per pair")
        return values[:, self.output_index].cpu().numpy()


def _check_output_index(output_index: int | None, num_labels: int, custom_code: bool, ref: str) -> int | None:
    """The output index to read, or a clear refusal for an ambiguous multi-output head.

    Custom-code models may return their own `.score`, so their check waits for the
    first forward pass."""
    if output_index is not None:
        if not 0 <= int(output_index) < max(num_labels, 1) and not custom_code:
            raise ValueError(f"output_index={output_index} is outside the {num_labels} output(s) of {ref!r}")
        return int(output_index)
    if num_labels > 1 and not custom_code:
        raise ValueError(f"{ref!r} has {num_labels} outputs per input, so which one is the reward "
                         "is ambiguous; pass output_index= (e.g. 0), or use a one-output reward model")
    return None


def model_limit(tokenizer: Any, config: Any) -> int:
    """The longest input the model takes: the smaller of the tokenizer's and the config's
    limits when they state one (tokenizers without one report a huge sentinel)."""
    limits = [int(tokenizer.model_max_length)] if tokenizer.model_max_length < 1_000_000 else []
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style position tables reserve the padding offset (2 slots).
        offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
        limits.append(int(positions) - offset)
    return min(limits) if limits else DEFAULT_MAX_LENGTH


def _unavailable(ref: str, why: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"{ROLE} model {ref!r}: {why}. No PyPI package ships a reward model, so ALERT-Disc needs "
        "a checkpoint: pass a local folder of a Hugging Face sequence-classification reward "
        "model (e.g. a download of RLHFlow/ArmoRM-Llama3-8B-v0.1, with trust_remote_code), or "
        "a hub id on a machine with hub access.")


def build_reward_scorer(ref: str, device: str = "auto", **options: Any) -> RewardScorer:
    """A RewardScorer for a model reference; `ModelUnavailable` says how to supply one."""
    location = resolve_checkpoint(ref, _unavailable)
    try:
        return RewardScorer(location, model_ref=ref, device=device, **options)
    except OSError as exc:  # transformers' "not a local folder and not on the hub"
        raise _unavailable(ref, f"cannot load it ({str(exc).splitlines()[0]})") from exc
