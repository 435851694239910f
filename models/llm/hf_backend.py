"""The `hf` backend: transformers on CPU or GPU, batched, JSON-schema constrained.

Why our own batching loop instead of a transformers pipeline: we need per-request
errors (an over-long prompt or a failing batch must not sink the others), grouping by
sampling parameters and schema, a token budget per batch, and token counts per request.

How a `generate()` call runs:
  1. every request is chat-templated and tokenised; prompts that do not fit in the
     context (`max_position_embeddings - max_tokens`) get an error result at once;
  2. requests are grouped by (sampling params, schema), sorted by prompt length inside
     a group (less padding) and cut into batches of `batch_size` requests, split further
     when `max_batch_tokens` (batch size x (longest prompt + max_tokens)) is exceeded;
  3. each batch is LEFT padded (decoder-only models continue from the last position)
     and decoded greedily (temperature 0) or by sampling, by transformers' generate();
     the prompt prefix the whole batch shares (system prompt, few-shot examples: about
     700 of 800 tokens for the extraction prompts) is run once into the KV cache.
     Greedy batches of supported models on CPU (Llama family) skip generate() for our
     own loop (`_greedy_decode`, same tokens): the shared prefix's KV is kept once and
     attended by every row ("cascade" attention, `_DecodeState`), each prompt suffix is
     prefilled without padding, finished rows leave the batch, and Linear layers use a
     column-major weight copy for 4+ rows (`column_major_linears`). Measured on SmolLM2-135M,
     2 CPUs, 32 extraction prompts, batch 16: 31 s against 66 s with generate();
  4. results go back in the callers' order.

Sampling is seeded with `torch.manual_seed(sampling.seed)` before each batch, so a
sampled output depends on which requests share its batch (and on the batch size):
only greedy outputs are reproducible request by request, and only they are cached.

`seconds` of a result is its batch's wall time divided by the number of requests in
that batch (an even share: the batch ran as one forward pass per step).

Options (`BackendSpec.options`): batch_size (8), max_batch_tokens (None), device
("auto" | "cpu" | "cuda"), dtype ("auto" = float32 on CPU, bfloat16 on CUDA, or a torch
dtype name), constrained ("auto" | "xgrammar" | "none"), num_threads (torch CPU threads),
share_prefix (True) and min_shared_prefix (32 tokens): compute the KV cache of the prompt
prefix a batch shares (system prompt, few-shot examples) once, static_cache (default: on
CPU only; see `_kv_cache`; generate() path only), fast_greedy ("auto": the greedy loop where
supported; False: always generate()), column_major_weights (default: on CPU with batch_size
> 1; doubles the memory of Linear weights), attn_implementation
("auto" = our GQA-aware SDPA on CPU, see `_cpu_gqa_sdpa`; or any transformers name).
"""
from __future__ import annotations

import inspect
import json
import re
import time
from typing import Any

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMBackend, LLMResult, register_backend


def _xgrammar_available() -> bool:
    try:
        import xgrammar  # noqa: F401
        import xgrammar.contrib.hf  # noqa: F401
    except Exception:  # ImportError, or a broken native build
        return False
    return True


_CONTROL = re.compile(r"[\x00-\x1f]")


def escape_controls(text: str) -> str:
    """Escape raw control characters, which xgrammar 0.2.8 lets into strings with a length
    bound (its `maxLength` character class only excludes quote, backslash, CR and LF) but
    strict JSON parsers reject. With compact separators they can only sit inside strings,
    so the \\u00XX escape keeps the decoded value (and its length) the same.
    """
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def schema_key(schema: dict[str, Any] | None) -> str | None:
    """JSON text of a schema: the key of the grammar cache and of grouping.

    Keys keep their order: the order of `properties` is the order the JSON is written in.
    """
    return None if schema is None else json.dumps(schema, separators=(",", ":"))


