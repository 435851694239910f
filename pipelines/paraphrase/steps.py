"""The steps of `rexeval cluster` that see whole tables, run on a worker, not the driver.

Each step reads what it needs from the job's storage (the input statements or reviews,
`<out>/_work/`), writes what it makes back there, and returns a small dict (counts,
progress lines) to the driver, which runs them with `pipeline.on_worker`:

    prepare      statements (or EXTRA's candidates from reviews) -> distinct statements,
                 written as `_work/nodes.parquet` (row, text, polarity group)
    neighbours   embeddings -> candidate pairs (FAISS, `neighbours.candidate_pairs`),
                 `_work/neighbours/`; the FAISS indexes are built here or in Ray tasks
    finish       pairs (and pair scores) -> graph -> clusters/, canonical/, errors/,
                 the report; or EXTRA's MinHash-LSH groups

`PairScoreStage` is the pair filter's actor stage: each task names a range of pairs,
and the actor reads those pairs and their texts from storage itself.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.core.io import ShardedOutput, read_parquet, read_table
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus
from rexeval.storage import Location, PathLike, location

NODES = "nodes.parquet"
EXTRA_STATEMENTS = "extra-statements.parquet"
PAIRS = "pairs/part-00000.parquet"


# -- inputs ------------------------------------------------------------------------------

def read_statements(cfg: ClusterConfig, stage: str, work: Location, say=None) -> tuple[pa.Table, dict]:
    """The statements to cluster: the input's rows of `stage`, or (stage "extra") EXTRA's
    candidates, made from the reviews when `say` is given (prepare) and read back from
    `_work/` otherwise (finish). Returns the table and EXTRA's candidate stats."""
    from rexeval.pipelines.core.inputs import statement_files

    if stage == "extra":
        if say is None:
            return read_parquet(work / EXTRA_STATEMENTS), {}
        return _extra_candidates(cfg, work, say)
    files = statement_files(cfg.input)
    table = read_table(files[0].parent if len(files) > 1 else files[0], "statements", rename=cfg.columns or None)
    total = table.num_rows
    table = table.filter(pc.equal(table.column("stage"), stage))
    if say is not None:
        say(f"cluster: {table.num_rows:,} '{stage}' statement(s) of {total:,} row(s) in {cfg.input}")
    return table, {}


def _extra_candidates(cfg: ClusterConfig, work: Location, say) -> tuple[pa.Table, dict]:
    """EXTRA's heuristic candidates from the reviews of an ingest folder / reviews file."""
    from rexeval.pipelines.paraphrase.extra import extra_candidates
    from rexeval.pipelines.core.inputs import reviews_path

    reviews = read_table(reviews_path(cfg.input), "reviews", columns=["review_id", "user_id", "item_id", "text"],
                         rename=cfg.columns or None)
    cands, stats = extra_candidates(reviews, min_count=cfg.extra_min_count)
    rule = (f"recurring in >= {cfg.extra_min_count} reviews" if cfg.extra_min_count > 1
            else "(recurrence filter off)")
    say(f"cluster (extra): {reviews.num_rows:,} review(s) -> {cands.num_rows:,} "
        f"candidate sentence(s) {rule}")
    (work / EXTRA_STATEMENTS).write_parquet(cands)
    return cands, stats


# -- step 1: distinct statements -------------------------------------------------------------

def prepare(cfg: ClusterConfig, stage: str, work: PathLike) -> dict:
    """Statements -> distinct statements (nodes), written as `_work/nodes.parquet`:
    {"n", "digest", "extra_stats", "messages"}."""
    from rexeval.pipelines.paraphrase.nodes import build_nodes

    work, messages = location(work), []
    statements, extra_stats = read_statements(cfg, stage, work, messages.append)
    nodes, errors = build_nodes(statements, source=str(cfg.input))
    messages.append(f"  {statements.num_rows:,} statement row(s) -> {nodes.n:,} distinct statement(s) in "
                    f"{len(nodes.group_names)} polarity group(s); {errors.num_rows} error row(s)")
    (work / NODES).write_parquet(pa.table({
        "row": pa.array(np.arange(nodes.n, dtype=np.int64)),
        "text": pa.array(nodes.texts, pa.string()),
        "group": pa.array(nodes.groups, pa.int64())}))
    return {"n": nodes.n, "digest": nodes.digest(), "extra_stats": extra_stats, "messages": messages}


# -- step 2: candidate pairs -----------------------------------------------------------------

def pairs_digest(a: np.ndarray, b: np.ndarray, nodes_digest: str) -> str:
    """Identifies a pair list (the pair scores are reused only for the same one)."""
    import hashlib

    h = hashlib.blake2b(digest_size=12)
    h.update(nodes_digest.encode())
    h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(b, dtype=np.int64).tobytes())
    return h.hexdigest()


