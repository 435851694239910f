"""Issue 45's acceptance test: every command of the CLI on a bad input.

Each leaf command of the `rexeval` group is run in-process (click's CliRunner) on one or
more bad inputs: a missing path, a garbage file (random bytes named .parquet / .jsonl /
.csv), a corrupt Parquet file (both magics, truncated in between), an empty folder, a
config YAML with a syntax error, one that is a list instead of a mapping, one with an
unknown setting, `--out` at an existing regular file, a bad option value. Every case must
end with the documented exit code (2: a usage or input mistake; 1: a runtime failure;
75: work left for a re-run), no traceback and no exception other than SystemExit
escaping, and a one-line message: the last non-empty line starts with "Error:" (click's
"Usage: ... / Try ... for help." may stand above it) and names the offending file or
setting.

`test_every_command_has_a_bad_input` walks the click group, so a new command without a
case here fails it. The inputs are tiny and every case must be refused before any model
loads: where real work starts (an LLM stream, an encoder, Ray Tune, a Serve app, a
study's steps; `WORK_STARTS`) the test raises StartedWork, so such a command fails at
once and says so instead of loading a model for minutes.
"""
from __future__ import annotations

import importlib
import random
import tempfile
from pathlib import Path
from typing import NamedTuple

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli

REPO = Path(__file__).resolve().parents[2]
SAMPLE_JSONL = REPO / "pipelines" / "sample" / "reviews.jsonl"
LOCAL_STUDY = REPO / "studies" / "local.yaml"

USAGE, RUNTIME, RERUN = 2, 1, 75  # the documented exit codes


class Case(NamedTuple):
    command: str  # the leaf command, words joined by a space ("star build")
    what: str  # the kind of bad input, for the test id
    args: list[str]  # after the command's words; "{name}" are the files of `bad_files`
    names: str  # what the error line must name: the bad file's name, or the option / setting
    code: int = USAGE


