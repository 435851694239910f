"""LLMCache and CachedBackend with a scripted fake backend (no model)."""
from __future__ import annotations

import multiprocessing as mp
import pickle
import sqlite3

from rexeval.models.llm import BackendSpec, ChatRequest, LLMBackend, LLMResult, SamplingParams
from rexeval.models.llm.cache import CachedBackend, LLMCache, request_key


class FakeBackend(LLMBackend):
    """Answers 'echo <text> #<call>'; prompts starting with 'fail' get an error result."""

    def __init__(self):
        super().__init__(BackendSpec(model="fake-model"))
        self.calls: list[int] = []  # size of each generate() call

    def generate(self, requests):
        self.calls.append(len(requests))
        out = []
        for r in requests:
            text = r.messages[-1]["content"]
            if text.startswith("fail"):
                out.append(LLMResult(error="RuntimeError: scripted failure"))
            else:
                out.append(LLMResult(text=f"echo {text} #{len(self.calls)}", prompt_tokens=len(text),
                                     completion_tokens=3, finish_reason="stop", seconds=0.5))
        return out


def req(text: str, **sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}],
                       sampling=SamplingParams(**sampling))


def test_request_key_is_canonical_and_sensitive():
    a = request_key("m", req("hi"))
    assert a == request_key("m", req("hi")) and len(a) == 64
    assert a != request_key("m2", req("hi"))
    assert a != request_key("m", req("hi", max_tokens=7))
    assert a != request_key("m", req("hello"))
    with_schema = ChatRequest(messages=[{"role": "user", "content": "hi"}],
                              json_schema={"type": "object"})
    assert a != request_key("m", with_schema)
    # dict key order in messages does not matter
    swapped = ChatRequest(messages=[{"content": "hi", "role": "user"}])
    assert a == request_key("m", swapped)


def test_second_run_makes_no_inner_calls(tmp_path):
    inner = FakeBackend()
    backend = CachedBackend(inner, LLMCache(tmp_path / "c.sqlite"))
    assert backend.model_id == "fake-model"
    reqs = [req(f"review {i}") for i in range(5)]
    first = backend.generate(reqs)
    assert inner.calls == [5] and backend.misses == 5 and backend.hits == 0
    assert not any(r.cached for r in first)
    second = backend.generate(reqs)
    assert inner.calls == [5]  # nothing new reached the model
    assert backend.hits == 5
    assert [r.text for r in second] == [r.text for r in first]
    assert all(r.cached and r.seconds == 0 for r in second)
    assert [(r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in second] == \
        [(r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in first]


def test_mixed_hits_and_misses_one_inner_call_in_order(tmp_path):
    inner = FakeBackend()
    backend = CachedBackend(inner, LLMCache(tmp_path / "c.sqlite"))
    backend.generate([req("a"), req("c")])
    out = backend.generate([req("a"), req("b"), req("c"), req("d"), req("b")])
    assert inner.calls == [2, 2]  # b and d, in one call; the duplicate b is sent once
    assert [r.text.split()[1] for r in out] == ["a", "b", "c", "d", "b"]
    assert [r.cached for r in out] == [True, False, True, False, False]


def test_sampled_requests_never_cached(tmp_path):
    inner = FakeBackend()
    cache = LLMCache(tmp_path / "c.sqlite")
    backend = CachedBackend(inner, cache)
    sampled = [req("s1", temperature=0.7, seed=1), req("s1", temperature=0.7, seed=1)]
    backend.generate(sampled)
    backend.generate(sampled)
    assert inner.calls == [2, 2] and backend.bypassed == 4 and backend.hits == 0
    assert len(cache) == 0


def test_errors_not_cached(tmp_path):
    inner = FakeBackend()
    cache = LLMCache(tmp_path / "c.sqlite")
    backend = CachedBackend(inner, cache)
    out = backend.generate([req("fail once"), req("fine")])
    assert not out[0].ok and out[1].ok and len(cache) == 1
    again = backend.generate([req("fail once"), req("fine")])
    assert inner.calls == [2, 1]  # the failed one is asked again
    assert not again[0].ok and again[1].cached


def test_cache_survives_reopen_and_pickles(tmp_path):
    path = tmp_path / "sub" / "c.sqlite"
    cache = LLMCache(path)
    key = request_key("m", req("x"))
    cache.put_many([(key, LLMResult(text="t", prompt_tokens=1, completion_tokens=2,
                                    finish_reason="length"))])
    cache.close()
    clone = pickle.loads(pickle.dumps(LLMCache(path)))
    got = clone.get_many([key, "missing"])
    assert list(got) == [key]
    assert got[key].text == "t" and got[key].finish_reason == "length" and got[key].cached
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode.lower() == "wal"


def _writer(path: str, worker: int, n: int) -> None:
    cache = LLMCache(path)
    for start in range(0, n, 10):  # many small transactions, interleaving with the other
        items = [(request_key("m", req(f"{worker}-{i}")),
                  LLMResult(text=f"{worker}-{i}", finish_reason="stop"))
                 for i in range(start, start + 10)]
        cache.put_many(items + [(request_key("m", req("shared")),
                                 LLMResult(text="shared", finish_reason="stop"))])
        cache.get_many([k for k, _ in items])


def test_two_processes_write_concurrently(tmp_path):
    path = str(tmp_path / "c.sqlite")
    LLMCache(path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 200)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert LLMCache(path).__len__() == 401
    want = {request_key("m", req(f"{w}-{i}")): f"{w}-{i}" for w in range(2) for i in range(200)}
    got = LLMCache(path).get_many(want)
    assert {k: r.text for k, r in got.items()} == want
