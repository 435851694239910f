"""`rexeval demo`: the whole platform, offline, on the sample shipped with the project.

The demo is a study, `studies/demo.yaml` (one way to chain stages, not two): ingest (the
sample plus a file of deliberately broken rows) -> temporal split -> Table II -> triplet
and STAR extraction with the local LLM on part of the sample -> ground truth ->
paraphrase clusters and the EXTRA baseline (Table 3) -> the STAR ranking benchmark on the
sample's hand-written statements with the baselines and a short ExpGCN (Tables 6 and 1)
-> a small PETER trained and decoded -> seed 000's metrics on PETER, the ground truth and
a sentiment-flipped copy (Tables III-VI) -> the Likert and pairwise judges -> seed 004's
win-rate study in small (Figure 5). This command sets the study's vars from its flags,
runs it (resuming what an earlier run finished), writes the study report and prints it.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import click

from rexeval.pipelines.study.config import load_study
from rexeval.pipelines.study.plan import STATE_FILE, build_plan
from rexeval.pipelines.study.report import build_report, render_markdown, write_report
from rexeval.pipelines.study.runner import hard_failures, run_study
from rexeval.ray_jobs.common import summary, user_errors

DEMO_STUDY = Path(__file__).resolve().parents[1] / "studies" / "demo.yaml"

NOTES = [
    "SmolLM2-135M exercises the LLM stages (extraction, St2Exp, the judges, seed 004's generators); its "
    "statements, ratings, verdicts and explanations are not of paper quality (give real models with "
    "`models:` in a study, or --model to the commands)",
    "clustering is bi-encoder only: the local profile has no cross-encoder "
    "(pass --model cross_encoder=/path to `rexeval cluster` for seed 002's filter)",
    "ranking uses the sample's hand-written statements (pipelines/sample/statements.jsonl); the ExpGCN run "
    "is a short one, not the seed's 500 epochs",
    "PETER here is small (64 dimensions) and trained for a few epochs on ~240 reviews: it exercises training "
    "and decoding, its explanations are not of paper quality",
    "the win-rate chart is drawn from SmolLM2-135M's writing and verdicts: it shows the study's plumbing, "
    "not which generator is better",
]


def _start_over(out: Path) -> None:
    """--overwrite: remove an earlier demo folder (and nothing that is not one)."""
    if not out.exists():
        return
    state = out / STATE_FILE
    name = json.loads(state.read_text()).get("name") if state.is_file() else None
    if name != "demo" and any(out.iterdir()):
        raise FileExistsError(f"{out} is not a demo output folder (no study.json of the demo): not removing it")
    shutil.rmtree(out)


@click.command("demo")
@click.option("--out", "-o", default="runs/demo", show_default=True, help="Output folder.")
@click.option("--overwrite", is_flag=True, help="Start over instead of resuming.")
@click.option("--extract-reviews", default=4, show_default=True, type=int,
              help="Reviews sent to the local LLM (0 skips the LLM stages; SmolLM2 on a CPU "
                   "answers in tens of seconds per batch).")
@click.option("--evaluate-examples", default=24, show_default=True, type=int,
              help="Examples per system in the evaluation step (St2Exp asks the local LLM about "
                   "each of their statements).")
@click.option("--nli", metavar="PATH",
              help="A 3-way NLI checkpoint for the evaluation step (StEnt, StCoh, SummaC); the local "
                   "profile has none, so those metrics are skipped without it.")
@click.option("--judge-examples", default=2, show_default=True, type=int,
              help="Examples per system the Likert and pairwise judges rate, and users in the seed 004 "
                   "step (each costs the local LLM a few seconds per call).")
@user_errors
def demo_cmd(out, overwrite, extract_reviews, evaluate_examples, nli, judge_examples):
    """Run the demo study (studies/demo.yaml) on the embedded review sample, offline.

    The same as `rexeval study run studies/demo.yaml` with the vars these flags set,
    followed by `rexeval study report` (OUT/report/index.html), whose tables are printed.

    Example: rexeval demo --out runs/demo
    """
    started = time.time()
    root = Path(out)
    if overwrite:
        _start_over(root)
    llm = extract_reviews > 0
    sets = {"llm": llm, "extract_reviews": max(1, extract_reviews), "evaluate_examples": evaluate_examples,
            "judge_examples": judge_examples, "nli": nli, "evaluate_skip": [] if llm else ["st2exp"]}
    plan = build_plan(load_study(DEMO_STUDY, sets), DEMO_STUDY, root)
    res = run_study(plan, progress=click.echo)
    report = build_report(root)
    paths = write_report(report, root / "report")
    click.echo("")
    click.echo(render_markdown(report))
    notes = list(NOTES)
    if not nli:
        notes.append("NLI metrics were skipped: no PyPI package ships an NLI model; pass --nli "
                     "/path/to/nli-checkpoint (e.g. deberta-large-mnli) to compute them")
    hard = hard_failures(plan, res)
    notes += [f"{k} failed{'' if k in hard else ' (optional)'}: {why}" for k, why in res["failed"].items()]
    notes += [f"{k} skipped: {why}" for k, why in res["skipped"].items()]
    summary("demo", {"stage instances": len(plan.order), "ran": len(res["ran"]),
                     "already complete": len(res["done"]), "off": len(plan.off), "failed": len(res["failed"])},
            started, {"study state": str(root / STATE_FILE), "report": str(paths["html"])}, notes)
    if hard:
        raise SystemExit(1)


def main():  # python -m rexeval.ray_jobs.demo
    demo_cmd()


if __name__ == "__main__":
    main()
