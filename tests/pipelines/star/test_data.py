"""StarData: CSR maps and candidate sets per level, and loading a built folder."""
from __future__ import annotations

import numpy as np
import pytest

from rexeval.pipelines.star.data import StarData, csr


def toy() -> StarData:
    # interactions: 0 (u0, i0, train) {0, 2}; 1 (u0, i1, valid) {1}; 2 (u1, i0, test) {2, 3}
    return StarData.from_arrays([0, 0, 1], [0, 1, 0], [0, 1, 2], [(0, 2), (0, 0), (1, 1), (2, 3), (2, 2), (0, 2)],
                                n_statements=5)


def test_csr_is_sorted_and_deduplicated():
    off, val = csr(np.array([1, 1, 0, 1]), np.array([5, 3, 4, 5]), 3)
    assert off.tolist() == [0, 1, 3, 3]
    assert val.tolist() == [4, 3, 5]


def test_ground_truth_and_triplets():
    d = toy()
    assert d.pos_offsets.tolist() == [0, 2, 3, 5]
    assert d.pos_values.tolist() == [0, 2, 1, 2, 3]
    assert d.triplet_arrays().tolist() == [[0, 0, 0], [0, 0, 2]]  # train only
    assert d.rows("test").tolist() == [2]


def test_candidates_per_level_span_all_splits():
    d = toy()
    assert d.candidates("global") is None
    off, val = d.candidates("item")
    # item 0: interactions 0 and 2 -> {0, 2, 3}; item 1: {1}
    assert [val[off[i]:off[i + 1]].tolist() for i in range(2)] == [[0, 2, 3], [1]]
    off, val = d.candidates("user")
    assert [val[off[u]:off[u + 1]].tolist() for u in range(2)] == [[0, 1, 2], [2, 3]]
    with pytest.raises(ValueError, match="unknown level"):
        d.candidates("shop")


def test_train_graph_edges():
    g = toy().train_graph()
    assert g.user_statement.tolist() == [[0, 0], [0, 2]]
    assert g.user_item.tolist() == [[0], [0]]


def test_load_reports_a_missing_table(tmp_path):
    with pytest.raises(FileNotFoundError, match="star build"):
        StarData.load(tmp_path)
