"""Item metadata (titles) from the Amazon meta dumps or any table, keyed by item id.

The 2014 meta files are Python-literal lines with `asin`/`title`; the 2018 ones are
JSON lines with the same keys; the 2023 ones are JSON lines with `parent_asin`/`title`;
a CSV or Parquet file needs `item_id` (or `asin`/`parent_asin`) and `title` columns.
Only items that occur in the reviews are kept, so a multi-GB meta file costs memory
for the titles that matter only. Files may be local paths or URIs.
"""
from __future__ import annotations

import zlib

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.inputs import given_text
from rexeval.storage import PathLike, location
from rexeval.pipelines.ingest.formats import open_bytes, parse_record

_ID_KEYS = ("parent_asin", "asin", "item_id")
_TITLE_KEYS = ("title", "item_title")


def load_titles(paths: list[PathLike], wanted: pa.Array | None = None) -> pa.Table:
    """Return a table (item_id, item_title), first title per item winning."""
    wanted_set = set(wanted.to_pylist()) if wanted is not None else None
    ids, titles = [], []
    for path in paths:
        for item, title in _iter_meta(path):
            if item is None or not title:
                continue
            item = str(item)
            if wanted_set is None or item in wanted_set:
                ids.append(item)
                titles.append(str(title).strip())
    t = pa.table({"item_id": pa.array(ids, pa.string()), "item_title": pa.array(titles, pa.string())})
    if t.num_rows:
        first = pc.equal(pa.array(range(t.num_rows)), pc.index_in(t.column("item_id"), value_set=t.column("item_id")))
        t = t.filter(first)
    return t


def _iter_meta(path: PathLike):
    loc = location(path)
    name = loc.name.lower().removesuffix(".gz")
    if name.endswith((".parquet", ".csv")):
        import pyarrow.csv as pacsv

        from rexeval.pipelines.core.io import read_parquet

        if name.endswith(".parquet"):
            t = read_parquet(loc)
        else:
            try:
                with open_bytes(loc) as fh:
                    t = pacsv.read_csv(fh)
            except (pa.ArrowInvalid, EOFError, OSError) as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                raise ValueError(f"{given_text(path)}: not a readable metadata CSV ({str(exc).splitlines()[0]})") from None
        idk = next((k for k in _ID_KEYS if k in t.column_names), None)
        tk = next((k for k in _TITLE_KEYS if k in t.column_names), None)
        if idk is None or tk is None:
            raise ValueError(f"{given_text(path)}: metadata needs an item id column ({'/'.join(_ID_KEYS)}) "
                             f"and a title column ({'/'.join(_TITLE_KEYS)}); found {t.column_names}")
        yield from zip(t.column(idk).to_pylist(), t.column(tk).to_pylist())
        return
    try:
        yield from _json_meta(loc)
    except (EOFError, OSError, zlib.error) as exc:  # a cut or damaged gzip
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{given_text(path)}: the file ends early or is damaged ({type(exc).__name__}: "
                         f"{exc}); repair or re-download it, or leave out --meta") from None


def _json_meta(loc):
    """(item id, title) of each JSON-lines record. A broken line only costs that item's
    title; a file of which no line is a record (another format, binary bytes) is refused,
    naming it, so a wrong --meta is never taken for a file without titles."""
    lines = records = 0
    with open_bytes(loc) as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            lines += 1
            try:
                obj = parse_record(raw.decode("utf-8", "replace"))
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                records += 1
                yield next((obj[k] for k in _ID_KEYS if obj.get(k)), None), next(
                    (obj[k] for k in _TITLE_KEYS if obj.get(k)), None)
            elif lines >= 1000 and not records:
                break  # a thousand lines and not one record: not a metadata file
    if lines and not records:
        raise ValueError(f"{given_text(loc.uri)}: not item metadata (none of its first {lines:,} line(s) is a JSON "
                         f"record); --meta takes JSON lines with {'/'.join(_ID_KEYS)} and "
                         f"{'/'.join(_TITLE_KEYS)}, or a CSV/Parquet table with those columns")
