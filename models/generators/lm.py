"""What the generators built on a pretrained causal language model share (PEPLER, XRec).

Why one base: both put vectors that stand for the user and the item in front of (or
inside) a pretrained LM's input and train it to continue with the explanation, so the
token mapping, the teacher-forced loss, the KV-cached decoding and the freezing of the
LM are the same code; a model only says how it builds its prompt.

Token ids. The trained generators of rexeval speak one id space (`models.generators.base`:
PAD, BOS, EOS, UNK = 0..3), which the trainer, `greedy`, `beam`, the prepared data and the
decoding job rely on. An LM-backed generator uses its backbone's own tokenizer inside
that space: our id = LM id + `OFFSET`, EOS is the LM's end-of-text token (its own id is
masked, so the end is spelled one way only), BOS stands for the token the model's
prompt ends with (PEPLER: the tokenizer's start token; XRec: the last token of the chat
template's assistant header), and every other special token of the tokenizer is never
generated. `LMTokens` is that vocabulary (encode, decode, saved with the data).

Decoding. `begin` runs the prompt once and keeps the LM's keys and values as state
tensors (batch first, so beam search reorders them like any other state); `step` feeds
only the newest token. Prompts of different lengths are left-padded with an attention
mask and position ids counted over real tokens only, so a row decodes the same in a
batch as alone (tested); the decoding job sorts examples by prompt length so a batch is
mostly of one shape.

dtype: "auto" loads the LM in bfloat16 on a GPU and float32 on the CPU; the trained
vectors (prompts, adapters) stay float32 and are cast when they enter the LM.
"""
from __future__ import annotations

import abc
import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from rexeval.models.generators.base import BOS, EOS, PAD, UNK, Batch, Generator, State

OFFSET = 4
"""LM token id t is our id t + OFFSET (PAD, BOS, EOS and UNK keep 0..3)."""
IGNORE = -100


def load_tokenizer(path: str):
    """The backbone's tokenizer; a model URI is read from this node's copy (`refs.on_node`)."""
    from transformers import AutoTokenizer

    from rexeval.models.refs import on_node

    return AutoTokenizer.from_pretrained(on_node(path))


def encode_plain(tokenizer, text: str) -> list[int]:
    """LM ids of `text` as plain text: special-token strings inside a review are split
    into ordinary pieces, never read as control tokens."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


class LMTokens:
    """The vocabulary of an LM-backed generator: the backbone's tokenizer in our id space
    (see the module docstring). Text keeps its case; a target is cut to `max_words`
    LM tokens."""

    kind = "lm"

    def __init__(self, path: str):
        self.path = str(path)
        self.tokenizer = load_tokenizer(self.path)
        self.n_lm = len(self.tokenizer)

    def __len__(self) -> int:
        return self.n_lm + OFFSET

    @property
    def words(self) -> list[str]:
        """What identifies this vocabulary (for data fingerprints): size and a hash of
        the token table."""
        table = json.dumps(sorted(self.tokenizer.get_vocab().items()), ensure_ascii=False)
        return ["<lm>", str(self.n_lm), hashlib.blake2b(table.encode(), digest_size=12).hexdigest()]

    def length(self, text: str) -> int:
        return len(encode_plain(self.tokenizer, (text or "").strip()))

    def encode(self, text: str, max_words: int) -> list[int]:
        """[BOS, t1 .. tn, EOS] with n <= max_words LM tokens."""
        ids = encode_plain(self.tokenizer, (text or "").strip())[:max_words]
        return [BOS, *(i + OFFSET for i in ids), EOS]

    def decode(self, ids) -> str:
        lm = [i - OFFSET for i in ids if i >= OFFSET]
        return self.tokenizer.decode(lm, skip_special_tokens=True).strip()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"kind": self.kind, "path": self.path, "size": self.n_lm}))

    @classmethod
    def load(cls, path: str | Path) -> LMTokens:
        return cls(json.loads(Path(path).read_text())["path"])


def resolve_dtype(dtype: str, device: str | torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return getattr(torch, dtype)
    except AttributeError:
        raise ValueError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16") from None


def load_causal_lm(path: str, dtype: str = "auto", device: str = "cpu"):
    """The backbone, in eval mode, weights in `dtype` (see `resolve_dtype`); a model URI
    is loaded from this node's copy (`refs.on_node`)."""
    from rexeval.models.hf_import import import_transformers
    from rexeval.models.refs import on_node

    transformers = import_transformers()
    AutoModelForCausalLM, hf_logging = transformers.AutoModelForCausalLM, transformers.utils.logging
    hf_logging.disable_progress_bar()
    try:
        lm = AutoModelForCausalLM.from_pretrained(on_node(path), dtype=resolve_dtype(dtype, device))
    except OSError as exc:
        raise FileNotFoundError(f"cannot load a causal language model from {path!r}: {exc}. Give a local "
                                "model folder with --model generator_lm=PATH (or generator_llm for XRec)") from None
    return lm.eval()


