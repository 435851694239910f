"""A local output folder that some node of the cluster cannot see is refused at once,
naming the folder and the nodes; a URI and a one-node Ray need no check. The nodes'
answers are given here (this machine is one node, every process of it sees its disk),
and the real one-node path runs on the session's Ray.

On a cluster that can add nodes (an autoscaler runs) a local folder is refused even with
one node up, unless REXEVAL_SHARED_MOUNTS says every node mounts it; the autoscaler is
told from the node types it reports, checked on the session's Ray (none) and on a real
cluster whose head runs Ray's autoscaler (tests/doubles/local_cluster.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rexeval.pipelines.core.reach import (PROBE_PREFIX, SHARED_MOUNTS_ENV, NodesToCome, UnreachablePath,
                                          ask_other_nodes, autoscaler_running, read_probe, require_reachable,
                                          typed_by_a_config, v1_node_types, verdict)


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


# -- a cluster that can add nodes -------------------------------------------------------------


def no_node_asked(probe, token):
    raise AssertionError("no node should be asked")


def test_a_local_out_is_refused_on_a_cold_autoscaling_cluster_with_one_node_up(tmp_path):
    """The head alone is up (a cold cluster): the workers that will run the steps are not
    there to be asked, so the folder is refused, saying what to use instead."""
    out = tmp_path / "runs" / "study"
    with pytest.raises(NodesToCome) as err:
        require_reachable(str(out), "--out", ask=no_node_asked, nodes=1, can_add_nodes=lambda: True)
    msg = str(err.value)
    assert msg.startswith(f"--out {out} is a local folder, and this Ray cluster can add nodes")
    assert "Use a URI (s3://, gs://), or a folder every node mounts" in msg
    assert f"{SHARED_MOUNTS_ENV}=<that mount>" in msg
    assert isinstance(err.value, UnreachablePath) and isinstance(err.value, ValueError)
    assert not (tmp_path / "runs").exists()  # refused before anything was written

    # A URI passes, and a fixed one-node Ray still needs no check.
    require_reachable("s3://bucket/runs/x", ask=no_node_asked, nodes=1, can_add_nodes=lambda: True)
    require_reachable(str(out), ask=no_node_asked, nodes=1, can_add_nodes=lambda: False)


def test_a_folder_declared_shared_passes_and_is_still_probed_on_the_nodes_up(tmp_path, monkeypatch):
    mount = tmp_path / "data"
    monkeypatch.setenv(SHARED_MOUNTS_ENV, f"/nonexistent/elsewhere:{mount}")
    require_reachable(str(mount / "runs" / "x"), ask=no_node_asked, nodes=1, can_add_nodes=lambda: True)
    require_reachable(str(mount), ask=no_node_asked, nodes=1, can_add_nodes=lambda: True)

    # With nodes up, they are asked as on a fixed cluster: a wrong declaration is caught.
    ask, asked = simulated_cluster(shared={"10.0.0.2 (node aaaa)"})
    with pytest.raises(UnreachablePath) as err:
        require_reachable(str(mount / "runs" / "x"), ask=ask, nodes=3, can_add_nodes=lambda: True)
    assert not isinstance(err.value, NodesToCome) and "10.0.0.3 (node bbbb)" in str(err.value)
    assert len(asked) == 1

    # A folder beside the mount (not under it) is refused.
    with pytest.raises(NodesToCome):
        require_reachable(str(tmp_path / "database"), ask=no_node_asked, nodes=1, can_add_nodes=lambda: True)


def test_the_autoscaler_is_told_from_the_node_types_it_reports():
    """The read-only monitor of a Ray without a cluster config names each node after its id;
    a real autoscaler reports its config's node types (what `ray status` prints)."""
    untyped = "node_" + "b2" * 28
    readonly = {"autoscaler_report": {"active_nodes": {untyped: 1}, "idle_nodes": None, "pending_nodes": [],
                                      "pending_launches": {}, "failed_nodes": [],
                                      "node_type_mapping": {"b2" * 28: untyped}},
                "load_metrics_report": {}}
    assert v1_node_types(json.dumps(readonly)) == {untyped}
    assert not typed_by_a_config(v1_node_types(json.dumps(readonly)))
    cold = {"autoscaler_report": {"active_nodes": {"headgroup": 1}, "pending_nodes": [],
                                  "pending_launches": {}, "failed_nodes": [], "node_type_mapping": {}}}
    assert typed_by_a_config(v1_node_types(json.dumps(cold)))  # KubeRay's head, no worker yet
    launching = {"autoscaler_report": {"active_nodes": {}, "pending_nodes": [["10.0.0.9", "gpu-worker", "setting-up"]],
                                       "pending_launches": {"cpu-worker": 2}, "failed_nodes": [["10.0.0.8", "x"]]}}
    assert v1_node_types(json.dumps(launching)) == {"gpu-worker", "cpu-worker", "x"}
    assert v1_node_types(None) == set() and v1_node_types(json.dumps({"load_metrics_report": {}})) == set()
    assert not typed_by_a_config([]) and not typed_by_a_config([""])


def test_the_session_ray_runs_no_autoscaler(ray_session):
    """A local `ray.init()` runs the read-only monitor: it reports, but can add no node."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    from tests.doubles.local_cluster import wait_for

    wait_for(lambda: _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS), 30, "the monitor's first status")
    assert autoscaler_running() is False


@pytest.mark.slow
def test_a_cluster_whose_head_runs_the_autoscaler_is_detected(tmp_path):
    """A real head started with an autoscaling config (Ray's fake multi-node provider, no
    CPU on the head, one worker type at 0 nodes): detected with the head alone up, and a
    local folder is refused there."""
    from tests.doubles.local_cluster import local_cluster, wait_for

    with local_cluster(head_cpus=0, autoscaling={"cpu": {"resources": {"CPU": 1}, "max_workers": 1}}) as cluster:
        assert wait_for(lambda: autoscaler_running(cluster.gcs_address), 30, "the autoscaler's report")
        assert len(cluster.alive_nodes()) == 1
        with pytest.raises(NodesToCome):
            require_reachable(str(tmp_path / "out"), ask=no_node_asked, nodes=1,
                              can_add_nodes=lambda: autoscaler_running(cluster.gcs_address))
