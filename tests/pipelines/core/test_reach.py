"""A local output folder that some node of the cluster cannot see is refused at once,
naming the folder and the nodes; a URI and a one-node Ray need no check. The nodes'
answers are given here (this machine is one node, every process of it sees its disk),
and the real one-node path runs on the session's Ray."""
from __future__ import annotations

from pathlib import Path

import pytest

from rexeval.pipelines.core.reach import (PROBE_PREFIX, UnreachablePath, ask_other_nodes, read_probe,
                                          require_reachable, verdict)


def test_the_verdict_names_the_path_and_each_node_that_cannot_see_it():
    verdict("/data/runs/x", "--out", {"10.0.0.2 (node aaaa)": None, "10.0.0.3 (node bbbb)": None})  # all see it
    with pytest.raises(UnreachablePath) as err:
        verdict("/data/runs/x", "--out", {"10.0.0.2 (node aaaa)": None,
                                          "10.0.0.3 (node bbbb)": "no such file there"})
    msg = str(err.value)
    assert msg.startswith("--out /data/runs/x is a local folder that 1 node(s) of the Ray cluster cannot see")
    assert "10.0.0.3 (node bbbb): no such file there" in msg and "10.0.0.2" not in msg
    assert "Use a URI (s3://, gs://) or a folder every node mounts." in msg
    assert isinstance(err.value, ValueError) and err.value.nodes == {"10.0.0.3 (node bbbb)": "no such file there"}


def test_a_node_reading_the_probe_tells_a_shared_folder_from_its_own_disk(tmp_path):
    probe = tmp_path / "probe"
    assert read_probe(str(probe), "t0k3n") == "no such file there"
    probe.write_text("another run's token")
    assert read_probe(str(probe), "t0k3n") == "another file at that path (the node's own disk)"
    probe.write_text("t0k3n")
    assert read_probe(str(probe), "t0k3n") is None


def simulated_cluster(shared: set[str]):
    """Nodes answering as a cluster would: those in `shared` mount the driver's disk
    (they read the real probe), the others look at a disk of their own (empty)."""
    asked: list[tuple[str, str]] = []

    def ask(probe: str, token: str) -> dict[str, str | None]:
        asked.append((probe, token))
        assert Path(probe).read_text() == token  # the driver wrote it before asking
        return {node: read_probe(probe if node in shared else probe + ".elsewhere", token)
                for node in ("10.0.0.2 (node aaaa)", "10.0.0.3 (node bbbb)")}
    return ask, asked


def test_a_local_out_a_node_cannot_see_fails_at_once_and_leaves_nothing(tmp_path):
    out = tmp_path / "runs" / "study"
    ask, asked = simulated_cluster(shared={"10.0.0.2 (node aaaa)"})
    with pytest.raises(UnreachablePath) as err:
        require_reachable(str(out), "--out", ask=ask, nodes=3)
    assert f"--out {out} is a local folder" in str(err.value)
    assert "10.0.0.3 (node bbbb): no such file there" in str(err.value)
    assert len(asked) == 1 and Path(asked[0][0]).parent == out and Path(asked[0][0]).name.startswith(PROBE_PREFIX)
    assert not (tmp_path / "runs").exists()  # the probe and the folders the check made are gone

    # A folder every node mounts passes; an existing folder keeps what it held.
    out.mkdir(parents=True)
    (out / "study.json").write_text("{}")
    ask, asked = simulated_cluster(shared={"10.0.0.2 (node aaaa)", "10.0.0.3 (node bbbb)"})
    require_reachable(out, "--out", ask=ask, nodes=3)
    assert len(asked) == 1 and sorted(p.name for p in out.iterdir()) == ["study.json"]


def test_a_uri_or_a_one_node_ray_is_not_checked(tmp_path):
    def ask(probe, token):
        raise AssertionError("no node should be asked")

    require_reachable("s3://bucket/runs/x", "--out", ask=ask, nodes=5)
    require_reachable("gs://bucket/runs/x", ask=ask, nodes=5)
    require_reachable(str(tmp_path / "x"), ask=ask, nodes=1)
    assert not (tmp_path / "x").exists()


def test_the_real_one_node_ray_passes_and_its_nodes_answer(tmp_path, ray_session):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    require_reachable(str(tmp_path / "out"))  # the session's Ray: one node, nothing to ask
    assert ask_other_nodes(str(tmp_path / "p"), "t") == {}
    # The task a node runs, pinned to a node as the check pins it (here the only one).
    probe = tmp_path / "probe"
    probe.write_text("t0k3n")
    task = ray.remote(num_cpus=0, max_retries=0)(read_probe)
    node = ray.get_runtime_context().get_node_id()
    pinned = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
    assert ray.get(pinned.remote(str(probe), "t0k3n")) is None
    assert ray.get(pinned.remote(str(probe), "other")) == "another file at that path (the node's own disk)"


def test_a_node_the_check_cannot_run_on_fails_it(tmp_path, ray_session, monkeypatch):
    """The real asker, with the session's Ray reporting one more alive node that no task
    can be pinned to (gone since the list was read): the folder is refused, naming it."""
    import ray

    real = ray.nodes
    ghost = {"NodeID": "ab" * 28, "Alive": True, "NodeManagerAddress": "10.9.9.9"}
    monkeypatch.setattr(ray, "nodes", lambda: real() + [ghost])
    with pytest.raises(UnreachablePath) as err:
        require_reachable(str(tmp_path / "out"), "--out")
    assert f"--out {tmp_path / 'out'} is a local folder" in str(err.value)
    assert "10.9.9.9 (node abababab): the check failed there" in str(err.value)
    assert not (tmp_path / "out").exists()
