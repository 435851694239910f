"""ExpGCN statement ranker: LightGCN propagation, scoring formula, training, caching."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rexeval.models.recommenders.base import RANKERS, TrainGraph, ranker_class
from rexeval.models.recommenders.expgcn import ExpGCN
from tests.doubles.seeds import SEED
from tests.doubles.planted_graph import (
    check_eval_cache,
    planted_graph,
    train_steps,
)


def tiny_graph() -> TrainGraph:
    """2 users, 1 item, 2 statements; user-statement edges (0,0), (0,1), (1,1)."""
    return TrainGraph.from_triplets(2, 1, 2, np.array([[0, 0, 0], [0, 0, 1], [1, 0, 1]]))


def dense_lightgcn(edges: np.ndarray, xa: np.ndarray, xb: np.ndarray, layers: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Reference: dense D^-1/2 A D^-1/2, mean of layers 0..L."""
    na, nb = len(xa), len(xb)
    A = np.zeros((na + nb, na + nb))
    for a, b in edges.T:
        A[a, na + b] = A[na + b, a] = 1.0
    deg = A.sum(1)
    dinv = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-12)), 0.0)
    norm = dinv[:, None] * A * dinv[None, :]
    x = np.concatenate([xa, xb]).astype(np.float64)
    acc = x.copy()
    for _ in range(layers):
        x = norm @ x
        acc += x
    acc /= layers + 1
    return acc[:na], acc[na:]


def numpy_scores(model: ExpGCN, graph: TrainGraph, users: np.ndarray,
                 items: np.ndarray) -> np.ndarray:
    U = model.user_emb.detach().numpy()
    I = model.item_emb.detach().numpy()
    S = model.stmt_emb.detach().numpy()
    u_us, s_us = dense_lightgcn(graph.user_statement, U, S, model.layers["us"])
    i_is, s_is = dense_lightgcn(graph.item_statement, I, S, model.layers["is"])
    u_ui, i_ui = dense_lightgcn(graph.user_item, U, I, model.layers["ui"])
    hu, hi = u_us + u_ui, i_is + i_ui
    out = np.zeros((len(users), model.n_statements))
    for r, (u, i) in enumerate(zip(users, items)):
        for s in range(model.n_statements):
            out[r, s] = hu[u] @ s_us[s] + hi[i] @ s_is[s]
    return out


def randomize(model: ExpGCN, seed: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))


def build(graph: TrainGraph, **kw) -> ExpGCN:
    return ExpGCN(graph.n_users, graph.n_items, graph.n_statements, graph, **kw)


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("layers", [0, 1, 2, 3])
def test_propagation_matches_dense_reference(sparse: bool, layers: int) -> None:
    graph = tiny_graph()
    model = build(graph, dim=3, layers_us=layers, sparse=sparse)
    randomize(model)
    with torch.no_grad():
        hu, hs = model.propagate("us", model.user_emb, model.stmt_emb)
    U, S = model.user_emb.detach().numpy(), model.stmt_emb.detach().numpy()
    ru, rs = dense_lightgcn(graph.user_statement, U, S, layers)
    np.testing.assert_allclose(hu.numpy(), ru, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hs.numpy(), rs, rtol=1e-5, atol=1e-6)
    if layers == 0:
        torch.testing.assert_close(hu, model.user_emb.detach())
        torch.testing.assert_close(hs, model.stmt_emb.detach())


def test_one_layer_by_hand() -> None:
    """L=1 on the tiny graph, written out: out = (x + A_hat x) / 2."""
    model = build(tiny_graph(), dim=1, layers_us=1)
    with torch.no_grad():
        model.user_emb.copy_(torch.tensor([[1.0], [2.0]]))
        model.stmt_emb.copy_(torch.tensor([[3.0], [5.0]]))
        hu, hs = model.propagate("us", model.user_emb, model.stmt_emb)
    s2 = 1 / np.sqrt(2)
    u0 = (1 + s2 * 3 + 0.5 * 5) / 2  # neighbours s0 (deg 1) and s1 (deg 2), u0 deg 2
    u1 = (2 + s2 * 5) / 2
    s0 = (3 + s2 * 1) / 2
    s1 = (5 + 0.5 * 1 + s2 * 2) / 2
    np.testing.assert_allclose(hu[:, 0].numpy(), [u0, u1], rtol=1e-6)
    np.testing.assert_allclose(hs[:, 0].numpy(), [s0, s1], rtol=1e-6)


