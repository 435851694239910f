"""HFBackend on a tiny random Llama (fast), plus one slow test on the real SmolLM2."""
from __future__ import annotations

import json

import pytest

from rexeval.models.llm import BackendSpec, ChatRequest, SamplingParams, build_backend
from rexeval.models.llm.hf_backend import HFBackend, _xgrammar_available, plan_batches

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 8},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["topic", "score"],
    "additionalProperties": False,
}


def chat(text: str, max_tokens: int = 12, **kw) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}],
                       sampling=SamplingParams(max_tokens=max_tokens, **kw))


# Lengths vary a lot and are not sorted, so sorting and batching really reorder them.
PROMPTS = ["sound " * 9, "cheap cable", "guitar strings " * 5, "amp", "pedal " * 14,
           "the tuner holds pitch well", "drum " * 3]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = build_backend(BackendSpec(backend="hf", model=str(tiny_model_dir),
                                  options={"batch_size": 3, "device": "cpu"}))
    yield b
    b.close()


@pytest.fixture(scope="module")
def single(tiny_model_dir):
    return HFBackend(BackendSpec(model=str(tiny_model_dir), options={"batch_size": 1}))


def test_registered_and_order_preserved(backend):
    assert isinstance(backend, HFBackend) and backend.name == "hf"
    reqs = [chat(p) for p in PROMPTS]
    results = backend.generate(reqs)
    assert len(results) == len(reqs)
    # prompt_tokens of result i must be the length of prompt i's own chat template.
    for req, res in zip(reqs, results):
        assert res.ok, res.error
        assert res.prompt_tokens == len(backend._prompt_ids(req))
        assert res.seconds > 0
    assert len({r.prompt_tokens for r in results}) == len(PROMPTS)


def test_batched_greedy_equals_one_at_a_time(backend, single):
    reqs = [chat(p, max_tokens=10) for p in PROMPTS]
    batched = backend.generate(reqs)
    alone = single.generate(reqs)
    assert [r.text for r in batched] == [r.text for r in alone]
    assert [r.completion_tokens for r in batched] == [r.completion_tokens for r in alone]


def test_finish_reason_length(backend):
    res = backend.generate([chat("amp", max_tokens=3)])[0]
    assert res.ok
    if res.finish_reason == "length":
        assert res.completion_tokens == 3
    else:  # EOS exactly within 3 tokens: still counted, EOS included
        assert res.finish_reason == "stop" and res.completion_tokens <= 3


def test_overlong_prompt_is_an_error_others_still_run(backend):
    # The tiny model's context is 256 positions.
    reqs = [chat("amp"), chat("pedal " * 300), chat("cheap cable")]
    results = backend.generate(reqs)
    assert results[0].ok and results[2].ok
    assert not results[1].ok and results[1].text is None
    assert "the model's context allows" in results[1].error
    assert results[1].error.startswith(f"prompt has {results[1].prompt_tokens} tokens")


def test_mixed_sampling_params_grouped(backend):
    reqs = [chat("amp", max_tokens=4), chat("amp", max_tokens=6),
            chat("amp", max_tokens=6, temperature=0.9, seed=3), chat("cheap", max_tokens=4)]
    results = backend.generate(reqs)
    assert all(r.ok for r in results)
    assert results[0].completion_tokens <= 4 and results[3].completion_tokens <= 4
    # The same sampled request with the same seed and batch gives the same text.
    again = backend.generate([reqs[2]])[0]
    assert again.text == backend.generate([reqs[2]])[0].text


def test_batch_exception_becomes_error_results(backend, monkeypatch):
    calls = {"n": 0}
    embed = backend.model.model.embed_tokens  # run by generate() and by the greedy loop
    real = embed.forward

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(*a, **kw)

    monkeypatch.setattr(embed, "forward", flaky)
    results = backend.generate([chat(p) for p in PROMPTS[:4]])  # batches of 3 + 1
    errors = [r for r in results if not r.ok]
    assert len(errors) == 3 and all(r.error == "RuntimeError: boom" for r in errors)
    assert sum(r.ok for r in results) == 1


def test_plan_batches_token_cap():
    assert plan_batches([1, 2, 3, 4, 5], 10, 2, None) == [[0, 1], [2, 3], [4]]
    # cap 40: (n) * (longest + 10) <= 40
    assert plan_batches([5, 5, 5, 20, 40], 10, 8, 45) == [[0, 1, 2], [3], [4]]


def test_max_batch_tokens_option(tiny_model_dir):
    b = HFBackend(BackendSpec(model=str(tiny_model_dir),
                              options={"batch_size": 8, "max_batch_tokens": 60}))
    assert all(r.ok for r in b.generate([chat(p, max_tokens=4) for p in PROMPTS]))


@pytest.mark.skipif(not _xgrammar_available(), reason="xgrammar not importable")
def test_json_schema_constrained(backend):
    reqs = [ChatRequest(messages=[{"role": "user", "content": p}], json_schema=SCHEMA,
                        sampling=SamplingParams(max_tokens=60)) for p in PROMPTS[:4]]
    results = backend.generate(reqs + [chat("amp")])  # plus an unconstrained one
    assert backend.constrained
    for res in results[:4]:
        assert res.ok and res.finish_reason == "stop", res
        data = json.loads(res.text)
        assert list(data) == ["topic", "score"]  # property order kept
        assert isinstance(data["topic"], str) and len(data["topic"]) <= 8
        assert isinstance(data["score"], int) and 1 <= data["score"] <= 5
    assert results[4].ok


