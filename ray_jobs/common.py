"""What every job shares: config from YAML + flags, clean errors, the closing summary, and
`run_job`, which runs a job through them; option types that read rexeval's registries."""
from __future__ import annotations

import functools
import json
import re
import sys
import time
from typing import Any, Callable, TypeVar

import click
import yaml
from pydantic import BaseModel, ValidationError

from rexeval.failures import AwaitingRerun, ServeStartFailed, WorkerFailed
from rexeval.models.refs import ModelUnavailable
from rexeval.pipelines.core.runtime import init_ray
from rexeval.pipelines.core.schema import SchemaError

C = TypeVar("C", bound=BaseModel)
R = TypeVar("R")


class Where(click.ParamType):
    """A command-line path that may be a URI (`s3://bucket/x`, `gs://...`) or a local
    path, checked through the storage module instead of the local disk (click.Path would
    refuse every URI). The value stays a string: a URI as given, a local path as typed."""

    name = "path|uri"

    def __init__(self, exists: bool = False, file_okay: bool = True, dir_okay: bool = True):
        self.exists, self.file_okay, self.dir_okay = exists, file_okay, dir_okay

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from rexeval.storage import location

        text = str(value)
        if not self.exists and self.file_okay and self.dir_okay:
            return text
        try:
            loc = location(text)
            is_dir, is_file = loc.is_dir(), loc.is_file()
        except (OSError, ValueError) as exc:
            self.fail(f"{text!r} cannot be reached: {_one(_first_line(exc))} (check the store's credentials "
                      "and address: AWS_* or GOOGLE_APPLICATION_CREDENTIALS, AWS_ENDPOINT_URL)", param, ctx)
        if not (is_dir or is_file):
            if not self.exists:  # to be made: only a path of the wrong kind is refused
                return text
            self.fail(f"{text!r} does not exist.", param, ctx)
        if is_dir and not self.dir_okay:
            self.fail(f"{text!r} is a folder; a file is expected.", param, ctx)
        if is_file and not self.file_okay:
            self.fail(f"{text!r} is a file; a folder is expected.", param, ctx)
        return text


class RegistryName(click.ParamType):
    """A name that one of rexeval's registries knows, or a `package.module:Name` plug-in:
    checked with the registry's own look-up, whose error (it lists the known names) is
    the usage error. `registry` returns the registry and runs only when a value is
    checked or --help lists the names, so importing a command imports no implementation
    (no torch for `rexeval --help`). `where` keeps the entries this option takes (e.g.
    the trainable rankers). The value stays the string given."""

    name = "name"

    def __init__(self, registry: Callable[[], Any], where: Callable[[Any], bool] | None = None):
        self.registry, self.where = registry, where

    def names(self) -> list[str]:
        reg = self.registry()
        return [n for n in reg.names() if self.where is None or self.where(reg.lookup(n))]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        try:
            entry = self.registry().lookup(text)
        except ValueError as exc:
            if self.where is None or ":" in text:  # the registry's own message: the known names, or the import error
                self.fail(str(exc), param, ctx)
            entry = None
        if self.where is not None and (entry is None or not self.where(entry)):
            self.fail(f"{text!r} is not one of {', '.join(self.names())} (or package.module:Name)", param, ctx)
        return text

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
        from click.shell_completion import CompletionItem

        return [CompletionItem(n) for n in self.names() if n.startswith(incomplete)]


