"""Dataset statistics on a toy dataset, expectations counted by hand in the comments."""
from __future__ import annotations

import pyarrow as pa
import pytest

from rexeval.pipelines.ingest.split import SplitResult
from rexeval.pipelines.ingest.stats import dataset_stats, format_markdown, format_table, group_thousands


def reviews(rows):
    review_id, user, item, text, ts = zip(*rows)
    return pa.table({"review_id": list(review_id), "user_id": list(user),
                     "item_id": list(item), "text": list(text),
                     "timestamp": pa.array(ts, pa.int64())})


# 1_000_000_000 s = 2001-09-09 01:46:40 UTC; 1_400_000_000 s = 2014-05-13 16:53:20 UTC
TRAIN = reviews([
    ("r1", "u1", "i1", "great sound", 1_000_000_000),        # 2 words
    ("r2", "u1", "i2", "too  loud\tfor me", 1_100_000_000),  # 4 words
    ("r3", "u2", "i1", "", 1_200_000_000),                   # 0 words
    ("r4", "u2", "i2", "ok", 1_300_000_000),                 # 1 word
])
VALID = reviews([("r5", "u2", "i3", "nice strings, cheap", 1_350_000_000)])  # 3 words
TEST = reviews([("r6", "u3", "i1", " works ", 1_400_000_000)])               # 1 word

STATEMENTS = pa.table({
    "review_id": ["r1", "r1", "r2", "r4", "r5", "r99"],
    "user_id": ["u1", "u1", "u1", "u2", "u2", "u9"],
    "item_id": ["i1", "i1", "i2", "i2", "i3", "i9"],
    "statement": ["great sound", "good value", "too loud", "great sound", "cheap",
                  "not in the splits"],
})


def test_dataset_stats_by_hand():
    s = dataset_stats({"train": TRAIN, "validation": VALID, "test": TEST}, STATEMENTS)
    # users u1 u2 u3 = 3; items i1 i2 i3 = 3; 4 + 1 + 1 = 6 interactions
    assert (s["users"], s["items"], s["interactions"]) == (3, 3, 6)
    assert (s["train"], s["valid"], s["test"]) == (4, 1, 1)
    # sparsity: 1 - 6 / (3 * 3) = 1/3 -> 33.33 %
    assert s["sparsity_pct"] == pytest.approx(100 / 3)
    # words: 2 + 4 + 0 + 1 + 3 + 1 = 11 over 6 reviews
    assert s["avg_words_per_review"] == pytest.approx(11 / 6)
    assert (s["time_first"], s["time_last"]) == (1_000_000_000, 1_400_000_000)
    # statements: r99 is not in any split -> 5 left; distinct texts: great sound,
    # good value, too loud, cheap = 4. Averages: 5/6 per interaction, 5/3 per user/item
    assert s["statements_total"] == 5
    assert s["statements_unique"] == 4
    assert s["statements_per_interaction"] == pytest.approx(5 / 6)
    assert s["statements_per_user"] == pytest.approx(5 / 3)
    assert s["statements_per_item"] == pytest.approx(5 / 3)


def test_dataset_stats_single_table_and_split_result():
    whole = pa.concat_tables([TRAIN, VALID, TEST])
    s = dataset_stats(whole)
    assert (s["users"], s["items"], s["interactions"]) == (3, 3, 6)
    assert s["train"] is s["valid"] is s["test"] is None
    assert "statements_total" not in s
    res = SplitResult(TRAIN, VALID, TEST, {})
    assert dataset_stats(res) == dataset_stats({"train": TRAIN, "valid": VALID, "test": TEST})


def test_dataset_stats_empty_and_errors():
    s = dataset_stats(TRAIN.slice(0, 0))
    assert (s["users"], s["items"], s["interactions"]) == (0, 0, 0)
    assert s["sparsity_pct"] is s["avg_words_per_review"] is s["time_first"] is None
    with pytest.raises(ValueError, match="unknown split"):
        dataset_stats({"dev": TRAIN})
    with pytest.raises(ValueError, match="item_id"):
        dataset_stats(TRAIN.drop_columns(["item_id"]))
    with pytest.raises(ValueError, match="given twice"):
        dataset_stats({"valid": VALID, "validation": VALID})


def test_group_thousands():
    assert group_thousands(0) == "0"
    assert group_thousands(999) == "999"
    assert group_thousands(1000) == "1 000"
    assert group_thousands(163711) == "163 711"
    assert group_thousands(1215270) == "1 215 270"
    assert group_thousands(1055145, "\u2009") == "1\u2009055\u2009145"


# Toys column of Table II in the paper, and a tiny dataset without statements.
PAPER = {
    "Toys": {"users": 19398, "items": 11924, "interactions": 163711, "train": 121751,
             "valid": 14805, "test": 22441, "statements_per_interaction": 5.03,
             "statements_per_user": 41.76, "statements_per_item": 67.49,
             "statements_unique": 587114, "statements_total": 823932},
    "Tiny": {"users": 3, "items": 3, "interactions": 6, "train": 4, "valid": 1, "test": 1},
}


