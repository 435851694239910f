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

* Serve-routed calls (a judge deployment or app, `backend: serve`, `--judge-service`)
  go through the job's cache too: each worker asks it before the deployment, and writes
  what the deployment answered, so a re-run makes no call for finished work wherever
  the replicas land (a new app, another node, an empty replica cache). A deployment may
  still keep a cache of its own (`serve/judge.py`'s `cache`, a URI too), shared by every
  client that calls it.

The stores themselves (`ObjectCallCache`, the SQLite `LLMCache`) are in
`models/llm/cache.py`, which the judge deployment's replicas (serve layer) open as well;
this module decides where a job's cache is.
"""
from __future__ import annotations

import os
from pathlib import Path

from rexeval.models.llm.cache import build_cached_backend as _build_cached_backend
from rexeval.pipelines.core.storage import PathLike, is_uri, location

CACHE_DIR = "_llm_cache"
"""The cache's folder under a job's output when the output is a URI."""
ENV_DIR = "llm-calls"
"""The cache's folder under a URI `REXEVAL_CACHE`."""


def build_cached_backend(backend: str, model: str, options: dict, cache: PathLike | None):
    """A backend behind the call cache at `cache` (a URI or a local SQLite path; none
    when None); what every pipeline builds, once per actor."""
    return _build_cached_backend(backend, model, options, None if cache is None else str(cache))


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
