"""The judge jobs end to end on Ray, with the scripted LLM behind the judge Serve
deployment the job starts: inputs, contexts, resume, usage and cost, outputs."""
import json
from pathlib import Path

import pandas as pd
import pytest

from tests.doubles.llm import ScriptedLLM

from rexeval.pipelines.judge.jobs import run_likert, run_pairwise
from rexeval.pipelines.judge.config import LikertJobConfig, PairwiseJobConfig

SAMPLE = Path(__file__).resolve().parents[3] / "pipelines" / "sample"
SCRIPTED = "tests.doubles.llm:ScriptedLLM"
LIKERT = "persuasiveness: 4\ntransparency: 3\naccuracy: 5\nsatisfaction: 2"


@pytest.fixture(scope="module")
def bench(tmp_path_factory, ray_session):
    """The demo's two systems (ground truth and a sentiment-flipped copy) and the
    ingested sample reviews the contexts are built from."""
    from rexeval.pipelines.evaluate.inputs import write_flip_benchmark
    from rexeval.pipelines.ingest.pipeline import run_ingest
    from rexeval.pipelines.ingest.config import IngestConfig
    from rexeval.pipelines.core.inputs import statements_from_annotations

    root = tmp_path_factory.mktemp("judge_bench")
    paths = write_flip_benchmark(statements_from_annotations(SAMPLE / "statements.jsonl", stage="triplet"),
                                 root / "inputs")
    run_ingest(IngestConfig(inputs=[str(SAMPLE / "reviews.jsonl")], meta=[str(SAMPLE / "items.jsonl")],
                            out=str(root / "ingest")), progress=lambda m: None)
    return {"explanations": paths["explanations"], "reviews": str(root / "ingest"), "root": root}


def _scripted(log, **options):
    return dict(backend=SCRIPTED, models={"judge_llm": "scripted-judge"}, use_cache=False,
                backend_options={"log": str(log), **options})


def _calls(log) -> int:
    return sum(1 for _ in open(log)) if Path(log).exists() else 0


@pytest.mark.slow
def test_likert_job_through_serve_with_prices_and_resume(bench, tmp_path):
    log = tmp_path / "calls.jsonl"
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: USD\nmodels:\n  scripted-judge: {prompt: 1.0, completion: 2.0}\n")
    cfg = LikertJobConfig(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=3,
                          out=str(tmp_path / "likert"), price_table=str(prices), chunk_size=2,
                          serve_port=8711, **_scripted(log, default=LIKERT))
    seen = []
    rep = run_likert(cfg, progress=seen.append)
    scores = pd.read_parquet(tmp_path / "likert" / "likert_scores.parquet")
    assert len(scores) == 6 * 4 and scores["score"].notna().all()
    assert set(scores["system"]) == {"ground_truth", "flipped"} or len(set(scores["system"])) == 2
    assert scores.groupby("aspect")["score"].first().to_dict() == {
        "persuasiveness": 4, "transparency": 3, "accuracy": 5, "satisfaction": 2}
    usage = rep["usage"]["scripted-judge"]
    # multi-aspect: one call per explanation; the scripted LLM counts 100 prompt tokens per call
    assert usage["calls"] == 6 and usage["prompt_tokens"] == 600
    completion = usage["completion_tokens"]
    assert usage["cost_usd"] == pytest.approx((600 * 1.0 + completion * 2.0) / 1e6)
    assert any("starting the Serve deployment" in m for m in seen)
    assert any("stopped the Serve application" in m for m in seen)
    # The judge saw the item's title from the ingested metadata, fenced as data.
    first = json.loads(open(log).readline())
    assert first["answer"].startswith("persuasiveness")
    assert _calls(log) == 6
    report = json.loads((tmp_path / "likert" / "report.json").read_text())
    assert report["no_context"] == 0 and report["unreadable"] == 0
    # Re-running resumes: no new calls, same scores.
    rep2 = run_likert(cfg, progress=lambda m: None)
    assert _calls(log) == 6
    pd.testing.assert_frame_equal(scores, pd.read_parquet(tmp_path / "likert" / "likert_scores.parquet"))
    assert rep2["usage"]["scripted-judge"]["calls"] == 6


@pytest.mark.slow
def test_pairwise_job_win_rates_position_bias_and_errors(bench, tmp_path):
    # A judge biased to the first slot: every pair's two orders disagree -> ties.
    cfg = PairwiseJobConfig(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=2,
                            baseline="ground_truth" if _has(bench, "ground_truth") else _first(bench),
                            divide=False, out=str(tmp_path / "pairwise"), serve_port=8712,
                            **_scripted(tmp_path / "calls.jsonl", default="The first is better.\n[[A]]"))
    rep = run_pairwise(cfg, progress=lambda m: None)
    wins = pd.DataFrame(rep["win_rates"])
    assert len(wins) == 1 and wins["n"].iloc[0] == 2 and wins["tie_rate"].iloc[0] == 1.0
    assert rep["position_bias"]["all"]["flip_rate"] == 1.0
    assert rep["position_bias"]["all"]["first_slot_rate"] == 1.0
    assert rep["usage"]["calls"] == 4
    md = (tmp_path / "pairwise" / "pairwise.md").read_text()
    assert "Position bias" in md and "100.0%" in md
    calls = pd.read_parquet(tmp_path / "pairwise" / "calls.parquet")
    assert len(calls) == 4 and set(calls["order"]) == {"ab", "ba"}


