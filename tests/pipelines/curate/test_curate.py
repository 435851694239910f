"""Seed 004's curation (§3.1) on planted purchases whose fate is known by hand: every
rule at its boundary (a 6-letter title kept, a 5-letter one dropped, letters beyond ASCII;
users with 4, 5, 20 and 21 purchases), a user whose latest purchase is in another
category, a timestamp tie for the latest, and a category with more qualifying users
than the cap. The expected sample is worked out here from the documented key (BLAKE2b of
"<seed>\\x1f<user>"), not from the job."""
from __future__ import annotations

import hashlib
import json

import pandas as pd
import pyarrow as pa
import pytest

from rexeval.pipelines.core.io import write_parquet_atomic
from rexeval.pipelines.core.schema import REVIEWS, validate_table
from rexeval.pipelines.curate import rules
from rexeval.pipelines.curate.config import CurateConfig

TITLES = {"good": "Soft face cream", "six": "ab1cd2ef", "uni": "Crème é", "five": "ab cde 99",
          "short": "AB 12 C-D", "none": None}
BEAUTY, TOYS = "data/amazon2023/All_Beauty.jsonl.gz", "data/amazon2023/Toys_and_Games.jsonl"


def _row(rid, user, item, rating=5.0, ts=0, source=BEAUTY):
    return {"review_id": rid, "user_id": user, "item_id": item, "rating": rating, "timestamp": 1_600_000_000 + ts,
            "text": "fine", "summary": None, "user_name": None, "item_title": TITLES[item.split("-")[0]],
            "category": None, "helpful_votes": None, "source": source, "line": ts + 1}


def planted() -> tuple[pd.DataFrame, dict]:
    """The purchases and, per review id, the reason it goes (by hand)."""
    rows, fate = [], {}

    def add(rid, user, item, why, **kw):
        rows.append(_row(rid, user, item, **kw))
        fate[rid] = why

    # u_ok5: exactly 5 that pass (good, six, uni titles), a 4-star and a 5-letter title.
    for k, item in enumerate(["good-1", "good-2", "six-1", "uni-1", "good-3"]):
        add(f"ok5-{k}", "u_ok5", item, "kept?", ts=k)
    add("ok5-4star", "u_ok5", "good-4", "not_5_stars", rating=4.0, ts=10)
    add("ok5-five", "u_ok5", "five-1", "title_short", ts=11)
    add("ok5-short", "u_ok5", "short-1", "title_short", ts=12)
    add("ok5-none", "u_ok5", "none-1", "title_missing", rating=3.0, ts=13)  # the rating rule comes first
    fate["ok5-none"] = "not_5_stars"
    # u_few: 4 that pass, 2 rated 3 -> too few.
    for k in range(4):
        add(f"few-{k}", "u_few", f"good-{k}", "user_too_few", ts=k)
    for k in range(2):
        add(f"few-r{k}", "u_few", f"good-{k + 5}", "not_5_stars", rating=3.0, ts=5 + k)
    # u_many: 21 -> too many; u_20: exactly 20 -> qualifies.
    for k in range(21):
        add(f"many-{k}", "u_many", f"good-{k}", "user_too_many", ts=k)
    for k in range(20):
        add(f"20-{k}", "u_20", f"good-{k}", "kept?", ts=k)
    # u_none: nothing passes (titles missing).
    for k in range(2):
        add(f"none-{k}", "u_none", f"none-{k}", "title_missing", ts=k)
    # u_cross: 5 in Beauty, then two at the same latest time: x1 (Beauty) and x2 (Toys);
    # the latest is x2 by review id, so the user is a Toys user.
    for k in range(5):
        add(f"cross-{k}", "u_cross", f"good-{k}", "kept?", ts=k)
    add("x1", "u_cross", "good-8", "kept?", ts=9)
    add("x2", "u_cross", "uni-8", "kept?", ts=9, source=TOYS)
    # Four more Beauty users with 5 each: Beauty has u_ok5, u_20 and these (6 qualify).
    for b in range(4):
        for k in range(5):
            add(f"b{b}-{k}", f"u_b{b}", f"good-{k}", "kept?", ts=k)
    return pd.DataFrame(rows), fate


def key(user: str, seed: int) -> tuple[int, str]:
    return int.from_bytes(hashlib.blake2b(f"{seed}\x1f{user}".encode(), digest_size=8).digest(), "big"), user


BEAUTY_USERS = ["u_ok5", "u_20", "u_b0", "u_b1", "u_b2", "u_b3"]


def expected(cap: int | None, seed: int) -> tuple[dict[str, str], set[str]]:
    """Each review's reason and the sampled users, from the hand-made fates and the keys."""
    frame, fate = planted()
    sampled = set(sorted(BEAUTY_USERS, key=lambda u: key(u, seed))[:cap] if cap else BEAUTY_USERS) | {"u_cross"}
    users = dict(zip(frame["review_id"], frame["user_id"]))
    return {rid: ("kept" if users[rid] in sampled else "not_sampled") if why == "kept?" else why
            for rid, why in fate.items()}, sampled


