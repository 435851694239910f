"""Examples for `rexeval evaluate`: every explanation row ends as an example or an error
row, statement sets are known, empty or unknown, and family selection is exact."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rexeval.pipelines.evaluate.inputs import (
    build_examples,
    sentiment_flipped,
    write_flip_benchmark,
)
from rexeval.pipelines.evaluate.families import select_families
from rexeval.pipelines.evaluate.pipeline import statement_gaps
from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import EXPLANATIONS, SchemaError
from rexeval.pipelines.core.inputs import read_explanations, statements_from_annotations


def _statements(rows):
    return pa.table({
        "statement_id": [f"s{i}" for i in range(len(rows))],
        "review_id": [r[0] for r in rows], "user_id": ["u"] * len(rows), "item_id": ["i"] * len(rows),
        "statement": [r[1] for r in rows], "topic": [r[3] if len(r) > 3 else None for r in rows],
        "sentiment": [r[2] for r in rows], "stage": ["triplet"] * len(rows), "provenance": [None] * len(rows)})


@pytest.fixture
def bench(tmp_path):
    st = _statements([("r1", "the strings are bright", "positive", "sound"),
                      ("r1", "the case is thin", "negative", "case"),
                      ("r2", "it stays in tune", "positive", "tuning")])
    return write_flip_benchmark(st, tmp_path / "bench"), tmp_path


def test_flip_benchmark_and_examples(bench):
    paths, _ = bench
    expl = read_explanations([paths["explanations"]])
    assert sorted(set(expl.column("system").to_pylist())) == ["flipped", "ground_truth"]
    ex, err, counts = build_examples(expl, paths["references"], [paths["statements"]])
    assert err.num_rows == 0 and counts["examples"] == 4 and counts["examples[flipped]"] == 2
    rows = {(r["system"], r["example_id"]): r for r in ex.to_pylist()}
    gt, fl = rows[("ground_truth", "r1")], rows[("flipped", "r1")]
    # Both sides read alike: the ground-truth sentence pattern (seed 000 IV-B).
    assert gt["ref_sentences"] == gt["gen_sentences"] == [
        "The user would appreciate this product because the strings are bright.",
        "The user may dislike that the case is thin."]
    assert fl["gen_sentences"] == ["The user may dislike that the strings are bright.",
                                   "The user would appreciate this product because the case is thin."]
    assert fl["reference"] == gt["explanation"] and fl["explanation"] != gt["explanation"]
    assert gt["ref_topics"] == ["case", "sound"]


def test_every_row_is_an_example_or_an_error(bench, tmp_path):
    paths, _ = bench
    extra = pa.table({"example_id": ["r1", "nope"], "system": ["ground_truth", "ground_truth"],
                      "user_id": ["u", "u"], "item_id": ["i", "i"], "explanation": ["again", "orphan"],
                      "reference": [None, None]}, schema=EXPLANATIONS)
    write_parquet_atomic(tmp_path / "extra.parquet", extra)
    expl = read_explanations([paths["explanations"], tmp_path / "extra.parquet"])
    ex, err, counts = build_examples(expl, paths["references"], [paths["statements"]])
    assert ex.num_rows + err.num_rows == expl.num_rows
    kinds = sorted(err.column("error_type").to_pylist())
    assert kinds == ["duplicate_example", "no_reference"]
    assert any("'nope'" in m for m in err.column("message").to_pylist())


def test_statement_sets_unknown_empty_and_bad_rows(bench, tmp_path):
    paths, _ = bench
    expl = read_explanations([paths["explanations"]])
    # No statements at all for a system: unknown (None), and the gap is explained.
    ex, _, _ = build_examples(expl, paths["references"], [])
    assert all(g is None for g in ex.column("gen_sentences").to_pylist())
    gaps = statement_gaps(ex)
    assert set(gaps) == {"flipped", "ground_truth"} and "--extract" in gaps["flipped"]
    # A JSONL file: one system known (r2 has none -> empty set), one bad sentiment -> error row.
    jl = tmp_path / "st.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in [
        {"example_id": "r1", "system": "flipped", "statement": "the strings are dull", "sentiment": "negative"},
        {"example_id": "r1", "system": "flipped", "statement": "it is loud", "sentiment": "angry"},
    ]) + "\n")
    ex, err, _ = build_examples(expl, paths["references"], [jl])
    got = {(r["system"], r["example_id"]): r["gen_sentences"] for r in ex.to_pylist()}
    assert got[("flipped", "r1")] == ["The user may dislike that the strings are dull."]
    assert got[("flipped", "r2")] == [] and got[("ground_truth", "r1")] is None
    assert err.num_rows == 1 and err.column("field")[0].as_py() == "sentiment"
    assert f"{jl}, row 2, field 'sentiment'" in err.column("message")[0].as_py()
    # Without --references: texts from the rows' reference column, no reference statements.
    no_ref = expl.set_column(expl.schema.get_field_index("reference"), EXPLANATIONS.field("reference"),
                             pa.array(["ref text"] * expl.num_rows, pa.string()))
    ex, _, _ = build_examples(no_ref, None, [paths["statements"]])
    assert set(ex.column("reference").to_pylist()) == {"ref text"}
    assert "--references" in statement_gaps(ex)["flipped"]


def test_malformed_statement_file_names_line(tmp_path, bench):
    paths, _ = bench
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"example_id": "r1", "system": "x", "statement": "ok", "sentiment": "positive"}\n{oops\n')
    with pytest.raises(SchemaError) as err:
        build_examples(read_explanations([paths["explanations"]]), paths["references"], [bad])
    assert err.value.row == 2 and str(bad) in str(err.value)


def test_limit_and_systems(bench):
    paths, _ = bench
    expl = read_explanations([paths["explanations"]])
    ex, _, _ = build_examples(expl, paths["references"], [paths["statements"]], limit=1, systems=["flipped"])
    assert ex.column("system").to_pylist() == ["flipped"]


def test_sentiment_flip_keeps_neutral():
    st = _statements([("r", "a", "positive"), ("r", "b", "Negative"), ("r", "c", "neutral")])
    assert sentiment_flipped(st).column("sentiment").to_pylist() == ["negative", "positive", "neutral"]


def test_sample_flip_benchmark_covers_every_review(tmp_path):
    st = statements_from_annotations("pipelines/sample/statements.jsonl", stage="triplet")
    paths = write_flip_benchmark(st, tmp_path)
    expl = read_explanations([paths["explanations"]])
    ex, err, counts = build_examples(expl, paths["references"], [paths["statements"]])
    n_reviews = len(set(st.column("review_id").to_pylist()))
    assert err.num_rows == 0 and counts["examples[ground_truth]"] == counts["examples[flipped]"] == n_reviews


def test_select_families():
    every = select_families(["all"], [])
    assert "statement_nli" in every and "corpus" in every and "st2exp" in every
    assert select_families(["stent_p", "bertscore-f1", "bleu-4"], []) == ["statement_nli", "bertscore", "corpus"]
    assert "st2exp" not in select_families(["all"], ["st2exp_p"])
    with pytest.raises(ValueError, match="unknown metric or family 'bleu5'"):
        select_families(["bleu5"], [])


def test_questeval_published_and_f1_variant_are_both_selectable():
    """`questeval` is the published score (one value, no P/R); the token-F1 variant runs
    under questeval_f1 with its P/R; questeval_p / questeval_r are refused with the reason."""
    assert select_families(["questeval"], []) == ["questeval"]
    assert select_families(["questeval_f1"], []) == ["questeval_f1"]
    assert select_families(["questeval_f1_r"], []) == ["questeval_f1"]
    assert {"questeval", "questeval_f1"} <= set(select_families(["all"], []))
    assert select_families(["all"], ["questeval"]).count("questeval_f1") == 1
    for old, new in (("questeval_p", "questeval_f1_p"), ("questeval_r", "questeval_f1_r")):
        with pytest.raises(ValueError, match=f"'{old}' is now '{new}'.*no precision or recall"):
            select_families([old], [])
    from rexeval.metrics.registry import METRICS, get_metric
    from rexeval.pipelines.evaluate.families import FAMILIES

    assert {"questeval", "questeval_f1", "questeval_f1_p", "questeval_f1_r"} <= set(METRICS)
    assert not {"questeval_p", "questeval_r"} & set(METRICS)
    assert get_metric("questeval").group == "questeval" and get_metric("questeval").higher_is_better
    assert FAMILIES["questeval"].metrics() == ("questeval",)
    assert FAMILIES["questeval"].roles == ("questeval_qg", "questeval_qa", "questeval_bertscore",
                                           "spacy")
    assert FAMILIES["questeval_f1"].metrics() == ("questeval_f1", "questeval_f1_p", "questeval_f1_r")
    from rexeval.pipelines.evaluate.report import TABLES

    labels = dict(row for _, rows in TABLES for row in rows)
    assert labels["questeval"] == "QuestEval" and labels["questeval_f1"] == "QuestEval-F1"


def test_review_generation_is_read_from_the_generate_run_manifests(tmp_path):
    """`generate run` records its target; evaluate calls the run review generation (Table
    VII) when every such folder says review and no ground truth is given, refuses a mix,
    and lets --task decide."""
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.inputs import reference_kind
    from rexeval.pipelines.evaluate.pipeline import evaluation_task

    def run_folder(name, target):
        d = tmp_path / name
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps({"job": "generate-run", "target": target}))
        return str(d)

    nrt, peter, gt = run_folder("nrt", "review"), run_folder("peter", "review"), run_folder("gt", "explanation")
    old = run_folder("old", None)  # written before the manifest said (it counts as not saying)
    plain = tmp_path / "x.parquet"
    plain.write_bytes(b"")
    assert reference_kind([nrt, peter, old, str(plain)]) == "review"
    assert reference_kind([gt]) == "explanation" and reference_kind([old, str(plain)]) is None
    with pytest.raises(ValueError, match=r"different targets \(explanation: .*gt; review: .*nrt, .*peter\)"):
        reference_kind([nrt, peter, gt])

    def task(**kw):
        return evaluation_task(EvaluateConfig(out="o", **kw))

    assert task(explanations=[nrt, peter]) == "review"
    assert task(explanations=[nrt], references="gt-folder") == "explanation"  # a ground truth is given
    assert task(explanations=[str(plain)]) == "explanation"
    assert task(explanations=[gt], task="review") == "review"


def test_a_damaged_run_manifest_is_named(tmp_path):
    from rexeval.pipelines.evaluate.inputs import reference_kind

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"run/manifest.json: not a readable job manifest"):
        reference_kind([str(tmp_path / "run")])
