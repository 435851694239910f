"""Model references that are URIs: a model folder or file in a bucket resolves to a local
copy with the same files, made once per node (threads racing make one copy), reused
without asking the store again while it is whole and unchanged (a damaged copy is copied
again, a copy cut short never put in place); a URI with nothing there is refused, naming
it. A driver ships the URI itself, and the node that loads it makes its own copy."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rexeval.models import fetch
from rexeval.models.refs import ModelUnavailable, is_available_offline, resolve
from rexeval.storage import location


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != fetch.MARKER}


@pytest.fixture
def model_folder(tmp_path) -> Path:
    """A small model-shaped folder with a sub-folder (any files do: only bytes are compared)."""
    folder = tmp_path / "src" / "ckpt"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": 32}\n')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 300)
    (folder / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\nyes\nno\n")
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This test's node cache: the models cache is `<REXEVAL_CACHE>/models`."""
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def test_uri_folder_resolves_to_a_local_copy_with_identical_files(s3_root, model_folder, cache):
    uri = f"{s3_root}/models/ckpt"
    location(uri).upload(model_folder)

    checked = resolve(uri, prepare=False)  # a driver's check: nothing is copied
    assert checked.kind == "uri" and checked.location == uri
    assert not (cache / "fetched").exists()
    assert not is_available_offline(checked)

    got = resolve(uri)
    assert got.kind == "uri" and got.ref == uri
    local = Path(got.location)
    assert local == fetch.fetched_dir(uri) and local.parent == cache / "fetched"
    assert files_of(local) == files_of(model_folder)
    assert is_available_offline(got)
    assert [p.name for p in (cache / "fetched").iterdir() if p.is_dir()] == [local.name]  # no temp folder left

    # A second resolve on this node reuses the copy: it no longer asks the store.
    location(uri).rmtree()
    again = resolve(uri + "/")
    assert again.location == got.location
    assert resolve(uri, prepare=False).location == uri  # a copy here counts as existing


def test_uri_file_resolves_to_a_file_of_the_same_name(s3_root, tmp_path, cache):
    src = tmp_path / "weights.ckpt"
    src.write_bytes(b"\x00\x01checkpoint" * 1000)
    uri = f"{s3_root}/ckpts/weights.ckpt"
    location(uri).write_bytes(src.read_bytes())
    got = Path(resolve(uri, cache_dir=tmp_path / "elsewhere").location)
    assert got.name == "weights.ckpt" and got.read_bytes() == src.read_bytes()
    assert got.parent == fetch.fetched_dir(uri, tmp_path / "elsewhere")
    assert not (cache / "fetched").exists()  # cache_dir overrides the node cache


def test_concurrent_resolves_make_one_copy(s3_root, model_folder, cache, monkeypatch):
    uri = f"{s3_root}/models/racing"
    location(uri).upload(model_folder)
    copies = []
    real_copy = fetch._copy

    def counting_copy(u, into):
        copies.append(into)
        return real_copy(u, into)

    monkeypatch.setattr(fetch, "_copy", counting_copy)
    start = threading.Barrier(6)
    got, errors = [], []

    def worker():
        start.wait()
        try:
            got.append(resolve(uri).location)
        except Exception as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(copies) == 1 and len(set(got)) == 1 and len(got) == 6
    assert files_of(Path(got[0])) == files_of(model_folder)
    assert [p for p in (cache / "fetched").iterdir() if p.is_dir()] == [Path(got[0])]


def test_missing_uri_is_refused_naming_it(s3_root, cache):
    uri = f"{s3_root}/models/not-there"
    for prepare in (False, True):
        with pytest.raises(ModelUnavailable, match=f"model URI {uri} not found"):
            resolve(uri, prepare=prepare)
    assert [p for p in (cache / "fetched").iterdir() if p.is_dir()] == []  # no half copy left


def test_uri_detection_leaves_paths_and_hub_ids_alone(tmp_path):
    assert fetch.is_model_uri("s3://b/x") and fetch.is_model_uri("gs://b/x")
    for ref in ("org/model", "/abs/path", "rel/path", "file:///tmp/x", "all-MiniLM-L6-v2"):
        assert not fetch.is_model_uri(ref)
    folder = tmp_path / "m"
    folder.mkdir()
    r = resolve(f"file://{folder}")
    assert r.kind == "path" and r.location == str(folder)
    assert fetch.fetched_dir("s3://b/x/") == fetch.fetched_dir("s3://b/x")


def test_a_tiny_bert_on_s3_loads_from_its_copy(s3_root, tmp_path, cache):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.doubles.tiny_encoders import build_tiny_bert

    src = build_tiny_bert(tmp_path / "tiny", 3)
    uri = f"{s3_root}/nli"
    location(uri).upload(src)
    local = resolve(uri).location
    assert files_of(Path(local)) == files_of(src)
    model = AutoModelForSequenceClassification.from_pretrained(local)
    assert model.config.num_labels == 3
    assert AutoTokenizer.from_pretrained(local)("yes no")["input_ids"]


