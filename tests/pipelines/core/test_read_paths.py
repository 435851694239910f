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
    (or its missing file is found only when the stage runs)."""
    from rexeval.pipelines.study.jobs import STUDY_JOBS

    want = {
        "annotations": ["input"], "stats": ["input"], "flip_benchmark": ["input"],
        "ingest": ["inputs", "meta"], "split": ["input"],
        "extract": ["input"], "extract_quality": ["input"], "ground_truth": ["input"],
        "cluster": ["input"],
        "star_build": ["statements", "clusters", "reviews"], "star_baselines": ["data"], "star_train": ["data"],
        "generate_train": ["data", "truth"], "generate_run": ["checkpoint"], "generate_llm": ["input"],
        "evaluate": ["explanations", "references", "statements"],
        "judge_detect": ["contexts", "reviews", "interactions"],
        "judge_likert": ["contexts", "reviews", "explanations"],
        "judge_pairwise": ["contexts", "reviews", "explanations"],
        "judge_winrate": ["runs"],
        "meta_evaluate": ["scores", "human"],
        "expscore_train": ["inputs", "reviews", "languagetool"],
        "expscore_score": ["inputs", "reviews", "languagetool", "model"],
    }
    got = {name: read_settings(STUDY_JOBS.get(name).config) for name in STUDY_JOBS.names()}
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}
