"""The LLM-call cache, whole: the stores, the backend in front of them, and where a job's
cache lives. A re-run of a job costs no model calls for what it already asked.

Only deterministic calls (greedy, temperature 0) are cached: a sampled call is meant to
vary, so answering it from a cache would change the experiment. The key is a hash of
(model id, messages, sampling params, JSON schema); error results and transport failures
are never stored, so a re-run retries them.

Two stores, both a `CallStore`, which `CachedBackend` takes either of:
- a local path: one SQLite file in WAL mode with a 60 s busy timeout (`LLMCache`), which
  several processes on one machine (Ray workers, parallel jobs) read and write at once;
  on one machine it is the faster store, and nothing changes for a laptop;
- a URI (`s3://`, `gs://`; `--cache s3://bucket/cache`, or `REXEVAL_CACHE` set to a URI):
  one immutable object per call, `<root>/<key[:2]>/<key>.json` (`ObjectCallCache`), which
  any node reads. Nodes of a cluster share no disk and SQLite's locks cannot be trusted
  over a network file system, so with the SQLite file a job re-run on another node (a
  retried Ray task, a new cluster, a resumed study) would pay for every call again. An
  object is written once, by a single PUT, which is atomic: no locks, no half-written
  entries; two nodes that make the same call write the same answer and the last PUT wins
  harmlessly. A batch of lookups (or writes) runs in parallel threads, one round trip
  each; the two-character prefix spreads the keys over folders (object stores rate-limit
  per prefix).

Where a job's cache is (`resolve_cache`, decided once in the driver; issue 32):
- the given cache (`--cache`), else a URI `REXEVAL_CACHE` (an operator who set one wants
  every job to share it);
- else, when the job writes to a URI, `<out>/_llm_cache/`: the node-local default would be
  on whichever node the driver or actor ran, so a re-run elsewhere would repeat the calls;
  under the output the cache lives exactly as long as the output, every node reaches it,
  and `--overwrite` with other settings (which clears the folder) clears it too;
- else the SQLite file in rexeval's local cache folder.

Serve-routed calls (a judge deployment or app, `backend: serve`, `--judge-service`) go
through the job's cache too: each worker asks it before the deployment and writes what
the deployment answered, so a re-run makes no call for finished work wherever the
replicas land. A deployment may keep a cache of its own (`serve/judge.py`'s `cache`, a URI
too), shared by every client that calls it; the app a job starts for itself keeps a
node-local one (`node_cache`).

One module for every layer: the stores address URIs through `rexeval/storage.py`, the
lowest layer, so the judge deployment's replicas (serve), the pipelines' LLM stages and
the models' own tools open the same cache the same way.
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
from rexeval.storage import PathLike, filesystem_for, is_uri, location

CACHE_DIR = "_llm_cache"
"""The cache's folder under a job's output when the output is a URI."""
ENV_DIR = "llm-calls"
"""The cache's folder under a URI `REXEVAL_CACHE`."""

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
    `<root>/<key[:2]>/<key>.json` (the module docstring gives the reasons).

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
                self._fs = filesystem_for(self.root)
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
                         cache: PathLike | CallStore | None):
    """A backend behind the call cache when one is given (a URI, a local SQLite path, a
    `Location`, or an open `CallStore`: `open_call_cache`); built once per actor or
    replica."""
    llm = build_backend(BackendSpec(backend=backend, model=model, options=dict(options)))
    store = cache if hasattr(cache, "get_many") else open_call_cache(None if cache is None else str(cache))
    return CachedBackend(llm, store) if store is not None else llm


def default_cache() -> str:
    """The cache when nothing else says: under a URI `REXEVAL_CACHE`, else the SQLite
    file in rexeval's local cache folder."""
    env = os.environ.get("REXEVAL_CACHE")
    if env and is_uri(env):
        return str(location(env) / ENV_DIR)
    from rexeval.models.gguf_cache import cache_root

    return str(cache_root() / "llm-calls.sqlite")


def node_cache(cache: str | None) -> str | None:
    """The replicas' own cache of a judge app that a job starts for itself: `cache` when
    local, else the node's default file. Not the job's URI cache: the job's workers
    already keep that one in front of the app (see the module docstring), and other jobs
    that join the app would write their calls into this job's output."""
    if not cache or not is_uri(cache):
        return cache
    env = os.environ.get("REXEVAL_CACHE")
    root = Path(env).expanduser() if env and not is_uri(env) else Path.home() / ".cache" / "rexeval"
    return str((root / "llm-calls.sqlite").resolve())


def resolve_cache(cache: str | None, out: PathLike | None = None) -> str:
    """Where a job's calls are cached, decided once in the driver (see the module
    docstring): the given cache (a local path made absolute), else a URI
    `REXEVAL_CACHE`, else `<out>/_llm_cache` when `out` is a URI, else the local file."""
    if cache:
        return str(location(cache)) if is_uri(cache) else str(Path(cache.removeprefix("file://")).resolve())
    env = os.environ.get("REXEVAL_CACHE")
    if not (env and is_uri(env)) and out is not None and is_uri(out):
        return str(location(out) / CACHE_DIR)
    chosen = default_cache()
    return chosen if is_uri(chosen) else str(Path(chosen).resolve())