def plan_batches(lengths: list[int], max_tokens: int, batch_size: int,
                 max_batch_tokens: int | None) -> list[list[int]]:
    """Cut positions (already sorted by prompt length) into batches.

    A batch holds at most `batch_size` requests and, when `max_batch_tokens` is set,
    at most that many tokens counted as requests x (longest prompt + max_tokens); a
    single request always forms a batch even when it alone is over the cap.
    """
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for pos, n in enumerate(lengths):
        longest_if = max(longest, n)
        too_many = len(cur) >= batch_size
        too_big = (max_batch_tokens is not None and cur
                   and (len(cur) + 1) * (longest_if + max_tokens) > max_batch_tokens)
        if cur and (too_many or too_big):
            batches.append(cur)
            cur, longest_if = [], n
        cur.append(pos)
        longest = longest_if
    if cur:
        batches.append(cur)
    return batches


CPU_GQA_ATTENTION = "rexeval_cpu_gqa"


def _cpu_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                  scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """SDPA that lets torch share KV heads (GQA) even when a padding mask is given.

    Why our own attention function: transformers' "sdpa" path copies every KV head
    `num_key_value_groups` times whenever a mask is present (CUDA kernels need that),
    which on CPU makes a padded batch's decode step memory-bound: measured on SmolLM2
    (3 KV heads for 9 query heads), batch 16 x 900 tokens, 10.5 ms per layer with the
    copies against 2.0 ms with torch's own GQA. Same maths, no copies.
    """
    import torch

    if isinstance(attention_mask, _DecodeState):  # our greedy loop (`_greedy_decode`)
        return attention_mask.attend(module.layer_idx, query, key, value, scaling)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _register_cpu_gqa() -> str:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(CPU_GQA_ATTENTION, _cpu_gqa_sdpa)
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


class _DecodeState:
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


