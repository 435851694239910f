"""Refuse at once a local output folder that some node of the cluster cannot see.

Why: on a cluster whose nodes share no disk, a job given `--out runs/x` writes its
shards on whichever node ran each actor, and the driver, reading markers on its own
disk, finds half of them missing hours later. A URI (`s3://`, `gs://`) or a folder every
node mounts (NFS, a shared volume) is what such a cluster needs, and this check says so
before the first stage starts, naming the path and the nodes that cannot see it.

How: the driver writes a small probe file with random content under the folder, then
one tiny task pinned to each other alive node (`NodeAffinitySchedulingStrategy`, not
soft) reads it back. A node that finds no file, or another file (its own disk at the
same path), cannot see the driver's folder. The probe is removed afterwards, and so are
the folders the check itself had to make. A URI, a Ray that is not started and a
one-node Ray need no check.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from rexeval.pipelines.core.storage import PathLike, is_uri, location

PROBE_PREFIX = ".rexeval-reach-"
ANSWER_SECONDS = 120.0  # a node's task must answer within this (a worker may have to start)


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


def require_reachable(path: PathLike, what: str = "--out", *, ask: Asker | None = None,
                      nodes: int | None = None) -> None:
    """Raise UnreachablePath when `path` is a local folder that some alive node of the
    running Ray cluster does not see as the driver does; nothing to do for a URI or a
    one-node Ray. `what` names the setting in the message ("--out").

    `ask(probe, token)` and `nodes` stand in for the cluster in tests (default: one
    pinned task per other node, and the alive nodes' count)."""
    if is_uri(path):
        return
    if (alive_nodes() if nodes is None else nodes) <= 1:
        return
    folder = location(path).local_path()
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
