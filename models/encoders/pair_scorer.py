"""Paraphrase pair scorers (role `cross_encoder`): two statements in, P(paraphrase) out.

Why a pair scorer after the bi-encoder: cosine similarity of separate embeddings
confuses "the strings are bright" with "the strings are dull" (same aspect, opposite
opinion); a model that reads both statements together does not. Seed 002 filters the
bi-encoder's candidate pairs with one.

Two kinds, registered by name (`@register_pair_scorer`), so another kind is one class:
- "cross_encoder": a Hugging Face sequence-classification checkpoint. One output ->
  sigmoid(logit); two -> softmax probability of the positive label (found in
  `config.id2label`). Three or more (NLI: entailment / neutral / contradiction) is
  refused: entailment one way is not paraphrase, so such a model needs its own logic.
- "reranker_llm": a causal-LM reranker (Qwen3-Reranker): the pair is written into the
  `paraphrase_rerank` prompt, and P = softmax([logit("yes"), logit("no")])[0] at the
  last prompt position.
`build_pair_scorer(ref, kind="auto")` picks the kind from the checkpoint's config.json
`architectures`. Scores are for the ordered pair (a, b); averaging both orders, if
wanted, is the caller's business.

Batching (shared with the NLI engine, see `pair_batching.py`): each distinct pair is
scored once; pairs are tokenised once, sorted by token length (less padding), cut into
batches, padded (right for encoders, left for the causal LM, with position ids from the
attention mask) and run under `torch.inference_mode`; results come back in input order
and equal one-at-a-time scoring up to float rounding. `last_stats` tells what the last
call did (pairs, distinct pairs, batches, real and padded tokens).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rexeval.models.encoders.pair_batching import (
    BatchedPairModel,
    check_pairs,
    classifier_logits,
    encoding_rows,
    pad_rows,
    read_config_json,
    resolve_checkpoint,
)
from rexeval.models.refs import ModelUnavailable
from rexeval.registry import Registry

ROLE = "cross_encoder"
POSITIVE_LABELS = frozenset({
    "1", "label_1", "true", "yes", "paraphrase", "is_paraphrase", "duplicate",
    "is_duplicate", "entailment", "equivalent", "same", "similar",
})
"""id2label names (case-insensitive) that mark the positive class of a 2-label model."""

class PairScorer(BatchedPairModel):
    """Probability, per ordered pair of statements, that they are paraphrases.

    Common options (see `BatchedPairModel`): device ("auto" | "cpu" | "cuda[:N]"),
    batch_size (32), max_length (256 tokens per pair, longer pairs are truncated),
    num_threads (torch CPU threads, process-wide), dtype ("auto": float32 on CPU,
    bfloat16 on CUDA). A subclass writes `_encode` and `_forward` (one probability per
    row).
    """

    name: str = "pair_scorer"

    def score(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> np.ndarray:
        """float32 array of P(paraphrase) in [0, 1], one per pair, in input order."""
        return np.clip(self._run(check_pairs(pairs), batch_size), 0.0, 1.0)


PAIR_SCORERS: Registry[type[PairScorer]] = Registry("pair scorer kind", base=PairScorer)
register_pair_scorer = PAIR_SCORERS.register
"""Class decorator: make a scorer buildable by `build_pair_scorer(kind=name)`."""


@register_pair_scorer("cross_encoder")
class CrossEncoderScorer(PairScorer):
    """A sequence-classification checkpoint reading "[CLS] a [SEP] b [SEP]".

    `positive_label` (a label name or index) overrides the positive class of a 2-label
    model; by default it is the label whose name is in POSITIVE_LABELS, else index 1.
    """

    def __init__(self, location: str, *, positive_label: str | int | None = None, **options: Any):
        super().__init__(location, **options)
        from transformers import (
            AutoConfig,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        config = AutoConfig.from_pretrained(self.location)
        self.num_labels = int(config.num_labels)
        if self.num_labels >= 3:
            labels = ", ".join(str(v) for _, v in sorted((config.id2label or {}).items()))
            raise ValueError(
                f"{self.model_ref!r} is a {self.num_labels}-way classifier ({labels}), e.g. an NLI "
                "model, not a paraphrase scorer: entailment in one direction is not paraphrase. "
                "Pick a paraphrase / duplicate-question cross-encoder (1 output, or 2 labels) "
                f"for the {ROLE!r} role.")
        self.positive_index = (0 if self.num_labels == 1
                               else _positive_index(config.id2label, positive_label))
        self.tokenizer = AutoTokenizer.from_pretrained(self.location)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            self.location, dtype=self.dtype).to(self.device).eval()

    def _encode(self, pairs):
        return encoding_rows(self.tokenizer([a for a, _ in pairs], [b for _, b in pairs],
                                            truncation=True, max_length=self.max_length))

    def _forward(self, batch):
        return self._launch(batch).cpu().numpy()

    def _launch(self, batch):
        import torch

        logits = classifier_logits(self.model, pad_rows(self.tokenizer, batch, self.device))
        if self.num_labels == 1:
            return torch.sigmoid(logits[:, 0])
        return torch.softmax(logits, dim=-1)[:, self.positive_index]


def _positive_index(id2label: dict | None, positive_label: str | int | None) -> int:
    """Index of the positive class among two labels (see POSITIVE_LABELS)."""
    labels = {int(k): str(v) for k, v in (id2label or {}).items()}
    if positive_label is not None:
        if isinstance(positive_label, int) and positive_label in (0, 1):
            return positive_label
        for idx, name in labels.items():
            if name.casefold() == str(positive_label).casefold():
                return idx
        raise ValueError(f"positive_label {positive_label!r} is not one of the labels {labels}")
    hits = [idx for idx, name in labels.items() if name.strip().casefold() in POSITIVE_LABELS]
    return hits[0] if len(hits) == 1 else 1


@register_pair_scorer("reranker_llm")
class RerankerLLMScorer(PairScorer):
    """A causal-LM reranker asked, through the `paraphrase_rerank` prompt, "paraphrases?".

    Options: prompt (prompt name, "paraphrase_rerank"), prompts_dir (an override folder,
    see prompts.loader), instruction (replaces the prompt's default instruction),
    yes_token / no_token ("yes" / "no"; each must be one token), assistant_prefix (text
    that opens the assistant turn; None = an empty think block "<think>\\n\\n</think>\\n\\n"
    when the chat template knows think blocks, as Qwen3 rerankers expect, else nothing),
    max_statement_tokens (200: a longer statement is cut to that many tokens before it
    is written into the prompt, so the answer position is never truncated away),
    max_length (512 here: the prompt around the statements is ~100 tokens).
    """

    THINK_PREFIX = "<think>\n\n</think>\n\n"

    def __init__(self, location: str, *, prompt: str = "paraphrase_rerank",
                 prompts_dir: str | os.PathLike | None = None, instruction: str | None = None,
                 yes_token: str = "yes", no_token: str = "no",
                 assistant_prefix: str | None = None, max_statement_tokens: int = 200,
                 max_length: int = 512, **options: Any):
        super().__init__(location, max_length=max_length, **options)
        import inspect

        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rexeval.prompts import load_prompt

        self.prompt = load_prompt(prompt, prompts_dir)
        self.prompt_version = self.prompt.version
        self.instruction = instruction
        self.tokenizer = AutoTokenizer.from_pretrained(self.location, padding_side="left")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.model_ref!r}: the tokenizer has no chat template; the "
                             f"{ROLE!r} reranker prompt needs one")
        self.yes_id = self._single_token(yes_token)
        self.no_id = self._single_token(no_token)
        self.assistant_prefix = assistant_prefix
        self.max_statement_tokens = int(max_statement_tokens)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.location, dtype=self.dtype).to(self.device).eval()
        # Only the last position's logits are read: skip the [batch, length, vocab]
        # tensor (5 GB for 32 x 512 x Qwen's 151k vocabulary) where the model allows.
        self._last_only = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _single_token(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"{self.model_ref!r}: {word!r} is {len(ids)} tokens {ids} in this tokenizer, "
                "not one; the reranker reads one answer token. Pass yes_token= / no_token= "
                "naming single tokens of this vocabulary.")
        return ids[0]

    def _clip(self, text: str) -> str:
        """`text` cut to max_statement_tokens tokens (byte length bounds the count first)."""
        if len(text.encode("utf-8")) <= self.max_statement_tokens:
            return text
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= self.max_statement_tokens:
            return text
        return self.tokenizer.decode(ids[:self.max_statement_tokens])

    def render(self, a: str, b: str) -> str:
        """The full prompt text for the pair (a, b), ending where the answer starts."""
        variables = {"statement_a": self._clip(a), "statement_b": self._clip(b)}
        if self.instruction is not None:
            variables["instruction"] = self.instruction
        messages = self.prompt.render(**variables)
        if self.assistant_prefix is not None:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
            return text + self.assistant_prefix
        # enable_thinking=False makes Qwen3 templates write the empty think block
        # themselves; other templates ignore the flag, and we add the block for those
        # that know think blocks but did not write it.
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True,
                                                  enable_thinking=False)
        if "<think>" in str(self.tokenizer.chat_template) and \
                not text.rstrip().endswith("</think>"):
            text += self.THINK_PREFIX
        return text

    def _encode(self, pairs):
        texts = [self.render(a, b) for a, b in pairs]
        enc = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        too_long = [i for i, ids in enumerate(enc) if len(ids) > self.max_length]
        if too_long:
            # Cutting the prompt would cut the answer position: refuse instead.
            raise ValueError(f"{len(too_long)} pair prompt(s) exceed max_length="
                             f"{self.max_length} tokens (first: pair {too_long[0]}, "
                             f"{len(enc[too_long[0]])} tokens); raise max_length or lower "
                             "max_statement_tokens")
        return [{"input_ids": ids} for ids in enc]

    def _forward(self, batch):
        import torch

        padded = pad_rows(self.tokenizer, batch, self.device)
        ids, mask = padded["input_ids"], padded["attention_mask"]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        extra = {"logits_to_keep": 1} if self._last_only else {}
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                **extra).logits[:, -1, :]
        pair = torch.stack([logits[:, self.yes_id], logits[:, self.no_id]], dim=-1).float()
        return torch.softmax(pair, dim=-1)[:, 0].cpu().numpy()


# --- building one from a reference -----------------------------------------------------

def _unavailable(ref: str, why: str, role: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"{role} model {ref!r}: {why}. No PyPI package ships a cross-encoder, so the local "
        "profile runs paraphrase clustering bi-encoder-only; to filter pairs with one, pass "
        f"a checkpoint with `--model {role}=/path/to/checkpoint` (a sequence-classification "
        "paraphrase/duplicate model, or a causal-LM reranker such as Qwen3-Reranker), or a "
        "Hugging Face id on a machine with hub access.")


def detect_pair_scorer_kind(location: str, *, ref: str | None = None, role: str = ROLE) -> str:
    """"cross_encoder" for *ForSequenceClassification, "reranker_llm" for *ForCausalLM,
    read from config.json `architectures`; anything else is a ValueError naming the file."""
    config, file = read_config_json(location, ref or location,
                                    lambda r, why: _unavailable(r, why, role),
                                    f"its {role} kind cannot be detected")
    archs = [str(a) for a in config.get("architectures") or []]
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return "cross_encoder"
    if any(a.endswith("ForCausalLM") for a in archs):
        return "reranker_llm"
    raise ValueError(
        f"{file}: architectures {archs or 'missing'} are neither *ForSequenceClassification "
        f"(kind 'cross_encoder') nor *ForCausalLM (kind 'reranker_llm'); pass kind= "
        f"explicitly or pick a {role} checkpoint of one of those kinds")


def pair_scorer_class(kind: str) -> type[PairScorer]:
    """The class registered under `kind`, or "package.module:Class" for one of your own."""
    return PAIR_SCORERS.lookup(kind)


def build_pair_scorer(ref: str, kind: str = "auto", device: str = "auto", *,
                      role: str = ROLE, **options: Any) -> PairScorer:
    """A pair scorer for a model reference (local path, or hub id on hub machines).

    `kind` "auto" reads the checkpoint's config.json (see `detect_pair_scorer_kind`);
    `options` go to the scorer class (batch_size, max_length, dtype, ...). A reference
    that names no existing path or reachable model raises `ModelUnavailable` saying how
    to supply one for `role`.
    """
    location = resolve_checkpoint(ref, lambda r, why: _unavailable(r, why, role))
    if kind == "auto":
        kind = detect_pair_scorer_kind(location, ref=ref, role=role)
    cls = pair_scorer_class(kind)
    try:
        return cls(location, model_ref=ref, device=device, **options)
    except OSError as exc:  # transformers' "not a local folder and not on the hub"
        raise _unavailable(ref, f"cannot load it ({str(exc).splitlines()[0]})", role) from exc
