"""BiasedMF: planted ratings (two user groups x two item groups) are predicted far better
than by the global mean and the factors put each user and item next to its own group;
`nearest` against cases worked out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rexeval.models.recommenders.biased_mf import BiasedMF, nearest, nearest_batch
from tests.doubles.seeds import SEED, seeded


def planted_ratings(n_users: int = 60, n_items: int = 40, density: float = 0.4, noise: float = 0.2,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Users and items in two groups each (even/odd index): rating 3 + 1.5 within a
    group, 3 - 1.5 across, plus a bias per user and per item (std 0.3) and noise;
    a random `density` of the cells is observed. Returns the observed (user, item,
    rating) rows and both groupings."""
    rng = np.random.default_rng(seed)
    gu, gi = np.arange(n_users) % 2, np.arange(n_items) % 2
    bu, bi = rng.normal(0, 0.3, n_users), rng.normal(0, 0.3, n_items)
    full = (3 + np.where(gu[:, None] == gi[None, :], 1.5, -1.5) + bu[:, None] + bi[None, :]
            + rng.normal(0, noise, (n_users, n_items)))
    u, i = np.nonzero(rng.random((n_users, n_items)) < density)
    return {"user": u, "item": i, "rating": full[u, i], "user_group": gu, "item_group": gi}


def _fit(users, items, ratings, n_users, n_items, epochs=100) -> BiasedMF:
    model = BiasedMF(n_users, n_items, dim=8, global_mean=float(ratings.mean()), seed=SEED)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(SEED)
    u, i, r = torch.as_tensor(users), torch.as_tensor(items), torch.as_tensor(ratings, dtype=torch.float32)
    for _ in range(epochs):
        order = torch.randperm(len(u), generator=gen)
        for s in range(0, len(u), 128):
            b = order[s:s + 128]
            loss = model.loss(u[b], i[b], r[b], 0.02)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


@pytest.mark.slow
@pytest.mark.learning
def test_the_planted_ratings_and_groups_are_learned() -> None:
    p = planted_ratings(seed=seeded(0))
    held = np.random.default_rng(seeded(1)).random(len(p["user"])) < 0.2
    tr = ~held
    model = _fit(p["user"][tr], p["item"][tr], p["rating"][tr], 60, 40)
    with torch.no_grad():
        pred = model(torch.as_tensor(p["user"][held]), torch.as_tensor(p["item"][held])).numpy()
    rmse = math.sqrt(np.mean((pred - p["rating"][held]) ** 2))
    baseline = math.sqrt(np.mean((p["rating"][tr].mean() - p["rating"][held]) ** 2))
    # The margin: the group effect (+-1.5) is most of the variance, so anything that
    # learned it beats the global mean (~1.5) by far; noise alone is 0.2 (we see ~0.3).
    assert rmse < 0.6 * baseline
    for factors, group in ((model.user_factors.weight, p["user_group"]), (model.item_factors.weight, p["item_group"])):
        lists = nearest_batch(factors, range(len(group)), None, 5)
        for q, neighbours in enumerate(lists):
            assert len(neighbours) == 5 and q not in [j for j, _ in neighbours]
            same = np.mean([group[j] == group[q] for j, _ in neighbours])
            assert same >= 0.9, (q, neighbours)


def test_the_model_is_the_biased_formula_and_its_loss() -> None:
    m = BiasedMF(3, 2, dim=2, global_mean=3.5, seed=1)
    with torch.no_grad():
        m.user_factors.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
        m.item_factors.weight.copy_(torch.tensor([[0.5, 0.5], [-1.0, 0.0]]))
        m.user_bias.weight.copy_(torch.tensor([[0.1], [0.2], [0.3]]))
        m.item_bias.weight.copy_(torch.tensor([[-0.5], [0.5]]))
    u, i, r = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 0]), torch.tensor([4.0, 4.0, 4.0])
    with torch.no_grad():
        pred = m(u, i)
    assert pred.tolist() == pytest.approx([3.5 + 0.1 - 0.5 + 0.5, 3.5 + 0.2 + 0.5 + 0.0, 3.5 + 0.3 - 0.5 + 1.0])
    mse = float(((pred - r) ** 2).mean())
    l2 = np.mean([1 + 0.5 + 0.01 + 0.25, 4 + 1 + 0.04 + 0.25, 2 + 0.5 + 0.09 + 0.25])
    assert float(m.loss(u, i, r, 0.1).detach()) == pytest.approx(mse + 0.1 * l2, rel=1e-6)
    assert "global_mean" in m.state_dict() and "global_mean" not in dict(m.named_parameters())
    fresh = BiasedMF(3, 2, dim=2, seed=7)
    assert torch.equal(fresh.user_factors.weight, BiasedMF(3, 2, dim=2, seed=7).user_factors.weight)
    assert not fresh.user_bias.weight.any() and not fresh.item_bias.weight.any()
    with pytest.raises(ValueError, match="dim must be"):
        BiasedMF(3, 2, dim=0)


# rows: 0 = (1, 0), 1 = (1, 1), 2 = (0, 1), 3 = (0, 0); cosines with row 0: 1 -> 1/sqrt2,
# 2 -> 0, 3 -> 0 (a zero row); with row 1: 0 and 2 -> 1/sqrt2 (tie: index order), 3 -> 0.
GOLD = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
S = 1 / math.sqrt(2)


@pytest.mark.parametrize("query,candidates,k,want", [
    (0, None, 3, [(1, S), (2, 0.0), (3, 0.0)]),
    (0, None, 1, [(1, S)]),
    (1, None, 3, [(0, S), (2, S), (3, 0.0)]),
    (1, None, 10, [(0, S), (2, S), (3, 0.0)]),
    (1, None, 1, [(0, S)]),  # the tie at the cut goes to the lower index
    (2, [3, 0, 2], 5, [(0, 0.0), (3, 0.0)]),  # restricted, the query left out, ties by index
    (1, [2, 3], 1, [(2, S)]),
    (3, None, 3, [(0, 0.0), (1, 0.0), (2, 0.0)]),  # the zero row: similarity 0, not NaN
    (0, [0], 3, []),
    (0, None, 0, []),
])
def test_nearest_by_hand(query, candidates, k, want) -> None:
    for factors in (GOLD, torch.as_tensor(GOLD, dtype=torch.float32)):
        got = nearest(factors, query, candidates, k)
        assert [j for j, _ in got] == [j for j, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)
        assert all(isinstance(j, int) and isinstance(s, float) for j, s in got)


def test_nearest_batch_equals_nearest_and_refuses_bad_rows() -> None:
    x = np.random.default_rng(0).normal(size=(9, 3))
    assert nearest_batch(x, [4, 0, 8], [1, 2, 3, 4, 5], 3) == [nearest(x, q, [1, 2, 3, 4, 5], 3) for q in (4, 0, 8)]
    with pytest.raises(IndexError):
        nearest(x, 9, None, 2)
    with pytest.raises(IndexError):
        nearest(x, 0, [1, 12], 2)
    with pytest.raises(ValueError, match="2-d"):
        nearest(x[0], 0, None, 2)
    with pytest.raises(ValueError, match="NaN"):
        nearest(np.full((2, 2), np.nan), 0, None, 1)
