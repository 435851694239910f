"""What every job shares: config from YAML + flags, clean errors, the closing summary."""
from __future__ import annotations

import functools
import json
import sys
import time
from typing import Any, Callable, TypeVar

import click
import yaml
from pydantic import BaseModel, ValidationError

from rexeval.failures import AwaitingRerun, ServeStartFailed, WorkerFailed
from rexeval.models.refs import ModelUnavailable
from rexeval.pipelines.core.schema import SchemaError

C = TypeVar("C", bound=BaseModel)


class Where(click.ParamType):
    """A command-line path that may be a URI (`s3://bucket/x`, `gs://...`) or a local
    path, checked through the storage module instead of the local disk (click.Path would
    refuse every URI). The value stays a string: a URI as given, a local path as typed."""

    name = "path|uri"

    def __init__(self, exists: bool = False, file_okay: bool = True, dir_okay: bool = True):
        self.exists, self.file_okay, self.dir_okay = exists, file_okay, dir_okay

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from rexeval.pipelines.core.storage import location

        text = str(value)
        if not self.exists:
            return text
        try:
            loc = location(text)
            is_dir, is_file = loc.is_dir(), loc.is_file()
        except (OSError, ValueError) as exc:
            self.fail(f"{text!r} cannot be reached: {exc}", param, ctx)
        if not (is_dir or is_file):
            self.fail(f"{text!r} does not exist.", param, ctx)
        if is_dir and not self.dir_okay:
            self.fail(f"{text!r} is a folder; a file is expected.", param, ctx)
        if is_file and not self.file_okay:
            self.fail(f"{text!r} is a file; a folder is expected.", param, ctx)
        return text


config_option = click.option(
    "--config", "config_file", type=Where(exists=True, dir_okay=False),
    help="YAML file (a path or a URI) with this command's settings; flags given on the command line win.")


