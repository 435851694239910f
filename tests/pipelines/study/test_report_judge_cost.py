"""The study report's judge sections: with a reward model in the run, one cost table
(LLM judge by tokens, reward model by GPU-hours, seed 004 Table 3) read from report.json,
shown once; without one, the sections are as before."""
import json

import pandas as pd

from rexeval.pipelines.judge.cost import COST_COLUMNS, cost_markdown
from rexeval.pipelines.judge.evaluators import pairwise_markdown
from rexeval.pipelines.study.report_model import Builder, Instance
from rexeval.pipelines.study.report_sections import section_pairwise

WINS = pd.DataFrame([{"system": "sys", "n": 4, "win_rate": 0.5, "tie_rate": 0.25, "loss_rate": 0.25,
                      "win_rate_half_ties": 0.625, "unreadable": 0}])
LLM = {"model": "judge-m", "calls": 8, "cached_calls": 0, "prompt_tokens": 1000, "completion_tokens": 250,
       "seconds": 12.5, "unparseable": 0, "cost_usd": 0.002}
DISC = {"kind": "GPU-hours", "model": "reward-armo", "pairs": 4, "scored": 8, "seconds": 5400.0,
        "devices": ["cuda:0", "cuda:1"], "gpus": 2, "gpu_hours": 3.0, "gpu_hour_price": 2.5, "cost_usd": 7.5}


def _plant(folder, report, with_disc):
    folder.mkdir()
    md = [pairwise_markdown(WINS, {}, "base", judge="LLM judge `judge-m`")]
    if with_disc:
        md += [pairwise_markdown(WINS, {}, "base", judge="reward model `reward-armo`"), cost_markdown(report)]
    (folder / "pairwise.md").write_text("\n".join(md))
    (folder / "report.json").write_text(json.dumps(report))
    return Instance(name="pw", step="pairwise", job="judge_pairwise", dataset=None, out=folder, status="complete",
                    reason=None, fingerprint=None, settings={}, seconds=1.0, finished=None, summary=None)


def test_cost_table_once_beside_the_llm_usage(tmp_path):
    report = {"job": "judge pairwise", "pairs": 4, "errors": 0, "usage": LLM, "usage_disc": DISC}
    inst = _plant(tmp_path / "pw", report, with_disc=True)
    sec = section_pairwise(Builder(tmp_path, [inst]), inst)
    titles = [t.title for t in sec.tables]
    cost = [t for t in sec.tables if t.columns == COST_COLUMNS]
    assert len(cost) == 1 and "tokens vs GPU-hours" in cost[0].title
    assert cost[0].rows == [["LLM judge judge-m", "tokens", "8 calls", "1250", "12.5", "–", "0.0020 USD"],
                            ["reward model reward-armo", "GPU-hours", "4 pairs", "–", "5400", "3", "7.5000 USD"]]
    assert "Table 3" in cost[0].note
    # the two win-rate tables of pairwise.md, numbered without the cost table
    assert "Pairwise win rates (pw) (1/2)" in titles and "Pairwise win rates (pw) (2/2)" in titles
    assert "LLM usage (pw)" in titles


def test_without_a_reward_model_the_section_is_unchanged(tmp_path):
    report = {"job": "judge pairwise", "pairs": 4, "errors": 0, "usage": LLM}
    inst = _plant(tmp_path / "pw", report, with_disc=False)
    sec = section_pairwise(Builder(tmp_path, [inst]), inst)
    assert not any(t.columns == COST_COLUMNS for t in sec.tables)
    assert [t.title for t in sec.tables] == ["Pairwise win rates (pw)", "Counts: pw", "LLM usage (pw)"]