def test_constrained_none_returns_raw_text(tiny_model_dir):
    b = HFBackend(BackendSpec(model=str(tiny_model_dir), options={"constrained": "none"}))
    assert not b.constrained
    res = b.generate([ChatRequest(messages=[{"role": "user", "content": "amp"}],
                                  json_schema=SCHEMA, sampling=SamplingParams(max_tokens=8))])[0]
    assert res.ok and isinstance(res.text, str)


def test_bad_constrained_option(tiny_model_dir):
    with pytest.raises(ValueError):
        HFBackend(BackendSpec(model=str(tiny_model_dir), options={"constrained": "outlines"}))


@pytest.mark.slow
@pytest.mark.skipif(not _xgrammar_available(), reason="xgrammar not importable")
def test_smollm2_short_json():
    from rexeval.models.refs import PackageNotInstalled

    try:
        b = build_backend(BackendSpec(backend="hf", model="SmolLM2-135M-Instruct"))
    except PackageNotInstalled as e:
        pytest.skip(str(e))
    schema = {"type": "object", "additionalProperties": False, "required": ["sentiment"],
              "properties": {"sentiment": {"type": "string",
                                           "enum": ["positive", "negative", "neutral"]}}}
    res = b.generate([ChatRequest(
        messages=[{"role": "user", "content": "Review: 'These strings sound great and stay "
                                              "in tune.' What is the sentiment? Answer in JSON."}],
        json_schema=schema, sampling=SamplingParams(max_tokens=24))])[0]
    assert res.ok and res.finish_reason == "stop", res
    assert json.loads(res.text)["sentiment"] in {"positive", "negative", "neutral"}


def test_escape_controls_keeps_json_value():
    from rexeval.models.llm.hf_backend import escape_controls

    raw = '{"topic": "a\x0fb\tc", "score": 2}'
    assert json.loads(escape_controls(raw)) == json.loads(raw, strict=False)


LONG_SYSTEM = ("You read one customer review and list the facts it gives about the product. "
               "Reply with JSON only. ") * 3


def test_shared_prefix_batch_equals_one_at_a_time(backend, single):
    reqs = [ChatRequest(messages=[{"role": "system", "content": LONG_SYSTEM},
                                  {"role": "user", "content": p}],
                        sampling=SamplingParams(max_tokens=10)) for p in PROMPTS]
    ids = [backend._prompt_ids(r) for r in reqs[:3]]
    assert backend._shared_prefix(ids) >= backend.min_shared_prefix  # the cache is used
    batched = backend.generate(reqs)
    alone = single.generate(reqs)
    assert [r.text for r in batched] == [r.text for r in alone]
    assert [r.prompt_tokens for r in batched] == [r.prompt_tokens for r in alone]
    assert backend.static_cache  # CPU default; the GPU default (DynamicCache) gives the same
    backend.static_cache = False
    try:
        assert [r.text for r in backend.generate(reqs)] == [r.text for r in alone]
    finally:
        backend.static_cache = True


def test_pad_batch_layout():
    from rexeval.models.llm.hf_decoding import pad_batch

    ids, mask = pad_batch([[1, 2, 3, 4], [1, 2, 5]], 0, 0)
    assert ids.tolist() == [[1, 2, 3, 4], [0, 1, 2, 5]]
    assert mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    ids, mask = pad_batch([[1, 2, 3, 4], [1, 2, 5]], 2, 0)
    assert ids.tolist() == [[1, 2, 3, 4], [1, 2, 0, 5]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 1]]


# --- the greedy loop (`_greedy_decode`) against transformers' generate() ------------------

@pytest.fixture(scope="module")
def via_generate(tiny_model_dir):
    b = HFBackend(BackendSpec(model=str(tiny_model_dir),
                              options={"batch_size": 3, "fast_greedy": False}))
    assert not b.fast_greedy
    return b


SHORT_SYSTEM = "You read one customer review and list its facts. Reply with JSON only. "