def write_parts(frame: pd.DataFrame, folder, parts: int) -> None:
    table = validate_table(pa.Table.from_pandas(frame, preserve_index=False), REVIEWS)
    step = -(-table.num_rows // parts)
    for p in range(parts):
        write_parquet_atomic(folder / "reviews" / f"part-{p:05d}.parquet", table.slice(p * step, step))


def codes_of(frame: pd.DataFrame, **settings) -> pd.DataFrame:
    """The rules without Ray: row codes, then the user step on the whole table, then the cut."""
    cap = settings.pop("per_category", 2)
    seed = settings.get("seed", 0)
    t = rules.row_codes(validate_table(pa.Table.from_pandas(frame, preserve_index=False), REVIEWS))
    t = rules.user_codes(t, seed=seed)
    cut = rules.thresholds(rules.smallest_per_category(t, cap + 1), cap) if cap else {}
    return rules.apply_sample(t, cut).to_pandas()


def test_title_letters_and_source_names():
    assert rules.title_letters(pa.array(list(TITLES.values()))).to_pylist() == [13, 6, 6, 5, 4, None]
    assert rules.source_category(BEAUTY) == "All_Beauty"
    assert rules.source_category("s3://b/x/Toys_and_Games.jsonl") == "Toys_and_Games"
    assert rules.source_category("Books.parquet") == "Books"


@pytest.mark.parametrize("cap,seed", [(2, 0), (2, 7), (None, 0), (10, 0)])
def test_rules_on_planted_purchases(cap, seed):
    frame, _ = planted()
    got = codes_of(frame, per_category=cap, seed=seed)
    want, sampled = expected(cap, seed)
    assert dict(zip(got["review_id"], (rules.REASONS[c] for c in got[rules.CODE]))) == want
    kept = got[got[rules.CODE] == rules.KEPT]
    assert set(kept["user_id"]) == sampled
    assert kept.groupby("user_id").size().between(5, 20).all()
    # Every kept row is a 5-star purchase of an item with a title of 6+ letters.
    assert (kept["rating"] == 5).all() and all(rules.title_letters(pa.array(kept["item_title"])).to_pylist()[i] >= 6
                                               for i in range(len(kept)))
    # The Toys user is one by their latest purchase (the tie settled by review id); the
    # category column is filled from the source file's name.
    targets = got[got[rules.TARGET] == 1].set_index("user_id")
    assert targets.loc["u_cross", "review_id"] == "x2" and targets.loc["u_cross", rules.UCAT] == "Toys_and_Games"
    assert set(got["category"]) == {"All_Beauty", "Toys_and_Games"}


def test_the_generators_explain_the_purchase_the_curation_sampled_on():
    """generate_llm explains each user's latest review (context.last_interactions): on the
    curated rows that is the row the curation took as the user's most recent."""
    from rexeval.pipelines.core.context import last_interactions

    frame, _ = planted()
    got = codes_of(frame, per_category=None)
    kept = got[got[rules.CODE] == rules.KEPT]
    last = last_interactions(kept[["user_id", "item_id", "timestamp", "review_id"]], min_reviews=2)
    assert set(last["review_id"]) == set(got.loc[got[rules.TARGET] == 1, "review_id"])


def test_settings_are_checked():
    with pytest.raises(ValueError, match="min_purchases"):
        CurateConfig(input="x", out="y", min_purchases=21, max_purchases=20)


@pytest.mark.slow
def test_alert_curate_on_ray_counts_every_row_and_does_not_depend_on_parts(tmp_path, ray_session, monkeypatch):
    from rexeval.pipelines.core.study_registry import STUDY_JOBS
    from rexeval.pipelines.curate.pipeline import run_curate
    from tests.doubles.whole_tables import forbid_whole_tables

    frame, _ = planted()
    want, sampled = expected(2, 3)
    monkeypatch.setattr("rexeval.pipelines.core.runtime.ROWS_PER_GROUP", 16)  # several user groups
    results = []
    for parts in (1, 3):
        src, out = tmp_path / f"in{parts}", tmp_path / f"out{parts}"
        write_parts(frame, src, parts)
        with monkeypatch.context() as driver:
            forbid_whole_tables(driver)
            m = run_curate(CurateConfig(input=str(src), out=str(out), per_category=2, seed=3),
                           progress=lambda _: None)
        kept = pd.read_parquet(out / "reviews" / "part-00000.parquet")
        results.append(kept)
        assert set(kept["review_id"]) == {r for r, why in want.items() if why == "kept"}
        assert set(kept["user_id"]) == sampled
        reasons = pd.Series(want).value_counts()
        assert {r: m["counts"][f"rows_{r}"] for r in rules.REASONS} == {r: int(reasons.get(r, 0)) for r in rules.REASONS}
        assert m["counts"]["rows_in"] == len(frame)
        assert m["counts"]["users_in"] == frame["user_id"].nunique() == 10
        assert {s: m["counts"][f"users_{s}"] for s in rules.USER_STATUS} == {
            "no_purchase_left": 1, "too_few": 1, "too_many": 1, "sampled": 3, "not_sampled": 4}
        assert m["categories"] == {"All_Beauty": {"qualifying_users": 6, "sampled_users": 2,
                                                  "kept_rows": int((kept["user_id"] != "u_cross").sum())},
                                   "Toys_and_Games": {"qualifying_users": 1, "sampled_users": 1, "kept_rows": 7}}
        assert json.loads((out / "manifest.json").read_text())["counts"] == m["counts"]
        assert (out / "curate.md").read_text().count("| All_Beauty |") == 1
    pd.testing.assert_frame_equal(results[0], results[1])
    assert STUDY_JOBS.lookup("alert_curate").outputs.reviews == "reviews"


@pytest.mark.slow
def test_rexeval_curate_command(tmp_path, ray_session):
    from click.testing import CliRunner

    from rexeval.ray_jobs.cli import cli

    frame, _ = planted()
    write_parts(frame, tmp_path / "in", 2)
    res = CliRunner().invoke(cli, ["curate", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                                   "--per-category", "2", "--seed", "3"])
    assert res.exit_code == 0, res.output
    want, _ = expected(2, 3)
    kept = pd.read_parquet(tmp_path / "out" / "reviews")
    assert set(kept["review_id"]) == {r for r, why in want.items() if why == "kept"}
    assert "| not sampled |" in res.output