def leaf_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every command of the CLI that runs something (not a group), as "word word"."""
    out = []
    for name, cmd in sorted(group.commands.items()):
        if isinstance(cmd, click.Group):
            out += leaf_commands(cmd, (*prefix, name))
        else:
            out.append(" ".join((*prefix, name)))
    return out


def _cases_for_config(command: str, before: list[str]) -> list[Case]:
    """The three config-file mistakes, for a command taking `--config`."""
    return [
        Case(command, "yaml-syntax-error", [*before, "--config", "{bad_yaml}"], "bad.yaml"),
        Case(command, "yaml-list", [*before, "--config", "{list_yaml}"], "list.yaml"),
        Case(command, "unknown-setting", [*before, "--config", "{unknown_yaml}"], "no_such_setting"),
    ]


OUT = ["--out", "{out}"]

CASES: list[Case] = [
    # -- ingest: review files -------------------------------------------------------
    Case("ingest", "missing-input", ["{missing_jsonl}", *OUT], "missing.jsonl"),
    Case("ingest", "garbage-jsonl", ["{garbage_jsonl}", *OUT], "garbage.jsonl"),
    Case("ingest", "garbage-csv", ["{garbage_csv}", *OUT], "garbage.csv"),
    Case("ingest", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("ingest", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("ingest", "folder-input", ["{empty}", *OUT], "/empty"),
    Case("ingest", "missing-meta", ["{sample_jsonl}", "--meta", "{missing_jsonl}", *OUT], "missing.jsonl"),
    Case("ingest", "garbage-meta", ["{sample_jsonl}", "--meta", "{garbage_jsonl}", *OUT], "garbage.jsonl"),
    Case("ingest", "out-is-a-file", ["{sample_jsonl}", "--out", "{occupied}"], "occupied"),
    Case("ingest", "bad-min-rating", ["{sample_jsonl}", "--min-rating", "abc", *OUT], "--min-rating"),
    Case("ingest", "bad-format", ["{sample_jsonl}", "--format", "nosuch", *OUT], "--format"),
    *_cases_for_config("ingest", ["{sample_jsonl}", *OUT]),
    # -- split: a reviews table or an ingest folder ------------------------------------
    Case("split", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("split", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("split", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("split", "garbage-jsonl", ["{garbage_jsonl}", *OUT], "garbage.jsonl"),
    Case("split", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("split", "out-is-a-file", ["{reviews}", "--out", "{occupied}"], "occupied"),
    Case("split", "bad-method", ["{reviews}", "--method", "nosuch", *OUT], "--method"),
    Case("split", "bad-train-share", ["{reviews}", "--train", "abc", *OUT], "--train"),
    *_cases_for_config("split", ["{reviews}", *OUT]),
    Case("curate", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("curate", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("curate", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("curate", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("curate", "out-is-a-file", ["{reviews}", "--out", "{occupied}"], "occupied"),
    Case("curate", "min-above-max", ["{reviews}", "--min-purchases", "21", *OUT], "min_purchases"),
    *_cases_for_config("curate", ["{reviews}", *OUT]),
    # -- info ----------------------------------------------------------------------------
    Case("info", "missing-input", ["{missing_parquet}"], "missing.parquet"),
    Case("info", "garbage-parquet", ["{garbage_parquet}"], "garbage.parquet"),
    Case("info", "corrupt-parquet", ["{corrupt_parquet}"], "corrupt.parquet"),
    Case("info", "empty-folder", ["{empty}"], "/empty"),
    Case("info", "garbage-statements", ["{reviews}", "--statements", "{garbage_parquet}"], "garbage.parquet"),
    # -- extract (an LLM job: refused before the model loads) --------------------------
    Case("extract", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("extract", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("extract", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("extract", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("extract", "out-is-a-file", ["{reviews}", "--limit", "1", "--out", "{occupied}"], "occupied"),
    Case("extract", "bad-max-tokens", ["{reviews}", "--max-tokens", "abc", *OUT], "--max-tokens"),
    Case("extract", "bad-backend-option", ["{reviews}", "--backend-option", "batch_size", *OUT],
         "--backend-option"),
    *_cases_for_config("extract", ["{reviews}", *OUT]),
    # -- extract-quality ---------------------------------------------------------------
    Case("extract-quality", "missing-input", ["{missing_dir}", *OUT], "/missing_dir"),
    Case("extract-quality", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("extract-quality", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("extract-quality", "bad-sample", ["{statements}", "--sample", "abc", *OUT], "--sample"),
    *_cases_for_config("extract-quality", ["{statements}", *OUT]),
    # -- ground-truth --------------------------------------------------------------------
    Case("ground-truth", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("ground-truth", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("ground-truth", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("ground-truth", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("ground-truth", "out-is-a-file", ["{statements}", "--out", "{occupied}"], "occupied"),
    Case("ground-truth", "bad-stage", ["{statements}", "--stage", "nosuch", *OUT], "--stage"),
    *_cases_for_config("ground-truth", ["{statements}", *OUT]),
    # -- cluster (an encoder job: refused before the model loads) ----------------------
    Case("cluster", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("cluster", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("cluster", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("cluster", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("cluster", "bad-index", ["{statements}", "--index", "nosuch", *OUT], "--index"),
    Case("cluster", "bad-k", ["{statements}", "--k", "abc", *OUT], "--k"),
    *_cases_for_config("cluster", ["{statements}", *OUT]),
    # -- cluster-report --------------------------------------------------------------------
    Case("cluster-report", "missing-run", ["{missing_dir}"], "/missing_dir"),
    Case("cluster-report", "file-not-folder", ["{garbage_parquet}"], "garbage.parquet"),
    Case("cluster-report", "empty-folder", ["{empty}"], "/empty"),
    Case("cluster-report", "garbage-report-json", ["{garbage_run}"], "report.json"),
    # -- star --------------------------------------------------------------------------
    Case("star build", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("star build", "garbage-jsonl", ["{garbage_jsonl}", "--reviews", "{reviews}", *OUT], "garbage.jsonl"),
    Case("star build", "garbage-parquet", ["{garbage_parquet}", "--reviews", "{reviews}", *OUT], "garbage.parquet"),
    Case("star build", "corrupt-parquet", ["{corrupt_parquet}", "--reviews", "{reviews}", *OUT], "corrupt.parquet"),
    Case("star build", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("star build", "missing-clusters", ["{statements}", "--reviews", "{reviews}", "--clusters", "{missing_dir}",
                                            *OUT], "/missing_dir"),
    *_cases_for_config("star build", ["{statements}", "--reviews", "{reviews}", *OUT]),
    Case("star baselines", "missing-input", ["{missing_dir}", *OUT], "/missing_dir"),
    Case("star baselines", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("star baselines", "bad-method", ["{empty}", "--method", "nosuch", *OUT], "--method"),
    Case("star baselines", "bad-level", ["{empty}", "--level", "nosuch", *OUT], "--level"),
    *_cases_for_config("star baselines", ["{empty}", *OUT]),
    Case("star train", "missing-input", ["{missing_dir}", *OUT], "/missing_dir"),
    Case("star train", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("star train", "bad-model", ["{empty}", "--model", "nosuch", *OUT], "--model"),
    Case("star train", "bad-set", ["{empty}", "--set", "epochs", *OUT], "--set"),
    Case("star train", "bad-grid", ["{empty}", "--grid", "lr", *OUT], "--grid"),
    Case("star train", "bad-seeds", ["{empty}", "--seeds", "0", *OUT], "--seeds"),
    *_cases_for_config("star train", ["{empty}", *OUT]),
    Case("star evaluate", "missing-checkpoint", ["{empty}", "--checkpoint", "{missing_dir}", *OUT], "/missing_dir"),
    Case("star evaluate", "empty-folder", ["{empty}", "--checkpoint", "{empty}", *OUT], "/empty"),
    Case("star evaluate", "missing-features", ["{empty}", "--checkpoint", "{empty}", "--features",
                                               "{missing_parquet}", *OUT], "missing.parquet"),
    Case("star evaluate", "yaml-syntax-error", ["{empty}", "--checkpoint", "{empty}", "--config", "{bad_yaml}"],
         "bad.yaml"),
    Case("star report", "missing-run", ["{missing_dir}"], "/missing_dir"),
    Case("star report", "empty-folder", ["{empty}"], "/empty"),
    Case("star report", "bad-k", ["{empty}", "--k", "abc"], "--k"),
    # -- generate ----------------------------------------------------------------------
    Case("generate train", "missing-input", ["{missing_dir}", "--target", "review", *OUT], "/missing_dir"),
    Case("generate train", "empty-folder", ["{empty}", "--target", "review", *OUT], "/empty"),
    Case("generate train", "garbage-parquet", ["{garbage_parquet}", "--target", "review", *OUT], "garbage.parquet"),
    Case("generate train", "missing-truth", ["{empty}", "--truth", "{missing_dir}", *OUT], "/missing_dir"),
    Case("generate train", "bad-model", ["{empty}", "--model", "nosuch", *OUT], "--model"),
    Case("generate train", "bad-set", ["{empty}", "--set", "epochs", *OUT], "--set"),
    *_cases_for_config("generate train", ["{empty}", "--target", "review", *OUT]),
    Case("generate run", "missing-checkpoint", ["{missing_dir}", *OUT], "/missing_dir"),
    Case("generate run", "file-checkpoint", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("generate run", "empty-checkpoint", ["{empty}", *OUT], "/empty"),
    Case("generate run", "bad-beam-size", ["{empty}", "--beam-size", "abc", *OUT], "--beam-size"),
    *_cases_for_config("generate run", ["{empty}", *OUT]),
    Case("generate llm", "missing-input", ["{missing_dir}", "--method", "review_extract", *OUT], "/missing_dir"),
    Case("generate llm", "empty-folder", ["{empty}", "--method", "review_extract", *OUT], "/empty"),
    Case("generate llm", "bad-method", ["{empty}", "--method", "nosuch", *OUT], "--method"),
    Case("generate llm", "missing-price-table", ["{empty}", "--method", "review_extract", "--price-table",
                                                 "{missing_yaml}", *OUT], "missing.yaml"),
    *_cases_for_config("generate llm", ["{empty}", "--method", "review_extract", *OUT]),
    # -- evaluate ----------------------------------------------------------------------
    Case("evaluate", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("evaluate", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("evaluate", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("evaluate", "garbage-jsonl", ["{garbage_jsonl}", *OUT], "garbage.jsonl"),
    Case("evaluate", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("evaluate", "missing-references", ["{explanations}", "--references", "{missing_dir}", *OUT], "/missing_dir"),
    Case("evaluate", "garbage-statements", ["{explanations}", "--statements", "{garbage_jsonl}", "--metrics", "texts",
                                            *OUT], "garbage.jsonl"),
    Case("evaluate", "out-is-a-file", ["{explanations}", "--metrics", "texts", "--out", "{occupied}"], "occupied"),
    Case("evaluate", "bad-limit", ["{explanations}", "--limit", "abc", *OUT], "--limit"),
    *_cases_for_config("evaluate", ["{explanations}", "--metrics", "texts", *OUT]),
    # -- judge (LLM jobs: refused before the judge loads) ------------------------------
    Case("judge likert", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("judge likert", "garbage-parquet", ["{garbage_parquet}", "--judge-service", "none", *OUT],
         "garbage.parquet"),
    Case("judge likert", "corrupt-parquet", ["{corrupt_parquet}", "--judge-service", "none", *OUT],
         "corrupt.parquet"),
    Case("judge likert", "empty-folder", ["{empty}", "--judge-service", "none", *OUT], "/empty"),
    Case("judge likert", "garbage-contexts", ["{explanations}", "--contexts", "{garbage_csv}", "--judge-service",
                                              "none", *OUT], "garbage.csv"),
    Case("judge likert", "missing-price-table", ["{explanations}", "--price-table", "{missing_yaml}", *OUT],
         "missing.yaml"),
    Case("judge likert", "bad-mode", ["{explanations}", "--mode", "nosuch", *OUT], "--mode"),
    *_cases_for_config("judge likert", ["{explanations}", "--judge-service", "none", *OUT]),
    Case("judge pairwise", "missing-input", ["{missing_parquet}", "--baseline", "base", *OUT], "missing.parquet"),
    Case("judge pairwise", "garbage-parquet", ["{garbage_parquet}", "--baseline", "base", "--judge-service", "none",
                                               *OUT], "garbage.parquet"),
    Case("judge pairwise", "empty-folder", ["{empty}", "--baseline", "base", "--judge-service", "none", *OUT],
         "/empty"),
    Case("judge pairwise", "missing-criteria", ["{explanations}", "--baseline", "base", "--criteria",
                                                "{missing_yaml}", "--judge-service", "none", *OUT], "missing.yaml"),
    *_cases_for_config("judge pairwise", ["{explanations}", "--baseline", "base", "--judge-service", "none", *OUT]),
    Case("judge detect", "missing-reviews", ["--reviews", "{missing_dir}", *OUT], "/missing_dir"),
    Case("judge detect", "empty-reviews", ["--reviews", "{empty}", "--judge-service", "none", *OUT], "/empty"),
    Case("judge detect", "garbage-interactions", ["--interactions", "{garbage_csv}", "--reviews", "{reviews}",
                                                  "--judge-service", "none", *OUT], "garbage.csv"),
    Case("judge detect", "bad-limit", ["--reviews", "{reviews}", "--limit", "abc", *OUT], "--limit"),
    *_cases_for_config("judge detect", ["--reviews", "{reviews}", "--judge-service", "none", *OUT]),
    Case("judge winrate", "missing-run", ["{missing_dir}", *OUT], "/missing_dir"),
    Case("judge winrate", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("judge winrate", "garbage-verdicts", ["{pairwise_run}", *OUT], "verdicts.parquet"),
    Case("judge winrate", "garbage-report-json", ["{garbage_run}", *OUT], "report.json"),
    Case("judge winrate", "bad-confidence", ["{pairwise_run}", "--confidence", "abc", *OUT], "--confidence"),
    *_cases_for_config("judge winrate", ["{pairwise_run}", *OUT]),
    # -- meta-evaluate -----------------------------------------------------------------
    Case("meta-evaluate", "missing-input", ["{missing_parquet}", *OUT], "missing.parquet"),
    Case("meta-evaluate", "garbage-csv", ["{garbage_csv}", *OUT], "garbage.csv"),
    Case("meta-evaluate", "garbage-parquet", ["{garbage_parquet}", *OUT], "garbage.parquet"),
    Case("meta-evaluate", "corrupt-parquet", ["{corrupt_parquet}", *OUT], "corrupt.parquet"),
    Case("meta-evaluate", "empty-folder", ["{empty}", *OUT], "/empty"),
    Case("meta-evaluate", "garbage-human", ["{scores_csv}", "--human", "{garbage_csv}", *OUT], "garbage.csv"),
    Case("meta-evaluate", "out-is-a-file", ["{scores_csv}", "--out", "{occupied}"], "occupied"),
    Case("meta-evaluate", "bad-human-null", ["{scores_csv}", "--human-null", "abc", *OUT], "--human-null"),
    *_cases_for_config("meta-evaluate", ["{scores_csv}", *OUT]),
    # -- expscore ----------------------------------------------------------------------
    Case("expscore train", "missing-input", ["{missing_jsonl}", *OUT], "missing.jsonl"),
    Case("expscore train", "garbage-jsonl", ["{garbage_jsonl}", "--reviews", "{reviews}", *OUT], "garbage.jsonl"),
    Case("expscore train", "garbage-csv", ["{garbage_csv}", "--reviews", "{reviews}", *OUT], "garbage.csv"),
    Case("expscore train", "corrupt-parquet", ["{corrupt_parquet}", "--reviews", "{reviews}", *OUT],
         "corrupt.parquet"),
    Case("expscore train", "empty-folder", ["{empty}", "--reviews", "{reviews}", *OUT], "/empty"),
    Case("expscore train", "garbage-reviews", ["{rated_csv}", "--reviews", "{garbage_parquet}", *OUT],
         "garbage.parquet"),
    Case("expscore train", "bad-head", ["{rated_csv}", "--head", "nosuch", *OUT], "--head"),
    *_cases_for_config("expscore train", ["{rated_csv}", "--reviews", "{reviews}", *OUT]),
    Case("expscore score", "missing-input", ["{missing_jsonl}", "--model", "{empty}", *OUT], "missing.jsonl"),
    Case("expscore score", "missing-model", ["{rated_csv}", "--model", "{missing_dir}", *OUT], "/missing_dir"),
    Case("expscore score", "empty-model", ["{rated_csv}", "--model", "{empty}", "--reviews", "{reviews}", *OUT],
         "/empty"),
    Case("expscore score", "missing-reviews", ["{rated_csv}", "--model", "{empty}", "--reviews", "{missing_dir}",
                                               *OUT], "/missing_dir"),
    *_cases_for_config("expscore score", ["{rated_csv}", "--model", "{empty}", "--reviews", "{reviews}", *OUT]),
    # -- serve (refused before anything is served) -------------------------------------
    Case("serve nli", "missing-model", ["--model", "{missing_dir}"], "/missing_dir"),
    Case("serve nli", "bad-profile", ["--profile", "nosuch"], "nosuch"),
    Case("serve nli", "bad-port", ["--port", "abc"], "--port"),
    Case("serve judge", "missing-model", ["--model", "{missing_dir}"], "/missing_dir"),
    Case("serve judge", "bad-profile", ["--profile", "nosuch"], "nosuch"),
    Case("serve judge", "bad-backend-option", ["--backend-option", "batch_size"], "--backend-option"),
    Case("serve judge", "bad-max-replicas", ["--max-replicas", "abc"], "--max-replicas"),
    # -- study -------------------------------------------------------------------------
    Case("study run", "missing-file", ["{missing_yaml}", *OUT], "missing.yaml"),
    Case("study run", "yaml-syntax-error", ["{bad_yaml}", *OUT], "bad.yaml"),
    Case("study run", "yaml-list", ["{list_yaml}", *OUT], "list.yaml"),
    Case("study run", "unknown-key", ["{unknown_yaml}", *OUT], "no_such_setting"),
    Case("study run", "folder-not-file", ["{empty}", *OUT], "/empty"),
    Case("study run", "bad-set", ["{unknown_yaml}", "--set", "novalue", *OUT], "--set"),
    Case("study run", "out-is-a-file", ["{local_study}", "--out", "{occupied}"], "occupied"),
    Case("study step", "missing-call", ["{missing_dir}/call.json"], "call.json"),
    Case("study step", "garbage-call", ["{garbage_jsonl}"], "garbage.jsonl"),
    Case("study report", "missing-folder", ["{missing_dir}"], "/missing_dir"),
    Case("study report", "empty-folder", ["{empty}"], "/empty"),
    Case("study report", "garbage-state", ["{garbage_run}"], "study.json"),
    Case("study report", "out-is-a-file", ["{study_dir}", "--out", "{occupied}"], "occupied"),
    Case("study jobs", "extra-argument", ["nosuch"], "nosuch"),
    # -- demo (refused before any step runs) -------------------------------------------
    Case("demo", "out-is-a-file", ["--out", "{occupied}"], "occupied"),
    Case("demo", "overwrite-a-foreign-folder", ["--out", "{foreign}", "--overwrite"], "/foreign"),
    Case("demo", "overwrite-garbage-state", ["--out", "{garbage_run}", "--overwrite"], "study.json"),
    Case("demo", "bad-extract-reviews", ["--extract-reviews", "abc", *OUT], "--extract-reviews"),
    Case("demo", "missing-nli", ["--nli", "{missing_dir}", *OUT], "/missing_dir"),
    # -- models ------------------------------------------------------------------------
    Case("models list", "bad-profile", ["--profile", "nosuch"], "nosuch"),
    Case("models list", "bad-override", ["--profile", "local", "--model", "llm"], "'llm'"),
    Case("models resolve", "missing-path", ["{missing_dir}"], "/missing_dir"),
    Case("models prepare", "bad-profile", ["--profile", "nosuch"], "nosuch"),
]


def _case_id(case: Case) -> str:
    return f"{case.command.replace(' ', '-')}-{case.what}"


# -- the bad (and the few good) inputs -------------------------------------------------


def _reviews_table(n: int = 6) -> pa.Table:
    from rexeval.pipelines.core.schema import REVIEWS

    rows = {"review_id": [f"r{i}" for i in range(n)], "user_id": [f"u{i % 2}" for i in range(n)],
            "item_id": [f"i{i % 3}" for i in range(n)], "rating": [4.0] * n,
            "timestamp": [1_400_000_000 + i for i in range(n)], "text": ["Good strings, warm tone."] * n,
            "summary": [None] * n, "user_name": [None] * n, "item_title": [None] * n,
            "category": ["instruments"] * n, "helpful_votes": [None] * n, "source": ["x.jsonl"] * n,
            "line": list(range(1, n + 1))}
    return pa.Table.from_pydict(rows, schema=REVIEWS)


def _statements_table(n: int = 4) -> pa.Table:
    from rexeval.pipelines.core.schema import STATEMENTS

    rows = {"statement_id": [f"s{i}" for i in range(n)], "review_id": [f"r{i}" for i in range(n)],
            "user_id": [f"u{i % 2}" for i in range(n)], "item_id": [f"i{i % 3}" for i in range(n)],
            "statement": ["the strings sound warm"] * n, "topic": ["sound"] * n, "sentiment": ["positive"] * n,
            "stage": ["triplet"] * n, "provenance": [None] * n}
    return pa.Table.from_pydict(rows, schema=STATEMENTS)


def _explanations_table(n: int = 4) -> pa.Table:
    from rexeval.pipelines.core.schema import EXPLANATIONS

    rows = {"example_id": [f"r{i // 2}" for i in range(n)], "system": ["sys", "base"] * (n // 2),
            "user_id": [f"u{i // 2}" for i in range(n)], "item_id": [f"i{i // 2}" for i in range(n)],
            "explanation": ["You will like its warm tone."] * n, "reference": ["The tone is warm."] * n}
    return pa.Table.from_pydict(rows, schema=EXPLANATIONS)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-inputs")
    noise = random.Random(45)
    garbage = bytes(noise.randrange(256) for _ in range(4096))
    paths: dict[str, Path] = {
        "missing_parquet": root / "missing.parquet", "missing_jsonl": root / "missing.jsonl",
        "missing_yaml": root / "missing.yaml", "missing_dir": root / "missing_dir",
    }
    for ext in ("parquet", "jsonl", "csv"):
        paths[f"garbage_{ext}"] = root / f"garbage.{ext}"
        paths[f"garbage_{ext}"].write_bytes(garbage)
    paths["reviews"] = root / "reviews.parquet"
    pq.write_table(_reviews_table(), paths["reviews"])
    paths["statements"] = root / "statements.parquet"
    pq.write_table(_statements_table(), paths["statements"])
    paths["explanations"] = root / "explanations.parquet"
    pq.write_table(_explanations_table(), paths["explanations"])
    # Both magics in place, the middle (row groups and the footer's start) cut out.
    whole = paths["reviews"].read_bytes()
    paths["corrupt_parquet"] = root / "corrupt.parquet"
    paths["corrupt_parquet"].write_bytes(whole[: len(whole) // 2] + whole[-8:])
    paths["empty"] = root / "empty"
    paths["empty"].mkdir()
    paths["bad_yaml"] = root / "bad.yaml"
    paths["bad_yaml"].write_text("out: [unclosed\n")
    paths["list_yaml"] = root / "list.yaml"
    paths["list_yaml"].write_text("- out\n- input\n")
    paths["unknown_yaml"] = root / "unknown.yaml"
    paths["unknown_yaml"].write_text("no_such_setting: 1\n")
    paths["occupied"] = root / "occupied"
    paths["occupied"].write_text("a regular file where a folder should go\n")
    # A folder of garbage where a finished run's files are expected.
    paths["garbage_run"] = root / "garbage_run"
    paths["garbage_run"].mkdir()
    for name in ("report.json", "verdicts.parquet", "study.json", "manifest.json"):
        (paths["garbage_run"] / name).write_bytes(garbage)
    paths["foreign"] = root / "foreign"  # somebody else's folder
    paths["foreign"].mkdir()
    (paths["foreign"] / "thesis.tex").write_text("\\documentclass{article}\n")
    paths["scores_csv"] = root / "scores.csv"
    paths["scores_csv"].write_text("user_id,item_id,system,judge_persuasiveness,human_persuasiveness\n"
                                   + "".join(f"u{i % 2},i{i},s{i % 2},{1 + i % 5},{1 + (i * 3) % 5}\n"
                                             for i in range(8)))
    paths["rated_csv"] = root / "rated.csv"
    paths["rated_csv"].write_text("example_id,item_id,explanation,rating\n"
                                  + "".join(f"e{i},i{i % 3},The tone is warm and clear.,{1 + i % 5}\n"
                                            for i in range(8)))
    paths["pairwise_run"] = root / "pairwise_run"  # a `judge pairwise` folder whose verdicts are garbage
    paths["pairwise_run"].mkdir()
    (paths["pairwise_run"] / "verdicts.parquet").write_bytes(garbage)
    paths["study_dir"] = root / "study"  # a study's output folder, no step run yet
    paths["study_dir"].mkdir()
    (paths["study_dir"] / "study.json").write_text('{"name": "tiny", "steps": {}}\n')
    paths["sample_jsonl"] = SAMPLE_JSONL
    paths["local_study"] = LOCAL_STUDY
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module", autouse=True)
def _ray(ray_session):
    """The jobs that need Ray join the session's one local Ray (started once)."""
    return ray_session


