"""The `rexeval star` jobs with inputs and outputs on S3 (moto on 127.0.0.1): build,
baselines, evaluating a checkpoint folder on the bucket and the Table 1 report give the
same tables as a local run, and write nothing to the local disk. (Training on a URI is
Tune's storage on the bucket: tests/pipelines/core/test_tune_phases.py.)"""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch
from click.testing import CliRunner

from rexeval.pipelines.core.io import read_parquet, write_parquet_atomic
from rexeval.storage import location
from rexeval.pipelines.core.tune import STATE_FILE
from rexeval.pipelines.star.config import BuildConfig, EvalSettings
from rexeval.pipelines.star.data import StarData
from rexeval.pipelines.star.pipeline import evaluate_checkpoint, run_baselines, run_build
from rexeval.pipelines.star.train import TrainSettings, build_model
from rexeval.ray_jobs.cli import cli
from tests.doubles.planted_star import planted_star
from tests.pipelines.star.test_build import CLUSTERS_T, REVIEWS_T, STATEMENTS_T

QUIET = dict(progress=lambda s: None)
TABLES = ("interactions", "triplets", "candidates", "errors")


def local_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def put_inputs(root) -> None:
    """An extract folder, an ingest folder and a cluster folder under `root` (local or a URI)."""
    base = location(root)
    write_parquet_atomic(base / "extract" / "statements" / "part-00000.parquet", STATEMENTS_T)
    write_parquet_atomic(base / "ingest" / "reviews" / "part-00000.parquet", REVIEWS_T)
    write_parquet_atomic(base / "clusters" / "clusters" / "part-00000.parquet", CLUSTERS_T)


def build(root: str):
    cfg = BuildConfig(statements=f"{root}/extract", reviews=f"{root}/ingest", clusters=f"{root}/clusters",
                      out=f"{root}/bench", name="toy")
    return run_build(cfg, **QUIET)


def test_build_on_s3_matches_local(tmp_path, s3_root):
    put_inputs(tmp_path)
    here = build(str(tmp_path))
    put_inputs(s3_root)
    before = local_files(tmp_path)
    there = build(s3_root)
    assert local_files(tmp_path) == before
    assert there["counts"] == here["counts"] and there["status"] == "complete"
    assert there["config"]["reviews"] == f"{s3_root}/ingest/reviews"
    assert here["config"]["reviews"] == str(tmp_path / "ingest" / "reviews")
    for t in TABLES:
        got = read_parquet(f"{s3_root}/bench/{t}/part-00000.parquet").to_pylist()
        want = pq.read_table(tmp_path / "bench" / t / "part-00000.parquet").to_pylist()
        assert got == [{k: v.replace(str(tmp_path), s3_root) if isinstance(v, str) else v for k, v in r.items()}
                       for r in want], t
    for name in ("stats.json", "stats.md"):
        assert location(f"{s3_root}/bench/{name}").read_bytes() == (tmp_path / "bench" / name).read_bytes()
    assert build(s3_root)["counts"] == here["counts"]  # done: read back from the bucket's manifest


def checkpoint(data: StarData, folder: Path) -> Path:
    """An epoch checkpoint folder as `star_trainable` leaves one (an untrained ExpGCN)."""
    settings = TrainSettings(model="expgcn", dim=8, layers=1).resolved()
    torch.manual_seed(0)
    model = build_model(settings, data, None, "cpu")
    folder.mkdir(parents=True)
    torch.save({"model": model.state_dict(), "epoch": 1, "settings": settings, "features_path": None},
               folder / STATE_FILE)
    return folder


def test_baselines_checkpoint_and_report_on_s3_match_local(tmp_path, s3_root):
    data = planted_star(n_users=30, n_items=15)
    data.save(tmp_path / "bench")
    ck = checkpoint(data, tmp_path / "ck")
    levels = ["global", "item", "user"]
    run_baselines(EvalSettings(data=str(tmp_path / "bench"), out=str(tmp_path / "rank"), levels=levels),
                  ["random", "userpop", "itempop"], **QUIET)
    evaluate_checkpoint(EvalSettings(data=str(tmp_path / "bench"), out=str(tmp_path / "rank"), levels=levels),
                        str(ck), **QUIET)

    data.save(f"{s3_root}/bench")
    location(f"{s3_root}/ck").upload(ck)
    before = local_files(tmp_path)
    cfg = EvalSettings(data=f"{s3_root}/bench", out=f"{s3_root}/rank", levels=levels)
    run_baselines(cfg, ["random", "userpop", "itempop"], **QUIET)
    evaluate_checkpoint(cfg, f"{s3_root}/ck", **QUIET)
    assert local_files(tmp_path) == before
    for method in ("RANDOM", "USERPOP", "ITEMPOP", "EXPGCN"):
        folder = f"{s3_root}/rank/results/{method}"
        got = location(f"{folder}/per_interaction.parquet").read_bytes()
        assert got == (tmp_path / "rank" / "results" / method / "per_interaction.parquet").read_bytes(), method
        summary = location(f"{folder}/summary.json").read_json()
        want = location(tmp_path / "rank" / "results" / method / "summary.json").read_json()
        assert summary["levels"] == want["levels"] and summary["data"] == f"{s3_root}/bench"
    assert location(f"{s3_root}/rank/baselines.json").read_json()["methods"] == \
        location(tmp_path / "rank" / "baselines.json").read_json()["methods"]

    # Table 1 from the bucket's run folder, its CSV and Markdown written there.
    runner = CliRunner()
    res = runner.invoke(cli, ["star", "report", str(tmp_path / "rank"), "--name", "toy", "--level", "global",
                              "--csv", str(tmp_path / "t1.csv"), "--out", str(tmp_path / "t1.md")])
    assert res.exit_code == 0, res.output
    before = local_files(tmp_path)
    res2 = runner.invoke(cli, ["star", "report", f"{s3_root}/rank", "--name", "toy", "--level", "global",
                               "--csv", f"{s3_root}/t1.csv", "--out", f"{s3_root}/t1.md"])
    assert res2.exit_code == 0, res2.output
    assert res2.output == res.output and "| EXPGCN |" in res.output
    assert local_files(tmp_path) == before
    for name in ("t1.csv", "t1.md"):
        assert location(f"{s3_root}/{name}").read_bytes() == (tmp_path / name).read_bytes(), name
    res3 = runner.invoke(cli, ["star", "report", f"{s3_root}/no-such-run"])
    assert res3.exit_code != 0 and "does not exist" in res3.output
