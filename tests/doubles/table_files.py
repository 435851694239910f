"""Planted tables written as a user keeps them: Parquet, CSV, TSV or JSON lines, gzipped
when the name ends in .gz, with our column names renamed to theirs (`rename`: ours ->
theirs). What the commands' table-format tests feed them."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq


def _lines(rows: list[dict]) -> bytes:
    """JSON lines; a float NaN (pandas' missing value) is written as null, as JSON has no NaN."""
    return "".join(json.dumps({k: None if v != v else v for k, v in r.items()}) + "\n" for r in rows).encode()


def write_arrow_as(table: pa.Table, path: Path, rename: dict[str, str] | None = None) -> Path:
    """`table` at `path` in the format its name says, written by Arrow (CSV cells quoted)."""
    rename = rename or {}
    table = table.rename_columns([rename.get(c, c) for c in table.column_names])
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        pq.write_table(table, path)
        return path
    if name.endswith((".csv", ".tsv")):
        sink = pa.BufferOutputStream()
        pcsv.write_csv(table, sink, pcsv.WriteOptions(delimiter="\t" if name.endswith(".tsv") else ","))
        data = sink.getvalue().to_pybytes()
    else:
        data = _lines(table.to_pylist())
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def write_frame_as(df: pd.DataFrame, path: Path, rename: dict[str, str] | None = None) -> str:
    """`df` at `path` in the format its name says, written by pandas (CSV cells as pandas
    prints them); returns the path as text."""
    df = df.rename(columns=rename or {})
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        df.to_parquet(path)
        return str(path)
    if name.endswith((".csv", ".tsv")):
        data = df.to_csv(index=False, sep="\t" if name.endswith(".tsv") else ",").encode()
    else:
        data = _lines(df.to_dict("records"))
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return str(path)
