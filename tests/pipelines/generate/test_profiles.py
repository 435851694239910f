"""XRec's user and item profiles on Ray with a scripted LLM: what each request holds,
error rows, resume and cache, reading the profiles back."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rexeval.models.llm.base import ChatRequest, LLMResult
from rexeval.pipelines.core.io import read_table, write_parquet_atomic
from rexeval.pipelines.core.llm.job import LLMJobSettings
from rexeval.pipelines.core.schema import REVIEWS
from rexeval.pipelines.generate import profiles
from rexeval.pipelines.generate.profiles import (PROFILES, profile_requests, read_profiles, render,
                                                 write_profiles)
from rexeval.prompts import load_prompt
from rexeval.prompts.untrusted import neutralise
from tests.doubles.llm import ScriptedLLM

BACKEND = "tests.pipelines.generate.test_profiles:RecordingLLM"
CHARS = 30
MAX_REVIEWS = 3
BLOCK = re.compile(r"<<<(REVIEW|ITEM)\n(.*?)\n\1>>>", re.S)


class RecordingLLM(ScriptedLLM):
    """ScriptedLLM that also appends every request's last user turn, whole, to the file
    named by the `dump` option (the `log` option keeps only its end)."""

    def generate(self, requests: list[ChatRequest]) -> list[LLMResult]:
        with open(self.spec.options["dump"], "a") as fh:
            for r in requests:
                fh.write(json.dumps({"user": r.messages[-1]["content"],
                                     "temperature": r.sampling.temperature,
                                     "max_tokens": r.sampling.max_tokens}) + "\n")
        return super().generate(requests)


@pytest.fixture
def split(tmp_path) -> Path:
    """The planted split, each text naming its split and review and of varied length
    (some longer than CHARS), every item titled but i1."""
    from tests.doubles.planted_split import planted_split

    root, _ = planted_split(tmp_path / "data", n_users=4, n_items=4)
    for name in ("train", "valid", "test"):
        path = root / name / "part-00000.parquet"
        rows = pq.read_table(path).to_pylist()
        for r in rows:
            r["text"] = f"[{name}:{r['review_id']}] " + "la " * (3 * (r["line"] % 5))
            r["item_title"] = None if r["item_id"] == "i1" else f"Title of {r['item_id']}"
        write_parquet_atomic(path, pa.Table.from_pylist(rows, schema=REVIEWS))
    return root


def settings(tmp_path: Path, rules=(), cache: bool = False) -> LLMJobSettings:
    opts = {"rules": [list(r) for r in rules], "default": "  Likes sturdy gear.  ",
            "log": str(tmp_path / "calls.log"), "dump": str(tmp_path / "requests.jsonl")}
    return LLMJobSettings(backend=BACKEND, backend_options=opts, use_cache=cache,
                          cache=str(tmp_path / "cache.sqlite") if cache else None)


def run(split: Path, out: Path, llm: LLMJobSettings, **kw) -> dict:
    return write_profiles(split, out, llm, max_reviews=MAX_REVIEWS, max_review_chars=CHARS,
                          progress=kw.pop("progress", lambda s: None), **kw)


def calls(tmp_path: Path) -> int:
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def requests(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]


def train_rows(split: Path) -> list[dict]:
    rows = read_table(split / "train", "reviews").to_pylist()
    return sorted(rows, key=lambda r: (-r["timestamp"], r["review_id"]))


def expected_blocks(rows: list[dict]) -> list[str]:
    return [neutralise(r["text"][:CHARS]).strip() for r in rows[:MAX_REVIEWS]]


@pytest.mark.slow
def test_each_request_holds_exactly_its_entitys_latest_training_reviews(split, tmp_path, ray_session,
                                                                       monkeypatch):
    monkeypatch.setattr(profiles, "SHARD_SIZE", 3)  # 8 entities -> 3 shards
    lines: list[str] = []
    m = run(split, tmp_path / "out", settings(tmp_path), progress=lines.append)
    train = train_rows(split)
    users = sorted({r["user_id"] for r in train})
    items = sorted({r["item_id"] for r in train})
    assert m["counts"]["users"] == len(users) == 4 and m["counts"]["items"] == len(items) == 4
    assert m["counts"]["ok"] == 8 and m["counts"]["errors"] == 0 and m["shards"] == 3
    assert sum("shard" in s and "done" in s for s in lines) == 3

    asked = requests(tmp_path)
    assert len(asked) == 8 == calls(tmp_path)
    assert all(a["temperature"] == 0.0 and a["max_tokens"] == 128 for a in asked)
    seen_users, seen_items = {}, {}
    for a in asked:
        text = a["user"]
        assert "[valid:" not in text and "[test:" not in text
        blocks = BLOCK.findall(text)
        reviews = [b for label, b in blocks if label == "REVIEW"]
        first = re.match(r"\[train:r(\d+)-(\d+)\]", reviews[0])
        if text.startswith("The shopper's reviews"):
            seen_users[f"u{first.group(1)}"] = (blocks, text)
        else:
            seen_items[f"i{first.group(2)}"] = (blocks, text)
    assert sorted(seen_users) == users and sorted(seen_items) == items

    for u, (blocks, text) in seen_users.items():
        mine = [r for r in train if r["user_id"] == u][:MAX_REVIEWS]
        want = []
        for r in mine:  # each shown review: its item's title (when known), then its text
            if r["item_title"]:
                want.append(("ITEM", r["item_title"]))
            want.append(("REVIEW", neutralise(r["text"][:CHARS]).strip()))
        assert blocks == want, u
        assert text.count("(text cut short)") == sum(len(r["text"]) > CHARS for r in mine)
    for i, (blocks, text) in seen_items.items():
        mine = [r for r in train if r["item_id"] == i]
        want = ([("ITEM", f"Title of {i}")] if i != "i1" else []) + \
            [("REVIEW", b) for b in expected_blocks(mine)]
        assert blocks == want, i
        assert ("(its name is not known)" in text) == (i == "i1")
    assert any(len(r["text"]) > CHARS for r in train)  # the cut was exercised

    table = read_table(tmp_path / "out" / "profiles", PROFILES)
    keys = list(zip(table.column("kind").to_pylist(), table.column("id").to_pylist()))
    assert keys == [("user", u) for u in users] + [("item", i) for i in items]
    row = table.to_pylist()[0]
    assert row["profile"] == "Likes sturdy gear." and row["error"] is None
    assert row["prompt"] == "xrec_user_profile" and row["model"] == m["model"]
    assert row["prompt_version"] == load_prompt("xrec_user_profile").version
    assert row["reviews"] == min(MAX_REVIEWS, sum(r["user_id"] == "u0" for r in train))
    assert m["prompts"] == {"xrec_user_profile": load_prompt("xrec_user_profile").version,
                            "xrec_item_profile": load_prompt("xrec_item_profile").version}


@pytest.mark.slow
def test_failed_or_empty_answers_are_error_rows_and_the_job_goes_on(split, tmp_path, ray_session):
    prompts = {k: load_prompt(n) for k, n in profiles.PROMPTS.items()}
    ents = {(e["kind"], e["id"]): e for e in profile_requests(
        read_table(split / "train", "reviews"), MAX_REVIEWS, CHARS)}
    whole = {k: render(e, prompts)[-1]["content"] for k, e in ents.items()}
    rules = [(whole[("item", "i2")], "!error"), (whole[("user", "u3")], "   ")]
    m = run(split, tmp_path / "out", settings(tmp_path, rules))
    assert m["counts"]["ok"] == 6 and m["counts"]["errors"] == 2
    rows = {(r["kind"], r["id"]): r for r in read_table(tmp_path / "out" / "profiles", PROFILES).to_pylist()}
    assert len(rows) == 8
    assert rows[("item", "i2")]["profile"] is None and "LLM call failed" in rows[("item", "i2")]["error"]
    assert rows[("user", "u3")]["profile"] is None and "empty" in rows[("user", "u3")]["error"]
    assert all(r["profile"] == "Likes sturdy gear." and r["error"] is None
               for k, r in rows.items() if k not in {("item", "i2"), ("user", "u3")})
    errors = read_table(tmp_path / "out" / "errors", "errors").to_pylist()
    assert {(e["row_id"], e["error_type"]) for e in errors} == {("item:i2", "llm_error"),
                                                               ("user:u3", "empty_profile")}
    assert all(e["stage"] == profiles.JOB and ("i2" in e["message"] or "u3" in e["message"])
               for e in errors)
    assert read_profiles(tmp_path / "out") == {k: "Likes sturdy gear." for k in rows
                                               if k not in {("item", "i2"), ("user", "u3")}}


@pytest.mark.slow
def test_rerun_is_free_and_other_settings_are_refused(split, tmp_path, ray_session):
    llm = settings(tmp_path, [("Title of i2\nITEM>>>\n\nIts reviews", "Plays loud rock.")], cache=True)
    first = run(split, tmp_path / "out", llm)
    n = calls(tmp_path)
    assert n == 8
    lines: list[str] = []
    again = run(split, tmp_path / "out", llm, progress=lines.append)
    assert calls(tmp_path) == n and any("already complete" in s for s in lines)
    assert {k: v for k, v in first.items() if k != "elapsed_s"} == again
    texts = read_profiles(tmp_path / "out")
    assert len(texts) == 8 and texts[("item", "i2")] == "Plays loud rock."
    assert texts[("user", "u0")] == texts[("item", "i3")] == "Likes sturdy gear."
    # Greedy calls come from the cache: the same settings elsewhere cost no call.
    run(split, tmp_path / "out2", llm)
    assert calls(tmp_path) == n and read_profiles(tmp_path / "out2") == texts
    with pytest.raises(FileExistsError, match="different"):
        write_profiles(split, tmp_path / "out", llm, max_reviews=2, progress=lambda s: None)
    m = run(split, tmp_path / "out", llm, limit=2, overwrite=True)
    assert m["counts"]["users"] == 2 and m["counts"]["items"] == 2
    assert sorted(read_profiles(tmp_path / "out")) == [("item", "i0"), ("item", "i1"),
                                                       ("user", "u0"), ("user", "u1")]
