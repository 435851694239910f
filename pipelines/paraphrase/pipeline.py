"""The paraphrase-clustering job (seed 002, section 4.2 and appendix B.3), on Ray.

method "star" (the paper's pipeline):
  statements -> distinct statements per polarity (`nodes`)
  -> embeddings (sentence-transformers actors, or vLLM's embed task; `embed`)
  -> K nearest neighbours within each polarity with FAISS, pairs with cos >= tau_pair
     (`neighbours`, `index`; queries sharded over Ray actors when asked)
  -> pair filter: a cross-encoder or reranker LLM keeps pairs with probability > 0.9
     (`models.encoders.pair_scorer`); without one (the local profile) the job runs
     bi-encoder only and says so in its manifest and report
  -> connected components, non-cohesive ones refined by Algorithm 1, representatives
     (`graph`) -> clusters/, canonical/, report (`quality`).
method "extra" (the EXTRA baseline of Table 3): heuristic sentence candidates from
reviews (or the given statements as they are) grouped by MinHash-LSH over n-grams
(`extra`, `minhash`); embeddings are computed only to measure SSE/SSB.

Every path may be a local folder or a URI (`rexeval/storage.py`). The driver
only orchestrates: it reads the input's footers (for the settings hash), markers and
manifests, and small results. The steps that hold whole tables (statements -> nodes,
the neighbour search, the graph and the outputs) run as Ray tasks on a worker
(`steps`), and the embedding and pair-scoring actors read their own rows from
storage. Work files (nodes, embeddings, pairs, pair scores) live in `<out>/_work/`,
the sharded ones resumable, so a re-run after a crash redoes only what is missing; the
graph step is recomputed (seconds) and the outputs rewritten identically.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pyarrow as pa

from rexeval.pipelines.paraphrase import steps
from rexeval.pipelines.paraphrase.config import CLUSTER_OUTPUTS, ClusterConfig
from rexeval.pipelines.core.io import ShardedOutput, table_files, unset_fields
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.pipelines.core.stage import Resources, cpu_share, worker_resources
from rexeval.storage import Location, PathLike, location

JOB = "cluster"
TABLES = [CLUSTER_OUTPUTS.clusters, CLUSTER_OUTPUTS.canonical, CLUSTER_OUTPUTS.errors]
CLUSTER_RULES_VERSION = 1  # bump when node building or output rules change


# -- models ---------------------------------------------------------------------------

def resolve_encoders(cfg: ClusterConfig) -> dict[str, Any]:
    """Embedder and pair scorer of this run; the pair filter mode is stated in words."""
    from rexeval.models.profiles import load_profile
    from rexeval.models.refs import on_node, shipped_location

    profile = load_profile(cfg.profile, overrides=cfg.models)
    embedder = profile.require("embedder")
    out: dict[str, Any] = {"embedder": embedder, "embedder_location": profile.shipped("embedder")}
    cross = profile.ref("cross_encoder")
    if cfg.method == "extra":
        out["pair_filter"] = "none (EXTRA groups statements by MinHash-LSH over n-grams)"
    elif cross is None or cfg.bi_encoder_only:
        why = ("--bi-encoder-only was given" if cross else
               f"profile {cfg.profile!r} has no cross_encoder"
               + (f" ({profile.notes['cross_encoder'].strip()})" if profile.notes.get("cross_encoder") else ""))
        out["pair_filter"] = (f"bi-encoder only: {why}; every neighbour pair with cosine >= "
                              f"{cfg.tau_pair} counts as a paraphrase (pass --model "
                              "cross_encoder=/path to filter pairs as seed 002 does)")
        out["cross_encoder"] = None
    else:
        from rexeval.models.encoders.pair_scorer import detect_pair_scorer_kind

        location = profile.shipped("cross_encoder")  # a URI stays one: each actor copies it on its node
        # Read the checkpoint here, so a wrong path fails before any work, not in an actor.
        kind = detect_pair_scorer_kind(on_node(location), ref=cross) if cfg.cross_kind == "auto" else cfg.cross_kind
        out.update({"cross_encoder": cross, "cross_location": location, "cross_kind": kind})
        out["pair_filter"] = (f"cross-encoder {cross} ({kind}): pairs kept when "
                              f"probability > {cfg.cross_threshold}")
    q = cfg.quality_embedder
    out["quality_embedder"] = q or embedder
    if q:
        out["quality_location"] = shipped_location(q)
    return out


# -- inputs ---------------------------------------------------------------------------

def is_reviews_input(path: PathLike, rename: dict[str, str] | None = None) -> bool:
    """An `rexeval ingest` folder or a reviews table in any format (it has a `text`
    column, after `rename`: our names -> the file's)."""
    from rexeval.pipelines.core.io import read_raw
    from rexeval.pipelines.core.schema import SchemaError

    p = location(path)
    if (p / "reviews").is_dir():
        return True
    try:
        files = table_files(p)
        return bool(files) and "text" in read_raw(files[0], "reviews", rename, "reviews", head=True).column_names
    except (FileNotFoundError, pa.ArrowInvalid, OSError, SchemaError):
        return False


def describe_input(cfg: ClusterConfig) -> tuple[dict, str]:
    """What the job reads, for its settings hash (files, sizes, row counts: of Parquet
    from the footers, of CSV, TSV or JSON lines counted), and the stage of statements it
    clusters ("extra": EXTRA's candidates made from reviews). Columns are checked here,
    before any work (`columns` maps ours to the table's)."""
    from rexeval.pipelines.core.inputs import (check_schemas, file_record, resolve_stage, reviews_path,
                                               statement_files, table_rows)

    rename = cfg.columns or None
    if cfg.method == "extra" and is_reviews_input(cfg.input, rename):
        files = table_files(reviews_path(cfg.input))
        check_schemas(files, rename, "reviews")
        return {"files": [file_record(f) for f in files], "stage": "extra",
                "reviews": table_rows(files) or 0}, "extra"
    files = statement_files(cfg.input)
    check_schemas(files, rename)
    stage = resolve_stage(files, cfg.stage, rename)
    return {"files": [file_record(f) for f in files], "stage": stage,
            "rows_in_files": table_rows(files) or 0}, stage


# -- running a step on a worker -----------------------------------------------------------

def on_worker(fn: Callable, *args: Any, resources: Resources = Resources(), threads: int | None = None,
              options: dict | None = None) -> Any:
    """`fn(*args)` run as one Ray task with `resources`, its numerical libraries using
    `threads` cores (default: its CPUs), and its (small) result. An error the step
    raised is raised here as itself, so a user's mistake still reads as one line.
    `options`: Ray options such as the placement `runtime.reads_here` gives."""
    import ray

    threads = max(1, int(threads or resources.cpus))
    task = ray.remote(fn).options(num_cpus=resources.cpus, num_gpus=resources.gpus,
                                  resources=resources.ray_resources, memory=resources.memory or None,
                                  **(options or {}),
                                  runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}})
    try:
        return ray.get(task.remote(*args))
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from exc
        raise


