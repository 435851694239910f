"""Parquet in and out: whole-or-nothing writes, resumable sharded outputs and manifests.

Every path here may be a local path or a URI (`rexeval/storage.py`). A job's
output folder holds one sub-folder per table (`reviews/`, `errors/`, ...) with numbered
shards `part-00000.parquet`, a `_done/` folder with one marker per finished shard, and
`manifest.json` (job, config, config hash, counts). A shard's files are written at
their final keys and its marker last (the commit point: an object PUT is atomic, and on
a local disk each file is renamed into place), and readers trust only markers, so a
crash leaves a shard that counts as not done and is rewritten whole by the re-run.
Re-running the same job skips the shards whose markers exist and yields byte-identical
files to an uninterrupted run; running it with a different config into the same folder
is refused unless asked to overwrite. The manifest lists what the job owns there (`owns`:
its tables, markers, and what else it made), and overwriting removes exactly that: other
files in the folder (`kept`) are never touched.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from rexeval.pipelines.core.read_paths import READ_SETTINGS
from rexeval.pipelines.core.schema import TABLES, SchemaError, validate_table
from rexeval.storage import Location, PathLike, is_uri, location

MANIFEST = "manifest.json"
DONE_DIR = "_done"
FORMAT_VERSION = 1


def config_hash(config: dict[str, Any]) -> str:
    """A stable hash of the settings that decide a job's output, with every local file
    they name standing for its content (`content_identity`)."""
    blob = json.dumps(content_identity(config), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def unset_fields(cfg: Any, *names: str) -> set[str]:
    """The named settings of `cfg` left empty (a `columns` mapping not given): what a job
    leaves out of its settings' hash, so a folder written before the field existed keeps
    its hash and resumes."""
    return {n for n in names if not getattr(cfg, n, None)}


_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def file_digest(path: str) -> str:
    """The SHA-256 of a local file's bytes (remembered for this process by path, size,
    inode and mtime; about 1.7 GB/s here, so a 10 GB input costs seconds once)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_ino, st.st_mtime_ns)
    if key not in _DIGESTS:
        with open(path, "rb") as f:
            _DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[key]


def content_identity(value: Any, keys: Iterable[str] = READ_SETTINGS,
                     counts: Callable[[str], bool] | None = None) -> Any:
    """`value` with every local file named under one of `keys` (the settings that name
    what a job reads, `read_paths.READ_SETTINGS`, at any depth) replaced by that file's
    name and content digest.

    Why: where a job's input lies is not what decides its output. A driver on another
    node finds the same submitted working dir unpacked under another folder (and each
    cluster session unpacks it anew, with new mtimes), so a hash of paths would make a
    re-run from there start over instead of resuming; a hash of contents also notices an
    input edited in place. Only declared inputs count so: a file a setting names for
    writing (a call log, a cache) changes with every run. Folders and URIs stay as they
    are: a folder is an upstream job's output (its own markers say what is done) and a
    URI names the same object from every node. `counts(path)`: which files count so (a
    study leaves out its own steps' outputs, whose upstream fingerprints stand for them)."""
    keys = frozenset(keys)
    if isinstance(value, dict):
        return {k: _by_content(v, counts) if k in keys else content_identity(v, keys, counts)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [content_identity(v, keys, counts) for v in value]
    return value


def _by_content(value: Any, counts: Callable[[str], bool] | None = None) -> Any:
    """A read setting's value with its local files by content (it may be a path, a list of
    them, or records such as ingest's {"path", "size"})."""
    if isinstance(value, dict):
        return {k: _by_content(v, counts) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_by_content(v, counts) for v in value]
    if (isinstance(value, str) and len(value) < 4096 and not is_uri(value) and os.path.isfile(value)
            and (counts is None or counts(value))):
        return {"file": os.path.basename(value), "sha256": file_digest(value)}
    return value


def is_atomic_leftover(path: PathLike) -> bool:
    """A temporary file of a local whole-or-nothing write that a killed run never renamed
    into place (`.NAME.XXXX.tmp`): it holds no committed output."""
    loc = location(path)
    return loc.name.startswith(".") and loc.name.endswith(".tmp") and loc.is_file()


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Write `data` at `path` whole or not at all (`Location.write_bytes`)."""
    location(path).write_bytes(data)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    location(path).write_json(obj)


def write_parquet_atomic(path: PathLike, table: pa.Table) -> None:
    """Write one Parquet file (zstd) at `path` whole or not at all."""
    location(path).write_parquet(table)


class UnreadableParquet(ValueError):
    """A file that should be Parquet and is not (cut short, another format): named."""

    def __init__(self, path: PathLike, exc: BaseException):
        self.reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        super().__init__(f"{path}: not a readable Parquet file ({self.reason})")


def _unreadable(exc: BaseException) -> bool:
    """Arrow's answer for bytes that are not Parquet (not a missing file or a store)."""
    return isinstance(exc, (pa.ArrowInvalid, pa.ArrowNotImplementedError)) or (
        isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)
        and any(m in str(exc) for m in ("Parquet", "parquet", "magic bytes", "footer", "Thrift", "Couldn't deserialize")))


