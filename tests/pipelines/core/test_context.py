"""Recommendation contexts: what a judge or generator is told about the user and the item."""
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from rexeval.pipelines.core.context import (
    build_contexts,
    informative_headline,
    last_interactions,
)

SAMPLE = Path(__file__).resolve().parents[3] / "pipelines" / "sample"


def _review(user, item, t, *, summary=None, text="it works fine for me", rating=5.0, title=None,
            category=None, helpful=0):
    return {"review_id": f"{user}-{item}-{t}", "user_id": user, "item_id": item, "timestamp": t,
            "rating": rating, "text": text, "summary": summary, "item_title": title,
            "category": category, "helpful_votes": helpful}


@pytest.fixture()
def reviews():
    rows = [
        _review("u1", "a", 10, summary="Lovely picks", title="Fender Medium Picks, 12 pack"),
        _review("u1", "b", 20, summary="Bright and loud", rating=4.0),
        _review("u1", "c", 30, summary="Five Stars", text="The strap is comfortable and the buckle "
                "feels solid even after a long gig on a hot stage", rating=2.0),
        _review("u1", "d", 50, summary="Same day as the target"),  # same time: not before
        _review("u1", "x", 50, summary="MY OWN WORDS ABOUT X", title="Snare Drum 14in",
                category="instruments"),
        _review("u1", "e", 60, summary="Bought later"),  # after the interaction
        _review("u2", "y", 5, summary="Great capo", helpful=1),
        _review("u3", "y", 7, summary="great CAPO", helpful=3),  # same headline, other case
        _review("u4", "y", 8, summary="Five stars!", helpful=9),  # placeholder: dropped
        _review("u5", "y", 9, summary="Slips on thick necks", helpful=3),
        _review("u1", "y", 70, summary="u1 about y, must not describe y"),
        _review("u6", "z", 1, summary="lonely item"),
    ]
    return pd.DataFrame(rows)


def test_profile_is_earlier_items_most_recent_first(reviews):
    ctx = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["x"]}))
    assert list(ctx.columns) == ["user_id", "item_id", "user_profile", "item_description"]
    assert ctx.loc[0, "user_profile"].split("\n") == [
        ('- an item they reviewed as "The strap is comfortable and the buckle feels solid even '
        'after a …" (rated 2/5)'),  # "Five Stars" is a placeholder: the text's first words
        '- an item they reviewed as "Bright and loud" (rated 4/5)',  # no title: their headline
        "- Fender Medium Picks, 12 pack (rated 5/5)",  # the title when known
    ]
    assert "MY OWN WORDS" not in ctx.loc[0, "user_profile"]  # the judged review never leaks
    assert ctx.loc[0, "item_description"] == "Snare Drum 14in (category: instruments)"


def test_max_history_keeps_the_most_recent(reviews):
    ctx = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["x"]}), max_history=1)
    assert ctx.loc[0, "user_profile"].startswith('- an item they reviewed as "The strap')
    assert ctx.loc[0, "user_profile"].count("\n") == 0
    none = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["x"]}), max_history=0)
    assert none.loc[0, "user_profile"] == ""


def test_untitled_item_is_described_by_other_buyers_headlines(reviews):
    ctx = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["y"]}))
    # most helpful first (ties: most recent first), case-insensitive duplicates and star
    # placeholders dropped, the target user's own review left out
    assert ctx.loc[0, "item_description"] == (
        'Title unknown. Other buyers\' review headlines: "Slips on thick necks"; "great CAPO".')
    one = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["y"]}),
                         max_item_summaries=1)
    assert one.loc[0, "item_description"].endswith('headlines: "Slips on thick necks".')


def test_empty_history_and_unknown_item_give_empty_strings(reviews):
    ctx = build_contexts(reviews, pd.DataFrame({"user_id": ["u6", "u2"], "item_id": ["z", "y"]}))
    assert ctx.loc[0, "user_profile"] == "" and ctx.loc[0, "item_description"] == ""
    assert ctx.loc[1, "user_profile"] == ""  # u2's only review is the interaction itself


