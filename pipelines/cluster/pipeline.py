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

Work files (embeddings, pairs, pair scores) live in `<out>/_work/` as resumable shards,
so a re-run after a crash redoes only what is missing; the graph step is recomputed
(seconds) and the outputs rewritten identically.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.cluster.config import ClusterConfig
from rexeval.pipelines.cluster.nodes import Nodes, build_nodes, output_tables
from rexeval.pipelines.core.io import ShardedOutput, read_table, table_files
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus, worker_resources

JOB = "cluster"
TABLES = ["clusters", "canonical", "errors"]
CLUSTER_RULES_VERSION = 1  # bump when node building or output rules change


# -- models ---------------------------------------------------------------------------

def resolve_encoders(cfg: ClusterConfig) -> dict[str, Any]:
    """Embedder and pair scorer of this run; the pair filter mode is stated in words."""
    from rexeval.models.profiles import load_profile
    from rexeval.models.refs import resolve

    profile = load_profile(cfg.profile, overrides=cfg.models)
    embedder = profile.require("embedder")
    out: dict[str, Any] = {"embedder": embedder, "embedder_location": resolve(embedder).location}
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

        location = resolve(cross).location
        # Read the checkpoint here, so a wrong path fails before any work, not in an actor.
        kind = detect_pair_scorer_kind(location, ref=cross) if cfg.cross_kind == "auto" else cfg.cross_kind
        out.update({"cross_encoder": cross, "cross_location": location, "cross_kind": kind})
        out["pair_filter"] = (f"cross-encoder {cross} ({kind}): pairs kept when "
                              f"probability > {cfg.cross_threshold}")
    q = cfg.quality_embedder
    out["quality_embedder"] = q or embedder
    if q:
        out["quality_location"] = resolve(q).location
    return out


# -- inputs ---------------------------------------------------------------------------

def load_statements(cfg: ClusterConfig, progress) -> tuple[pa.Table, dict, str]:
    """The statements to cluster, their provenance for the config hash, and the stage."""
    from rexeval.pipelines.core.inputs import check_schemas, resolve_stage, statement_files

    files = statement_files(cfg.input)
    check_schemas(files)
    stage = resolve_stage(files, cfg.stage)
    table = read_table(files[0].parent if len(files) > 1 else files[0], "statements")
    total = table.num_rows
    table = table.filter(pc.equal(table.column("stage"), stage))
    progress(f"cluster: {table.num_rows:,} '{stage}' statement(s) of {total:,} row(s) in {cfg.input}")
    src = {"files": [{"path": str(f.resolve()), "size": f.stat().st_size} for f in files],
           "stage": stage, "rows_in_files": total}
    return table, src, stage


def _is_reviews_input(path: str) -> bool:
    p = Path(path)
    if (p / "reviews").is_dir():
        return True
    if p.is_file() or p.is_dir():
        import pyarrow.parquet as pq

        try:
            files = table_files(p)
            return bool(files) and "text" in pq.read_schema(files[0]).names
        except (FileNotFoundError, pa.ArrowInvalid, OSError):
            return False
    return False


def extra_statements(cfg: ClusterConfig, progress) -> tuple[pa.Table, dict, dict]:
    """EXTRA's heuristic candidates from the reviews of an ingest folder / reviews file."""
    from rexeval.pipelines.cluster.extra import extra_candidates
    from rexeval.pipelines.core.inputs import reviews_path

    src_path = reviews_path(cfg.input)
    reviews = read_table(src_path, "reviews", columns=["review_id", "user_id", "item_id", "text"])
    cands, stats = extra_candidates(reviews, min_count=cfg.extra_min_count)
    rule = (f"recurring in >= {cfg.extra_min_count} reviews" if cfg.extra_min_count > 1
            else "(recurrence filter off)")
    progress(f"cluster (extra): {reviews.num_rows:,} review(s) -> {cands.num_rows:,} "
             f"candidate sentence(s) {rule}")
    files = table_files(src_path)
    src = {"files": [{"path": str(f.resolve()), "size": f.stat().st_size} for f in files],
           "stage": "extra", "reviews": reviews.num_rows}
    return cands, src, stats


