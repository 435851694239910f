"""Where job data lives: a local path or a URI (`s3://`, `gs://`, `abfs://`, `hdfs://`),
addressed the same way through `pyarrow.fs`.

Why one module: a cluster's nodes share no disk unless someone mounts one, so every
table, marker, manifest, report and cache entry a job writes must go to a place every
node can reach, and every reader must ask that place, not its own disk. Jobs therefore
never touch `pathlib` or `open()` for data: they hold a `Location` and call its methods,
which work on a local folder on a laptop and on a bucket on a cluster.

    out = location("s3://bucket/runs/x")          # or "runs/x", or a Location
    (out / "reviews" / "part-00000.parquet").write_parquet(table)
    for part in (out / "reviews").glob("*.parquet"): ...

Committing without rename: an object store has no atomic rename (a "rename" is a copy
and a delete), but a single PUT is atomic: an object is either there whole or not at
all. So a file is written at its final key and readers trust only done markers written
after the files (`pipelines/core/io.py`). On a local disk a file is still written to a
temporary name and renamed, because a local write is not atomic and the manifest is
rewritten in place.

Credentials and endpoints come from the standard places, never from a flag: the AWS
variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`,
`AWS_ENDPOINT_URL` for an S3-compatible store such as MinIO), Google's application
default credentials, Azure's variables. pyarrow reads all of them itself.
"""
from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Union

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

PathLike = Union[str, os.PathLike, "Location"]

_FS_CACHE: dict[tuple[str, str], pafs.FileSystem] = {}
_FS_LOCK = threading.Lock()
_LOCAL = pafs.LocalFileSystem()


def is_uri(path: PathLike) -> bool:
    """A URI with a scheme other than `file` (a local path is not one)."""
    if isinstance(path, Location):
        return not path.is_local
    text = os.fspath(path) if not isinstance(path, str) else path
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


