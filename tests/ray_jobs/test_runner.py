"""The one job runner (`ray_jobs.common.run_job`) and the registry-read choices, as the
commands use them: settings from YAML and flags, Ray started only by the jobs that use
it, the pipeline called with the settings, the closing summary; names registered at
test time are taken and listed, `package.module:Class` plug-ins are taken. No Ray starts
here: `init_ray` and the pipeline functions are replaced by fakes."""
from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs import common
from rexeval.ray_jobs.cli import cli

SAMPLE = "pipelines/sample/reviews.jsonl"


class ToyGenerator:
    """A trained generator of a user's own package (registered or named module:Class)."""


class ToyMethod:
    """A prompted generator of a user's own package."""


@pytest.fixture
def calls(monkeypatch):
    """What the runner did, in order: Ray started, the pipeline called with its settings."""
    seen: list = []
    monkeypatch.setattr(common, "init_ray", lambda: seen.append("init_ray"))
    return seen


def _fake(seen: list, result: dict):
    def run(cfg, progress, **kwargs):
        seen.append(("run", cfg, kwargs))
        progress("fake progress line")
        return result

    return run


# ---------------------------------------------------------------- the runner


def test_run_job_loads_starts_ray_runs_shows_and_summarises(calls, tmp_path, capsys):
    from pydantic import BaseModel

    class Settings(BaseModel):
        out: str
        size: int = 1
        names: list[str] = []

    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text("size: 3\nout: from-yaml\n")
    result = common.run_job(
        lambda cfg, r: f"toy {cfg.size}", Settings, _fake(calls, {"counts": {"rows": 1234}}), str(cfg_file),
        {"out": str(tmp_path / "o"), "names": ("a", "b"), "size": None},
        show=lambda cfg, r: click.echo(f"shown {sorted(r)}"),
        outputs=lambda cfg, r: {"table": f"{cfg.out}/t.parquet"}, notes=lambda cfg, r: ["a note"])
    assert result == {"counts": {"rows": 1234}}
    assert calls[0] == "init_ray" and calls[1][0] == "run"
    cfg = calls[1][1]
    assert (cfg.out, cfg.size, cfg.names) == (str(tmp_path / "o"), 3, ["a", "b"])  # flag wins; None = not given
    out = capsys.readouterr().out
    assert out.index("fake progress line") < out.index("shown ['counts']") < out.index("== toy 3 ")
    assert "rows" in out and "1,234" in out and f"{tmp_path}/o/t.parquet" in out and "note: a note" in out


def test_run_job_without_ray_and_with_the_default_counts(calls, capsys):
    from pydantic import BaseModel

    class Settings(BaseModel):
        out: str

    common.run_job("quiet", Settings, _fake(calls, {"counts": {"in": 2}}), None, {"out": "o"}, ray=False)
    assert "init_ray" not in calls
    out = capsys.readouterr().out
    assert "== quiet " in out and "in" in out and "time" in out


def test_a_ray_command_runs_through_the_runner(calls, monkeypatch, tmp_path):
    """`rexeval ingest`: YAML then flags into IngestConfig (`--format` reaches `format`),
    Ray started before the pipeline, --overwrite passed to it, the summary printed."""
    import rexeval.ray_jobs.ingest as ingest

    monkeypatch.setattr(ingest, "run_ingest", _fake(calls, {"counts": {"in": 7, "out": 5, "errors": 2}}))
    cfg_file = tmp_path / "ingest.yaml"
    cfg_file.write_text("category: Toys\nchunk_mb: 8\n")
    res = CliRunner().invoke(cli, ["ingest", SAMPLE, "--out", str(tmp_path / "o"), "--format", "amazon2014",
                                   "--chunk-mb", "4", "--overwrite", "--config", str(cfg_file)])
    assert res.exit_code == 0, res.output
    assert calls[0] == "init_ray"
    _, cfg, kwargs = calls[1]
    assert kwargs == {"overwrite": True}
    assert (cfg.format, cfg.category, cfg.chunk_mb, cfg.out) == ("amazon2014", "Toys", 4.0, str(tmp_path / "o"))
    assert "== ingest " in res.output and "error rows" in res.output and f"{tmp_path}/o/reviews" in res.output


