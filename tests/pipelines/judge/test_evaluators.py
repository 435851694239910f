"""The pairwise evaluators' registry (pipelines/judge/evaluators/): what every registered
evaluator promises, and a new one, registered here as its own module would register it,
run by `judge pairwise` and read by `judge winrate` with no other file touched."""
import json

import pandas as pd
import pytest

from rexeval.pipelines.judge.config import PairwiseJobConfig
from rexeval.pipelines.judge.evaluators import (BUILT_IN, EVALUATORS, Evaluator, Judged, declared_evaluators,
                                                evaluator, evaluator_names, in_order)
from tests.pipelines.judge.test_jobs import SAMPLE, bench  # noqa: F401  (the module's fixture)


def test_every_registered_evaluator_keeps_the_contract():
    """Whatever their number: each is an Evaluator with a description (`--help` lists the
    same ones from the source, nothing imported), and no two write the same file."""
    names = evaluator_names()
    assert names[:len(BUILT_IN)] == list(BUILT_IN)
    assert declared_evaluators() == {n: EVALUATORS.lookup(n).description for n in names}
    files = [evaluator(n).verdicts_file for n in names]
    assert len(set(files)) == len(files) and evaluator("gen").verdicts_file == "verdicts.parquet"
    for n in names:
        assert issubclass(EVALUATORS.lookup(n), Evaluator) and EVALUATORS.lookup(n).description, n


def test_the_jobs_ask_built_ins_first_whatever_order_they_are_given():
    assert in_order(["zz", "disc", "gen", "disc", "aa"]) == ["gen", "disc", "aa", "zz"]


def test_an_unknown_evaluator_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown judge evaluator 'nope'; known: .*gen"):
        PairwiseJobConfig(explanations=[str(tmp_path)], baseline="b", evaluators=["nope"], out=str(tmp_path / "o"))


class LongerWins(Evaluator):
    """Prefers the longer explanation, by words (a planted evaluator: no model)."""

    description = "the longer explanation wins"

    def check(self, cfg) -> None:
        if cfg.seed < 0:
            raise ValueError("longer: the seed must not be negative")

    def judge(self, pairs: pd.DataFrame, run) -> Judged:
        a = pairs["explanation_a"].fillna("").str.split().str.len()
        b = pairs["explanation_b"].fillna("").str.split().str.len()
        verdict = ["A" if x > y else "B" if x < y else "C" for x, y in zip(a, b)]
        return Judged(pd.DataFrame({"pair_id": pairs["pair_id"], "verdict": verdict, "words_a": a, "words_b": b}),
                      usage={"pairs": len(pairs)})


@pytest.fixture
def longer():
    EVALUATORS.register("longer")(LongerWins)
    try:
        yield "longer"
    finally:
        EVALUATORS.pop("longer")


@pytest.mark.slow
def test_a_new_evaluator_is_run_by_pairwise_and_read_by_winrate(bench, longer, tmp_path):  # noqa: F811
    from rexeval.metrics.preference import win_rates
    from rexeval.pipelines.judge.jobs import run_pairwise
    from rexeval.pipelines.judge.winrate import read_runs
    from rexeval.pipelines.study.builtin_jobs import _evaluator_roles

    expl = pd.read_parquet(bench["explanations"])
    base = sorted(set(expl["system"]) - {"flipped"})[0]
    kwargs = dict(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=3, baseline=base,
                  evaluators=[longer], out=str(tmp_path / "pw"))
    with pytest.raises(ValueError, match="seed must not be negative"):
        PairwiseJobConfig(seed=-1, **kwargs)
    cfg = PairwiseJobConfig(**kwargs)
    assert _evaluator_roles(cfg) == []  # it serves no LLM: a study starts none for it
    seen = []
    rep = run_pairwise(cfg, progress=seen.append)
    assert not any("Serve" in m for m in seen)  # no LLM judge started
    out = tmp_path / "pw"
    assert not (out / "verdicts.parquet").exists()
    v = pd.read_parquet(out / "verdicts_longer.parquet")
    assert list(v.columns[:7]) == ["pair_id", "system", "baseline", "example_id", "user_id", "item_id", "verdict"]
    words = expl.set_index(["system", "example_id"])["explanation"].str.split().str.len()
    for r in v.itertuples(index=False):
        mine, theirs = words[(r.system, r.example_id)], words[(base, r.example_id)]
        assert (r.words_a, r.words_b) == (mine, theirs)
        assert r.verdict == ("A" if mine > theirs else "B" if mine < theirs else "C")
    assert rep["win_rates_longer"] == win_rates(v).to_dict("records") and rep["usage_longer"] == {"pairs": len(v)}
    assert rep["win_rates"] == [] and json.loads((out / "report.json").read_text())["evaluators"] == ["longer"]
    assert f"Win rates against the baseline `{base}` by the evaluator `longer`" in (out / "pairwise.md").read_text()
    long, inputs = read_runs([str(out)])
    assert set(long["judge"]) == {"longer"} and inputs[0]["files"] == {"verdicts_longer.parquet":
                                                                       {"judge": "longer", "pairs": len(v)}}