def test_format_table_text():
    # widest label "  Avg/interaction" = 17 characters; the Toys column is 7 wide
    # ("163 711"), Tiny 4 ("Tiny"); columns are separated by two spaces, right-aligned.
    expected = (
        "                      Toys  Tiny\n"
        "Users               19 398     3\n"
        "Items               11 924     3\n"
        "Interactions       163 711     6\n"
        "Train              121 751     4\n"
        "Validation          14 805     1\n"
        "Test                22 441     1\n"
        "Statements\n"
        "  Avg/interaction     5.03     -\n"
        "  Avg/user           41.76     -\n"
        "  Avg/item           67.49     -\n"
        "  Unique           587 114     -\n"
        "  Total            823 932     -\n"
    )
    assert format_table(PAPER) == expected


def test_format_table_markdown():
    lines = format_markdown(PAPER).splitlines()
    assert lines[0] == "| | Toys | Tiny |"
    assert lines[1] == "|---|---:|---:|"
    assert lines[2] == "| Users | 19 398 | 3 |"
    assert lines[8] == "| **Statements** | | |"
    assert lines[9] == "| &nbsp;&nbsp;Avg/interaction | 5.03 | - |"
    assert lines[-1] == "| &nbsp;&nbsp;Total | 823 932 | - |"
    assert len(lines) == 14  # header, rule, 6 counts, section, 5 statement rows


def test_format_table_extra_rows_from_dataset_stats():
    s = dataset_stats({"train": TRAIN, "valid": VALID, "test": TEST}, STATEMENTS)
    text = format_table({"Toy": s})
    # labels 17 wide, then 2 spaces, then a 10 wide column ("2001-09-09")
    assert "\nSparsity %" + " " * 14 + "33.33\n" in text       # 7 + 2 + 5 pad
    assert "\nAvg words/review" + " " * 9 + "1.83\n" in text   # 11/6; 1 + 2 + 6 pad
    assert ("\nTime range\n  First review" + " " * 5 + "2001-09-09\n"
            "  Last review" + " " * 6 + "2014-05-13\n") in text
    assert "\n  Unique" + " " * 20 + "4\n" in text             # 9 + 2 + 9 pad
    with pytest.raises(ValueError):
        format_table({})


# -- counted on Ray workers (issue 47: the driver never holds a table) --------------------


@pytest.mark.slow
def test_split_stats_count_on_workers_per_category(tmp_path, ray_session, monkeypatch):
    """The study `stats` job's numbers (`split_stats`), the driver forbidden any table's
    rows: per category of train, then the whole split, as pandas counts them."""
    from rexeval.pipelines.ingest.stats import split_stats
    from tests.doubles.whole_tables import assert_table2, expected_table2, forbid_whole_tables, write_split

    frames = write_split(str(tmp_path / "split"))
    monkeypatch.setattr("rexeval.pipelines.core.runtime.ROWS_PER_GROUP", 16)  # keys over several groups
    with monkeypatch.context() as driver:
        forbid_whole_tables(driver)
        got = split_stats(str(tmp_path / "split"), name="toys-all")
    cats = sorted(set(frames["train"]["category"].dropna()))
    assert list(got) == [*cats, "toys-all"] and len(cats) == 3
    for cat in cats:
        assert_table2(got[cat], expected_table2({n: f[f["category"] == cat] for n, f in frames.items()}))
    assert_table2(got["toys-all"], expected_table2(frames))


@pytest.mark.slow
def test_the_study_stats_job_reads_no_whole_table(tmp_path, ray_session, monkeypatch):
    """The study's `stats` job (pipelines/study/builtin_jobs.py) through `split_stats`."""
    from rexeval.pipelines.study.builtin_jobs import StatsConfig, _stats
    from tests.doubles.whole_tables import assert_table2, expected_table2, forbid_whole_tables, write_split

    frames = write_split(str(tmp_path / "split"))
    with monkeypatch.context() as driver:
        forbid_whole_tables(driver)
        m = _stats(StatsConfig(input=str(tmp_path / "split"), out=str(tmp_path / "stats"), name="all"),
                   progress=lambda _: None)
    assert_table2(m["stats"]["all"], expected_table2(frames))


def test_ray_counts_equal_the_in_memory_counts(ray_session):
    """`dataset_stats_ray` and `dataset_stats` on the toy dataset above: the same dict."""
    import ray

    from rexeval.pipelines.ingest.stats import dataset_stats_ray

    def full(t: pa.Table) -> pa.Table:  # the columns a reviews table read by the job has
        return t.append_column("category", pa.nulls(t.num_rows, pa.string()))

    splits = {"train": TRAIN, "valid": VALID, "test": TEST}
    got = dataset_stats_ray({n: ray.data.from_arrow(full(t)) for n, t in splits.items()},
                            ray.data.from_arrow(STATEMENTS), groups=3)
    assert got == dataset_stats(splits, STATEMENTS)
