"""Seed 004's Table 6 from `judge winrate --repeats`: three pairwise folders that judged the
same pairs, whose overall verdicts differ where planted; kappa and alpha equal sklearn's and
the krippendorff package's on the aligned verdicts, and the win rates are those of `runs`."""
from __future__ import annotations

import itertools
import json

import krippendorff
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from rexeval.pipelines.judge.winrate import WinrateConfig, run_winrate
from tests.pipelines.judge.test_winrate import write_run

# Run 1's overall verdicts (test_winrate's hand-worked ones), in pair order sysA|e1..e3,
# sysB|e1..e3; runs 2 and 3 change some and miss one.
RUN1 = ["A", "C", "B", "C", None, "A"]
RUN2 = ["B", "C", "B", "C", "A", "A"]
RUN3 = ["A", "C", "A", "C", None, "C"]


def _rewrite(folder, verdicts):
    v = pd.read_parquet(folder / "verdicts.parquet")
    v["verdict"] = pd.Series(verdicts, dtype=object)
    v.to_parquet(folder / "verdicts.parquet")
    return folder


def test_table6_equals_sklearn_and_krippendorff(tmp_path):
    runs = [_rewrite(write_run(tmp_path / f"run{k}"), v) for k, v in enumerate((RUN1, RUN2, RUN3), 1)]
    alone = run_winrate(WinrateConfig(runs=[str(runs[0])], out=str(tmp_path / "alone"), resamples=0),
                        progress=lambda _: None)
    got = run_winrate(WinrateConfig(runs=[str(runs[0])], repeats=[str(r) for r in runs[1:]],
                                    out=str(tmp_path / "wr"), resamples=0), progress=lambda _: None)
    pd.testing.assert_frame_equal(pd.DataFrame(got["overall"]), pd.DataFrame(alone["overall"]))  # run 1's
    t6 = pd.read_csv(tmp_path / "wr" / "table6.csv").set_index("judge")
    gen = t6.loc["ALERT-Gen (scripted-judge)"]
    labelled = [RUN1, RUN2, RUN3]
    kappas = []
    for a, b in itertools.combinations(labelled, 2):
        both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
        kappas.append(cohen_kappa_score([x for x, _ in both], [y for _, y in both]))
    data = np.array([[np.nan if v is None else "ABC".index(v) for v in r] for r in labelled], dtype=float)
    assert gen["kappa"] == pytest.approx(np.mean(kappas), abs=1e-9)
    assert [gen["kappa_1_2"], gen["kappa_1_3"], gen["kappa_2_3"]] == pytest.approx(kappas, abs=1e-9)
    assert gen["alpha"] == pytest.approx(krippendorff.alpha(reliability_data=data, level_of_measurement="nominal"),
                                         abs=1e-9)
    assert (gen["runs"], gen["pairs"], gen["complete"]) == (3, 6, 5)
    # The reward model gave the same verdicts in every folder: it agrees with itself fully.
    disc = t6.loc["ALERT-Disc"]
    assert disc["kappa"] == pytest.approx(1.0) and disc["alpha"] == pytest.approx(1.0)
    md = (tmp_path / "wr" / "table6.md").read_text()
    assert f"| ALERT-Gen (scripted-judge) | 3 | 6 | {np.mean(kappas):.3f} |" in md
    assert json.loads((tmp_path / "wr" / "report.json").read_text())["table6"][0]["runs"] == 3
    assert not (tmp_path / "alone" / "table6.md").exists()


def test_a_repeat_against_another_baseline_is_refused(tmp_path):
    one = write_run(tmp_path / "one")
    other = write_run(tmp_path / "other", baseline="else")
    with pytest.raises(ValueError, match="compare against"):
        run_winrate(WinrateConfig(runs=[str(one)], repeats=[str(other)], out=str(tmp_path / "wr"), resamples=0),
                    progress=lambda _: None)


def test_repeats_through_the_cli(tmp_path):
    from click.testing import CliRunner

    from rexeval.ray_jobs.cli import cli

    runs = [_rewrite(write_run(tmp_path / f"run{k}"), v) for k, v in enumerate((RUN1, RUN2, RUN3), 1)]
    res = CliRunner().invoke(cli, ["judge", "winrate", str(runs[0]), "--repeat", str(runs[1]), "--repeat",
                                   str(runs[2]), "--resamples", "0", "--out", str(tmp_path / "wr")])
    assert res.exit_code == 0, res.output
    assert len(pd.read_csv(tmp_path / "wr" / "table6.csv")) == 2


def test_the_study_report_shows_table6(tmp_path):
    from rexeval.pipelines.core.io import write_json_atomic
    from rexeval.pipelines.study.report import build_report, render_markdown

    runs = [_rewrite(write_run(tmp_path / f"run{k}"), v) for k, v in enumerate((RUN1, RUN2, RUN3), 1)]
    d = tmp_path / "study"
    run_winrate(WinrateConfig(runs=[str(runs[0])], repeats=[str(r) for r in runs[1:]], out=str(d / "table6"),
                              resamples=0), progress=lambda _: None)
    write_json_atomic(d / "study.json", {
        "name": "planted", "file": "/x/s.yaml", "profile": "paper", "out": str(d), "steps": {
            "table6": {"step": "table6", "job": "judge_winrate", "dataset": None, "out": str(d / "table6"),
                       "status": "complete", "fingerprint": "f", "settings": {},
                       "finished": "2025-11-25T10:00:00+00:00"}}})
    report = build_report(d)
    assert any(t.title.startswith("Table 6: the judge's agreement with itself") for t in report.tables())
    t6 = pd.read_csv(d / "table6" / "table6.csv")
    assert f"{t6['kappa'].iloc[0]:.3f}" in render_markdown(report)
