"""SummaC-ZS and SummaC-Conv on our NLI engine (metrics/summac.py): hand-worked values,
equality with the `summac` package on one tiny random NLI model, batching and policies."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rexeval.metrics import statement_level as sl
from rexeval.metrics import summac as sm
from rexeval.models.encoders import summac_head as head_mod
from rexeval.metrics.registry import get_metric
from tests.doubles.nli import ScriptedNLI

NAN = float("nan")


def bar_split(text: str) -> list[str]:
    """Sentences separated by "|" (keeps the hand-worked cases independent of Punkt)."""
    return [s for s in text.split("|") if s]


class DictNLI:
    """Scripted scorer: (premise, hypothesis) -> (E, N, C); records every call."""

    def __init__(self, table: dict[tuple[str, str], tuple[float, float, float]]):
        self.table = table
        self.calls: list[list[tuple[str, str]]] = []

    def score(self, premises, hypotheses):
        pairs = list(zip(premises, hypotheses))
        self.calls.append(pairs)
        return np.array([self.table[p] for p in pairs], dtype=np.float32).reshape(-1, 3)


# Generated "g1|g2" (hypotheses) against reference "r1|r2|r3" (premises); (E, N, C):
TABLE = {
    ("r1", "g1"): (0.7, 0.2, 0.1), ("r2", "g1"): (0.2, 0.2, 0.6), ("r3", "g1"): (0.5, 0.5, 0.0),
    ("r1", "g2"): (0.1, 0.3, 0.6), ("r2", "g2"): (0.3, 0.4, 0.3), ("r3", "g2"): (0.25, 0.0, 0.75),
}
# g1: max E = 0.7 (r1), max C = 0.6 (r2)  -> 0.7 - 0.6 = 0.1
# g2: max E = 0.3 (r2), max C = 0.75 (r3) -> 0.3 - 0.75 = -0.45
# SummaC-ZS e-c = (0.1 - 0.45) / 2 = -0.175;   e = (0.7 + 0.3) / 2 = 0.5
# (max_l (E - C) would give g1 0.6, g2 0.0 -> 0.3: the package subtracts the maxima.)


def test_zs_by_hand():
    got = sm.summac_zs_scores(["g1|g2"], ["r1|r2|r3"], DictNLI(TABLE), split=bar_split)
    assert got.shape == (1,) and got[0] == pytest.approx(-0.175, abs=1e-6)
    got_e = sm.summac_zs_scores(["g1|g2"], ["r1|r2|r3"], DictNLI(TABLE), zs_score="e",
                                split=bar_split)
    assert got_e[0] == pytest.approx(0.5, abs=1e-6)
    # statement_level's per-example summac_zs computes the same as the package (max E - max C),
    # not the literal max_l (E - C), which would give 0.3 here; with X = E they agree.
    probs = np.array([[TABLE[(r, g)] for r in ("r1", "r2", "r3")] for g in ("g1", "g2")])
    assert sl.summac_zs(probs) == pytest.approx(-0.175)
    assert sl.summac_zs(probs, zs_score="e") == pytest.approx(got_e[0], abs=1e-6)


def test_zs_one_call_and_duplicates_scored_once():
    nli = DictNLI(TABLE)
    # example 1 repeats example 0's pairs plus nothing new; example 2 is g2 vs r3 only
    got = sm.summac_zs_scores(["g1|g2", "g2|g1", "g2"], ["r1|r2|r3", "r3|r1|r2", "r3"], nli,
                              split=bar_split)
    assert len(nli.calls) == 1 and len(nli.calls[0]) == 6  # 6 distinct of 6 + 6 + 1 pairs
    # example 2: g2 vs r3 alone: 0.25 - 0.75 = -0.5
    np.testing.assert_allclose(got, [-0.175, -0.175, -0.5], atol=1e-6)


def even4_head(device="cpu"):
    """Bins [0, .25), [.25, .5), [.5, .75), [.75, 1]; label E only; row output = the sum
    of the bin indices of the row's values; P(consistent) = sigmoid(mean row output)."""
    import torch

    state = {"mlp.weight": torch.tensor([[0.0, 1.0, 2.0, 3.0]]), "mlp.bias": torch.zeros(1),
             "layer_final.weight": torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]),
             "layer_final.bias": torch.zeros(2)}
    return head_mod.SummaCConvHead.from_state_dict(state, bins="even4", nli_labels="e", device=device)


