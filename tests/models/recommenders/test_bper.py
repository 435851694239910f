"""BPER+ statement ranker: scoring formula, mu weighting, features, training, caching."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rexeval.models.recommenders.base import RANKERS, TrainGraph, ranker_class
from rexeval.models.recommenders.bper import BPERPlus
from tests.doubles.seeds import SEED, seeded
from tests.doubles.planted_graph import (
    check_eval_cache,
    planted_graph,
    train_steps,
)


def mean_positive_rank(model: torch.nn.Module, graph: TrainGraph) -> float:
    """Mean 0-based rank of each training positive among all statements."""
    t = torch.as_tensor(graph.triplets)
    model.eval()
    with torch.no_grad():
        scores = model.score_all(t[:, 0], t[:, 1], torch.arange(len(t)))
    pos = scores.gather(1, t[:, 2:3])
    return float((scores > pos).sum(1).float().mean())


def features(n: int, width: int = 7, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, width)).astype(np.float32)


def randomize(model: BPERPlus, seed: int = 3) -> None:
    """Non-trivial parameters (biases start at zero, embeddings tiny)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))


def numpy_scores(model: BPERPlus, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Per-pair formula, written independently of the model's GEMM."""
    P = model.user_emb.detach().numpy()
    O = model.item_emb.detach().numpy()
    EU = model.stmt_user_emb.detach().numpy()
    EI = model.stmt_item_emb.detach().numpy()
    bU = model.stmt_user_bias.detach().numpy()
    bI = model.stmt_item_bias.detach().numpy()
    if model.features is not None:
        f = model.features.numpy()
        EU = EU + f @ model.proj_user.weight.detach().numpy().T
        EI = EI + f @ model.proj_item.weight.detach().numpy().T
    out = np.zeros((len(users), model.n_statements))
    for r, (u, i) in enumerate(zip(users, items)):
        for s in range(model.n_statements):
            r_us = P[u] @ EU[s] + bU[s]
            r_is = O[i] @ EI[s] + bI[s]
            out[r, s] = model.mu * r_us + (1 - model.mu) * r_is
    return out


@pytest.mark.parametrize("with_features", [False, True])
def test_score_all_matches_pair_formula(with_features: bool) -> None:
    f = features(11) if with_features else None
    model = BPERPlus(5, 4, 11, dim=6, mu=0.7, statement_features=f).eval()
    randomize(model)
    users, items = np.array([0, 4, 2, 2]), np.array([3, 0, 1, 1])
    got = model.score_all(torch.tensor(users), torch.tensor(items), torch.arange(4))
    assert got.dtype == torch.float32 and got.shape == (4, 11)
    np.testing.assert_allclose(got.numpy(), numpy_scores(model, users, items),
                               rtol=1e-4, atol=1e-4)
    pair = model.pair_scores(torch.tensor(users), torch.tensor(items), torch.tensor([1, 2, 3, 4]))
    np.testing.assert_allclose(pair.detach().numpy(),
                               got.numpy()[np.arange(4), [1, 2, 3, 4]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mu,side", [(1.0, "item"), (0.0, "user")])
def test_mu_extremes_drop_one_side(mu: float, side: str) -> None:
    model = BPERPlus(4, 3, 9, dim=5, mu=mu, statement_features=features(9)).eval()
    randomize(model)
    u, i = torch.tensor([0, 1, 3]), torch.tensor([2, 0, 1])
    before = model.score_all(u, i, torch.arange(3)).clone()
    with torch.no_grad():
        if side == "item":
            model.item_emb.add_(5.0)
            model.stmt_item_emb.mul_(-3.0)
            model.stmt_item_bias.add_(2.0)
        else:
            model.user_emb.add_(5.0)
            model.stmt_user_emb.mul_(-3.0)
            model.stmt_user_bias.add_(2.0)
    after = model.score_all(u, i, torch.arange(3))
    torch.testing.assert_close(before, after)


def test_features_feed_projection() -> None:
    f = features(9)
    model = BPERPlus(4, 3, 9, dim=5, statement_features=f).eval()
    randomize(model)
    names = {n for n, _ in model.named_parameters()}
    assert {"proj_user.weight", "proj_item.weight"} <= names
    assert "features" not in model.state_dict()  # fixed buffer, not trained or saved
    assert not model.features.requires_grad and model.features.dtype == torch.float32
    u, i = torch.tensor([0, 1]), torch.tensor([2, 0])
    before = model.score_all(u, i, torch.arange(2)).clone()
    with torch.no_grad():
        model.features.mul_(2.0)
    model.invalidate()  # buffers are not parameters: a feature edit needs an explicit drop
    assert not torch.allclose(before, model.score_all(u, i, torch.arange(2)))
    plain = BPERPlus(4, 3, 9, dim=5)
    assert plain.features is None and plain.proj_user is None
    assert not any(n.startswith("proj") for n, _ in plain.named_parameters())


def test_features_accept_torch_and_float64() -> None:
    f = torch.tensor(features(6), dtype=torch.float64)
    model = BPERPlus(2, 2, 6, dim=3, statement_features=f)
    assert model.features.dtype == torch.float32 and model.features.shape == (6, 7)


@pytest.mark.learning
def test_training_learns_planted_signal() -> None:
    graph = planted_graph(seed=SEED)
    model = BPERPlus(graph.n_users, graph.n_items, graph.n_statements, dim=8, mu=0.7,
                     reg=1e-5, statement_features=features(graph.n_statements, seed=seeded(1)), graph=graph,
                     seed=SEED)
    losses = train_steps(model, graph, seed=SEED)
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0]
    n = graph.n_statements
    assert mean_positive_rank(model, graph) < (n - 1) / 4  # random would be (n-1)/2


def test_reg_term_adds_scaled_l2() -> None:
    model = BPERPlus(3, 3, 5, dim=4, reg=0.0)
    randomize(model)
    args = [torch.tensor(v) for v in ([0, 1], [2, 0], [1, 3], [4, 0], [0, 0])]
    base = model.loss(*args)
    model.reg = 0.5
    l2 = sum(t.pow(2).sum().item() for t in (
        model.user_emb[[0, 1]], model.item_emb[[2, 0]],
        model.stmt_user_emb[[1, 3, 4, 0]], model.stmt_item_emb[[1, 3, 4, 0]],
        model.stmt_user_bias[[1, 3, 4, 0]], model.stmt_item_bias[[1, 3, 4, 0]]))
    assert model.loss(*args).item() == pytest.approx(base.item() + 0.5 * l2 / 2, rel=1e-5)


def test_eval_cache_and_invalidation() -> None:
    graph = planted_graph()
    model = BPERPlus(graph.n_users, graph.n_items, graph.n_statements, dim=6,
                     statement_features=features(graph.n_statements)).eval()
    u, i = check_eval_cache(model, graph)
    # an in-place edit while staying in eval mode is also noticed
    before = model.score_all(u, i, torch.arange(2)).clone()
    with torch.no_grad():
        model.stmt_user_bias.add_(1.0)
    after = model.score_all(u, i, torch.arange(2))
    torch.testing.assert_close(after, before + model.mu)


def test_state_dict_round_trip() -> None:
    f = features(10)
    a = BPERPlus(4, 4, 10, dim=5, statement_features=f, seed=1).eval()
    randomize(a)
    b = BPERPlus(4, 4, 10, dim=5, statement_features=f, seed=2).eval()
    u, i = torch.tensor([0, 1, 3]), torch.tensor([3, 2, 0])
    assert not torch.allclose(a.score_all(u, i, u), b.score_all(u, i, u))
    b.score_all(u, i, u)  # warm b's cache so load_state_dict must invalidate it
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a.score_all(u, i, u), b.score_all(u, i, u))


def test_seeded_init_is_reproducible() -> None:
    a, b = BPERPlus(3, 3, 4, dim=4, seed=7), BPERPlus(3, 3, 4, dim=4, seed=7)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa, pb, msg=na)


