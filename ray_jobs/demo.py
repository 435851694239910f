"""`rexeval demo`: the whole platform, offline, on the sample shipped with the project.

Today: ingest (the sample plus a file of deliberately broken rows) -> temporal split
-> dataset statistics per domain and overall. Each later stage joins here when it lands.
"""
from __future__ import annotations

import time
from pathlib import Path

import click
import pyarrow.compute as pc

from pipelines.ingest_pipeline import IngestConfig, run_ingest
from pipelines.io import read_table
from pipelines.ray_runtime import init_ray
from pipelines.split_pipeline import SplitConfig, run_split
from pipelines.stats import dataset_stats, format_table
from ray_jobs.common import summary, user_errors

SAMPLE = Path(__file__).resolve().parents[1] / "pipelines" / "sample"


@click.command("demo")
@click.option("--out", "-o", default="runs/demo", show_default=True, help="Output folder.")
@click.option("--overwrite", is_flag=True, help="Start over instead of resuming.")
@user_errors
def demo_cmd(out, overwrite):
    """Run the demo pipeline on the embedded review sample (five domains, offline).

    Example: rexeval demo --out runs/demo
    """
    started = time.time()
    root = Path(out)
    init_ray()
    click.echo("[1/3] ingest: the sample (clean) + reviews_noisy.jsonl (broken rows on purpose)")
    ing = run_ingest(IngestConfig(inputs=[str(SAMPLE / "reviews.jsonl"), str(SAMPLE / "reviews_noisy.jsonl")],
                                  meta=[str(SAMPLE / "items.jsonl")], out=str(root / "ingest")),
                     overwrite=overwrite, progress=click.echo)
    errors = read_table(root / "ingest" / "errors", "errors")
    for e in errors.to_pylist():
        click.echo(f"  error row: {Path(e['source']).name} line {e['line']}: {e['error_type']}: {e['message']}")

    click.echo("[2/3] split: per-user temporal 80/10/10 (seed 000)")
    spl = run_split(SplitConfig(input=str(root / "ingest"), out=str(root / "split")),
                    overwrite=overwrite, progress=click.echo)

    click.echo("[3/3] info: statistics per domain (seed 000, Table II)")
    splits = {n: read_table(root / "split" / n, "reviews") for n in ("train", "valid", "test")}
    stats = {}
    for cat in sorted(set(splits["train"].column("category").to_pylist()) - {None}):
        stats[cat] = dataset_stats({n: t.filter(pc.equal(t.column("category"), cat)) for n, t in splits.items()})
    stats["all"] = dataset_stats(splits)
    click.echo(format_table(stats))
    c, s = ing["counts"], spl["counts"]
    summary("demo", {"reviews in": c["in"], "reviews out": c["out"], "error rows": c["errors"],
                     "train": s["train"], "valid": s["valid"], "test": s["test"]}, started,
            {"ingest": str(root / "ingest"), "split": str(root / "split")},
            ["later stages (extraction, clustering, ranking, metrics, judges) join this demo as they land"])


def main():  # python -m ray_jobs.demo
    demo_cmd()


if __name__ == "__main__":
    main()
