"""The judges' own tables (contexts, detect's interactions, reviews) in any table format
(issue 50, item 1): a CSV and a gzipped JSON-lines file under other column names, mapped
with `columns`, give what the Parquet file gives; an unknown format or a missing column
names the file, the format read and the columns found."""
from __future__ import annotations

import pandas as pd
import pytest

from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.judge.config import DetectJobConfig
from rexeval.pipelines.judge.inputs import load_contexts, read_contexts
from rexeval.pipelines.judge.jobs import detect_contexts
from tests.doubles.table_files import write_frame_as

CTX = pd.DataFrame({"user_id": ["u1", "u2", "007"], "item_id": ["i1", "i2", "i3"],
                    "user_profile": ["bought strings", "", "a capo, picks"],
                    "item_description": ["a tuner", "a cable, 3 m", "a \"quiet\" amp"]})
THEIRS = {"user_id": "uid", "item_id": "asin", "item_description": "title"}  # ours -> theirs
INTER = pd.DataFrame({"user_id": ["007", "u1"], "item_id": ["i3", "i1"]})


@pytest.mark.parametrize("name", ["ctx.csv", "ctx.jsonl.gz", "ctx.tsv"])
def test_contexts_in_other_formats_and_names_read_as_the_parquet_ones(tmp_path, name):
    want = read_contexts(write_frame_as(CTX, tmp_path / "ctx.parquet"))
    got = read_contexts(write_frame_as(CTX, tmp_path / name, THEIRS), THEIRS)
    pd.testing.assert_frame_equal(got, want)
    assert got["user_id"].tolist()[2] == "007"  # an id stays as written
    inter = CTX[["user_id", "item_id"]]
    pd.testing.assert_frame_equal(load_contexts(str(tmp_path / name), [], inter, columns=THEIRS), want)


@pytest.mark.parametrize("name", ["inter.csv", "inter.jsonl.gz"])
def test_detect_interactions_and_contexts_in_other_formats(tmp_path, name):
    want = detect_contexts(DetectJobConfig(contexts=write_frame_as(CTX, tmp_path / "ctx.parquet"),
                                           interactions=write_frame_as(INTER, tmp_path / "inter.parquet"),
                                           out=str(tmp_path / "out")))
    assert want["user_id"].tolist() == ["007", "u1"]
    ctx = "ctx.jsonl.gz" if name.endswith(".csv") else "ctx.csv"
    got = detect_contexts(DetectJobConfig(contexts=write_frame_as(CTX, tmp_path / ctx, THEIRS),
                                          interactions=write_frame_as(INTER, tmp_path / name, THEIRS),
                                          columns=THEIRS, out=str(tmp_path / "out")))
    pd.testing.assert_frame_equal(got, want)


def test_a_mapping_renames_only_the_tables_own_columns(tmp_path):
    """One mapping serves the explanations and the contexts: explanation=title never
    turns the contexts' title into an explanation column."""
    columns = {**THEIRS, "explanation": "item_description"}
    path = write_frame_as(CTX, tmp_path / "ctx.csv", THEIRS)
    assert read_contexts(path, columns)["item_description"].tolist() == CTX["item_description"].tolist()


def test_a_missing_column_names_the_file_the_format_and_the_columns_found(tmp_path):
    path = write_frame_as(CTX, tmp_path / "ctx.jsonl.gz", THEIRS)
    with pytest.raises(SchemaError) as err:
        read_contexts(path)  # no mapping given
    msg = str(err.value)
    assert path in msg and "JSON-lines file" in msg and "columns found: uid, asin, user_profile, title" in msg
    assert "--columns" in msg
    inter = write_frame_as(INTER.rename(columns={"item_id": "asin"}), tmp_path / "inter.csv")
    with pytest.raises(SchemaError) as err:
        detect_contexts(DetectJobConfig(contexts=write_frame_as(CTX, tmp_path / "ctx.parquet"), interactions=inter,
                                        out=str(tmp_path / "out")))
    msg = str(err.value)
    assert inter in msg and "CSV file" in msg and "item_id" in msg and "columns found: user_id, asin" in msg


def test_an_unknown_or_mislabelled_format_is_named(tmp_path):
    odd = tmp_path / "ctx.xlsx"
    odd.write_bytes(b"PK\x03\x04 not a table")
    with pytest.raises(SchemaError) as err:
        read_contexts(str(odd))
    assert str(odd) in str(err.value) and "parquet, csv, tsv, jsonl" in str(err.value)
    fake = tmp_path / "ctx.jsonl"
    fake.write_text("user_id,item_id\nu1,i1\n")
    with pytest.raises(SchemaError) as err:
        read_contexts(str(fake))
    assert str(fake) in str(err.value) and "JSON lines" in str(err.value)
    notgz = tmp_path / "ctx.csv.gz"
    notgz.write_text("user_id,item_id\nu1,i1\n")
    with pytest.raises(SchemaError) as err:
        read_contexts(str(notgz))
    assert str(notgz) in str(err.value) and "gzip" in str(err.value)


# -- the Likert judge's one-shot examples and the study's likert pool ------------------

POOL_THEIRS = {"user_id": "uid", "explanation": "text", "human_accuracy": "acc"}  # ours -> theirs


