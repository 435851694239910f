"""cluster.yaml as `ray up` runs it, without a cloud: every node's setup and start commands,
chosen per node type and wrapped exactly as Ray's launcher does (its own helpers), run in
a sandbox HOME with stand-ins for uv, pip and ray that record what they were asked.

What must hold on every node type (the head, cpu_worker, gpu_worker):
- the setup makes the checkout's .venv and puts its bin/ first on PATH in ~/.bashrc, so
  the `ray stop` / `ray start` of the start commands are the venv's ray, and `rexeval`
  (what `ray job submit -- rexeval ...` runs) resolves to the venv from the PATH the
  raylet inherits;
- the head's dashboard and Jobs API listen on 127.0.0.1:8265, where the header's
  `ray dashboard cluster.yaml` tunnel and `ray job submit --address` point;
- REXEVAL_SERVE_TOKEN reaches every `ray start` from the node's environment or the
  token file the head makes once (workers get its copy): never written in the file.
Left out: the cloud itself, the download of uv and the package installs.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.test_manifests import CLUSTER_YAML, cluster_yaml

REMOTE = "/home/ubuntu/rexeval"          # where file_mounts puts the checkout
HEAD_IP = "10.0.0.1"
TOKEN_ENV = "REXEVAL_SERVE_TOKEN"
# What a stock Ubuntu ~/.bashrc starts with: lines after it run only in interactive
# shells, which is why the launcher's `bash -i` matters for the PATH line.
UBUNTU_BASHRC = "case $- in\n    *i*) ;;\n      *) return;;\nesac\n"


# -- the launcher's own view of the config ------------------------------------------------


def prepared() -> dict:
    """cluster.yaml after `ray up`'s prepare_config (defaults filled, setup lists merged)."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(cluster_yaml())


def node_commands(config: dict, node_type: str) -> tuple[list[str], list[str]]:
    """(setup commands, start commands) for one node type, as the launcher picks them:
    the head runs setup_commands + head_setup_commands (`ray up`, commands.py); a worker
    runs its node type's own worker_setup_commands when it has them, else setup_commands
    + worker_setup_commands (StandardAutoscaler._get_node_type_specific_fields), and the
    start commands with RAY_HEAD_IP exported (with_head_node_ip)."""
    from ray.autoscaler._private.util import with_head_node_ip

    if node_type == config["head_node_type"]:
        return list(config["head_setup_commands"]), list(config["head_start_ray_commands"])
    own = config["available_node_types"][node_type]
    setup = own.get("worker_setup_commands", config["worker_setup_commands"])
    return list(setup), with_head_node_ip(config["worker_start_ray_commands"], HEAD_IP)


def remote_shell(cmd: str, env_vars: dict | None = None) -> str:
    """The line the node's login shell gets over SSH (SSHCommandRunner.run)."""
    from ray.autoscaler._private.command_runner import _with_environment_variables, _with_interactive

    if env_vars:
        cmd = _with_environment_variables(cmd, env_vars)
    return " ".join(_with_interactive(cmd))


# -- the sandbox ----------------------------------------------------------------------------


RECORDER = """#!{python}
import json, os, shutil, sys
with open(os.environ.get("SANDBOX_LOG", os.path.expanduser("~/calls.jsonl")), "a") as f:
    f.write(json.dumps({{"tool": {tool!r}, "exe": sys.argv[0], "argv": sys.argv[1:],
                        "token": os.environ.get("{token_env}"), "omp_wait": os.environ.get("OMP_WAIT_POLICY"),
                        "rexeval": shutil.which("rexeval"), "cwd": os.getcwd()}}) + "\\n")
{extra}
"""

# `uv venv ... .venv`: a venv whose python is this interpreter and whose pip and ray record.
UV_EXTRA = """
if sys.argv[1:2] == ["venv"]:
    bin_dir = os.path.join(os.getcwd(), sys.argv[-1], "bin")
    os.makedirs(bin_dir, exist_ok=True)
    os.symlink({python!r}, os.path.join(bin_dir, "python"))
    for tool in ("pip", "ray"):
        with open(os.path.join(bin_dir, tool), "w") as out:
            out.write(open(os.path.join({stubs!r}, tool)).read())
        os.chmod(os.path.join(bin_dir, tool), 0o755)
"""
# `pip install -e .`: the console script `rexeval` appears in the venv.
PIP_EXTRA = """
if "install" in sys.argv and "-e" in sys.argv:
    script = os.path.join(os.path.dirname(sys.argv[0]), "rexeval")
    with open(script, "w") as out:
        out.write("#!/bin/sh\\n")
    os.chmod(script, 0o755)
"""


