"""What a careless or hostile input does to `rexeval evaluate`'s readers: numbers where
text belongs are refused (a whole Parquet column) or become error rows (a value in a
JSON line), never scored as "3"; a statement that joins no explanation is an error row
and a warning, not a silent drop; and every error row names its file and its 1-based
row there."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.core.schema import EXPLANATIONS, SchemaError
from rexeval.pipelines.core.inputs import read_explanations
from rexeval.pipelines.evaluate.inputs import build_examples


def _explanations(n: int = 2, system: str = "s") -> pa.Table:
    return pa.table({"example_id": [f"e{i}" for i in range(1, n + 1)], "system": [system] * n,
                     "user_id": ["u"] * n, "item_id": ["i"] * n,
                     "explanation": [f"the strings are bright {i}" for i in range(n)],
                     "reference": ["the case is thin"] * n}, schema=EXPLANATIONS)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_numeric_explanation_column_is_refused_naming_file_and_column(tmp_path):
    t = _explanations()
    t = t.set_column(t.schema.get_field_index("explanation"), "explanation", pa.array([3, 4], pa.int64()))
    pq.write_table(t, tmp_path / "scores_not_texts.parquet")
    with pytest.raises(SchemaError) as err:
        read_explanations([str(tmp_path / "scores_not_texts.parquet")])
    msg = str(err.value)
    assert "scores_not_texts.parquet" in msg and err.value.field == "explanation"
    assert "int64" in msg and "expected text (string)" in msg
    # Integer ids stay welcome: they are ids, written as they are.
    ids = _explanations().set_column(0, "example_id", pa.array([7, 8], pa.int64()))
    pq.write_table(ids, tmp_path / "int_ids.parquet")
    assert read_explanations([str(tmp_path / "int_ids.parquet")]).column("example_id").to_pylist() == ["7", "8"]


def test_numbers_in_a_statements_file_are_error_rows_or_refused(tmp_path):
    pq.write_table(_explanations(), tmp_path / "ex.parquet")
    expl = read_explanations([str(tmp_path / "ex.parquet")])
    # JSON lines: a number in one line is that line's error row; the other lines count.
    jl = _jsonl(tmp_path / "st.jsonl", [
        {"example_id": "e1", "system": "s", "statement": 5, "sentiment": "positive"},
        {"example_id": "e1", "system": "s", "statement": "the strings are bright", "sentiment": "positive"},
        {"example_id": "e2", "system": "s", "statement": "it stays in tune", "sentiment": 1}])
    ex, err, _ = build_examples(expl, None, [str(jl)])
    sets = {r["example_id"]: r["gen_sentences"] for r in ex.to_pylist()}
    assert sets == {"e1": ["The user would appreciate this product because the strings are bright."], "e2": []}
    rows = sorted(err.to_pylist(), key=lambda r: r["line"])
    assert [(r["line"], r["field"], r["error_type"]) for r in rows] == [
        (1, "statement", "bad_type"), (3, "sentiment", "bad_type")]
    assert all(r["source"] == str(jl) for r in rows)
    assert "5 is a number (int), not text" in rows[0]["message"]
    # Parquet: the whole column has one type, so the file is refused.
    st = pa.table({"example_id": ["e1"], "system": ["s"], "statement": pa.array([5.0]), "sentiment": ["positive"]})
    pq.write_table(st, tmp_path / "st.parquet")
    with pytest.raises(SchemaError, match=r"st\.parquet, field 'statement': holds double values, expected text"):
        build_examples(expl, None, [str(tmp_path / "st.parquet")])


def test_a_statement_without_its_explanation_is_an_error_row_and_a_warning(tmp_path):
    pq.write_table(_explanations(), tmp_path / "ex.parquet")
    expl = read_explanations([str(tmp_path / "ex.parquet")])
    jl = _jsonl(tmp_path / "st.jsonl", [
        {"example_id": "e1", "system": "s", "statement": "the strings are bright", "sentiment": "positive"},
        {"example_id": "e9", "system": "s", "statement": "it stays in tune", "sentiment": "positive"},
        {"example_id": "e1", "system": "typo", "statement": "it is loud", "sentiment": "negative"},
        {"example_id": "e1", "system": "other", "statement": "it is loud", "sentiment": "negative"}])
    ex, err, _ = build_examples(expl, None, [str(jl)], systems=["s", "typo"])
    orphans = [r for r in err.to_pylist() if r["error_type"] == "no_explanation"]
    # Lines 2 and 3 name no explanation; line 4's system was left out on purpose.
    assert [(r["source"], r["line"], r["row_id"]) for r in orphans] == [(str(jl), 2, "s/e9"), (str(jl), 3, "typo/e1")]
    assert "no explanation of system 's' for example 'e9'" in orphans[0]["message"]
    from rexeval.pipelines.evaluate.inputs import input_warnings

    warnings = input_warnings(err)
    assert warnings == [f"{jl}: 2 statement row(s) join no explanation (system, example_id); they are "
                        "error rows (no_explanation) in errors.parquet"]


def test_a_reference_sentence_without_reference_text_is_an_error_row(tmp_path):
    gt = tmp_path / "gt"
    (gt / "explanations").mkdir(parents=True)
    (gt / "sentences").mkdir()
    pq.write_table(_explanations(1, "ground_truth"), gt / "explanations" / "part-00000.parquet")
    pq.write_table(pa.table({"statement_id": ["a", "b"], "review_id": ["e1", "e7"],
                             "sentence": ["The user may dislike that the case is thin."] * 2,
                             "topic": ["case", "case"], "sentiment": ["negative"] * 2}),
                   gt / "sentences" / "part-00000.parquet")
    pq.write_table(_explanations(1), tmp_path / "ex.parquet")
    ex, err, _ = build_examples(read_explanations([str(tmp_path / "ex.parquet")]), str(gt), [])
    assert ex.num_rows == 1 and err.column("error_type").to_pylist() == ["no_reference_text"]
    row = err.to_pylist()[0]
    assert (row["source"], row["line"], row["row_id"]) == (f"{gt}/sentences/part-00000.parquet", 2, "e7")


def test_error_rows_name_the_file_and_its_1_based_row(tmp_path):
    pq.write_table(_explanations(2), tmp_path / "a.parquet")
    st = pa.table({"example_id": ["e1"], "system": ["s"], "statement": ["x"], "sentiment": ["angry"]})
    pq.write_table(st, tmp_path / "st.parquet")
    _, err, _ = build_examples(read_explanations([str(tmp_path / "a.parquet")]), None, [str(tmp_path / "st.parquet")])
    assert [(r["source"], r["line"]) for r in err.to_pylist()] == [(str(tmp_path / "st.parquet"), 1)]
    from rexeval.pipelines.core.inputs import read_explanation_rows

    b = _explanations(3)  # e1 and e2 again (duplicates), then e3 without a reference
    b = b.set_column(b.schema.get_field_index("reference"), EXPLANATIONS.field("reference"),
                     pa.array(["r", "r", None], pa.string()))
    pq.write_table(b, tmp_path / "b.parquet")
    expl, origins = read_explanation_rows([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")])
    ex, err, _ = build_examples(expl, None, [str(tmp_path / "st.parquet")], origins=origins)
    got = sorted((r["error_type"], r["source"], r["line"]) for r in err.to_pylist())
    b_path, st_path = str(tmp_path / "b.parquet"), str(tmp_path / "st.parquet")
    assert got == [("bad_sentiment", st_path, 1), ("duplicate_example", b_path, 1),
                   ("duplicate_example", b_path, 2), ("no_reference", b_path, 3)]
    messages = {r["error_type"] + str(r["line"]): r["message"] for r in err.to_pylist()}
    assert messages["duplicate_example2"].startswith(f"{b_path}, row 2: system 's' has example 'e2' twice")
    assert messages["bad_sentiment1"].startswith(f"{st_path}, row 1, field 'sentiment'")


@pytest.mark.slow
def test_the_job_prints_and_records_the_warnings_and_points_every_error_row(tmp_path):
    """The model-free corpus metrics only: the job's own reading, warning and writing."""
    from rexeval.pipelines.evaluate.config import EvaluateConfig
    from rexeval.pipelines.evaluate.pipeline import run_evaluate

    pq.write_table(_explanations(2), tmp_path / "ex.parquet")
    jl = _jsonl(tmp_path / "st.jsonl", [
        {"example_id": "e1", "system": "s", "statement": "the strings are bright", "sentiment": "positive"},
        {"example_id": "e5", "system": "s", "statement": "it stays in tune", "sentiment": "positive"}])
    said: list[str] = []
    cfg = EvaluateConfig(explanations=[str(tmp_path / "ex.parquet")], statements=[str(jl)], out=str(tmp_path / "out"),
                         metrics=["corpus"], bootstrap=0)
    report = run_evaluate(cfg, progress=said.append)
    line = f"{jl}: 1 statement row(s) join no explanation (system, example_id); they are error rows " \
           "(no_explanation) in errors.parquet"
    assert report["warnings"] == [line] and f"  warning: {line}" in said
    assert json.loads((tmp_path / "out" / "report.json").read_text())["warnings"] == [line]
    errors = pq.read_table(tmp_path / "out" / "errors.parquet").to_pylist()
    assert [(r["source"], r["line"], r["error_type"]) for r in errors] == [(str(jl), 2, "no_explanation")]
