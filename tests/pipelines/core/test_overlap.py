"""An output folder is checked apart from every input its job names, before anything is
touched (pipelines/core/overlap.py)."""
import os

import pytest
from pydantic import BaseModel

from rexeval.pipelines.core.overlap import (OutputIsAFile, OutputOverlapsInput, check_apart, check_output_apart,
                                            inputs_of, relation)
from rexeval.pipelines.core.read_paths import OptionalReadPath, ReadPath, ReadPaths


def test_relation_of_local_paths(tmp_path):
    a = tmp_path / "runs"
    assert relation(str(a), str(a)) == "is"
    assert relation(str(a), str(a) + "/") == "is"
    assert relation(str(a), str(a / "mi" / "ingest")) == "contains"
    assert relation(str(a / "mi" / "x"), str(a / "mi")) == "inside"
    assert relation(str(a / "mi"), str(a / "mi2")) is None  # a shared prefix is not a parent
    assert relation(str(a / "x"), str(a / "y")) is None


def test_relative_paths_and_links_are_resolved(tmp_path, monkeypatch):
    real = tmp_path / "data"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert relation(str(tmp_path / "link"), str(real / "r.jsonl")) == "contains"
    monkeypatch.chdir(tmp_path)
    assert relation("data", str(real / "r.jsonl")) == "contains"
    assert relation("./data/../data", "data/r.jsonl") == "contains"


def test_relation_of_uris():
    assert relation("s3://b/runs/x", "s3://b/runs/x/") == "is"
    assert relation("s3a://b/runs", "s3://b/runs/x/reviews") == "contains"
    assert relation("gs://b/runs/x/y", "gcs://b/runs/x") == "inside"
    assert relation("s3://b/runs/x", "s3://other/runs/x") is None  # another bucket
    assert relation("s3://b/runs/x", "gs://b/runs/x") is None
    assert relation("/b/runs/x", "s3://b/runs/x") is None  # a local path is never a URI


class _Llm(BaseModel):
    cache: str | None = None


class _Job(BaseModel):
    inputs: ReadPaths
    references: OptionalReadPath = None
    model: str = "nrt"  # not declared as read: a name, never taken for a path
    out: str
    llm: _Llm = _Llm()


class _Split(BaseModel):
    input: ReadPath
    out: str


def test_inputs_are_the_declared_read_settings_and_caches():
    cfg = _Job(inputs=["a.jsonl", "b/*.jsonl", "none"], references="refs", out="o",
               llm=_Llm(cache="c.sqlite"))
    assert inputs_of(cfg) == [("inputs", "a.jsonl"), ("references", "refs"), ("llm.cache", "c.sqlite")]


@pytest.mark.parametrize("out, relation_word", [("u", "holds"), ("u/r.jsonl", "is"), ("u/r.jsonl/x", "lies inside")])
def test_an_output_overlapping_an_input_is_refused_naming_both(tmp_path, monkeypatch, out, relation_word):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputOverlapsInput) as err:
        check_output_apart(_Job(inputs=["u/r.jsonl"], out=out))
    msg = str(err.value)
    assert f"--out {out} {relation_word} an input" in msg and "inputs: u/r.jsonl" in msg
    assert isinstance(err.value, ValueError)  # the CLI's input mistake: exit 2


def test_split_into_its_own_input_folder_is_refused(tmp_path):
    with pytest.raises(OutputOverlapsInput, match="is an input of this job"):
        check_output_apart(_Split(input=str(tmp_path / "X"), out=str(tmp_path / "X")))
    check_output_apart(_Split(input=str(tmp_path / "ingest"), out=str(tmp_path / "split")))  # siblings


def test_a_cache_inside_the_output_is_refused(tmp_path):
    cfg = _Job(inputs=[str(tmp_path / "a.jsonl")], out=str(tmp_path / "o"),
               llm=_Llm(cache=str(tmp_path / "o" / "cache.sqlite")))
    with pytest.raises(OutputOverlapsInput, match="llm.cache"):
        check_output_apart(cfg)


def test_an_output_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(OutputIsAFile, match="is a file"):
        check_output_apart(_Split(input=str(tmp_path / "in"), out=str(f)))


def test_check_apart_without_an_output_does_nothing():
    check_apart(None, [("input", os.getcwd())])
    check_apart("", [("input", os.getcwd())])
