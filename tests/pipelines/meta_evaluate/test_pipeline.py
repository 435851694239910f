"""The meta-evaluate job: reading, joining, pairing columns, error rows, the null
policy, and the written tables, checked against numpy/scipy/sklearn directly."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from scipy import stats
from sklearn.metrics import cohen_kappa_score

from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.inputs import read_input, read_number, read_verdict, resolve_targets
from rexeval.pipelines.core.schema import ERRORS, SchemaError

ONE_TABLE = """user_id,item_id,system,judge_persuasiveness,human_persuasiveness,judge_transparency,human_transparency
u1,i1,s1,4,5,3,2
u1,i1,s2,2,2,,3
u1,i2,s1,5,4,4,4
u1,i2,s2,1,1,2,seven
u2,i1,s1,3,3,1,
u2,i1,s2,3,2,5,5
u2,i2,s1,4,5,2,1
u2,i2,s2,2,1,3,3
u2,i2,s2,2,1,3,3
"""


def write(path, text):
    path.write_text(text)
    return path


def run(tmp_path, **settings):
    cfg = MetaEvaluateConfig(out=str(tmp_path / "out"), bootstrap=settings.pop("bootstrap", 100), **settings)
    report = run_meta_evaluate(cfg)
    results = pd.read_parquet(tmp_path / "out" / "meta_evaluation.parquet")
    return report, results


def cell(results, evaluator, aspect, level, method="pearson"):
    r = results[(results.evaluator == evaluator) & (results.aspect == aspect) & (results.level == level)
                & (results.method == method)]
    assert len(r) == 1
    return r.iloc[0]


# ------------------------------------------------------------------ one table


def test_one_table_with_null_policy_bad_value_and_duplicate(tmp_path):
    src = write(tmp_path / "one.csv", ONE_TABLE)
    report, results = run(tmp_path, scores=str(src))
    # The repeated last row is an error; 8 rows remain.
    assert report["counts"]["joined"] == 8 and report["counts"]["duplicate_key"] == 1
    # Persuasiveness has no gaps: plain correlations over the 8 rows.
    j = [4, 2, 5, 1, 3, 3, 4, 2]
    h = [5, 2, 4, 1, 3, 2, 5, 1]
    assert cell(results, "judge", "persuasiveness", "dataset")["value"] == pytest.approx(np.corrcoef(j, h)[0, 1])
    assert cell(results, "judge", "persuasiveness", "dataset", "kendall")["value"] == pytest.approx(
        stats.kendalltau(j, h).statistic)
    per_user = [np.corrcoef(j[:4], h[:4])[0, 1], np.corrcoef(j[4:], h[4:])[0, 1]]
    assert cell(results, "judge", "persuasiveness", "user")["value"] == pytest.approx(np.mean(per_user))
    # Transparency: "seven" (u1/i2/s2) leaves its row out; the missing judge score
    # (u1/i1/s2) becomes 0 and the missing human rating (u2/i1/s1) becomes 3.
    jt = [3, 0, 4, 1, 5, 2, 3]
    ht = [2, 3, 4, 3, 5, 1, 3]
    row = cell(results, "judge", "transparency", "dataset")
    assert row["value"] == pytest.approx(np.corrcoef(jt, ht)[0, 1]) and row["n_rows"] == 7
    target = {t["aspect"]: t for t in report["targets"]}["transparency"]
    assert (target["rows"], target["bad_values"], target["human_filled"], target["judge_filled"]) == (7, 1, 1, 1)
    assert (report["counts"]["human_filled"], report["counts"]["judge_filled"]) == (1, 1)
    errors = pq.read_table(tmp_path / "out" / "errors.parquet")
    assert errors.schema.equals(ERRORS)
    rows = {r["error_type"]: r for r in errors.to_pylist()}
    assert rows["bad_value"]["field"] == "human_transparency" and rows["bad_value"]["row_id"] == "u1/i2/s2"
    assert f"{src}, row 4, field 'human_transparency': not a number: 'seven'" in rows["bad_value"]["message"]
    assert "row 9" in rows["duplicate_key"]["message"] and rows["duplicate_key"]["source"] == str(src)


def test_drop_policy_and_pair_level_groups(tmp_path):
    src = write(tmp_path / "one.csv", ONE_TABLE)
    report, results = run(tmp_path, scores=str(src), human_null="drop", judge_null="drop",
                          aspects=["transparency"], methods=["pearson"])
    jt, ht = [3, 4, 5, 2, 3], [2, 4, 5, 1, 3]  # both gaps dropped, "seven" left out
    assert cell(results, "judge", "transparency", "dataset")["value"] == pytest.approx(np.corrcoef(jt, ht)[0, 1])
    assert report["counts"]["dropped_null"] == 2 and report["counts"]["human_filled"] == 0
    # Pairs left: (u1,i1) one row, (u1,i2) one row, (u2,i1) one row, (u2,i2) x = 2 3,
    # y = 1 3: only (u2, i2) has a correlation, and it is +1.
    pair = cell(results, "judge", "transparency", "pair")
    assert (pair["value"], pair["n_groups_used"], pair["n_groups_total"]) == (1.0, 1, 4)
    assert set(results["method"]) == {"pearson"} and set(results["aspect"]) == {"transparency"}


def test_markdown_has_seed_001_layout(tmp_path):
    src = write(tmp_path / "one.csv", ONE_TABLE)
    run(tmp_path, scores=str(src), methods=["pearson"], bootstrap=0)
    md = (tmp_path / "out" / "meta_evaluation.md").read_text()
    j, h = [4, 2, 5, 1, 3, 3, 4, 2], [5, 2, 4, 1, 3, 2, 5, 1]
    dataset = np.corrcoef(j, h)[0, 1] * 100
    assert "| Evaluator | persuasiveness | transparency | Average |" in md
    line = next(x for x in md.splitlines() if x.startswith("| judge | "))
    assert line.split(" | ")[1].startswith(f"{dataset:.2f} / ")
    assert len(line.split(" | ")[1].split(" / ")) == 3


# ------------------------------------------------------------------ two tables


def test_two_tables_join_and_report_unmatched_rows(tmp_path):
    judge = pd.DataFrame({"user_id": ["u1", "u1", "u1", "u2", "u2", "u9"], "item_id": ["a"] * 6,
                          "explanation_id": ["e1", "e2", "e3", "e1", "e2", "e1"],
                          "gpt4_accuracy": [1.0, 3.0, 2.0, 5.0, None, 4.0],
                          "bleu_accuracy": [0.1, 0.3, 0.2, 0.4, 0.2, 0.9]})
    judge.to_parquet(tmp_path / "judge.parquet")
    human = [{"user_id": "u1", "item_id": "a", "explanation_id": e, "human_accuracy": v}
             for e, v in (("e1", 2), ("e2", 3), ("e3", 1))]
    human += [{"user_id": "u2", "item_id": "a", "explanation_id": "e1", "human_accuracy": 4},
              {"user_id": "u2", "item_id": "a", "explanation_id": "e2", "human_accuracy": 1},
              {"user_id": "u3", "item_id": "a", "explanation_id": "e1", "human_accuracy": 5}]
    (tmp_path / "human.jsonl").write_text("\n".join(json.dumps(r) for r in human) + "\n")
    report, results = run(tmp_path, scores=str(tmp_path / "judge.parquet"), human=str(tmp_path / "human.jsonl"),
                          judge_prefixes=["gpt4_", "bleu_"])
    c = report["counts"]
    assert (c["rows_scores"], c["rows_human"], c["joined"], c["unmatched_scores"], c["unmatched_human"]) == (6, 6, 5, 1,
                                                                                                            1)
    errors = pd.read_parquet(tmp_path / "out" / "errors.parquet")
    by_source = errors.set_index("source")
    assert by_source.loc[str(tmp_path / "judge.parquet"), "row_id"] == "u9/a/e1"
    assert by_source.loc[str(tmp_path / "human.jsonl"), "line"] == 6  # the JSON line of u3
    assert set(errors["error_type"]) == {"unmatched_row"}
    # gpt4: u2/e2 was not parsed (None) and becomes 0.
    gpt4 = [1, 3, 2, 5, 0]
    hum = [2, 3, 1, 4, 1]
    assert cell(results, "gpt4", "accuracy", "dataset", "spearman")["value"] == pytest.approx(
        stats.spearmanr(gpt4, hum).statistic)
    bleu = [0.1, 0.3, 0.2, 0.4, 0.2]
    assert cell(results, "bleu", "accuracy", "user")["value"] == pytest.approx(
        (np.corrcoef(bleu[:3], hum[:3])[0, 1] + np.corrcoef(bleu[3:], hum[3:])[0, 1]) / 2)
    assert {t["evaluator"]: t["judge_filled"] for t in report["targets"]} == {"gpt4": 1, "bleu": 0}


def test_pairwise_mode_against_sklearn(tmp_path):
    judge = ["[[A]]", "B", "C", "a", "D", None, "A", "B"]
    human = ["A", "A", "C", "A", "B", "B", "B", "B"]
    rows = [{"user_id": f"u{i}", "item_id": "x", "pair_id": f"p{i}", "judge_verdict": j, "human_verdict": h}
            for i, (j, h) in enumerate(zip(judge, human))]
    pd.DataFrame(rows).to_csv(tmp_path / "v.csv", index=False)
    report, _ = run(tmp_path, scores=str(tmp_path / "v.csv"), mode="pairwise", bootstrap=50)
    results = pd.read_parquet(tmp_path / "out" / "meta_evaluation.parquet")
    # "D" is an error row, None is a missing label: 6 items with ties, 5 without (item 2 is C/C).
    j_ok, h_ok = ["A", "B", "C", "A", "A", "B"], ["A", "A", "C", "A", "B", "B"]
    with_ties = results[results.ties].set_index("metric")
    assert with_ties.loc["accuracy", "value"] == pytest.approx(4 / 6)
    assert with_ties.loc["cohen_kappa", "value"] == pytest.approx(cohen_kappa_score(h_ok, j_ok))
    assert (with_ties.loc["accuracy", "n_used"], with_ties.loc["accuracy", "n_missing"]) == (6, 1)
    no_ties = results[~results.ties].set_index("metric")
    keep = [(j, h) for j, h in zip(j_ok, h_ok) if "C" not in (j, h)]
    assert no_ties.loc["cohen_kappa", "value"] == pytest.approx(cohen_kappa_score([h for _, h in keep],
                                                                                  [j for j, _ in keep]))
    assert no_ties.loc["accuracy", "n_used"] == 5
    assert (report["counts"]["bad_values"], report["counts"]["missing_labels"], report["counts"]["tie_dropped"]) == (
        1, 1, 1)
    md = (tmp_path / "out" / "meta_evaluation.md").read_text()
    assert "| judge | 0.667 |" in md and "ACC w/o tie" in md


# ------------------------------------------------------------------ pieces


def test_read_input_formats_and_errors(tmp_path):
    df = pd.DataFrame({"user_id": ["007"], "x": [1.5]})
    df.to_csv(tmp_path / "a.csv", index=False)
    df.to_csv(tmp_path / "a.tsv", index=False, sep="\t")
    (tmp_path / "parts").mkdir()
    df.to_parquet(tmp_path / "parts" / "part-0.parquet")
    df.to_parquet(tmp_path / "parts" / "part-1.parquet")
    assert read_input(tmp_path / "a.csv").df["user_id"].tolist() == ["007"]
    assert read_input(tmp_path / "a.tsv").df["x"].tolist() == ["1.5"]
    folder = read_input(tmp_path / "parts")
    assert len(folder.df) == 2 and folder.where(1) == f"{tmp_path / 'parts'}, row 2"
    (tmp_path / "b.jsonl").write_text('{"user_id": "u"}\n\n{"user_id": "v"}\n')
    assert read_input(tmp_path / "b.jsonl").where(1).endswith("line 3")
    with pytest.raises(SchemaError, match=r"c\.xlsx: not a table in a format rexeval reads \(parquet, csv, tsv, jsonl"):
        read_input(write(tmp_path / "c.xlsx", "x"))
    with pytest.raises(SchemaError, match="empty"):
        read_input(write(tmp_path / "d.csv", ""))
    with pytest.raises(FileNotFoundError):
        read_input(tmp_path / "nope.csv")


def test_readers_of_values():
    assert [read_number(v) for v in (3, "4", " 2.5 ", np.int64(1))] == [3.0, 4.0, 2.5, 1.0]
    assert all(math.isnan(read_number(v)) for v in (None, "", "NaN", float("nan"), pd.NA))
    for bad in ("seven", True, "inf", [1]):
        with pytest.raises(ValueError, match="not a"):
            read_number(bad)
    assert [read_verdict(v) for v in ("A", " b ", "[[C]]", "tie", None, "")] == ["A", "B", "C", "C", None, None]
    with pytest.raises(ValueError, match="not a verdict"):
        read_verdict("D")


def test_resolve_targets_by_prefix_pairs_and_errors():
    cols = ["user_id", "item_id", "system", "gpt4_pers", "gpt4_trans", "qwen_pers", "human_pers", "human_trans"]
    keys = ["user_id", "item_id", "system"]
    cfg = MetaEvaluateConfig(scores="f", out="o", judge_prefixes=["gpt4_", "qwen_"])
    got = resolve_targets(cfg, cols, cols, keys, "f", "f")
    assert [(t.evaluator, t.aspect, t.judge_col, t.human_col) for t in got] == [
        ("gpt4", "pers", "gpt4_pers", "human_pers"), ("gpt4", "trans", "gpt4_trans", "human_trans"),
        ("qwen", "pers", "qwen_pers", "human_pers")]
    cfg = MetaEvaluateConfig(scores="f", out="o", judge_cols=["qwen_pers"], human_cols=["human_pers"])
    assert resolve_targets(cfg, cols, cols, keys, "f", "f")[0][:2] == ("qwen", "pers")
    cfg = MetaEvaluateConfig(scores="f", out="o", judge_prefixes=["qwen_"], aspects=["trans"])
    with pytest.raises(SchemaError, match="f, field 'qwen_trans': evaluator column is missing"):
        resolve_targets(cfg, cols, cols, keys, "f", "f")
    cfg = MetaEvaluateConfig(scores="f", out="o")
    with pytest.raises(SchemaError, match="no aspect columns found"):
        resolve_targets(cfg, cols, cols, keys, "f", "f")


def test_config_checks():
    with pytest.raises(ValueError, match="one human column per judge column"):
        MetaEvaluateConfig(scores="f", out="o", judge_cols=["a"], human_cols=[])
    with pytest.raises(ValueError, match="table_method"):
        MetaEvaluateConfig(scores="f", out="o", methods=["kendall"], table_method="pearson")
    assert MetaEvaluateConfig(scores="f", out="o", methods=["kendall"]).shown_method == "kendall"
    with pytest.raises(ValueError):
        MetaEvaluateConfig(scores="f", out="o", human_null="zero")


def test_missing_key_column_and_missing_key_value(tmp_path):
    src = write(tmp_path / "k.csv", "user_id,item_id,judge_a,human_a\nu,i,1,2\n")
    with pytest.raises(SchemaError, match="no explanation key column"):
        run(tmp_path, scores=str(src))
    with pytest.raises(SchemaError, match="k.csv, field 'sys': required key column is missing"):
        run(tmp_path, scores=str(src), key="sys")
    src = write(tmp_path / "m.csv", "user_id,item_id,system,judge_a,human_a\nu,i,s,1,2\n,i,t,2,3\nu,i,t,3,3\n")
    report, _ = run(tmp_path, scores=str(src))
    assert report["counts"]["missing_key"] == 1 and report["counts"]["joined"] == 2
    err = pd.read_parquet(tmp_path / "out" / "errors.parquet").iloc[0]
    assert (err["field"], err["error_type"]) == ("user_id", "missing_key")


def test_output_folder_guards_and_stale_errors(tmp_path):
    src = write(tmp_path / "one.csv", ONE_TABLE)
    out = tmp_path / "out"
    run(tmp_path, scores=str(src), methods=["pearson"], bootstrap=0)
    assert (out / "errors.parquet").exists()
    with pytest.raises(FileExistsError, match="another config"):
        run(tmp_path, scores=str(src), methods=["kendall"], bootstrap=0)
    clean = write(tmp_path / "clean.csv", "\n".join(ONE_TABLE.splitlines()[:4]) + "\n")
    cfg = MetaEvaluateConfig(scores=str(clean), out=str(out), methods=["kendall"], bootstrap=0)
    report = run_meta_evaluate(cfg, overwrite=True)
    assert not (out / "errors.parquet").exists() and "errors.parquet" not in report["outputs"]
    assert json.loads((out / "report.json").read_text())["config"]["methods"] == ["kendall"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        run_meta_evaluate(MetaEvaluateConfig(scores=str(clean), out=str(other)))


def test_a_run_killed_before_its_report_is_taken_over(tmp_path):
    """Killed between its tables and report.json (a study resumes such a step): the
    folder holds only this job's own files, so the re-run writes into it; one foreign
    file beside them still stops it."""
    src = write(tmp_path / "one.csv", ONE_TABLE)
    first, table = run(tmp_path, scores=str(src), methods=["pearson"], bootstrap=0)
    out = tmp_path / "out"
    (out / "report.json").unlink()
    (out / ".meta_evaluation.parquet.x1y2.tmp").write_bytes(b"PAR")
    again, table2 = run(tmp_path, scores=str(src), methods=["pearson"], bootstrap=0)
    pd.testing.assert_frame_equal(table, table2)
    assert again["counts"] == first["counts"] and (out / "report.json").is_file()
    assert not list(out.glob(".*.tmp"))
    (out / "report.json").unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        run(tmp_path, scores=str(src), methods=["pearson"], bootstrap=0)
    assert (out / "notes.txt").read_text() == "mine"


def test_random_baseline_is_seeded(tmp_path):
    src = write(tmp_path / "one.csv", ONE_TABLE)
    _, a = run(tmp_path, scores=str(src), random_baseline=True, methods=["pearson"], bootstrap=0)
    rand = a[a.evaluator == "random"]
    assert len(rand) == 6 and set(rand["aspect"]) == {"persuasiveness", "transparency"}
    _, b = run(tmp_path, scores=str(src), random_baseline=True, methods=["pearson"], bootstrap=0)
    pd.testing.assert_frame_equal(a, b)


# ------------------------------------------------------------------ our judge jobs' files

# Eight explanations (user, item, system) in a fixed order; two judges whose names are
# not column-safe; NaN = an answer the judge job could not read.
EXPLANATIONS = [(u, i, s) for u in ("u1", "u2") for i in ("i1", "i2") for s in ("s1", "s2")]
NAN = float("nan")
LONG_SCORES = {
    ("org/model-a", "persuasiveness"): [4, 2, NAN, 1, 3, 3, 4, 2],
    ("org/model-a", "transparency"): [3, 1, 4, 2, 5, NAN, 2, 3],
    ("model_b", "persuasiveness"): [5, 1, 4, 2, 2, 4, 5, 1],
    ("model_b", "transparency"): [NAN, NAN, 3, 3, 4, 2, 1, 5],
}
HUMAN = {"persuasiveness": [5, 2, 4, 1, 3, 2, 5, 1], "transparency": [2, 3, 4, 2, 5, 1, None, 3]}


def likert_long() -> pd.DataFrame:
    """Scores shaped like `rexeval judge likert`'s likert_scores.parquet, rows shuffled."""
    rows = []
    for (judge, aspect), scores in LONG_SCORES.items():
        for (u, i, s), score in zip(EXPLANATIONS, scores):
            rows.append({"example_id": f"{u}-{i}", "system": s, "user_id": u, "item_id": i, "judge": judge,
                         "aspect": aspect, "score": float(score), "shots": "zero", "shot_example": None,
                         "problem": None if score == score else "no number in the answer", "raw": "{}"})
    df = pd.DataFrame(rows).astype({"problem": "string", "shot_example": "string", "raw": "string"})
    return df.sample(frac=1.0, random_state=0).reset_index(drop=True)