class Prompt(NamedTuple):
    """A batch's prompt: input embeddings [B, P, H] (left-padded), its attention mask
    [B, P] (1 = real token) and what a model injects inside the LM while the prompt runs
    (None for PEPLER)."""

    embeds: torch.Tensor
    mask: torch.Tensor
    inject: Any = None


class LMGenerator(Generator):
    """Base of the generators on a pretrained causal LM (see the module docstring).

    A subclass sets `self.bos_lm` (the LM id that BOS stands for) and implements
    `prompt(user, item, rating) -> Prompt`; it may override `combine` (a rating
    head) and `inject` (XRec's per-layer injection, a context manager around a forward
    pass that runs the prompt).
    """

    def __init__(self, n_users: int, n_items: int, vocab_size: int, max_words: int, lm: str | None = None,
                 dtype: str = "auto"):
        super().__init__(n_users, n_items, vocab_size, max_words)
        if not lm:
            raise ValueError(f"{type(self).__name__} needs a backbone: the profile's language model role "
                             "(or --model generator_lm=PATH)")
        self.lm_path, self.dtype_name = str(lm), dtype
        self.lm = load_causal_lm(self.lm_path, dtype)
        self.tokenizer = load_tokenizer(self.lm_path)
        self.n_lm = len(self.tokenizer)
        if vocab_size != self.n_lm + OFFSET:
            raise ValueError(f"the data was tokenised for a vocabulary of {vocab_size - OFFSET} LM tokens but "
                             f"{self.lm_path} has {self.n_lm}: prepare the data with this backbone")
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"{self.lm_path}'s tokenizer has no end-of-text token")
        self.eos_lm = int(eos)
        self.bos_lm = int(self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else eos)
        self.hidden = int(self.lm.get_input_embeddings().weight.shape[1])
        banned = sorted({int(i) for i in self.tokenizer.all_special_ids if i is not None and 0 <= i < self.n_lm})
        self.register_buffer("banned", torch.tensor(banned, dtype=torch.long), persistent=False)
        self.lm_tuned = False
        self.freeze_lm()

    # --- the LM's weights: frozen, tuned, and kept out of checkpoints while frozen ---------

    def freeze_lm(self) -> None:
        for p in self.lm.parameters():
            p.requires_grad_(False)
        self.lm_tuned = False

    def unfreeze_lm(self) -> None:
        for p in self.lm.parameters():
            p.requires_grad_(True)
        self.lm_tuned = True

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.lm_tuned:  # a frozen backbone also keeps its dropout off
            self.lm.eval()
        return self

    def state_dict(self, *args, **kwargs):
        """Without the backbone's weights while they are the pretrained ones (a checkpoint
        of a frozen-LM phase holds the trained vectors only, not a copy of the LM)."""
        sd = super().state_dict(*args, **kwargs)
        if not self.lm_tuned:
            prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
            for k in [k for k in sd if k.startswith(prefix + "lm.")]:
                del sd[k]
        return sd

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A checkpoint without `lm.*` keys keeps the pretrained backbone; one with them
        (the LM was tuned) replaces it."""
        if any(k.startswith("lm.") for k in state_dict):
            self.unfreeze_lm()
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        if strict:
            missing = [k for k in result.missing_keys if not k.startswith("lm.")]
            if missing or result.unexpected_keys:
                raise RuntimeError(f"checkpoint does not fit {type(self).__name__}: missing {missing}, "
                                   f"unexpected {result.unexpected_keys}")
        return result

    # --- id mapping -----------------------------------------------------------------------

    def to_lm(self, ids: torch.Tensor) -> torch.Tensor:
        """Our ids as LM input ids (PAD, EOS and UNK read as the end token: they only
        follow the end, where nothing is predicted)."""
        out = torch.where(ids >= OFFSET, ids - OFFSET, torch.full_like(ids, self.eos_lm))
        return torch.where(ids == BOS, torch.full_like(ids, self.bos_lm), out)

    def targets_lm(self, ids: torch.Tensor) -> torch.Tensor:
        """Our target ids as LM targets: EOS is the end token, PAD is ignored."""
        out = torch.where(ids >= OFFSET, ids - OFFSET, torch.full_like(ids, self.eos_lm))
        return out.masked_fill((ids == PAD) | (ids == BOS) | (ids == UNK), IGNORE)

    def to_ours(self, logp: torch.Tensor) -> torch.Tensor:
        """LM log-probabilities [B, V_lm] as ours [B, V_lm + OFFSET]: the end token's go to
        EOS, the tokenizer's special tokens get none (not renormalised: decoding only
        compares them)."""
        logp = logp.float()
        eos = logp[:, self.eos_lm]
        out = logp.new_full((logp.shape[0], self.n_lm + OFFSET), -float("inf"))
        out[:, OFFSET:] = logp.index_fill(1, self.banned, -float("inf"))
        out[:, EOS] = eos
        return out

    def embed_ids(self, lm_ids: torch.Tensor) -> torch.Tensor:
        return self.lm.get_input_embeddings()(lm_ids)

    @property
    def lm_dtype(self) -> torch.dtype:
        return self.lm.get_input_embeddings().weight.dtype

    # --- what a model provides ------------------------------------------------------------

    @abc.abstractmethod
    def prompt(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> Prompt:
        """The batch's prompt embeddings, mask and injection (see `Prompt`)."""

    def combine(self, batch: Batch, text: torch.Tensor) -> dict[str, torch.Tensor]:
        """The objective from the text loss (PEPLER adds its rating regulariser)."""
        return {"loss": text, "text": text}

    def inject(self, prompt: Prompt):
        """Context manager around a forward pass that runs `prompt` (XRec injects inside
        the LM's layers); nothing here."""
        return contextlib.nullcontext()

    def prompt_lengths(self, user: torch.Tensor, item: torch.Tensor) -> list[int]:
        """Prompt length per row (the decoding job groups rows of one length)."""
        return [2] * len(user)

    # --- training and decoding ------------------------------------------------------------

    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        p = self.prompt(batch.user, batch.item, batch.rating)
        inputs = batch.tokens[:, :-1]
        words = self.embed_ids(self.to_lm(inputs))
        x = torch.cat([p.embeds, words], 1)
        mask = torch.cat([p.mask, torch.ones_like(inputs)], 1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        with self.inject(p):
            out = self.lm(inputs_embeds=x, attention_mask=mask, position_ids=positions, use_cache=False,
                          logits_to_keep=inputs.shape[1])
        logits = out.logits[..., : self.n_lm].float()
        text = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                           self.targets_lm(batch.tokens[:, 1:]).reshape(-1), ignore_index=IGNORE)
        return self.combine(batch, text)

    def begin(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> State:
        from transformers import DynamicCache

        p = self.prompt(user, item, rating)
        positions = (p.mask.cumsum(1) - 1).clamp(min=0)
        with self.inject(p):
            out = self.lm(inputs_embeds=p.embeds, attention_mask=p.mask, position_ids=positions,
                          past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        state = _cache_state(out.past_key_values)
        state["mask"] = p.mask
        state["next_pos"] = positions[:, -1] + 1
        return state

    def step(self, state: State, prefix: torch.Tensor) -> tuple[torch.Tensor, State]:
        last = self.embed_ids(self.to_lm(prefix[:, -1:]))
        mask = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], 1)
        out = self.lm(inputs_embeds=last, attention_mask=mask, position_ids=state["next_pos"][:, None],
                      past_key_values=_state_cache(state), use_cache=True)
        logp = out.logits[:, -1, : self.n_lm].float().log_softmax(-1)
        new = _cache_state(out.past_key_values)
        new["mask"] = mask
        new["next_pos"] = state["next_pos"] + 1
        return self.to_ours(logp), new


def _cache_state(cache) -> State:
    """A DynamicCache's per-layer keys and values as flat state tensors [B, heads, T, d]."""
    state = {}
    for i, layer in enumerate(cache.layers):
        state[f"k{i}"], state[f"v{i}"] = layer.keys, layer.values
    return state


def _state_cache(state: State):
    from transformers import DynamicCache

    cache = DynamicCache()
    i = 0
    while f"k{i}" in state:
        cache.update(state[f"k{i}"], state[f"v{i}"], i)
        i += 1
    return cache