def load_config(cls: type[C], config_file: str | None, **flags: Any) -> C:
    """Build a typed config: YAML values first, then every flag that was given."""
    data: dict[str, Any] = {}
    if config_file:
        from rexeval.pipelines.core.storage import location

        loaded = yaml.safe_load(location(config_file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise click.UsageError(f"{config_file}: expected a mapping of settings")
        data.update(loaded)
    for k, v in flags.items():
        if v is None or v == () or v == []:
            continue
        data[k] = list(v) if isinstance(v, tuple) else v
    try:
        return cls(**data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or '(config)'}: {e['msg']}" for e in exc.errors()]
        src = f" (from {config_file})" if config_file else ""
        raise click.UsageError("invalid settings" + src + ":\n" + "\n".join(lines)) from None


def parse_backend_options(items: tuple[str, ...]) -> dict:
    """KEY=VALUE pairs; values are parsed as JSON when they can be (numbers, booleans)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} must look like KEY=VALUE", param_hint="--backend-option")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


_LLM_OPTIONS = [
    click.option("--profile", help="Model profile: local (default, CPU, offline) or paper."),
    click.option("--model", "models", multiple=True, metavar="ROLE=REF",
                 help="Override one model of the profile, e.g. --model llm=/models/qwen3-8b "
                      "or --model judge_llm=/models/llama-3.1-8b-instruct."),
    click.option("--backend", help="LLM backend: hf, openai, vllm (default: the profile's)."),
    click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE",
                 help="Backend setting, e.g. batch_size=16, base_url=http://127.0.0.1:8000/v1, "
                      "concurrency=8, device=cuda."),
    click.option("--max-retries", type=int, help="Retries of an unusable answer (default 2)."),
    click.option("--workers", type=int, help="LLM actors; each loads the model (default 1)."),
    click.option("--cache", help="LLM-call cache: a local SQLite file, or a URI folder (s3://bucket/cache) "
                                "holding one object per call (default: $REXEVAL_CACHE/llm-calls.sqlite; "
                                "OUT/_llm_cache when --out is a URI)."),
    click.option("--no-cache", is_flag=True, help="Do not read or write the LLM-call cache."),
]


def parse_grid(items: tuple[str, ...]) -> dict[str, list]:
    """--grid SETTING=V1,V2,... values (each parsed like a --set value)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} must look like SETTING=V1,V2,...", param_hint="--grid")
        k, v = item.split("=", 1)
        out[k.strip()] = [parse_backend_options((f"x={x}",))["x"] for x in v.split(",") if x.strip()]
    return out


_TUNE_OPTIONS = [
    click.option("--grid", "grids", multiple=True, metavar="SETTING=V1,V2,...",
                 help="Grid-search a setting, e.g. --grid lr=0.01,0.001 (ASHA stops weak trials)."),
    click.option("--num-samples", type=int, help="Repeats of the grid (default 1)."),
    click.option("--no-asha", "asha", flag_value=False, default=None, help="Train every trial to the end."),
    click.option("--grace-period", type=int, help="ASHA: epochs before a trial can be stopped (default 5)."),
    click.option("--gpus-per-trial", type=float, help="GPUs per trial (default 0; 1 on GPU clusters)."),
    click.option("--max-concurrent", type=int, help="Trials running at once (default: as resources allow)."),
]


def tune_options(fn: Callable) -> Callable:
    """The Ray Tune options every training command takes (the one trainer's)."""
    for opt in reversed(_TUNE_OPTIONS):
        fn = opt(fn)
    return fn


def llm_options(fn: Callable | None = None, *, model_help: str | None = None) -> Callable:
    """The model, backend and cache flags of every LLM-backed command
    (pipelines.core.llm_job.LLMJobSettings); the command receives them as one `llm` dict.
    `model_help` replaces the help of --model (a command that also takes other values
    there says so)."""
    if fn is None:
        return functools.partial(llm_options, model_help=model_help)

    @functools.wraps(fn)
    def wrapper(*args, profile, models, backend, backend_options, max_retries, workers, cache,
                no_cache, **kwargs):
        llm = dict(profile=profile, models=models, backend=backend,
                   backend_options=parse_backend_options(backend_options) or None,
                   max_retries=max_retries, workers=workers, cache=cache,
                   use_cache=False if no_cache else None)
        return fn(*args, llm=llm, **kwargs)

    options = list(_LLM_OPTIONS)
    if model_help:
        options[1] = click.option("--model", "models", multiple=True, metavar="NAME|ROLE=REF", help=model_help)
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def user_errors(fn: Callable) -> Callable:
    """Turn the errors a user can fix, and a Ray worker's or replica's failure, into a
    one-line message (exit code 1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SchemaError, FileNotFoundError, FileExistsError, ValueError, ModelUnavailable) as exc:
            raise click.ClickException(str(exc)) from None
        except AwaitingRerun as exc:  # transport failures left rows undone: not an error of the input
            err = click.ClickException(str(exc))
            err.exit_code = AwaitingRerun.exit_code
            raise err from None
        except (ServeStartFailed, WorkerFailed) as exc:  # a replica or actor died: its reason, one line
            raise click.ClickException(f"{exc} (the whole traceback is in Ray's logs: "
                                       "/tmp/ray/session_latest/logs on the node that ran it)") from None

    return wrapper


def summary(title: str, counts: dict[str, Any], started: float, outputs: dict[str, str],
            notes: list[str] | None = None) -> None:
    """The closing one-screen summary every job prints."""
    click.echo("")
    click.echo(f"== {title} " + "=" * max(0, 60 - len(title)))
    for k, v in counts.items():
        click.echo(f"  {k:<28} {v:>12,}" if isinstance(v, int) else f"  {k:<28} {v:>12}")
    click.echo(f"  {'time':<28} {time.time() - started:>11.1f}s")
    for k, v in outputs.items():
        click.echo(f"  {k:<10} {v}")
    for n in notes or []:
        click.echo(f"  note: {n}")


def echo_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