class StartedWork(Exception):
    """A command began its real work (a model, an LLM stream, a Tune run, a Serve app, a
    study's steps) before refusing its bad input."""


# Where the commands' real work starts, in this process: each raises StartedWork here, so
# that a command which would load a model or train before checking its input fails at
# once, saying so, instead of spending minutes (or hanging on two shared cores).
WORK_STARTS = {
    "rexeval.ray_jobs.demo.run_study": "the demo's steps",
    "rexeval.ray_jobs.study.run_study": "the study's steps",
    "rexeval.pipelines.core.llm.stream.run_stream": "the LLM stream (its actors load the model)",
    "rexeval.pipelines.paraphrase.embed.embed_texts": "the embedder",
    "rexeval.models.encoders.embedder.Embedder.__init__": "a sentence encoder",
    "ray.tune.Tuner.fit": "Ray Tune training",
    "rexeval.serve.nli.start_nli_service": "the NLI Serve app (its replicas load the model)",
    "rexeval.serve.judge.start_judge_service": "the judge Serve app (its replicas load the model)",
    "rexeval.serve.judge_client.start_judge_service": "the judge Serve app (its replicas load the model)",
}


def _import_owner(target: str) -> None:
    """Import the longest module prefix of a dotted attribute path."""
    parts = target.split(".")
    for n in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:n])
        try:
            importlib.import_module(name)
            return
        except ModuleNotFoundError as e:
            if e.name != name:  # the module exists and lacks a dependency: say so
                raise


