"""A scripted NLI scorer (test double): deterministic probabilities from the texts, an
optional delay per call, and a record of the batch sizes it was given."""
from __future__ import annotations

import hashlib
import time

import numpy as np


def scripted_probs(premise: str, hypothesis: str) -> list[float]:
    """Entailment when the hypothesis is in the premise, contradiction when the premise
    says "not" and the hypothesis does not (or the reverse); else a hash-made mix."""
    p, h = premise.lower(), hypothesis.lower()
    if h in p:
        return [0.9, 0.08, 0.02]
    if (" not " in f" {p} ") != (" not " in f" {h} ") and h.replace("not ", "") in p.replace("not ", ""):
        return [0.03, 0.07, 0.9]
    x = int(hashlib.blake2b(f"{p}\x1f{h}".encode(), digest_size=4).hexdigest(), 16) / 2**32
    return [0.2 * x, 0.8 - 0.2 * x, 0.2]


class ScriptedNLI:
    def __init__(self, location: str = "", *, model_ref: str | None = None, device: str = "cpu",
                 delay_s: float = 0.0, **_):
        self.delay_s = float(delay_s)
        self.calls: list[int] = []

    def score(self, premises, hypotheses, batch_size=None) -> np.ndarray:
        if len(premises) != len(hypotheses):
            raise ValueError("premises and hypotheses differ in length")
        self.calls.append(len(premises))
        if self.delay_s:
            time.sleep(self.delay_s)
        return np.array([scripted_probs(p, h) for p, h in zip(premises, hypotheses)],
                        dtype=np.float32).reshape(-1, 3)
