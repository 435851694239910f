"""Every default is written once, in its config: a command's --help reads it from there
(`common.defaults_from`), so the help cannot drift from what the job does."""
from __future__ import annotations

import re

import click
import pytest
from pydantic import BaseModel

from rexeval.ray_jobs.cli import cli
from rexeval.ray_jobs.common import DEFAULT, defaults_from, shown_default


def _commands(cmd=cli, path=()):
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), cmd


NUMBER_DEFAULT = re.compile(r"\(default:? (-?[0-9][0-9.e-]*)(?=[);:,])")


def test_every_command_with_settings_reads_its_defaults_from_them():
    with_config = {name: cmd for name, cmd in _commands() if getattr(cmd, "rexeval_config", None)}
    assert len(with_config) >= 20, sorted(with_config)
    checked = 0
    for name, cmd in with_config.items():
        fields = cmd.rexeval_config.model_fields
        for p in cmd.params:
            if not isinstance(p, click.Option) or not p.help:
                continue
            assert DEFAULT not in p.help, f"rexeval {name} {p.opts[0]}: an unfilled default"
            m = NUMBER_DEFAULT.search(p.help)
            if m and p.name in fields:
                checked += 1
                default = fields[p.name].get_default(call_default_factory=True)
                assert float(m.group(1)) == float(default), (
                    f"rexeval {name} {p.opts[0]}: help says default {m.group(1)}, "
                    f"{cmd.rexeval_config.__name__}.{p.name} is {default}")
    assert checked > 60


def test_the_help_shows_the_configs_value_and_refuses_an_option_without_a_field():
    class Settings(BaseModel):
        k: int = 128
        tau: float = 0.9
        split: str = "test"

    @defaults_from(Settings)
    @click.command()
    @click.option("--k", type=int, help="Neighbours (default {default}).")
    @click.option("--tau", type=float, help="Threshold (default {default}; strictly above).")
    @click.option("--split", help="Split (default {default}).")
    def cmd(**_):
        pass

    helps = {p.name: p.help for p in cmd.params}
    assert helps == {"k": "Neighbours (default 128).", "tau": "Threshold (default 0.9; strictly above).",
                     "split": "Split (default test)."}
    assert cmd.rexeval_config is Settings
    assert shown_default(0.01) == "0.01" and shown_default(5000) == "5000"

    with pytest.raises(TypeError, match="no field 'nope'"):
        defaults_from(Settings)(click.command()(click.option("--nope", help="(default {default})")(lambda **_: None)))
