"""XRec against its original (HKUDS/XRec as seed 000 ran it): every adapter expert draws
its own dropout mask (the original gives each expert its own Dropout) while evaluation
stays the plain whitening mixture, and the LightGCN settings that shape the prepared
collaborative embeddings (layer sum, Xavier-uniform start) are XRec's defaults and part
of what the prepared data depends on."""
from __future__ import annotations

import torch

from rexeval.models.generators.base import generator_class
from rexeval.models.generators.xrec import MoEAdapter


def test_each_expert_draws_its_own_dropout_mask() -> None:
    torch.manual_seed(0)
    ad = MoEAdapter(32, 16, n_experts=2, dropout=0.5, noisy=False).train()
    x = torch.rand(64, 32) + 0.5  # no zeros of its own: a zero is a dropped entry
    inp = ad.expert_inputs(x)  # bias is zero at the start: the dropped inputs themselves
    assert inp.shape == (64, 2, 32)
    kept = inp != 0
    for e in range(2):
        torch.testing.assert_close(inp[:, e][kept[:, e]], 2 * x[kept[:, e]])  # inverted dropout: kept * 1/(1-p)
        assert 0.4 < kept[:, e].float().mean() < 0.6
    assert not torch.equal(kept[:, 0], kept[:, 1])
    agree = (kept[:, 0] == kept[:, 1]).float().mean()
    assert 0.4 < agree < 0.6  # independent masks agree on half the entries (one shared mask: all)

    # the forward pass mixes exactly these per-expert inputs
    with torch.no_grad():
        ad.w_gate.normal_()
        ad.bias.normal_()
    torch.manual_seed(3)
    y = ad(x)
    torch.manual_seed(3)
    inp = ad.expert_inputs(x)
    g = ad.gates(x)
    want = sum(g[:, e, None] * (inp[:, e] @ ad.weight[e]) for e in range(2))
    torch.testing.assert_close(y, want)


def test_eval_output_is_the_formula_without_dropout() -> None:
    torch.manual_seed(1)
    ad = MoEAdapter(8, 16, n_experts=4, dropout=0.5, noisy=True)
    with torch.no_grad():
        ad.w_gate.normal_()
        ad.w_noise.normal_()
        ad.bias.normal_()
    ad.eval()
    x = torch.randn(5, 8)
    g = (x @ ad.w_gate).softmax(-1)
    want = sum(g[:, e, None] * ((x - ad.bias[e]) @ ad.weight[e]) for e in range(4))
    torch.testing.assert_close(ad(x), want)
    assert torch.equal(ad(x), ad(x))
    torch.testing.assert_close(ad.expert_inputs(x), x[:, None, :] - ad.bias[None])


def test_xrec_lightgcn_settings_are_the_originals_and_fix_the_data() -> None:
    from rexeval.pipelines.generate.collab import KEYS

    cls = generator_class("xrec")
    assert cls.DEFAULTS["gcn_combine"] == "sum" and cls.DEFAULTS["gcn_init"] == "xavier"
    assert {"gcn_combine", "gcn_init"} <= set(cls.DATA_KEYS)
    # every LightGCN setting the pipeline passes is an XRec setting the prepared data depends on
    assert set(KEYS) - {"seed"} <= set(cls.DATA_KEYS) <= set(cls.DEFAULTS)
    assert not {"gcn_combine", "gcn_init"} & set(cls.model_kwargs(cls.DEFAULTS))  # data, not model, settings