@pytest.mark.slow
def test_a_ray_worker_resolves_the_uri_where_it_runs(ray_session, s3_root, model_folder, tmp_path):
    """A task resolves the URI itself, from the endpoint in its own environment."""
    import ray

    uri = f"{s3_root}/models/on-worker"
    location(uri).upload(model_folder)
    where = tmp_path / "worker-cache"

    @ray.remote
    def load(ref: str, cache_dir: str) -> str:
        from rexeval.models.refs import resolve

        return resolve(ref, cache_dir=cache_dir).location

    got = Path(ray.get(load.remote(uri, str(where))))
    assert got == fetch.fetched_dir(uri, where)
    assert files_of(got) == files_of(model_folder)


def _damage_by(how: str, copy: Path) -> None:
    """A copy on this node damaged as a full disk, a killed copier or a stray write would."""
    weights = copy / "model.safetensors"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif how == "rewritten":  # same length, other bytes: caught by the time it was written
        data = bytearray(weights.read_bytes())
        data[:4] = b"\xff\xff\xff\xff"
        weights.write_bytes(bytes(data))
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    elif how == "missing":
        (copy / "tokenizer" / "vocab.txt").unlink()
    elif how == "unmarked":  # an older rexeval's copy, or a folder someone made by hand
        (copy / fetch.MARKER).write_text('{"uri": "x", "kind": "dir", "files": 3}')


@pytest.mark.parametrize("how", ["truncated", "rewritten", "missing", "unmarked"])
def test_a_damaged_copy_is_copied_again(s3_root, model_folder, cache, how):
    uri = f"{s3_root}/models/damaged-{how}"
    location(uri).upload(model_folder)
    local = fetch.fetch(uri)
    _damage_by(how, local)
    assert fetch.fetched(uri) is None  # not whole: not counted as this node's copy
    assert not is_available_offline(resolve(uri, prepare=False))
    again = Path(resolve(uri).location)
    assert again == local and files_of(again) == files_of(model_folder)
    assert fetch.fetched(uri) == again
    assert sorted(p.name for p in (cache / "fetched").iterdir() if p.is_dir()) == [local.name]  # nothing left over


def test_a_copy_cut_short_in_transfer_is_never_put_in_place(s3_root, model_folder, cache, monkeypatch):
    import pyarrow.fs as pafs

    uri = f"{s3_root}/models/cut-short"
    location(uri).upload(model_folder)
    real = pafs.copy_files

    def short_copy(source, destination, **kw):  # the store sent fewer bytes than it lists
        real(source, destination, **kw)
        for f in Path(destination).rglob("*.safetensors"):
            f.write_bytes(f.read_bytes()[:10])

    monkeypatch.setattr(pafs, "copy_files", short_copy)
    with pytest.raises(ModelUnavailable, match="incomplete: model.safetensors has 10 of 76800 bytes"):
        resolve(uri)
    assert not fetch.fetched_dir(uri).exists()
    assert [p for p in (cache / "fetched").iterdir() if p.is_dir()] == []  # no temporary folder left
    monkeypatch.setattr(pafs, "copy_files", real)
    assert files_of(Path(resolve(uri).location)) == files_of(model_folder)


def test_a_driver_ships_the_uri_and_a_loader_opens_its_own_node_copy(s3_root, model_folder, cache, tmp_path,
                                                                     monkeypatch):
    """`shipped_location` keeps a URI a URI without copying; `on_node` and `NodeModels`
    give the copy on the node that reads them; other references pass through."""
    import pickle

    from rexeval.models.refs import NodeModels, on_node, shipped_location

    uri = f"{s3_root}/models/shipped"
    location(uri).upload(model_folder)
    assert shipped_location(uri) == uri and not (cache / "fetched").exists()
    models = NodeModels({"sts": shipped_location(uri), "other": shipped_location(str(model_folder))})
    assert dict(models) == {"sts": uri, "other": str(model_folder)}  # as shipped
    assert not (cache / "fetched").exists()
    # In the actor (another node: another models cache), a lookup copies it there.
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path / "other-node"))
    there = pickle.loads(pickle.dumps(models))
    assert isinstance(there, NodeModels)
    local = Path(there["sts"])
    assert local == fetch.fetched_dir(uri, tmp_path / "other-node" / "models")
    assert files_of(local) == files_of(model_folder)
    assert there.get("other") == str(model_folder) and there.get("absent", "d") == "d"
    assert on_node(str(model_folder)) == str(model_folder) and on_node("org/model") == "org/model"
    with pytest.raises(ModelUnavailable, match="not found"):
        shipped_location(f"{s3_root}/models/not-there")
