"""`rexeval --help` and every subcommand's `--help` answer at once: none of them imports
torch, transformers or Ray Serve (seconds and hundreds of MB before any help appears),
nor scipy.stats or scikit-learn (over a second between them).
Nor does `rexeval study run STUDY --dry-run`, which checks a whole study's settings.
Checked in a fresh interpreter, since this test session has imported them all."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "ray.serve", "scipy.stats", "sklearn")

_SCRIPT = f"""
import json, sys
from click.testing import CliRunner
from rexeval.ray_jobs.cli import cli

def walk(cmd, path, out):
    if getattr(cmd, "hidden", False):
        return
    out.append(path)
    for name, sub in sorted(getattr(cmd, "commands", {{}}).items()):
        walk(sub, [*path, name], out)

paths = []
walk(cli, [], paths)
report = []
for path in paths:
    res = CliRunner().invoke(cli, [*path, "--help"])
    report.append({{"command": " ".join(["rexeval", *path]), "exit": res.exit_code,
                    "names_listed": "{{names}}" not in res.output and "{{default}}" not in res.output,
                    "heavy": [m for m in {HEAVY!r} if m in sys.modules]}})
print(json.dumps(report))
"""


def test_no_help_imports_torch_transformers_or_serve():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report) > 30  # every command, groups included
    assert [r["command"] for r in report if r["exit"] != 0 or not r["names_listed"]] == []
    # The first command after which a heavy module is loaded is the one that loaded it.
    first = next((r for r in report if r["heavy"]), None)
    assert first is None, f"{first['command']} --help imported {first['heavy']}"


def test_the_help_lists_registered_names_without_importing_them():
    """The rankers' and generators' names read from their modules' source (what --help
    lists before torch is imported) are the names the registries give once imported,
    each ranker on the side it belongs to."""
    from rexeval.models import generators, recommenders
    from rexeval.models.generators.base import GENERATORS
    from rexeval.models.recommenders.base import RANKERS, TrainableRanker
    from rexeval.registry import declared_names

    assert sorted(declared_names(*generators.SCAN)) == sorted(GENERATORS.names())
    rankers = declared_names(*recommenders.SCAN)
    trainable = sorted(n for n in RANKERS.names() if issubclass(RANKERS.lookup(n), TrainableRanker))
    assert sorted(n for n, bases in rankers.items() if "TrainableRanker" in bases) == trainable == ["bper+", "expgcn"]
    assert sorted(n for n, bases in rankers.items() if "TrainableRanker" not in bases) == sorted(
        set(RANKERS.names()) - set(trainable))


def test_the_generators_settings_facts_read_from_source_are_their_classes():
    """What a --dry-run checks a generator's settings with (its name, DEFAULTS and
    DATA_KEYS, read from the source without importing torch) is what its class holds,
    CER's inherited from PETER included; and once the registry is loaded, the facts
    come from the classes."""
    from rexeval.models.generators.base import GENERATORS
    from rexeval.models.generators.declared import declared_generators, generator_facts

    read = declared_generators()
    assert sorted(read) == sorted(GENERATORS.names())
    for key in GENERATORS.names():
        cls = GENERATORS.lookup(key)
        facts = read[key]
        assert (facts.name, facts.defaults, facts.data_keys) == (cls.name, cls.DEFAULTS, cls.DATA_KEYS), key
        assert generator_facts(key.upper()) == facts
    assert read["cer"].defaults == GENERATORS.lookup("peter").DEFAULTS
    assert read["xrec"].data_keys and "gcn_dim" in read["xrec"].data_keys


_DRY_RUN_SCRIPT = f"""
import json, sys
from click.testing import CliRunner
from rexeval.ray_jobs.cli import cli

report = []
for study, out in json.loads(sys.argv[1]):
    res = CliRunner().invoke(cli, ["study", "run", study, "--dry-run", "--out", out])
    report.append({{"study": study, "exit": res.exit_code, "output": res.output[-2000:],
                    "heavy": [m for m in {HEAVY!r} if m in sys.modules]}})
print(json.dumps(report))
"""


def test_no_study_dry_run_imports_torch_transformers_or_serve(tmp_path, monkeypatch):
    """Every study's --dry-run (which validates every step's settings, the generators'
    and the metric families' included) on planted inputs, one after the other in one
    fresh interpreter: the first study after which a heavy module is loaded loaded it."""
    from rexeval.pipelines.study.config import load_study
    from tests.pipelines.study.test_seed_studies import plant

    data = tmp_path / "data"
    monkeypatch.setenv("REXEVAL_DATA", str(data))  # where the seed studies read their inputs
    studies = sorted((REPO / "studies").glob("*.yaml"))
    assert {"demo", "seed000", "seed001", "seed002", "seed003", "seed004"} <= {s.stem for s in studies}
    runs = []
    for study in studies:
        plant(data, load_study(study))
        runs.append((str(study), str(tmp_path / "out" / study.stem)))
    out = subprocess.run([sys.executable, "-c", _DRY_RUN_SCRIPT, json.dumps(runs)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert [(r["study"], r["output"]) for r in report if r["exit"] != 0] == []
    first = next((r for r in report if r["heavy"]), None)
    assert first is None, f"study run {first['study']} --dry-run imported {first['heavy']}"
