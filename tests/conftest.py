"""Shared fixtures: one local Ray per test session, the shared real data, and what the
real local LLM extracts from it (once per session: SmolLM2 on two CPU cores is slow).

The session's rexeval cache (LLM calls) is a folder of its own, so that no test passes
or fails on answers an earlier run left in the user's cache; converted models (the
SmolLM2 GGUF, ~16 s to convert) are shared with the user's cache.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _omp_wait() -> None:
    """This process computes beside the session's Ray workers (and, under xdist, the other
    worker's): its OpenMP threads sleep while they wait, as the workers' do; set before
    torch loads (pipelines/core/runtime.py imports no torch)."""
    from rexeval.pipelines.core.runtime import OMP_WAIT

    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT)


_omp_wait()


def _thread_cap() -> None:
    """Under xdist every worker computes beside the others, each with its own Ray: its
    processes (itself, its Ray's actors and trials) get its share of the cores as torch,
    FAISS and BLAS threads (rexeval/threads.py), not each the whole machine. Set before
    torch loads; the session's Ray workers inherit both variables. A value exported
    wins. On 2 cores at -n 2 that is 1 thread per process: a trainer's steps took 1.18x the
    CPU with 2 (benchmarks/bench_thread_cap.py); on a slice of the suite the cap did not show
    (docs/benchmarks.md), and costs nothing there."""
    from rexeval.threads import MAX_THREADS_ENV

    cores = os.cpu_count() or 1
    share = max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    if share < cores and MAX_THREADS_ENV not in os.environ:
        os.environ[MAX_THREADS_ENV] = str(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


_thread_cap()

# Two of Ray's daemons poll on timers whatever a test does: the log monitor lists the logs
# folder every 0.1 s while it holds under 1,000 files (every 0.5 s beyond), and each node's
# agent reports its machine's stats to the dashboard every 5 s. No test reads either
# faster (the log monitor still reads open files every 0.1 s). On judge+extract tests at
# -n 2 they took 15.6 s of CPU, against 9.7 s so (benchmarks/suite_cpu.py, 2026-11-30);
# the full suite started ~700 workers, so its log folders fill the listing.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "30000")


def _session_cache() -> None:
    from rexeval.models.gguf_cache import models_cache_dir

    models = models_cache_dir()
    models.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rexeval-test-cache-"))
    (root / "models").symlink_to(models.resolve(), target_is_directory=True)
    os.environ["REXEVAL_CACHE"] = str(root)
    atexit.register(shutil.rmtree, root, True)


if "REXEVAL_TEST_KEEP_CACHE" not in os.environ:
    _session_cache()


def _threads() -> None:
    """REXEVAL_TEST_THREADS: torch's CPU threads for the session (learning robustness)."""
    from tests.doubles.seeds import THREADS

    if THREADS:
        import torch

        torch.set_num_threads(THREADS)


_threads()


def _serve_port() -> None:
    """Under xdist, a Serve HTTP port of this worker's own (tests/doubles/ports.py)."""
    from tests.doubles.ports import pin_worker_serve_port

    pin_worker_serve_port()


_serve_port()

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("REXEVAL_SHARED", REPO.parent / "shared"))
SHARED_CSV = SHARED / "data" / "amazon_musical_instruments_2014_part.csv"


# -- two workers (scripts/test.sh runs `-n 2`) ---------------------------------------------
# Files that share a session fixture too costly to build twice run on one worker.
SAME_WORKER = {"tests/pipelines/paraphrase/test_real_data.py": "tests/pipelines/extract/test_real_model.py"}
# The files that take longest, measured (a full `-n 2` run's junit, 2 cores), longest first.
# They start first, so that no worker is left running one of them alone at the end; the
# rest follow by test count (xdist's own order). A stale entry only costs balance.
LONGEST_FIRST = [
    "tests/ray_jobs/test_cli.py",  # the demo: a whole study, ~6 min beside the other worker
    "tests/deploy/test_autoscaling.py",  # mostly waits on nodes: the demo's lighter neighbour
    "tests/pipelines/generate/prompted/test_real_llm.py",
    "tests/ray_jobs/test_no_shared_disk.py",
    "tests/pipelines/study/test_runner.py",
    "tests/pipelines/generate/test_lm_generators_real.py",
    "tests/pipelines/extract/test_real_model.py",
    "tests/benchmarks/test_bench_llm_scale.py",
    "tests/pipelines/generate/test_real_data.py",
]