def test_conv_by_hand():
    table = {("r1", "g1"): (0.9, 0.1, 0.0), ("r2", "g1"): (0.25, 0.7, 0.05),
             ("r1", "g2"): (0.5, 0.5, 0.0), ("r2", "g2"): (1.0, 0.0, 0.0)}
    # g1: E = 0.9 -> bin 3, 0.25 -> bin 1 (a bin includes its lower edge) -> row 3 + 1 = 4
    # g2: E = 0.5 -> bin 2, 1.0 -> bin 3 (the top edge is in the last bin) -> row 2 + 3 = 5
    # mean 4.5; logits (0, 4.5); P(consistent) = 1 / (1 + e^-4.5)
    got = sm.summac_conv_scores(["g1|g2"], ["r1|r2"], DictNLI(table), even4_head(),
                                split=bar_split)
    assert got[0] == pytest.approx(1 / (1 + math.exp(-4.5)), abs=1e-6)
    # The per-example registered function agrees.
    probs = np.array([[table[(r, g)] for r in ("r1", "r2")] for g in ("g1", "g2")])
    assert sm.summac_conv(probs, even4_head()) == pytest.approx(got[0], abs=1e-7)


@pytest.mark.parametrize("bins,labels", [("percentile", "ecn"), ("even7", "cn"), ("even50", "e")])
def test_histograms_match_numpy(bins, labels):
    rng = np.random.default_rng(0)
    n, m = np.array([3, 1, 2]), np.array([4, 5, 1])
    p = rng.dirichlet(np.ones(3), size=int((n * m).sum()))
    edges = head_mod.bin_edges(bins)
    p[:8, 0] = edges[:8]  # exact edges, the top edge too
    p[8, 0] = 1.0
    hist = sm.conv_histograms(p, n, m, edges, labels)
    cols = [c for letter, c in (("e", sl.ENT), ("c", sl.CON), ("n", sl.NEU)) if letter in labels]
    want = []
    start = 0
    for n_e, m_e in zip(n, m):
        block = p[start:start + n_e * m_e].reshape(n_e, m_e, 3)
        start += n_e * m_e
        for k in range(n_e):
            want.append(np.concatenate([np.histogram(block[k, :, c], bins=edges)[0]
                                        for c in cols]))
    np.testing.assert_array_equal(hist, np.array(want))


# ------------------------------------------------------------ batching and policies

GEN = ["The strings sound bright. They stay in tune.", "It is loud.", "",
       "The tuner clips on firmly. It holds pitch well! Cheap cable.", "Great value."]
REF = ["The strings sound bright and warm.", "", "The cable broke.",
       "The tuner holds pitch well. It clips on firmly.", "Great value for the money."]


@pytest.mark.parametrize("variant", ["zs", "conv"])
def test_batch_equals_one_by_one_and_empty_policies(variant):
    def run(gen, ref, nli, empty="skip"):
        if variant == "zs":
            return sm.summac_zs_scores(gen, ref, nli, empty=empty)
        return sm.summac_conv_scores(gen, ref, nli, even4_head(), empty=empty)

    nli = ScriptedNLI()
    together = run(GEN, REF, nli)
    assert len(nli.calls) == 1
    alone = np.array([run([g], [r], ScriptedNLI())[0] for g, r in zip(GEN, REF)])
    np.testing.assert_array_equal(together, alone)
    assert np.isnan(together[[1, 2]]).all() and np.isfinite(together[[0, 3, 4]]).all()
    zero = run(GEN, REF, ScriptedNLI(), empty="zero")
    np.testing.assert_array_equal(zero[[1, 2]], [0.0, 0.0])
    np.testing.assert_array_equal(zero[[0, 3, 4]], together[[0, 3, 4]])
    # Nothing to score at all: no scorer call, all empty.
    nli = ScriptedNLI()
    assert np.isnan(run(["", "x."], ["y.", None], nli)).all() and nli.calls == []
    assert run([], [], ScriptedNLI()).shape == (0,)
    with pytest.raises(ValueError, match="empty policy"):
        run(GEN, REF, ScriptedNLI(), empty="drop")