@pytest.mark.parametrize("system", [None, LONG_SYSTEM])
def test_greedy_loop_equals_generate(backend, single, via_generate, system, monkeypatch):
    assert backend.fast_greedy and single.fast_greedy  # llama on CPU: the loop is the default
    reqs = [ChatRequest(messages=([{"role": "system", "content": system}] if system else [])
                        + [{"role": "user", "content": p}],
                        sampling=SamplingParams(max_tokens=12)) for p in PROMPTS]
    if system:
        assert backend._shared_prefix([backend._prompt_ids(r) for r in reqs[:3]]) >= 32
    loops = {"n": 0}
    real = HFBackend._greedy_decode

    def counted(self, *a, **kw):
        loops["n"] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(HFBackend, "_greedy_decode", counted)
    ref = via_generate.generate(reqs)
    assert loops["n"] == 0
    for b in (backend, single):
        got = b.generate(reqs)
        assert [(r.text, r.completion_tokens, r.finish_reason) for r in got] == \
               [(r.text, r.completion_tokens, r.finish_reason) for r in ref]
    ok = sum(r.ok for r in ref)  # the longest prompt can be over the context with a system
    assert ok >= 6 and loops["n"] == -(-ok // 3) + ok  # batches of 3, then one at a time


@pytest.mark.skipif(not _xgrammar_available(), reason="xgrammar not importable")
@pytest.mark.parametrize("system", [None, SHORT_SYSTEM])
def test_greedy_loop_constrained_equals_generate(backend, via_generate, system, monkeypatch):
    from rexeval.models.llm.hf_decoding import DecodeState

    reqs = [ChatRequest(messages=([{"role": "system", "content": system}] if system else [])
                        + [{"role": "user", "content": p}], json_schema=SCHEMA,
                        sampling=SamplingParams(max_tokens=60)) for p in PROMPTS]
    if system:
        assert backend._shared_prefix([backend._prompt_ids(r) for r in reqs[:3]]) >= 32
    dropped = []
    real = DecodeState.select
    monkeypatch.setattr(DecodeState, "select",
                        lambda self, rows: dropped.append(len(rows)) or real(self, rows))
    got, ref = backend.generate(reqs), via_generate.generate(reqs)
    assert [(r.text, r.completion_tokens, r.finish_reason) for r in got] == \
           [(r.text, r.completion_tokens, r.finish_reason) for r in ref]
    assert all(r.finish_reason == "stop" for r in got)
    for r in got:
        json.loads(r.text)
    lengths = [r.completion_tokens for r in got]
    if len(set(lengths[:3])) > 1 or len(set(lengths[3:6])) > 1:
        assert dropped  # rows that stopped early left their batch


def test_cascade_attention_matches_sdpa():
    """The shared-prefix + own-KV attention equals SDPA over [prefix][own] with the mask."""
    import torch

    from rexeval.models.llm.hf_decoding import DecodeState

    torch.manual_seed(0)
    batch, heads, kv_heads, dim, prefix_len, width = 3, 6, 2, 8, 5, 4
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    pk, pv = torch.randn(kv_heads, prefix_len, dim), torch.randn(kv_heads, prefix_len, dim)
    state = DecodeState(1, batch, kv_heads, dim, width + 2, torch.float32, "cpu",
                         prefix=[(pk, pv)])
    state.set_padding(mask)
    seen = torch.cat([torch.ones(batch, prefix_len, dtype=torch.long), mask], 1)
    for q in (width, 1, 1):  # the prompt suffixes, then two decode steps
        if q == 1:
            seen = torch.cat([seen, torch.ones(batch, 1, dtype=torch.long)], 1)
        query = torch.randn(batch, heads, q, dim)
        key, value = state.update(torch.randn(batch, kv_heads, q, dim),
                                  torch.randn(batch, kv_heads, q, dim), 0)
        state.begin(q)
        got, _ = state.attend(0, query, key, value, 0.3)
        keys = torch.cat([pk.expand(batch, -1, -1, -1), key], 2)
        values = torch.cat([pv.expand(batch, -1, -1, -1), value], 2)
        total = keys.shape[2]
        allowed = seen[:, None, None, :total].bool() & torch.ones(q, total, dtype=torch.bool).tril(
            total - q)
        ref = torch.nn.functional.scaled_dot_product_attention(
            query, keys, values, attn_mask=allowed, scale=0.3, enable_gqa=True).transpose(1, 2)
        real_rows = mask[:, -q:].bool() if q > 1 else torch.ones(batch, 1, dtype=torch.bool)
        assert torch.allclose(got[real_rows], ref[real_rows], atol=1e-5)  # padding rows: any
        state.length += q


def test_fast_greedy_true_needs_support(tiny_model_dir):
    with pytest.raises(ValueError):
        HFBackend(BackendSpec(model=str(tiny_model_dir),
                              options={"fast_greedy": True, "attn_implementation": "sdpa"}))


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_batched_greedy_equals_one_at_a_time(tiny_model_dir, dtype):
    """On CUDA (DynamicCache, transformers' attention, the dtype asked for): padding and
    the shared prefix must not change a row (benchmarks/gpu_check.py's hf part, small)."""
    opts = {"device": "cuda", "dtype": dtype}
    batched = HFBackend(BackendSpec(model=str(tiny_model_dir), options={**opts, "batch_size": 4}))
    alone = HFBackend(BackendSpec(model=str(tiny_model_dir), options={**opts, "batch_size": 1}))
    assert batched.model.device.type == "cuda" and str(batched.model.dtype) == f"torch.{dtype}"
    reqs = [ChatRequest(messages=[{"role": "system", "content": LONG_SYSTEM},
                                  {"role": "user", "content": p}],
                        sampling=SamplingParams(max_tokens=10)) for p in PROMPTS]
    got = batched.generate(reqs)
    assert all(r.ok for r in got), [r.error for r in got]
    assert [r.text for r in got] == [r.text for r in alone.generate(reqs)]
