"""Two cheap study jobs that read and write only through the storage module, for the
tests of a study whose folder is a URI: `lines` turns text files into a table, `total`
sums an upstream table. Module-level, as every study job must be (each step runs in a
process of its own, which imports its job by name)."""
from __future__ import annotations

import pyarrow as pa
from pydantic import BaseModel

from rexeval.pipelines.core.read_paths import ReadPath, ReadPaths


class LinesConfig(BaseModel):
    inputs: ReadPaths
    out: str


class TotalConfig(BaseModel):
    input: ReadPath
    out: str


def lines(cfg: LinesConfig, progress) -> dict:
    """Every non-empty line of the inputs, numbered, as OUT/table/part-00000.parquet."""
    from rexeval.storage import location

    texts = [line for f in cfg.inputs for line in location(f).read_text().splitlines() if line.strip()]
    out = location(cfg.out)
    (out / "table" / "part-00000.parquet").write_parquet(
        pa.table({"n": list(range(len(texts))), "chars": [len(t) for t in texts]}))
    manifest = {"job": "lines", "status": "complete", "counts": {"lines": len(texts)}}
    (out / "manifest.json").write_json(manifest)
    progress(f"lines: {len(texts)} line(s) from {len(cfg.inputs)} file(s)")
    return manifest


def total(cfg: TotalConfig, overwrite, progress) -> dict:
    """The sum of the upstream table's `chars`, as OUT/total.json."""
    from rexeval.pipelines.core.io import read_parquet
    from rexeval.storage import location

    parts = location(cfg.input) / "table"
    table = pa.concat_tables([read_parquet(p) for p in parts.glob("*.parquet")])
    chars = sum(table.column("chars").to_pylist())
    report = {"job": "total", "counts": {"rows": table.num_rows, "chars": chars}}
    (location(cfg.out) / "total.json").write_json(report)
    (location(cfg.out) / "total.md").write_text(f"| rows | chars |\n|---|---|\n| {table.num_rows} | {chars} |\n")
    progress(f"total: {chars} character(s) in {table.num_rows} row(s)")
    return report
