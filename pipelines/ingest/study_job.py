"""The study job `statement_stats`: seed 000's Table II with its Statements rows.

The study's `stats` job counts a split's users, items, interactions and reviews; the
paper's Table II also counts the statements extracted from the reviews (per interaction,
user and item; unique; total), which only `rexeval info SPLIT --statements FILE` printed.
This job is that command as a study step:

    steps:
      table2: {job: statement_stats, with: {input: "{split}", statements: "{triplets}", name: "{dataset}"}}

It is a study job in one file: the study finds every `rexeval.pipelines.<capability>.study_job`
module (pipelines/core/study_registry.py), so nothing else in the product names it. The report
shows it in a generic section (its counts, and Table II from its table2.md).
"""
from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPath
from rexeval.pipelines.core.study_registry import register_study_job, write_manifest

OUTPUTS = Outputs(
    manifest=MANIFEST_OUTPUT,  # with `stats`: Table II's numbers, and the stage counted
    table=Output("table2.md", "seed 000's Table II with the Statements rows, as a Markdown table"),
)


class StatementStatsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: ReadPath = Field(description="a `split` folder (its three splits), or an `ingest` folder or reviews table")
    statements: ReadPath = Field(description="an `extract` or `annotations` folder, or a statements table")
    out: str
    name: str = Field("all", description="the dataset's column in the table")
    stage: str = Field("auto", description="which statements count: triplet, candidate or verified; auto: "
                                           "verified where any row is, else triplet")


@register_study_job("statement_stats", StatementStatsConfig, outputs=OUTPUTS,
                    description="seed 000 Table II with its Statements rows (`rexeval info --statements`)")
def run_statement_stats(cfg: StatementStatsConfig, progress: Callable[[str], None] = print) -> dict:
    from rexeval.pipelines.core.inputs import dataset_stage, of_stage, reviews_path, statement_files, table_rows
    from rexeval.pipelines.core.io import table_files, write_bytes_atomic
    from rexeval.pipelines.core.runtime import key_groups, read_dataset
    from rexeval.pipelines.core.schema import SPLIT_NAMES
    from rexeval.storage import location
    from rexeval.pipelines.ingest.stats import dataset_stats_ray, format_table

    # Read and counted by Ray workers (`stats.dataset_stats_ray`): this driver holds counts.
    source = location(cfg.input)
    if all((source / n).exists() for n in SPLIT_NAMES):
        parts = {n: source / n for n in SPLIT_NAMES}
    else:
        parts = {"all": reviews_path(source)}
    reviews = {n: read_dataset(p, "reviews") for n, p in parts.items()}
    files = statement_files(cfg.statements)
    statements = read_dataset(files, "statements").materialize()  # two passes: read once
    stage = dataset_stage(statements, cfg.stage)
    statements = statements.map_batches(of_stage, fn_kwargs={"stage": stage}, batch_format="pyarrow")
    rows = table_rows([f for p in parts.values() for f in table_files(p)] + files) or 0
    stats = {cfg.name: dataset_stats_ray(reviews, statements, key_groups(rows))}
    table = format_table(stats, markdown=True)
    progress(f"statement_stats: {stage} statements of {cfg.statements}\n{table}")
    write_bytes_atomic(location(cfg.out) / OUTPUTS.table, table.encode())
    mine = stats[cfg.name]
    counts = {"interactions": mine["interactions"], "statements": mine["statements_total"],
              "unique statements": mine["statements_unique"]}
    return write_manifest(cfg, "statement_stats", counts, stage=stage, stats=stats)