def test_caps_on_sentences():
    head = even4_head()
    gen10 = " ".join(f"Line {i} is fine." for i in range(10))
    ref = " ".join(f"Ref {i} is here." for i in range(100))
    nli = ScriptedNLI()
    base = sm.summac_conv_scores([gen10], [ref], nli, head)
    # an 11th generated sentence and a 101st reference sentence are ignored by Conv...
    nli2 = ScriptedNLI()
    more = sm.summac_conv_scores([gen10 + " Extra sentence."], [ref + " Late one."], nli2, head)
    assert more[0] == base[0] and nli2.calls == nli.calls == [1000]
    # ... while ZS averages over every generated sentence, still with 100 references.
    nli3 = ScriptedNLI()
    sm.summac_zs_scores([gen10 + " Extra sentence."], [ref + " Late one."], nli3)
    assert nli3.calls == [1100]


def test_nan_probability_gives_nan_example():
    p = np.array([[0.5, 0.5, 0.0], [NAN, 0.5, 0.5], [0.9, 0.1, 0.0]])
    n, m = np.array([1, 1]), np.array([2, 1])
    assert np.isnan(sm.summac_zs_batch(p, n, m)[0]) and not np.isnan(sm.summac_zs_batch(p, n, m)[1])
    conv = sm.summac_conv_batch(p, n, m, even4_head())
    assert np.isnan(conv[0]) and not np.isnan(conv[1])


def test_registry_and_head_errors(tmp_path):
    import torch

    info = get_metric("summac_conv")
    assert info.higher_is_better and info.kind == "per_example"
    state = {"mlp.weight": torch.zeros(1, 23), "mlp.bias": torch.zeros(1),
             "layer_final.weight": torch.zeros(2, 3), "layer_final.bias": torch.zeros(2)}
    torch.save(state, tmp_path / "head.bin")
    head = head_mod.load_conv_head(str(tmp_path / "head.bin"), device="auto")  # percentile, "e"
    assert head.n_features == 23 and head.device == "cpu"
    with pytest.raises(ValueError, match="bins='even50'"):
        head_mod.load_conv_head(str(tmp_path / "head.bin"), bins="even50")
    with pytest.raises(ValueError, match="nli_labels"):
        head_mod.load_conv_head(str(tmp_path / "head.bin"), nli_labels="x")
    with pytest.raises(ValueError, match="missing"):
        head_mod.SummaCConvHead.from_state_dict({"mlp.weight": torch.zeros(1, 23)})
    with pytest.raises(ValueError, match="zs_score"):
        sm.summac_zs_scores(["a."], ["b."], ScriptedNLI(), zs_score="c")


# ------------------------------------------------- equality with the summac package

NOUNS = ("product", "strings", "cable", "tuner", "pitch", "document", "query", "noise", "answer")
ADJS = ("loud", "bright", "cheap", "noisy", "firm", "warm")
VERBS = ("holds", "breaks", "makes", "clips", "decides", "sounds", "beats")
ADVS = ("well", "firmly", "after two weeks", "a lot", "yes or no")
# 12 distinct generated sentences (Conv reads the first 10) and 103 distinct reference
# sentences (both variants read the first 100).
MANY_GEN = " ".join(f"The {NOUNS[i % 9]} is {ADJS[i % 6]} and the {NOUNS[(4 * i + 1) % 9]} "
                    f"sounds {ADJS[(5 * i + 2) % 6]}." for i in range(12))
