"""XRec's collaborative backbone as `pipelines/generate/collab.py` builds it: the
settings' layer combination and initialisation reach LightGCN (the trial's model and the
one the best checkpoint is loaded into are built by the same function)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from rexeval.models.generators.base import generator_class
from rexeval.pipelines.generate.collab import KEYS, lightgcn

PAIRS = np.array([[0, 0, 1, 2], [0, 1, 1, 2]])


def settings(**kw):
    s = {k: v for k, v in generator_class("xrec").DEFAULTS.items() if k in KEYS} | {"seed": 3}
    return s | kw


def test_xrec_defaults_build_a_summed_xavier_lightgcn() -> None:
    data = SimpleNamespace(n_users=3, n_items=4)
    s = settings(gcn_dim=8, gcn_layers=2)
    model = lightgcn(data, PAIRS, s)
    assert model.prop.combine == "sum" and model.init == "xavier" and model.reg == s["gcn_reg"]
    assert model.dim == 8 and model.prop.layers == 2
    gen = torch.Generator().manual_seed(3)
    want_u = torch.nn.init.xavier_uniform_(torch.empty(3, 8), generator=gen)
    want_i = torch.nn.init.xavier_uniform_(torch.empty(4, 8), generator=gen)
    assert torch.equal(model.user_emb.data, want_u) and torch.equal(model.item_emb.data, want_i)
    mean = lightgcn(data, PAIRS, settings(gcn_dim=8, gcn_layers=2, gcn_combine="mean", gcn_init="normal"))
    assert mean.prop.combine == "mean" and mean.init == "normal"
    with torch.no_grad():
        mean.user_emb.copy_(model.user_emb)
        mean.item_emb.copy_(model.item_emb)
    for a, b in zip(model.embeddings(), mean.embeddings()):
        torch.testing.assert_close(a, 3 * b)
