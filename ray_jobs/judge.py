"""`rexeval judge likert|pairwise|detect|winrate`: LLM judges of explanations (python -m ray_jobs.judge)."""
from __future__ import annotations

import click

from rexeval.pipelines.judge.jobs import run_detect, run_likert, run_pairwise
from rexeval.pipelines.judge.config import DetectJobConfig, LikertJobConfig, PairwiseJobConfig
from rexeval.pipelines.judge.cost import reward_line
from rexeval.pipelines.judge.winrate import WinrateConfig
from rexeval.ray_jobs.common import (Where, columns_option, config_option, defaults_from, llm_options, run_job,
                                     user_errors)


def _judge_options(fn):
    """Context, service, cost and chunk flags every judge command shares."""
    options = [
        click.option("--out", "-o", help="Output folder (a local path or a URI such as s3://bucket/run)."),
        click.option("--contexts", type=Where(exists=True, dir_okay=False),
                     help="File (Parquet, CSV, TSV or JSON lines, gzipped or not; --columns maps your "
                          "column names) of user_id, item_id, user_profile, item_description: what the judge "
                          "knows of the shopper and the item."),
        click.option("--reviews", multiple=True, type=Where(exists=True),
                     help="Ingested reviews (a `rexeval ingest` folder) to build the contexts from: "
                          "the user's earlier purchases and the item's title/category."),
        click.option("--max-history", type=int, help="Earlier purchases shown per user (default {default})."),
        click.option("--judge-service",
                     help="auto (default: use the running rexeval-judge Serve app, else start one with "
                          "the judge model and stop it at the end), none (a model in each actor), "
                          "serve:APP, or the http(s) URL of a running deployment."),
        click.option("--judge-replicas", type=int, help="Max replicas of a deployment this job starts."),
        click.option("--judge-gpus", type=float, help="GPUs per replica of a deployment this job starts."),
        click.option("--serve-port", type=int, help="HTTP port of a deployment this job starts "
                                                    "(127.0.0.1; default $REXEVAL_SERVE_PORT, else 8000)."),
        click.option("--price-table", type=click.Path(exists=True, dir_okay=False),
                     help="YAML of USD per 1M prompt/completion tokens by model, and per GPU-hour "
                          "(gpu_hour) for a reward model (see models/prices.example.yaml); the "
                          "report then totals the cost."),
        click.option("--chunk-size", type=int, help="Rows per shard, the unit of resume (default {default})."),
        click.option("--seed", type=int, help="Seed of every random choice (default {default})."),
        click.option("--free-text", "constrained", flag_value=False, default=None,
                     help="Let the judge answer in free text; by default answers are held to a small "
                          "JSON schema where the backend can constrain decoding (hf, vllm, openai)."),
    ]
    for o in reversed(options):
        fn = o(fn)
    return fn


@click.group("judge")
def judge_group():
    """LLM judges of recommendation explanations (seeds 001 and 004).

    Judges call the LLM through the rexeval-judge Ray Serve deployment, which batches
    the calls of every actor; each call's tokens and seconds are recorded and the report
    totals them (and the cost, with --price-table). Re-running a command resumes.
    `winrate` summarises pairwise runs (win / tie / loss shares with intervals, a figure).
    """


def _judge_job(title: str, config_cls, run, config_file, flags: dict, files) -> dict:
    """A judge job: its table and each model's calls, tokens and cost, then the summary;
    `files(cfg)` are its outputs, relative to --out."""
    return run_job(title, config_cls, run, config_file, flags, show=lambda cfg, report: _show(report),
                   counts=lambda cfg, report: {k: v for k, v in report.items() if isinstance(v, int)},
                   outputs=lambda cfg, report: {k: f"{cfg.out}/{v}" for k, v in files(cfg).items()})


