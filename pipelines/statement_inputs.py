"""Where statement tables come from: an `rexeval extract` folder or Parquet files.

Jobs that consume statements (ground truth, clustering, the ranking benchmark) find
the shards, check their columns before any work, and pick which stage's rows to use
the same way, through these functions.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.io import table_files
from pipelines.schema import SchemaError, validate_table


def statement_files(path: str | Path) -> list[Path]:
    """The statement shards of an extract folder (its statements/), a folder, or a file."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"statements input not found: {p} (expected an `rexeval "
                                "extract` output folder or a statements Parquet file)")
    src = p / "statements" if (p / "statements").is_dir() else p
    files = table_files(src)
    if not files:
        raise FileNotFoundError(f"no statements shards (*.parquet) in {src}")
    return files


def check_schemas(files: list[Path]) -> None:
    """Fail before any work when a file's columns do not fit STATEMENTS (reads footers only)."""
    for f in files:
        try:
            schema = pq.read_schema(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError("statements", str(f), None, None,
                              f"not a readable Parquet file: {exc}") from None
        validate_table(schema.empty_table(), "statements", source=str(f))


def resolve_stage(files: list[Path], stage: str) -> str:
    """"auto" -> "verified" if any verified row exists (in any shard), else "triplet"."""
    if stage != "auto":
        return stage
    for f in files:
        col = pq.read_table(f, columns=["stage"]).column("stage")
        if pc.any(pc.equal(col, "verified")).as_py():
            return "verified"
    return "triplet"