@register_backend("hf")
class HFBackend(LLMBackend):
    """A transformers causal LM loaded once; see the module docstring for the options."""

    def __init__(self, spec: BackendSpec):
        super().__init__(spec)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rexeval.models.refs import resolve

        opts = spec.options
        self.batch_size = int(opts.get("batch_size", 8))
        self.max_batch_tokens = opts.get("max_batch_tokens")
        self.share_prefix = bool(opts.get("share_prefix", True))
        self.min_shared_prefix = int(opts.get("min_shared_prefix", 32))
        self.static_cache = opts.get("static_cache")  # None: on CPU only, set below
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if opts.get("num_threads"):
            torch.set_num_threads(int(opts["num_threads"]))

        device = opts.get("device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.static_cache is None:
            self.static_cache = self.device.type == "cpu"
        dtype = opts.get("dtype", "auto")
        if dtype == "auto":
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)

        constrained = opts.get("constrained", "auto")
        if constrained not in ("auto", "xgrammar", "none"):
            raise ValueError(f"constrained must be auto, xgrammar or none, got {constrained!r}")
        if constrained == "xgrammar" and not _xgrammar_available():
            raise RuntimeError("constrained='xgrammar' but xgrammar cannot be imported; "
                               "pip install xgrammar apache-tvm-ffi")
        self.constrained = constrained != "none" and _xgrammar_available()

        location = resolve(spec.model).location
        self.tokenizer = AutoTokenizer.from_pretrained(location)
        attn = opts.get("attn_implementation", "auto")
        if attn == "auto":  # our GQA-aware SDPA on CPU; transformers' choice on GPUs
            attn = _register_cpu_gqa() if self.device.type == "cpu" else None
        elif attn == CPU_GQA_ATTENTION:
            _register_cpu_gqa()
        self.model = AutoModelForCausalLM.from_pretrained(
            location, dtype=dtype, attn_implementation=attn).to(self.device)
        self.model.eval()
        if opts.get("column_major_weights", self.device.type == "cpu" and self.batch_size > 1):
            column_major_linears(self.model)

        # Stop tokens: the generation config's EOS ids (some models list several), else
        # the tokenizer's; padding uses EOS when the tokenizer has no pad token.
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.stop_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
        if not self.stop_ids:
            raise ValueError(f"model {spec.model!r} defines no EOS token")
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.stop_ids[0]
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        fast = opts.get("fast_greedy", "auto")
        body = getattr(self.model, "model", None)
        self.fast_greedy = (
            fast not in (False, "off", "none")
            and self.model.config._attn_implementation == CPU_GQA_ATTENTION
            and self.model.config.model_type in FAST_GREEDY_MODEL_TYPES
            and all(hasattr(body, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm"))
            and hasattr(self.model, "lm_head")
            and plain_greedy_config(self.model.generation_config))
        if fast is True and not self.fast_greedy:
            raise ValueError("fast_greedy=True but this model/device cannot use the greedy loop")
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None

        self._grammar_compiler = None
        self._grammars: dict[str, Any] = {}

    # --- preparation --------------------------------------------------------------

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        text = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True,
                                                  tokenize=False)
        # The template already holds the special tokens (BOS/role markers).
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _grammar(self, schema: dict[str, Any]):
        """Compiled xgrammar grammar for a schema, compiled once per backend."""
        key = schema_key(schema)
        if key not in self._grammars:
            import xgrammar as xgr

            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.model.config.vocab_size,
                    stop_token_ids=self.stop_ids)
                self._grammar_compiler = xgr.GrammarCompiler(info)
            # Compact JSON: free whitespace lets a small model emit blanks until max_tokens.
            self._grammars[key] = self._grammar_compiler.compile_json_schema(
                key, any_whitespace=False)
        return self._grammars[key]

    # --- generation ---------------------------------------------------------------

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        results: list[LLMResult | None] = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, list[int]]]] = {}
        for i, req in enumerate(requests):
            try:
                ids = self._prompt_ids(req)
            except Exception as e:  # a template that rejects these messages
                results[i] = LLMResult(error=f"chat template failed: {type(e).__name__}: {e}")
                continue
            if self.context is not None:
                allowed = self.context - req.sampling.max_tokens
                if len(ids) > allowed:
                    results[i] = LLMResult(
                        prompt_tokens=len(ids),
                        error=f"prompt has {len(ids)} tokens; the model's context allows "
                              f"{max(allowed, 0)}")
                    continue
            groups.setdefault((req.sampling, schema_key(req.json_schema)), []).append((i, ids))

        for (sampling, _), members in groups.items():
            members.sort(key=lambda m: len(m[1]))  # stable: ties keep request order
            schema = requests[members[0][0]].json_schema
            for batch in plan_batches([len(ids) for _, ids in members], sampling.max_tokens,
                                      self.batch_size, self.max_batch_tokens):
                chosen = [members[p] for p in batch]
                for (i, _), res in zip(chosen, self._run_batch([ids for _, ids in chosen],
                                                               sampling, schema)):
                    results[i] = res
        return results  # type: ignore[return-value]

    def _run_batch(self, prompts: list[list[int]], sampling, schema) -> list[LLMResult]:
        """One padded generate() call; any exception becomes an error on every request."""
        t0 = time.perf_counter()
        try:
            new = self._decode(prompts, sampling, schema)
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            return [LLMResult(prompt_tokens=len(p), error=msg) for p in prompts]

        share = (time.perf_counter() - t0) / len(prompts)
        constrained = schema is not None and self.constrained
        stops = set(self.stop_ids)
        results = []
        for ids, gen in zip(prompts, new):
            end = next((k for k, t in enumerate(gen) if t in stops), None)
            kept = gen if end is None else gen[:end]
            text = self.tokenizer.decode(kept, skip_special_tokens=True)
            results.append(LLMResult(
                text=escape_controls(text) if constrained else text,
                prompt_tokens=len(ids),
                completion_tokens=len(gen) if end is None else end + 1,
                seconds=share,
                finish_reason="length" if end is None else "stop"))
        return results

    def _decode(self, prompts: list[list[int]], sampling, schema) -> list[list[int]]:
        """New token ids per prompt (EOS included when reached; may run on after it)."""
        import torch

        shared = self._shared_prefix(prompts)
        grammar = self._grammar(schema) if schema is not None and self.constrained else None
        if sampling.deterministic and self.fast_greedy:
            with torch.inference_mode():
                return self._greedy_decode(prompts, shared, sampling.max_tokens, grammar)
        input_ids, mask = pad_batch(prompts, shared, self.pad_id)
        width = input_ids.shape[1]
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens, pad_token_id=self.pad_id,
            eos_token_id=self.stop_ids)
        if sampling.deterministic:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            torch.manual_seed(sampling.seed)
            kwargs.update(do_sample=True, temperature=sampling.temperature,
                          top_p=sampling.top_p, top_k=None)
        if grammar is not None:
            from transformers import LogitsProcessorList
            from xgrammar.contrib.hf import LogitsProcessor

            # A fresh processor per generate(): it keeps one matcher per sequence.
            kwargs["logits_processor"] = LogitsProcessorList([LogitsProcessor(grammar)])
        with torch.inference_mode():
            kwargs["past_key_values"] = self._kv_cache(
                prompts[0][:shared], len(prompts), width + sampling.max_tokens)
            out = self.model.generate(input_ids=input_ids.to(self.device),
                                      attention_mask=mask.to(self.device), **kwargs)
        return out[:, width:].tolist()

    def _greedy_decode(self, prompts: list[list[int]], shared: int, max_new: int,
                       grammar=None) -> list[list[int]]:
        """Greedy decoding without generate(): the same tokens, less work per step.

        Drives the model's decoder layers directly with a `_DecodeState` (cascade
        attention over the shared prefix, no 4D masks, the LM head on the last position
        only), takes the argmax of the float32 logits (after the grammar's bitmask, as
        xgrammar's HF logits processor applies it) and drops rows from the batch as soon
        as they emit a stop token, so the remaining rows' steps get cheaper. Each row's
        list ends with its stop token, or has `max_new` tokens.
        """
        import torch

        model, body, config = self.model, self.model.model, self.model.config
        layers = body.layers[: config.num_hidden_layers]
        kv_heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype, device = model.dtype, self.device

        def forward(state: _DecodeState, ids, positions):
            """Run new tokens through the model; the last position's final hidden state."""
            hidden = body.embed_tokens(ids)
            rope = body.rotary_emb(hidden, positions)
            state.begin(ids.shape[1])
            for layer in layers:
                hidden = layer(hidden, attention_mask=state, position_ids=positions,
                               past_key_values=state, use_cache=True, position_embeddings=rope)
            state.length += ids.shape[1]
            return hidden[:, -1]

        def prefill(tokens: list[int], start: int, prefix=None) -> _DecodeState:
            """One row's prompt tokens from position `start` on, after `prefix` if any."""
            state = _DecodeState(len(layers), 1, kv_heads, head_dim, len(tokens), dtype,
                                 device, prefix)
            state.last = forward(state, torch.tensor([tokens], device=device),
                                 torch.arange(start, start + len(tokens), device=device)[None])
            return state

        prefix = None
        if shared:
            once = prefill(prompts[0][:shared], 0)
            prefix = [(k[0], v[0]) for k, v in zip(once.k, once.v)]
        # Each row's own KV, left padded: [padding][prompt suffix], then generated tokens.
        # The suffixes are run one row at a time (no compute on padding: in a batch of
        # 16 extraction prompts the padding was 60% of the positions).
        tails = [p[shared:] for p in prompts]
        width = max(len(t) for t in tails)
        state = _DecodeState(len(layers), len(prompts), kv_heads, head_dim, width + max_new,
                             dtype, device, prefix)
        state.set_padding(torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in tails]))
        last = []
        for row, tail in enumerate(tails):
            own = prefill(tail, shared, prefix)
            for k, v, ok, ov in zip(state.k, state.v, own.k, own.v):
                k[row, :, width - len(tail):width] = ok[0]
                v[row, :, width - len(tail):width] = ov[0]
            last.append(own.last)
            del own
        state.length = width
        hidden = torch.cat(last)
        positions = torch.tensor([[shared + len(t)] for t in tails], device=device)

        rows = list(range(len(prompts)))  # the prompt of each row still in the batch
        matchers, bitmask = [], None
        if grammar is not None:
            import xgrammar as xgr

            matchers = [xgr.GrammarMatcher(grammar) for _ in prompts]
            bitmask = xgr.allocate_token_bitmask(len(prompts), grammar.tokenizer_info.vocab_size)
        stops = set(self.stop_ids)
        out: list[list[int]] = [[] for _ in prompts]
        for step in range(max_new):
            logits = model.lm_head(body.norm(hidden)).float()
            if matchers:
                for j, matcher in enumerate(matchers):
                    matcher.fill_next_token_bitmask(bitmask, j)
                xgr.apply_token_bitmask_inplace(logits, bitmask[: len(rows)].to(logits.device))
            tokens = logits.argmax(-1)
            keep = []
            for j, token in enumerate(tokens.tolist()):
                out[rows[j]].append(token)
                if matchers and not matchers[j].accept_token(token):
                    raise RuntimeError(f"grammar rejected token {token}")
                if token not in stops:
                    keep.append(j)
            if not keep or step == max_new - 1:
                break
            if len(keep) < len(rows):
                index = torch.tensor(keep, device=device)
                state.select(index)
                tokens, positions = tokens[index], positions[index]
                rows = [rows[j] for j in keep]
                matchers = [matchers[j] for j in keep] if matchers else []
            hidden = forward(state, tokens[:, None], positions)
            positions = positions + 1
        return out

    def _shared_prefix(self, prompts: list[list[int]]) -> int:
        """Length of the token prefix all prompts share, 0 when too short to be worth it.

        At least one token of every prompt is left outside, as generate() needs one.
        """
        if len(prompts) < 2 or not self.share_prefix:
            return 0
        n = min(len(p) for p in prompts) - 1
        first = prompts[0]
        for p in prompts[1:]:
            k = 0
            while k < n and p[k] == first[k]:
                k += 1
            n = k
        return n if n >= self.min_shared_prefix else 0

    def _kv_cache(self, prefix: list[int], copies: int, max_len: int):
        """The KV cache a batch starts from: the shared prefix already in it, if any.

        On CPU a StaticCache (preallocated, written in place): the default DynamicCache
        re-concatenates the whole cache at every step, about a third of a decode step for
        16 x 900 tokens. On GPUs a DynamicCache (a static one would trigger torch.compile).
        """
        import torch
        from transformers import DynamicCache, StaticCache

        config = self.model.config
        cache = (StaticCache(config=config, max_cache_len=max_len) if self.static_cache
                 else DynamicCache(config=config))
        if prefix:
            done = DynamicCache(config=config)
            ids = torch.tensor([prefix], dtype=torch.long, device=self.device)
            extra = {"logits_to_keep": 1} if self._keeps_logits else {}  # skip the LM head
            self.model(input_ids=ids, past_key_values=done, use_cache=True, **extra)
            if not self.static_cache:
                done.batch_repeat_interleave(copies)
                return done
            for i, layer in enumerate(done.layers):  # one prefix, written into every row
                cache.update(layer.keys.expand(copies, -1, -1, -1),
                             layer.values.expand(copies, -1, -1, -1), i)
        return cache

    def close(self) -> None:
        self.model = None
        self._grammars.clear()
