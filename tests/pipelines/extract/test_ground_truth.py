"""Ground-truth explanations: rewriting rules, paragraphs, tables and the sharded job.

Every expected string below is written out by hand from the rules in
pipelines/extract/ground_truth.py, not copied from the code's output.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.pipelines.extract.ground_truth import (build_explanation, clause, ground_truth_shard,
                                    ground_truth_tables, join_clauses, point_of_view,
                                    statement_sentence, subject_pronoun)
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.schema import EXPLANATIONS, SENTENCES, SchemaError

POS = "The user would appreciate this product because "
NEG = "The user may dislike that "
NEU = "The user seems indifferent to the fact that "

# -- point of view -------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("I love the sound", "they love the sound"),
    ("My feet got hotter", "their feet got hotter"),
    ("It works for me", "it works for them"),
    ("I bought it for myself", "they bought it for themselves"),
    ("the case is mine", "the case is theirs"),
    ("I'm happy with it", "they're happy with it"),
    ("I’ve had it for a year", "they’ve had it for a year"),
    ("I'd buy it again", "they'd buy it again"),
    ("I'll keep it", "they'll keep it"),
    ("i like it", "they like it"),
    ("We love it and our kids do too", "they love it and their kids do too"),
    ("It sent us a spare", "it sent them a spare"),
    ("We're glad it is ours", "they're glad it is theirs"),
    ("I have small hands", "they have small hands"),
    # verb agreement after the new "they"
    ("I was disappointed", "they were disappointed"),
    ("I am a beginner", "they are a beginner"),
    ("I was not impressed", "they were not impressed"),
    ("I wasn't sure", "they weren't sure"),
    ("I really was surprised", "they really were surprised"),
    # words that merely contain i / my / me / us stay
    ("A mystery to a dummy from Iowa", "a mystery to a dummy from Iowa"),
    ("It is my dummy string", "it is their dummy string"),
    ("Mystery solved for me", "mystery solved for them"),
    ("Meters are accurate and it is music to my ears", "meters are accurate and it is music to their ears"),
    ("Made in the US", "made in the US"),
    # first letter, names and acronyms, quotes and punctuation
    ("USB cable is too short.", "USB cable is too short"),
    ("iPhone holder is sturdy", "iPhone holder is sturdy"),
    ("McIntosh amps sound warm", "McIntosh amps sound warm"),
    ('  "Great value for the money!"  ', "great value for the money"),
    ("“Sounds great”...", "sounds great"),
    ("'Works fine'", "works fine"),
    ("Great. I'm happy", "great. They're happy"),
])
def test_point_of_view(text, expected):
    assert point_of_view(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("the product is comfortable", "it is comfortable"),
    ("This product works well", "it works well"),
    ("The product doesn't fit", "it doesn't fit"),
    ("this item arrived broken", "it arrived broken"),
    ("The product's finish is smooth", "its finish is smooth"),
    ("It is very comfortable to walk in", "it is very comfortable to walk in"),
    # not the product as the subject of a verb: unchanged
    ("the product description is wrong", "the product description is wrong"),
    ("the product features are great", "the product features are great"),
    ("the strings are bright", "the strings are bright"),
])
def test_subject_pronoun(text, expected):
    assert subject_pronoun(text) == expected


def test_clause_combines_both_rewrites():
    assert clause("The product was not what I expected.") == "it was not what they expected"
    assert clause("The product is\n  light") == "it is light"


@pytest.mark.parametrize("parts, expected", [
    ([], ""), (["a"], "a"), (["a", "b"], "a and b"), (["a", "b", "c"], "a, b and c"),
    (["a", "b", "c", "d"], "a, b, c and d"),
])
def test_join_clauses(parts, expected):
    assert join_clauses(parts) == expected


# -- one review ------------------------------------------------------------------------


def T(statement, sentiment, topic=None):
    return {"statement": statement, "sentiment": sentiment, "topic": topic}


LOVE = T("I love the tone", "positive")
LIGHT = T("The product is light", "positive")
STRAP = T("The strap broke after a week.", "negative")
BIGGER = T("It is a bit larger than my previous pair", "neutral")


def test_positive_only():
    assert build_explanation([LOVE, LIGHT]) == (
        "The user would appreciate this product because they love the tone and it is light.")


def test_three_positive_clauses():
    assert build_explanation([LOVE, LIGHT, T("I use it every day", "positive")]) == (
        "The user would appreciate this product because they love the tone, it is light and "
        "they use it every day.")


def test_negative_only():
    assert build_explanation([STRAP]) == "The user may dislike that the strap broke after a week."


def test_neutral_only():
    assert build_explanation([BIGGER]) == (
        "The user seems indifferent to the fact that it is a bit larger than their previous pair.")


def test_positive_and_negative():
    assert build_explanation([STRAP, LOVE]) == (
        "The user would appreciate this product because they love the tone. "
        "However, they may dislike that the strap broke after a week.")


def test_positive_and_neutral():
    assert build_explanation([BIGGER, LOVE]) == (
        "The user would appreciate this product because they love the tone. "
        "They seem indifferent to the fact that it is a bit larger than their previous pair.")


def test_negative_and_neutral():
    assert build_explanation([BIGGER, STRAP]) == (
        "The user may dislike that the strap broke after a week. "
        "They seem indifferent to the fact that it is a bit larger than their previous pair.")


def test_all_three_like_the_seed_example():
    # The review of seed 000's Table I, statements given neutral, positive, negative.
    triplets = [
        T("It is a bit larger than my previous pair", "neutral", "size"),
        T("The product is very comfortable to walk in", "Positive", "comfort"),
        T("My feet got hotter in these than in the previous version.", " NEGATIVE ", "comfort"),
    ]
    assert build_explanation(triplets) == (
        "The user would appreciate this product because it is very comfortable to walk in. "
        "However, they may dislike that their feet got hotter in these than in the previous "
        "version. They seem indifferent to the fact that it is a bit larger than their "
        "previous pair.")


def test_repeated_statements_are_kept_once_in_first_order():
    triplets = [LOVE, T("i love the tone!", "positive"), LIGHT, T("  I LOVE the   tone ", "positive"),
                T("the product is light.", "positive"), T("I love the tone", "negative")]
    assert build_explanation(triplets) == (
        "The user would appreciate this product because they love the tone and it is light.")


def test_unknown_or_missing_label_is_a_value_error():
    with pytest.raises(ValueError, match="'mixed'"):
        build_explanation([LOVE, T("meh", "mixed")])
    with pytest.raises(ValueError, match="None"):
        build_explanation([T("meh", None)])


def test_empty_input_and_wordless_statements_give_nothing():
    assert build_explanation([]) == ""
    assert build_explanation([T('"..."', "positive")]) == ""


@pytest.mark.parametrize("sentiment, expected", [
    ("positive", "The user would appreciate this product because it is comfortable."),
    ("NEGATIVE", "The user may dislike that it is comfortable."),
    ("neutral", "The user seems indifferent to the fact that it is comfortable."),
])
def test_statement_sentence(sentiment, expected):
    assert statement_sentence("The product is comfortable.", sentiment) == expected


def test_statement_sentence_rejects_bad_input():
    with pytest.raises(ValueError, match="'great'"):
        statement_sentence("I love it", "great")
    with pytest.raises(ValueError, match="no words"):
        statement_sentence("!!", "positive")


# -- tables ------------------------------------------------------------------------------


def statements_table(rows, stage="triplet"):
    """rows: (statement_id, review_id, statement, sentiment[, stage]); user/item from review."""
    cols = {k: [] for k in ("statement_id", "review_id", "user_id", "item_id", "statement",
                            "topic", "sentiment", "stage")}
    for sid, rid, text, sentiment, *rest in rows:
        for k, v in zip(cols, (sid, rid, f"u-{rid}", f"i-{rid}", text, f"t-{sid}", sentiment,
                               rest[0] if rest else stage)):
            cols[k].append(v)
    return pa.table({k: pa.array(v, pa.string()) for k, v in cols.items()})


SMALL = [
    ("s1", "r2", "I love it", "positive"),
    ("s2", "r1", "The strings are too loud", "negative"),
    ("s3", "r1", "The product is cheap", "Positive"),
    ("s4", "r2", "I love it.", "positive"),  # duplicate of s1
    ("s5", "r1", "It comes in a box", "neutral"),
]


def test_ground_truth_tables_small():
    exps, sents = ground_truth_tables(statements_table(SMALL))
    assert exps.schema.equals(EXPLANATIONS) and sents.schema.equals(SENTENCES)
    assert exps.to_pylist() == [
        {"example_id": "r1", "system": "ground_truth", "user_id": "u-r1", "item_id": "i-r1",
         "explanation": "The user would appreciate this product because it is cheap. However, "
                        "they may dislike that the strings are too loud. They seem indifferent "
                        "to the fact that it comes in a box.", "reference": None},
        {"example_id": "r2", "system": "ground_truth", "user_id": "u-r2", "item_id": "i-r2",
         "explanation": "The user would appreciate this product because they love it.",
         "reference": None},
    ]
    # by review, then input order; the duplicate s4 has no sentence
    assert sents.column("statement_id").to_pylist() == ["s2", "s3", "s5", "s1"]
    assert sents.column("review_id").to_pylist() == ["r1", "r1", "r1", "r2"]
    assert sents.column("sentiment").to_pylist() == ["negative", "positive", "neutral", "positive"]
    assert sents.column("topic").to_pylist() == ["t-s2", "t-s3", "t-s5", "t-s1"]
    assert sents.column("sentence").to_pylist() == [
        NEG + "the strings are too loud.", POS + "it is cheap.", NEU + "it comes in a box.",
        POS + "they love it."]


def test_ground_truth_tables_raises_on_unknown_label():
    rows = SMALL + [("s6", "r3", "Whatever", "so-so")]
    with pytest.raises(ValueError, match="'so-so'.*") as err:
        ground_truth_tables(statements_table(rows))
    assert "r3" in str(err.value)


def test_ground_truth_shard_records_bad_rows_and_keeps_the_rest():
    rows = SMALL + [("s6", "r2", "Whatever", "so-so"), ("s7", "r3", "Meh", None),
                    ("s8", "r3", '"?!"', "neutral")]
    exps, sents, errors = ground_truth_shard(statements_table(rows), source="x.parquet")
    assert exps.column("example_id").to_pylist() == ["r1", "r2"]  # r3 lost every statement
    assert sents.num_rows == 4
    e = errors.to_pylist()
    assert [(r["row_id"], r["field"], r["error_type"]) for r in e] == [
        ("s6", "sentiment", "unknown_sentiment"), ("s7", "sentiment", "missing_sentiment"),
        ("s8", "statement", "empty_statement")]
    assert "r2" in e[0]["message"] and "'so-so'" in e[0]["message"]
    assert json.loads(e[0]["raw"])["sentiment"] == "so-so"
    assert {r["stage"] for r in e} == {"ground-truth"} and e[0]["source"] == "x.parquet"


def test_ground_truth_tables_empty():
    exps, sents = ground_truth_tables(statements_table([]))
    assert exps.num_rows == 0 and sents.num_rows == 0 and exps.schema.equals(EXPLANATIONS)


def test_tables_and_build_explanation_agree_on_random_reviews():
    rng = random.Random(7)
    texts = ["I love it", "The product is great", "it fits well", "My kids like it", "I was sad.",
             "too loud", "I LOVE IT!", "it is heavy", '"..."', "Works for me"]
    labels = ["positive", "Negative", " neutral", "POSITIVE"]
    rows = [(f"s{n}", f"r{rng.randrange(60):02d}", rng.choice(texts), rng.choice(labels))
            for n in range(300)]
    exps, _ = ground_truth_tables(statements_table(rows))
    got = dict(zip(exps.column("example_id").to_pylist(), exps.column("explanation").to_pylist()))
    for rid in {r[1] for r in rows}:
        mine = [T(text, label) for _, r, text, label in rows if r == rid]
        assert got.get(rid, "") == build_explanation(mine), rid


# -- the job -----------------------------------------------------------------------------

SHARD0 = [
    ("a1", "r1", "I love the tone", "positive"),
    ("a2", "r1", "The strap broke", "negative"),
    ("a3", "r1", "I love the tone!", "positive"),  # duplicate
    ("a4", "r1", "The strap is nice", "positive", "candidate"),  # other stage: ignored
    ("a5", "r2", "The case is sturdy", "positive"),
    ("a6", "r2", "It is blue", "mixed"),  # unknown label: error row
    ("a7", "r3", "Nothing to say", "unsure"),  # r3's only statement fails
]
SHARD1 = [
    ("b1", "r4", "It is a bit large", "neutral"),
    ("b2", "r5", "I was disappointed", "negative"),
]


def make_extract(root: Path, shard1=SHARD1) -> Path:
    out = ShardedOutput(root, "extract", {"test": 1}, ["statements"]).open()
    for i, rows in enumerate((SHARD0, shard1)):
        out.write_shard(i, {"statements": statements_table(rows)}, {"out": len(rows)})
    out.finish(2)
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_job_counts_and_skips_a_finished_output(tmp_path, ray_session):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth
    from rexeval.pipelines.extract.config import GroundTruthConfig

    src = make_extract(tmp_path / "extract")
    cfg = GroundTruthConfig(input=str(src), out=str(tmp_path / "gt"))
    m = run_ground_truth(cfg, progress=lambda s: None)
    # shard 0: reviews r1, r2, r3 (3); explanations r1, r2; 6 triplet rows = 3 sentences
    #          (a1, a2, a5) + 1 duplicate (a3) + 2 errors (a6, a7)
    # shard 1: reviews r4, r5; 2 explanations; 2 sentences
    marker = json.loads((tmp_path / "gt" / "_done" / "part-00000.json").read_text())
    assert marker["counts"] == {
        "in": 3, "out": 2, "statements": 6, "sentences": 3, "duplicates": 1, "errors": 2}
    assert m["counts"] == {"in": 5, "out": 4, "statements": 8, "sentences": 5, "duplicates": 1,
                           "errors": 2}
    assert m["stage"] == "triplet" and m["stage_requested"] == "auto" and m["status"] == "complete"
    exps = pq.read_table(tmp_path / "gt" / "explanations")
    assert exps.column("example_id").to_pylist() == ["r1", "r2", "r4", "r5"]
    assert exps.column("explanation").to_pylist() == [
        POS + "they love the tone. However, they may dislike that the strap broke.",
        POS + "the case is sturdy.",
        NEU + "it is a bit large.",
        NEG + "they were disappointed.",
    ]
    errors = pq.read_table(tmp_path / "gt" / "errors").to_pylist()
    assert [(e["row_id"], e["field"]) for e in errors] == [("a6", "sentiment"), ("a7", "sentiment")]
    assert "r3" in errors[1]["message"] and "'unsure'" in errors[1]["message"]
    assert errors[0]["source"].endswith("part-00000.parquet")

    reference = tree(tmp_path / "gt")
    lines = []
    again = run_ground_truth(cfg, progress=lines.append)
    assert any("already complete" in line for line in lines)
    assert again["counts"] == m["counts"]
    assert tree(tmp_path / "gt") == reference


@pytest.mark.slow
def test_interrupted_job_resumes_to_identical_output(tmp_path, ray_session):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth
    from rexeval.pipelines.extract.config import GroundTruthConfig

    src = make_extract(tmp_path / "extract")
    run_ground_truth(GroundTruthConfig(input=str(src), out=str(tmp_path / "a")), progress=lambda s: None)
    reference = tree(tmp_path / "a")
    b = GroundTruthConfig(input=str(src), out=str(tmp_path / "b"), workers=1)
    run_ground_truth(b, progress=lambda s: None)
    # A crash after shard 0: shard 1's marker and files are gone, the manifest is running.
    root = tmp_path / "b"
    (root / "_done" / "part-00001.json").unlink()
    for table in ("explanations", "sentences", "errors"):
        (root / table / "part-00001.parquet").unlink()
    m = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**m, "status": "running"}))
    lines = []
    run_ground_truth(b, progress=lines.append)
    assert any("resuming: 1 of 2" in line for line in lines)
    assert sum("done (" in line for line in lines) == 1  # only shard 1 was rebuilt
    assert tree(root) == reference


def test_auto_uses_verified_statements_when_any_exist(tmp_path, ray_session):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth
    from rexeval.pipelines.extract.config import GroundTruthConfig

    shard1 = SHARD1 + [("b3", "r5", "I was annoyed", "negative", "verified")]
    src = make_extract(tmp_path / "extract", shard1)
    m = run_ground_truth(GroundTruthConfig(input=str(src), out=str(tmp_path / "gt")),
                         progress=lambda s: None)
    assert m["stage"] == "verified" and m["config"]["stage"] == "verified"
    # shard 0 has no verified rows; shard 1 has one review with one statement
    assert m["counts"] == {"in": 1, "out": 1, "statements": 1, "sentences": 1, "duplicates": 0,
                           "errors": 0}
    exps = pq.read_table(tmp_path / "gt" / "explanations").to_pylist()
    assert [e["explanation"] for e in exps] == [NEG + "they were annoyed."]
    # asking for a stage explicitly, with a single Parquet file as input
    m = run_ground_truth(GroundTruthConfig(
        input=str(src / "statements" / "part-00000.parquet"), out=str(tmp_path / "cand"),
        stage="candidate"), progress=lambda s: None)
    assert m["counts"]["in"] == 1 and m["stage"] == "candidate" and m["shards"] == 1


def test_missing_input_is_a_clear_error(tmp_path):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth
    from rexeval.pipelines.extract.config import GroundTruthConfig

    with pytest.raises(FileNotFoundError, match="statements input not found"):
        run_ground_truth(GroundTruthConfig(input=str(tmp_path / "nope"), out=str(tmp_path / "o")))
    (tmp_path / "empty" / "statements").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no statements shards"):
        run_ground_truth(GroundTruthConfig(input=str(tmp_path / "empty"), out=str(tmp_path / "o")))


def test_input_not_matching_the_schema_names_file_and_field(tmp_path, ray_session):
    from rexeval.pipelines.extract.ground_truth_pipeline import run_ground_truth
    from rexeval.pipelines.extract.config import GroundTruthConfig

    bad = tmp_path / "no_stage.parquet"
    pq.write_table(statements_table(SHARD1).drop_columns(["stage"]), bad)
    with pytest.raises(SchemaError) as err:
        run_ground_truth(GroundTruthConfig(input=str(bad), out=str(tmp_path / "o1")),
                         progress=lambda s: None)
    assert str(bad) in str(err.value) and "'stage'" in str(err.value)

    # A null in a required column is only seen when the data is read, on a worker.
    t = statements_table(SHARD1)
    nulls = tmp_path / "null_statement.parquet"
    pq.write_table(t.set_column(4, "statement", pa.array(["ok", None], pa.string())), nulls)
    with pytest.raises(SchemaError) as err:
        run_ground_truth(GroundTruthConfig(input=str(nulls), out=str(tmp_path / "o2"), stage="triplet"),
                         progress=lambda s: None)
    msg = str(err.value)
    assert str(nulls) in msg and "'statement'" in msg and "row 2" in msg  # 1-based