def _scope(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0]
    return SAME_WORKER.get(file, file)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole files to a worker (`--dist loadfile`: module fixtures are built once), in the
    workers' collection order (`pytest_collection_modifyitems` below), and the files of
    `SAME_WORKER` together."""
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False  # xdist would order files by test count
    return LongestFirst(config, log)


def pytest_collection_modifyitems(session, config, items):
    """In an xdist worker: `LONGEST_FIRST`'s files first, then the rest by test count (the
    order xdist's scheduler takes the files in; every worker sorts alike)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    counts: dict[str, int] = {}
    for item in items:
        counts[_scope(item.nodeid)] = counts.get(_scope(item.nodeid), 0) + 1
    items.sort(key=lambda item: (rank.get(_scope(item.nodeid), len(rank)), -counts[_scope(item.nodeid)],
                                 _scope(item.nodeid)))


@pytest.fixture(scope="session")
def ray_session(s3_env):
    """A local Ray started once for the whole session (3-5 s to start), after the test
    S3 endpoint, so that its workers inherit the variables that point at it."""
    import ray as ray_module

    from rexeval.pipelines.core.runtime import init_ray

    if ray_module.is_initialized():
        # A test before this fixture ran a job that started Ray itself (Ray Data starts
        # one when none runs), before the S3 endpoint existed: its workers lack the
        # endpoint's variables, and every later S3 test on this worker would fail to
        # resolve the bucket. Start the session's Ray afresh.
        ray_module.shutdown()
    ray = init_ray(num_cpus=2)
    yield ray


@pytest.fixture(scope="session")
def shared_csv() -> Path:
    if not SHARED_CSV.exists():
        pytest.skip(f"shared data not found at {SHARED_CSV}")
    return SHARED_CSV


SMOLLM2_REVIEWS = 1  # the first shared reviews SmolLM2 extracts statements from


@pytest.fixture(scope="session")
def smollm2_extraction(ray_session, shared_csv, tmp_path_factory) -> dict:
    """The shared reviews ingested, and triplets (statement, topic, sentiment) that the
    real local LLM extracts from the first of them: {"ingest", "out", "cache", "manifest"}.
    Built once; tests read it and write elsewhere."""
    from rexeval.pipelines.extract.config import ExtractConfig
    from rexeval.pipelines.extract.pipeline import run_extract
    from rexeval.pipelines.ingest.config import IngestConfig
    from rexeval.pipelines.ingest.pipeline import run_ingest

    root = tmp_path_factory.mktemp("smollm2-extraction")
    run_ingest(IngestConfig(inputs=[str(shared_csv)], out=str(root / "ingest"), category="instruments"),
               progress=lambda s: None)
    cfg = ExtractConfig(input=str(root / "ingest"), out=str(root / "triplets"), limit=SMOLLM2_REVIEWS,
                        max_tokens=160, shard_size=SMOLLM2_REVIEWS, cache=str(root / "cache.sqlite"))
    manifest = run_extract(cfg, progress=lambda s: None)
    return {"ingest": root / "ingest", "out": root / "triplets", "cache": root / "cache.sqlite",
            "manifest": manifest, "config": cfg}


@pytest.fixture(scope="session")
def s3_env():
    """An S3 endpoint on 127.0.0.1 (tests/doubles/s3.py) for the whole session, with this
    process's AWS variables pointing at it (the session's Ray workers inherit them)."""
    from tests.doubles.s3 import s3_server

    with s3_server() as env:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        from rexeval import storage

        storage._FS_CACHE.clear()
        try:
            yield env
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            storage._FS_CACHE.clear()


@pytest.fixture
def s3_root(s3_env) -> str:
    """A fresh, empty `s3://` folder on the test endpoint."""
    from tests.doubles.s3 import fresh_prefix

    return fresh_prefix()