def step_threads(cfg: ClusterConfig, workers: int = 1) -> int:
    """Threads of each of `workers` processes of a step (FAISS, the graph): the settings'
    `cpus_per_worker`, else `stage.cpu_share` (on one machine its cores shared, on a
    cluster one). Never the cluster's nodes: on an autoscaling one, those up at the
    start (a head with no CPUs) say nothing of the node the step will get."""
    return max(1, int(cfg.cpus_per_worker or cpu_share(workers)))


# -- pair filter ------------------------------------------------------------------------

def score_pairs(work: Location, n_pairs: int, digest: str, cfg: ClusterConfig, enc: dict, progress) -> None:
    """Probability per candidate pair in `_work/pair-scores/`, resumable per shard of
    `cfg.shard_size` pairs; the actors read the pairs and texts from storage."""
    conf = {"model": enc["cross_encoder"], "kind": enc["cross_kind"], "pairs": digest}
    size = cfg.shard_size
    job = ShardedJob(ShardedOutput(work / "pair-scores", "pair-scores", conf, ["pair_scores"]),
                     steps.pair_score_shards(n_pairs, size), overwrite=True, progress=progress)
    if job.todo:
        stage = steps.PairScoreStage(job.output, enc["cross_location"], enc["cross_kind"],
                                     work / "neighbours" / steps.PAIRS, work / steps.NODES, device=cfg.device,
                                     batch_size=cfg.pair_batch_size, resources=worker_resources(cfg))
        job.run(stage, lambda i: {"shard": i, "start": i * size, "end": min(n_pairs, (i + 1) * size)},
                workers=cfg.workers, min_workers=cfg.min_workers, report=lambda row, k, n: shard_line(
                    row["shard"], k, n, f"{row['pairs']:,} pairs", label="pair scores"))
    job.finish()


# -- neighbours -------------------------------------------------------------------------

def neighbour_pairs(cfg: ClusterConfig, work: Location, emb_key: str, prep: dict, options: dict,
                    progress) -> dict:
    """Candidate pairs, found on a worker (`steps.neighbours`): {"pairs", "digest", "stats"}.

    GPUs follow what the job asks for (--gpus-per-worker > 0), not what the cluster has
    now: with one neighbour worker the step's task asks for a GPU and FAISS uses it there;
    with several, that task asks for none, holds no vectors, and its index shards ask
    for one each (an autoscaling cluster brings a GPU node when they do)."""
    gpu = cfg.gpus_per_worker > 0
    # One process: its threads; several: each build task's and search actor's CPUs.
    threads = step_threads(cfg, cfg.neighbour_workers)
    if cfg.neighbour_workers == 1:
        resources = Resources(cpus=cfg.cpus_per_worker or 1, gpus=1 if gpu else 0)
        want = "auto" if gpu else False  # the GPU the task was given, when FAISS has GPU support
    else:
        resources, want = Resources(cpus=1), gpu
    res = on_worker(steps.neighbours, cfg, work, emb_key, prep["n"], prep["digest"], want, threads,
                    resources=resources, threads=threads, options=options)
    for m in res["messages"]:
        progress(m)
    return res