class Node:
    """One machine: its own HOME, the checkout at REMOTE's stand-in, a stock ~/.bashrc."""

    def __init__(self, root: Path, name: str):
        self.home = root / name / "home"
        self.remote = root / name / "rexeval"
        self.stubs = root / name / "stubs"
        for d in (self.home, self.remote, self.stubs, self.home / ".local" / "bin"):
            d.mkdir(parents=True, exist_ok=True)
        (self.home / ".bashrc").write_text(UBUNTU_BASHRC)
        extras = {"uv": UV_EXTRA.format(python=sys.executable, stubs=str(self.stubs)),
                  "pip": PIP_EXTRA, "ray": ""}
        for tool, extra in extras.items():
            path = self.stubs / tool
            path.write_text(RECORDER.format(python=sys.executable, tool=tool, token_env=TOKEN_ENV, extra=extra))
            path.chmod(0o755)
        # uv is already in ~/.local/bin, so the setup does not download it.
        shutil.copy(self.stubs / "uv", self.home / ".local" / "bin" / "uv")

    def localize(self, cmd: str) -> str:
        return cmd.replace(REMOTE, str(self.remote))

    def run(self, cmd: str, env_vars: dict | None = None, environ: dict | None = None) -> None:
        env = {"HOME": str(self.home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        env.update(environ or {})
        line = remote_shell(self.localize(cmd), env_vars)
        proc = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{cmd!r} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"

    def calls(self, tool: str | None = None) -> list[dict]:
        log = self.home / "calls.jsonl"
        rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return [r for r in rows if tool is None or r["tool"] == tool]

    @property
    def token_file(self) -> Path:
        return self.home / ".rexeval" / "serve-token"


def bring_up(root: Path, node_type: str, config: dict, head: Node | None = None,
             environ: dict | None = None) -> Node:
    """What `ray up` (the head) or the head's autoscaler (a worker) does to a new node."""
    node = Node(root, node_type)
    if head is not None:  # cluster_synced_files: from the head's HOME to the worker's
        for path in config.get("cluster_synced_files", []):
            rel = Path(path.replace("~/", "", 1))
            if (head.home / rel).exists():
                (node.home / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(head.home / rel, node.home / rel)
    setup, start = node_commands(config, node_type)
    for cmd in setup:
        node.run(cmd, environ=environ)
    # The updater sets this on the head's start commands (usage stats off: --disable-usage-stats).
    usage = {"RAY_USAGE_STATS_ENABLED": 0} if node_type == config["head_node_type"] else None
    for cmd in start:
        node.run(cmd, env_vars=usage, environ=environ)
    return node


def ray_starts(node: Node) -> list[dict]:
    return [c for c in node.calls("ray") if c["argv"][:1] == ["start"]]


def parse_ray_start(argv: list[str]):
    """`ray start`'s own option parser (an unknown or misspelt flag raises)."""
    from ray.scripts.scripts import start

    return start.make_context("start", list(argv[1:])).params


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The head and one worker of each type, brought up in order."""
    config = prepared()
    root = tmp_path_factory.mktemp("cluster")
    head = bring_up(root, config["head_node_type"], config)
    workers = {t: bring_up(root, t, config, head=head)
               for t in config["available_node_types"] if t != config["head_node_type"]}
    return config, head, workers


# ==========================================================================================


def test_every_node_type_runs_the_venvs_ray_and_finds_rexeval(cluster):
    config, head, workers = cluster
    for name, node in {"head": head, **workers}.items():
        venv_bin = node.remote / ".venv" / "bin"
        assert (venv_bin / "python").exists(), f"{name}: the setup made no {REMOTE}/.venv"
        calls = node.calls("ray")
        assert [c["argv"][0] for c in calls] == ["stop", "start"], f"{name}: {calls}"
        for c in calls:
            assert Path(c["exe"]) == venv_bin / "ray", f"{name}: `ray {c['argv'][0]}` ran {c['exe']}, not the venv's"
        start = ray_starts(node)[0]
        assert start["rexeval"] and Path(start["rexeval"]) == venv_bin / "rexeval", \
            f"{name}: a job's `rexeval` would resolve to {start['rexeval']!r}"
        installs = [c["argv"] for c in node.calls("pip") if "install" in c["argv"]]
        editable = [i for i, a in enumerate(installs) if "-e" in a]
        torch = [i for i, a in enumerate(installs) if "torch==2.13.0" in a]
        assert len(editable) == 1 and torch and torch[0] < editable[0], \
            f"{name}: torch (pinned) first, then rexeval once: {installs}"
        assert all("constraints.txt" in installs[i] for i in torch + editable), installs
        assert all(Path(c["cwd"]) == node.remote for c in node.calls("pip")), name


def test_each_node_type_gets_its_own_extra(cluster):
    """faiss-cpu and faiss-gpu are one module: a node gets one extra, never both."""
    _, head, workers = cluster
    for name, node, extra in [("head", head, ".[cpu]"), ("cpu_worker", workers["cpu_worker"], ".[cpu]"),
                              ("gpu_worker", workers["gpu_worker"], ".[gpu]")]:
        extras = {a for c in node.calls("pip") for a in c["argv"] if a.startswith(".[")}
        assert extras == {extra}, f"{name}: {extras}"


def test_the_path_line_is_written_once(tmp_path):
    config = prepared()
    node = Node(tmp_path, "head")
    setup, _ = node_commands(config, "head")
    for _ in range(2):  # `ray up` again on a running cluster
        for cmd in setup:
            node.run(cmd)
    lines = (node.home / ".bashrc").read_text().splitlines()
    path_lines = [x for x in lines if "PATH=" in x]
    assert path_lines == [f"export PATH={node.remote}/.venv/bin:$PATH"], path_lines
    assert lines[:4] == UBUNTU_BASHRC.splitlines(), "the stock ~/.bashrc was changed, not appended to"


def test_dashboard_where_the_header_says(cluster):
    from ray.scripts.scripts import dashboard

    _, head, _ = cluster
    params = parse_ray_start(ray_starts(head)[0]["argv"])
    assert params["head"] is True and params["include_dashboard"] is True
    assert (params["dashboard_host"], params["dashboard_port"]) == ("127.0.0.1", 8265), \
        "the Jobs API runs any code it is sent: loopback only, reached through `ray dashboard`"
    tunnel = {p.name: p.default for p in dashboard.params}
    assert tunnel["remote_port"] == params["dashboard_port"] == tunnel["port"]
    header = CLUSTER_YAML.read_text().split("\ncluster_name:")[0]
    assert "ray dashboard cluster.yaml" in header
    assert re.search(r"ray job submit --address http://127\.0\.0\.1:8265 --working-dir \. ", header)


def test_workers_join_the_head(cluster):
    _, _, workers = cluster
    for name, node in workers.items():
        params = parse_ray_start(ray_starts(node)[0]["argv"])
        assert params["address"] == f"{HEAD_IP}:6379", name
        assert not params["head"], name


def test_every_ray_start_gets_the_heads_serve_token(cluster):
    _, head, workers = cluster
    token = head.token_file.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert head.token_file.stat().st_mode & 0o777 == 0o600
    assert (head.home / ".rexeval").stat().st_mode & 0o777 == 0o700
    for name, node in {"head": head, **workers}.items():
        assert ray_starts(node)[0]["token"] == token, f"{name}: ray start without the head's token"
        # ... and with OpenMP threads that sleep while they wait, as a local Ray's workers.
        assert ray_starts(node)[0]["omp_wait"] == "PASSIVE", name


def test_the_token_is_made_once_and_the_nodes_environment_wins(tmp_path):
    config = prepared()
    head = bring_up(tmp_path / "a", "head", config)
    first = head.token_file.read_text()
    setup, start = node_commands(config, "head")
    for cmd in setup + start:
        head.run(cmd)
    assert head.token_file.read_text() == first, "a second `ray up` replaced the token"
    own = bring_up(tmp_path / "b", "head", config, environ={TOKEN_ENV: "token-from-the-environment"})
    assert ray_starts(own)[0]["token"] == "token-from-the-environment"


def test_no_secret_is_written_in_cluster_yaml():
    text = CLUSTER_YAML.read_text()
    assert not re.search(r"(?i)(token|secret|password|AWS_SECRET_ACCESS_KEY)\s*[=:]\s*['\"]?[0-9a-zA-Z/+]{16,}", text)
    config = cluster_yaml()
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    exports = [c for c in starts if TOKEN_ENV in c]
    assert exports and all(f"${{{TOKEN_ENV}:-" in c for c in exports), exports


def test_the_checkouts_ignored_files_stay_behind():
    config = cluster_yaml()
    assert config["file_mounts"] == {REMOTE: "."}
    assert ".gitignore" in config.get("rsync_filter", [])
    assert ".venv/" in (CLUSTER_YAML.parent / ".gitignore").read_text().splitlines()


def test_the_sandbox_catches_a_worker_type_without_the_common_setup(tmp_path):
    """A node type's own worker_setup_commands replace the common ones: the mistake
    cluster.yaml once had (GPU workers ran pip in a venv nobody made) fails here."""
    config = prepared()
    config["available_node_types"]["gpu_worker"]["worker_setup_commands"] = \
        config["available_node_types"]["gpu_worker"]["worker_setup_commands"][-1:]
    with pytest.raises(AssertionError, match="failed"):
        bring_up(tmp_path, "gpu_worker", config, head=None)
