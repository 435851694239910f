"""The one LightGCN: normalisation by hand, propagation against a dense reference (both
backends), and the user-item recommender learning planted preferences with BPR."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rexeval.models.recommenders.lightgcn import BipartitePropagation, LightGCN, normalized_bipartite
from tests.models.recommenders.test_expgcn import dense_lightgcn
from tests.doubles.seeds import SEED


def test_normalized_bipartite_by_hand() -> None:
    # node a0 has degree 2, a1 degree 1, b0 degree 1, b1 degree 2
    ei, w = normalized_bipartite(np.array([[0, 0, 1], [0, 1, 1]]), 2, 2)
    got = {(int(a), int(b)): float(x) for a, b, x in zip(ei[0], ei[1], w)}
    s2 = 1 / np.sqrt(2)
    want = {(0, 2): s2, (0, 3): 0.5, (1, 3): s2}
    want.update({(b, a): x for (a, b), x in want.items()})
    assert got.keys() == want.keys()
    for k, x in want.items():
        assert got[k] == pytest.approx(x, rel=1e-6)


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("layers", [0, 2])
def test_propagation_matches_the_dense_reference(sparse: bool, layers: int) -> None:
    edges = np.array([[0, 0, 1, 2, 2], [0, 3, 1, 1, 2]])
    gen = torch.Generator().manual_seed(0)
    xa, xb = torch.randn(3, 4, generator=gen), torch.randn(4, 4, generator=gen)
    prop = BipartitePropagation(edges, 3, 4, layers, sparse=sparse)
    ha, hb = prop(xa, xb)
    ra, rb = dense_lightgcn(edges, xa.numpy(), xb.numpy(), layers)
    np.testing.assert_allclose(ha.numpy(), ra, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hb.numpy(), rb, rtol=1e-5, atol=1e-6)
    assert dict(prop.state_dict()) == {}  # the graph is rebuilt, never saved
    with pytest.raises(ValueError, match="layers must be"):
        BipartitePropagation(edges, 3, 4, -1)


@pytest.mark.learning
def test_the_recommender_learns_planted_preferences() -> None:
    """Two user groups each like their own half of the items; a held-out liked item must
    outscore the other half for every user after BPR training."""
    n_users, n_items = 20, 10
    liked = {u: [i for i in range(n_items) if (i < 5) == (u < 10)] for u in range(n_users)}
    held = {u: liked[u][u % 5] for u in range(n_users)}
    pairs = np.array([(u, i) for u in range(n_users) for i in liked[u] if i != held[u]]).T
    model = LightGCN(n_users, n_items, pairs, dim=16, layers=2, reg=1e-4, seed=SEED)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(SEED)
    users, pos = torch.as_tensor(pairs[0]), torch.as_tensor(pairs[1])
    first = None
    for _ in range(150):
        loss = model.loss(users, pos, torch.randint(n_items, (len(users),), generator=gen))
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    # Half the sampled negatives are items the user likes too (loss log 2 on those), so
    # the loss cannot fall much below half its start: ask for a drop of 30%.
    assert float(loss.detach()) < 0.7 * first
    with torch.no_grad():
        for u in range(n_users):
            others = [i for i in range(n_items) if i not in liked[u]]
            s = model.score(torch.full((n_items,), u), torch.arange(n_items))
            assert float(s[held[u]]) > float(s[others].max()), u


def test_xrec_backbone_and_expgcn_share_one_propagation() -> None:
    """XRec's collaborative backbone (LightGCN) and ExpGCN's user-item path are one
    implementation: on the same graph and the same ego embeddings, LightGCN's propagated
    users and items equal ExpGCN's user-item subgraph output, and both hold the very
    same propagation class."""
    from rexeval.models.recommenders.base import TrainGraph
    from rexeval.models.recommenders.expgcn import ExpGCN

    triplets = np.array([[0, 0, 0], [0, 1, 1], [1, 1, 2], [2, 2, 0], [2, 0, 3], [3, 2, 1]])
    graph = TrainGraph.from_triplets(4, 3, 4, triplets)
    exp = ExpGCN(4, 3, 4, graph, dim=8, layers_ui=3, seed=1)
    gcn = LightGCN(4, 3, graph.user_item, dim=8, layers=3, seed=2)
    with torch.no_grad():
        gcn.user_emb.copy_(exp.user_emb)
        gcn.item_emb.copy_(exp.item_emb)
    hu, hi = gcn.embeddings()
    h = exp.forward_all()
    torch.testing.assert_close(hu, h.user_ui, rtol=0, atol=0)
    torch.testing.assert_close(hi, h.item_ui, rtol=0, atol=0)
    assert type(gcn.prop) is type(exp.props["ui"]) is BipartitePropagation


# --- XRec's encoder options: layer sum, Xavier-uniform start, regulariser on the outputs ---

S2 = 1 / np.sqrt(2)
TINY = np.array([[0, 0, 1], [0, 1, 1]])  # u0-i0, u0-i1, u1-i1: weights 1/sqrt2, 1/2, 1/sqrt2
TINY_X = (torch.tensor([[1.0], [2.0]]), torch.tensor([[3.0], [4.0]]))  # u0, u1 | i0, i1
# Layers 0..2 of [u0, u1, i0, i1] under that adjacency, worked out by hand:
# layer 1: u0 = 3/sqrt2 + 4/2, u1 = 4/sqrt2, i0 = 1/sqrt2, i1 = 1/2 + 2/sqrt2
# layer 2: u0 = (1/sqrt2)/sqrt2 + (1/2 + 2/sqrt2)/2, u1 = (1/2 + 2/sqrt2)/sqrt2,
#          i0 = (3/sqrt2 + 2)/sqrt2, i1 = (3/sqrt2 + 2)/2 + (4/sqrt2)/sqrt2
TINY_LAYERS = [
    np.array([1.0, 2.0, 3.0, 4.0]),
    np.array([3 * S2 + 2, 4 * S2, S2, 0.5 + 2 * S2]),
    np.array([0.75 + S2, 1 + 0.5 * S2, 1.5 + 2 * S2, 3 + 1.5 * S2]),
]


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("layers", [0, 1, 2])
def test_sum_and_mean_of_layers_by_hand(sparse: bool, layers: int) -> None:
    want_sum = sum(TINY_LAYERS[: layers + 1])
    for combine, want in (("sum", want_sum), ("mean", want_sum / (layers + 1))):
        ha, hb = BipartitePropagation(TINY, 2, 2, layers, sparse=sparse, combine=combine)(*TINY_X)
        np.testing.assert_allclose(torch.cat([ha, hb])[:, 0].numpy(), want, rtol=1e-6)
    assert BipartitePropagation(TINY, 2, 2, layers).combine == "mean"  # today's behaviour by default
    # the sum is (L + 1) times the mean on any input
    gen = torch.Generator().manual_seed(1)
    xa, xb = torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen)
    sa, sb = BipartitePropagation(TINY, 2, 2, layers, sparse=sparse, combine="sum")(xa, xb)
    ma, mb = BipartitePropagation(TINY, 2, 2, layers, sparse=sparse)(xa, xb)
    torch.testing.assert_close(sa, (layers + 1) * ma)
    torch.testing.assert_close(sb, (layers + 1) * mb)


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ValueError, match="combine must be"):
        BipartitePropagation(TINY, 2, 2, 1, combine="max")
    with pytest.raises(ValueError, match="combine must be"):
        LightGCN(2, 2, TINY, dim=4, combine="concat")
    with pytest.raises(ValueError, match="init must be"):
        LightGCN(2, 2, TINY, dim=4, init="uniform")
    with pytest.raises(ValueError, match="reg_mode must be"):
        LightGCN(2, 2, TINY, dim=4, reg_mode="params")


def test_lightgcn_passes_combine_to_its_propagation() -> None:
    for combine, scale in (("mean", 1 / 3), ("sum", 1.0)):
        gcn = LightGCN(2, 2, TINY, dim=1, layers=2, combine=combine)
        with torch.no_grad():
            gcn.user_emb.copy_(TINY_X[0])
            gcn.item_emb.copy_(TINY_X[1])
        hu, hi = gcn.embeddings()
        np.testing.assert_allclose(torch.cat([hu, hi])[:, 0].detach().numpy(), scale * sum(TINY_LAYERS), rtol=1e-6)


def test_inits_are_seeded_normal_or_xavier_uniform() -> None:
    n_users, n_items, dim = 300, 500, 64
    normal = LightGCN(n_users, n_items, TINY, dim=dim, seed=5)
    gen = torch.Generator().manual_seed(5)
    torch.testing.assert_close(normal.user_emb.data, torch.randn(n_users, dim, generator=gen) * 0.01, rtol=0, atol=0)
    torch.testing.assert_close(normal.item_emb.data, torch.randn(n_items, dim, generator=gen) * 0.01, rtol=0, atol=0)

    xavier = LightGCN(n_users, n_items, TINY, dim=dim, seed=5, init="xavier")
    again = LightGCN(n_users, n_items, TINY, dim=dim, seed=5, init="xavier")
    other = LightGCN(n_users, n_items, TINY, dim=dim, seed=6, init="xavier")
    assert torch.equal(xavier.user_emb, again.user_emb) and torch.equal(xavier.item_emb, again.item_emb)
    assert not torch.equal(xavier.user_emb, other.user_emb)
    for emb, rows in ((xavier.user_emb, n_users), (xavier.item_emb, n_items)):
        # Xavier-uniform on a [rows, dim] table: U(-b, b), b = sqrt(6 / (rows + dim)), variance b^2 / 3
        bound = np.sqrt(6 / (rows + dim))
        x = emb.detach().numpy()
        assert np.abs(x).max() <= bound and np.abs(x).max() > 0.98 * bound
        assert abs(x.mean()) < 0.02 * bound
        assert x.var() == pytest.approx(bound ** 2 / 3, rel=0.03)


def test_regulariser_modes_by_hand() -> None:
    """BPR + reg on the tiny graph (1 layer, summed): "ego_mean" takes the batch's ego rows
    over the batch size, "output_sum" the batch's propagated rows, not divided."""
    users, pos, neg = torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([1, 0])
    u, i = TINY_LAYERS[0][:2] + TINY_LAYERS[1][:2], TINY_LAYERS[0][2:] + TINY_LAYERS[1][2:]  # propagated sums
    diff = np.array([u[0] * (i[0] - i[1]), u[1] * (i[1] - i[0])])
    bpr = np.mean(np.log1p(np.exp(-diff)))
    reg = 0.1
    want = {
        "ego_mean": bpr + reg * (1 + 4 + 9 + 16 + 16 + 9) / 2,
        "output_sum": bpr + reg * (u[0] ** 2 + u[1] ** 2 + i[0] ** 2 + i[1] ** 2 + i[1] ** 2 + i[0] ** 2),
    }
    for mode, value in want.items():
        gcn = LightGCN(2, 2, TINY, dim=1, layers=1, reg=reg, combine="sum", reg_mode=mode)
        with torch.no_grad():
            gcn.user_emb.copy_(TINY_X[0])
            gcn.item_emb.copy_(TINY_X[1])
        assert float(gcn.loss(users, pos, neg).detach()) == pytest.approx(value, rel=1e-6), mode
    assert LightGCN(2, 2, TINY, dim=1).reg_mode == "ego_mean"  # today's behaviour by default