MANY_REF = " ".join(f"The {NOUNS[i % 9]} {VERBS[i % 7]} the {NOUNS[(2 * i + 3) % 9]} "
                    f"{ADVS[i % 5]}." for i in range(103))
EQ_GEN = [
    "The product is loud and the strings sound bright. It makes a lot of noise. Yes.",
    "The tuner holds pitch well and clips on firmly.",
    "The cable is cheap, noisy and broke after two weeks! Decide whether the query and "
    "the document are paraphrases. The product makes a lot of noise.",
    MANY_GEN,
    "The strings sound bright and the tuner holds pitch well. The cable is noisy.",
]
EQ_REF = [
    "The product makes a lot of noise. The strings sound bright. No.",
    "The tuner clips on firmly. It holds pitch well. Answer yes or no please.",
    "The cable is cheap and noisy. It broke after two weeks.",
    "A product aspect opinion. The document about the product. The tuner holds pitch.",
    MANY_REF,
]


@pytest.fixture(scope="module")
def nli_model(tmp_path_factory):
    """Tiny random BERT NLI in the MNLI label order (contradiction first), so both
    sides have to read the label order right."""
    pytest.importorskip("summac")
    from tests.doubles.tiny_encoders import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("summac-nli") / "nli", 3,
                           id2label={0: "contradiction", 1: "neutral", 2: "entailment"}, seed=3)


@pytest.fixture(scope="module")
def our_scorer(nli_model):
    from rexeval.models.encoders.nli import NLIScorer

    scorer = NLIScorer(str(nli_model), device="cpu")
    # float64 here and in the package (`package`): SummaC-Conv bins the probabilities, and
    # float32's batch- and thread-dependent last bits moved one across a bin edge (1 run in 4).
    scorer.model = scorer.model.double()
    return scorer


@pytest.fixture
def package(monkeypatch, nli_model):
    from rexeval.models.sentences import split_sentences
    from tests.metrics.summac_reference import patch_summac

    return patch_summac(monkeypatch, "tiny-rexeval", nli_model, entailment_idx=2,
                        contradiction_idx=0, split=split_sentences, double=True)


@pytest.mark.parametrize("zs_score", ["e-c", "e"])
def test_zs_equals_summac_package(package, our_scorer, zs_score):
    model = package.SummaCZS(model_name="tiny-rexeval", granularity="sentence", device="cpu",
                             imager_load_cache=False, use_con=zs_score == "e-c")
    want = np.array(model.score(EQ_REF, EQ_GEN)["scores"], dtype=np.float64)
    got = sm.summac_zs_scores(EQ_GEN, EQ_REF, our_scorer, zs_score=zs_score,
                              split=sm.summac_sentences)
    assert np.ptp(want) > 0.05  # the model is random but not constant
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Creating a tensor from a list")  # inside the package
@pytest.mark.parametrize("bins,labels", [("percentile", "e"), ("even20", "ecn")])
def test_conv_equals_summac_package(package, our_scorer, tmp_path, bins, labels):
    import torch

    kwargs = dict(models=["tiny-rexeval"], bins=bins, granularity="sentence",
                  nli_labels=labels, device="cpu", imager_load_cache=False)
    fresh = package.SummaCConv(**kwargs)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in fresh.parameters():
            param.normal_(0.0, 0.3)
    path = tmp_path / "conv.bin"
    torch.save(fresh.state_dict(), path)
    # the package reads the file back through its own start_file mechanism
    model = package.SummaCConv(start_file=str(path), **kwargs)
    want = np.array(model.score(EQ_REF, EQ_GEN)["scores"], dtype=np.float64)
    head = head_mod.load_conv_head(str(path), bins=bins, nli_labels=labels)
    got = sm.summac_conv_scores(EQ_GEN, EQ_REF, our_scorer, head, split=sm.summac_sentences)
    assert np.ptp(want) > 0.01
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
