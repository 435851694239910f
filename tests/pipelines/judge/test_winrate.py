"""The win-rate study (seed 004, Figure 5 and Table 4) from hand-made pairwise folders:
both-order calls combined as `judge pairwise` combines them, plus reward-model verdicts."""
import json

import pandas as pd
import pytest

from rexeval.pipelines.judge.pairwise import PairwiseConfig, _combine
from rexeval.pipelines.judge.winrate import WinrateConfig, read_runs, run_winrate

KEYS = ["pair_id", "system", "baseline", "example_id", "user_id", "item_id"]
SYSTEMS, EXAMPLES, CRITERIA = ("sysA", "sysB"), ("e1", "e2", "e3"), ("reasoning", "clear_language")

# (system, example) -> {criterion: (verdict asked A/B, verdict asked B/A mapped back)}
CALLS = {
    ("sysA", "e1"): {"reasoning": ("A", "A"), "clear_language": ("A", "A")},    # A, A -> A
    ("sysA", "e2"): {"reasoning": ("A", "B"), "clear_language": ("B", "B")},    # C, B -> C (1:1)
    ("sysA", "e3"): {"reasoning": ("B", "B"), "clear_language": (None, "B")},   # B, B -> B
    ("sysB", "e1"): {"reasoning": ("A", "A"), "clear_language": ("A", "C")},    # A, C -> C (1:1)
    ("sysB", "e2"): {"reasoning": (None, None), "clear_language": (None, None)},  # unreadable
    ("sysB", "e3"): {"reasoning": ("A", "A"), "clear_language": ("A", "A")},    # A, A -> A
}
# the reward model's verdicts: (overall, reasoning, clear_language)
DISC = {
    ("sysA", "e1"): ("A", "A", "A"), ("sysA", "e2"): ("B", "B", "B"), ("sysA", "e3"): ("B", "B", "B"),
    ("sysB", "e1"): ("A", "A", "A"), ("sysB", "e2"): ("C", "A", "B"), ("sysB", "e3"): ("B", "B", "B"),
}


def _keys(baseline="base", systems=SYSTEMS):
    return pd.DataFrame([{"pair_id": f"{s}|{e}", "system": s, "baseline": baseline, "example_id": e,
                          "user_id": f"u{e[1:]}", "item_id": f"i{e[1:]}"} for s in systems for e in EXAMPLES])


