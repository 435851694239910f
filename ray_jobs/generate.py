"""`rexeval generate train|run` (python -m rexeval.ray_jobs.generate): seed 000's trained
explanation generators (NRT, Att2Seq, PETER, CER, PEPLER, XRec)."""
from __future__ import annotations

from functools import partial

import click

from rexeval.models.generators.presets import PRESETS
from rexeval.pipelines.generate.config import RunConfig, TrainJob
from rexeval.pipelines.generate.prompted.config import PromptedJob
from rexeval.ray_jobs.common import (
    defaults_from,
    ListedCommand,
    ListedOption,
    RegistryName,
    Where,
    columns_option,
    config_option,
    llm_options,
    parse_backend_options,
    parse_grid,
    run_job,
    tune_options,
    user_errors,
)


def _generators():
    """The trained generators' registry (imported when a name is checked or listed: torch)."""
    from rexeval.models.generators.base import GENERATORS

    return GENERATORS


def _declared_generators() -> list[str]:
    """The generators' names for --help, read from their modules' source (no torch),
    unless the registry is loaded already (torch is then too), which also knows the
    generators registered at run time."""
    import sys

    if "rexeval.models.generators.base" in sys.modules:
        return _generators().names()
    from rexeval.models.generators import SCAN
    from rexeval.registry import declared_names

    return sorted(declared_names(*SCAN))


def _methods():
    """The prompted generators' registry."""
    from rexeval.pipelines.generate.prompted.methods import METHODS

    return METHODS


def _method_lines() -> list[tuple[str, str]]:
    """Every prompted generator with what it does (its docstring's first paragraph), for
    `generate llm --help`: registered ones included."""
    from rexeval.registry import summary

    reg = _methods()
    return [(name, summary(reg.lookup(name))) for name in reg.names()]


def split_model_flags(values: list | tuple | None) -> tuple[str | None, list[str]]:
    """--model values: one generator (a registered name, lower-cased, or a
    package.module:Class), and ROLE=REF overrides of the profile."""
    names = [v for v in values or () if "=" not in v]
    if len(names) > 1:
        raise click.BadParameter(f"one generator at a time, got {', '.join(names)}", param_hint="--model")
    model = None
    if names:
        model = names[0] if ":" in names[0] else names[0].lower()
        try:
            _generators().lookup(model)
        except ValueError as exc:
            raise click.BadParameter(f"{exc}; or give ROLE=REF to override a model of the profile",
                                     param_hint="--model") from None
    return model, [v for v in values or () if "=" in v]


@click.group("generate")
def generate_group():
    """Explanation generators: seed 000's trained baselines (train NRT, Att2Seq, PETER,
    CER, PEPLER or XRec on a split with Ray Tune, then `run` decodes a split) and
    prompted ones, seed 004's and rexeval's own (`llm`; `rexeval generate llm --help`
    lists them). Both write an explanations table that `rexeval evaluate` and `rexeval
    judge` read as is.

    Typical run (seed 000, Tables III-VI):

      rexeval split runs/mi/ingest --out runs/mi/split

      rexeval ground-truth runs/mi/triplets --out runs/mi/truth

      rexeval generate train runs/mi/split --truth runs/mi/truth --model peter --out runs/mi/peter

      rexeval generate train runs/mi/split --truth runs/mi/truth --model cer --preset seed000 --out runs/mi/cer

      rexeval generate run runs/mi/peter --split test --out runs/mi/peter-test

      rexeval evaluate runs/mi/peter-test --references runs/mi/truth --out runs/mi/eval-peter
    """


@defaults_from(TrainJob)
@generate_group.command("train")
@click.argument("data", required=False, type=Where())
@click.option("--target", type=click.Choice(["explanation", "review"]),
              help="What the model learns to write: the ground-truth explanation of each review "
                   "(default; needs --truth) or the review text itself (seed 000 Table VII).")
@click.option("--truth", type=Where(exists=True, file_okay=False),
              help="`rexeval ground-truth` output folder (the explanation targets), a local path or a URI.")
@click.option("--preset", type=click.Choice(list(PRESETS)),
              help="The settings table to start from: paper (default: each original paper) or seed000 "
                   "(what seed 000 ran: its released main.sh/main.py, 128-word targets). Every value and its "
                   "source: --show-settings, or the presets tables in docs/methods/generators.md.")
@click.option("--set", "sets", multiple=True, metavar="SETTING=VALUE",
              help="A setting over the preset's, e.g. --set epochs=20 --set emsize=256.")