def _one_shot(tmp_path, examples: str, columns=None):
    """The likert task's scores and prompts for the judged rows with `examples` as the pool
    (its settings as `run_likert` stages them)."""
    from rexeval.pipelines.judge.config import LikertJobConfig
    from rexeval.pipelines.judge.jobs import _examples
    from rexeval.pipelines.judge.likert import LikertConfig
    from rexeval.pipelines.judge.tasks import TASKS
    from tests.doubles.llm import ScriptedLLM
    from tests.pipelines.judge.test_likert import FOUR, rows

    cfg = LikertJobConfig(explanations=["x"], shots="personalised", examples=examples, columns=columns or {},
                          out=str(tmp_path / "out"))
    settings = {"likert": LikertConfig(shots="personalised", seed=3).model_dump(), **_examples(cfg, tmp_path)}
    llm = ScriptedLLM.make(default=FOUR)
    judged = pd.concat([rows(1), rows(4).iloc[3:].assign(user_id="u0", item_id="i3", example_id="e3")])
    tables, _ = TASKS.lookup("likert")(llm, judged.reset_index(drop=True), settings)
    return tables["likert"], [m["content"] for c in llm.calls for m in c.messages], settings


@pytest.mark.parametrize("name", ["rated.csv", "rated.jsonl.gz"])
def test_one_shot_examples_in_other_formats_and_names_judge_as_the_parquet_ones(tmp_path, name):
    from tests.pipelines.judge.test_likert import pool

    want, want_prompts, plain = _one_shot(tmp_path, write_frame_as(pool(), tmp_path / "rated.parquet"))
    assert "examples_columns" not in plain  # no mapping: the chunks' settings as before
    assert want["shot_example"].notna().all()
    got, prompts, settings = _one_shot(tmp_path, write_frame_as(pool(), tmp_path / name, POOL_THEIRS),
                                       {**POOL_THEIRS, "item_id": "asin", "example_id": "id"})
    assert settings["examples_columns"] == {**POOL_THEIRS, "item_id": "asin"}  # the pool's own entries only
    pd.testing.assert_frame_equal(got, want)
    assert prompts == want_prompts


def test_one_shot_examples_missing_a_column_are_named_before_any_judge(tmp_path):
    from rexeval.pipelines.judge.config import LikertJobConfig
    from rexeval.pipelines.judge.jobs import _examples
    from tests.pipelines.judge.test_likert import pool

    path = write_frame_as(pool(), tmp_path / "rated.csv", POOL_THEIRS)
    cfg = LikertJobConfig(explanations=["x"], shots="one", examples=path, out=str(tmp_path / "out"))
    with pytest.raises(SchemaError) as err:
        _examples(cfg, tmp_path / "out")  # no mapping given
    msg = str(err.value)
    assert path in msg and "CSV file" in msg and "user_id" in msg and "--columns" in msg
    assert "columns found: uid, item_id, system, text, item_description, human_persuasiveness" in msg
    bad = pool().astype({"human_accuracy": object})
    bad.loc[2, "human_accuracy"] = "good"
    path = write_frame_as(bad, tmp_path / "bad.jsonl.gz")
    with pytest.raises(SchemaError) as err:
        _examples(cfg.model_copy(update={"examples": path}), tmp_path / "out")
    assert path in str(err.value) and "human_accuracy" in str(err.value) and "'good' is not a number" in str(err.value)


SCORES_THEIRS = {"score": "rating", "judge": "model", "example_id": "id"}


@pytest.mark.parametrize("name", ["scores.csv", "scores.jsonl.gz"])
def test_likert_pool_reads_scores_tables_in_other_formats_and_names(tmp_path, name):
    from rexeval.pipelines.judge.study_job import LikertPoolConfig, run_likert_pool
    from tests.pipelines.judge.test_likert_pool import run_folder, scores

    api = scores(["gpt-4"], 4.0)
    api.loc[1, "score"] = float("nan")  # an unreadable answer stays missing
    api.loc[2, "shot_example"] = "u1|i9|user"
    opened = run_folder(tmp_path, "open", scores(["qwen-14b"], 3.0))
    want = run_likert_pool(LikertPoolConfig(runs=[str(opened), write_frame_as(api, tmp_path / "api.parquet")],
                                            out=str(tmp_path / "want")), progress=lambda s: None)
    got = run_likert_pool(LikertPoolConfig(runs=[str(opened), write_frame_as(api, tmp_path / name, SCORES_THEIRS)],
                                           columns=SCORES_THEIRS, out=str(tmp_path / "got")),
                          progress=lambda s: None)
    assert got["counts"] == want["counts"] and got["judges"] == want["judges"]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "got" / "likert_scores.parquet"),
                                  pd.read_parquet(tmp_path / "want" / "likert_scores.parquet"))
    assert (tmp_path / "got" / "likert.md").read_text() == (tmp_path / "want" / "likert.md").read_text()
    with pytest.raises(SchemaError) as err:
        run_likert_pool(LikertPoolConfig(runs=[write_frame_as(api, tmp_path / name, SCORES_THEIRS)],
                                         out=str(tmp_path / "bad")), progress=lambda s: None)
    msg = str(err.value)
    fmt = "CSV file" if name.endswith(".csv") else "JSON-lines file"
    assert str(tmp_path / name) in msg and fmt in msg and "columns found: id, system, user_id" in msg