def human_ratings(path, example_id: bool = False):
    """The human side: one row per explanation, keyed by user, item, system (and example_id)."""
    df = pd.DataFrame(EXPLANATIONS, columns=["user_id", "item_id", "system"])
    if example_id:
        df.insert(0, "example_id", df["user_id"] + "-" + df["item_id"])
    for aspect, values in HUMAN.items():
        df[f"human_{aspect}"] = values
    df.to_csv(path, index=False)
    return path


def expected(judge: str, aspect: str) -> tuple[list[float], list[float]]:
    """The hand-pivoted pair after seed 001's null policy (judge NaN -> 0, human gap -> 3)."""
    j = [0.0 if v != v else float(v) for v in LONG_SCORES[(judge, aspect)]]
    h = [3.0 if v is None else float(v) for v in HUMAN[aspect]]
    return j, h


def test_long_likert_scores_are_pivoted_one_evaluator_per_judge(tmp_path):
    likert_long().to_parquet(tmp_path / "likert_scores.parquet")
    human = human_ratings(tmp_path / "human.csv")
    report, results = run(tmp_path, scores=str(tmp_path / "likert_scores.parquet"), human=str(human))
    assert report["layout"] == "long" and report["keys"] == ["user_id", "item_id", "system"]
    c = report["counts"]
    assert (c["long_rows"], c["rows_scores"], c["joined"], c["errors"], c["absent_scores"]) == (32, 8, 8, 0, 0)
    assert set(results["evaluator"]) == {"org/model-a", "model_b"}
    for (judge, aspect) in LONG_SCORES:
        j, h = expected(judge, aspect)
        assert cell(results, judge, aspect, "dataset")["value"] == pytest.approx(stats.pearsonr(j, h).statistic)
        assert cell(results, judge, aspect, "dataset", "spearman")["value"] == pytest.approx(
            stats.spearmanr(j, h).statistic)
        assert cell(results, judge, aspect, "dataset", "kendall")["value"] == pytest.approx(
            stats.kendalltau(j, h).statistic)
    filled = {(t["evaluator"], t["aspect"]): (t["judge_filled"], t["human_filled"]) for t in report["targets"]}
    assert filled == {("org/model-a", "persuasiveness"): (1, 0), ("org/model-a", "transparency"): (1, 1),
                      ("model_b", "persuasiveness"): (0, 0), ("model_b", "transparency"): (2, 1)}
    md = (tmp_path / "out" / "meta_evaluation.md").read_text()
    assert "| org/model-a | " in md and "| model_b | " in md