@tune_options
@click.option("--cpus-per-trial", type=float, help="CPUs per trial (default: all for a single trial, else 1).")
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(data/, tune/, best/, train.json).")
@click.option("--overwrite", is_flag=True, help="Start over instead of restoring the experiment.")
@click.option("--show-settings", is_flag=True, help="Print the model's settings with their defaults and sources, "
                                                    "then exit.")
@llm_options(model_help="The generator: {names} (default peter) or package.module:Class; and, as ROLE=REF, "
                        "a model of the profile, e.g. --model pepler --model generator_lm=/models/gpt2, "
                        "--model xrec --model generator_llm=/models/llama-2-7b-chat --model llm=/models/qwen3-8b "
                        "(the LLM that writes XRec's profiles).", model_names=_declared_generators)
@config_option
@user_errors
def train_cmd(data, sets, grids, config_file, show_settings, llm, **flags):
    """Train a generator with Ray Tune on a `rexeval split` output.

    Word-level vocabulary (the most frequent training words, case kept) and a fixed
    maximum length, saved with the checkpoint; a checkpoint every epoch; the best epoch
    by the validation value `select` names (loss: the objective; ppl: perplexity;
    text_rating: text NLL + rating MSE, the originals' for NRT, PETER, CER); early
    stopping after `patience` epochs without improvement. Run the same command again after a crash: the experiment is restored
    and an interrupted trial resumes from its last checkpoint. Other settings into the
    same --out folder are refused.

    Settings come from a preset (--preset paper, the default, or seed000), then --set /
    --grid override single ones: each model's own and epochs, patience, seed, select
    (list them with their sources: --show-settings). max_words: with `paper`, review
    targets keep the model's and explanation targets default to the 95th percentile of
    the training explanations' lengths; with `seed000` every target is cut at 128 words
    (PEPLER, XRec: tokens). Att2Seq writes without the rating unless --set
    rating_input=true (its system is then named att2seq+rating: it reads the test label).

    Examples:

      rexeval generate train runs/mi/split --truth runs/mi/truth --model peter --out runs/mi/peter

      rexeval generate train runs/mi/split --truth runs/mi/truth --model cer --preset seed000 --out runs/mi/cer

      rexeval generate train runs/mi/split --target review --model nrt --set epochs=20 --out runs/mi/nrt-review

      rexeval generate train runs/mi/split --truth runs/mi/truth --model cer --grid lr=1.0,0.5 --gpus-per-trial 1 --out runs/mi/cer

      rexeval generate train runs/mi/split --truth runs/mi/truth --model pepler --out runs/mi/pepler

      rexeval generate train runs/mi/split --truth runs/mi/truth --model xrec --profile paper --gpus-per-trial 1 --out runs/mi/xrec

    PEPLER and XRec run on a pretrained LM of the profile (roles generator_lm and
    generator_llm: the packaged SmolLM2-135M in `local`, GPT-2 and Llama-2-7b-chat in
    `paper`); their targets are counted in that LM's tokens. XRec first trains LightGCN
    (a Tune trial) and has the profile's llm write a profile of every user and item from
    their training reviews (cached; --backend/--backend-option/--workers as in
    `rexeval extract`).

    DATA, --truth and --out may be local folders or URIs (s3://bucket/run; credentials
    and endpoint from the standard AWS variables): the trials, on any node, read the
    prepared data and keep their checkpoints there.
    """
    from rexeval.pipelines.generate.pipeline import run_train

    settings = parse_backend_options(sets, "--set")
    model, overrides = split_model_flags(llm.pop("models"))
    llm["models"] = overrides or None
    flags["model"] = model
    if show_settings:
        from rexeval.models.generators.declared import generator_facts
        from rexeval.models.generators.presets import DEFAULT_PRESET, table
        from rexeval.pipelines.generate.settings import resolve_settings

        model = generator_facts(model or "peter").name
        preset = flags.get("preset") or DEFAULT_PRESET
        sources = table(preset, model)
        for k, v in resolve_settings(model, settings, preset).items():
            src = "--set" if k in settings else sources[k][1] if k in sources else ""
            click.echo(f"{k} = {v!r}" + (f"    # {src}" if src else ""))
        return
    return run_job("generate train", TrainJob, run_train, config_file,
                   {"data": data, "settings": settings or None, "grid": parse_grid(grids) or None, **flags, **llm},
                   counts=_train_counts,
                   outputs=lambda job, report: {
                       "checkpoint": report["best"]["checkpoint"], "experiment": report["experiment"],
                       "report": f"{job.out}/train.json", "errors": f"{job.out}/data/errors.parquet"},
                   notes=lambda job, report: [f"best settings: {report['best']['config'] or 'single configuration'}"])