# -- pair filter ------------------------------------------------------------------------

_SCORED = pa.schema([("shard", pa.int64()), ("pairs", pa.int64())])


class PairScoreStage(Stage):
    """Score one shard of candidate pairs with the cross-encoder / reranker per call."""

    name = "pair-score"
    batch_size = 1

    def __init__(self, output: ShardedOutput, location: str, kind: str, *, device: str = "auto",
                 batch_size: int = 64, resources: Resources = Resources()):
        self.output, self.location, self.kind, self.device = output, location, kind, device
        self.pair_batch = batch_size
        self.resources = resources
        self.scorer = None

    def setup(self) -> None:
        from rexeval.models.encoders.pair_scorer import build_pair_scorer

        use_cpus(self.resources)
        self.scorer = build_pair_scorer(self.location, kind=self.kind, device=self.device)

    def process(self, batch: pa.Table) -> pa.Table:
        if self.scorer is None:
            self.setup()
        rows = []
        for shard, a, b, ta, tb in zip(*(batch.column(c).to_pylist()
                                         for c in ("shard", "a", "b", "text_a", "text_b"))):
            prob = np.asarray(self.scorer.score(list(zip(ta, tb)), batch_size=self.pair_batch),
                              dtype=np.float32)
            table = pa.table({"a": pa.array(a, pa.int64()), "b": pa.array(b, pa.int64()),
                              "prob": pa.array(prob, pa.float32())})
            self.output.write_shard(shard, {"pair_scores": table}, {"pairs": len(a)})
            rows.append({"shard": shard, "pairs": len(a)})
        return pa.Table.from_pylist(rows, schema=_SCORED)


def score_pairs(a: np.ndarray, b: np.ndarray, texts: np.ndarray, folder: Path, digest: str,
                cfg: ClusterConfig, enc: dict, progress) -> np.ndarray:
    """Probability per candidate pair, resumable per shard of `cfg.shard_size` pairs."""
    import pyarrow.parquet as pq

    conf = {"model": enc["cross_encoder"], "kind": enc["cross_kind"], "pairs": digest}
    size = cfg.shard_size
    n_shards = (len(a) + size - 1) // size
    job = ShardedJob(ShardedOutput(folder, "pair-scores", conf, ["pair_scores"]), n_shards, overwrite=True,
                     progress=progress)
    out = job.output
    if job.todo:
        stage = PairScoreStage(out, enc["cross_location"], enc["cross_kind"], device=cfg.device,
                               batch_size=cfg.pair_batch_size, resources=worker_resources(cfg))
        job.run(stage, lambda i: {"shard": i, "a": a[i * size:(i + 1) * size].tolist(),
                                  "b": b[i * size:(i + 1) * size].tolist(),
                                  "text_a": texts[a[i * size:(i + 1) * size]].tolist(),
                                  "text_b": texts[b[i * size:(i + 1) * size]].tolist()},
                workers=cfg.workers, report=lambda row, k, n: (
                    f"  pair scores: shard {row['shard']} done ({k}/{n}): {row['pairs']:,} pairs"))
    job.finish()
    if not n_shards:
        return np.zeros(0, dtype=np.float32)
    parts = [pq.read_table(out.shard_path("pair_scores", i)) for i in range(n_shards)]
    return pa.concat_tables(parts).column("prob").to_numpy().astype(np.float32)


def _pairs_digest(a: np.ndarray, b: np.ndarray, nodes_digest: str) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=12)
    h.update(nodes_digest.encode())
    h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(b, dtype=np.int64).tobytes())
    return h.hexdigest()


# -- neighbours -------------------------------------------------------------------------