def test_a_command_without_ray_does_not_start_it(calls, monkeypatch, tmp_path):
    """`rexeval split` runs in-process: the same flow, no Ray; --cold-start reaches its field."""
    import rexeval.ray_jobs.split as split

    monkeypatch.setattr(split, "run_split", _fake(calls, {"counts": {"train": 3}}))
    res = CliRunner().invoke(cli, ["split", SAMPLE, "--out", str(tmp_path / "s"), "--no-cold-start"])
    assert res.exit_code == 0, res.output
    assert "init_ray" not in calls
    _, cfg, kwargs = calls[0]
    assert cfg.drop_cold_start_items is False and kwargs == {"overwrite": False}
    assert "== split " in res.output and f"{tmp_path}/s/train" in res.output


def test_evaluate_passes_every_flag_through_to_its_settings(calls, monkeypatch, tmp_path):
    """Each evaluate setting is written once, as its option: the flags reach
    EvaluateConfig by name (--metrics included), over the YAML file's values."""
    import rexeval.ray_jobs.evaluate as evaluate

    report = {"counts": {"examples": 4}, "tables_md": "| table |", "family_counts": {}, "skipped": {},
              "skipped_for_systems": {}}
    monkeypatch.setattr(evaluate, "run_evaluate", _fake(calls, report))
    expl = tmp_path / "explanations.parquet"
    expl.write_text("")
    cfg_file = tmp_path / "eval.yaml"
    cfg_file.write_text("limit: 99\ndataset: from-yaml\nbootstrap: 10\n")
    res = CliRunner().invoke(cli, ["evaluate", str(expl), "--out", str(tmp_path / "e"), "--metrics", "bertscore",
                                   "--metrics", "sts", "--skip", "sts", "--system", "peter", "--limit", "3",
                                   "--device", "cpu", "--task", "review", "--bootstrap", "0", "--profile", "local",
                                   "--config", str(cfg_file)])
    assert res.exit_code == 0, res.output
    _, cfg, kwargs = calls[1]
    assert kwargs == {"overwrite": False}
    assert cfg.explanations == [str(expl)] and cfg.metrics == ["bertscore", "sts"] and cfg.skip == ["sts"]
    assert (cfg.systems, cfg.limit, cfg.device, cfg.task, cfg.bootstrap, cfg.dataset) == \
        (["peter"], 3, "cpu", "review", 0, "from-yaml")
    assert "| table |" in res.output and "== evaluate " in res.output and f"{tmp_path}/e/tables.md" in res.output


# ---------------------------------------------------------- registry-read choices


@pytest.fixture
def toy_generator():
    from rexeval.models.generators.base import GENERATORS

    GENERATORS.register("toygen")(ToyGenerator)
    try:
        yield "toygen"
    finally:
        GENERATORS.pop("toygen")


@pytest.fixture
def toy_method():
    from rexeval.pipelines.generate.prompted.methods import METHODS

    METHODS.register("toy_method")(ToyMethod)
    try:
        yield "toy_method"
    finally:
        METHODS.pop("toy_method")


def test_a_generator_registered_now_is_taken_and_listed(toy_generator):
    from rexeval.ray_jobs.generate import split_model_flags

    assert split_model_flags(("ToyGen", "llm=/models/x")) == ("toygen", ["llm=/models/x"])
    spec = f"{__name__}:ToyGenerator"
    assert split_model_flags((spec,)) == (spec, [])  # a plug-in keeps its case
    with pytest.raises(click.BadParameter, match="toygen"):  # the known names, the new one among them
        split_model_flags(("gpt5",))
    res = CliRunner().invoke(cli, ["generate", "train", "--help"], terminal_width=200)
    assert res.exit_code == 0 and "toygen" in res.output and "xrec" in res.output