def _train_counts(job, report: dict) -> dict:
    best, data = report["best"], report["data"]
    counts = {"train examples": data["train"], "valid examples": data["valid"], "test examples": data["test"],
              "reviews without a target": data["no_target"], "trials": len(report["trials"]),
              "trials with errors": report["trial_errors"], "best epoch": best["epoch"],
              "valid loss": f"{best['val_loss']:.4f}", "valid perplexity": f"{best['val_ppl']:.2f}"}
    if "val_rmse" in best:
        counts["valid RMSE"] = f"{best['val_rmse']:.4f}"
    return counts


@defaults_from(RunConfig)
@generate_group.command("run")
@click.argument("checkpoint", required=False, type=Where(exists=True, file_okay=False))
@click.option("--split", type=click.Choice(["train", "valid", "test"]), help="Split to decode (default {default}).")
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(explanations/, ratings/, errors/, manifest.json).")
@click.option("--system", help="System name in the explanations table (default: the model's name).")
@click.option("--beam-size", type=int, help="1: greedy decoding (default); more: beam search.")
@click.option("--batch-size", type=int, help="Examples decoded together (default {default}).")
@click.option("--max-words", type=int, help="Longest explanation (default: the training length).")
@click.option("--limit", type=int, help="Decode only the first N examples.")
@click.option("--workers", type=int, help="Most decoding actors; each loads the model once (default: as many as fit "
                                          "on a machine whose Ray the job started, one per shard on a cluster).")
@click.option("--gpus-per-worker", type=float, help="GPUs per actor (default {default}).")
@click.option("--overwrite", is_flag=True, help="Replace an output folder made with other settings.")
@config_option
@user_errors
def run_cmd(config_file, overwrite, **flags):
    """Decode a split with a trained generator, batched, on a Ray Data actor pool.

    CHECKPOINT is a `generate train` output folder (its best/ checkpoint) or one epoch
    checkpoint folder of its Tune experiment. Writes the explanations table (system =
    the model, example ids = review ids, joining the ground truth), the predicted ratings
    with RMSE and MAE for the models that predict them, and an error row for every
    example of the split without an explanation. CHECKPOINT and --out may be local
    folders or URIs (s3://bucket/run).

    Examples:

      rexeval generate run runs/mi/peter --split test --out runs/mi/peter-test

      rexeval generate run runs/mi/peter --beam-size 4 --out runs/mi/peter-test-beam
    """
    from rexeval.pipelines.generate.decode import run_generate

    return run_job("generate run", RunConfig, partial(run_generate, overwrite=overwrite), config_file, flags,
                   counts=_run_counts, outputs=lambda cfg, m: {n: f"{cfg.out}/{n}" for n in
                                                               ("explanations", "ratings", "errors")},
                   notes=lambda cfg, m: [f"`rexeval evaluate {cfg.out} --references <ground-truth folder>` "
                                         "scores them"])


def _run_counts(cfg, manifest: dict) -> dict:
    c = manifest["counts"]
    counts = {"examples": c.get("in", 0), "explanations": c.get("out", 0), "error rows": c.get("errors", 0),
              "reviews without a target": c.get("no_target", 0)}
    if "rmse" in manifest:
        counts.update({"RMSE": f"{manifest['rmse']:.4f}", "MAE": f"{manifest['mae']:.4f}"})
    return counts


def prompted_settings(sets: tuple[str, ...]) -> dict | None:
    """--set KEY=VALUE of `generate llm`: the generators' settings, and the BiasedMF's
    (mf_dim, mf_lr, mf_reg, mf_batch_size, mf_epochs, mf_patience) under `mf`."""
    values = parse_backend_options(sets, "--set")
    if not values:
        return None
    mf = {k: v for k, v in values.items() if k.startswith("mf_")}
    out = {k: v for k, v in values.items() if not k.startswith("mf_")}
    return {**out, **({"mf": mf} if mf else {})}


@defaults_from(PromptedJob)
@generate_group.command("llm", cls=ListedCommand, listing=_method_lines)
@click.argument("data", required=False, type=Where(exists=True))
@click.option("--method", "methods", multiple=True, type=RegistryName(_methods), cls=ListedOption,
              help="Generator(s) to run (repeatable): {names} (preference_logic is seed 004's baseline), "
                   "or package.module:Class.")
@click.option("--out", "-o", type=Where(), help="Output folder, a local path or a URI such as s3://bucket/run "
                                                "(explanations.parquet, errors.parquet, report.json, "
                                                "<method>/plan.parquet, mf/).")
@click.option("--split", type=click.Choice(["train", "valid", "test"]),
              help="For a `rexeval split` folder: the split to explain (default {default}).")
