"""A planted study job (tests/extension): counts the rows of a table into a manifest."""
from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from rexeval.pipelines.core.outputs import MANIFEST_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPath
from rexeval.pipelines.core.study_registry import register_study_job, write_manifest

OUTPUTS = Outputs(manifest=MANIFEST_OUTPUT, table=Output("rows.md", "the row count, as a Markdown table"))


class ScratchCountConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: ReadPath
    out: str


@register_study_job("scratch_count", ScratchCountConfig, outputs=OUTPUTS,
                    description="counts a table's rows (a planted study job)")
def run_scratch_count(cfg: ScratchCountConfig, progress: Callable[[str], None] = print) -> dict:
    from rexeval.pipelines.core.inputs import reviews_path
    from rexeval.pipelines.core.io import read_table
    from rexeval.storage import location

    rows = read_table(reviews_path(cfg.input), "reviews").num_rows
    out = location(cfg.out)
    out.mkdir()
    (out / OUTPUTS.table).write_text(f"| rows |\n|---|\n| {rows} |\n")
    return write_manifest(cfg, "scratch_count", {"rows": rows})