def test_long_scores_join_on_example_id_and_report_bad_rows(tmp_path):
    long = likert_long()
    first = long.index[(long.judge == "model_b") & (long.aspect == "persuasiveness")
                       & (long.example_id == "u1-i1") & (long.system == "s1")][0]
    repeat = long.loc[[first]].assign(score=1.0)  # a second run's score for the same cell
    nameless = long.loc[[0]].assign(judge=None)
    long = pd.concat([long, repeat, nameless], ignore_index=True).astype({"score": object})
    seven = long.index[(long.judge == "org/model-a") & (long.aspect == "transparency")
                       & (long.example_id == "u2-i2") & (long.system == "s2")][0]
    long.loc[seven, "score"] = "seven"
    long.astype({"score": str}).to_csv(tmp_path / "long.csv", index=False)
    human = human_ratings(tmp_path / "human.csv", example_id=True)
    report, results = run(tmp_path, scores=str(tmp_path / "long.csv"), human=str(human), methods=["pearson"])
    assert report["keys"] == ["example_id", "system"]
    errors = pd.read_parquet(tmp_path / "out" / "errors.parquet").set_index("error_type")
    src = tmp_path / "long.csv"
    assert errors.loc["duplicate_key", "field"] == "score"
    assert errors.loc["duplicate_key", "message"].startswith(f"{src}, row 33, field 'score': repeats judge 'model_b'")
    assert errors.loc["missing_key", "field"] == "judge"
    assert errors.loc["bad_value", "message"] == (f"{src}, row {seven + 1} (judge 'org/model-a', aspect "
                                                  "'transparency'), field 'score': not a number: 'seven'")
    # The first score is used; "seven" leaves only its own cell out.
    j, h = expected("model_b", "persuasiveness")
    assert cell(results, "model_b", "persuasiveness", "dataset")["value"] == pytest.approx(np.corrcoef(j, h)[0, 1])
    j, h = expected("org/model-a", "transparency")
    assert cell(results, "org/model-a", "transparency", "dataset")["value"] == pytest.approx(
        np.corrcoef(j[:-1], h[:-1])[0, 1])