def _show(report: dict) -> None:
    click.echo("")
    click.echo(report.pop("table_md"))
    usage = report.get("usage", {})
    for name, u in (usage.items() if isinstance(usage, dict) else []):
        if isinstance(u, dict) and "calls" in u:
            cost = f", cost ${u['cost_usd']:.4f}" if u.get("cost_usd") is not None else ""
            click.echo(f"  {name}: {u['calls']} call(s) ({u.get('cached_calls', 0)} cached), "
                       f"{u['prompt_tokens']} prompt + {u['completion_tokens']} completion tokens, "
                       f"{u['seconds']:.1f}s of model time{cost}; {u.get('unparseable', 0)} unreadable")
    if isinstance(report.get("usage_disc"), dict):
        click.echo(f"  {reward_line(report['usage_disc'])}")


@defaults_from(LikertJobConfig)
@judge_group.command("likert")
@click.argument("explanations", nargs=-1, type=Where(exists=True))
@click.option("--system", "systems", multiple=True, help="Only these systems.")
@click.option("--limit", type=int, help="Only the first N examples of each system.")
@click.option("--judge", "judges", multiple=True, metavar="MODEL",
              help="Judge model (repeatable; default the profile's judge_llm). Two or more also give "
                   "their ensemble: the average of their scores (seed 001, section 5).")
@click.option("--aspect", "aspects", multiple=True,
              help="persuasiveness, transparency, accuracy, satisfaction (default all).")
@click.option("--mode", type=click.Choice(["single", "multi"]),
              help="One call per aspect (single) or all aspects in one call (multi, default).")
@click.option("--shots", type=click.Choice(["zero", "one", "personalised"]),
              help="zero (default), one (a human-rated example of another user) or personalised "
                   "(the same user's rating of the same system on another item); needs --examples.")
@click.option("--examples", type=Where(exists=True, dir_okay=False),
              help="Human-rated explanations for one-shot prompts (user_id, item_id, system, explanation, "
                   "item_description, human_<aspect>...): Parquet, CSV, TSV or JSON lines, gzipped or not; "
                   "--columns maps its columns too.")
@click.option("--ensemble-missing", type=click.Choice(["skip", "zero"]),
              help="In the ensemble an unreadable score is left out (skip, default) or counts 0 (seed 001).")
@click.option("--max-tokens", type=int, help="Answer length limit (default {default}).")
@columns_option
@_judge_options
@llm_options
@config_option
@user_errors
def likert_cmd(config_file, llm, **flags):
    """Rate explanations 1-5 on persuasiveness, transparency, accuracy and satisfaction.

    Writes likert_scores.parquet (example_id, system, judge, aspect, score; NaN with the
    reason when the answer stayed unreadable after the retries), likert.md (mean per
    judge, system and aspect) and report.json (calls, tokens, seconds, cost). Compare the
    scores with human ratings with `rexeval meta-evaluate`.

    Examples:

      rexeval judge likert runs/gen/explanations.parquet --reviews runs/demo/ingest --out runs/likert

      rexeval judge likert expl.parquet --contexts ctx.parquet --mode single --shots personalised
      --examples rated.parquet --judge /models/llama-3.1-8b --judge /models/qwen3-8b --out runs/likert
    """
    return _judge_job("judge likert", LikertJobConfig, run_likert, config_file, {**flags, **llm},
                      lambda cfg: {"scores": "likert_scores.parquet", "table": "likert.md", "report": "report.json"})


def _pairwise_flags(fn):
    options = [
        click.option("--criteria", help="Rubric name or .yaml file of the criteria (default {default})."),
        click.option("--divide/--no-divide", default=None,
                     help="One call per criterion and a majority vote (default), or all criteria in one call."),
        click.option("--both-orders/--one-order", default=None,
                     help="Ask each pair in both orders (default) to cancel and measure position bias."),
        click.option("--disagreement", type=click.Choice(["tie", "first"]),
                     help="When the two orders disagree: a tie (default) or the first order's verdict."),
        click.option("--max-tokens", type=int,
                     help="Answer length limit, reasoning included (default: the profile's answer_caps."
                          "judge_tokens: 2048 with paper, as seed 004; 512 with local)."),
        click.option("--temperature", type=float,
                     help="Judge sampling temperature (default {default}; seed 004 used 0.7)."),
    ]
    for o in reversed(options):
        fn = o(fn)
    return fn


