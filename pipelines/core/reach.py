"""Refuse at once a local output folder that some node of the cluster cannot see.

Why: on a cluster whose nodes share no disk, a job given `--out runs/x` writes its
shards on whichever node ran each actor, and the driver, reading markers on its own
disk, finds half of them missing hours later. A URI (`s3://`, `gs://`) or a folder every
node mounts (NFS, a shared volume) is what such a cluster needs, and this check says so
before the first job or study step starts, naming the path and the nodes that cannot see it.

How: the driver writes a small probe file with random content under the folder, then
one tiny task pinned to each other alive node (`NodeAffinitySchedulingStrategy`, not
soft) reads it back. A node that finds no file, or another file (its own disk at the
same path), cannot see the driver's folder. The probe is removed afterwards, and so are
the folders the check itself had to make. A URI, a Ray that is not started and a
one-node Ray need no probe.

A cluster that can add nodes (an autoscaler runs: a cloud cluster, KubeRay) is another
matter: the nodes that will run most of the work are not up yet, so no probe can ask
them. There a local folder is refused outright, even with the head alone up, unless the
user says it is mounted on every node: REXEVAL_SHARED_MOUNTS lists such folders
(os.pathsep between them), and a path under one of them is then probed on the nodes
alive, as on a fixed cluster.

How an autoscaler is told apart (`autoscaler_running`): every Ray head runs the
autoscaler's monitor, but without a cluster config it runs a read-only one that names
each node `node_<node id>`. The node types a real autoscaler reports are those of its
config ("ray.head.default", a KubeRay group name). `ray status` reads the same report:
the JSON the v1 monitor puts in the GCS key-value store, or the v2 autoscaler's
cluster status from the GCS.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from rexeval.storage import PathLike, is_uri, location

PROBE_PREFIX = ".rexeval-reach-"
ANSWER_SECONDS = 120.0  # a node's task must answer within this (a worker may have to start)
SHARED_MOUNTS_ENV = "REXEVAL_SHARED_MOUNTS"  # folders every node mounts at the same path
# The name the read-only monitor (no cluster config) gives each node: node_<node id, hex>.
UNTYPED_NODE = re.compile(r"node_[0-9a-f]{56}")


class UnreachablePath(ValueError):
    """A local path that some of the cluster's nodes cannot see (a ValueError, so a
    command's `user_errors` prints it as one line)."""

    def __init__(self, path: str, what: str, nodes: dict[str, str]):
        self.path, self.what, self.nodes = path, what, dict(nodes)
        listed = "; ".join(f"{node}: {why}" for node, why in sorted(nodes.items()))
        super().__init__(
            f"{what} {path} is a local folder that {len(nodes)} node(s) of the Ray cluster cannot see "
            f"({listed}): their workers would write their shards to their own disks. Use a URI "
            "(s3://, gs://) or a folder every node mounts.")


class NodesToCome(UnreachablePath):
    """A local path on a cluster that can add nodes: those not up yet cannot be asked."""

    def __init__(self, path: str, what: str):
        self.path, self.what, self.nodes = path, what, {}
        ValueError.__init__(
            self,
            f"{what} {path} is a local folder, and this Ray cluster can add nodes (an autoscaler is "
            "running): a node that joins later would write its shards to its own disk, where no other "
            "node reads them. Use a URI (s3://, gs://), or a folder every node mounts at the same path "
            f"(NFS, a ReadWriteMany volume); if {path} is on one, say so in the job's environment: "
            f"{SHARED_MOUNTS_ENV}=<that mount> (several: joined with '{os.pathsep}'), e.g. "
            f"--runtime-env-json '{{\"env_vars\": {{\"{SHARED_MOUNTS_ENV}\": \"/data\"}}}}'.")


def verdict(path: str, what: str, answers: dict[str, str | None]) -> None:
    """Raise UnreachablePath when any node's answer is not None.

    `answers`: node -> None when it saw the driver's probe, else why not."""
    bad = {node: why for node, why in answers.items() if why is not None}
    if bad:
        raise UnreachablePath(path, what, bad)


def read_probe(probe: str, token: str) -> str | None:
    """On a node: None when `probe` holds `token`, else what it found instead."""
    try:
        got = Path(probe).read_text()
    except FileNotFoundError:
        return "no such file there"
    except OSError as exc:
        return f"cannot read it ({type(exc).__name__}: {exc})"
    return None if got == token else "another file at that path (the node's own disk)"


Asker = Callable[[str, str], dict[str, str | None]]


def ask_other_nodes(probe: str, token: str, timeout: float = ANSWER_SECONDS) -> dict[str, str | None]:
    """node -> its answer (`read_probe`), for every alive node but the driver's; a node
    that does not answer within `timeout` seconds is one that cannot be relied on."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others:
        return {}
    task = ray.remote(num_cpus=0, max_retries=0)(read_probe)
    refs = {_node_name(n): task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(probe, token) for n in others}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
    answers: dict[str, str | None] = {}
    for name, ref in refs.items():
        if ref not in ready:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001  (already gone: nothing to cancel)
                pass
            answers[name] = f"did not answer within {timeout:.0f}s"
            continue
        try:
            answers[name] = ray.get(ref)
        except Exception as exc:  # noqa: BLE001  (the node could not run the check: it cannot be relied on)
            answers[name] = f"the check failed there ({type(exc).__name__}: {exc})"
    return answers


def _node_name(node: dict) -> str:
    return f"{node.get('NodeManagerAddress', '?')} (node {node['NodeID'][:8]})"


def alive_nodes() -> int:
    """How many nodes the running Ray has alive (0 when Ray is not started here)."""
    import ray

    if not ray.is_initialized():
        return 0
    return sum(1 for n in ray.nodes() if n.get("Alive"))


# -- a cluster that can add nodes ---------------------------------------------------------


def typed_by_a_config(node_types: Iterable[str]) -> bool:
    """Whether any node type the autoscaler reports comes from a cluster config (it can
    launch nodes of that type), rather than the read-only monitor's `node_<id>`."""
    return any(t and not UNTYPED_NODE.fullmatch(t) for t in node_types)