def test_registry() -> None:
    assert RANKERS["bper+"] is BPERPlus
    assert ranker_class("BPER+") is BPERPlus
    assert BPERPlus.name == "bper+" and BPERPlus.trainable


@pytest.mark.parametrize("kwargs,match", [
    ({"mu": 1.5}, "mu must be in"),
    ({"mu": -0.1}, "mu must be in"),
    ({"dim": 0}, "dim must be"),
    ({"reg": -1.0}, "reg must be"),
    ({"statement_features": np.zeros((4, 3))}, "4 rows but n_statements is 5"),
    ({"statement_features": np.zeros(5)}, "must be 2-D"),
])
def test_constructor_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BPERPlus(3, 3, 5, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    f = features(10)
    cpu = BPERPlus(4, 4, 10, dim=5, statement_features=f).eval()
    randomize(cpu)
    gpu = BPERPlus(4, 4, 10, dim=5, statement_features=f).to("cuda").eval()
    gpu.load_state_dict(cpu.state_dict())
    assert gpu.features.is_cuda
    u, i = torch.tensor([0, 3]), torch.tensor([1, 2])
    torch.testing.assert_close(gpu.score_all(u, i, u).cpu(), cpu.score_all(u, i, u),
                               rtol=1e-4, atol=1e-4)
    gpu.train()
    loss = gpu.loss(u, i, u, i, i)  # CPU indices are moved to the model's device
    loss.backward()
    assert torch.isfinite(loss)