def _evaluator_flags(fn):
    """--evaluator and --reward-model, shared by pairwise and detect; the evaluators are
    listed from their modules' source (pipelines/judge/evaluators/), nothing imported."""
    from rexeval.pipelines.judge.evaluators import declared_evaluators

    evaluators = declared_evaluators()
    options = [
        click.option("--evaluator", "evaluators", multiple=True, type=click.Choice(list(evaluators)),
                     help="Who judges each pair (default gen; repeatable): "
                          + "; ".join(f"{n}, {d}" for n, d in evaluators.items()) + "."),
        click.option("--reward-model", type=click.Path(exists=True),
                     help="Hugging Face sequence-classification reward model folder, for --evaluator disc."),
    ]
    for o in reversed(options):
        fn = o(fn)
    return fn


def _verdict_files(cfg) -> dict[str, str]:
    """Each evaluator's verdicts file, under its name (the LLM judge's: "verdicts")."""
    from rexeval.pipelines.judge.evaluators import evaluator, in_order

    return {(ev.name if ev.tag else "verdicts"): ev.verdicts_file for ev in map(evaluator, in_order(cfg.evaluators))}


@defaults_from(PairwiseJobConfig)
@judge_group.command("pairwise")
@click.argument("explanations", nargs=-1, type=Where(exists=True))
@click.option("--baseline", help="The system every other system is compared with (required).")
@click.option("--system", "systems", multiple=True, help="Only these systems (and the baseline).")
@click.option("--limit", type=int, help="Only the first N examples of each system.")
@click.option("--only", multiple=True, help="Only these criteria of the rubric.")
@columns_option
@_evaluator_flags
@_pairwise_flags
@_judge_options
@llm_options
@config_option
@user_errors
def pairwise_cmd(config_file, llm, **flags):
    """Compare each system's explanations with a baseline's (ALERT-Gen and ALERT-Disc, seed 004).

    For every example both systems explained, the LLM judge (--evaluator gen, the
    default) reasons against the criteria (reasoning, clear language, engaging
    narrative, neutral tone) and answers [[A]], [[B]] or [[C]]; per criterion and in
    both orders by default. It writes verdicts.parquet and calls.parquet (every call's
    verdict and raw answer). With --evaluator disc a reward model (--reward-model)
    scores both explanations per criterion and the higher score wins; it writes
    verdicts_disc.parquet, and starts no LLM judge when gen is not asked for too.
    pairwise.md and report.json hold each evaluator's win / tie / loss rates (also per
    criterion), the LLM judge's position bias and its cost; with disc also the reward
    model's scoring time, GPUs and GPU-hour cost, beside the LLM judge's token cost in
    one table (seed 004 Table 3; price it with gpu_hour in --price-table). Summarise
    one or more runs with `rexeval judge winrate`.

    Examples:

      rexeval judge pairwise runs/gen/explanations.parquet --baseline ground_truth
      --reviews runs/demo/ingest --out runs/pairwise

      rexeval judge pairwise runs/gen/explanations.parquet --baseline preference_logic
      --reviews runs/demo/ingest --evaluator gen --evaluator disc --reward-model /models/armorm
      --out runs/pairwise
    """
    return _judge_job("judge pairwise", PairwiseJobConfig, run_pairwise, config_file, {**flags, **llm},
                      lambda cfg: {**_verdict_files(cfg), "table": "pairwise.md", "report": "report.json"})


@defaults_from(DetectJobConfig)
@judge_group.command("detect")
@click.option("--interactions", type=Where(exists=True, dir_okay=False),
              help="File (Parquet, CSV, TSV or JSON lines, gzipped or not) of user_id, item_id to "
                   "explain (default: every interaction of --contexts or --reviews).")
@click.option("--limit", type=int, help="Only the first N interactions.")
@click.option("--condition", "conditions", multiple=True,
              help="item_replace, user_replace, empty_user, jargon, minor_benefits, misinformation, "
                   "bad_experience (default all).")
@click.option("--generator", help="Model that writes the explanations (default the profile's llm).")
@columns_option
@_evaluator_flags
@click.option("--generation-max-tokens", type=int,
              help="Length limit of a generated explanation (default: the profile's answer_caps.explain_tokens: "
                   "2048 with paper, as seed 004; 96 with local).")