@click.option("--min-reviews", type=int, help="For an ingest folder: explain the latest review of every user "
                                              "with at least this many reviews (default {default}).")
@click.option("--limit", type=int, help="Only the first N interactions (by user, item).")
@click.option("--set", "sets", multiple=True, metavar="SETTING=VALUE",
              help="A generator setting, e.g. --set k_users=5 --set temperature=0.7, or a BiasedMF one: "
                   "--set mf_dim=64 --set mf_epochs=100.")
@click.option("--judge-service",
              help="auto (default: the running rexeval-judge Serve app, else one started for this job), none "
                   "(the LLM in each actor), serve:APP, or the http(s) URL of a running deployment.")
@click.option("--serve-port", type=int, help="HTTP port of a deployment this job starts "
                                             "(127.0.0.1; default $REXEVAL_SERVE_PORT, else 8000).")
@click.option("--judge-replicas", type=int, help="Max replicas of a deployment this job starts.")
@click.option("--judge-gpus", type=float, help="GPUs per replica of a deployment this job starts.")
@click.option("--mf-gpus", type=float, help="GPUs of the BiasedMF Tune trial (default {default}).")
@click.option("--price-table", type=click.Path(exists=True, dir_okay=False),
              help="YAML of USD per 1M tokens by model; the report then totals the cost.")
@click.option("--chunk-size", type=int, help="Prompts per shard, the unit of resume (default {default}).")
@click.option("--seed", type=int, help="Seed of the BiasedMF and of sampling (default {default}).")
@columns_option
@llm_options(model_help="A model of the profile as ROLE=REF: the LLM that writes the explanations is the "
                        "`llm` role, e.g. --model llm=/models/qwen3-8b.")
@config_option
@user_errors
def llm_cmd(data, sets, config_file, llm, **flags):
    """Seed 004's explanation generators, prompted (no training of the LLM).

    DATA is a `rexeval ingest` folder or a reviews table of yours (Parquet, CSV, TSV or
    JSON lines, gzipped or not; --columns maps your column names to ours): each user's
    latest review is explained, as seed 004 does. Or a `rexeval split` folder (the --split
    interactions, with the same example ids as `rexeval generate run`, so Att2Seq's table
    can be judged beside these). No
    generator reads the review it explains: the known data leaves out every explained
    interaction's (user, item) pair. DATA and --out may be local folders or URIs
    (s3://bucket/run; credentials and endpoint from the standard AWS variables).

    The generators (the registry's, so one added in a module of its own is listed):

    \b
    {names}

    Writes explanations.parquet (read by `rexeval evaluate` and `rexeval judge`),
    errors.parquet (every interaction a method could not explain, with the reason),
    report.json and generate.md. LLM calls are cached and run in resumable chunks: a
    re-run makes no call.

    Examples:

      rexeval generate llm runs/demo/ingest --method preference_logic --method user_based --out runs/seed004

      rexeval generate llm runs/mi/split --method review_extract --method review_summary --limit 200 --out runs/mi/llm

      rexeval generate llm reviews.csv.gz --columns user_id=reviewer,item_id=asin,text=body --method user_based --out runs/mine/llm

      rexeval generate llm runs/mi/split --method item_based --profile paper --backend vllm --set mf_dim=64 --out runs/mi/llm
    """
    from rexeval.pipelines.generate.prompted.job import run_prompted

    return run_job("generate llm", PromptedJob, run_prompted, config_file,
                   {"input": data, "settings": prompted_settings(sets), **flags, **llm},
                   show=lambda cfg, report: click.echo("\n" + report.pop("table_md")), counts=_llm_counts,
                   outputs=lambda cfg, report: {k: f"{cfg.out}/{v}" for k, v in (
                       ("explanations", "explanations.parquet"), ("errors", "errors.parquet"),
                       ("report", "report.json"))},
                   notes=lambda cfg, report: [f"`rexeval judge pairwise {cfg.out}/explanations.parquet --baseline "
                                              "preference_logic --reviews <ingest folder>` compares them"])


def _llm_counts(cfg, report: dict) -> dict:
    counts = {"interactions": report["interactions"], "explanations": report["explanations"],
              "error rows": report["errors"]}
    usage = report.get("usage") or {}
    if usage:
        counts.update({"LLM calls": usage.get("calls", 0), "cached calls": usage.get("cached_calls", 0)})
    if report.get("biased_mf"):
        m = report["biased_mf"]
        counts["BiasedMF valid RMSE"] = f"{m['val_rmse']:.4f} (global mean {m['global_mean_rmse']:.4f})"
    return counts


def main():  # python -m rexeval.ray_jobs.generate
    generate_group()


if __name__ == "__main__":
    main()