class ListedOption(click.Option):
    """An option whose help says "{names}" where a registry's names go: `names`, or the
    option's RegistryName type, gives them when the help is shown (not at import)."""

    def __init__(self, *args: Any, names: Callable[[], list[str]] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.names = names or getattr(self.type, "names", None)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None or self.names is None:
            return record
        return record[0], record[1].replace("{names}", ", ".join(self.names()))


DEFAULT = "{default}"
"""Where an option's help names its default: `defaults_from` writes the config's value
there, so a default is written once, in the config."""


def shown_default(value: Any) -> str:
    """A config default as a help text shows it: 0.9, 128, test."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def defaults_from(config_cls: type[BaseModel]) -> Callable[[click.Command], click.Command]:
    """Fill "{default}" in the help of each of a command's options from the field of the
    same name in `config_cls` (its settings), and keep the class on the command
    (`rexeval_config`) so tests can check every help against it. Put it above the
    `@click.command` line. An option with "{default}" and no such field is a bug, raised
    at import."""
    fields = config_cls.model_fields

    def fill(cmd: click.Command) -> click.Command:
        for param in cmd.params:
            if isinstance(param, click.Option) and param.help and DEFAULT in param.help:
                if param.name not in fields:
                    raise TypeError(f"{cmd.name} --{param.name}: its help names a default but "
                                    f"{config_cls.__name__} has no field {param.name!r}")
                value = fields[param.name].get_default(call_default_factory=True)
                param.help = param.help.replace(DEFAULT, shown_default(value))
        cmd.rexeval_config = config_cls
        return cmd

    return fill


class ListedCommand(click.Command):
    """A command whose help says "{names}" where a registry's entries go, one a line with
    what each is: `listing` gives the (name, description) pairs when the help is shown
    (not at import, so `rexeval --help` imports no implementation). "{names}" stands
    alone in a paragraph that a \\b line keeps from being rewrapped."""

    def __init__(self, *args: Any, listing: Callable[[], list[tuple[str, str]]] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.listing = listing

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.listing is None or not self.help or "{names}" not in self.help:
            return super().format_help_text(ctx, formatter)
        import inspect

        kept = self.help
        # The help text is indented by the formatter's step (2) under "Usage:".
        self.help = inspect.cleandoc(kept).replace("{names}", name_lines(self.listing(), formatter.width - 2))
        try:
            super().format_help_text(ctx, formatter)
        finally:
            self.help = kept


def name_lines(entries: list[tuple[str, str]], width: int) -> str:
    """`name  description` lines, the descriptions wrapped in a column of their own."""
    import textwrap

    if not entries:
        return "(none registered)"
    col = max(len(name) for name, _ in entries) + 2
    lines = []
    for name, what in entries:
        wrapped = textwrap.wrap(what, max(width - col, 30)) or [""]
        lines.append((name.ljust(col) + wrapped[0]).rstrip())
        lines += [" " * col + more for more in wrapped[1:]]
    return "\n".join(lines)


def backend_names() -> list[str]:
    """The LLM backends a job can name (`serve` is declared by core.llm.job)."""
    from rexeval.pipelines.core.llm.job import BACKENDS

    return BACKENDS.names()


def _columns(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, str] | None:
    from rexeval.pipelines.core.table_formats import parse_columns

    try:
        return parse_columns(value) or None
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


columns_option = click.option(
    "--columns", multiple=True, callback=_columns, metavar="OURS=YOURS,...",
    help="Your tables' column names for ours, e.g. --columns explanation=text,system=model "
         "(repeatable); the files may be Parquet, CSV, TSV or JSON lines, gzipped or not.")

config_option = click.option(
    "--config", "config_file", type=Where(exists=True, dir_okay=False),
    help="YAML file (a path or a URI) with this command's settings; flags given on the command line win.")


def read_yaml_settings(config_file: str) -> dict[str, Any]:
    """A YAML settings file (a path or a URI) as a mapping; a file that is not UTF-8, not
    YAML or not a mapping is an InputMistake naming the file (and the line)."""
    from rexeval.storage import location

    try:
        loaded = yaml.safe_load(location(config_file).read_text())
    except UnicodeDecodeError as exc:
        raise InputMistake(f"{config_file}: not a text file (byte {exc.start} is not UTF-8); "
                           "--config takes a YAML file of settings") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or _first_line(exc)
        raise InputMistake(f"{config_file}{where}: not valid YAML ({problem})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise InputMistake(f"{config_file}: expected a mapping of settings (setting: value lines), "
                           f"found a {type(loaded).__name__}")
    return loaded


def load_config(cls: type[C], config_file: str | None, **flags: Any) -> C:
    """Build a typed config: YAML values first, then every flag that was given."""
    data: dict[str, Any] = {}
    if config_file:
        data.update(read_yaml_settings(config_file))
    for k, v in flags.items():
        if v is None or v == () or v == []:
            continue
        data[k] = list(v) if isinstance(v, tuple) else v
    try:
        return cls(**data)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or '(config)'}: {e['msg'].removeprefix('Value error, ')}"
                    for e in exc.errors()]
        src = f" (from {config_file})" if config_file else ""
        raise click.UsageError(f"invalid settings{src}: " + "; ".join(problems)) from None


def parse_backend_options(items: tuple[str, ...], option: str = "--backend-option") -> dict:
    """KEY=VALUE pairs of `option`; values are parsed as JSON when they can be (numbers,
    booleans)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} must look like KEY=VALUE", param_hint=option)
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
    click.option("--backend", cls=ListedOption, names=backend_names,
                 help="LLM backend: {names}, or package.module:Class (default: the profile's)."),
    click.option("--backend-option", "backend_options", multiple=True, metavar="KEY=VALUE",
                 help="Backend setting, e.g. batch_size=16, base_url=http://127.0.0.1:8000/v1, "
                      "concurrency=8, device=cuda."),
    click.option("--max-retries", type=int, help="Retries of an unusable answer (default {default})."),
    click.option("--workers", type=int,
                 help="Most LLM actors (a pool from min_workers); each loads the model (default {default})."),
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
    click.option("--num-samples", type=int, help="Repeats of the grid (default {default})."),
    click.option("--no-asha", "asha", flag_value=False, default=None, help="Train every trial to the end."),
    click.option("--grace-period", type=int, help="ASHA: epochs before a trial can be stopped (default {default})."),
    click.option("--gpus-per-trial", type=float, help="GPUs per trial (default {default}; 1 on GPU clusters)."),
    click.option("--max-concurrent", type=int, help="Trials running at once (default: as resources allow)."),
]