def neighbours(cfg: ClusterConfig, work: PathLike, emb_key: str, n: int, nodes_digest: str,
               gpu: str | bool, threads: int) -> dict:
    """Candidate pairs (a < b, cos >= tau_pair) within each polarity, saved in
    `_work/neighbours/` (reused by a re-run): {"pairs", "digest", "stats", "messages"}."""
    from rexeval.pipelines.paraphrase.embed import embedding_dim, read_vectors
    from rexeval.pipelines.paraphrase.neighbours import candidate_pairs
    from rexeval.pipelines.paraphrase.shards import EmbeddingsAt

    work = location(work)
    folder = work / "neighbours"
    conf = {"embeddings": emb_key, "k": cfg.k, "tau_pair": cfg.tau_pair, "index": cfg.index,
            "nprobe": cfg.nprobe}
    out = ShardedOutput(folder, "neighbours", conf, ["pairs"]).open(overwrite=True)
    if 0 in out.done_shards():
        t = read_parquet(out.shard_path("pairs", 0), columns=["a", "b"])
        a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
        return {"pairs": len(a), "digest": pairs_digest(a, b, nodes_digest),
                "stats": (out.read_manifest() or {}).get("stats", {}),
                "messages": [f"  neighbours: reusing {len(a):,} candidate pair(s) from {folder}"]}
    messages: list[str] = []
    groups = read_parquet(work / NODES, columns=["group"]).column("group").to_numpy()
    if cfg.neighbour_workers > 1:  # the index shards read their own rows; this task holds none
        vectors = EmbeddingsAt(str(work / "embeddings"), n, embedding_dim(work / "embeddings"))
    else:
        vectors = read_vectors(work / "embeddings", n)
    res = candidate_pairs(vectors, groups, k=cfg.k, tau=cfg.tau_pair,
                          kind=cfg.index, nprobe=cfg.nprobe, workers=cfg.neighbour_workers, gpu=gpu,
                          progress=lambda m: messages.append("  " + m), threads=threads,
                          memory_gib=cfg.memory_per_worker, resources=cfg.resources_per_worker,
                          index_shard_gib=cfg.index_shard_gib)
    table = pa.table({"a": pa.array(res.a, pa.int64()), "b": pa.array(res.b, pa.int64()),
                      "cos": pa.array(res.cos, pa.float32())})
    out.write_shard(0, {"pairs": table}, {"pairs": table.num_rows})
    out.finish(1, stats=res.stats)
    return {"pairs": len(res), "digest": pairs_digest(res.a, res.b, nodes_digest), "stats": res.stats,
            "messages": messages}


# -- the pair filter -------------------------------------------------------------------------

_SCORED = pa.schema([("shard", pa.int64()), ("pairs", pa.int64())])