def neighbour_pairs(emb: np.ndarray, nodes: Nodes, folder: Path, emb_key: str, cfg: ClusterConfig,
                    progress) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Candidate pairs (a < b, cos >= tau_pair) within each polarity; saved for resume."""
    import pyarrow.parquet as pq

    from rexeval.pipelines.cluster.neighbours import candidate_pairs

    conf = {"embeddings": emb_key, "k": cfg.k, "tau_pair": cfg.tau_pair, "index": cfg.index,
            "nprobe": cfg.nprobe}
    out = ShardedOutput(folder, "neighbours", conf, ["pairs"]).open(overwrite=True)
    manifest = out.read_manifest() or {}
    if 0 in out.done_shards():
        t = pq.read_table(out.shard_path("pairs", 0))
        progress(f"  neighbours: reusing {t.num_rows:,} candidate pair(s) from {folder}")
        return (t.column("a").to_numpy(), t.column("b").to_numpy(), t.column("cos").to_numpy(),
                manifest.get("stats", {}))
    res = candidate_pairs(emb, nodes.groups, k=cfg.k, tau=cfg.tau_pair, kind=cfg.index,
                          nprobe=cfg.nprobe, workers=cfg.neighbour_workers,
                          gpu="auto", progress=lambda m: progress("  " + m))
    table = pa.table({"a": pa.array(res.a, pa.int64()), "b": pa.array(res.b, pa.int64()),
                      "cos": pa.array(res.cos, pa.float32())})
    out.write_shard(0, {"pairs": table}, {"pairs": table.num_rows})
    out.finish(1, stats=res.stats)
    return res.a, res.b, res.cos, res.stats


# -- the job ------------------------------------------------------------------------------

def run_cluster(cfg: ClusterConfig, overwrite: bool = False,
                progress: Callable[[str], None] = print) -> dict:
    """Run the job end to end (reusing finished work) and return the manifest."""
    from rexeval.pipelines.cluster.quality import quality_summary, write_report
    from rexeval.pipelines.cluster.embed import embed_texts

    t0 = time.time()
    timings: dict[str, float] = {}
    enc = resolve_encoders(cfg)
    extra_stats: dict = {}
    if cfg.method == "extra" and _is_reviews_input(cfg.input):
        statements, src, extra_stats = extra_statements(cfg, progress)
        stage = "extra"
    else:
        statements, src, stage = load_statements(cfg, progress)
    hashed = cfg.model_dump(exclude={"input", "out", "workers", "cpus_per_worker", "gpus_per_worker",
                                     "neighbour_workers", "shard_size", "embed_batch_size",
                                     "pair_batch_size", "device"})
    conf = {**hashed, "input": src, "encoders": {k: v for k, v in enc.items() if not k.endswith("location")},
            "rules": CLUSTER_RULES_VERSION}
    job = ShardedJob(ShardedOutput(cfg.out, JOB, conf, TABLES + (["statements"] if stage == "extra" else [])), 1,
                     overwrite=overwrite, progress=progress)
    if (manifest := job.finished("cluster")) is not None:
        return manifest
    out = job.output
    work = Path(cfg.out) / "_work"

    t = time.time()
    nodes, errors = build_nodes(statements, source=str(cfg.input))
    progress(f"  {statements.num_rows:,} statement row(s) -> {nodes.n:,} distinct statement(s) in "
             f"{len(nodes.group_names)} polarity group(s); {errors.num_rows} error row(s)")
    timings["nodes_s"] = time.time() - t

    t = time.time()
    emb_digest = nodes.digest()
    emb = embed_texts(nodes.texts.tolist(), work / "embeddings", model_ref=enc["embedder"],
                      location=enc["embedder_location"], digest=emb_digest, device=cfg.device,
                      batch_size=cfg.embed_batch_size, shard_size=cfg.shard_size, workers=cfg.workers,
                      resources=worker_resources(cfg), backend=cfg.embed_backend, progress=progress)
    timings["embed_s"] = time.time() - t

    t = time.time()
    counts: dict[str, Any] = {}
    if cfg.method == "star":
        labels, reps, graph_counts, pair_stats = _star_graph(emb, nodes, work, f"{enc['embedder']}:{emb_digest}",
                                                             cfg, enc, timings, progress)
        counts.update(graph_counts)
    else:
        from rexeval.pipelines.cluster.minhash import extra_representatives, minhash_lsh_clusters

        labels = minhash_lsh_clusters(nodes.texts.tolist(), threshold=cfg.extra_threshold,
                                      num_perm=cfg.extra_num_perm, ngram=cfg.extra_ngram)
        reps = extra_representatives(labels, nodes.texts.tolist(), nodes.counts)
        pair_stats = {}
        timings["minhash_s"] = time.time() - t

    t = time.time()
    clusters, canonical = output_tables(statements, nodes, labels, reps)
    tables = {"clusters": clusters, "canonical": canonical, "errors": errors}
    if stage == "extra":
        tables["statements"] = statements
    q_emb = emb
    if enc.get("quality_location"):
        q_emb = embed_texts(nodes.texts.tolist(), work / "quality-embeddings", model_ref=enc["quality_embedder"],
                            location=enc["quality_location"], digest=emb_digest, device=cfg.device,
                            batch_size=cfg.embed_batch_size, shard_size=cfg.shard_size, workers=cfg.workers,
                            resources=worker_resources(cfg), backend=cfg.embed_backend, progress=progress)
    summary = quality_summary(cfg.method.upper(), q_emb, labels, reps, nodes.texts.tolist(),
                              n_statements_in=statements.num_rows)
    summary.update({"pair_filter": enc["pair_filter"], "quality_embedder": enc["quality_embedder"],
                    "embedder": enc["embedder"], "stage": stage})
    counts.update({"statements_in": statements.num_rows, "statements_clustered": clusters.num_rows,
                   "errors": errors.num_rows, "distinct_statements": nodes.n,
                   "clusters": canonical.num_rows})
    shard_counts = {k: v for k, v in counts.items() if isinstance(v, int)}
    out.write_shard(0, tables, shard_counts)
    reports = write_report(Path(cfg.out), summary)
    timings["write_s"] = time.time() - t
    timings["total_s"] = time.time() - t0
    manifest = out.finish(1, counts=shard_counts, method=cfg.method, stage=stage,
                          pair_filter=enc["pair_filter"], neighbours=pair_stats,
                          extra_candidates=extra_stats or None,
                          quality={k: summary[k] for k in ("clusters", "reduction_pct", "sse", "ssb",
                                                           "sse_sum", "ssb_sum") if k in summary},
                          timings={k: round(v, 2) for k, v in timings.items()},
                          reports={k: str(v) for k, v in reports.items()})
    return manifest


def _star_graph(emb, nodes, work, emb_key, cfg, enc, timings, progress):
    """Neighbours -> pair filter -> graph refinement; returns labels, representatives, counts."""
    from rexeval.pipelines.cluster.graph import cluster_graph

    t = time.time()
    if nodes.n == 0:
        a = b = np.zeros(0, dtype=np.int64)
        cos, stats = np.zeros(0, dtype=np.float32), {}
    else:
        a, b, cos, stats = neighbour_pairs(emb, nodes, work / "neighbours", emb_key, cfg, progress)
    timings["neighbours_s"] = time.time() - t
    progress(f"  neighbours: {len(a):,} candidate pair(s) with cosine >= {cfg.tau_pair}")
    t = time.time()
    if enc.get("cross_encoder"):
        prob = score_pairs(a, b, nodes.texts, work / "pair-scores", _pairs_digest(a, b, nodes.digest()),
                           cfg, enc, progress)
        keep = prob > cfg.cross_threshold
        progress(f"  pair filter: {int(keep.sum()):,} of {len(a):,} pair(s) validated by {enc['cross_encoder']}")
    else:
        keep = np.ones(len(a), dtype=bool)
        progress(f"  pair filter: {enc['pair_filter']}")
    timings["pair_filter_s"] = time.time() - t
    t = time.time()
    g = cluster_graph(emb, a[keep], b[keep], tau_intra=cfg.tau_intra, tau_remerge=cfg.tau_remerge)
    timings["graph_s"] = time.time() - t
    progress(f"  graph: {g.n_components:,} component(s), {g.refined_components:,} refined by "
             f"Algorithm 1 -> {g.n_clusters:,} cluster(s)")
    counts = {"candidate_pairs": int(len(a)), "validated_pairs": int(keep.sum()),
              "components": int(g.n_components), "refined_components": int(g.refined_components)}
    return g.labels, g.representatives, counts, stats

