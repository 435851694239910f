"""XRec's profiles with the split and the output on S3 (moto on 127.0.0.1): the same
shards as a local run, planned in the driver from counts alone (the actors read the
training reviews themselves), and resumed from the markers in the bucket."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexeval.pipelines.core.io import read_table
from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.storage import location
from rexeval.pipelines.generate import profiles
from rexeval.pipelines.generate.profiles import read_profiles, write_profiles
from tests.doubles.planted_split import planted_split

pytestmark = pytest.mark.slow


def _llm(log: Path) -> LLMJobSettings:
    return LLMJobSettings(backend="tests.doubles.llm:ScriptedLLM", use_cache=False,
                          backend_options={"rules": [["noise words 3 and", "!error"]], "default": "Likes sturdy gear.",
                                           "log": str(log)})


def _sent(log: Path) -> list[str]:
    return [json.loads(line)["last"] for line in log.read_text().splitlines()] if log.exists() else []


def _files(root) -> dict[str, bytes]:
    base = location(root)
    return {f.relative_to(base): f.read_bytes() for f in base.walk_files() if f.name != "manifest.json"}


def test_profiles_on_s3_match_the_local_ones_and_resume_from_markers(tmp_path, s3_root, ray_session,
                                                                     monkeypatch):
    monkeypatch.setattr(profiles, "SHARD_SIZE", 3)  # 4 users + 4 items -> 3 shards
    split, _ = planted_split(tmp_path / "data", n_users=4, n_items=4)
    local = write_profiles(split, tmp_path / "out", _llm(tmp_path / "local.jsonl"), progress=lambda s: None)
    assert local["shards"] == 3 and local["counts"]["errors"] > 0 and local["counts"]["ok"] > 0

    location(f"{s3_root}/split").upload(split)
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)

    def no_entities_here(*a, **k):
        raise AssertionError("the driver built the entities: it should plan from counts")

    # Only the driver's module is patched: the actors (other processes) build the entities.
    monkeypatch.setattr(profiles, "profile_requests", no_entities_here)
    log = tmp_path / "s3.jsonl"
    out = f"{s3_root}/profiles"
    m = write_profiles(f"{s3_root}/split", out, _llm(log), progress=lambda s: None)
    assert list(here.iterdir()) == []
    assert m["counts"] == local["counts"] and m["config"]["split"] == f"{s3_root}/split"
    mine, theirs = _files(out), _files(tmp_path / "out")
    assert mine.keys() == theirs.keys()
    assert all(mine[k] == theirs[k] for k in mine if not k.startswith("errors/"))  # errors name the input
    errors = read_table(location(out) / "errors", "errors").to_pandas()
    assert len(errors) and (errors["source"] == f"{s3_root}/split/train").all()
    assert errors.drop(columns="source").equals(
        read_table(tmp_path / "out" / "errors", "errors").to_pandas().drop(columns="source"))
    assert read_profiles(out) == read_profiles(tmp_path / "out")
    asked = _sent(log)
    assert sorted(asked) == sorted(_sent(tmp_path / "local.jsonl"))

    # Without shard 1's marker, only its three entities are asked again.
    (location(out) / "_done" / "part-00001.json").unlink()
    again = write_profiles(f"{s3_root}/split", out, _llm(log), progress=lambda s: None)
    assert len(_sent(log)) == len(asked) + 3 and again["counts"] == local["counts"]
    assert _files(out) == mine
    assert list(here.iterdir()) == []
