"""The pairwise judge under transport faults, through the judge Serve app it starts: a
fifth of the calls failing (as a 503 would), the replica killed mid-job, and an outage on
one pair. Every pair ends in a verdict or a model-output reason, never a transport
error; what the outage left is done by a plain re-run, and the tables then equal a run
without faults."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from rexeval.failures import AwaitingRerun
from rexeval.pipelines.judge.config import PairwiseJobConfig
from rexeval.pipelines.judge.jobs import run_pairwise
from tests.pipelines.judge.test_jobs import _first, _has, _scripted, bench  # noqa: F401  (the fixture)
from tests.doubles.ports import free_port

VERDICT = "The first explains the item better.\n[[A]]"


def tables(root) -> tuple[pd.DataFrame, pd.DataFrame]:
    verdicts = pd.read_parquet(root / "verdicts.parquet")
    calls = pd.read_parquet(root / "calls.parquet").sort_values(["pair_id", "unit", "order"], ignore_index=True)
    return verdicts, calls


@pytest.mark.slow
def test_pairwise_heals_flaky_calls_and_a_killed_replica_and_an_outage_waits_for_a_rerun(bench, tmp_path):
    expl = pd.read_parquet(bench["explanations"])
    baseline = "ground_truth" if _has(bench, "ground_truth") else _first(bench)
    others = expl[expl["system"] != baseline].sort_values("example_id")
    killer, down = others["explanation"].iloc[0], others["explanation"].iloc[1]
    assert killer != down

    def config(name: str, **faults) -> PairwiseJobConfig:
        # The call holding `killer` kills the replica once when the flag exists; else
        # (and after the kill) it is answered "[]", unreadable, and asked again.
        options = {"rules": [[killer, "!exit"]], "default": VERDICT, "exit_flag": str(tmp_path / "kill"),
                   "exit_once": True, "backoff_s": 0.2, **faults}
        return PairwiseJobConfig(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=3,
                                 baseline=baseline, divide=False, chunk_size=2, out=str(tmp_path / name),
                                 serve_port=free_port(), **_scripted(tmp_path / f"{name}.jsonl", **options))

    quiet = {"progress": lambda m: None}
    ref = run_pairwise(config("ref"), **quiet)
    assert ref["pairs"] >= 3

    (tmp_path / "kill").write_text("once")
    (tmp_path / "outage").write_text("on")
    faulty = config("out", flaky=0.2, down_while=str(tmp_path / "outage"), down_for=down)
    lines: list[str] = []
    with pytest.raises(AwaitingRerun) as err:
        run_pairwise(faulty, progress=lines.append)
    assert not (tmp_path / "kill").exists(), "the replica was never killed"
    assert err.value.awaiting >= 1  # the outage's calls (and any the kill left)
    assert any("failed in transport" in line for line in lines), lines
    manifest = json.loads((tmp_path / "out" / "calls" / "manifest.json").read_text())
    assert manifest["status"] == "running" and manifest["awaiting_rerun"] == err.value.awaiting
    assert not (tmp_path / "out" / "verdicts.parquet").exists()  # nothing reported from a part

    (tmp_path / "outage").unlink()  # the endpoint is back: the same command finishes
    rep = run_pairwise(faulty, **quiet)
    assert rep["pairs"] == ref["pairs"] and rep["win_rates"] == ref["win_rates"]
    (v_ref, c_ref), (v_out, c_out) = tables(tmp_path / "ref"), tables(tmp_path / "out")
    pd.testing.assert_frame_equal(v_ref, v_out)
    pd.testing.assert_frame_equal(c_ref, c_out)
    # The killed call was read as a model answer ("[]"), asked again, then judged;
    # no call's reason is a transport failure.
    assert c_out["verdict"].notna().all()
    assert not c_out["problem"].fillna("").str.contains("503|flake|connection|replica", case=False).any()
