"""Config fields declare the paths a job reads; study plans check exactly those."""
from __future__ import annotations

from pydantic import BaseModel, Field

from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath, ReadPaths, read_settings


def test_declared_fields_are_found_with_their_other_constraints_kept():
    class Config(BaseModel):
        input: ReadPath = Field(description="what the job reads")
        out: str
        model: str = "nrt"
        extra: OptionalReadPath = None
        files: ReadPaths = Field(min_length=1)

    assert read_settings(Config) == ["input", "extra", "files"]
    assert Config.model_fields["input"].description == "what the job reads"
    assert Config(input="a", out="o", files=["f"]).extra is None
    try:
        Config(input="a", out="o", files=[])
    except ValueError as exc:
        assert "files" in str(exc)
    else:
        raise AssertionError("min_length=1 was lost")


def test_every_study_job_declares_the_paths_it_reads():
    """Pinned by hand from each job's inputs: a job that gains an input must declare it
    (or its missing file is found only when the step runs)."""
    from rexeval.pipelines.core.study_registry import STUDY_JOBS

    want = {
        "annotations": ["input"], "stats": ["input"], "flip_benchmark": ["input"],
        "statement_stats": ["input", "statements"],  # pipelines/ingest/study_job.py
        "ingest": ["inputs", "meta"], "split": ["input"],
        "extract": ["input"], "extract_quality": ["input"], "ground_truth": ["input"],
        "cluster": ["input"],
        "star_build": ["statements", "clusters", "reviews"], "star_baselines": ["data"], "star_train": ["data"],
        "generate_train": ["data", "truth"], "generate_run": ["checkpoint"], "generate_llm": ["input"],
        "evaluate": ["explanations", "references", "statements"],
        "judge_detect": ["contexts", "reviews", "interactions"],
        "judge_likert": ["contexts", "reviews", "explanations"],
        "judge_pairwise": ["contexts", "reviews", "explanations"],
        "judge_winrate": ["runs", "repeats"],  # repeats: seed 004's Table 6 re-runs
        "likert_pool": ["runs"],  # pipelines/judge/study_job.py
        "metric_table": ["run"],  # pipelines/evaluate/study_job.py
        "alert_curate": ["input"],  # pipelines/curate/study_job.py
        "meta_evaluate": ["scores", "human"],
        "expscore_train": ["inputs", "reviews", "languagetool"],
        "expscore_score": ["inputs", "reviews", "languagetool", "model"],
    }
    got = {name: read_settings(STUDY_JOBS.get(name).config) for name in STUDY_JOBS.names()}
    # The built-ins as pinned; a job added in one file is checked by the contract tests
    # below, not against this list.
    assert set(want) <= set(got), sorted(set(want) - set(got))
    assert {k: sorted(got[k]) for k in want} == {k: sorted(v) for k, v in want.items()}


def test_read_settings_names_every_read_field_of_every_job_config():
    """A job's config hash counts the files its read fields name by content (so a re-run
    from another node, where the working dir is unpacked elsewhere, resumes): a read
    field under a name READ_SETTINGS lacks would count by path again."""
    import importlib
    import inspect
    from pathlib import Path

    from rexeval.pipelines.core.read_paths import READ_SETTINGS

    root = Path(__file__).resolve().parents[3] / "pipelines"
    declared: dict[str, set[str]] = {}
    for f in sorted(root.rglob("config.py")):
        module = importlib.import_module("rexeval." + ".".join(f.relative_to(root.parent).with_suffix("").parts))
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseModel) and cls.__module__ == module.__name__:
                for field in read_settings(cls):
                    declared.setdefault(field, set()).add(f"{module.__name__}.{name}")
    assert len(declared) > 10 and "inputs" in declared and "meta" in declared
    assert set(declared) <= READ_SETTINGS, {k: v for k, v in declared.items() if k not in READ_SETTINGS}
