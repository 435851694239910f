"""The five seed studies (studies/seed000.yaml ... seed004.yaml) plan as `--dry-run` shows
them, on planted inputs of the shape each names (the Amazon 2014 and 2023 dumps, seed 001's
released ratings, RecoExp's rated explanations), and their first, model-free steps run
on those inputs: so the files a study expects and the settings it passes fit together."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.pipelines.study.config import load_study

REPO = Path(__file__).resolve().parents[3]
SEEDS = ["seed000", "seed001", "seed002", "seed003", "seed004"]
ASPECTS = ["persuasiveness", "transparency", "accuracy", "satisfaction"]


def _lines(path: Path, rows: list[dict]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def _amazon2014(path: Path) -> None:
    """A 2014 5-core review file or its metadata (JSON lines, gzipped)."""
    if path.name.startswith("meta_"):
        _lines(path, [{"asin": f"B00000000{i}", "title": f"Planted item number {i}"} for i in range(6)])
        return
    _lines(path, [{"reviewerID": f"U{u}", "asin": f"B00000000{i}", "reviewerName": "P.", "helpful": [0, 0],
                   "reviewText": f"The planted item {i} works well and the battery lasts.", "overall": 4.0,
                   "summary": "Fine", "unixReviewTime": 1_400_000_000 + 86_400 * (u * 6 + i),
                   "reviewTime": "05 13, 2014"} for u in range(6) for i in range(6)])


def _amazon2023(path: Path) -> None:
    """A 2023 category's review file or its metadata: seven users with six 5-star
    purchases each, so seed 004's curation keeps them all."""
    if path.name.startswith("meta_"):
        _lines(path, [{"parent_asin": f"P{path.stem[:4]}{i}", "title": f"Planted garden lantern {i}",
                       "main_category": "planted"} for i in range(6)])
        return
    cat = path.name.split(".")[0]
    _lines(path, [{"rating": 5.0, "title": "Great", "text": f"Lovely lantern {i}, bright and sturdy.",
                   "images": [], "asin": f"A{cat[:4]}{i}", "parent_asin": f"P{('meta_' + cat)[:4]}{i}",
                   "user_id": f"{cat}-U{u}", "timestamp": 1_600_000_000_000 + 3_600_000 * (u * 6 + i),
                   "helpful_vote": 0, "verified_purchase": True} for u in range(7) for i in range(6)])


def _seed001(folder: Path) -> None:
    """Seed 001's four files, as its study's comment describes them."""
    rows = [(f"u{u}", f"m{m}", s) for u in range(3) for m in range(2) for s in ("sysA", "sysB")]
    expl = pa.table({"example_id": [f"{u}-{m}-{s}" for u, m, s in rows], "system": [s for *_, s in rows],
                     "user_id": [u for u, *_ in rows], "item_id": [m for _, m, _ in rows],
                     "explanation": [f"Because you liked {m}." for _, m, _ in rows],
                     "reference": [None] * len(rows)})
    pq.write_table(expl, folder / "explanations.parquet")
    pq.write_table(expl.set_column(5, "reference", pa.array(["I liked it ."] * len(rows))),
                   folder / "explanations_chars.parquet")
    pq.write_table(pa.table({"user_id": [u for u in ("u0", "u1", "u2") for _ in range(2)],
                             "item_id": ["m0", "m1"] * 3, "user_profile": [""] * 6,
                             "item_description": ["A planted film"] * 6}), folder / "contexts.parquet")
    ratings = pd.DataFrame({"user_id": [u for u, *_ in rows], "item_id": [m for _, m, _ in rows],
                            "system": [s for *_, s in rows],
                            "explanation": [f"Because you liked {m}." for _, m, _ in rows]})
    for k, a in enumerate(ASPECTS):
        ratings[f"human_{a}"] = [(i * (k + 2)) % 5 + 1 for i in range(len(rows))]
        ratings[f"annotator1_{a}"] = [(i * (k + 3)) % 5 + 1 for i in range(len(rows))]
        ratings[f"annotator2_{a}"] = [(i + k) % 5 + 1 for i in range(len(rows))]
        ratings[f"annotators_{a}"] = (ratings[f"annotator1_{a}"] + ratings[f"annotator2_{a}"]) / 2
    ratings.to_csv(folder / "ratings.csv", index=False)


def _recoexp(path: Path) -> None:
    _lines(path, [{"example_id": f"e{i}", "explanation": f"A gripping film {i} with a warm cast.",
                   "item_id": "B000000001", "rating": 1 + i % 5, "features": ["cast"]} for i in range(10)])


def plant(data: Path, study) -> None:
    """Every input file the study names under `data`, planted in its own shape."""
    for ds in study.datasets.values():
        for p in [*ds.inputs, *ds.meta, *(v for v in ds.vars.values() if isinstance(v, str))]:
            path = Path(p).absolute()  # inputs are kept relative to the working directory
            if not path.is_relative_to(data) or path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.parent.name == "amazon2014":
                _amazon2014(path)
            elif path.parent.name == "amazon2023":
                _amazon2023(path)
            elif path.parent.name == "llm_as_evaluator":
                _seed001(path.parent)
            elif path.name == "ratings.jsonl":
                _recoexp(path)
            else:
                raise AssertionError(f"no planted shape for {path}: add one here")


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("REXEVAL_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "data"


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_study_plans_its_every_step_on_planted_inputs(seed, data, tmp_path):
    from rexeval.ray_jobs.cli import cli

    study_file = REPO / "studies" / f"{seed}.yaml"
    study = load_study(study_file)
    plant(data, study)
    res = CliRunner().invoke(cli, ["study", "run", str(study_file), "--dry-run", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    planned = [line.split()[2] for line in res.output.splitlines() if line.strip().startswith("[run ]")]
    steps = {p.split("@")[0] for p in planned}
    assert steps == set(study.steps), res.output
    assert f"{len(planned)} to run, 0 not" in res.output


# The steps of each study that need no model: they run here on the planted files.
MODEL_FREE = {"seed000": ["ingest@toys", "split@toys", "stats@toys"], "seed001": ["given@lu2023"],
              "seed002": ["ingest@toys"], "seed003": ["ingest@recoexp"], "seed004": ["ingest@alert", "curate@alert"]}


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_studys_model_free_steps_run_on_planted_inputs(seed, data, tmp_path, ray_session):
    from rexeval.pipelines.study.plan import build_plan
    from rexeval.pipelines.study.runner import run_study

    study_file = REPO / "studies" / f"{seed}.yaml"
    study = load_study(study_file)
    plant(data, study)
    lines: list[str] = []
    res = run_study(build_plan(study, study_file, tmp_path / "out"), only=MODEL_FREE[seed],
                    progress=lines.append, steps_as="process")
    assert res["failed"] == {} and sorted(res["ran"]) == sorted(MODEL_FREE[seed]), "\n".join(lines)
    if seed == "seed004":  # seven users with six 5-star purchases in each of the 15 categories
        cats = pd.read_csv(tmp_path / "out" / "alert" / "curate" / "categories.csv")
        assert len(cats) == 15, cats
        assert set(cats.select_dtypes("number").iloc[:, 0]) == {7}, cats