def read_parquet(path: PathLike, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file, local or by URI; a file that is not Parquet is named."""
    loc = location(path)
    try:
        return pq.read_table(loc.path, filesystem=loc.fs, columns=columns)
    except Exception as exc:  # noqa: BLE001  (re-raised unless it is unreadable bytes)
        if _unreadable(exc):
            raise UnreadableParquet(loc, exc) from None
        raise


def parquet_schema(path: PathLike) -> pa.Schema:
    """A Parquet file's schema (its footer only); a file that is not Parquet is named."""
    loc = location(path)
    try:
        with loc.open_input() as fh:
            return pq.read_schema(fh)
    except Exception as exc:  # noqa: BLE001
        if _unreadable(exc):
            raise UnreadableParquet(loc, exc) from None
        raise


def table_files(path: PathLike) -> list[Location]:
    """The Parquet files of a table: the file itself, or a folder's parts in order."""
    loc = location(path)
    if loc.is_dir():
        return [p for p in loc.glob("*.parquet") if not p.name.startswith(".")]
    if loc.exists():
        return [loc]
    raise FileNotFoundError(f"no such table: {loc}")


def told_format(path: PathLike, name: str = "table", head: bool = False) -> str:
    """A table file's format (`table_formats.table_format`: by its name, checked by its
    first bytes); a file in none is a SchemaError naming it and the formats read. `head`:
    a file named .parquet is taken at its word (reading its footer is the check)."""
    from rexeval.pipelines.core.table_formats import UnknownTableFormat, table_format

    if head and location(path).name.lower().endswith(".parquet"):
        return "parquet"
    try:
        return table_format(path)
    except UnknownTableFormat as exc:
        raise SchemaError(name, str(path), None, None, str(exc).split(": ", 1)[-1]) from None


def read_raw(path: PathLike, schema: str | pa.Schema | None = None, rename: dict[str, str] | None = None,
             name: str = "table", *, head: bool = False, text: bool = False, fmt: str | None = None) -> pa.Table:
    """One file of a table as it is, in any format `table_formats` reads (Parquet, CSV,
    TSV, JSON lines, gzipped or not), its columns renamed by `rename` (ours -> theirs;
    with a `schema`, only the schema's columns: one mapping may name several tables');
    not validated. A file that is none of them, or not readable as the one it claims to
    be, is a SchemaError naming it and the format tried.

    `head`: only its first block of rows (of a Parquet file none: its footer's columns),
    to check a table's columns before tasks read it. `text`: CSV and TSV columns as text,
    as written. `fmt`: its format, when the caller has told it already."""
    from rexeval.pipelines.core.table_formats import read_any, read_head, renamed, their_types

    fmt = fmt or told_format(path, name, head)
    sch = TABLES[schema] if isinstance(schema, str) else schema
    if rename and sch is not None:  # one mapping may serve several tables: each takes its own columns
        rename = {ours: theirs for ours, theirs in rename.items() if ours in sch.names}
    if fmt == "parquet":
        try:
            t = parquet_schema(path).empty_table() if head else read_parquet(path)
        except (UnreadableParquet, pa.ArrowInvalid) as exc:
            reason = getattr(exc, "reason", str(exc))
            raise SchemaError(name, str(path), None, None, f"not a readable Parquet file ({reason})") from None
    else:
        types = their_types(sch, rename) if sch is not None else None
        try:
            t = read_head(path, fmt, types) if head else read_any(path, fmt, types, text=text)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = "the file is empty" if reason.startswith("Empty CSV file") else reason
            raise SchemaError(name, str(path), None, None, f"not a readable {fmt.upper()} file ({reason})") from None
        if fmt != "jsonl" and not text and sch is not None:
            return _empty_as_null(renamed(t, rename), sch)
    return renamed(t, rename)


def _empty_as_null(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """A CSV's empty cells of the schema's nullable text columns as missing (CSV has no
    other way to write one), as Parquet and JSON lines would hold them."""
    import pyarrow.compute as pc

    for f in schema:
        i = t.schema.get_field_index(f.name)
        if f.nullable and pa.types.is_string(f.type) and i >= 0 and pa.types.is_string(t.schema.field(i).type):
            col = t.column(i)
            t = t.set_column(i, f.name, pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.string()), col))
    return t


