"""Metric agreement files of `rexeval evaluate` (pipelines.evaluate.correlations): from
planted scores.parquet / aggregates.parquet without Ray, and (slow) from a real
evaluate run with the model-free metrics on planted explanations."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import SCORE_AGGREGATES, SCORES
from rexeval.pipelines.evaluate.correlations import slug, write_metric_correlations

PNG = b"\x89PNG\r\n\x1a\n"


def plant(root, scores: list[tuple[str, str, str, float]], agg: list[tuple[str, str, float, str]]) -> None:
    write_parquet_atomic(root / "scores.parquet", pa.Table.from_pylist(
        [{"example_id": e, "system": s, "metric": m, "value": v} for s, e, m, v in scores], schema=SCORES))
    write_parquet_atomic(root / "aggregates.parquet", pa.Table.from_pylist(
        [{"system": s, "metric": m, "mean": v, "std": None, "n": 1, "n_missing": 0, "ci_low": None,
          "ci_high": None, "kind": k} for s, m, v, k in agg], schema=SCORE_AGGREGATES))


def test_files_from_planted_job_folder(tmp_path):
    # Over systems (aggregates.parquet): four systems with BLEU-1 (corpus) 1, 2, 3, 4 and
    # ROUGE-1 1, 3, 2, 4: pairs (s1,s2) C, (s1,s3) C, (s1,s4) C, (s2,s3) D, (s2,s4) C,
    # (s3,s4) C: 5 concordant, 1 discordant, tau = (5 - 1) / 6 = 2/3. DIV (lower is
    # better) 4, 3, 2, 1 is negated: the same order as BLEU-1, tau = 1. METEOR's means
    # 1, 5.5, 3.5, 7.5 order the systems as ROUGE-1 does: tau = 1.
    agg = []
    for s, bleu, rouge, div, met in (("s1", 1, 1, 4, 1), ("s2", 2, 3, 3, 5.5), ("s3", 3, 2, 2, 3.5),
                                     ("s4", 4, 4, 1, 7.5)):
        agg += [(s, "bleu-1", bleu, "corpus"), (s, "rouge-1-f", rouge, "per_example"), (s, "div", div, "corpus"),
                (s, "meteor", met, "per_example")]
    # Over examples (scores.parquet), (ROUGE-1, METEOR) per (system, example):
    # s1 (1, 1) (1, NaN); s2 (3, 5) (3, 6); s3 (2, 3) (2, 4); s4 (4, 7) (4, 8).
    # The NaN row is dropped: n = 7, 21 pairs. Tied in ROUGE-1 only: the two rows of s2,
    # of s3, of s4 (3 pairs); METEOR has no ties and rises with ROUGE-1 across groups, so
    # the other 18 pairs are concordant. tau-b = (C - D) / sqrt((n0 - tx)(n0 - ty))
    # = 18 / sqrt((21 - 3) * 21) = sqrt(6/7).
    values = {"s1": [(1, 1), (1, None)], "s2": [(3, 5), (3, 6)], "s3": [(2, 3), (2, 4)], "s4": [(4, 7), (4, 8)]}
    scores = []
    for s, pairs in values.items():
        for k, (x, y) in enumerate(pairs):
            scores += [(s, f"e{k}", "rouge-1-f", float(x)), (s, f"e{k}", "meteor", np.nan if y is None else float(y))]
    plant(tmp_path, scores, agg)
    (tmp_path / "metric_correlations_old_systems.png").write_bytes(PNG)  # a stale heat map
    kept = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    md = write_metric_correlations(tmp_path, dataset="toys & games", progress=lambda s: None)
    long = pq.read_table(tmp_path / "metric_correlations.parquet").to_pandas()
    assert list(long.columns) == ["dataset", "over", "metric_a", "metric_b", "tau", "p", "n", "note"]
    assert set(long["dataset"]) == {"toys & games"}
    sysl = long[long["over"] == "systems"].set_index(["metric_a", "metric_b"])
    # Report order (the n-gram table): BLEU-1, ROUGE-1, METEOR, DIV.
    assert sysl.loc[("bleu-1", "rouge-1-f"), "tau"] == pytest.approx(2 / 3)
    assert sysl.loc[("bleu-1", "div"), "tau"] == pytest.approx(1.0) and sysl.loc[("bleu-1", "div"), "n"] == 4
    assert sysl.loc[("rouge-1-f", "meteor"), "tau"] == pytest.approx(1.0)
    ex = long[long["over"] == "examples"]
    assert len(ex) == 1 and (ex.iloc[0]["metric_a"], ex.iloc[0]["metric_b"]) == ("rouge-1-f", "meteor")
    assert ex.iloc[0]["n"] == 7 and ex.iloc[0]["tau"] == pytest.approx(math.sqrt(6 / 7))
    csv = pd.read_csv(tmp_path / "metric_correlations.csv")
    assert len(csv) == len(long) and csv["tau"].iloc[0] == pytest.approx(long["tau"].iloc[0], abs=1e-6)
    for over in ("systems", "examples"):
        png = tmp_path / f"metric_correlations_{slug('toys & games')}_{over}.png"
        assert png.read_bytes().startswith(PNG)
    assert not (tmp_path / "metric_correlations_old_systems.png").exists()
    assert "### Kendall τ over systems: toys & games" in md and "| DIV | 1.00 |" in md
    assert (tmp_path / "metric_correlations.md").read_text() == md
    for name, data in kept.items():  # the job's own files are read, never changed
        if not name.startswith("metric_correlations"):
            assert (tmp_path / name).read_bytes() == data
    # Computed from the files alone: a second pass gives the same table.
    write_metric_correlations(tmp_path, dataset="toys & games", progress=lambda s: None)
    pd.testing.assert_frame_equal(pq.read_table(tmp_path / "metric_correlations.parquet").to_pandas(), long)


def test_examples_tau_b_with_ties_by_hand(tmp_path):
    # x (ROUGE-1) = 1, 1, 2, 3; y (METEOR) = 1, 2, 2, 3 over one system's 4 examples.
    # Pairs: (1,2) tied in x only; (1,3) C; (1,4) C; (2,3) tied in y only; (2,4) C; (3,4) C.
    # C = 4, D = 0, tx = 1, ty = 1: tau-b = 4 / sqrt(5 * 5) = 0.8.
    scores = []
    for k, (x, y) in enumerate(((1, 1), (1, 2), (2, 2), (3, 3))):
        scores += [("s1", f"e{k}", "rouge-1-f", float(x)), ("s1", f"e{k}", "meteor", float(y))]
    plant(tmp_path, scores, [("s1", "rouge-1-f", 1.75, "per_example"), ("s1", "meteor", 2.0, "per_example")])
    md = write_metric_correlations(tmp_path, progress=lambda s: None)
    long = pq.read_table(tmp_path / "metric_correlations.parquet").to_pandas().set_index("over")
    assert long.loc["examples", "tau"] == pytest.approx(0.8) and long.loc["examples", "n"] == 4
    # One system: over systems there is nothing to rank.
    assert math.isnan(long.loc["systems", "tau"]) and "not meaningful" in long.loc["systems", "note"]
    assert set(long["dataset"]) == {"all"} and "not meaningful: 1 systems" in md
    assert (tmp_path / "metric_correlations_all_systems.png").is_file()


def test_no_metric_pairs(tmp_path):
    plant(tmp_path, [("s1", "e0", "meteor", 0.5)], [("s1", "meteor", 0.5, "per_example")])
    md = write_metric_correlations(tmp_path, progress=lambda s: None)
    assert pq.read_table(tmp_path / "metric_correlations.parquet").num_rows == 0
    assert "No pair of metrics" in md and not list(tmp_path.glob("metric_correlations_*.png"))


@pytest.mark.slow
def test_evaluate_run_writes_correlations(ray_session, tmp_path):
    """Four planted systems scored with the model-free metrics (overlap, corpus): the
    correlation files come with the run, and the job's other outputs are as before."""
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    refs = ["the strings sound bright and the neck feels smooth under the fingers",
            "a sturdy stand that holds the guitar firmly and folds flat for travel",
            "the pedal adds warm overdrive without any hum at high gain settings",
            "soft case with thick padding and a large pocket for cables and picks"]
    # Word overlap with the reference falls from system to system by construction: all
    # words, the first 3/4, the first half, none. Every unigram metric ranks them the same.
    cut = {"copy": 1.0, "most": 0.75, "half": 0.5}
    rows = []
    for system in ("copy", "most", "half", "junk"):
        for k, ref in enumerate(refs):
            words = ref.split()
            text = (" ".join(words[:max(1, int(len(words) * cut[system]))]) if system in cut
                    else "zebra quantum lasagna orbit " * 3)
            rows.append({"example_id": f"e{k}", "system": system, "user_id": "u", "item_id": f"i{k}",
                         "explanation": text, "reference": ref})
    write_parquet_atomic(tmp_path / "expl.parquet", pa.Table.from_pylist(rows))
    out = tmp_path / "eval"
    cfg = EvaluateConfig(explanations=[str(tmp_path / "expl.parquet")], out=str(out), metrics=["overlap", "corpus"],
                         bootstrap=0, dataset="planted", models={})
    rep = run_evaluate(cfg, progress=lambda s: None)
    long = pq.read_table(out / "metric_correlations.parquet").to_pandas()
    sysl = long[long["over"] == "systems"].set_index(["metric_a", "metric_b"])
    # copy > most > half > junk on both: all 6 pairs of systems concordant, tau = 1.
    assert sysl.loc[("bleu-1", "rouge-1-r"), "tau"] == pytest.approx(1.0)
    assert sysl.loc[("bleu-1", "rouge-1-r"), "n"] == 4
    ex = long[long["over"] == "examples"]
    assert len(ex) and set(ex["n"]) <= {16} and not ex["metric_a"].isin(["bleu-1", "usr"]).any()
    for over in ("systems", "examples"):
        assert (out / f"metric_correlations_planted_{over}.png").read_bytes().startswith(PNG)
    assert (out / "metric_correlations.csv").is_file() and "Kendall τ over examples" in rep["correlations_md"]
    # The existing outputs are as before: report.json keys (and `task`, which says whether the
    # references were explanations or reviews), tables.md without correlations.
    import json

    report = json.loads((out / "report.json").read_text())
    assert set(report) == {
        "counts", "families_run", "skipped", "skipped_for_systems", "family_counts", "nli_service", "models",
        "elapsed_s", "task", "warnings"}
    assert report["task"] == "explanation"  # a plain explanations file with its own reference column
    assert "Kendall" not in (out / "tables.md").read_text()
    # A re-run (every family done) rebuilds the files from scores/aggregates alone.
    for p in out.glob("metric_correlations*"):
        p.unlink()
    run_evaluate(cfg, progress=lambda s: None)
    pd.testing.assert_frame_equal(pq.read_table(out / "metric_correlations.parquet").to_pandas(), long)