def filesystem_for(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path within it) for a URI; filesystems are made once per bucket."""
    scheme, _, rest = uri.partition("://")
    if scheme not in ("s3", "s3a", "gs", "gcs"):
        return pafs.FileSystem.from_uri(uri)
    key = (scheme, rest.split("/", 1)[0])
    with _FS_LOCK:
        fs = _FS_CACHE.get(key)
        if fs is None:
            fs = s3_from_env() if scheme in ("s3", "s3a") else pafs.FileSystem.from_uri(uri)[0]
            _FS_CACHE[key] = fs
    return fs, rest.rstrip("/")


def s3_from_env():
    """An S3 filesystem configured from the environment. `AWS_ENDPOINT_URL` is read here
    as well as by pyarrow itself, so that an `http://` endpoint (MinIO, a local test
    server) is reached over plain HTTP."""
    kwargs: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        proto, _, host = endpoint.partition("://")
        kwargs["endpoint_override"] = host.rstrip("/") if host else endpoint
        kwargs["scheme"] = proto if host else "https"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)


class NotText(UnicodeDecodeError):
    """A file read as text that is not: the decoder's error, its message naming the file
    (still a UnicodeDecodeError, and so a ValueError, for every caller that catches one)."""

    def __init__(self, where: str, exc: UnicodeDecodeError):
        super().__init__(exc.encoding, exc.object, exc.start, exc.end, exc.reason)
        self.where = where

    def __reduce__(self):  # pickles (a Ray task raising it) as what it was made from
        return (NotText, (self.where, UnicodeDecodeError(self.encoding, self.object, self.start, self.end,
                                                         self.reason)))

    def __str__(self) -> str:
        return (f"{self.where}: not a {self.encoding} text file (byte {self.start} is "
                f"{self.object[self.start:self.start + 1]!r}: {self.reason})")


class NotJSON(json.JSONDecodeError):
    """A file read as JSON that is not: the parser's error, its message naming the file
    (still a JSONDecodeError for every caller that catches one)."""

    def __init__(self, where: str, exc: json.JSONDecodeError):
        super().__init__(exc.msg, exc.doc, exc.pos)
        self.where = where

    def __reduce__(self):
        return (NotJSON, (self.where, json.JSONDecodeError(self.msg, self.doc, self.pos)))

    def __str__(self) -> str:
        return f"{self.where}: not JSON (line {self.lineno}, column {self.colno}: {self.msg})"


class Location:
    """A file or folder at a local path or under a URI (see the module docstring).

    Pickles as its text, so a stage carrying one rebuilds the filesystem on the worker
    from that worker's environment."""

    __slots__ = ("uri", "fs", "path")

    def __init__(self, where: PathLike):
        if isinstance(where, Location):
            self.uri, self.fs, self.path = where.uri, where.fs, where.path
            return
        text = os.fspath(where)
        if text.startswith("file://"):
            text = text[len("file://"):]
        if is_uri(text):
            self.uri = text.rstrip("/")
            self.fs, self.path = filesystem_for(self.uri)
        else:
            self.path = os.path.abspath(os.path.expanduser(text))
            self.uri = self.path
            self.fs = _LOCAL

    # -- identity and names --------------------------------------------------------

    def __reduce__(self):
        return (Location, (self.uri,))

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    @property
    def is_local(self) -> bool:
        return self.fs is _LOCAL or isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> "Location":
        if self.is_local:
            return Location(os.path.dirname(self.path))
        scheme, _, rest = self.uri.partition("://")
        head, _, _ = rest.rstrip("/").rpartition("/")
        return Location(f"{scheme}://{head or rest}")

    def __truediv__(self, part: str | os.PathLike) -> "Location":
        part = os.fspath(part).strip("/") if not isinstance(part, str) else part.strip("/")
        if not part:
            return self
        if self.is_local:
            return Location(os.path.join(self.path, part))
        return Location(f"{self.uri}/{part}")

    def joinpath(self, *parts: str) -> "Location":
        loc = self
        for p in parts:
            loc = loc / p
        return loc

    def relative_to(self, other: PathLike) -> str:
        base = Location(other).uri.rstrip("/") + "/"
        if not (self.uri + "/").startswith(base):
            raise ValueError(f"{self} is not under {other}")
        return self.uri[len(base):]

    def local_path(self) -> Path:
        """This location as a local `Path`, for libraries that can only open a local file
        (SQLite, a model folder); a URI raises, naming the location."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is not a local path: this step needs a local file "
                             "(copy it down with `Location.download`)")
        return Path(self.path)

    # -- asking ----------------------------------------------------------------------

    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self._info().type != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def is_file(self) -> bool:
        return self._info().type == pafs.FileType.File

    def size(self) -> int:
        return self._info().size or 0

    def iterdir(self) -> list["Location"]:
        """The entries directly inside this folder, sorted by name (none if it is absent)."""
        selector = pafs.FileSelector(self.path, recursive=False, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted((self / posixpath.basename(i.path.rstrip("/")) for i in infos), key=lambda l: l.name)

    def glob(self, pattern: str) -> list["Location"]:
        """Entries of this folder whose name matches `pattern` (one level, fnmatch)."""
        return [c for c in self.iterdir() if fnmatch.fnmatchcase(c.name, pattern)]

    def walk_files(self) -> list["Location"]:
        """Every file below this folder, sorted by key."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        infos = [i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]
        root = self.path.rstrip("/")
        return [self / i.path[len(root) + 1:] for i in sorted(infos, key=lambda i: i.path)]

    # -- reading ---------------------------------------------------------------------

    def read_bytes(self) -> bytes:
        """The whole file. From an object store, one version of it: pyarrow asks an
        object's size first and then reads that many bytes, so an object replaced in
        between (a study's state, a job's manifest) could come back cut to the old size;
        such a read is seen by its length against the size asked again after it, and
        repeated."""
        for attempt in range(5):
            with self.fs.open_input_stream(self.path, compression=None) as fh:
                data = fh.read()
            if self.is_local or len(data) == self.fs.get_file_info(self.path).size:
                return data
            time.sleep(0.05 * (attempt + 1))
        return data

    def read_text(self, encoding: str = "utf-8") -> str:
        """The file as text; bytes that are not `encoding` raise a ValueError naming it."""
        data = self.read_bytes()
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise NotText(self.uri, exc) from None

    def read_json(self) -> Any:
        """The file as JSON; a file that is not JSON raises a ValueError naming it."""
        text = self.read_text()
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise NotJSON(self.uri, exc) from None

    def open_input(self):
        """A seekable binary file (pyarrow's), for readers that seek (Parquet, CSV)."""
        return self.fs.open_input_file(self.path)

    # -- writing ---------------------------------------------------------------------

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Make this folder (and its parents). Object stores have no folders: nothing to do."""
        if self.is_local:
            os.makedirs(self.path, exist_ok=True)

    def write_bytes(self, data: bytes) -> None:
        """Put `data` at this key whole or not at all (see the module docstring)."""
        with self.open_output() as fh:
            fh.write(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def write_json(self, obj: Any) -> None:
        self.write_bytes((json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())

    def write_parquet(self, table: pa.Table, **kwargs: Any) -> None:
        """Write `table` as one Parquet file at this key (zstd, 128k-row groups)."""
        kwargs = {"compression": "zstd", "row_group_size": 128 * 1024, **kwargs}
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **kwargs)
        self.write_bytes(sink.getvalue().to_pybytes())

    @contextmanager
    def open_output(self) -> Iterator[Any]:
        """A binary stream written to this key whole or not at all: on a local disk a
        temporary file beside it, synced and renamed into place; on an object store one
        upload (a PUT is atomic)."""
        if self.is_local:
            parent = os.path.dirname(self.path)
            os.makedirs(parent, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.name}.", suffix=".tmp", dir=parent)
            try:
                os.fchmod(fd, file_mode())  # mkstemp makes it private; the umask decides, as for open()
                with os.fdopen(fd, "wb") as fh:
                    yield fh
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            return
        with self.fs.open_output_stream(self.path, compression=None) as fh:
            yield fh

    # -- removing and copying ----------------------------------------------------------

    def unlink(self, missing_ok: bool = True) -> None:
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def rmtree(self) -> None:
        """Remove this folder and everything in it (nothing if it is absent)."""
        info = self._info()
        if info.type == pafs.FileType.Directory or (not self.is_local and info.type == pafs.FileType.NotFound):
            try:
                self.fs.delete_dir(self.path)
            except (FileNotFoundError, OSError):
                if self.exists():
                    raise
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(self.path)

    def download(self, to: str | os.PathLike) -> Path:
        """Copy this file or folder to the local path `to`; returns it."""
        to = Path(to)
        if self.is_dir():
            to.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(self.path, str(to), source_filesystem=self.fs, destination_filesystem=_LOCAL)
        else:
            to.parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(self.path, str(to), source_filesystem=self.fs, destination_filesystem=_LOCAL)
        return to

    def upload(self, local: str | os.PathLike) -> None:
        """Copy the local file or folder `local` to this location."""
        local = os.fspath(local)
        if self.is_local:  # pyarrow makes only the folders below the destination
            (self if os.path.isdir(local) else self.parent).mkdir()
        pafs.copy_files(local, self.path, source_filesystem=_LOCAL, destination_filesystem=self.fs)


_UMASK: list[int] = []


def current_umask() -> int:
    """This process's umask, read without changing it (Linux: /proc/self/status; else
    set and restored once, under a lock)."""
    if not _UMASK:
        with _FS_LOCK:
            try:
                with open("/proc/self/status") as fh:
                    line = next(x for x in fh if x.startswith("Umask:"))
                _UMASK.append(int(line.split()[1], 8))
            except (OSError, StopIteration, ValueError):
                mask = os.umask(0o022)
                os.umask(mask)
                _UMASK.append(mask)
    return _UMASK[0]


def file_mode() -> int:
    """The mode a file written here gets: what `open()` would give it (0o666 less the
    umask), so others on a shared volume read outputs as the user's umask allows."""
    return 0o666 & ~current_umask()


def location(where: PathLike) -> Location:
    """`where` as a Location (a Location is returned as it is)."""
    return where if isinstance(where, Location) else Location(where)


def as_text(where: PathLike | None) -> str | None:
    """The text form of a path or URI as the user gave it: a URI unchanged, a local path
    made absolute (for configs and manifests)."""
    return None if where is None else location(where).uri


@contextmanager
def local_copy(where: PathLike) -> Iterator[Path]:
    """A local path holding `where`'s file or folder: the path itself when it is local,
    else a temporary copy removed afterwards (for libraries that open only local files)."""
    loc = location(where)
    if loc.is_local:
        yield loc.local_path()
        return
    with tempfile.TemporaryDirectory(prefix="rexeval-") as tmp:
        yield loc.download(Path(tmp) / (loc.name or "data"))