def tune_options(fn: Callable) -> Callable:
    """The Ray Tune options every training command takes (the one trainer's)."""
    for opt in reversed(_TUNE_OPTIONS):
        fn = opt(fn)
    return fn


def llm_options(fn: Callable | None = None, *, model_help: str | None = None,
                model_names: Callable[[], list[str]] | None = None) -> Callable:
    """The model, backend and cache flags of every LLM-backed command
    (pipelines.core.llm.job.LLMJobSettings); the command receives them as one `llm` dict.
    `model_help` replaces the help of --model (a command that also takes other values
    there says so); "{names}" in it is filled from `model_names` when the help is shown."""
    if fn is None:
        return functools.partial(llm_options, model_help=model_help, model_names=model_names)

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
        options[1] = click.option("--model", "models", multiple=True, metavar="NAME|ROLE=REF", help=model_help,
                                  cls=ListedOption, names=model_names)
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


class InputMistake(click.ClickException):
    """A mistake the user can fix in what they gave (a file, a setting): "Error: ..." in
    one line, exit code 2, as click's own usage errors."""

    exit_code = 2


class RuntimeFailure(click.ClickException):
    """The job could not finish for a reason outside its inputs (a worker or replica
    died, storage failed): one line, exit code 1."""

    exit_code = 1


EXIT_CODES = {"usage or input mistake": 2, "runtime failure": 1, "work left for a re-run": AwaitingRerun.exit_code}
"""What a command's exit code means (docs/concepts.md, docs/cluster.md)."""

_INPUT_ERRORS = (SchemaError, ValueError, FileNotFoundError, FileExistsError, IsADirectoryError,
                 NotADirectoryError, PermissionError, ModelUnavailable, UnicodeError, yaml.YAMLError)
_INPUT_ERROR_NAMES = {c.__name__ for c in _INPUT_ERRORS} | {
    "ValidationError", "JSONDecodeError", "UnicodeDecodeError", "ArrowInvalid", "UnreachablePath",
    "OutputOverlapsInput", "PackageNotInstalled", "ModelNotFound", "SetupFailed"}
# Storage answers that mean the user's settings (credentials, bucket, endpoint) are wrong.
_STORAGE_MISTAKES = ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY", "InvalidAccessKeyId",
                     "SignatureDoesNotMatch", "NoSuchBucket", "NO_SUCH_BUCKET", "credentials",
                     "Could not resolve host", "RESOURCE_NOT_FOUND")


