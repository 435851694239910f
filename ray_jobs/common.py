"""What every job shares: config from YAML + flags, clean errors, the closing summary."""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import click
import yaml
from pydantic import BaseModel, ValidationError

from pipelines.schema import SchemaError

C = TypeVar("C", bound=BaseModel)

config_option = click.option(
    "--config", "config_file", type=click.Path(exists=True, dir_okay=False),
    help="YAML file with this command's settings; flags given on the command line win.")


def load_config(cls: type[C], config_file: str | None, **flags: Any) -> C:
    """Build a typed config: YAML values first, then every flag that was given."""
    data: dict[str, Any] = {}
    if config_file:
        loaded = yaml.safe_load(Path(config_file).read_text()) or {}
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


def user_errors(fn: Callable) -> Callable:
    """Turn the errors a user can fix into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SchemaError, FileNotFoundError, FileExistsError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None

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
