"""The LLM-call cache: a re-run of a job costs no model calls for what it already asked.

Only deterministic calls (greedy, temperature 0) are cached: a sampled call is
meant to vary, so answering it from a cache would change the experiment. The key is a
hash of (model id, messages, sampling params, JSON schema); error results are never
stored, so a re-run retries them.

Two stores, both a `CallStore`, which `CachedBackend` takes either of:
- a local path: one SQLite file in WAL mode with a 60 s busy timeout (`LLMCache`), which
  several processes on one machine (Ray workers, parallel jobs) read and write at once;
- a URI (`s3://`, `gs://`): one immutable object per call (`ObjectCallCache`), which any
  node reads. SQLite locking is not reliable over network file systems, so a cluster
  whose nodes share no disk keeps its cache at a URI; `pipelines/core/llm/cache.py` says
  where a job's goes. It lives here, on `pyarrow.fs` (through `models/fetch.py`'s
  filesystems, as the model copies do), not on the pipelines' storage module, because the
  judge deployment's replicas (the serve layer, below the pipelines) open it too.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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


class ObjectCallCache:
    """Key -> successful LLMResult, one JSON object per key under a URI,
    `<root>/<key[:2]>/<key>.json` (`pipelines/core/llm/cache.py` gives the reasons).

    An entry is written once by a single PUT, which an object store makes atomic: no
    locks, no half-written entries, and two nodes that make the same call write the same
    answer. A batch of lookups or writes runs in parallel threads, one round trip each.
    Pickles as its URI, so each Ray worker or replica opens it from its own environment."""

    def __init__(self, root: str | os.PathLike, threads: int = 16):
        self.root = os.fspath(root).rstrip("/")
        if not is_uri(self.root):
            raise ValueError(f"an object call cache lives at a URI, not at {self.root!r}: "
                             "a local path keeps the SQLite file (LLMCache)")
        self.threads = threads
        self._fs = self._pool = None
        self._pid = 0
        self._lock = threading.Lock()

    def __reduce__(self):
        return (ObjectCallCache, (self.root, self.threads))

    def __repr__(self) -> str:
        return f"ObjectCallCache({self.root!r})"

    def _open(self):
        """(filesystem, base path, thread pool) of this process, made on first use."""
        with self._lock:
            if self._fs is None or self._pid != os.getpid():
                from rexeval.models.fetch import filesystem

                self._fs = filesystem(self.root)
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="llm-cache")
                self._pid = os.getpid()
            return (*self._fs, self._pool)

    def entry(self, key: str) -> str:
        """The URI of `key`'s object."""
        return f"{self.root}/{key[:2]}/{key}.json"

    def _path(self, key: str) -> tuple:
        fs, base, _ = self._open()
        return fs, f"{base.rstrip('/')}/{key[:2]}/{key}.json"

    def _map(self, fn, items: list) -> list:
        """`fn` over `items` in this process's thread pool (in line for one item)."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        return list(self._open()[2].map(fn, items))

    def _get(self, key: str) -> LLMResult | None:
        fs, path = self._path(key)
        try:
            with fs.open_input_stream(path, compression=None) as fh:
                obj = json.loads(fh.read())
        except FileNotFoundError:
            return None
        except ValueError:  # not JSON: never written by us whole; ask the model again
            return None
        return LLMResult(text=obj["text"], prompt_tokens=obj["prompt_tokens"],
                         completion_tokens=obj["completion_tokens"], finish_reason=obj.get("finish_reason"),
                         cached=True, seconds=0.0)

    def get_many(self, keys: Iterable[str]) -> dict[str, LLMResult]:
        keys = list(dict.fromkeys(keys))
        return {k: r for k, r in zip(keys, self._map(self._get, keys)) if r is not None}

    def put_many(self, items: Iterable[tuple[str, LLMResult]], model_id: str = "") -> int:
        """Store successful results (errors are skipped); returns how many were written."""
        now = time.time()
        rows = {k: r for k, r in items if r.ok}

        def put(key: str) -> None:
            r = rows[key]
            blob = {"key": key, "model_id": model_id, "text": r.text, "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens, "finish_reason": r.finish_reason,
                    "created": now}
            fs, path = self._path(key)
            with fs.open_output_stream(path, compression=None) as fh:  # one PUT: whole or absent
                fh.write(json.dumps(blob, ensure_ascii=False).encode("utf-8"))

        self._map(put, list(rows))
        return len(rows)

    def __len__(self) -> int:
        import pyarrow.fs as pafs

        fs, base, _ = self._open()
        found = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return sum(1 for f in found if f.type == pafs.FileType.File and f.path.endswith(".json"))

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.shutdown(wait=True)
            self._fs = self._pool = None


def open_call_cache(where: str | os.PathLike | None) -> CallStore | None:
    """The cache at `where`: objects under a URI, a SQLite file at a local path (a
    `file://` URL is one), or none for None or ""."""
    if where is None or not os.fspath(where):
        return None
    if is_uri(where):
        return ObjectCallCache(where)
    path = Path(os.fspath(where).removeprefix("file://")).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return LLMCache(path)


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
    """A backend behind the call cache when one is given (a URI, a local SQLite path, or
    an open `CallStore`: `open_call_cache`); built once per actor or replica."""
    llm = build_backend(BackendSpec(backend=backend, model=model, options=dict(options)))
    store = open_call_cache(cache) if isinstance(cache, (str, os.PathLike)) else cache
    return CachedBackend(llm, store) if store is not None else llm
