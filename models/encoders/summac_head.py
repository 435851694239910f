"""The trained head of SummaC-Conv (seed 000, section IV-A-2): two small linear layers
and the histogram binning they were trained with.

Why it lives here: it holds weights. The metric (`metrics/summac.py`) computes the
histograms of NLI scores per generated sentence and asks this head for the row outputs
and the final probability; the maths of both SummaC variants, the caps and the layout are
there. A head is loaded from the `summac` package's saved `state_dict` (.bin) with
`load_conv_head`; the bins and NLI labels are not stored in the file, so they are passed
(the published checkpoint's: "percentile", "e").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PERCENTILE_EDGES: tuple[float, ...] = (
    0.0, 0.01, 0.02, 0.03, 0.04, 0.07, 0.13, 0.37, 0.90, 0.91, 0.92, 0.93, 0.94, 0.95,
    0.955, 0.96, 0.965, 0.97, 0.975, 0.98, 0.985, 0.99, 0.995, 1.0)
"""The package's "percentile" bin edges (23 bins; fine near 1, where entailment
probabilities of a trained NLI model pile up). The published checkpoint uses them."""

NLI_LABEL_SETS: tuple[str, ...] = ("e", "c", "n", "ec", "en", "cn", "ecn")
"""Accepted `nli_labels` of a Conv head (those the package accepts)."""


def check_nli_labels(nli_labels: str) -> None:
    if nli_labels not in NLI_LABEL_SETS:
        raise ValueError(f"unknown nli_labels {nli_labels!r}; expected one of {NLI_LABEL_SETS}")


def bin_edges(bins: str) -> np.ndarray:
    """Histogram edges for "percentile" or "evenN" (N equal bins on [0, 1])."""
    if bins == "percentile":
        return np.array(PERCENTILE_EDGES, dtype=np.float64)
    if bins.startswith("even") and bins[4:].isdigit() and int(bins[4:]) > 0:
        count = int(bins[4:])
        # The package's construction (arange, then 1.0), so the edges match to the bit.
        return np.array(list(np.arange(0, 1, 1 / count)) + [1.0], dtype=np.float64)
    raise ValueError(f"unknown bins {bins!r}; expected 'percentile' or 'evenN', e.g. 'even50'")


@dataclass(frozen=True, eq=False)
class SummaCConvHead:
    """The trained part of SummaC-Conv: row layer (histogram -> number) and final 2-way
    layer, as torch tensors on `device`, plus the binning they were trained with."""

    row_weight: Any    # torch [1, n_features]  (the package's `mlp`)
    row_bias: Any      # torch [1]
    final_weight: Any  # torch [2, 3]           (the package's `layer_final`)
    final_bias: Any    # torch [2]
    bins: str
    nli_labels: str
    device: str

    @property
    def edges(self) -> np.ndarray:
        return bin_edges(self.bins)

    @property
    def n_features(self) -> int:
        return int(self.row_weight.shape[1])

    @classmethod
    def from_state_dict(cls, state: dict, *, bins: str = "percentile", nli_labels: str = "e",
                        device: str = "cpu") -> SummaCConvHead:
        """From the package's `SummaCConv.state_dict()` (keys mlp.*, layer_final.*)."""
        import torch

        check_nli_labels(nli_labels)
        keys = ("mlp.weight", "mlp.bias", "layer_final.weight", "layer_final.bias")
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"not a SummaC-Conv state dict: missing {missing} "
                             f"(found {sorted(state)[:8]})")
        t = {key: torch.as_tensor(state[key]).detach().to(device=device, dtype=torch.float32)
             for key in keys}
        want = len(nli_labels) * (len(bin_edges(bins)) - 1)
        if tuple(t["mlp.weight"].shape) != (1, want) or tuple(t["layer_final.weight"].shape) != (2, 3):
            raise ValueError(
                f"the head has mlp.weight {tuple(t['mlp.weight'].shape)} and layer_final.weight "
                f"{tuple(t['layer_final.weight'].shape)}; bins={bins!r} with "
                f"nli_labels={nli_labels!r} needs (1, {want}) and (2, 3). Pass the bins and "
                "labels it was trained with; heads over several NLI models (the package's "
                "models=[...] with more than one) are not supported: we have one NLI engine.")
        return cls(t["mlp.weight"], t["mlp.bias"], t["layer_final.weight"],
                   t["layer_final.bias"], bins, nli_labels, str(device))

    def row_scores(self, histograms: np.ndarray) -> np.ndarray:
        """[R, n_features] counts -> [R] row outputs (float32 arithmetic, as trained)."""
        import torch

        with torch.inference_mode():
            h = torch.as_tensor(np.asarray(histograms), dtype=torch.float32, device=self.device)
            out = torch.nn.functional.linear(h, self.row_weight, self.row_bias)
        return out[:, 0].cpu().numpy().astype(np.float64)

    def final_scores(self, mean_rows: np.ndarray) -> np.ndarray:
        """Per-example mean row outputs [B] -> P(consistent) [B]."""
        import torch

        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(mean_rows), dtype=torch.float32, device=self.device)
            logits = torch.nn.functional.linear(x[:, None].expand(-1, 3), self.final_weight,
                                                self.final_bias)
            probs = torch.softmax(logits, dim=-1)[:, 1]
        return probs.cpu().numpy().astype(np.float64)


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_conv_head(path: str, device: str = "cpu", *, bins: str = "percentile",
                   nli_labels: str = "e") -> SummaCConvHead:
    """A SummaC-Conv head from a .bin the package saved (its `state_dict`). The bins and
    labels are not stored in the file; the defaults are those of the published
    checkpoint (summac_conv_vitc_sent_perc_e.bin: "percentile", "e")."""
    import torch

    device = _resolve_device(device)
    state = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
    return SummaCConvHead.from_state_dict(state, bins=bins, nli_labels=nli_labels, device=device)
