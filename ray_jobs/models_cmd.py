"""`rexeval models`: see which model plays each role, where it lives, and prepare caches.

Why: before a long job it should be obvious which checkpoints a profile will load,
whether each one is usable offline on this machine, and which roles are empty. No Ray
here: these commands only read files and, for `prepare`, convert packaged models.
"""
from __future__ import annotations

import sys
import time

import click

from rexeval.models.profiles import ProfileError, available_profiles, load_profile, parse_overrides
from rexeval.models.refs import ModelUnavailable, offline_status, resolve
from rexeval.ray_jobs.common import InputMistake

MODEL_OPT_HELP = ("Override one role, as ROLE=REF (a local path, a packaged model name or a "
                  "Hugging Face id); ROLE=none clears it. Repeatable.")
CACHE_OPT_HELP = ("Folder for converted models (default: $REXEVAL_CACHE/models or "
                  "~/.cache/rexeval/models).")


def _load(name: str, overrides: tuple[str, ...]):
    try:
        return load_profile(name, parse_overrides(overrides))
    except ProfileError as exc:
        raise click.UsageError(str(exc)) from None


def _row(role: str, ref: str | None, profile, *, prepare: bool, cache_dir) -> tuple[str, bool]:
    """One printable line for a role, and whether it is usable offline."""
    if ref is None:
        why = profile.notes.get(role, "no model in this profile")
        return f"  {role:<18} -        NOT SET: {why} (pass --model {role}=/path/to/checkpoint)", False
    try:
        r = resolve(ref, prepare=prepare, cache_dir=cache_dir)
    except ModelUnavailable as exc:
        return f"  {role:<18} {ref}\n  {'':<18} MISSING: {exc}", False
    ok, why = offline_status(r)
    loc = "" if r.kind == "hub" else f"\n  {'':<18} -> {r.location}"
    return f"  {role:<18} {r.kind:<8} {ref}{loc}\n  {'':<18} offline: {'yes' if ok else 'no'} ({why})", ok


@click.group("models")
def models_group() -> None:
    """Inspect model profiles, resolve model references, prepare offline caches."""


@models_group.command("list")
@click.option("--profile", "profiles", multiple=True,
              help="Profile to show (repeatable; default: all profiles).")
@click.option("--model", "overrides", multiple=True, metavar="ROLE=REF", help=MODEL_OPT_HELP)
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help=CACHE_OPT_HELP)
def list_cmd(profiles: tuple[str, ...], overrides: tuple[str, ...], cache_dir: str | None) -> None:
    """Print every role of each profile with its resolved location and offline status.

    Nothing is downloaded or converted.
    """
    for name in profiles or tuple(available_profiles()):
        prof = _load(name, overrides)
        click.echo(f"profile {prof.name}  (llm backend: {prof.llm_backend}, "
                   f"bertscore layers: {prof.bertscore_num_layers}, "
                   f"questeval bertscore layers: {prof.questeval_bertscore_num_layers})")
        if prof.description:
            click.echo(f"  {prof.description}")
        for role, ref in prof.roles().items():
            click.echo(_row(role, ref, prof, prepare=False, cache_dir=cache_dir)[0])
        click.echo("")


@models_group.command("resolve")
@click.argument("ref")
@click.option("--prepare/--no-prepare", default=False, show_default=True,
              help="Also run one-off preparation (e.g. convert the packaged SmolLM2 GGUF).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help=CACHE_OPT_HELP)
def resolve_cmd(ref: str, prepare: bool, cache_dir: str | None) -> None:
    """Show how REF resolves: local path, packaged model, or Hugging Face hub id."""
    try:
        r = resolve(ref, prepare=prepare, cache_dir=cache_dir)
    except (ModelUnavailable, ValueError) as exc:
        raise InputMistake(str(exc)) from None
    ok, why = offline_status(r)
    click.echo(f"ref:      {r.ref}\nkind:     {r.kind}\nlocation: {r.location}")
    click.echo(f"package:  {r.package or '-'}\noffline:  {'yes' if ok else 'no'} ({why})")


@models_group.command("prepare")
@click.option("--profile", default="local", show_default=True,
              help="Profile whose packaged models to materialise.")
@click.option("--model", "overrides", multiple=True, metavar="ROLE=REF", help=MODEL_OPT_HELP)
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help=CACHE_OPT_HELP)
def prepare_cmd(profile: str, overrides: tuple[str, ...], cache_dir: str | None) -> None:
    """Convert/locate every packaged model of a profile once, and print their paths.

    Exits non-zero when a packaged model's PyPI package is missing. Hub ids are only
    reported (they are fetched by the loader on machines with hub access).
    """
    prof = _load(profile, overrides)
    t0 = time.perf_counter()
    failed = 0
    seen: dict[str, str] = {}
    for role, ref in prof.roles().items():
        if ref is None:
            click.echo(f"  {role:<18} not set ({prof.notes.get(role, 'no model in this profile')})")
            continue
        if ref not in seen:
            click.echo(f"  {role:<18} preparing {ref} ...", err=True)
            try:
                r = resolve(ref, prepare=True, cache_dir=cache_dir)
                ok, why = offline_status(r)
                seen[ref] = f"{r.kind:<8} {r.location}  [offline: {'yes' if ok else 'no'}]"
            except ModelUnavailable as exc:
                failed += 1
                seen[ref] = f"MISSING: {exc}"
        click.echo(f"  {role:<18} {seen[ref]}")
    click.echo(f"profile {prof.name}: {len(seen)} distinct model(s), {failed} missing, "
               f"{time.perf_counter() - t0:.1f} s")
    if failed:
        sys.exit(1)