def read_part(path: PathLike, schema: str | pa.Schema, columns: list[str] | None = None,
              rename: dict[str, str] | None = None) -> pa.Table:
    """One part of a table (any format `read_raw` reads), validated against `schema`: a
    missing or unexpected column is a SchemaError naming the part and the columns found."""
    name = schema if isinstance(schema, str) else None
    fmt = told_format(path, name or "table")
    t = validated(read_raw(path, schema, rename, name or "table", fmt=fmt), schema, str(path), name, fmt, rename)
    return t.select(columns) if columns is not None else t


FORMAT_NAMES = {"parquet": "Parquet", "csv": "CSV", "tsv": "TSV", "jsonl": "JSON-lines"}


def validated(raw: pa.Table, schema: str | pa.Schema, source: str, name: str | None = None,
              fmt: str | None = None, rename: dict[str, str] | None = None) -> pa.Table:
    """`schema.validate_table`, a missing or unexpected column also naming the format the
    file was read as (`fmt`), the columns it has and how to map them, and first any
    mapping of `rename` (ours -> theirs, as given to `read_raw`) that named no column of
    the file: a misspelt `--columns` entry, said as such."""
    try:
        return validate_table(raw, schema, source=source, name=name)
    except SchemaError as exc:
        if exc.problem.startswith(("required column is missing", "unexpected column")):
            exc.problem += unmatched_mapping(raw.column_names, schema, rename) + columns_found(raw.column_names, fmt)
        raise


def unmatched_mapping(names: Iterable[str], schema: str | pa.Schema, rename: dict[str, str] | None) -> str:
    """The message's part for `--columns` entries of this table's columns whose column
    is in the file under neither name (after `read_raw` renamed what it found)."""
    sch = TABLES[schema] if isinstance(schema, str) else schema
    have = set(names)
    bad = [f"{ours}={theirs}" for ours, theirs in (rename or {}).items()
           if ours in sch.names and ours not in have and theirs not in have]
    return f"; --columns {', '.join(bad)}: the file has no such column" if bad else ""


def columns_found(names: Iterable[str], fmt: str | None = None) -> str:
    """What a missing or unexpected column's message adds: the format the file was read
    as, the columns it has, and how to map them."""
    read_as = f"{FORMAT_NAMES.get(fmt, fmt)} file, " if fmt else ""
    return (f"; {read_as}columns found: {', '.join(map(str, names)) or 'none'} (map yours with "
            "--columns OURS=YOURS, or `columns:` in a config)")


def read_table(path: PathLike, schema: str | pa.Schema, columns: list[str] | None = None,
               rename: dict[str, str] | None = None) -> pa.Table:
    """Read a table (a file in any format `read_raw` reads, or a folder of Parquet parts),
    validating each part against `schema`.

    A mismatch raises `SchemaError` naming the part file, the row within it and the
    field, rather than failing later in a stage with an unrelated message.
    """
    files = table_files(path)
    sch = TABLES[schema] if isinstance(schema, str) else schema
    parts = [read_part(f, schema, columns, rename) for f in files]
    if not parts:
        t = sch.empty_table()
        return t.select(columns) if columns is not None else t
    return pa.concat_tables(parts)