def v1_node_types(status: bytes | str | None) -> set[str]:
    """The node types in the v1 monitor's status (the JSON `ray status` prints from)."""
    if not status:
        return set()
    report = json.loads(status).get("autoscaler_report") or {}
    types = set(report.get("active_nodes") or {}) | set(report.get("idle_nodes") or {})
    types |= set(report.get("pending_launches") or {})
    types |= {n[-2] for n in report.get("pending_nodes") or [] if len(n) >= 2}  # (ip, type, status)
    types |= {n[-1] for n in report.get("failed_nodes") or [] if n}  # (ip, type)
    types |= set((report.get("node_type_mapping") or {}).values())
    return {str(t) for t in types}


def v2_node_types(gcs_address: str) -> set[str]:
    """The node types in the v2 autoscaler's cluster status (nodes up, pending, failed)."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(gcs_address)
    nodes = [*status.active_nodes, *status.idle_nodes, *status.pending_nodes, *status.failed_nodes,
             *status.pending_launches, *status.failed_launches]
    return {n.ray_node_type_name for n in nodes if n.ray_node_type_name}


def autoscaler_node_types(gcs_address: str | None = None) -> set[str]:
    """The node types the cluster's autoscaler reports, read from the GCS as `ray status`
    reads them (v1 or v2); empty when Ray is not started here or nothing is reported yet.
    `gcs_address`: another cluster's GCS (default: the connected one's)."""
    import ray
    from ray._private import ray_constants
    from ray._raylet import GCS_AUTOSCALER_STATE_NAMESPACE, GCS_AUTOSCALER_V2_ENABLED_KEY, GcsClient

    if gcs_address is None:
        if not ray.is_initialized():
            return set()
        gcs_address = ray.get_runtime_context().gcs_address
    client = GcsClient(address=gcs_address)
    v2 = client.internal_kv_get(GCS_AUTOSCALER_V2_ENABLED_KEY.encode(),
                                namespace=GCS_AUTOSCALER_STATE_NAMESPACE.encode()) == b"1"
    if v2:
        return v2_node_types(gcs_address)
    return v1_node_types(client.internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None))


def autoscaler_running(gcs_address: str | None = None) -> bool:
    """Whether the Ray cluster can add nodes: an autoscaler with a cluster config runs.
    False when that cannot be told (no Ray, no report yet): the probe of the nodes alive
    still runs then."""
    try:
        return typed_by_a_config(autoscaler_node_types(gcs_address))
    except Exception:  # noqa: BLE001  (a status that cannot be read says nothing either way)
        return False


def shared_mounts() -> list[Path]:
    """The folders the user says every node mounts at the same path (REXEVAL_SHARED_MOUNTS)."""
    raw = os.environ.get(SHARED_MOUNTS_ENV, "")
    return [Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip()]


def declared_shared(folder: Path) -> bool:
    """Whether `folder` is, or is under, one of the declared shared mounts."""
    here = Path(os.path.abspath(folder)).resolve()
    return any(here == m or m in here.parents for m in shared_mounts())


def require_reachable(path: PathLike, what: str = "--out", *, ask: Asker | None = None,
                      nodes: int | None = None, can_add_nodes: Callable[[], bool] | None = None) -> None:
    """Raise UnreachablePath when `path` is a local folder that some node of the running
    Ray cluster does not see as the driver does: NodesToCome on a cluster that can add
    nodes (unless the folder is under a declared shared mount), else when an alive node
    cannot read the driver's probe. Nothing to do for a URI or a one-node fixed Ray.
    `what` names the setting in the message ("--out").

    `ask(probe, token)`, `nodes` and `can_add_nodes()` stand in for the cluster in tests
    (default: one pinned task per other node, the alive nodes' count, and
    `autoscaler_running`)."""
    if is_uri(path):
        return
    folder = location(path).local_path()
    if not declared_shared(folder) and (can_add_nodes or autoscaler_running)():
        raise NodesToCome(str(folder), what)
    if (alive_nodes() if nodes is None else nodes) <= 1:
        return
    made = _missing_parents(folder)
    probe = folder / f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}"
    token = uuid.uuid4().hex
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
        answers = (ask or ask_other_nodes)(str(probe), token)
    finally:
        probe.unlink(missing_ok=True)
        for d in made:  # deepest first: only the folders this check made, and only empty
            try:
                os.rmdir(d)
            except OSError:
                break
    verdict(str(folder), what, answers)


def _missing_parents(folder: Path) -> list[Path]:
    """`folder` and its ancestors that do not exist yet, deepest first."""
    out = []
    for d in [folder, *folder.parents]:
        if d.exists():
            break
        out.append(d)
    return out
