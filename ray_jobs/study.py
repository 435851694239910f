"""`rexeval study run|jobs`: a whole benchmark from one YAML file (python -m rexeval.ray_jobs.study)."""
from __future__ import annotations

import time

import click

from rexeval.failures import AwaitingRerun
from rexeval.pipelines.study.config import STEPS_AS, load_study, parse_sets
from rexeval.pipelines.core.study_registry import STUDY_JOBS
from rexeval.pipelines.study.plan import build_plan
from rexeval.pipelines.study.runner import hard_failures, run_study
from rexeval.ray_jobs.common import summary, user_errors
from rexeval.ray_jobs.study_report import study_report_cmd


@click.group("study")
def study_group():
    """A whole benchmark from one study file: datasets, steps, models (see studies/).

    Each step runs an existing rexeval job with that job's settings; steps run in
    dependency order, independent ones at once, on the local Ray or the cluster named
    by RAY_ADDRESS (or under `ray job submit`). A re-run does only what is missing or
    changed, and says why.
    """


@study_group.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--out", "-o", help="Output folder or URI (s3://bucket/x; default: the file's `out`, else "
                                   "runs/<name>). On a cluster whose nodes share no disk: a URI.")
@click.option("--only", multiple=True, metavar="STEP",
              help="Run only this step (or instance, e.g. extract@mi); repeatable. Its inputs must be done.")
@click.option("--dry-run", is_flag=True, help="Show every step instance, whether it would run and why; run nothing.")
@click.option("--max-parallel", type=int, help="Independent step instances at once (default: the file's, 2).")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
              help="Override one of the study's vars (VALUE read as YAML: 3, true, null, [a, b]); repeatable.")
@click.option("--verbose", "-v", is_flag=True,
              help="Also print Ray's and the libraries' own output of every step (always in OUT/logs/).")
@click.option("--steps-as", type=click.Choice(STEPS_AS),
              help="Each step's driver as a process of this one, or as a Ray job of its own that may run on any "
                   "node (with the study's driver_resources); auto: jobs on a running cluster with a job server. "
                   "Default: REXEVAL_STEPS_AS, else the file's steps_as, else auto.")
@click.option("--stages-as", "stages_as", type=click.Choice(STEPS_AS), hidden=True,
              help="The old name of --steps-as (a step was a \"stage\"), still read.")
@user_errors
def study_run_cmd(file, out, only, dry_run, max_parallel, sets, verbose, steps_as, stages_as):
    """Check the study file, then run the steps that are missing or changed.

    Everything a user can fix is reported before anything runs: unknown keys, unknown
    jobs, references to no step, a cycle, missing input files, settings a job refuses,
    a model role the profile lacks. Each step instance runs in a driver of its own (its
    log in OUT/logs/<instance>.log): on a running Ray cluster a Ray job submitted with
    the study's `driver_resources` (so it can run on a worker node), else a process of
    this driver (--steps-as); steps that call the same judge share one judge
    deployment, started once. The state of each step instance is kept in
    OUT/study.json; `rexeval study report OUT` turns the results into one HTML page.

    OUT may be a URI (s3://, gs://): the state, every step's folder, the logs and the
    report are written there. A local OUT that some node of the Ray cluster cannot see
    is refused before any step runs (use a URI or a folder every node mounts).

    Examples:

      rexeval study run studies/local.yaml --dry-run

      rexeval study run studies/local.yaml --out runs/local

      rexeval study run studies/seed000.yaml --out s3://bucket/studies/seed000

      rexeval study run studies/seed000.yaml --only evaluate

      rexeval study run studies/demo.yaml --set judge_examples=4 --set nli=/models/deberta-large-mnli
    """
    if stages_as and steps_as and stages_as != steps_as:
        raise click.UsageError("--stages-as is the old name of --steps-as: give one of them")
    steps_as = steps_as or stages_as
    started = time.time()
    plan = build_plan(load_study(file, parse_sets(sets)), file, out)
    res = run_study(plan, only=list(only) or None, dry_run=dry_run, max_parallel=max_parallel, progress=click.echo,
                    verbose=verbose, steps_as=steps_as)
    if dry_run:
        return res
    hard = set(hard_failures(plan, res))
    notes = [f"{k} FAILED{'' if k in hard else ' (optional)'}: {why}" for k, why in res["failed"].items()]
    notes += [f"{k} skipped: {why}" for k, why in res["skipped"].items()]
    notes += [f"{k}: {why}" for k, why in plan.off.items()]
    failed_hard = [k for k in hard if k in res["failed"]]
    left = bool(failed_hard) and set(failed_hard) <= set(res["transport"])
    if left:
        notes.append("every failure was in transport (a lost node, calls that failed): run the same command "
                     "again to finish")
    summary(f"study {plan.study.name}", {"step instances": len(plan.order), "ran": len(res["ran"]),
                                         "already complete": len(res["done"]), "failed": len(res["failed"]),
                                         "skipped": len(res["skipped"])},
            started, {"state": str(plan.out / "study.json"), "logs": str(plan.out / "logs")}, notes=notes)
    if hard:
        raise SystemExit(AwaitingRerun.exit_code if left else 1)
    return res


@study_group.command("step", hidden=True)
@click.argument("call")
@user_errors
def study_step_cmd(call):
    """Run one step of a study inside its Ray job: what `study run` submits for a step
    (CALL: the call file the study wrote, OUT/_step_jobs/<instance>/call.json)."""
    from rexeval.storage import location
    from rexeval.pipelines.study.step_job import run_call

    location(call).read_json()  # a missing or broken call file is the caller's mistake: one line, exit 2
    raise SystemExit(run_call(call))


@study_group.command("jobs")
def study_jobs_cmd():
    """List the jobs a step can run (`job:` in a study file) and their config classes."""
    for name in sorted(STUDY_JOBS):
        job = STUDY_JOBS[name]
        click.echo(f"{name:16s} {job.description}  [settings: {job.config.__module__}.{job.config.__name__}]")


study_group.add_command(study_report_cmd)



def main():  # python -m rexeval.ray_jobs.study
    study_group()


if __name__ == "__main__":
    main()