def _has(bench, system):
    return system in set(pd.read_parquet(bench["explanations"])["system"])


def _first(bench):
    return sorted(set(pd.read_parquet(bench["explanations"])["system"]) - {"flipped"})[0]


@pytest.mark.slow
def test_pairwise_rows_without_a_baseline_end_as_error_rows(bench, tmp_path):
    expl = pd.read_parquet(bench["explanations"])
    base = _first(bench)
    keep = expl[(expl["system"] != base) | (expl["example_id"] != expl["example_id"].iloc[0])]
    path = tmp_path / "expl.parquet"
    keep.to_parquet(path)
    cfg = PairwiseJobConfig(explanations=[str(path)], baseline=base, limit=2, divide=False, both_orders=False,
                            judge_service="none", out=str(tmp_path / "pw"),
                            **_scripted(tmp_path / "c.jsonl", default="[[B]]"))
    rep = run_pairwise(cfg, progress=lambda m: None)
    errors = pd.read_parquet(tmp_path / "pw" / "errors.parquet")
    assert rep["errors"] == len(errors) >= 1
    assert (errors["error_type"] == "no_baseline").all() and errors["message"].str.contains(base).all()
    assert rep["no_context"] == rep["pairs"] + rep["errors"] or rep["no_context"] >= rep["pairs"]


def _block(text: str, label: str) -> str:
    start = text.index(f"<<<{label}\n") + len(label) + 4
    return text[start:text.index(f"\n{label}>>>", start)]


class FairLLM(ScriptedLLM):
    """A scripted generator and a content-aware scripted judge for the detection test.

    Generating, it writes an explanation that names the first words of the history and
    the item it was given, and any flawed style rule it was told to follow. Judging, it
    prefers the explanation that fits the history and item in front of it and follows
    no flawed rule (a tie when both score the same)."""

    FLAWS = ("Pile on the jargon", "Dwell on trivia", "Get the facts wrong", "Dwell on what goes wrong")

    def _answer(self, req):
        system, user = req.messages[0]["content"], req.messages[-1]["content"]
        if "You rank recommendation explanations" in system:
            hist, item = _block(user, "HISTORY")[:25], _block(user, "ITEM")[:25]

            def score(e):
                return (hist in e) + (item in e) + (not any(f in e for f in self.FLAWS))

            a, b = score(_block(user, "EXPLANATION_A")), score(_block(user, "EXPLANATION_B"))
            return "Reasoning done.\n" + ("[[A]]" if a > b else "[[B]]" if b > a else "[[C]]")
        hist = _block(user, "HISTORY")[:25] if "<<<HISTORY" in user else "nothing"
        flaw = next((f for f in self.FLAWS if f in system), "plain words")
        return f"You liked {hist} so you will enjoy {_block(user, 'ITEM')[:25]} written with {flaw} here."


@pytest.mark.slow
def test_detect_job_generates_every_condition_and_scores_a_fair_judge(bench, tmp_path):
    from rexeval.pipelines.judge.jobs import run_detect
    from rexeval.pipelines.judge.config import DetectJobConfig

    cfg = DetectJobConfig(reviews=[bench["reviews"]], limit=4, out=str(tmp_path / "detect"), chunk_size=8,
                          divide=False, judge_service="none", backend="tests.pipelines.judge.test_jobs:FairLLM",
                          models={"judge_llm": "fair-judge", "llm": "fair-writer"}, use_cache=False)
    rep = run_detect(cfg, progress=lambda m: None)
    pairs = pd.read_parquet(tmp_path / "detect" / "pairs.parquet")
    errors = pd.read_parquet(tmp_path / "detect" / "errors.parquet")
    # Every interaction x condition ends as a pair or an error row.
    assert len(pairs) + len(errors) == 4 * 7 == rep["pairs"] + rep["generation_errors"]
    assert set(pairs["condition"]) >= {"item_replace", "user_replace", "jargon", "minor_benefits",
                                       "misinformation", "bad_experience"}
    acc = pd.DataFrame(rep["accuracy"]["gen"]).set_index("condition")
    # The fair judge catches every flaw it can see: all conditions at 1.0.
    assert (acc.drop(index="AVG")["accuracy"] == 1.0).all()
    # The good explanation sat in slot A for some pairs and B for others.
    v = pd.read_parquet(tmp_path / "detect" / "verdicts_gen.parquet")
    assert set(v["original_position"]) == {"A", "B"}
    assert "random = 0.5" in (tmp_path / "detect" / "detection.md").read_text()