def test_long_scores_absent_cells_and_settings_that_do_not_apply(tmp_path):
    long = likert_long()
    gone = (long.judge == "model_b") & (long.aspect == "transparency") & (long.system == "s2")
    long[~gone].to_parquet(tmp_path / "l.parquet")
    human = human_ratings(tmp_path / "h.csv")
    report, _ = run(tmp_path, scores=str(tmp_path / "l.parquet"), human=str(human), aspects=["transparency"],
                    judge_null="drop", bootstrap=0)
    assert report["counts"]["absent_scores"] == 4
    target = {t["evaluator"]: t for t in report["targets"]}["model_b"]
    # judge_null=drop: the four absent s2 cells and the NaN of (u1, i1, s1) are dropped.
    assert (target["rows"], target["dropped_null"]) == (3, 5)
    for bad in ({"mode": "pairwise"}, {"judge_prefixes": ["gpt4_"]}, {"evaluator": "x"}):
        with pytest.raises(ValueError, match="long-format"):
            run(tmp_path, scores=str(tmp_path / "l.parquet"), human=str(human), **bad)
    with pytest.raises(SchemaError, match="no human column for the scored aspects"):
        run(tmp_path, scores=str(tmp_path / "l.parquet"))


def verdicts_frame() -> tuple[pd.DataFrame, list[str], list[str], list[str], list[str]]:
    """Shaped like `rexeval judge pairwise`'s verdicts.parquet, and the human preferences."""
    judge = ["A", "B", "C", "A", None, "A", "B", "B"]
    clarity = ["A", "A", "B", "C", "A", "B", "B", "A"]
    human = ["A", "A", "C", "A", "B", "B", "B", "B"]
    human_clarity = ["A", "B", "B", "C", "A", "B", "A", "A"]
    examples = [f"u{n // 2}-i{n % 2}" for n in range(4)]
    rows = [{"pair_id": f"{s}|{e}", "system": s, "baseline": "base", "example_id": e, "user_id": e.split("-")[0],
             "item_id": e.split("-")[1]} for e in examples for s in ("s1", "s2")]
    df = pd.DataFrame(rows).assign(verdict=judge, verdict_clarity=clarity)
    return df, judge, clarity, human, human_clarity


