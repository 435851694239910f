"""`rexeval cluster` and `rexeval cluster-report` (python -m ray_jobs.paraphrase)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.ray_jobs.common import Where, columns_option, config_option, defaults_from, run_job, user_errors


@defaults_from(ClusterConfig)
@click.command("cluster")
@click.argument("input", required=False, type=Where())
@click.option("--out", "-o", type=Where(),
              help="Output folder or URI (clusters/, canonical/, errors/, report.md, manifest.json).")
@click.option("--method", type=click.Choice(["star", "extra"]),
              help="star (default): embeddings + FAISS neighbours + pair filter + graph refinement "
                   "(seed 002); extra: the EXTRA baseline (heuristic candidates, MinHash-LSH).")
@click.option("--stage", type=click.Choice(["auto", "triplet", "candidate", "verified"]),
              help="Which statements to cluster (default {default}: verified if any, else triplet).")
@click.option("--profile", help="Model profile: local (default, CPU, offline) or paper.")
@click.option("--model", "models", multiple=True, metavar="ROLE=REF",
              help="Override a model, e.g. --model embedder=/models/qwen3-embedding-0.6b or "
                   "--model cross_encoder=/models/qwen3-reranker-0.6b.")
@click.option("--bi-encoder-only", is_flag=True, default=None,
              help="Skip the cross-encoder filter even when the profile has one.")
@click.option("--k", type=int, help="Neighbours per statement within its polarity (default {default}).")
@click.option("--tau-pair", type=float, help="Cosine for a candidate pair (default {default}).")
@click.option("--cross-threshold", type=float, help="Pair probability to keep, strictly above (default {default}).")
@click.option("--cross-kind", metavar="KIND",
              help="How to score pairs: cross_encoder (sequence classification), reranker_llm "
                   "(causal LM scored by P(yes)), or package.module:Class of your own "
                   "(default {default}: read from the checkpoint).")
@click.option("--tau-intra", type=float, help="Component cohesion (min cosine) below which "
                                              "Algorithm 1 refines it (default {default}).")
@click.option("--tau-remerge", type=float, help="Pivot similarity to merge groups (default {default}).")
@click.option("--index", type=click.Choice(["auto", "flat", "ivf", "hnsw"]),
              help="FAISS index: auto (default: exact up to a size, then IVF), flat, ivf, hnsw.")
@click.option("--nprobe", type=int, help="IVF lists probed per query (default: chosen by size).")
@click.option("--device", help="Encoder device: auto (default), cpu, cuda.")
@click.option("--embed-backend", type=click.Choice(["sentence-transformers", "vllm"]),
              help="Embedding engine (vllm: ray.data.llm embed task on GPU workers).")
@click.option("--workers", type=int,
              help="Most encoder actors (a pool from min_workers); each loads the model (default {default}).")
@click.option("--gpus-per-worker", type=float, help="GPUs per encoder actor (default {default}); above 0 the FAISS "
                                                   "neighbour search asks for a GPU too.")
@click.option("--neighbour-workers", type=int, help="FAISS index shards at least, one Ray actor each, every "
              "query sent to all (default {default}: one index in one process of cpus_per_worker threads).")
@click.option("--index-shard-gib", type=float, help="Most vectors one index shard holds, in GiB (default {default}): "
              "a polarity group above it is split into more shards.")
@click.option("--quality-embedder", help="Model for SSE/SSB (default: the embedder).")
@click.option("--extra-min-count", type=int, help="extra: reviews a sentence must recur in (default {default}).")
@click.option("--extra-threshold", type=float, help="extra: n-gram Jaccard to merge (default {default}).")
@columns_option
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def cluster_cmd(overwrite, config_file, **flags):
    """Group paraphrased statements into clusters with one canonical statement each.

    INPUT is an `rexeval extract` output folder (or a statements table: Parquet, CSV, TSV
    or JSON lines, gzipped or not; --columns maps your column names to ours), a local
    path or a URI (s3://..., gs://...), as --out may be; with --method extra it may
    also be an `rexeval ingest` folder or a reviews table, whose reviews then give
    EXTRA's heuristic sentence candidates. Statements are compared only within the same
    polarity. Without a cross-encoder (the local profile has none) pairs are accepted on
    the bi-encoder cosine alone, and the manifest and report say so.

    Outputs: clusters/ (every statement -> cluster_id, is_representative), canonical/
    (one representative per cluster), errors/, report.md/json (clusters, reduction %,
    SSE, SSB, size histogram, examples), cluster_sizes.csv/png. A re-run resumes.

    Examples:

      rexeval cluster runs/mi/star --out runs/mi/clusters

      rexeval cluster runs/mi/ingest --method extra --out runs/mi/clusters-extra

      rexeval cluster my_statements.jsonl.gz --columns statement=text --out runs/mi/clusters-mine

      rexeval cluster runs/toys/star --out runs/toys/clusters --profile paper --gpus-per-worker 1
    """
    from rexeval.pipelines.paraphrase.pipeline import run_cluster  # here: --help needs none of it

    return run_job(lambda cfg, m: f"cluster ({m.get('method', cfg.method)})", ClusterConfig,
                   partial(run_cluster, overwrite=overwrite), config_file, flags, counts=_counts,
                   outputs=lambda cfg, m: {n: f"{cfg.out}/{n}" for n in ("clusters", "canonical", "errors")}
                   | {"report": f"{cfg.out}/report.md"},
                   notes=lambda cfg, m: [f"pair filter: {m.get('pair_filter')}"])


def _counts(cfg, manifest: dict) -> dict:
    c, q = manifest["counts"], manifest.get("quality", {})
    return {"statements in": c.get("statements_in", 0), "distinct statements": c.get("distinct_statements", 0),
            "candidate pairs": c.get("candidate_pairs", "-"), "validated pairs": c.get("validated_pairs", "-"),
            "refined components": c.get("refined_components", "-"), "clusters": c.get("clusters", 0),
            "reduction %": f"{q.get('reduction_pct', 0):.2f}", "SSE": f"{q.get('sse', 0):.4f}",
            "SSB": f"{q.get('ssb', 0):.4f}", "error rows": c.get("errors", 0)}


@click.command("cluster-report")
@click.argument("runs", nargs=-1, required=True, type=Where(exists=True, file_okay=False))
@click.option("--dataset", help="Dataset name for the first column (default: none).")
@click.option("--csv", "csv_path", type=Where(dir_okay=False), help="Also write the rows as CSV.")
@user_errors
def cluster_report_cmd(runs, dataset, csv_path):
    """Print seed 002's Table 3 (#clusters, reduction %, SSE, SSB) for several cluster runs
    (local folders or URIs).

    Example: rexeval cluster-report runs/mi/clusters-extra runs/mi/clusters --dataset MI
    """
    from rexeval.pipelines.paraphrase.quality import format_table3
    from rexeval.storage import location

    rows = []
    for run in runs:
        report = location(run) / "report.json"
        if not report.exists():
            raise FileNotFoundError(f"{run} has no report.json: is it a finished `rexeval cluster` output?")
        rows.append(report.read_json())
    click.echo(format_table3(rows, dataset=dataset))
    if csv_path:
        import csv
        import io

        keys = ["method", "statements", "clusters", "reduction_pct", "sse", "ssb"]
        text = io.StringIO(newline="")
        w = csv.DictWriter(text, fieldnames=["dataset", *keys])
        w.writeheader()
        for r in rows:
            w.writerow({"dataset": dataset or "", **{k: r.get(k) for k in keys}})
        location(csv_path).write_text(text.getvalue())


def main():  # python -m ray_jobs.paraphrase
    cluster_cmd()


if __name__ == "__main__":
    main()