@pytest.mark.parametrize("sparse", [True, False])
def test_score_all_matches_dense_model(sparse: bool) -> None:
    graph = planted_graph()
    model = build(graph, dim=4, layers_us=2, layers_is=3, layers_ui=1, sparse=sparse).eval()
    randomize(model)
    users, items = np.array([0, 7, 3, 3]), np.array([5, 0, 2, 2])
    got = model.score_all(torch.tensor(users), torch.tensor(items), torch.arange(4))
    assert got.dtype == torch.float32 and got.shape == (4, graph.n_statements)
    assert not got.requires_grad
    np.testing.assert_allclose(got.numpy(), numpy_scores(model, graph, users, items),
                               rtol=1e-4, atol=1e-4)
    stmts = torch.tensor([0, 4, 9, 19])
    pair = model.pair_scores(torch.tensor(users), torch.tensor(items), stmts)
    np.testing.assert_allclose(pair.numpy(), got.numpy()[np.arange(4), stmts.numpy()],
                               rtol=1e-5, atol=1e-5)


def test_sparse_and_lgconv_paths_agree_in_training() -> None:
    graph = planted_graph()
    a, b = build(graph, dim=8, sparse=True), build(graph, dim=8, sparse=False)
    la, lb = train_steps(a, graph, steps=5), train_steps(b, graph, steps=5)
    np.testing.assert_allclose(la, lb, rtol=1e-4)
    u = torch.arange(graph.n_users)
    i = u % graph.n_items
    torch.testing.assert_close(a.eval().score_all(u, i, u), b.eval().score_all(u, i, u),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.learning
@pytest.mark.parametrize("rec_weight", [0.0, 1.0])
def test_training_learns_planted_signal(rec_weight: float) -> None:
    graph = planted_graph(seed=SEED)
    model = build(graph, dim=16, reg=1e-3, rec_weight=rec_weight, seed=SEED)
    losses = train_steps(model, graph, seed=SEED)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.6 * losses[0]
    t = torch.as_tensor(graph.triplets)
    model.eval()
    scores = model.score_all(t[:, 0], t[:, 1], torch.arange(len(t)))
    rank = (scores > scores.gather(1, t[:, 2:3])).sum(1).float().mean().item()
    assert rank < (graph.n_statements - 1) / 4  # random would be (n-1)/2


def test_loss_terms() -> None:
    graph = planted_graph()
    model = build(graph, dim=4, reg=0.0, rec_weight=0.0)
    randomize(model)
    args = [torch.tensor(v) for v in ([0, 1], [2, 0], [1, 3], [4, 0], [5, 1])]
    base = model.loss(*args).item()
    model.reg = 0.5
    l2 = sum(t.pow(2).sum().item() for t in (
        model.user_emb[[0, 1]], model.item_emb[[2, 0]], model.item_emb[[5, 1]],
        model.stmt_emb[[1, 3, 4, 0]]))
    assert model.loss(*args).item() == pytest.approx(base + 0.5 * l2 / 2, rel=1e-5)
    model.reg, model.rec_weight = 0.0, 2.0
    h = model.forward_all()
    rec = (h.user_ui[[0, 1]] * (h.item_ui[[2, 0]] - h.item_ui[[5, 1]])).sum(-1)
    want = base + 2.0 * -torch.nn.functional.logsigmoid(rec).mean().item()
    assert model.loss(*args).item() == pytest.approx(want, rel=1e-5)


def test_eval_cache_and_invalidation() -> None:
    graph = planted_graph()
    model = build(graph, dim=6).eval()
    u, i = check_eval_cache(model, graph)
    # in-place edits while in eval mode are noticed too
    before = model.score_all(u, i, torch.arange(2)).clone()
    with torch.no_grad():  # propagation is linear: doubling every ego row quadruples r_uis
        for p in (model.user_emb, model.item_emb, model.stmt_emb):
            p.mul_(2.0)
    torch.testing.assert_close(model.score_all(u, i, torch.arange(2)), 4 * before)
    model.invalidate()
    assert model._cache is None


def test_state_dict_round_trip() -> None:
    graph = planted_graph()
    a = build(graph, dim=5, seed=1).eval()
    b = build(graph, dim=5, seed=2).eval()
    u, i = torch.tensor([0, 1, 6]), torch.tensor([3, 2, 0])
    assert not torch.allclose(a.score_all(u, i, u), b.score_all(u, i, u))
    sd = a.state_dict()
    assert set(sd) == {"user_emb", "item_emb", "stmt_emb"}  # graph buffers not saved
    b.load_state_dict(sd)
    torch.testing.assert_close(a.score_all(u, i, u), b.score_all(u, i, u))


def test_to_moves_graph_buffers() -> None:
    model = build(planted_graph(), dim=4).to(torch.device("cpu"))
    buffers = dict(model.named_buffers())
    assert {f"props.{k}.edge_index" for k in ("us", "is", "ui")} <= set(buffers)
    assert all(b.device == model.user_emb.device for b in buffers.values())


def test_registry() -> None:
    assert RANKERS["expgcn"] is ExpGCN
    assert ranker_class("ExpGCN") is ExpGCN
    assert ExpGCN.name == "expgcn" and ExpGCN.trainable


def test_accepts_and_ignores_features() -> None:
    graph = tiny_graph()
    a = build(graph, dim=3, statement_features=np.ones((2, 4)))
    b = build(graph, dim=3)
    u = torch.tensor([0, 1])
    i = torch.tensor([0, 0])
    torch.testing.assert_close(a.eval().score_all(u, i, u), b.eval().score_all(u, i, u))


@pytest.mark.parametrize("kwargs,match", [
    ({"dim": 0}, "dim must be"),
    ({"layers_us": -1}, "layers_us must be"),
    ({"layers_ui": -2}, "layers_ui must be"),
    ({"reg": -1.0}, "reg must be"),
    ({"rec_weight": -0.5}, "rec_weight must be"),
])
def test_constructor_validation(kwargs: dict, match: str) -> None:
    graph = tiny_graph()
    with pytest.raises(ValueError, match=match):
        build(graph, **kwargs)


def test_graph_validation() -> None:
    graph = tiny_graph()
    with pytest.raises(ValueError, match="do not match the model"):
        ExpGCN(3, 1, 2, graph)
    with pytest.raises(ValueError, match="needs the training graph"):
        ExpGCN(2, 1, 2, None)  # type: ignore[arg-type]
    bad = TrainGraph(2, 1, 2, graph.triplets, np.array([[0], [5]]), graph.item_statement,
                     graph.user_item)
    with pytest.raises(ValueError, match="out of range"):
        build(bad)


def test_empty_subgraph_keeps_scaled_ego() -> None:
    """A subgraph without edges leaves ego / (L + 1): nothing to propagate."""
    graph = tiny_graph()
    empty = TrainGraph(2, 1, 2, graph.triplets, graph.user_statement,
                       graph.item_statement, np.zeros((2, 0), dtype=np.int64))
    model = build(empty, dim=3, layers_ui=2)
    with torch.no_grad():
        hu, hi = model.propagate("ui", model.user_emb, model.item_emb)
    torch.testing.assert_close(hu, model.user_emb.detach() / 3)
    torch.testing.assert_close(hi, model.item_emb.detach() / 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    graph = planted_graph()
    cpu = build(graph, dim=8).eval()
    randomize(cpu)
    gpu = build(graph, dim=8).to("cuda").eval()
    gpu.load_state_dict(cpu.state_dict())
    assert all(b.is_cuda for b in gpu.buffers())
    u, i = torch.tensor([0, 5]), torch.tensor([1, 3])
    torch.testing.assert_close(gpu.score_all(u, i, u).cpu(), cpu.score_all(u, i, u),
                               rtol=1e-4, atol=1e-4)
    gpu.train()
    loss = gpu.loss(u.cuda(), i.cuda(), u.cuda(), i.cuda(), i.cuda())
    loss.backward()
    assert torch.isfinite(loss) and gpu.user_emb.grad is not None
