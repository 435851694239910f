"""`rexeval demo`: the whole platform, offline, on the sample shipped with the project.

The demo is a study, `studies/demo.yaml` (one way to chain steps, not two): ingest (the
sample plus a file of deliberately broken rows) -> temporal split -> Table II -> triplet
and STAR extraction with the local LLM on part of the sample -> ground truth ->
paraphrase clusters and the EXTRA baseline (Table 3) -> the STAR ranking benchmark on the
sample's hand-written statements with the baselines and a short ExpGCN (Tables 6 and 1)
-> a small PETER trained and decoded -> seed 000's metrics on PETER, the ground truth and
a sentiment-flipped copy (Tables III-VI) -> the Likert and pairwise judges -> seed 004's
win-rate study in small (Figure 5). This command sets the study's vars from its flags,
runs it (resuming what an earlier run finished), writes the study report, and prints a
short summary: the headline results and where the report is.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import click

from rexeval.pipelines.core.io import remove_entries
from rexeval.storage import location
from rexeval.pipelines.study.config import load_study
from rexeval.pipelines.study.plan import STATE_FILE, build_plan
from rexeval.pipelines.study.report import build_report, write_report
from rexeval.pipelines.study.runner import hard_failures, run_study
from rexeval.ray_jobs.common import summary, user_errors

DEMO_STUDY = Path(__file__).resolve().parents[1] / "studies" / "demo.yaml"

NOTES = [
    "SmolLM2-135M exercises the LLM steps (extraction, St2Exp, the judges, seed 004's generators); its "
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


def _start_over(out: Path, plan) -> list[str]:
    """--overwrite: remove what an earlier demo wrote in `out` (its state file, logs,
    report and step folders) and nothing else; the names of what stays. A folder that
    holds files but no demo state is refused."""
    if not out.exists():
        return []
    state = out / STATE_FILE
    try:
        found = location(state).read_json() if state.is_file() else None
    except ValueError:  # not JSON, not text: not a state the demo wrote
        found = None
    name = found.get("name") if isinstance(found, dict) else None
    if name != "demo" and any(out.iterdir()):
        raise FileExistsError(f"{out} is not a demo output folder (no study.json of the demo): not removing it")
    root = location(out)
    own = {STATE_FILE, "logs", "report", *(location(i.out).relative_to(root).split("/", 1)[0]
                                           for i in plan.instances.values())}
    return remove_entries(root, own)


def headline(plan, root: Path) -> list[str]:
    """The demo's result in a screen: seed 000's headline metrics per system, then what
    the judges said (the full tables are in the report)."""
    import pandas as pd

    from rexeval.pipelines.evaluate.report import headline_markdown

    lines: list[str] = []
    evaluate = root / "sample" / "evaluate" / "aggregates.parquet"
    if evaluate.is_file():
        agg = pd.read_parquet(evaluate)
        n = int(agg.loc[agg["kind"] == "per_example", "n"].max()) if (agg["kind"] == "per_example").any() else 0
        lines += ["", f"Seed 000's metrics on the demo's systems (evaluate@sample, means over up to {n} examples "
                  "each; ↑ higher is better):", "", *headline_markdown(agg).splitlines()]
    likert = root / "sample" / "likert" / "likert_scores.parquet"
    if likert.is_file():
        scores = pd.read_parquet(likert)
        means = scores.groupby("system")["score"].mean().dropna()
        lines += ["", "Likert judge (seed 001; 1-5, mean of the four aspects): "
                  + ", ".join(f"{s} {v:.2f}" for s, v in means.items())]
    for step in ("pairwise", "seed004_pairwise"):
        rep = root / "sample" / step / "report.json"
        if rep.is_file():
            data = json.loads(rep.read_text())
            wins = ", ".join(f"{w['system']} {w['win_rate']:.0%} of {w['n']}" for w in data.get("win_rates", []))
            base = plan.instances[f"{step}@sample"].settings.get("baseline")
            lines.append(f"Pairwise judge (seed 004) against {base}: {wins or 'no pair judged'}")
    return lines


@click.command("demo")
@click.option("--out", "-o", default="runs/demo", show_default=True, help="Output folder.")
@click.option("--overwrite", is_flag=True, help="Start over instead of resuming.")
@click.option("--extract-reviews", default=4, show_default=True, type=int,
              help="Reviews sent to the local LLM (0 skips the LLM steps; SmolLM2 on a CPU "
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
@click.option("--verbose", "-v", is_flag=True,
              help="Print every job's progress lines and Ray's own output too (they are always in "
                   "OUT/logs/<step>.log).")
@user_errors
def demo_cmd(out, overwrite, extract_reviews, evaluate_examples, nli, judge_examples, verbose):
    """Run the demo study (studies/demo.yaml) on the embedded review sample, offline.

    The same as `rexeval study run studies/demo.yaml` with the vars these flags set,
    followed by `rexeval study report` (OUT/report/index.html). The terminal shows each
    step as it starts and ends, then the headline results and where the report is;
    every job's own lines are in OUT/logs/.

    Example: rexeval demo --out runs/demo
    """
    started = time.time()
    root = Path(out)
    llm = extract_reviews > 0
    sets = {"llm": llm, "extract_reviews": max(1, extract_reviews), "evaluate_examples": evaluate_examples,
            "judge_examples": judge_examples, "nli": nli, "evaluate_skip": [] if llm else ["st2exp"]}
    plan = build_plan(load_study(DEMO_STUDY, sets), DEMO_STUDY, root)
    if overwrite:
        kept = _start_over(root, plan)
        if kept:
            click.echo(f"--overwrite left what is not the demo's as it is: {', '.join(kept)}")
    click.echo(f"rexeval demo: {DEMO_STUDY.name} on the embedded sample -> {root} (each step's log in "
               f"{root / 'logs'}{'' if verbose else '; --verbose prints them here'})")
    res = run_study(plan, progress=click.echo, job_lines=click.echo if verbose else (lambda _: None),
                    verbose=verbose, show_plan=verbose)
    report = build_report(root)
    paths = write_report(report, root / "report")
    for line in headline(plan, root):
        click.echo(line)
    notes = list(NOTES)
    if not nli:
        notes.append("NLI metrics were skipped: no PyPI package ships an NLI model; pass --nli "
                     "/path/to/nli-checkpoint (e.g. deberta-large-mnli) to compute them")
    hard = hard_failures(plan, res)
    notes += [f"{k} failed{'' if k in hard else ' (optional)'}: {why}" for k, why in res["failed"].items()]
    notes += [f"{k} skipped: {why}" for k, why in res["skipped"].items()]
    html = paths["html"].resolve()
    summary("demo", {"step instances": len(plan.order), "ran": len(res["ran"]),
                     "already complete": len(res["done"]), "off": len(plan.off), "failed": len(res["failed"])},
            started, {"report": str(html), "open it": f"in a browser, file://{html} (or: xdg-open {html})",
                      "markdown": str(paths["md"].resolve()), "state": str(root / STATE_FILE),
                      "logs": str(root / "logs")}, notes)
    if hard:
        raise SystemExit(1)


def main():  # python -m rexeval.ray_jobs.demo
    demo_cmd()


if __name__ == "__main__":
    main()
