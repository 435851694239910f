"""A real multi-process Ray cluster on this machine, started with `ray start` as a user
starts one, for tests that submit jobs to it or take one of its nodes away.

Why not `ray.init()` or `ray.cluster_utils.Cluster`: those run in the test's process,
where the session's own local Ray (tests/conftest.py `ray_session`) may already live,
and they skip what users go through (the `ray start` CLI, the job server in the
dashboard, a working-dir upload). So everything here is a subprocess, and the test talks
to the cluster only through the CLI and the dashboard's HTTP API.

Two Rays side by side must not collide, so each node gets:
  * its own SHORT temp dir (`/tmp/rxXXXXXX/<node>`): Ray puts unix sockets under
    `<temp>/session_*/sockets/`, and a socket path must stay below 107 characters;
  * a port for every listener Ray would otherwise take by default (GCS 6379, client
    server 10001, dashboard 8265, the dashboard's and autoscaler's metrics 44227 and
    44217, agents, metrics export, node and object managers) and its own worker port range, all from a block of free ports in 20000-31999: above Ray's
    default worker range (10002-19999, which the session Ray uses) and below the
    kernel's ephemeral range (where Ray's random ports and outgoing connections live).

Listening addresses. A single-node cluster stays on the loopback interface: with
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's "no multi-node" switch) `ray start` keeps
`--node-ip-address=127.0.0.1`, and every Ray listener then binds 127.0.0.1 only. A
multi-node cluster cannot: Ray 2.60 refuses `ray start --address` under that switch, and
otherwise resolves 127.0.0.1 to the machine's routable address and binds its gRPC
servers (GCS, raylet, object manager, agents) on all interfaces, as the session's own
`ray.init()` does. The dashboard and the job server are on 127.0.0.1 either way.

Nodes that share no disk. On a real cluster every node has its own disk; here all nodes
are processes of one machine, so a worker node can be started in a mount namespace of
its own (`add_node(hide=[...])`: `unshare -m`, then a tmpfs over every hidden folder),
where the cluster's temp dirs (the head's sessions, logs and unpacked working dir) and
the test's run folder are empty. A job that writes a file with pathlib on that node, or
reads one the head wrote, fails there as it would on a real cluster. Its raylet and
workers inherit the namespace; everything else (the venv, the checkout, ../shared, the
network) it still sees. It gets a PID namespace of its own as well (`unshare -p
--mount-proc`), as another machine would: a driver started there looks for "the raylet
on this host" by listing processes, and would otherwise find the head's (Ray prefers
the head when several share an address) and fail on its sockets, which are hidden. The
namespace lives while its first process does, so `ray start` runs under a shell that
then becomes a reaper of the node's orphans (`REAPER`), held by an `unshare
--kill-child` that `stop()` kills.

Teardown never uses `ray stop`, which stops every Ray on the machine (the session's
included): it kills the processes of this cluster only (those whose command line names
one of its temp dirs or its GCS port, and their children), then removes the temp dirs.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.doubles.ports import CLUSTER_PORT_HIGH, CLUSTER_PORT_LOW

VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")

PORT_LOW, PORT_HIGH = CLUSTER_PORT_LOW, CLUSTER_PORT_HIGH  # below the session Serve ports (ports.py)
WORKER_PORTS = 100  # workers (and drivers) of one node at once; these tests need ~20
NAMED_PORTS = ("node_manager", "object_manager", "agent_listen", "agent_grpc", "metrics_export",
               "runtime_env_agent")
HEAD_PORTS = ("gcs", "dashboard", "client_server", "dashboard_metrics", "autoscaler_metrics")
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
_TAKEN: set[int] = set()


def cluster_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of `ray start` and of every CLI call: offline models, no token
    auth (Ray 2.60 enables it by default), the venv's `rexeval` first on PATH (a job's
    entrypoint runs it), and no RAY_ADDRESS of the session Ray to mislead the CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER"))}
    env.update({"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
                "PATH": os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])})
    env.update(extra or {})
    return env


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_ports(n: int, tries: int = 200) -> list[int]:
    """`n` consecutive ports that are free now and not handed out before in this process.

    A random block (not the OS's port 0) so that a worker port range is contiguous, and
    so that two test processes rarely pick the same block."""
    for _ in range(tries):
        start = random.randrange(PORT_LOW, PORT_HIGH - n)
        block = list(range(start, start + n))
        if not _TAKEN.intersection(block) and all(_port_is_free(p) for p in block):
            _TAKEN.update(block)
            return block
    raise RuntimeError(f"no block of {n} free ports in {PORT_LOW}-{PORT_HIGH}")


@dataclass
class RayNode:
    """One `ray start`ed node: its temp dir (which names its processes) and its ports."""

    name: str
    temp_dir: Path
    ports: dict[str, int]
    num_cpus: int
    head: bool = False
    resources: dict[str, float] = field(default_factory=dict)
    holder: subprocess.Popen | None = None  # what keeps an isolated node's namespaces alive

    def start_args(self) -> list[str]:
        p = self.ports
        return [f"--temp-dir={self.temp_dir}", "--node-ip-address=127.0.0.1", f"--num-cpus={self.num_cpus}",
                f"--node-manager-port={p['node_manager']}", f"--object-manager-port={p['object_manager']}",
                f"--dashboard-agent-listen-port={p['agent_listen']}",
                f"--dashboard-agent-grpc-port={p['agent_grpc']}",
                f"--metrics-export-port={p['metrics_export']}",
                f"--runtime-env-agent-port={p['runtime_env_agent']}",
                f"--min-worker-port={p['min_worker']}", f"--max-worker-port={p['max_worker']}",
                *([f"--resources={json.dumps(self.resources)}"] if self.resources else [])]


@dataclass
class LocalCluster:
    """A head (with the dashboard and job server) and any number of worker nodes."""

    root: Path
    env: dict[str, str]
    object_store_mb: int = 300
    system_config: dict[str, Any] | None = None
    nodes: list[RayNode] = field(default_factory=list)

    # -- addresses --------------------------------------------------------------------

    @property
    def head(self) -> RayNode:
        return self.nodes[0]

    @property
    def gcs_address(self) -> str:
        """What `ray start --address` and `RAY_ADDRESS` take."""
        return self.gcs_address_of(self.head)

    @staticmethod
    def gcs_address_of(head: RayNode) -> str:
        return f"127.0.0.1:{head.ports['gcs']}"

    @property
    def dashboard_url(self) -> str:
        """What `ray job submit --address` takes."""
        return f"http://127.0.0.1:{self.head.ports['dashboard']}"

    # -- starting ---------------------------------------------------------------------

    def _new_node(self, num_cpus: int, head: bool, resources: dict[str, float] | None = None) -> RayNode:
        names = NAMED_PORTS + (HEAD_PORTS if head else ())
        block = reserve_ports(len(names) + WORKER_PORTS)
        ports = dict(zip(names, block))
        ports.update(min_worker=block[len(names)], max_worker=block[-1])
        name = f"n{len(self.nodes)}"
        node = RayNode(name, self.root / name, ports, num_cpus, head, dict(resources or {}))
        node.temp_dir.mkdir(parents=True)
        return node

    @property
    def loopback_only(self) -> bool:
        """Started with Ray's single-node switch: everything listens on 127.0.0.1 only."""
        return self.env.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"

    def _ray_start(self, node: RayNode, args: list[str], timeout: float, env: dict[str, str] | None = None,
                   hide: list[Path] | None = None) -> None:
        cmd = [RAY, "start", *args, *node.start_args(), f"--object-store-memory={self.object_store_mb << 20}",
               "--disable-usage-stats"]
        self.nodes.append(node)  # before starting: a half-started node is torn down too
        if hide:
            self._start_isolated(node, cmd, hide, {**self.env, **(env or {})}, timeout)
            return
        res = subprocess.run(cmd, env={**self.env, **(env or {})}, capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")

    def _start_isolated(self, node: RayNode, cmd: list[str], hide: list[Path], env: dict[str, str],
                        timeout: float) -> None:
        """`ray start` in the node's own namespaces; returns when it has exited, leaving the
        holder process (the namespaces' life) running. `ray start`'s output goes to a file
        beside the cluster root, which the node cannot hide."""
        log = self.root.with_name(f"{self.root.name}-{node.name}.log")
        with open(log, "w") as out:
            node.holder = subprocess.Popen(isolated(cmd, hide, node.temp_dir), env=env, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, stderr=out, text=True)
        line = ""
        deadline = time.monotonic() + timeout
        while not line.startswith("ray start exited "):
            if time.monotonic() > deadline or node.holder.poll() is not None:
                raise RuntimeError(f"`{' '.join(cmd)}` in its own namespaces did not finish:\n{log.read_text()}")
            line = node.holder.stdout.readline() or line
        node.holder.stdout.close()
        if line.split()[-1] != "0":
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({line.split()[-1]}):\n{log.read_text()}")

    def start_head(self, num_cpus: int = 2, timeout: float = 60,
                   autoscaling: dict[str, dict] | None = None, idle_timeout_s: float = 10) -> RayNode:
        """`ray start --head` with the dashboard (the job server lives in it), on 127.0.0.1;
        returns once the job server answers.

        `autoscaling`: worker node types (name -> {"resources", "min_workers",
        "max_workers"}) that Ray's own autoscaler starts and stops on this machine
        (`autoscaling_config`): the head then runs the autoscaler's monitor with the fake
        multi-node provider, as `ray.cluster_utils.AutoscalingCluster` does, but without its
        `ray stop --force` and on this cluster's ports and temp dir."""
        node = self._new_node(num_cpus, head=True)
        p = node.ports
        args = ["--head", f"--port={p['gcs']}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                f"--dashboard-port={p['dashboard']}", f"--ray-client-server-port={p['client_server']}"]
        if self.system_config:
            args.append(f"--system-config={json.dumps(self.system_config)}")
        # The dashboard's and the autoscaler's metrics ports have no flag, only these variables.
        env = {"DASHBOARD_METRIC_PORT": str(p["dashboard_metrics"]),
               "AUTOSCALER_METRIC_PORT": str(p["autoscaler_metrics"])}
        if autoscaling is not None:
            config = self.root / "autoscaling.json"
            config.write_text(json.dumps(autoscaling_config(num_cpus, autoscaling, self.gcs_address_of(node),
                                                            idle_timeout_s)))
            args.append(f"--autoscaling-config={config}")
            env.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"})
        self._ray_start(node, args, timeout, env=env)
        wait_for(lambda: self._get("/api/version") is not None, timeout, "the dashboard's job server")
        return node

    def add_node(self, num_cpus: int = 2, timeout: float = 60, hide: list[Path] | None = None,
                 resources: dict[str, float] | None = None) -> RayNode:
        """`ray start --address=<head>` for one more node on this machine; returns once
        the cluster lists it alive. `hide`: folders this node must not see (it then runs
        in namespaces of its own, with the cluster's temp dirs hidden as well: a node that
        shares no disk with the head, see the module docstring). `resources`: custom
        resources it offers (what `ray job submit --entrypoint-resources` can ask for to
        put a driver there)."""
        if self.loopback_only:
            raise RuntimeError("a loopback-only cluster has one node (see the module docstring)")
        node = self._new_node(num_cpus, head=False, resources=resources)
        before = len(self.alive_nodes())
        hidden = [self.root, *(hide or [])] if hide is not None else None
        self._ray_start(node, [f"--address={self.gcs_address}"], timeout, hide=hidden)
        wait_for(lambda: len(self.alive_nodes()) > before, timeout, f"node {node.name} to join")
        return node

    # -- looking at it ------------------------------------------------------------------

    def _get(self, path: str) -> Any:
        """GET a dashboard endpoint as JSON; None while it does not answer."""
        try:
            with urllib.request.urlopen(self.dashboard_url + path, timeout=5) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def state(self, kind: str) -> list[dict]:
        """Rows of Ray's state API ("nodes", "actors", ...), through the dashboard."""
        got = self._get(f"/api/v0/{kind}?detail=1&limit=10000")
        return ((got or {}).get("data") or {}).get("result", {}).get("result", [])

    def alive_nodes(self) -> list[dict]:
        """The nodes the GCS counts as alive."""
        return [r for r in self.state("nodes") if r.get("state") == "ALIVE"]

    def node_id(self, node: RayNode) -> str:
        """Ray's id of `node`, as its raylet was told it (`--node_id=`)."""
        for arg in self.raylet(node).cmdline():
            if arg.startswith("--node_id="):
                return arg.split("=", 1)[1]
        raise LookupError(f"the raylet of node {node.name} names no node id")

    def processes(self, node: RayNode | None = None) -> list[psutil.Process]:
        """This cluster's processes (or one node's): those whose command line names its
        temp dir (or, for the whole cluster, its GCS port: the client server names only
        that), and all their children (workers rename themselves `ray::...`)."""
        dirs = [str(n.temp_dir) + os.sep for n in ([node] if node else self.nodes)]
        gcs = f":{self.head.ports['gcs']}" if node is None and self.nodes else None
        roots = []
        for proc in psutil.process_iter(["cmdline"]):
            args = proc.info["cmdline"] or []
            if any(d in a + os.sep for a in args for d in dirs) or (gcs and any(a.endswith(gcs) for a in args)):
                roots.append(proc)
        found = {p.pid: p for p in roots}
        for p in roots:
            with contextlib.suppress(psutil.Error):
                found.update({c.pid: c for c in p.children(recursive=True)})
        found.pop(os.getpid(), None)
        return list(found.values())

    def raylet(self, node: RayNode) -> psutil.Process:
        """The raylet of `node`: the process that makes it a node."""
        for proc in self.processes(node):
            with contextlib.suppress(psutil.Error):
                if proc.name() == "raylet":
                    return proc
        raise LookupError(f"no raylet of node {node.name} ({node.temp_dir})")

    def kill_raylet(self, node: RayNode) -> int:
        """kill -9 the node's raylet, as when a machine disappears; returns its pid."""
        proc = self.raylet(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return proc.pid

    # -- stopping ---------------------------------------------------------------------

    def stop(self) -> None:
        """Kill this cluster's processes (never `ray stop`: it stops every Ray on the
        machine) and remove its temp dirs. Safe to call twice or after a failed start."""
        for node in self.nodes:  # an isolated node's namespaces end with their holder
            if node.holder is not None and node.holder.poll() is None:
                node.holder.kill()
                node.holder.wait(10)
        for _ in range(3):  # a raylet may start a worker while we look: look again
            procs = self.processes() if self.nodes else []
            if not procs:
                break
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
        for log in self.root.parent.glob(f"{self.root.name}-*.log"):
            log.unlink()

    # -- the CLI and jobs ---------------------------------------------------------------

    def ray(self, *args: str, cwd: str | Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the `ray` CLI in this cluster's environment (output captured)."""
        return subprocess.run([RAY, *args], env=self.env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def submit(self, *entrypoint: str, cwd: str | Path, runtime_env_json: str,
               entrypoint_resources: dict[str, float] | None = None) -> str:
        """`ray job submit --address <dashboard> --working-dir . --runtime-env-json ...
        --no-wait -- <entrypoint>` run in `cwd`, as a user submits; the submission id it
        prints. `entrypoint_resources`: where the driver must run (a node that offers them)."""
        where = ["--entrypoint-resources", json.dumps(entrypoint_resources)] if entrypoint_resources else []
        res = self.ray("job", "submit", "--address", self.dashboard_url, "--working-dir", ".",
                       "--runtime-env-json", runtime_env_json, *where, "--no-wait", "--", *entrypoint, cwd=cwd)
        out = res.stdout + res.stderr
        found = re.search(r"Job '([^']+)' submitted successfully", out)
        if res.returncode != 0 or not found:
            raise RuntimeError(f"ray job submit failed ({res.returncode}):\n{out}")
        return found.group(1)

    def job_client(self):
        """Ray's HTTP client of the job server (no `ray.init`: this process may hold the
        session's own Ray)."""
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard_url)

    def wait_job(self, submission_id: str, timeout: float = 180) -> tuple[Any, str]:
        """Poll a job until it ends (bounded: a stuck job fails the test instead of
        hanging it); its JobDetails and its whole log."""
        client = self.job_client()
        info = wait_for(lambda: (i := client.get_job_info(submission_id)).status.is_terminal() and i,
                        timeout, f"job {submission_id} to end", every=0.5)
        return info, client.get_job_logs(submission_id)


def autoscaling_config(head_cpus: int, worker_types: dict[str, dict], gcs_address: str,
                       idle_timeout_s: float) -> dict[str, Any]:
    """The cluster config Ray's autoscaler reads (`ray start --autoscaling-config`), for
    its fake multi-node provider: worker nodes are raylets it starts on this machine
    (joining `gcs_address`) when tasks, actors or jobs ask for resources no node has, and
    stops after `idle_timeout_s` idle. The fields are those of Ray's own example config
    for that provider (ray/autoscaler/_private/fake_multi_node/example.yaml, which the
    wheel does not ship)."""
    types = {name: {"node_config": {}, "min_workers": 0, **spec} for name, spec in worker_types.items()}
    types["ray.head.default"] = {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0}
    return {"cluster_name": "rexeval-autoscaling-test",
            "max_workers": sum(int(t.get("max_workers", 0)) for t in worker_types.values()),
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": gcs_address},
            "available_node_types": types, "head_node_type": "ray.head.default", "auth": {},
            "upscaling_speed": 1.0, "idle_timeout_minutes": idle_timeout_s / 60.0, "docker": {},
            "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": []}


def can_isolate() -> bool:
    """Whether this machine lets a node run in mount and PID namespaces of its own (root,
    or unprivileged user namespaces with mounts)."""
    probe = subprocess.run(["unshare", "-m", "-p", "--fork", "--mount-proc", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt && umount /mnt"], capture_output=True)
    return probe.returncode == 0


# The namespace's first process once `ray start` has exited: it reaps the node's orphans
# (its raylet among them, once killed), which nothing else in the namespace would.
REAPER = ("import os, time\n"
          "while True:\n"
          "    try:\n"
          "        os.wait()\n"
          "    except ChildProcessError:\n"
          "        time.sleep(0.2)\n")


def isolated(cmd: list[str], hide: list[Path], own_temp: Path) -> list[str]:
    """`cmd` run in new mount and PID namespaces where every folder of `hide` is an empty
    tmpfs, then `own_temp` is made again inside it (the node's own, empty temp dir). It
    prints "ray start exited <code>" when `cmd` ends, then reaps orphans: the namespaces
    (and so the node) live until the returned command's process is killed."""
    mounts = " && ".join(f"mount -t tmpfs -o size=4g tmpfs {shlex.quote(str(h))}" for h in hide)
    script = (f"{mounts} && mkdir -p {shlex.quote(str(own_temp))} && \"$@\" >&2; "
              f"echo \"ray start exited $?\"; exec {shlex.quote(sys.executable)} -c {shlex.quote(REAPER)} "
              ">/dev/null 2>&1")
    return ["unshare", "-m", "-p", "--fork", "--mount-proc", "--kill-child", "--propagation", "private",
            "sh", "-c", script, "isolated", *cmd]


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    """Poll `check` until it returns something true; a bounded wait that names what it
    waited for, so a broken cluster fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


@contextlib.contextmanager
def local_cluster(head_cpus: int = 2, worker_cpus: tuple[int, ...] = (), *,
                  env: dict[str, str] | None = None, object_store_mb: int = 300,
                  system_config: dict[str, Any] | None = None,
                  hide: list[Path] | None = None,
                  worker_resources: dict[str, float] | None = None,
                  autoscaling: dict[str, dict] | None = None, idle_timeout_s: float = 10) -> Iterator[LocalCluster]:
    """A started cluster (a head with `head_cpus`, one worker node per `worker_cpus`
    entry), stopped on exit however the block ends. A head alone listens on 127.0.0.1
    only. `system_config`: Ray settings for the whole cluster (`ray start --head
    --system-config`), e.g. faster health checks. `hide`: the worker nodes share no disk
    with the head: each runs in its own mount namespace where these folders and the
    cluster's temp dirs are empty (see the module docstring). `worker_resources`: custom
    resources every worker node offers. `autoscaling`: worker node types Ray's autoscaler
    starts on demand and stops when idle for `idle_timeout_s` (`LocalCluster.start_head`)."""
    env = {**({} if worker_cpus or autoscaling else LOOPBACK_ONLY), **(env or {})}
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="rx", dir="/tmp")), cluster_env(env),
                           object_store_mb=object_store_mb, system_config=system_config)
    try:
        cluster.start_head(head_cpus, autoscaling=autoscaling, idle_timeout_s=idle_timeout_s)
        for cpus in worker_cpus:
            cluster.add_node(cpus, hide=hide, resources=worker_resources)
        yield cluster
    finally:
        cluster.stop()