class PairScoreStage(Stage):
    """Score one shard of candidate pairs with the cross-encoder / reranker per call.

    A task names its pairs (`start`, `end` in the pairs file); the actor reads the pairs
    and the texts from storage (once, then keeps them for its next shards)."""

    name = "pair-score"
    batch_size = 1

    def __init__(self, output: ShardedOutput, location: str, kind: str, pairs_at: PathLike,
                 texts_at: PathLike, *, device: str = "auto", batch_size: int = 64,
                 resources: Resources = Resources()):
        self.output, self.location, self.kind, self.device = output, location, kind, device
        self.pairs_at, self.texts_at = str(pairs_at), str(texts_at)
        self.pair_batch = batch_size
        self.resources = resources
        self.scorer = None
        self._data: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def setup(self) -> None:
        from rexeval.models.encoders.pair_scorer import build_pair_scorer

        use_cpus(self.resources)
        self.scorer = build_pair_scorer(self.location, kind=self.kind, device=self.device)

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, texts) of the whole pair list, read once per actor."""
        if self._data is None:
            from rexeval.pipelines.paraphrase.embed import read_texts

            t = read_parquet(self.pairs_at, columns=["a", "b"])
            self._data = (t.column("a").to_numpy(), t.column("b").to_numpy(),
                          np.asarray(read_texts(self.texts_at), dtype=object))
        return self._data

    def process(self, batch: pa.Table) -> pa.Table:
        if self.scorer is None:
            self.setup()
        all_a, all_b, texts = self.data()
        rows = []
        for shard, start, end in zip(*(batch.column(c).to_pylist() for c in ("shard", "start", "end"))):
            a, b = all_a[start:end], all_b[start:end]
            prob = np.asarray(self.scorer.score(list(zip(texts[a].tolist(), texts[b].tolist())),
                                                batch_size=self.pair_batch), dtype=np.float32)
            table = pa.table({"a": pa.array(a, pa.int64()), "b": pa.array(b, pa.int64()),
                              "prob": pa.array(prob, pa.float32())})
            self.output.write_shard(shard, {"pair_scores": table}, {"pairs": len(a)})
            rows.append({"shard": shard, "pairs": len(a)})
        return pa.Table.from_pylist(rows, schema=_SCORED)


def pair_score_shards(n_pairs: int, shard_size: int) -> int:
    return (n_pairs + shard_size - 1) // shard_size


# -- step 3: clusters, outputs, report ---------------------------------------------------------

def finish(cfg: ClusterConfig, enc: dict, stage: str, work: PathLike, out: ShardedOutput) -> dict:
    """Cluster the distinct statements (STAR's graph over the kept pairs, or EXTRA's
    MinHash-LSH groups), write the output tables (shard 0 and its marker) and the report:
    {"counts", "quality", "reports", "timings", "messages"}."""
    from rexeval.pipelines.paraphrase.embed import read_vectors
    from rexeval.pipelines.paraphrase.nodes import build_nodes, output_tables
    from rexeval.pipelines.paraphrase.quality import quality_summary, write_report

    work, messages, timings = location(work), [], {}
    statements, _ = read_statements(cfg, stage, work)
    nodes, errors = build_nodes(statements, source=str(cfg.input))
    emb = read_vectors(work / "embeddings", nodes.n) if nodes.n else np.zeros((0, 0), dtype=np.float32)
    t = time.time()
    counts: dict[str, Any] = {}
    if cfg.method == "star":
        labels, reps, graph_counts = _star_graph(emb, nodes, work, cfg, enc, timings, messages)
        counts.update(graph_counts)
    else:
        from rexeval.pipelines.paraphrase.minhash import extra_representatives, minhash_lsh_clusters

        labels = minhash_lsh_clusters(nodes.texts.tolist(), threshold=cfg.extra_threshold,
                                      num_perm=cfg.extra_num_perm, ngram=cfg.extra_ngram)
        reps = extra_representatives(labels, nodes.texts.tolist(), nodes.counts)
        timings["minhash_s"] = time.time() - t

    t = time.time()
    clusters, canonical = output_tables(statements, nodes, labels, reps)
    tables = {"clusters": clusters, "canonical": canonical, "errors": errors}
    if stage == "extra":
        tables["statements"] = statements
    q_emb = read_vectors(work / "quality-embeddings", nodes.n) if enc.get("quality_location") and nodes.n else emb
    summary = quality_summary(cfg.method.upper(), q_emb, labels, reps, nodes.texts.tolist(),
                              n_statements_in=statements.num_rows)
    summary.update({"pair_filter": enc["pair_filter"], "quality_embedder": enc["quality_embedder"],
                    "embedder": enc["embedder"], "stage": stage})
    counts.update({"statements_in": statements.num_rows, "statements_clustered": clusters.num_rows,
                   "errors": errors.num_rows, "distinct_statements": nodes.n,
                   "clusters": canonical.num_rows})
    shard_counts = {k: v for k, v in counts.items() if isinstance(v, int)}
    out.write_shard(0, tables, shard_counts)
    reports = write_report(out.root, summary)
    timings["write_s"] = time.time() - t
    return {"counts": shard_counts, "messages": messages, "timings": timings,
            "quality": {k: summary[k] for k in ("clusters", "reduction_pct", "sse", "ssb", "sse_sum", "ssb_sum")
                        if k in summary},
            "reports": {k: str(v) for k, v in reports.items()}}


def _star_graph(emb, nodes, work: Location, cfg: ClusterConfig, enc: dict, timings: dict, messages: list):
    """Kept pairs -> graph refinement; returns labels, representatives, counts."""
    from rexeval.pipelines.paraphrase.graph import cluster_graph

    if nodes.n == 0:
        a = b = np.zeros(0, dtype=np.int64)
    else:
        t = read_parquet(work / "neighbours" / PAIRS, columns=["a", "b"])
        a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
    if enc.get("cross_encoder"):
        scores = work / "pair-scores" / "pair_scores"
        parts = [read_parquet(scores / f"part-{i:05d}.parquet", columns=["prob"])
                 for i in range(pair_score_shards(len(a), cfg.shard_size))]
        prob = (pa.concat_tables(parts).column("prob").to_numpy().astype(np.float32) if parts
                else np.zeros(0, dtype=np.float32))
        keep = prob > cfg.cross_threshold
        messages.append(f"  pair filter: {int(keep.sum()):,} of {len(a):,} pair(s) validated by "
                        f"{enc['cross_encoder']}")
    else:
        keep = np.ones(len(a), dtype=bool)
        messages.append(f"  pair filter: {enc['pair_filter']}")
    t = time.time()
    g = cluster_graph(emb, a[keep], b[keep], tau_intra=cfg.tau_intra, tau_remerge=cfg.tau_remerge)
    timings["graph_s"] = time.time() - t
    messages.append(f"  graph: {g.n_components:,} component(s), {g.refined_components:,} refined by "
                    f"Algorithm 1 -> {g.n_clusters:,} cluster(s)")
    counts = {"candidate_pairs": int(len(a)), "validated_pairs": int(keep.sum()),
              "components": int(g.n_components), "refined_components": int(g.refined_components)}
    return g.labels, g.representatives, counts
