"""What makes the `hf` backend's greedy decoding fast on a CPU (`hf_backend.py` uses it).

- `cpu_gqa_sdpa`: an attention function that lets torch share the KV heads of grouped
  query attention even when a padding mask is given (transformers copies them);
- `DecodeState`: the KV cache and attention of one batch of our own greedy loop: the
  prompt prefix the batch shares is stored once and attended by every row ("cascade"
  attention), rows that finish leave the batch;
- `column_major_linears`: Linear layers with a column-major weight copy, faster for
  batches of 4 rows and more;
- `plain_greedy_config`: whether a generation config lets our loop stand in for
  generate() token for token; `pad_batch`: left padding after a shared prefix.
"""
from __future__ import annotations


CPU_GQA_ATTENTION = "rexeval_cpu_gqa"



def cpu_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                  scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """SDPA that lets torch share KV heads (GQA) even when a padding mask is given.

    Why our own attention function: transformers' "sdpa" path copies every KV head
    `num_key_value_groups` times whenever a mask is present (CUDA kernels need that),
    which on CPU makes a padded batch's decode step memory-bound: measured on SmolLM2
    (3 KV heads for 9 query heads), batch 16 x 900 tokens, 10.5 ms per layer with the
    copies against 2.0 ms with torch's own GQA. Same maths, no copies.
    """
    import torch

    if isinstance(attention_mask, DecodeState):  # our greedy loop (`_greedy_decode`)
        return attention_mask.attend(module.layer_idx, query, key, value, scaling)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None



def register_cpu_gqa() -> str:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(CPU_GQA_ATTENTION, cpu_gqa_sdpa)
    AttentionMaskInterface.register(CPU_GQA_ATTENTION, sdpa_mask)  # same masks as "sdpa"
    return CPU_GQA_ATTENTION



# Model families whose decoder layers `_greedy_decode` drives directly (embed_tokens,
# rotary_emb, layers calling `past_key_values.update` and the attention function, norm,
# lm_head with no logit scaling); any other model goes through generate().
FAST_GREEDY_MODEL_TYPES = frozenset({"llama"})



# Generation-config fields with which generate() would change greedy logits or stop
# otherwise than on EOS / max_new_tokens: the greedy loop runs only when all are neutral.
_NEUTRAL_GENERATION = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0),
    "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "sequence_bias": (None,),
    "exponential_decay_length_penalty": (None,), "stop_strings": (None,), "max_time": (None,),
    "guidance_scale": (None, 1.0), "watermarking_config": (None,), "num_beams": (None, 1),
    "num_return_sequences": (None, 1),
}



def plain_greedy_config(generation_config) -> bool:
    """True when greedy generate() with this config is argmax + EOS / length stops only."""
    return all(getattr(generation_config, k, None) in ok for k, ok in _NEUTRAL_GENERATION.items())



