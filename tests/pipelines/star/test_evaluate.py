"""The batched evaluator: hand-computed metrics per level, and a planted signal that
USERPOP and a trained ExpGCN must find (fails if training or scoring is broken)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rexeval.models.recommenders.base import Ranker, ranker_class
from rexeval.pipelines.star.data import StarData
from rexeval.pipelines.star.evaluate import evaluate, mask_to_candidates
from tests.doubles.planted_star import planted_star
from tests.doubles.seeds import SEED


class Scripted(Ranker):
    """Fixed scores per interaction row."""

    def __init__(self, table: dict[int, list[float]]):
        self.table = table

    def score_all(self, users, items, rows):
        return torch.tensor([self.table[int(r)] for r in rows], dtype=torch.float32)


def toy() -> StarData:
    # Interaction 0: (u0, i0, test), positives {1, 4}; interaction 1: (u1, i0, train) {2}.
    return StarData.from_arrays([0, 1], [0, 0], [2, 0], [(0, 1), (0, 4), (1, 2)], n_statements=6)


def test_global_and_item_level_by_hand():
    ranker = Scripted({0: [5, 3, 3, 0, 3, 9]})
    res = evaluate(ranker, toy(), levels=("global", "item"), ks=(1, 3, 5))
    g = res["global"].summary
    # Global order: 5 (9), 0 (5), then the tie at 3 by index: 1, 2, 4; then 3.
    # rel = 0 0 1 0 1 0; 2 positives.
    idcg2 = 1 + 1 / math.log2(3)
    assert g["precision@1"] == 0 and g["hit@1"] == 0
    assert g["precision@3"] == pytest.approx(1 / 3) and g["recall@3"] == pytest.approx(1 / 2)
    assert g["ndcg@3"] == pytest.approx((1 / math.log2(4)) / idcg2)
    assert g["ndcg@5"] == pytest.approx((1 / math.log2(4) + 1 / math.log2(6)) / idcg2)
    # Item level: candidates of i0 are {1, 2, 4} (all splits); order 1, 2, 4 -> rel 1 0 1.
    it = res["item"].summary
    assert it["precision@1"] == 1
    assert it["precision@3"] == pytest.approx(2 / 3) and it["recall@3"] == 1
    assert it["ndcg@3"] == pytest.approx((1 + 1 / math.log2(4)) / idcg2)
    # Only 3 candidates, yet P@5 divides by 5 (seed 002 eq. 1).
    assert it["precision@5"] == pytest.approx(2 / 5)
    assert res["item"].summary["n_without_positives"] == 0


def test_interactions_without_positives_are_counted_not_averaged():
    d = StarData.from_arrays([0, 1], [0, 0], [2, 2], [(0, 1), (1, 2)], n_statements=4)
    d.pos_offsets[2] = d.pos_offsets[1]  # interaction 1 loses its statement
    d.pos_values = d.pos_values[:1]
    res = evaluate(Scripted({0: [0, 1, 0, 0], 1: [0, 1, 0, 0]}), d, levels=("global",), ks=(1,))
    s = res["global"].summary
    assert (s["n_rows"], s["n_scored"], s["n_without_positives"]) == (2, 1, 1)
    assert s["precision@1"] == 1.0
    assert np.isnan(res["global"].per_row["precision@1"][1])


def test_mask_keeps_only_candidates():
    scores = torch.arange(12, dtype=torch.float32).reshape(2, 6)
    cand = (torch.tensor([0, 2, 3]), torch.tensor([1, 4, 0]))
    out = mask_to_candidates(scores, torch.tensor([0, 1]), cand)
    assert torch.isinf(out).sum() == 9
    assert out[0, 1] == 1 and out[0, 4] == 4 and out[1, 0] == 6


def test_results_do_not_depend_on_batch_size():
    d = planted_star(seed=3)
    r = ranker_class("random").fit(d, seed=1)
    a = evaluate(r, d, levels=("global", "item"), batch_size=7)
    b = evaluate(r, d, levels=("global", "item"))
    for lv in a:
        for k, v in a[lv].per_row.items():
            np.testing.assert_array_equal(v, b[lv].per_row[k])


def _item_ndcg(ranker, d) -> float:
    return evaluate(ranker, d, levels=("item",), ks=(10,))["item"].summary["ndcg@10"]


@pytest.mark.learning
def test_planted_signal_userpop_and_expgcn_beat_random_at_item_level():
    from rexeval.pipelines.star.train import build_model, train_epoch

    d = planted_star(seed=SEED)
    rnd = _item_ndcg(ranker_class("random").fit(d, seed=SEED), d)
    upop = _item_ndcg(ranker_class("userpop").fit(d), d)
    torch.manual_seed(SEED)
    s = {"model": "expgcn", "dim": 32, "layers_us": 2, "layers_is": 2, "layers_ui": 1, "reg": 1e-4,
         "rec_weight": 1.0, "seed": SEED}
    model = build_model(s, d, None, "cpu")
    untrained = _item_ndcg(model.eval(), d)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    gen = torch.Generator().manual_seed(SEED)
    trip = torch.from_numpy(d.triplet_arrays())
    for _ in range(40):
        train_epoch(model, opt, trip, d.n_statements, d.n_items, 256, gen)
    trained = _item_ndcg(model, d)
    # Each test interaction holds 2 of the user's 3 "voice" statements among ~38 candidates.
    assert rnd < 0.35
    assert upop > rnd + 0.3
    assert trained > rnd + 0.3
    assert trained > untrained + 0.2
