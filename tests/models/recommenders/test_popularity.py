"""RANDOM and the popularity baselines on toy data whose rankings are known."""
from __future__ import annotations

import numpy as np
import torch

from rexeval.models.recommenders.base import ranker_class
from rexeval.models.recommenders.popularity import hash_uniform
from rexeval.pipelines.star.data import StarData


def toy() -> StarData:
    # train: (u0,i0) {0,1}, (u0,i1) {1}, (u1,i0) {1,2}, (u1,i0) {2, 2 again};
    # test: (u0, i0) {3} (its statement never counts).
    trips = [(0, 0), (0, 1), (1, 1), (2, 1), (2, 2), (3, 2), (3, 2), (4, 3)]
    return StarData.from_arrays([0, 0, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 2], trips, n_statements=5)


def scores(name, users, items, rows=None):
    d = toy()
    r = ranker_class(name).fit(d)
    rows = torch.arange(len(users)) if rows is None else rows
    return r.score_all(torch.tensor(users), torch.tensor(items), rows).numpy()


def test_userpop_counts_the_users_training_interactions():
    # u0: statement 0 once, 1 twice (two interactions); u1: 1 once, 2 twice (dedup per interaction).
    assert scores("userpop", [0, 1], [0, 0]).tolist() == [[1, 2, 0, 0, 0], [0, 1, 2, 0, 0]]


def test_itempop_and_globalpop():
    assert scores("itempop", [0, 0], [0, 1]).tolist() == [[1, 2, 2, 0, 0], [0, 1, 0, 0, 0]]
    assert scores("globalpop", [0, 1], [1, 0]).tolist() == [[1, 3, 2, 0, 0]] * 2


def test_random_is_seeded_and_independent_of_batching():
    d = toy()
    r = ranker_class("random").fit(d, seed=7)
    rows = torch.arange(5)
    full = r.score_all(rows, rows, rows)
    one = r.score_all(rows[3:4], rows[3:4], rows[3:4])
    assert torch.equal(full[3:4], one)
    assert not torch.equal(full, ranker_class("random").fit(d, seed=8).score_all(rows, rows, rows))
    assert torch.equal(full, ranker_class("random").fit(d, seed=7).score_all(rows, rows, rows))


def test_random_scores_look_uniform():
    u = hash_uniform(torch.arange(400), 500, seed=1).numpy()
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01
    # Each row's ranking is a different permutation.
    firsts = np.argsort(-u, axis=1, kind="stable")[:, 0]
    assert len(np.unique(firsts)) > 250