@pytest.fixture(autouse=True)
def _no_real_work(monkeypatch):
    """A bad input is refused before any model loads or any step runs."""
    # Every target's module is imported before any is patched: a module first imported
    # while another's function is patched (serve/judge_client.py imports serve/judge.py's
    # start_judge_service by name) would keep the stand-in after the test, for the
    # rest of the session's tests on this worker.
    for target in WORK_STARTS:
        _import_owner(target)
    for target, what in WORK_STARTS.items():
        def refuse(*args, _what=what, **kwargs):
            raise StartedWork(f"{_what} started before the bad input was refused")

        monkeypatch.setattr(target, refuse)


# -- the tests ---------------------------------------------------------------------------


def test_every_command_has_a_bad_input():
    """The table covers every leaf command: a new command needs a bad-input case here."""
    commands = leaf_commands()
    assert len(commands) >= 30 and "star build" in commands and "serve judge" in commands, commands
    covered = {c.command for c in CASES}
    missing = sorted(set(commands) - covered)
    assert not missing, f"commands without a bad-input case in {Path(__file__).name}: {missing}"
    unknown = sorted(covered - set(commands))
    assert not unknown, f"cases for commands the CLI does not have: {unknown}"


def test_case_ids_are_unique():
    ids = [_case_id(c) for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_bad_input(case: Case, bad_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a command writes by default lands in the checkout
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # nor in /tmp (an unexpected error's traceback file)
    files = {**bad_files, "out": str(tmp_path / "out")}
    args = [*case.command.split(), *(a.format(**files) for a in case.args)]
    result = CliRunner().invoke(cli, args)
    output = result.output
    shown = f"rexeval {' '.join(args)}\n--- exit {result.exit_code}, output:\n{output}"

    assert "Traceback" not in output, shown
    assert "StartedWork" not in output, f"the command began its work before refusing the bad input\n{shown}"
    assert "a bug in rexeval" not in output, f"an unexpected exception, not a refused input\n{shown}"
    assert isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception} escaped instead of a SystemExit\n{shown}")
    assert result.exit_code == case.code, shown

    lines = [line for line in output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error:"), f"the last line is not one 'Error:' line\n{shown}"
    assert sum(line.startswith("Error:") for line in lines) == 1, shown
    assert case.names in lines[-1], f"the error line does not name {case.names!r}\n{shown}"