def test_interaction_time_from_column_or_unknown(reviews):
    at = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["x"], "timestamp": [25]}))
    assert at.loc[0, "user_profile"].split("\n")[0].endswith('"Bright and loud" (rated 4/5)')
    assert at.loc[0, "user_profile"].count("\n") == 1
    # an item u1 never reviewed: every review of u1 is history, most recent first
    new = build_contexts(reviews, pd.DataFrame({"user_id": ["u1"], "item_id": ["new"]}))
    lines = new.loc[0, "user_profile"].split("\n")
    assert lines[0] == '- an item they reviewed as "u1 about y, must not describe y" (rated 5/5)'
    assert len(lines) == 7  # a, b, c, d, x, e, y
    assert new.loc[0, "item_description"] == ""


def test_order_and_duplicated_users_are_kept(reviews):
    inter = pd.DataFrame({"user_id": ["u6", "u1", "u1"], "item_id": ["z", "x", "y"]})
    ctx = build_contexts(reviews, inter)
    assert ctx[["user_id", "item_id"]].values.tolist() == inter.values.tolist()
    assert ctx.loc[2, "user_profile"].count("\n") == 5  # before t=70: a b c d x e


def test_placeholder_headlines():
    got = informative_headline(pd.Series(["Five Stars", "4 stars.", "one star", "Five stars for the tone",
                                          "  ", None]))
    assert got.isna().tolist() == [True, True, True, False, True, True]


def test_missing_columns_are_named(reviews):
    with pytest.raises(ValueError, match="timestamp"):
        build_contexts(reviews.drop(columns="timestamp"), pd.DataFrame({"user_id": [], "item_id": []}))
    with pytest.raises(ValueError, match="item_id"):
        build_contexts(reviews, pd.DataFrame({"user_id": ["u1"]}))


def test_last_interactions(reviews):
    last = last_interactions(reviews, min_reviews=2)
    assert last[["user_id", "item_id", "timestamp"]].values.tolist() == [["u1", "y", 70]]
    assert last["review_id"].tolist() == reviews.loc[(reviews.user_id == "u1") & (reviews.item_id == "y"),
                                                     "review_id"].astype(str).tolist()
    assert len(last_interactions(reviews, min_reviews=1)) == 6


def _read_reviews(path: Path, titles: Path | None = None) -> pd.DataFrame:
    from rexeval.pipelines.ingest.formats import detect_layout
    from rexeval.pipelines.ingest.parse import parse_chunk
    from rexeval.pipelines.ingest.steps import join_titles
    from rexeval.pipelines.ingest.validate import normalise
    from rexeval.pipelines.ingest.chunks import plan_chunks
    from rexeval.pipelines.ingest.metadata import load_titles

    layout = detect_layout(path)
    table = pa.concat_tables([normalise(parse_chunk(c))[0] for c in plan_chunks([(str(path), layout)], 1 << 30)])
    if titles is not None:
        table = join_titles(table, load_titles([str(titles)]))
    return table.to_pandas()


def test_sample_with_titles():
    reviews = _read_reviews(SAMPLE / "reviews.jsonl", SAMPLE / "items.jsonl")
    inter = last_interactions(reviews, min_reviews=2)
    ctx = build_contexts(reviews, inter)
    titled = reviews.dropna(subset=["item_title"]).groupby("item_id")["item_title"].first()
    for row in ctx.itertuples():
        if row.item_id in titled.index:
            assert row.item_description.startswith(titled[row.item_id])
    assert (ctx["user_profile"] != "").any()


def test_real_csv_is_fast_and_never_looks_ahead(shared_csv):
    reviews = _read_reviews(shared_csv)
    inter = pd.concat([reviews[["user_id", "item_id"]]] * 2, ignore_index=True)  # ~10k rows
    start = time.perf_counter()
    ctx = build_contexts(reviews, inter)
    assert time.perf_counter() - start < 15
    assert len(ctx) == len(inter)
    # every profile line is an earlier review of another item (spot check one user)
    user = reviews["user_id"].value_counts().index[0]
    mine = reviews[reviews["user_id"] == user].sort_values("timestamp")
    last = mine.iloc[-1]
    one = build_contexts(reviews, pd.DataFrame({"user_id": [user], "item_id": [last["item_id"]]}))
    earlier = mine[(mine["timestamp"] < last["timestamp"]) & (mine["item_id"] != last["item_id"])]
    assert one.loc[0, "user_profile"].count("\n") + 1 == min(10, earlier["item_id"].nunique())
    assert one.loc[0, "item_description"].startswith("Title unknown.")
