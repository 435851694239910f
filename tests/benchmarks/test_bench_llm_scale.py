"""benchmarks/bench_llm_scale.py (issue 46, item 4): the simulated engine's answers and
timing without Ray, and the whole benchmark with --tiny (both designs, both sizes) on
the CPU, so the scale benchmark cannot rot."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.sim_engine import (REPAIR_MARK, EngineModel, SimEngine, answer_for, candidates_answer,
                                   verified_answer)
from rexeval.pipelines.extract.outputs import CANDIDATES, parse_output
from rexeval.prompts import load_prompt

REPO = Path(__file__).resolve().parents[2]
BASELINE = "74945fb"


def _candidates_request(review: str) -> list[dict]:
    return load_prompt("star_candidates").render(review=review)


def test_answers_parse_as_the_job_parses_them_and_a_planted_share_needs_a_repair():
    bad = 0
    for i in range(1000):
        messages = _candidates_request(f"Review {i}: the strings buzz and the case is sturdy.")
        text, malformed = answer_for(messages, 0.10)
        parsed = parse_output(text, CANDIDATES)
        assert parsed.ok != malformed, text
        if malformed:
            bad += 1
            assert parsed.error_type == "truncated_json"
            repair = messages + [{"role": "assistant", "content": text},
                                 {"role": "user", "content": f"{REPAIR_MARK}: cut off."}]
            again, still = answer_for(repair, 0.10)
            assert not still and parse_output(again, CANDIDATES).ok
            assert again == candidates_answer(messages[-1]["content"])
    assert 70 <= bad <= 130  # the planted 10%


def test_the_verifier_keeps_most_candidates_and_answers_in_the_candidates_shape():
    cands = candidates_answer("a review")
    from rexeval.pipelines.extract.structured import items_json

    shown = json.loads(cands)["statements"]
    messages = load_prompt("star_verify").render(candidates_json=items_json(shown, "statements"))
    text, _ = answer_for(messages, 0.0)
    parsed = parse_output(text, CANDIDATES)
    assert parsed.ok and 1 <= len(parsed.items) <= len(shown)
    assert text == verified_answer(messages[-1]["content"])
    assert 3 <= len(shown) <= 7 and 60 <= EngineModel().tokens(cands) <= 260  # realistic lengths


@pytest.mark.slow
def test_the_engine_batches_continuously_at_its_modelled_speed():
    """Without Ray: 256 requests through one engine of 64 slots take about their ideal
    (work at a full batch), and never more than 64 sequences run at once."""
    model = EngineModel(load_s=0, max_num_seqs=64, step_base_s=0.004, step_decode_s=0.0001,
                        step_prefill_s=0.00002)
    engine = SimEngine(vars(model))

    async def run():
        engine.loaded, engine.wake = asyncio.Event(), asyncio.Event()
        engine.loaded.set()
        engine.loop_task = asyncio.get_running_loop().create_task(engine._run())
        reqs = [{"messages": _candidates_request(f"review {i} " * 30)} for i in range(256)]
        t0 = time.perf_counter()
        out = await asyncio.gather(*(engine.generate(reqs[i:i + 16]) for i in range(0, 256, 16)))
        wall = time.perf_counter() - t0
        engine.loop_task.cancel()
        return [r for part in out for r in part], wall

    results, wall = asyncio.run(run())
    t = engine.totals
    assert len(results) == 256 and t["requests"] == 256 and t["largest_batch"] == 64
    assert sum(r["completion_tokens"] for r in results) == t["completion_tokens"]
    # Prefix caching: the prompt's instructions and examples are prefilled once.
    assert t["prefill_tokens"] < t["prompt_tokens"] / 3
    assert t["work_s"] <= t["busy_s"] <= wall * 1.05
    assert wall < t["work_s"] * 1.6, (wall, t)
    assert model.tokens_per_s_full_batch == pytest.approx(64 / (0.004 + 0.0064))


def _has_baseline() -> bool:
    return subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{BASELINE}^{{commit}}"],
                          capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _has_baseline(), reason=f"the pass design's commit {BASELINE} is not in this clone")
def test_tiny_run_reports_both_designs_with_the_issue_keys(tmp_path):
    out = tmp_path / "llm_scale.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "benchmarks/bench_llm_scale.py", "--tiny", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["command"].startswith("python benchmarks/bench_llm_scale.py --tiny")
    for key in ("efficiency", "engine_starts", "driver_rss_ratio_10x", "passes_design", "engine_model", "stream"):
        assert key in res, key
    assert 0 < res["efficiency"] <= 1.5
    assert res["engine_starts"] == {"sim-llama-8b": 1}
    assert 0 < res["driver_rss_ratio_10x"] < 3
    old = res["passes_design"]
    assert 0 < old["efficiency"] <= 1.5 and old["engine_starts"]["sim-llama-8b"] > 1
    # --tiny runs the pass design at the smaller size only (its run is fixed costs).
    assert res["passes_sizes"] == res["sizes"][:1]
    for arm, sizes in ((res["stream"], res["sizes"]), (old, res["passes_sizes"])):
        for n in map(str, sizes):
            run = arm[n]
            # Every review went through both turns (repairs as planted) and came out.
            assert run["reviews_out"] == int(n) and run["errors"] == 0
            assert run["calls"] == run["engine_requests"] and run["repairs"] == run["planted_malformed"] > 0
    # The two designs sent the same requests: the engines did the same work.
    both = str(res["passes_sizes"][-1])
    assert res["stream"][both]["completion_tokens"] == old[both]["completion_tokens"]
    print(f"--tiny took {seconds:.0f} s")