def write_run(folder, baseline="base", systems=SYSTEMS, model="scripted-judge", disc=True):
    """A `judge pairwise` output folder: verdicts.parquet from both-order calls,
    calls.parquet, verdicts_disc.parquet (with score columns) and report.json."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = _keys(baseline, systems)
    calls = [(f"{s}|{e}", c, order, v) for (s, e), crits in CALLS.items() if s in systems
             for c, both in crits.items() for order, v in zip(("ab", "ba"), both)]
    detail = pd.DataFrame(calls, columns=["pair_id", "unit", "order", "verdict"])
    # An unreadable call is None, as `judge_pairwise` means it (an object column: pandas
    # would otherwise infer a string column and turn None into NaN).
    detail["verdict"] = pd.Series([c[3] for c in calls], dtype=object)
    verdicts = keys.merge(_combine(keys[["pair_id"]], detail, PairwiseConfig()), on="pair_id")
    verdicts.to_parquet(folder / "verdicts.parquet")
    detail.to_parquet(folder / "calls.parquet")
    if disc:
        rows = [{"pair_id": f"{s}|{e}", "verdict": v[0], "verdict_reasoning": v[1], "verdict_clear_language": v[2],
                 "score_a": 0.5, "score_b": 0.25, "score_a_reasoning": 1.0, "score_b_reasoning": 0.0}
                for (s, e), v in DISC.items() if s in systems]
        keys.merge(pd.DataFrame(rows), on="pair_id").to_parquet(folder / "verdicts_disc.parquet")
    (folder / "report.json").write_text(json.dumps({"job": "judge pairwise", "usage": {"model": model}}))
    return folder


def test_combined_verdicts_are_the_hand_worked_ones(tmp_path):
    v = pd.read_parquet(write_run(tmp_path / "run") / "verdicts.parquet").set_index("pair_id")

    def col(c):
        return [None if pd.isna(x) else x for x in v[c]]

    assert col("verdict") == ["A", "C", "B", "C", None, "A"]
    assert col("verdict_reasoning") == ["A", "C", "B", "A", None, "A"]
    assert col("verdict_clear_language") == ["A", "B", "B", "C", None, "A"]


def _counts(stats, judge, criterion, system):
    r = stats[(stats["judge"] == judge) & (stats["criterion"] == criterion) & (stats["system"] == system)]
    assert len(r) == 1
    r = r.iloc[0]
    return tuple(int(r[c]) for c in ("n", "unreadable", "wins", "ties", "losses"))


def test_winrate_report_counts_tables_and_figure(tmp_path):
    run = write_run(tmp_path / "run")
    out = tmp_path / "wr"
    rep = run_winrate(WinrateConfig(runs=[str(run)], out=str(out), resamples=200, baseline_label="PreferenceLogic"),
                      progress=lambda m: None)
    gen, disc = "ALERT-Gen (scripted-judge)", "ALERT-Disc"
    assert rep["judges"] == [gen, disc] and rep["baseline"] == "base"
    assert rep["criteria"] == ["overall", "reasoning", "clear_language"]
    stats = pd.read_csv(out / "winrate.csv")
    assert len(stats) == 2 * 3 * 2  # judges x criteria x systems
    # (n, unreadable, wins, ties, losses)
    assert _counts(stats, gen, "overall", "sysA") == (3, 0, 1, 1, 1)
    assert _counts(stats, gen, "overall", "sysB") == (2, 1, 1, 1, 0)
    assert _counts(stats, gen, "reasoning", "sysA") == (3, 0, 1, 1, 1)
    assert _counts(stats, gen, "reasoning", "sysB") == (2, 1, 2, 0, 0)
    assert _counts(stats, gen, "clear_language", "sysA") == (3, 0, 1, 0, 2)
    assert _counts(stats, gen, "clear_language", "sysB") == (2, 1, 1, 1, 0)
    assert _counts(stats, disc, "overall", "sysA") == (3, 0, 1, 0, 2)
    assert _counts(stats, disc, "overall", "sysB") == (3, 0, 1, 1, 1)
    assert _counts(stats, disc, "reasoning", "sysB") == (3, 0, 2, 0, 1)
    assert _counts(stats, disc, "clear_language", "sysB") == (3, 0, 1, 0, 2)
    row = stats[(stats["judge"] == gen) & (stats["criterion"] == "reasoning") & (stats["system"] == "sysB")].iloc[0]
    assert row["win_rate"] == 1.0 and (row["win_low"], row["win_high"]) == (1.0, 1.0)
    assert set(stats["baseline"]) == {"base"}
    assert not any(c.startswith("score") for c in stats["criterion"])

    table = (out / "table4.md").read_text()
    for col in ("Reasoning", "Clear language", "Overall"):
        assert col in table
    assert gen in table and disc in table
    t4 = pd.read_csv(out / "table4.csv").set_index(["judge", "system"])
    assert t4.loc[(gen, "sysB"), "Reasoning"].startswith("1.000 [1.00, 1.00]")
    assert t4.loc[(disc, "sysA"), "Overall"].startswith("0.333 [")

    md = (out / "winrate.md").read_text()
    assert "PreferenceLogic loses" in md and "PreferenceLogic wins" in md and "unreadable" in md
    assert (out / "figure5.png").stat().st_size > 0
    svg = (out / "figure5.svg").read_text()
    for text in ("sysA", "sysB", gen, disc, "PreferenceLogic loses", "PreferenceLogic wins", "tie"):
        assert text in svg, text
    report = json.loads((out / "report.json").read_text())
    assert report["counts"] == {"folders": 1, "judges": 2, "systems": 2, "criteria": 2, "verdicts": 12,
                                "unreadable": 1}
    assert report["settings"]["resamples"] == 200
    assert report["inputs"][0]["files"]["verdicts_disc.parquet"] == {"judge": disc, "pairs": 6}


def test_folders_per_system_batch_are_joined(tmp_path):
    a = write_run(tmp_path / "a", systems=("sysA",))
    b = write_run(tmp_path / "b", systems=("sysB",), disc=False)
    long, inputs = read_runs([a, b])
    assert len(inputs) == 2
    overall = long[long["criterion"] == "overall"]
    assert overall.groupby("judge")["system"].nunique().to_dict() == {"ALERT-Gen (scripted-judge)": 2,
                                                                       "ALERT-Disc": 1}


def test_clear_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty: holds (neither|none of) verdicts.parquet(,| nor) verdicts_disc.parquet"):
        read_runs([empty])
    a = write_run(tmp_path / "a", systems=("sysA",))
    b = write_run(tmp_path / "b", systems=("sysB",), baseline="other")
    with pytest.raises(ValueError, match="different baselines") as err:
        read_runs([a, b])
    assert "'base'" in str(err.value) and "'other'" in str(err.value)
    with pytest.raises(ValueError, match="judged more than once"):
        read_runs([a, a])
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_runs([tmp_path / "nowhere"])
    none = tmp_path / "none"
    none.mkdir()
    pd.DataFrame({c: pd.Series(dtype=object) for c in ("pair_id", "system", "baseline", "example_id", "user_id",
                                                       "item_id", "verdict")}).to_parquet(none / "verdicts.parquet")
    with pytest.raises(ValueError, match="hold no pair"):
        run_winrate(WinrateConfig(runs=[str(none)], out=str(tmp_path / "w")))


def test_winrate_records_a_settings_hash_for_provenance(tmp_path):
    """The study report shows it under Figure 5: the same settings give the same hash
    wherever the output goes, another interval setting another one."""
    run = write_run(tmp_path / "run")

    def digest(out, **kw):
        return run_winrate(WinrateConfig(runs=[str(run)], out=str(tmp_path / out), resamples=50, **kw),
                           progress=lambda m: None)["config_hash"]

    a = digest("a")
    assert len(a) == 16 and a == digest("b") and a != digest("c", seed=1)
    assert json.loads((tmp_path / "a" / "report.json").read_text())["config_hash"] == a