@click.option("--generation-temperature", type=float,
              help="Sampling temperature of the generator (default {default}: greedy, cached).")
@_pairwise_flags
@_judge_options
@llm_options
@config_option
@user_errors
def detect_cmd(config_file, llm, **flags):
    """Inferior-explanation detection test (seed 004, Table 1).

    An LLM writes a good explanation for each interaction and, per condition, a worse
    one: written for another item (item_replace), another user (user_replace) or no
    history (empty_user), or in a flawed style (jargon, minor_benefits, misinformation,
    bad_experience). Each evaluator then compares the pair in the true context; the
    accuracy per condition is how often it preferred the good one (random = 0.5).
    Writes pairs.parquet, verdicts_<evaluator>.parquet, detection.md and report.json.

    Examples:

      rexeval judge detect --reviews runs/demo/ingest --limit 20 --out runs/detect

      rexeval judge detect --contexts ctx.csv.gz --columns user_id=uid,item_description=title --out runs/detect
    """
    return _judge_job("judge detect", DetectJobConfig, run_detect, config_file, {**flags, **llm},
                      lambda cfg: {"pairs": "pairs.parquet", "table": "detection.md", "report": "report.json"})


@defaults_from(WinrateConfig)
@judge_group.command("winrate")
@click.argument("runs", nargs=-1, metavar="RUN_DIR...", type=Where(exists=True, file_okay=False))
@click.option("--out", "-o", help="Output folder (a local path or a URI).")
@click.option("--confidence", type=float, help="Level of the bootstrap intervals (default {default}).")
@click.option("--resamples", type=int, help="Bootstrap resamples of the pairs (default {default}; 0: no intervals).")
@click.option("--seed", type=int, help="Seed of the bootstrap (default {default}).")
@click.option("--baseline-label", help="The baseline's name in the figure and tables (default its system name).")
@click.option("--repeat", "repeats", multiple=True, type=Where(exists=True, file_okay=False),
              help="A pairwise folder that judged the same pairs again, one more run (repeatable): seed 004's "
                   "Table 6, each judge's agreement with itself (table6.md).")
@config_option
@user_errors
def winrate_cmd(config_file, **flags):
    """Win-rate study against the baseline: seed 004's Figure 5 and Table 4.

    Reads one or more `rexeval judge pairwise` output folders (e.g. one per batch of
    systems, all against the same baseline): verdicts.parquet is the LLM judge
    ("ALERT-Gen (<model>)"), verdicts_disc.parquet the reward model ("ALERT-Disc").
    Per judge, system and criterion ("overall" and each judged criterion) it counts the
    pairs the system won, tied and lost, with a percentile bootstrap interval over the
    pairs for each share; unreadable verdicts are counted and left out of the shares.
    Writes winrate.csv (every number), winrate.md with figure5.png/.svg (per judge,
    the shares "<baseline> loses / wins / tie" per system, as stacked bars), table4.md
    and table4.csv (per judge, each system's win rate per criterion) and report.json.
    With --repeat (further runs of the same pairs, e.g. at temperature 0.7 with other
    seeds) also table6.md / table6.csv: seed 004's Table 6, Cohen's kappa (averaged
    over the pairs of runs) and Krippendorff's alpha of each judge with itself.
    Needs no Ray and no model.

    Example:

      rexeval judge winrate runs/pairwise-batch1 runs/pairwise-batch2 --baseline-label PreferenceLogic
      --out runs/winrate
    """
    from rexeval.pipelines.judge.winrate import WinrateConfig, run_winrate

    return run_job("judge winrate", WinrateConfig, run_winrate, config_file, flags, ray=False,
                   show=lambda cfg, report: click.echo("\n" + report.pop("table_md")),
                   outputs=lambda cfg, report: {k: f"{cfg.out}/{v}" for k, v in {
                       "table": "winrate.md", "table4": "table4.md", "figure": "figure5.png",
                       "numbers": "winrate.csv", "report": "report.json"}.items()})


def main():  # python -m ray_jobs.judge
    judge_group()


if __name__ == "__main__":
    main()
