"""The study job `likert_pool`: several `judge likert` outputs as one scores table.

A Likert step runs its judges on one backend (the open models on vLLM, the API models
through an OpenAI-compatible client), but seed 001 compares all six judges in one Table 1
and averages five of them in Figure 4 (section 5 leaves Llama2-7B out). This job puts the
steps' `likert_scores.parquet` side by side, keeps the judges named (default: every one),
and leaves out the `ensemble(...)` rows each multi-judge step added: an ensemble-size sweep
averages the members itself, and a step's own mean would enter it as one more "judge".

    steps:
      pool: {job: likert_pool, with: {runs: ["{likert_open}", "{likert_api}"], judges: [...]}}

A run may also be a scores table of yours: Parquet, CSV, TSV or JSON lines, gzipped or
not, its columns mapped to ours by `columns:` (e.g. `{score: rating}`); a missing column
names the file, the format read and the columns found.

`meta_evaluate` reads the pooled table as it reads one `judge likert` output. The same
judge scoring the same explanation and aspect in two runs is refused (the runs overlap).
"""
from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, Outputs
from rexeval.pipelines.core.read_paths import ReadPaths
from rexeval.pipelines.core.study_registry import register_study_job, write_manifest
from rexeval.pipelines.judge.config import LIKERT_OUTPUTS

OUTPUTS = Outputs(scores=LIKERT_OUTPUTS.scores, table=LIKERT_OUTPUTS.table, manifest=MANIFEST_OUTPUT)
ENSEMBLE_PREFIX = "ensemble("  # the judge name `likert.ensemble` gives a step's own mean
KEYS = ["judge", "example_id", "system", "aspect"]


class LikertPoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runs: ReadPaths = Field(min_length=1, description="`judge likert` folders or scores files (any table format)")
    out: str
    judges: list[str] = Field(default_factory=list, description="the judges kept, in this order (default: all)")
    keep_ensembles: bool = Field(False, description="keep the `ensemble(...)` rows the runs added")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for a scores "
                                    "file of yours (e.g. {score: rating, judge: model})")


def pool_scores(frames: list, judges: list[str], keep_ensembles: bool = False):
    """The runs' score rows as one table (pandas frames in, one frame out); ValueError
    naming what is wrong: a judge asked for that no run has, or a score given twice."""
    import pandas as pd

    scores = pd.concat(frames, ignore_index=True)
    if not keep_ensembles:
        scores = scores[~scores["judge"].astype(str).str.startswith(ENSEMBLE_PREFIX)]
    if judges:
        present = list(dict.fromkeys(scores["judge"]))
        absent = [j for j in judges if j not in present]
        if absent:
            raise ValueError(f"judge(s) {absent} are in none of the runs; they hold {present}")
        order = {j: i for i, j in enumerate(judges)}
        scores = scores[scores["judge"].isin(order)]
        scores = scores.iloc[scores["judge"].map(order).argsort(kind="stable")]
    twice = scores.duplicated(KEYS, keep=False)
    if twice.any():
        first = scores[twice].iloc[0]
        raise ValueError(f"judge {first['judge']!r} scored ({first['example_id']}, {first['system']}, "
                         f"{first['aspect']}) in more than one run; pool runs that do not overlap")
    return scores.reset_index(drop=True)


@register_study_job("likert_pool", LikertPoolConfig, outputs=OUTPUTS,
                    description="several `judge likert` outputs as one scores table (seed 001's six judges)")
def run_likert_pool(cfg: LikertPoolConfig, progress: Callable[[str], None] = print) -> dict:
    import pyarrow as pa

    from rexeval.pipelines.core.io import write_bytes_atomic, write_parquet_atomic
    from rexeval.storage import location
    from rexeval.pipelines.judge.inputs import read_likert_scores
    from rexeval.pipelines.judge.jobs import likert_table

    frames = []
    for run in cfg.runs:  # a run's folder, or a scores table in any format (`columns` maps yours)
        loc = location(run)
        frames.append(read_likert_scores(loc / LIKERT_OUTPUTS.scores if loc.is_dir() else run, cfg.columns))
    scores = pool_scores(frames, cfg.judges, cfg.keep_ensembles)
    root = location(cfg.out)
    write_parquet_atomic(root / OUTPUTS.scores, pa.Table.from_pandas(scores, preserve_index=False))
    write_bytes_atomic(root / OUTPUTS.table, likert_table(scores).encode())
    judges = list(dict.fromkeys(scores["judge"]))
    progress(f"likert pool: {len(scores):,} score(s) of {len(judges)} judge(s) from {len(cfg.runs)} run(s)")
    return write_manifest(cfg, "likert_pool", {"scores": len(scores), "judges": len(judges)}, judges=judges)