def _is_ray_error(exc: BaseException) -> bool:
    """A Ray error (checked by module, so that `rexeval --help` never imports Ray)."""
    return any(c.__module__.startswith("ray.") for c in type(exc).__mro__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def as_click_error(exc: BaseException) -> click.ClickException | None:
    """The one-line error a command exits with for `exc` (None: let it propagate).

    A Ray error is read for the exception its worker raised (the last line of the remote
    traceback, `failures.reason_of`): an input mistake found by a worker is still the
    user's to fix (2), anything else is a runtime failure (1)."""
    if isinstance(exc, (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt)):
        return None
    if isinstance(exc, AwaitingRerun):  # transport failures left rows undone: not an error of the input
        err = click.ClickException(str(exc))
        err.exit_code = AwaitingRerun.exit_code
        return err
    if isinstance(exc, (ServeStartFailed, WorkerFailed)):  # a replica or actor died: its reason, one line
        reason = str(exc)
        raised = re.search(r"(?:failed|set it up): (\w+): ", reason)  # what the worker raised
        cls = InputMistake if raised and raised.group(1) in _INPUT_ERROR_NAMES else RuntimeFailure
        return cls(f"{_one(reason)} (the whole traceback is in Ray's logs: /tmp/ray/session_latest/logs on "
                   "the node that ran it)")
    if _is_ray_error(exc):
        from rexeval.failures import reason_of

        reason = reason_of(exc)
        kind = reason.split(":", 1)[0]
        return (InputMistake if kind in _INPUT_ERROR_NAMES else RuntimeFailure)(
            _one(reason.split(": ", 1)[1] if kind in _INPUT_ERROR_NAMES and ": " in reason else reason))
    if isinstance(exc, _INPUT_ERRORS):
        return InputMistake(_one(str(exc)) if not isinstance(exc, yaml.YAMLError) else _one(f"bad YAML: {exc}"))
    if isinstance(exc, OSError):  # storage: a bucket, an endpoint, a disk
        text = _first_line(exc)
        cls = InputMistake if any(m in text for m in _STORAGE_MISTAKES) else RuntimeFailure
        return cls(_one(f"storage: {text}" + (" (check the store's credentials and address: AWS_* or "
                                                "GOOGLE_APPLICATION_CREDENTIALS, AWS_ENDPOINT_URL)"
                                                if cls is InputMistake else "")))
    return None


def _one(text: str) -> str:
    """A message as one line: a multi-line message is joined with "; "."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    out = lines[0]
    for line in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + line.lstrip("-* ")
    return out


def internal_error(exc: BaseException) -> click.ClickException:
    """An unexpected exception (a bug of rexeval, not of the input): one line naming it
    and a file holding its whole traceback, exit code 1. REXEVAL_TRACEBACK=1 shows the
    traceback instead."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="rexeval-error-", suffix=".txt")
    with open(fd, "w") as fh:
        fh.write("".join(traceback.format_exception(exc)))
    return RuntimeFailure(f"unexpected {type(exc).__name__}: {_one(_first_line(exc))} (a bug in rexeval: the "
                          f"traceback is in {path}; please report it)")


def user_errors(fn: Callable) -> Callable:
    """Every failure of a command as one line and its exit code: 2 for a mistake the user
    can fix (a file, a row, a setting), 1 for a runtime failure (a worker that died, a
    store that failed, a bug: its traceback goes to a file), 75 for rows left for a
    re-run (`EXIT_CODES`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (each kind becomes its one line below)
            import os

            err = as_click_error(exc)
            if err is None:
                if isinstance(exc, click.ClickException) or os.environ.get("REXEVAL_TRACEBACK"):
                    raise
                err = internal_error(exc)
            raise err from None

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


def run_job(title: str | Callable[[C, R], str], config_cls: type[C], run: Callable[..., R],
            config_file: str | None, flags: dict[str, Any], *, ray: bool = True,
            show: Callable[[C, R], None] | None = None,
            counts: Callable[[C, R], dict[str, Any]] = lambda cfg, result: result["counts"],
            outputs: Callable[[C, R], dict[str, str]] = lambda cfg, result: {},
            notes: Callable[[C, R], list[str] | None] = lambda cfg, result: None) -> R:
    """One job, as every command runs it: its settings from the YAML file and the flags
    given (`load_config(config_cls, config_file, **flags)`), its output checked apart
    from its inputs (`overlap.check_output_apart`), a local Ray or the cluster's
    (unless ray=False), `run(cfg, progress=click.echo)`, then `show` prints the result
    and the closing summary gives the counts, the output paths and the notes (each a
    function of the settings and the result; the title may be one too). Returns the
    result."""
    from rexeval.pipelines.core.overlap import check_output_apart

    started = time.time()
    cfg = load_config(config_cls, config_file, **flags)
    check_output_apart(cfg)  # before anything is read or written
    if ray:
        init_ray()
    result = run(cfg, progress=click.echo)
    if show is not None:
        show(cfg, result)
    summary(title if isinstance(title, str) else title(cfg, result), counts(cfg, result), started,
            outputs(cfg, result), notes(cfg, result))
    return result


def echo_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
