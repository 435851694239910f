"""What a careless or hostile input does to `rexeval meta-evaluate`: an undefined (NaN)
correlation says why, in the results, the printed table, the report and a warning; two
files that share no row are refused, naming both, the keys and a few ids of each; a
missing column is blamed on the file that lacks it; a damaged Parquet file is named."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.meta_evaluate.config import MetaEvaluateConfig
from rexeval.pipelines.meta_evaluate.inputs import read_input
from rexeval.pipelines.meta_evaluate.pipeline import run_meta_evaluate

SCORES = "user_id,item_id,system,judge_p\nu1,i1,a,1\nu1,i1,b,2\nu2,i1,a,3\nu2,i1,b,4\n"
CONSTANT = "user_id,item_id,system,human_p\nu1,i1,a,3\nu1,i1,b,3\nu2,i1,a,3\nu2,i1,b,3\n"


def write(path, text):
    path.write_text(text)
    return str(path)


def run(tmp_path, said=None, **settings):
    cfg = MetaEvaluateConfig(**{"out": str(tmp_path / "out"), "bootstrap": 20, **settings})
    return run_meta_evaluate(cfg, progress=(said.append if said is not None else lambda s: None))


def test_constant_human_ratings_say_why_the_correlation_is_undefined(tmp_path):
    said: list[str] = []
    report = run(tmp_path, said, scores=write(tmp_path / "s.csv", SCORES), human=write(tmp_path / "h.csv", CONSTANT))
    results = pd.read_parquet(tmp_path / "out" / "meta_evaluation.parquet")
    assert results["value"].isna().all()
    reason = "constant human ratings (all 3): correlation undefined"
    assert set(results["note"]) == {reason}
    warning = f"judge / p (levels dataset, user, pair): {reason}"
    assert f"  warning: {warning}" in said and report["warnings"] == [warning]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["warnings"] == [warning]
    assert report["targets"][0]["undefined"] == {"dataset": reason, "user": reason, "pair": reason}
    printed = report["markdown"].split("\n## ")[0]  # what the command prints
    assert f"- judge / p (levels dataset, user, pair): {reason}" in printed


def test_constant_scores_and_groups_without_a_value_say_why(tmp_path):
    scores = "user_id,item_id,system,judge_p\nu1,i1,a,2\nu1,i2,b,2\nu2,i1,a,2\n"
    human = "user_id,item_id,system,human_p\nu1,i1,a,1\nu1,i2,b,4\nu2,i1,a,\n"
    run(tmp_path, scores=write(tmp_path / "s.csv", scores), human=write(tmp_path / "h.csv", human))
    notes = pd.read_parquet(tmp_path / "out" / "meta_evaluation.parquet").set_index(["level", "method"])["note"]
    assert notes[("dataset", "pearson")] == "constant evaluator scores (all 2): correlation undefined"
    # Defined over all rows, undefined within every user and every (user, item) pair.
    scores = "user_id,item_id,system,judge_p\nu1,i1,a,1\nu1,i2,b,2\nu2,i1,a,5\n"
    human = "user_id,item_id,system,human_p\nu1,i1,a,3\nu1,i2,b,3\nu2,i1,a,1\n"
    run(tmp_path, scores=write(tmp_path / "s2.csv", scores), human=write(tmp_path / "h2.csv", human),
        out=str(tmp_path / "out2"))
    res = pd.read_parquet(tmp_path / "out2" / "meta_evaluation.parquet").set_index(["level", "method"])
    assert pd.notna(res.loc[("dataset", "pearson"), "value"]) and pd.isna(res.loc[("dataset", "pearson"), "note"])
    assert res.loc[("user", "kendall"), "note"] == (
        "no user has a defined correlation (of 2 users: 1 with fewer than two rows, 1 with constant human ratings)")
    assert res.loc[("pair", "pearson"), "note"] == (
        "no (user, item) pair has a defined correlation (of 3 (user, item) pairs: 3 with fewer than two rows)")


def test_pairwise_kappa_of_one_label_says_why(tmp_path):
    rows = "user_id,item_id,pair_id,judge_verdict,human_verdict\nu1,x,p1,A,A\nu2,x,p2,A,A\n"
    report = run(tmp_path, scores=write(tmp_path / "v.csv", rows), mode="pairwise")
    res = pd.read_parquet(tmp_path / "out" / "meta_evaluation.parquet")
    kappa = res[(res.metric == "cohen_kappa") & res.ties].iloc[0]
    reason = "every verdict on both sides is A: chance agreement is total, so kappa and alpha are undefined"
    assert kappa["note"] == reason
    assert report["warnings"] == [f"judge / verdict ({t} ties: cohen_kappa, krippendorff_alpha): {reason}"
                                  for t in ("with", "without")]
    assert f"- judge / verdict / with ties (metrics cohen_kappa, krippendorff_alpha): {reason}" in report["markdown"]


def test_files_that_share_no_row_are_refused_naming_both(tmp_path):
    human = "user_id,item_id,system,human_p\nx1,i1,a,3\nx1,i1,b,2\n"
    s, h = write(tmp_path / "s.csv", SCORES), write(tmp_path / "h.csv", human)
    with pytest.raises(ValueError) as err:
        run(tmp_path, scores=s, human=h)
    msg = str(err.value)
    assert f"no row of {s} matches a row of {h} on (user_id, item_id, system)" in msg
    assert "(user_id=u1, item_id=i1, system=a)" in msg and "(user_id=x1, item_id=i1, system=a)" in msg
    assert "and 1 more" in msg and "--key" in msg
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_missing_human_column_is_blamed_on_the_human_file(tmp_path):
    s = write(tmp_path / "s.csv", SCORES)
    typo = write(tmp_path / "typo.csv", "user_id,item_id,system,human_q\nu1,i1,a,3\n")
    with pytest.raises(SchemaError) as err:
        run(tmp_path, scores=s, human=typo)
    assert err.value.source == typo and "human_p" in str(err.value) and "human_q" in str(err.value)
    none = write(tmp_path / "none.csv", "user_id,item_id,system,rating\nu1,i1,a,3\n")
    with pytest.raises(SchemaError) as err:
        run(tmp_path, scores=s, human=none)
    assert err.value.source == none and "no human rating column (human_<aspect>)" in str(err.value)
    # The explanation key: the file without one is the one named.
    nokey = write(tmp_path / "nokey.csv", "user_id,item_id,human_p\nu1,i1,3\n")
    with pytest.raises(SchemaError) as err:
        run(tmp_path, scores=s, human=nokey)
    assert err.value.source == nokey and "no explanation key column" in str(err.value)


def test_a_damaged_parquet_file_is_named(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"user_id": [f"u{i}" for i in range(2000)], "x": list(range(2000))}), good)
    data = bytearray(good.read_bytes())
    data[8:3000] = b"\xff" * (3000 - 8)  # pages gone, footer intact
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:  # an input mistake: exit 2, one line
        read_input(str(bad))
    assert str(bad) in str(err.value) and "not a readable Parquet file" in str(err.value)
    csv = write(tmp_path / "bad.csv", 'user_id,x\n"u1,1\n')
    with pytest.raises(SchemaError, match="bad.csv: not a readable CSV file"):
        read_input(csv)
