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