class DecodeState:
    """KV cache and attention of one `_greedy_decode` batch.

    The decoder layers get it as `past_key_values` (they call `update`) and as
    `attention_mask` (our attention function sees the type and calls `attend`), so no
    4D mask is built by transformers and no generic Cache logic runs per step.

    The prompt prefix the batch shares is kept ONCE per layer (`prefix`: (kv heads, P,
    head dim)), not copied into every row: each row's queries attend to it in one matmul
    for the whole batch, and to the row's own KV ([left padding][prompt suffix][generated],
    preallocated to `capacity`); the two softmax parts are merged by their log-sum-exp
    ("cascade" attention). A copied 700-token prefix was most of a batch-16 decode step's
    memory traffic. Without a shared prefix it is torch's SDPA with GQA, as before.

    `select(rows)` drops finished rows: only the rows' own KV is copied, the prefix stays.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype, device, prefix=None):
        import torch

        shape = (batch, kv_heads, capacity, head_dim)
        # zeros: padding slots are masked, but garbage there (NaN, inf) would still leak
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.prefix = prefix  # per layer (keys, values), or None
        self.length = 0       # positions of the rows' own KV filled so far
        self.min = torch.finfo(dtype).min
        self.pad_bias = None  # (batch, capacity): 0 where a key may be seen, min at padding
        self.bias = None      # additive mask of the current forward: (batch, 1, q, length + q)

    def set_padding(self, mask) -> None:
        """mask: (batch, width) of 1 for tokens, 0 for padding; later positions are tokens."""
        import torch

        if bool(mask.all()):
            return
        bias = torch.zeros((mask.shape[0], self.k[0].shape[2]), dtype=self.k[0].dtype,
                           device=self.k[0].device)
        bias[:, :mask.shape[1]].masked_fill_(mask.to(bias.device) == 0, self.min)
        self.pad_bias = bias

    def begin(self, q: int) -> None:
        """Build the mask for a forward of `q` new positions per row (causal when q > 1)."""
        import torch

        end = self.length + q
        if self.pad_bias is None and (q == 1 or (self.length == 0 and self.prefix is None)):
            self.bias = None  # nothing hidden (q > 1: SDPA's own is_causal)
            return
        bias = (torch.zeros((self.k[0].shape[0], end), dtype=self.k[0].dtype,
                            device=self.k[0].device)
                if self.pad_bias is None else self.pad_bias[:, :end])
        bias = bias[:, None, None, :].expand(-1, 1, q, -1)
        if q > 1:  # key j is hidden from new position i when j > length + i
            future = torch.ones((q, end), dtype=torch.bool, device=bias.device).triu_(self.length + 1)
            bias = bias.masked_fill(future, self.min)  # masked_fill, not +: min + min = -inf
        self.bias = bias

    def update(self, key, value, layer_idx: int, *args, **kwargs):
        end = self.length + key.shape[2]
        self.k[layer_idx][:, :, self.length:end] = key
        self.v[layer_idx][:, :, self.length:end] = value
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]

    def select(self, rows) -> None:
        """Keep only these rows (a LongTensor of row indices)."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        if self.pad_bias is not None:
            self.pad_bias = self.pad_bias.index_select(0, rows)

    def attend(self, layer: int, query, key, value, scaling):
        """Attention output (batch, q, heads, head dim) of `query` (batch, heads, q, head dim)."""
        import torch

        batch, heads, q, dim = query.shape
        kv_heads, own = key.shape[1], key.shape[2]
        if self.prefix is None:
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=self.bias, scale=scaling,
                is_causal=self.bias is None and q > 1, enable_gqa=kv_heads != heads)
            return out.transpose(1, 2).contiguous(), None

        rows = heads // kv_heads * q  # query head h reads KV head h // group (repeat_kv order)
        qg = (query * scaling).reshape(batch, kv_heads, rows, dim)
        # The row's own keys: (batch, kv heads, group x q, own).
        s2 = torch.matmul(qg, key.transpose(2, 3))
        if self.bias is not None:
            s2 = s2.view(batch, kv_heads, -1, q, own).add_(self.bias.unsqueeze(1))
            s2 = s2.view(batch, kv_heads, rows, own)
        m2 = s2.amax(-1, keepdim=True)
        s2 = s2.sub_(m2).exp_()
        l2 = s2.sum(-1, keepdim=True)
        o2 = torch.matmul(s2, value)
        # The shared prefix, every row at once: (kv heads, batch x group x q, P).
        pk, pv = self.prefix[layer]
        s1 = torch.bmm(qg.transpose(0, 1).reshape(kv_heads, batch * rows, dim), pk.transpose(1, 2))
        m1 = s1.amax(-1, keepdim=True)
        s1 = s1.sub_(m1).exp_()
        l1 = s1.sum(-1, keepdim=True)
        o1 = torch.bmm(s1, pv)

        def per_row(t):  # (kv heads, batch x rows, n) -> (batch, kv heads, rows, n)
            return t.view(kv_heads, batch, rows, -1).transpose(0, 1)

        o1, m1, l1 = per_row(o1), per_row(m1), per_row(l1)
        m = torch.maximum(m1, m2)
        a1, a2 = (m1 - m).exp_(), (m2 - m).exp_()
        out = (o1 * a1 + o2 * a2).div_(l1 * a1 + l2 * a2)
        return out.reshape(batch, heads, q, dim).transpose(1, 2).contiguous(), None


COLUMN_MAJOR_MIN_ROWS = 4



def _linear_by_rows(self, x):
    """nn.Linear.forward choosing the weight copy by the number of rows (see below)."""
    import torch

    rows = x.numel() // x.shape[-1]
    weight = self.weight_cm if rows >= COLUMN_MAJOR_MIN_ROWS else self.weight
    return torch.nn.functional.linear(x, weight, self.bias)



def column_major_linears(model) -> None:
    """Give every Linear a column-major copy of its weight for inputs of 4 rows or more.

    `F.linear(x, W)` is x @ W.t(): with W.t() contiguous MKL runs a plain (NN) GEMM, which
    on CPU is 3-4x faster for a handful of rows, i.e. a batched decode step (measured:
    16 x 576 by 576 x 1536 in 0.25 ms against 0.9 ms row-major; the 49152-row LM head
    12.6 against 27.4 ms), the same for prompts (hundreds of rows, same results), but
    slower for 1-2 rows (one-at-a-time decoding: 22% slower end to end). So both layouts
    are kept (Linear weights twice in memory) and each call picks by its row count.
    """
    import types

    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not hasattr(module, "weight_cm"):
            module.weight_cm = module.weight.detach().t().contiguous().t()
            module.forward = types.MethodType(_linear_by_rows, module)



def pad_batch(prompts: list[list[int]], shared: int, pad_id: int):
    """(input_ids, attention_mask) for a batch: [shared prefix][left padding][own suffix].

    With shared == 0 this is plain left padding (decoder-only models continue from the
    last position). With a shared prefix the padding sits after it, so the prefix keeps
    the same positions in every row and one KV cache of it serves the whole batch; the
    mask hides the padding and position ids come from the mask's running count.
    """
    import torch

    tails = [p[shared:] for p in prompts]
    width = shared + max(len(t) for t in tails)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, (p, tail) in enumerate(zip(prompts, tails)):
        input_ids[row, :shared] = torch.tensor(p[:shared], dtype=torch.long)
        mask[row, :shared] = 1
        input_ids[row, width - len(tail):] = torch.tensor(tail, dtype=torch.long)
        mask[row, width - len(tail):] = 1
    return input_ids, mask