# -- the job ------------------------------------------------------------------------------

def run_cluster(cfg: ClusterConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Run the job end to end (reusing finished work) and return the manifest."""
    from rexeval.pipelines.paraphrase.embed import embed_texts
    from rexeval.pipelines.core.runtime import reads_here

    t0 = time.time()
    timings: dict[str, float] = {}
    enc = resolve_encoders(cfg)
    src, stage = describe_input(cfg)
    hashed = cfg.model_dump(exclude={"input", "out", "workers", "min_workers", "cpus_per_worker", "gpus_per_worker",
                                     "memory_per_worker", "resources_per_worker", "neighbour_workers", "index_shard_gib",
                                     "shard_size",
                                     "embed_batch_size", "pair_batch_size", "device"}
                                     | unset_fields(cfg, "columns"))
    conf = {**hashed, "input": src, "encoders": {k: v for k, v in enc.items() if not k.endswith("location")},
            "rules": CLUSTER_RULES_VERSION}
    job = ShardedJob(ShardedOutput(cfg.out, JOB, conf, TABLES + ([CLUSTER_OUTPUTS.statements] if stage == "extra" else []),
                                   owns=CLUSTER_OUTPUTS.paths()), 1,
                     overwrite=overwrite, progress=progress)
    if (manifest := job.finished("cluster")) is not None:
        return manifest
    out = job.output
    work = out.root / CLUSTER_OUTPUTS.work
    # A local input or output exists on this machine only: the steps run on its node then.
    options = reads_here([cfg.input, cfg.out])
    one_process = Resources(cpus=cfg.cpus_per_worker or 1)
    threads = step_threads(cfg)

    t = time.time()
    prep = on_worker(steps.prepare, cfg, stage, work, resources=one_process, threads=threads, options=options)
    for m in prep["messages"]:
        progress(m)
    timings["nodes_s"] = time.time() - t

    t = time.time()
    texts_at = work / steps.NODES
    embed_texts(texts_at, prep["n"], work / "embeddings", model_ref=enc["embedder"],
                location=enc["embedder_location"], digest=prep["digest"], device=cfg.device,
                batch_size=cfg.embed_batch_size, shard_size=cfg.shard_size, workers=cfg.workers,
                min_workers=cfg.min_workers,
                resources=worker_resources(cfg), backend=cfg.embed_backend, progress=progress)
    timings["embed_s"] = time.time() - t

    pair_stats: dict = {}
    if cfg.method == "star":
        t = time.time()
        pairs = {"pairs": 0, "digest": steps.pairs_digest([], [], prep["digest"]), "stats": {}}
        if prep["n"]:
            pairs = neighbour_pairs(cfg, work, f"{enc['embedder']}:{prep['digest']}", prep, options, progress)
        pair_stats = pairs["stats"]
        timings["neighbours_s"] = time.time() - t
        progress(f"  neighbours: {pairs['pairs']:,} candidate pair(s) with cosine >= {cfg.tau_pair}")
        t = time.time()
        if enc.get("cross_encoder"):
            score_pairs(work, pairs["pairs"], pairs["digest"], cfg, enc, progress)
        timings["pair_filter_s"] = time.time() - t

    if enc.get("quality_location"):
        embed_texts(texts_at, prep["n"], work / "quality-embeddings", model_ref=enc["quality_embedder"],
                    location=enc["quality_location"], digest=prep["digest"], device=cfg.device,
                    batch_size=cfg.embed_batch_size, shard_size=cfg.shard_size, workers=cfg.workers,
                    min_workers=cfg.min_workers, resources=worker_resources(cfg), backend=cfg.embed_backend,
                    progress=progress)
    done = on_worker(steps.finish, cfg, enc, stage, work, out, resources=one_process, threads=threads,
                     options=options)
    for m in done["messages"]:
        progress(m)
    timings.update(done["timings"])
    timings["total_s"] = time.time() - t0
    return out.finish(1, counts=done["counts"], method=cfg.method, stage=stage,
                      pair_filter=enc["pair_filter"], neighbours=pair_stats,
                      extra_candidates=prep["extra_stats"] or None, quality=done["quality"],
                      timings={k: round(v, 2) for k, v in timings.items()}, reports=done["reports"])
