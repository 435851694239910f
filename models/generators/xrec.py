"""XRec (Ma, Ren & Huang, EMNLP 2024): collaborative embeddings of the user and the item,
mapped by a small mixture-of-experts adapter into a frozen LLM at reserved prompt
positions, beside profiles of both written by an LLM from their reviews."""
from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from rexeval.models.generators.base import register_generator
from rexeval.models.generators.lm import LMGenerator, Prompt

SYSTEM = ("Explain in at most 50 words why this user would enjoy this item. You are given a "
          "collaborative-filtering embedding of the user and of the item, and short profiles of both "
          "that were written from their reviews.")
SLOTS = ("\x00user_embedding\x00", "\x00item_embedding\x00", "\x00user_profile\x00", "\x00item_profile\x00")
CONTENT = "User record: {}\nItem record: {}\nUser profile: {}\nItem profile: {}"


class MoEAdapter(nn.Module):
    """XRec's collaborative information adapter: `n_experts` whitening experts (dropout,
    subtract a learned bias, then a linear map without bias) mixed by a softmax gate over
    the (undropped) input; in training the gate logits get Gaussian noise whose scale is
    learned (softplus of a second linear map, + 0.01), as in the original. Each expert
    draws its own dropout mask (the original gives each expert its own Dropout). Gate and
    noise weights start at zero, expert weights from N(0, 0.02)."""

    def __init__(self, in_dim: int, out_dim: int, n_experts: int = 8, dropout: float = 0.2, noisy: bool = True):
        super().__init__()
        self.noisy = bool(noisy)
        self.drop = nn.Dropout(dropout)
        self.bias = nn.Parameter(torch.zeros(n_experts, in_dim))
        self.weight = nn.Parameter(torch.randn(n_experts, in_dim, out_dim) * 0.02)
        self.w_gate = nn.Parameter(torch.zeros(in_dim, n_experts))
        self.w_noise = nn.Parameter(torch.zeros(in_dim, n_experts))

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        logits = x @ self.w_gate
        if self.noisy and self.training:
            std = nn.functional.softplus(x @ self.w_noise) + 1e-2
            logits = logits + torch.randn_like(logits) * std
        return logits.softmax(-1)

    def expert_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """[B, in_dim] -> [B, n_experts, in_dim]: dropout(x) - bias_e, one mask per expert."""
        return self.drop(x[:, None, :].expand(-1, self.bias.shape[0], -1)) - self.bias[None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, in_dim] -> [B, out_dim]."""
        experts = torch.einsum("bei,eio->beo", self.expert_inputs(x), self.weight)
        return (self.gates(x)[..., None] * experts).sum(1)


def kv_share(vec: torch.Tensor, width: int, head_dim: int) -> torch.Tensor:
    """A hidden-size vector [B, H] made to fit a key/value projection of `width` (grouped
    query attention has fewer key/value heads than query heads): the mean over the query
    heads that share each key/value head. The identity when width == H."""
    if vec.shape[-1] == width:
        return vec
    n_q, n_kv = vec.shape[-1] // head_dim, width // head_dim
    return vec.reshape(len(vec), n_kv, n_q // n_kv, head_dim).mean(2).reshape(len(vec), width)


def ragged(flat: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [flat[offsets[k]:offsets[k + 1]].tolist() for k in range(len(offsets) - 1)]


@register_generator("xrec")
class XRec(LMGenerator):
    """XRec's explainer (see the module docstring).

    The original, as seed 000 ran it (`baselines/XRec` of the authors' repository):
    LightGCN (64 dimensions, 4 layers summed, Xavier-uniform start; BPR + 1e-6 times the
    squared L2 norm of the batch's propagated rows; Adam 1e-3, batch 1024, at most 300
    epochs, stopping after 10 without a better validation Recall@20) is trained on the
    training interactions and its embeddings are frozen. Two MoE adapters (8 experts,
    dropout 0.2, noisy gating) map them to the width of Llama-2-7b-chat, loaded in 8-bit,
    the adapter outputs cast to half. The prompt `<s>[INST] <<SYS>>Explain why the user
    would interact with the item.<</SYS>>user record: <USER_EMBED> {domain} record:
    <ITEM_EMBED> {domain} name: {title} user profile: {..} {domain} profile: {..}
    <EXPLAIN_POS> {explanation}[/INST]` uses three added tokens; the adapter outputs
    replace the input embeddings at `<USER_EMBED>` and `<ITEM_EMBED>` and are added to
    the query, key and value projections at those positions in every attention layer
    while the prompt is read. The LLM stays frozen; the adapters train one epoch (Adam
    1e-4, batch 1) on the next-token loss from `<EXPLAIN_POS>` to the end (`[/INST]`
    included, no EOS); generation is greedy, 128 new tokens, cut at the first "[".

    Here the same mechanism on the profile's `generator_llm` role (the packaged
    SmolLM2-135M in `local`; a Llama in `paper`) and rexeval's one LightGCN
    (`pipelines/generate/collab.py`; `gcn_combine="sum"`, `gcn_init="xavier"`,
    `gcn_reg_mode="output_sum"` as the original). What still differs:

    - LightGCN's regulariser is the original's (`gcn_reg_mode="output_sum"`: `gcn_reg`
      times the batch's propagated rows' squared norms, not divided; "ego_mean" is
      rexeval's LightGCN default, the ego rows divided by the batch); it trains on
      the distinct (user, item) pairs with a fresh uniform negative each epoch (the
      original: every training row, one negative per row drawn once, among the training
      items the user has none with) and keeps the epoch of best validation AUC.
    - Profiles come from rexeval's profile step on the `generator_llm` role with our
      prompts (the original: Llama-3.1-8B-Instruct summaries); an item's title is the
      first line of its profile.
    - The prompt: our system text (asks for at most 50 words) and field labels; the
      explanation is the assistant's turn of the backbone's chat template, ending with
      EOS (loss on it and EOS only). The reserved positions are our own: no tokens are
      added to the vocabulary and there is no `<EXPLAIN_POS>`.
    - Training targets are cut at `max_words` tokens (the original cuts none); decoding
      is rexeval's (stops at EOS or `max_words`).
    - Batches are left-padded and the padding is masked out of attention and loss (the
      original passes no attention mask in training and keeps pads in the loss; at its
      batch 1, our default too, there are none).
    - Precision: the LLM and the adapter outputs in `dtype` (bfloat16 on a GPU, float32
      on CPU), not 8-bit weights and half outputs.
    - On grouped-query attention the vector added to the narrower key and value
      projections is the mean over the query heads sharing each key/value head
      (`kv_share`; the original's Llama-2-7b has none); `inject_layers=false` keeps only
      the input replacement (backbones without q/k/v projections, GPT-2 among them).

    The data (`collab_*` embeddings and the profile token ids) is given by the pipeline and
    is not part of the checkpoint.
    """

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "optimizer": "adam", "lr": 1e-4, "lr_decay": 1.0, "weight_decay": 0.0, "clip": 0.0,
        "batch_size": 1, "vocab_size": 0, "max_words": 128, "epochs": 1,
        "lm": None, "dtype": "auto", "n_experts": 8, "adapter_dropout": 0.2, "noisy_gating": True,
        "inject_layers": True,
        "gcn_dim": 64, "gcn_layers": 4, "gcn_lr": 1e-3, "gcn_reg": 1e-6, "gcn_batch_size": 1024,
        "gcn_epochs": 300, "gcn_patience": 10, "gcn_combine": "sum", "gcn_init": "xavier",
        "gcn_reg_mode": "output_sum",
        "profile_reviews": 8, "profile_length": 128, "profile_tokens": 128,
    }
    SOURCE = "see models/generators/presets.py (PAPER_SOURCES['xrec'], SEED000['xrec'])"
    ROLE = "generator_llm"
    DATA_KEYS: ClassVar[tuple[str, ...]] = ("gcn_dim", "gcn_layers", "gcn_lr", "gcn_reg", "gcn_batch_size",
                                            "gcn_epochs", "gcn_patience", "gcn_combine", "gcn_init", "gcn_reg_mode",
                                            "profile_reviews", "profile_length", "profile_tokens")
    INPUTS: ClassVar[tuple[str, ...]] = ("collab", "profiles")

    def __init__(self, n_users: int, n_items: int, vocab_size: int, max_words: int = 128, lm: str | None = None,
                 dtype: str = "auto", n_experts: int = 8, adapter_dropout: float = 0.2, noisy_gating: bool = True,
                 inject_layers: bool = True, *, collab_user: np.ndarray, collab_item: np.ndarray,
                 user_text: list[list[int]], item_text: list[list[int]]):
        super().__init__(n_users, n_items, vocab_size, max_words, lm=lm, dtype=dtype)
        if len(collab_user) != n_users or len(collab_item) != n_items:
            raise ValueError(f"collaborative embeddings for {len(collab_user)} users / {len(collab_item)} items, "
                             f"data has {n_users} / {n_items}")
        if len(user_text) != n_users or len(item_text) != n_items:
            raise ValueError("one profile token list per user and per item is needed")
        self.register_buffer("collab_user", torch.as_tensor(np.asarray(collab_user), dtype=torch.float32),
                             persistent=False)
        self.register_buffer("collab_item", torch.as_tensor(np.asarray(collab_item), dtype=torch.float32),
                             persistent=False)
        self.user_text, self.item_text = [list(t) for t in user_text], [list(t) for t in item_text]
        dim = self.collab_user.shape[1]
        self.user_adapter = MoEAdapter(dim, self.hidden, n_experts, adapter_dropout, noisy_gating)
        self.item_adapter = MoEAdapter(dim, self.hidden, n_experts, adapter_dropout, noisy_gating)
        self.pieces = self._template()
        self.inject_layers = bool(inject_layers)
        self.projections = self._projections() if self.inject_layers else []
        self._active: tuple | None = None
        self._head_dim = {id(m): h for m, _, h in self.projections}
        for module, _, _ in self.projections:
            module.register_forward_hook(self._hook)

    @classmethod
    def build(cls, data, settings: dict[str, Any]) -> XRec:
        ex = data.extras
        missing = [k for k in ("collab_user", "collab_item", "user_text", "user_text_offsets", "item_text",
                               "item_text_offsets") if k not in ex]
        if missing:
            raise ValueError(f"{data.folder} has no XRec inputs ({', '.join(missing)} missing from extras.npz): "
                             "prepare it with `rexeval generate train --model xrec`")
        return cls(data.n_users, data.n_items, len(data.vocab), data.max_words, **cls.model_kwargs(settings),
                   collab_user=ex["collab_user"], collab_item=ex["collab_item"],
                   user_text=ragged(ex["user_text"], ex["user_text_offsets"]),
                   item_text=ragged(ex["item_text"], ex["item_text_offsets"]))

    def enter_phase(self, phase: int) -> None:
        self.freeze_lm()  # the LLM is never trained

    # --- the prompt -----------------------------------------------------------------------

    def _template(self) -> list[list[int]]:
        """The prompt's constant token pieces around the four slots; the last token of the
        last piece becomes what BOS stands for."""
        tok = self.tokenizer
        content = CONTENT.format(*SLOTS)
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
                                           tokenize=False, add_generation_prompt=True)
        else:
            text = f"{SYSTEM}\n\n{content}\nExplanation:"
        pieces, rest = [], text
        for slot in SLOTS:
            head, rest = rest.split(slot, 1)
            pieces.append(head)
        pieces.append(rest)
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in pieces]
        if not ids[-1]:
            raise ValueError(f"{self.lm_path}: the prompt template ends with a slot; cannot place BOS")
        self.bos_lm = int(ids[-1][-1])
        ids[-1] = ids[-1][:-1]
        return ids

    def row_ids(self, u: int, i: int) -> tuple[list[int], int, int]:
        """One prompt's LM ids and the positions of its user and item slots."""
        p = self.pieces
        slot = self.eos_lm  # any id: the embedding at a reserved position is replaced
        ids = p[0] + [slot] + p[1] + [slot] + p[2] + self.user_text[u] + p[3] + self.item_text[i] + p[4]
        return ids, len(p[0]), len(p[0]) + 1 + len(p[1])

    def prompt_lengths(self, user: torch.Tensor, item: torch.Tensor) -> list[int]:
        base = sum(len(p) for p in self.pieces) + 2
        return [base + len(self.user_text[u]) + len(self.item_text[i]) for u, i in zip(user.tolist(), item.tolist())]

    def prompt(self, user: torch.Tensor, item: torch.Tensor, rating: torch.Tensor) -> Prompt:
        rows = [self.row_ids(u, i) for u, i in zip(user.tolist(), item.tolist())]
        width = max(len(r[0]) for r in rows)
        dev = user.device
        ids = torch.full((len(rows), width), self.eos_lm, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        pos_u, pos_i = [], []
        for k, (r, pu, pi) in enumerate(rows):
            pad = width - len(r)  # left padding: every prompt ends where the answer starts
            ids[k, pad:] = torch.tensor(r)
            mask[k, pad:] = 1
            pos_u.append(pad + pu)
            pos_i.append(pad + pi)
        ids, mask = ids.to(dev), mask.to(dev)
        pos_u, pos_i = torch.tensor(pos_u, device=dev), torch.tensor(pos_i, device=dev)
        vec_u = self.user_adapter(self.collab_user[user]).to(self.lm_dtype)
        vec_i = self.item_adapter(self.collab_item[item]).to(self.lm_dtype)
        embeds = self.embed_ids(ids)
        rows_idx = torch.arange(len(rows), device=dev)
        embeds = embeds.index_put((rows_idx, pos_u), vec_u).index_put((rows_idx, pos_i), vec_i)
        return Prompt(embeds, mask, (rows_idx, pos_u, vec_u, pos_i, vec_i))

    # --- injection inside the LM ----------------------------------------------------------

    def _projections(self) -> list[tuple[nn.Module, str, int]]:
        """(module, kind, head_dim) of every attention layer's q, k and v projection."""
        cfg = self.lm.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        found = []
        for name, module in self.lm.named_modules():
            for kind in ("q_proj", "k_proj", "v_proj"):
                if name.endswith(f"self_attn.{kind}") and isinstance(module, nn.Linear):
                    found.append((module, kind, int(head_dim)))
        if not found:
            raise ValueError(f"{self.lm_path} has no q_proj/k_proj/v_proj attention projections to inject into; "
                             "use --set inject_layers=false (input positions only)")
        return found

    @contextlib.contextmanager
    def inject(self, prompt: Prompt):
        """While the prompt is read, add the adapter outputs to every layer's query, key and
        value projections at the two reserved positions."""
        self._active = prompt.inject if self.inject_layers else None
        try:
            yield
        finally:
            self._active = None

    def _hook(self, module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor | None:
        if self._active is None or output.shape[1] == 1:
            return None
        rows, pos_u, vec_u, pos_i, vec_i = self._active
        head_dim = self._head_dim[id(module)]
        width = output.shape[-1]
        out = output.index_put((rows, pos_u), kv_share(vec_u, width, head_dim).to(output.dtype), accumulate=True)
        return out.index_put((rows, pos_i), kv_share(vec_i, width, head_dim).to(output.dtype), accumulate=True)