def test_a_prompted_method_registered_now_is_taken_listed_and_run(toy_method, calls, monkeypatch, tmp_path):
    import rexeval.pipelines.generate.prompted.job as job

    res = CliRunner().invoke(cli, ["generate", "llm", "--help"], terminal_width=200)
    assert res.exit_code == 0 and "toy_method" in res.output and "preference_logic" in res.output
    # the help's list of generators: each name with its docstring's first paragraph
    assert re.search(r"(?m)^  toy_method +A prompted generator of a user's own package\.$", res.output)
    report = {"table_md": "| toy table |", "interactions": 3, "explanations": 2, "errors": 1}
    monkeypatch.setattr(job, "run_prompted", _fake(calls, report))
    (tmp_path / "split").mkdir()
    res = CliRunner().invoke(cli, ["generate", "llm", str(tmp_path / "split"), "--method", "toy_method", "--out",
                                   str(tmp_path / "o"), "--set", "k_users=5"])
    assert res.exit_code == 0, res.output
    assert calls[0] == "init_ray"
    cfg = calls[1][1]
    assert cfg.methods == ["toy_method"] and cfg.settings.k_users == 5
    assert "| toy table |" in res.output and "== generate llm " in res.output and "error rows" in res.output


def test_method_takes_a_plugin_spec_and_refuses_unknown_names():
    from rexeval.ray_jobs.generate import llm_cmd

    spec = f"{__name__}:ToyMethod"
    ctx = llm_cmd.make_context("llm", ["--method", spec, "--method", "user_based"])
    assert ctx.params["methods"] == (spec, "user_based")
    with pytest.raises(click.BadParameter, match="user_based"):
        llm_cmd.make_context("llm", ["--method", "telepathy"])
    with pytest.raises(click.BadParameter, match="cannot import"):
        llm_cmd.make_context("llm", ["--method", "no_such_package.mod:Method"])


def test_star_options_list_the_rankers_of_their_kind():
    from rexeval.ray_jobs.star import baselines_cmd, train_cmd

    def option_line(args, option):
        out = CliRunner().invoke(cli, [*args, "--help"], terminal_width=400).output
        return next(x for x in out.splitlines() if x.lstrip().startswith(option + " "))

    assert "Model: bper+, expgcn (default expgcn)" in option_line(["star", "train"], "--model")
    assert "Baseline, repeatable: globalpop, itempop, random, userpop (" in option_line(["star", "baselines"],
                                                                                        "--method")
    assert baselines_cmd.make_context("baselines", ["--method", "userpop"]).params["methods"] == ("userpop",)
    with pytest.raises(click.BadParameter, match="not one of globalpop"):
        baselines_cmd.make_context("baselines", ["--method", "expgcn"])
    with pytest.raises(click.BadParameter, match="not one of bper\\+, expgcn"):
        train_cmd.make_context("train", ["--model", "userpop"])


def test_metrics_help_lists_the_registered_families():
    from rexeval.pipelines.evaluate.families import FAMILIES, Family

    class ToyFamily(Family):
        pass

    FAMILIES.register("toy_family")(ToyFamily)
    try:
        res = CliRunner().invoke(cli, ["evaluate", "--help"], terminal_width=400)
    finally:
        FAMILIES.pop("toy_family")
    line = next(x for x in res.output.splitlines() if x.lstrip().startswith("--metrics "))
    for name in [*FAMILIES.names(), "corpus", "toy_family"]:
        assert name in line


def test_no_help_shows_an_unfilled_names_placeholder():
    def walk(cmd, path):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    for path in walk(cli, []):
        res = CliRunner().invoke(cli, [*path, "--help"])
        assert res.exit_code == 0 and "{names}" not in res.output, path