@pytest.mark.slow
def test_pairwise_job_with_the_reward_model_only(bench, tmp_path):
    from tests.doubles.tiny_encoders import build_tiny_bert

    from rexeval.metrics.preference import win_rates
    from rexeval.pipelines.judge.disc import verdict_from_scores

    reward = build_tiny_bert(tmp_path / "reward", 1)
    log = tmp_path / "calls.jsonl"
    base = _first(bench)
    kwargs = dict(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=3, baseline=base,
                  out=str(tmp_path / "pw"), **_scripted(log, default="[[A]]"))
    with pytest.raises(ValueError, match="--reward-model"):
        run_pairwise(PairwiseJobConfig(evaluators=["disc"], **kwargs), progress=lambda m: None)
    seen = []
    rep = run_pairwise(PairwiseJobConfig(evaluators=["disc"], reward_model=str(reward), **kwargs),
                       progress=seen.append)
    # no LLM judge was started or asked
    assert _calls(log) == 0 and not any("Serve" in m for m in seen)
    assert not (tmp_path / "pw" / "verdicts.parquet").exists()
    v = pd.read_parquet(tmp_path / "pw" / "verdicts_disc.parquet")
    criteria = ["reasoning", "clear_language", "engaging_narrative", "neutral_tone"]
    assert list(v.columns[:11]) == ["pair_id", "system", "baseline", "example_id", "user_id", "item_id", "verdict"] + [
        f"verdict_{c}" for c in criteria]
    assert len(v) == rep["pairs"] == 3 and (v["baseline"] == base).all()
    for c in criteria:
        assert v[f"verdict_{c}"].tolist() == [verdict_from_scores(a, b) for a, b in
                                              zip(v[f"score_a_{c}"], v[f"score_b_{c}"])]
    assert rep["evaluators"] == ["disc"] and rep["win_rates"] == [] and rep["reward_model"] == str(reward)
    assert rep["win_rates_disc"] == win_rates(v).to_dict("records")
    assert set(rep["win_rates_per_criterion_disc"]) == set(criteria)
    assert "reward model" in (tmp_path / "pw" / "pairwise.md").read_text()


@pytest.mark.slow
def test_pairwise_disc_job_reports_seconds_gpus_and_cost(bench, tmp_path, monkeypatch):
    """A scripted reward model on two GPUs and a scripted clock: report.json carries the
    scoring's seconds, GPUs, GPU-hours and cost; pairwise.md the cost table."""
    import numpy as np

    import rexeval.models.encoders.reward as reward
    import rexeval.pipelines.judge.disc as disc

    class TwoGpuScorer:
        devices = ["cuda:0", "cuda:1"]

        def score(self, pairs, batch_size=None):
            return np.array([len(r) for _, r in pairs], dtype=np.float32)

    times = iter([1000.0, 6400.0])  # the scoring starts at 1000 s and ends at 6400 s: 5400 s
    monkeypatch.setattr(reward, "build_reward_scorer", lambda ref, **kw: TwoGpuScorer())
    monkeypatch.setattr(disc, "perf_counter", lambda: next(times))
    prices = tmp_path / "prices.yaml"
    prices.write_text('currency: USD\nmodels:\n  "scripted-*": {gpu_hour: 2.50}\n')
    seen = []
    rep = run_pairwise(PairwiseJobConfig(explanations=[bench["explanations"]], reviews=[bench["reviews"]], limit=2,
                                         baseline=_first(bench), evaluators=["disc"], reward_model="scripted-reward",
                                         price_table=str(prices), out=str(tmp_path / "pw"),
                                         **_scripted(tmp_path / "calls.jsonl")), progress=seen.append)
    u = json.loads((tmp_path / "pw" / "report.json").read_text())["usage_disc"]
    # 5400 s x 2 GPUs / 3600 = 3 GPU-hours; x 2.50 per GPU-hour = 7.50
    assert (u["seconds"], u["devices"], u["gpus"]) == (5400.0, ["cuda:0", "cuda:1"], 2)
    assert u["gpu_hours"] == pytest.approx(3.0) and u["cost_usd"] == pytest.approx(7.5)
    assert u["model"] == "scripted-reward" and u["pairs"] == rep["pairs"] == 2
    assert rep["usage_disc"] == u
    md = (tmp_path / "pw" / "pairwise.md").read_text()
    assert "| reward model `scripted-reward` | GPU-hours | 2 pairs | – | 5400 | 3 | 7.5000 USD |" in md
    assert "Table 3" in md
    assert any("2 GPU(s) = 3 GPU-hours, cost 7.5000 USD" in m for m in seen)