def json_lines(path: PathLike, table: str,
               on_bad: Callable[[int, str, str], None] | None = None) -> Iterator[tuple[int, dict]]:
    """(1-based line, object) of every non-blank line of a JSON-lines file. A line that
    is not a JSON object raises `SchemaError` naming the file and line, or, with
    `on_bad`, is passed to `on_bad(line number, problem, raw line)` and skipped (for
    readers that turn bad lines into error rows). A file named .gz is gunzipped."""
    p = location(path)
    if p.name.lower().endswith(".gz"):
        try:
            text = gzip.decompress(p.read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise SchemaError(table, str(p), None, None, f"not a readable gzipped JSON-lines file ({exc})") from None
    else:
        text = p.read_text(encoding="utf-8")
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problem = f"not JSON: {exc.msg}"
        else:
            if isinstance(obj, dict):
                yield n, obj
                continue
            problem = "expected a JSON object"
        if on_bad is None:
            raise SchemaError(table, str(p), None, n, problem)
        on_bad(n, problem, line)


def _listed(entries: list[Location], most: int = 5) -> str:
    names = [e.name + ("/" if e.is_dir() else "") for e in entries[:most]]
    return ", ".join(names) + (f" and {len(entries) - most} more" if len(entries) > most else "")


def remove_entries(root: PathLike, names: Iterable[str], entries: list[Location] | None = None) -> list[str]:
    """Remove from the folder `root` the entries called `names` (top-level names, as a
    job's declared outputs begin) and unrenamed temporary files; return the names of the
    other entries, which stay as they are. What `--overwrite` does: a job removes what
    it wrote, never what it finds beside it."""
    import fnmatch
    import re

    # A declared template (`train-{name}.json`) stands for every file it names.
    patterns = {re.sub(r"\{[^{}]*\}", "*", str(n).split("/", 1)[0]) for n in names}
    kept = []
    for e in location(root).iterdir() if entries is None else entries:
        if any(fnmatch.fnmatchcase(e.name, p) for p in patterns) or is_atomic_leftover(e):
            e.rmtree()
        else:
            kept.append(e.name)
    return sorted(kept)


def remove_owned(root: Location, entries: list[Location], manifest: dict) -> list[str]:
    """Remove from `root` the entries an earlier job's `manifest` lists as its own
    (`owns`; a manifest from before that list names its tables, `_done` and itself);
    return the names of the others, which stay."""
    owns = set(manifest.get("owns") or [*manifest.get("tables", []), DONE_DIR, MANIFEST])
    # The manifest is rewritten last by the caller: a crash in between leaves it, so the
    # folder still reads as that job's output (and --overwrite can be repeated).
    kept = remove_entries(root, owns - {MANIFEST}, [e for e in entries if e.name != MANIFEST])
    return kept


class ShardedOutput:
    """A resumable, sharded job output (see the module docstring)."""

    def __init__(self, root: PathLike, job: str, config: dict[str, Any], tables: Iterable[str],
                 owns: Iterable[str] = ()):
        """`owns`: what else the job writes in its folder besides its tables (declared
        outputs, `pipelines/core/outputs.py`; only their first path part counts), so that
        `--overwrite` removes them with the tables and nothing else."""
        self.root = location(root)
        self.job = job
        self.config = config
        self.hash = config_hash(config)
        self.tables = list(tables)
        self.owns = sorted({*self.tables, DONE_DIR, MANIFEST, *(str(o).split("/", 1)[0] for o in owns)})
        self.kept: list[str] = []  # entries of the folder that are not this job's (kept as they are)
        self.kept_now = False  # this open found them (a message says so once)

    # -- lifecycle -----------------------------------------------------------------

    def open(self, overwrite: bool = False) -> "ShardedOutput":
        """Prepare the folder; refuse to mix outputs of two different configs, and a local
        folder that another node of the running cluster cannot see (before any work:
        `pipelines/core/reach.py`).

        `overwrite` replaces another configuration's output, removing only what that
        job's manifest lists as its own (`owns`); anything else in the folder (a user's
        notes, another tool's files) stays, and is recorded as `kept`. A folder with no
        manifest is taken only when what it holds cannot be mistaken for this job's
        output (no entry by the name of one of its tables)."""
        from rexeval.pipelines.core.reach import require_reachable

        if self.root.is_file():
            raise NotADirectoryError(f"{self.root} is a file; the {self.job} job writes a folder of "
                                     "outputs there: give a folder")
        require_reachable(self.root, what=f"the {self.job} output folder")
        manifest = self.read_manifest()
        entries = [] if manifest is None and not self.root.exists() else self.root.iterdir()
        if manifest is not None and manifest.get("config_hash") != self.hash:
            if not overwrite:
                raise FileExistsError(
                    f"{self.root} holds output of a different '{manifest.get('job')}' config "
                    f"(hash {manifest.get('config_hash')} != {self.hash}); use another output "
                    "folder or --overwrite to replace it")
            self.kept = remove_owned(self.root, entries, manifest)
            self.kept_now = bool(self.kept)
        elif manifest is None and entries:
            # Only a killed run's unrenamed temporary files (it died writing its first
            # manifest) hold nothing committed: clear them without asking.
            foreign = [e for e in entries if not is_atomic_leftover(e)]
            if foreign and not overwrite:
                raise FileExistsError(f"{self.root} is not empty and has no rexeval manifest "
                                      f"(it holds {_listed(foreign)}); use another output folder, or "
                                      "--overwrite to write beside those files")
            clash = [e for e in foreign if e.name in self.owns]
            if clash:
                raise FileExistsError(f"{self.root} holds {_listed(clash)}, which no rexeval manifest "
                                      f"accounts for and this {self.job} job would write; move or remove "
                                      "it yourself, or use another output folder")
            for e in entries:
                if is_atomic_leftover(e):
                    e.unlink()
            self.kept = sorted(e.name for e in foreign)
            self.kept_now = bool(self.kept)
        elif manifest is not None:
            self.kept = list(manifest.get("kept", []))
        self.root.mkdir()
        if manifest is None or manifest.get("config_hash") != self.hash:
            write_json_atomic(self.root / MANIFEST, self._manifest("running", {}, 0))
        return self

    def _manifest(self, status: str, counts: dict[str, int], shards: int, **extra: Any) -> dict:
        owns = self.owns
        if status == "complete":  # and what else the job made there (work folders, reports)
            owns = sorted({*owns, *(e.name for e in self.root.iterdir()
                                    if e.name not in self.kept and not is_atomic_leftover(e))})
        return {"format": FORMAT_VERSION, "job": self.job, "status": status,
                "config": self.config, "config_hash": self.hash, "shards": shards,
                "tables": self.tables, "owns": owns, **({"kept": self.kept} if self.kept else {}),
                "counts": counts, **extra}

    def read_manifest(self) -> dict | None:
        try:
            return (self.root / MANIFEST).read_json()
        except FileNotFoundError:
            return None

    def finish(self, shards: int, counts: dict[str, int] | None = None, **extra: Any) -> dict:
        """Write the final manifest: summed shard counts unless `counts` is given."""
        if counts is None:
            counts = self.total_counts()
        manifest = self._manifest("complete", counts, shards, **extra)
        write_json_atomic(self.root / MANIFEST, manifest)
        return manifest

    # -- shards ----------------------------------------------------------------------

    def shard_path(self, table: str, shard: int) -> Location:
        return self.root / table / f"part-{shard:05d}.parquet"

    def marker_path(self, shard: int) -> Location:
        return self.root / DONE_DIR / f"part-{shard:05d}.json"

    def done_shards(self) -> dict[int, dict]:
        """Finished shards and the counts their markers hold."""
        out = {}
        for p in (self.root / DONE_DIR).glob("part-*.json"):
            out[int(p.stem.split("-")[1])] = p.read_json()["counts"]
        return out

    def write_shard(self, shard: int, tables: dict[str, pa.Table], counts: dict[str, int]) -> None:
        """Write every table of one shard, then its marker (the commit point)."""
        missing = set(self.tables) - set(tables)
        if missing:
            raise ValueError(f"shard {shard} lacks tables {sorted(missing)}")
        for name, table in tables.items():
            if name in TABLES:
                table = validate_table(table, name, source=f"{self.job} shard {shard}")
            write_parquet_atomic(self.shard_path(name, shard), table)
        self.mark_done(shard, counts)

    def mark_done(self, shard: int, counts: dict[str, int]) -> None:
        """Commit a shard whose files are already in place."""
        write_json_atomic(self.marker_path(shard), {"shard": shard, "counts": counts})

    def shard_counts(self, shard: int) -> dict[str, int]:
        return self.marker_path(shard).read_json()["counts"]

    def total_counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for counts in self.done_shards().values():
            for k, v in counts.items():
                total[k] = total.get(k, 0) + int(v)
        return total

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """A table of this output, every part. A table without a declared schema takes its
        parts' own, unified: a part written from pandas whose column held only None has
        it as type null, which another part's strings or numbers fill in."""
        if table in TABLES:
            return read_table(self.root / table, table, columns)
        files = table_files(self.root / table)
        schema = pa.unify_schemas([parquet_schema(f) for f in files], promote_options="permissive")
        return read_table(self.root / table, schema, columns)
