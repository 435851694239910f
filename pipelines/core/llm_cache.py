"""The LLM-call cache on a cluster: one immutable object per call, at a URI every node reads.

`models/llm/cache.py` keeps calls in a SQLite file, which serves the processes of one
machine. Nodes of a cluster share no disk, and SQLite's locks cannot be trusted over a
network file system, so with that file a job re-run on another node (a retried Ray task,
a new cluster, a resumed study) would pay for every call again.

Decision (issue 32, item 2):

* When the cache location is a URI (`--cache s3://bucket/cache`, or `REXEVAL_CACHE`
  set to a URI), each successful call is stored as its own object,
  `<root>/<key[:2]>/<key>.json`, where the key is the request hash the SQLite cache
  already uses (model, messages, sampling, schema). The store is content-addressed: an
  object is written once, by a single PUT, which is atomic, so there are no locks and
  no half-written entries; two nodes that make the same call write the same answer, and
  the last PUT wins harmlessly. Any node reads any entry. A batch of lookups (or
  writes) runs in parallel threads, because each is one round trip. The two-character
  prefix spreads the keys over folders (object stores rate-limit per prefix; a local
  listing stays short).
* A local path keeps the SQLite file: on one machine it is faster, and nothing changes
  for a laptop.
* When a job writes to a URI and no cache was given (neither `--cache` nor a URI
  `REXEVAL_CACHE`), the cache defaults to `<out>/_llm_cache/`. The node-local default
  (`~/.cache/rexeval/llm-calls.sqlite`) would be on whichever node the driver or the
  actor happened to run, so a re-run elsewhere would repeat the calls; under the output
  folder the cache lives exactly as long as the output does, every node can reach it,
  and a re-run of the job from any node makes no call for finished work. Keeping it
  beside the output also means `--overwrite` with other settings (which clears the
  folder) clears it too, and that deleting an output deletes what it cost to make.
  A URI `REXEVAL_CACHE` wins over it: an operator who set one wants every job to share
  it.
* Only successful results are stored (a transport failure or an error answer is never
  cached, so a re-run retries it), exactly as in the SQLite cache; `CachedBackend` uses
  either through the same `get_many` / `put_many`.

`models/` must not import `pipelines/`, so this class lives here and the pipelines
build their cached backends with `build_cached_backend` below, which picks the store.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from rexeval.models.llm.base import LLMResult
from rexeval.models.llm.cache import CallStore, LLMCache
from rexeval.models.llm.cache import build_cached_backend as _build_cached_backend
from rexeval.pipelines.core.storage import Location, PathLike, is_uri, location

CACHE_DIR = "_llm_cache"
"""The cache's folder under a job's output when the output is a URI."""
ENV_DIR = "llm-calls"
"""The cache's folder under a URI `REXEVAL_CACHE`."""
THREADS = 16


class ObjectCallCache:
    """Key -> successful LLMResult, one JSON object per key under a folder (a URI).

    Pickles as its location, so each Ray worker opens it from its own environment."""

    def __init__(self, root: PathLike, threads: int = THREADS):
        self.root = location(root)
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def __reduce__(self):
        return (ObjectCallCache, (str(self.root), self.threads))

    def __repr__(self) -> str:
        return f"ObjectCallCache({str(self.root)!r})"

    def entry(self, key: str) -> Location:
        return self.root / key[:2] / f"{key}.json"

    def _map(self, fn, items: list) -> list:
        """`fn` over `items` in this process's thread pool (in line for one item)."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="llm-cache")
                self._pid = os.getpid()
            pool = self._pool
        return list(pool.map(fn, items))

    def _get(self, key: str) -> LLMResult | None:
        try:
            obj = json.loads(self.entry(key).read_bytes())
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
            self.entry(key).write_bytes(json.dumps(blob, ensure_ascii=False).encode("utf-8"))

        self._map(put, list(rows))
        return len(rows)

    def __len__(self) -> int:
        return sum(1 for f in self.root.walk_files() if f.suffix == ".json")

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.shutdown(wait=True)
            self._pool = None


def open_call_cache(where: PathLike | None) -> CallStore | None:
    """The cache at `where`: objects under a URI, a SQLite file at a local path, or none."""
    if where is None or not str(where):
        return None
    if is_uri(where):
        return ObjectCallCache(where)
    path = Path(str(where).removeprefix("file://")).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return LLMCache(path)


def build_cached_backend(backend: str, model: str, options: dict, cache: PathLike | None):
    """A backend behind the call cache at `cache` (a URI or a local SQLite path; none
    when None); what every pipeline builds, once per actor."""
    store = ObjectCallCache(cache) if cache and is_uri(cache) else (None if cache is None else str(cache))
    return _build_cached_backend(backend, model, options, store)


def default_cache() -> str:
    """The cache when nothing else says: under a URI `REXEVAL_CACHE`, else the SQLite
    file in rexeval's local cache folder."""
    env = os.environ.get("REXEVAL_CACHE")
    if env and is_uri(env):
        return str(location(env) / ENV_DIR)
    from rexeval.models.gguf_cache import cache_root

    return str(cache_root() / "llm-calls.sqlite")


def node_cache(cache: str | None) -> str | None:
    """`cache` for a process that can open only a local SQLite file (the judge Serve
    deployment, in the serve layer below this module): itself when local, else the
    node's own default file, so the deployment still keeps what it answered."""
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
