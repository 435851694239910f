"""Model references that are URIs (`s3://bucket/ckpt`, `gs://...`): one checked local copy per node.

Why: on a cluster the nodes share no disk, so a fine-tuned checkpoint lives in a bucket
and every replica or actor, on whichever node, must load it from a local folder (the
loaders, transformers and spaCy among them, open files). A driver hands the URI itself
to its actors (`refs.shipped_location`); the process that loads the model copies it into
its own node's models cache, `<models cache>/fetched/<sha256 of the URI>`
(`refs.on_node`); later loads, by any process on that node, reuse the copy without
asking the store again.

Checked by content: the copy's marker lists every file with its size in the store and
the time it was written here. A copy whose sizes differ from the store's listing is never
put in place, and one whose files are no longer as they were written (a file missing,
cut short or rewritten on this disk) is thrown away and copied again.

Safe to race: copiers take an exclusive file lock, a copy is written to a temporary
sibling folder and renamed into place, so a process sees either no folder or a whole
one. A URI is taken to name fixed content: to load a new checkpoint, give it a new URI
(or delete the cached folder).

Files are copied with `pyarrow.fs` through the filesystems of `rexeval/storage.py`
(the lowest layer), so endpoints and credentials are read as for every job's data: the
AWS variables, `AWS_ENDPOINT_URL` included, for S3 and S3-compatible stores; Google's
default credentials for GCS.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rexeval.models.gguf_cache import _locked, models_cache_dir  # one lock: flock on a fresh open file

MARKER = ".rexeval-fetched.json"
"""File inside a fetched folder that names the URI it holds and what it is."""

if TYPE_CHECKING:
    import pyarrow.fs as pafs


class ModelURINotFound(FileNotFoundError):
    """No file or folder at a model URI."""


def is_model_uri(ref: str) -> bool:
    """A URI with a scheme other than `file` (hub ids and local paths have no `://`)."""
    scheme, sep, _ = ref.strip().partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() != "file"


def _normal(uri: str) -> str:
    return uri.strip().rstrip("/")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path within it) for a model URI, through the storage module (which
    configures S3 from the AWS variables); imported here, so that resolving a local path
    or a hub id never loads pyarrow."""
    from rexeval.storage import filesystem_for

    return filesystem_for(_normal(uri))


def fetched_dir(uri: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder a URI's copy lands in on this node (it may not exist yet)."""
    base = Path(cache_dir).expanduser() if cache_dir is not None else models_cache_dir()
    return base / "fetched" / hashlib.sha256(_normal(uri).encode("utf-8")).hexdigest()


def _checked_copy(folder: Path) -> Path | None:
    """What a whole, unchanged copy holds (the folder, or the single file in it); None
    when there is none, or when a file of it is missing or no longer as written."""
    try:
        info = json.loads((folder / MARKER).read_text())
        for rel, (size, mtime_ns) in info["manifest"].items():
            st = (folder / rel).stat()
            if st.st_size != size or st.st_mtime_ns != mtime_ns:
                return None
        return folder / info["name"] if info["kind"] == "file" else folder
    except (OSError, ValueError, KeyError, TypeError):  # no marker, a file gone, a marker not ours
        return None


def fetched(uri: str, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The whole, unchanged local copy of `uri` on this node, or None (asks no store)."""
    return _checked_copy(fetched_dir(uri, cache_dir))


def stat(uri: str) -> str:
    """"file" or "dir" for what `uri` names; ModelURINotFound naming it when nothing is
    there. Cheap (one request), for a driver to fail early without copying anything."""
    return _kind(*filesystem(uri), uri)


def _kind(fs: pafs.FileSystem, path: str, uri: str) -> str:
    import pyarrow.fs as pafs

    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return "file"
    if info.type == pafs.FileType.Directory:
        return "dir"
    raise ModelURINotFound(f"model URI {_normal(uri)} not found: no file or folder there "
                           "(check the path, and the AWS_* variables that name the store and its keys)")


def _listing(fs: pafs.FileSystem, path: str, kind: str, uri: str) -> dict[str, int]:
    """Relative path -> size of every file `uri` names (one, for a file URI)."""
    import pyarrow.fs as pafs

    if kind == "file":
        return {path.rsplit("/", 1)[-1]: fs.get_file_info(path).size}
    base = path.rstrip("/") + "/"
    files = {i.path[len(base):]: i.size for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
             if i.type == pafs.FileType.File}
    if not files:
        raise ModelURINotFound(f"model URI {_normal(uri)} is an empty folder")
    return files


def _copy(uri: str, into: Path) -> dict:
    """Copy what `uri` names into the empty folder `into`, and check every file arrived
    whole (its size as the store lists it); the marker's contents, with the manifest
    `_checked_copy` holds the copy to."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    kind = _kind(fs, path, uri)
    sizes = _listing(fs, path, kind, uri)
    local = pafs.LocalFileSystem()
    if kind == "file":
        [name] = sizes
        pafs.copy_files(path, str(into / name), source_filesystem=fs, destination_filesystem=local)
    else:
        name = None
        pafs.copy_files(path, str(into), source_filesystem=fs, destination_filesystem=local)
    manifest = {}
    for rel, size in sizes.items():
        st = (into / rel).stat()
        if st.st_size != size:
            raise OSError(f"copy of model URI {_normal(uri)} is incomplete: {rel} has {st.st_size} "
                          f"of {size} bytes")
        manifest[rel] = [size, st.st_mtime_ns]
    marker = {"uri": _normal(uri), "kind": kind, "files": len(sizes), "bytes": sum(sizes.values()),
              "manifest": manifest}
    if name is not None:
        marker["name"] = name
    return marker


def fetch(uri: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local copy of the model at `uri` (a folder, or a file for a file URI), copied
    from the store first if this node has no whole, unchanged one (`_checked_copy`).
    ModelURINotFound names a missing URI."""
    target = fetched_dir(uri, cache_dir)
    done = _checked_copy(target)
    if done is not None:
        return done
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        done = _checked_copy(target)  # another process may have copied it while we waited
        if done is not None:
            return done
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; other users may read the cache
            marker = _copy(uri, tmp)
            (tmp / MARKER).write_text(json.dumps(marker, indent=2))
            if target.exists():  # a damaged or unmarked copy: move it aside, then drop it
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.rename(target, old / "copy")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _checked_copy(target)
