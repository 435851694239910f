"""`runtime.ranked`: places and dense ranks across the blocks of a Ray sort, numbered by
tasks from a few values per block (what `star build` indexes interactions, users, items
and statements with)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rexeval.pipelines.core.runtime import ranked

pytestmark = pytest.mark.slow


def test_places_and_dense_ranks_across_blocks(ray_session):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"k": rng.choice(["a", "b", "ü", "Z", "c"], 300), "t": rng.permutation(300)})
    ds = ray_session.data.from_pandas(frame).repartition(6)  # a key's rows fall in several sorted blocks
    got, distinct = ranked(ds, ["k", "t"], position="place", dense="rank")
    blocks = got.num_blocks()
    got = got.to_pandas()
    want = frame.sort_values(["k", "t"]).reset_index(drop=True)
    assert got[["k", "t"]].values.tolist() == want[["k", "t"]].values.tolist()
    assert got["place"].tolist() == list(range(300))
    assert got["rank"].tolist() == want["k"].map({k: i for i, k in enumerate(sorted(set(frame["k"])))}).tolist()
    assert distinct == 5 and blocks > 1
