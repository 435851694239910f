"""The LLM-call cache at a URI (one object per call on the test S3 endpoint,
`ObjectCallCache`), where the cache of a job goes (`resolve_cache`), and that a local
path keeps the SQLite file (`models/llm/cache.py`, all three)."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rexeval.models.llm import BackendSpec, ChatRequest, LLMBackend, LLMResult, SamplingParams
from rexeval.models.llm.cache import (CachedBackend, LLMCache, ObjectCallCache, build_cached_backend, node_cache,
                                      open_call_cache, request_key, resolve_cache)
from rexeval.storage import location

ROOT = Path(__file__).resolve().parents[3]


class Counting(LLMBackend):
    """Answers 'echo <text>'; prompts starting with 'fail' get an error result, 'crash'
    makes the whole call raise (a transport failure). Counts the requests it got."""

    def __init__(self, spec: BackendSpec | None = None):
        super().__init__(spec or BackendSpec(backend="tests.models.llm.test_cache_uri:Counting",
                                             model="fake-model"))
        self.asked: list[str] = []

    def generate(self, requests):
        texts = [r.messages[-1]["content"] for r in requests]
        if any(t.startswith("crash") for t in texts):
            raise ConnectionError("scripted transport failure")
        self.asked.extend(texts)
        return [LLMResult(error="RuntimeError: scripted failure") if t.startswith("fail") else
                LLMResult(text=f"echo {t}", prompt_tokens=len(t), completion_tokens=2, finish_reason="stop")
                for t in texts]


def req(text: str, **sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(**sampling))


def test_a_second_run_and_a_pickled_copy_make_no_calls(s3_root):
    cache = open_call_cache(f"{s3_root}/cache")
    assert isinstance(cache, ObjectCallCache)
    inner = Counting()
    first = CachedBackend(inner, cache).generate([req(f"review {i}") for i in range(12)])
    assert len(inner.asked) == 12 and not any(r.cached for r in first) and len(cache) == 12

    again = Counting()
    second = CachedBackend(again, cache).generate([req(f"review {i}") for i in range(12)])
    assert again.asked == [] and all(r.cached and r.seconds == 0 for r in second)
    assert [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in second] == \
        [(r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in first]

    # A copy shipped to another process (as a Ray worker gets it): its text only.
    blob = pickle.dumps(cache)
    assert len(blob) < 300 and b"review" not in blob
    clone = pickle.loads(blob)
    fresh = Counting()
    third = CachedBackend(fresh, clone).generate([req(f"review {i}") for i in range(12)] + [req("new one")])
    assert fresh.asked == ["new one"] and sum(r.cached for r in third) == 12


def test_one_object_per_call_at_its_request_hash(s3_root):
    cache = ObjectCallCache(f"{s3_root}/c")
    key = request_key("m", req("x"))
    assert cache.put_many([(key, LLMResult(text="t", prompt_tokens=1, completion_tokens=2,
                                           finish_reason="length"))], model_id="m") == 1
    entry = location(f"{s3_root}/c/{key[:2]}/{key}.json")
    assert [f.relative_to(f"{s3_root}/c") for f in location(f"{s3_root}/c").walk_files()] == \
        [f"{key[:2]}/{key}.json"]
    stored = entry.read_json()
    assert stored["text"] == "t" and stored["model_id"] == "m" and stored["finish_reason"] == "length"
    got = cache.get_many([key, request_key("m", req("y"))])
    assert list(got) == [key] and got[key].text == "t" and got[key].cached


def test_errors_and_transport_failures_are_never_cached(s3_root):
    cache = ObjectCallCache(f"{s3_root}/c")
    inner = Counting()
    backend = CachedBackend(inner, cache)
    out = backend.generate([req("fail once"), req("fine")])
    assert not out[0].ok and out[1].ok and len(cache) == 1
    again = backend.generate([req("fail once"), req("fine")])
    assert inner.asked == ["fail once", "fine", "fail once"]  # the failed one is asked again
    assert not again[0].ok and again[1].cached
    with pytest.raises(ConnectionError):
        backend.generate([req("crash now"), req("other")])
    assert len(cache) == 1  # nothing of the failed call was stored
    # Sampled requests are never cached, at a URI as in the SQLite file.
    backend.generate([req("s", temperature=0.7, seed=1)] * 2)
    assert len(cache) == 1


def test_a_batch_of_lookups_runs_in_parallel_threads(s3_root, monkeypatch):
    cache = ObjectCallCache(f"{s3_root}/c", threads=8)
    keys = [request_key("m", req(str(i))) for i in range(40)]
    cache.put_many([(k, LLMResult(text=k[:6])) for k in keys])
    seen, real = set(), ObjectCallCache._get

    def spy(self, key):
        seen.add(threading.get_ident())
        return real(self, key)

    monkeypatch.setattr(ObjectCallCache, "_get", spy)
    got = cache.get_many(keys + ["0" * 64])
    assert {k: r.text for k, r in got.items()} == {k: k[:6] for k in keys}
    assert len(seen) > 1 and threading.get_ident() not in seen
    cache.close()


_OTHER_PROCESS = """
import json, sys
from rexeval.models.llm import ChatRequest
from rexeval.models.llm.cache import build_cached_backend
llm = build_cached_backend("tests.models.llm.test_cache_uri:Counting", "fake-model", {}, sys.argv[1])
out = llm.generate([ChatRequest(messages=[{"role": "user", "content": f"review {i}"}]) for i in range(6)])
print(json.dumps({"asked": llm.inner.asked, "cached": [r.cached for r in out]}))
"""


def test_a_fresh_process_reads_what_another_wrote(s3_root):
    uri = f"{s3_root}/shared-cache"
    run = lambda: json.loads(subprocess.run(  # noqa: E731
        [sys.executable, "-c", _OTHER_PROCESS, uri], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, check=True).stdout)
    first = run()
    assert len(first["asked"]) == 6 and not any(first["cached"])
    second = run()  # another process (on a cluster: another node) with nothing in memory
    assert second == {"asked": [], "cached": [True] * 6}


def test_a_local_path_keeps_the_sqlite_file_and_a_uri_opens_the_object_store(tmp_path, monkeypatch):
    assert isinstance(open_call_cache(tmp_path / "sub" / "c.sqlite"), LLMCache)
    assert open_call_cache(None) is None and open_call_cache("") is None
    llm = build_cached_backend("tests.models.llm.test_cache_uri:Counting", "m", {}, str(tmp_path / "c.sqlite"))
    assert isinstance(llm.cache, LLMCache) and (tmp_path / "c.sqlite").is_file()
    assert not isinstance(build_cached_backend("tests.models.llm.test_cache_uri:Counting", "m", {}, None),
                          CachedBackend)
    # A URI opens the object store (the judge replicas, in the serve layer, build their
    # backends here too), never a local folder named "s3:"; a Location is taken as well.
    monkeypatch.chdir(tmp_path)
    assert isinstance(build_cached_backend("tests.models.llm.test_cache_uri:Counting", "m", {},
                                           location("s3://b/cache")).cache, ObjectCallCache)
    llm = build_cached_backend("tests.models.llm.test_cache_uri:Counting", "m", {}, "s3://b/cache")
    assert isinstance(llm.cache, ObjectCallCache) and llm.cache.root == "s3://b/cache"
    assert not (tmp_path / "s3:").exists()
    with pytest.raises(ValueError, match="lives at a URI"):
        ObjectCallCache(tmp_path / "c")


def test_where_a_job_caches_its_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path / "home"))
    local_default = str((tmp_path / "home" / "llm-calls.sqlite").resolve())
    # Local output: the node's SQLite file, as before.
    assert resolve_cache(None, str(tmp_path / "out")) == local_default
    # An output at a URI: the cache lives under it.
    assert resolve_cache(None, "s3://b/runs/x/") == "s3://b/runs/x/_llm_cache"
    # A given cache wins: a URI as given, a local path made absolute.
    assert resolve_cache("s3://b/cache", "s3://b/runs/x") == "s3://b/cache"
    monkeypatch.chdir(tmp_path)
    assert resolve_cache("c.sqlite", "s3://b/runs/x") == str(tmp_path.resolve() / "c.sqlite")
    # A URI REXEVAL_CACHE is the cluster's cache: every job shares it.
    monkeypatch.setenv("REXEVAL_CACHE", "s3://b/cache")
    assert resolve_cache(None, "s3://b/runs/x") == "s3://b/cache/llm-calls"
    assert resolve_cache(None, str(tmp_path / "out")) == "s3://b/cache/llm-calls"
    # A judge app a job starts keeps the node's own file: the job's workers keep the job's
    # cache in front of it.
    assert node_cache("s3://b/cache/llm-calls") == str((Path.home() / ".cache" / "rexeval" / "llm-calls.sqlite").resolve())
    assert node_cache(local_default) == local_default and node_cache(None) is None