def test_pairwise_verdicts_file_joins_a_human_preference_file(tmp_path):
    df, judge, clarity, human, human_clarity = verdicts_frame()
    df.to_parquet(tmp_path / "verdicts.parquet")
    pref = df[["example_id", "system"]].assign(human_verdict=human, human_verdict_clarity=human_clarity)
    pref.iloc[::-1].to_csv(tmp_path / "prefs.csv", index=False)  # order does not matter
    report, results = run(tmp_path, scores=str(tmp_path / "verdicts.parquet"), human=str(tmp_path / "prefs.csv"),
                          mode="pairwise", evaluator="qwen", bootstrap=0)
    assert report["layout"] == "verdicts" and report["keys"] == ["example_id", "system"]
    assert report["counts"]["joined"] == 8 and report["counts"]["missing_labels"] == 1
    with_ties = results[results.ties].set_index(["aspect", "metric"])
    keep = [n for n, v in enumerate(judge) if v is not None]
    assert with_ties.loc[("overall", "cohen_kappa"), "value"] == pytest.approx(
        cohen_kappa_score([human[n] for n in keep], [judge[n] for n in keep]))
    assert with_ties.loc[("clarity", "accuracy"), "value"] == pytest.approx(
        np.mean([a == b for a, b in zip(clarity, human_clarity)]))
    assert set(results["evaluator"]) == {"qwen"}
    # Without example_id on the human side the rows match on user, item and system.
    pref = df[["user_id", "item_id", "system"]].assign(human_verdict=human)
    pref.to_csv(tmp_path / "prefs2.csv", index=False)
    cfg = MetaEvaluateConfig(scores=str(tmp_path / "verdicts.parquet"), human=str(tmp_path / "prefs2.csv"),
                             out=str(tmp_path / "out2"), mode="pairwise", bootstrap=0)
    report = run_meta_evaluate(cfg)
    assert report["keys"] == ["user_id", "item_id", "system"] and [t["aspect"] for t in report["targets"]] == [
        "overall"]
    with pytest.raises(ValueError, match="need --mode pairwise"):
        run(tmp_path, scores=str(tmp_path / "verdicts.parquet"), human=str(tmp_path / "prefs.csv"))
