"""The LLM-call cache: a re-run of a job costs no model calls for what it already asked.

Only deterministic calls (greedy, temperature 0) are cached: a sampled call is
meant to vary, so answering it from a cache would change the experiment. The key is a
hash of (model id, messages, sampling params, JSON schema); error results are never
stored, so a re-run retries them.

Storage here is one SQLite file in WAL mode with a 60 s busy timeout: several processes
on one machine (Ray workers, parallel jobs) can read and write it at once. SQLite
locking is not reliable over network file systems, so a cluster whose nodes share no
disk keeps its cache at a URI instead: one immutable object per call
(`rexeval.pipelines.core.llm_cache`, built on the pipelines' storage module, which this
layer must not import). Both are a `CallStore`; `CachedBackend` takes either.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable, Protocol

from rexeval.models.llm.base import BackendSpec, ChatRequest, LLMBackend, LLMResult, build_backend

_SCHEMA = """
CREATE TABLE IF NOT EXISTS llm_calls (
    key TEXT PRIMARY KEY,
    model_id TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    finish_reason TEXT,
    created REAL NOT NULL
)
"""
_CHUNK = 500  # keys per SELECT ... IN (...): below SQLite's variable limit


def request_key(model_id: str, request: ChatRequest) -> str:
    """sha256 hex of the canonical JSON of [model id, messages, sampling, schema]."""
    payload = [model_id, request.messages, request.sampling.model_dump(), request.json_schema]
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CallStore(Protocol):
    """What `CachedBackend` needs of a cache: a batch of keys looked up at once, a batch
    of results stored at once (errors skipped), and closing."""

    def get_many(self, keys: Iterable[str]) -> dict[str, LLMResult]: ...

    def put_many(self, items: Iterable[tuple[str, LLMResult]], model_id: str = "") -> int: ...

    def close(self) -> None: ...


def is_uri(where: str | os.PathLike) -> bool:
    """`s3://...`, `gs://...` and the like (a `file://` URL is a local path)."""
    scheme, sep, _ = os.fspath(where).partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


class LLMCache:
    """Key -> successful LLMResult, in a SQLite file shared by processes on one machine.

    One connection per process and thread (sqlite3 connections must not cross either);
    the object pickles as its path, so it can be shipped to Ray workers.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connect()  # create the file and table now, so errors show up here

    def __getstate__(self) -> dict:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        self.path = Path(state["path"])
        self._local = threading.local()

    def _connect(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(_SCHEMA)
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def get_many(self, keys: Iterable[str]) -> dict[str, LLMResult]:
        keys = list(dict.fromkeys(keys))
        conn = self._connect()
        found: dict[str, LLMResult] = {}
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            rows = conn.execute(
                "SELECT key, text, prompt_tokens, completion_tokens, finish_reason FROM llm_calls"
                f" WHERE key IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            for key, text, p_tok, c_tok, finish in rows:
                found[key] = LLMResult(text=text, prompt_tokens=p_tok, completion_tokens=c_tok,
                                       finish_reason=finish, cached=True, seconds=0.0)
        return found

    def put_many(self, items: Iterable[tuple[str, LLMResult]], model_id: str = "") -> int:
        """Store successful results (errors are skipped); returns how many were written."""
        now = time.time()
        rows = [(k, model_id, r.text, r.prompt_tokens, r.completion_tokens, r.finish_reason, now)
                for k, r in items if r.ok]
        if not rows:
            return 0
        conn = self._connect()
        conn.execute("BEGIN IMMEDIATE")  # take the write lock now (waits up to the timeout)
        try:
            conn.executemany(
                "INSERT OR REPLACE INTO llm_calls (key, model_id, text, prompt_tokens,"
                " completion_tokens, finish_reason, created) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return len(rows)

    def __len__(self) -> int:
        return self._connect().execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class CachedBackend(LLMBackend):
    """Wraps a backend: deterministic requests are answered from the cache when possible.

    The requests the cache cannot answer (misses, sampled requests) go to the inner
    backend in one `generate()` call, so its batching is kept; identical deterministic
    requests in one call are sent once. Counters: `hits`, `misses` (deterministic
    requests not found), `bypassed` (sampled requests, never cached).
    """

    name = "cached"

    def __init__(self, inner: LLMBackend, cache: CallStore):
        super().__init__(inner.spec)
        self.inner, self.cache = inner, cache
        self.hits = self.misses = self.bypassed = 0

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        keys = [request_key(self.model_id, r) if r.sampling.deterministic else None
                for r in requests]
        found = self.cache.get_many(k for k in keys if k is not None)
        results: list[LLMResult | None] = [None] * len(requests)
        forward: list[int] = []          # positions in `requests` sent to the inner backend
        first_of: dict[str, int] = {}    # key -> position of its first forwarded request
        duplicates: list[tuple[int, int]] = []
        for i, key in enumerate(keys):
            if key is None:
                self.bypassed += 1
                forward.append(i)
            elif key in found:
                self.hits += 1
                results[i] = found[key]
            elif key in first_of:
                self.misses += 1
                duplicates.append((i, first_of[key]))
            else:
                self.misses += 1
                first_of[key] = i
                forward.append(i)
        if forward:
            answers = self.inner.generate([requests[i] for i in forward])
            for i, res in zip(forward, answers):
                results[i] = res
            self.cache.put_many([(keys[i], results[i]) for i in forward if keys[i] is not None],
                                model_id=self.model_id)
        for i, j in duplicates:
            results[i] = results[j].model_copy()
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self.inner.close()
        self.cache.close()


def build_cached_backend(backend: str, model: str, options: dict,
                         cache: str | os.PathLike | CallStore | None):
    """A backend behind the call cache (when one is given: a local SQLite path or an open
    `CallStore`); built once per actor. A URI is refused here rather than taken for a
    local path: `rexeval.pipelines.core.llm_cache.build_cached_backend` opens it."""
    if isinstance(cache, (str, os.PathLike)) and is_uri(cache):
        raise ValueError(f"the LLM-call cache {os.fspath(cache)} is a URI: build the backend with "
                         "rexeval.pipelines.core.llm_cache.build_cached_backend, which opens it")
    llm = build_backend(BackendSpec(backend=backend, model=model, options=dict(options)))
    if isinstance(cache, (str, os.PathLike)):
        if not os.fspath(cache):
            return llm
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        cache = LLMCache(cache)
    return CachedBackend(llm, cache) if cache is not None else llm
