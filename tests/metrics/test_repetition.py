"""Distinct-2 (metrics/repetition.py), the extension guide's one-file metric: values
worked out by hand, and the registry entries that make `rexeval evaluate` run it."""
import math

import numpy as np

from rexeval.metrics.registry import METRICS, TEXTS_GROUP, get_metric, group_metrics
from rexeval.metrics.repetition import distinct_2, distinct_bigram_ratio


def test_hand_computed_values():
    # "a b a b": bigrams ab, ba, ab -> 2 distinct of 3
    assert math.isclose(distinct_bigram_ratio("a b a b"), 2 / 3)
    # no repeated bigram
    assert distinct_bigram_ratio("The strings stay in tune.") == 1.0
    # case and punctuation do not make a bigram new: great-quality x3, quality-great x3 -> 2 of 6
    assert math.isclose(distinct_bigram_ratio("Great quality, great quality; GREAT quality great"), 2 / 6)
    # one word or none: no bigram, no value
    assert math.isnan(distinct_bigram_ratio("Great")) and math.isnan(distinct_bigram_ratio(""))


def test_vectorised_over_a_batch_and_ignores_references():
    got = distinct_2(["a b a b", "x y z", "solo"], ["ignored", "", None])
    assert got.dtype == np.float64 and got.shape == (3,)
    assert np.allclose(got[:2], [2 / 3, 1.0]) and math.isnan(got[2])


def test_found_by_the_folders_scan_with_its_table():
    assert "distinct-2" in METRICS.names()  # metrics/registry.py lists no module by hand
    info = get_metric("distinct-2")
    assert info.group == TEXTS_GROUP and info.kind == "per_example" and info.higher_is_better
    assert info.table and info.label == "Distinct-2"
    assert "distinct-2" in group_metrics(TEXTS_GROUP, kind="per_example")


def test_no_other_product_file_names_it():
    """The extension guide's claim: a metric is one file."""
    import re
    from pathlib import Path

    from rexeval import LAYERS

    repo = Path(__file__).resolve().parents[2]
    name = re.compile(r"distinct[-_]2|metrics.repetition")
    naming = sorted(str(f.relative_to(repo)) for top in (*LAYERS, "rexeval") for f in (repo / top).rglob("*.py")
                    if name.search(f.read_text(encoding="utf-8")))
    assert naming == ["metrics/repetition.py"]
