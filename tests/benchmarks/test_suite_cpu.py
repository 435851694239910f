"""benchmarks/suite_cpu.py: processes named and attributed to the test files they served,
on planted samples (the whole run is the benchmark's; these are its arithmetic)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.suite_cpu import attribute, file_windows, kind_of, summary, worker_phase

WORKER = "/v/bin/python /v/lib/python3.11/site-packages/ray/_private/workers/default_worker.py --raylet-name=x"


@pytest.mark.parametrize("comm, cmd, kind", [
    ("ray::MapWorker(", WORKER, "ray worker: MapWorker("),
    ("ray::IDLE", WORKER, "ray worker: IDLE, up to its first task"),
    ("ray::IDLE again", WORKER, "ray worker: IDLE, after a task"),
    ("python", WORKER, "ray worker: starting"),  # its raylet flag does not make it the raylet
    ("ray::DashboardA", "ray::DashboardAgent", "ray agent: dashboard_agent"),
    ("raylet", "/v/ray/core/src/ray/raylet/raylet --gcs-address=x", "ray daemon: raylet"),
    ("python", "/v/bin/python -u /v/ray/_private/log_monitor.py --gcs-address=x", "ray daemon: log_monitor"),
    ("python", "/v/bin/python -u /v/ray/autoscaler/_private/monitor.py --logs-dir=x", "ray daemon: autoscaler_monitor"),
    ("python", "/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest worker"),
    ("python", "/v/bin/python -c from multiprocessing.forkserver import main; main(8)", "study step driver"),
    ("rexeval", "/v/bin/python3 /v/bin/rexeval study run /tmp/pytest-of-root/s.yaml", "other: rexeval"),
])
def test_kinds(comm, cmd, kind):
    assert kind_of(comm, cmd) == kind


def test_an_idle_workers_cpu_is_told_apart_by_whether_it_has_run_a_task_yet():
    """Ray titles a worker IDLE both before its first task (its start, its first task's
    imports) and between tasks: the sampler names the second `ray::IDLE again`."""
    worker, agent = {}, {}
    seen = [worker_phase(c, worker) for c in ("python", "ray::IDLE", "ray::IDLE", "ray::Encoder", "ray::IDLE",
                                              "ray::tokenize", "ray::IDLE")]
    assert seen == ["python", "ray::IDLE", "ray::IDLE", "ray::Encoder", "ray::IDLE again", "ray::tokenize",
                    "ray::IDLE again"]
    assert worker_phase("ray::DashboardA", agent) == "ray::DashboardA" and worker_phase("raylet", {}) == "raylet"


def _events(pid: int, tests: list[tuple[float, float, str]]) -> list[dict]:
    out = []
    for s, e, nodeid in tests:
        out += [{"t": s, "id": nodeid, "ev": "start", "pid": pid}, {"t": e, "id": nodeid, "ev": "end", "pid": pid}]
    return out


def test_a_workers_cpu_goes_to_the_files_its_pytest_worker_ran_while_it_lived():
    # gw0 (pid 10) runs a.py's two tests (0-10 s, 10-20 s), then b.py (25-40 s); gw1 (pid 20) c.py.
    windows = file_windows(_events(10, [(0, 10, "a.py::t1"), (10, 20, "a.py::t2"), (25, 40, "b.py::t")])
                           + _events(20, [(0, 40, "c.py::t")]))
    assert windows[10] == [[0, 25, "a.py"], [25, 40, "b.py"]]  # merged, stretched to b's start
    raylet = {"pid": 11, "ppid": 10, "cmd": "raylet", "first": 0, "last": 40, "by_comm": {"raylet": 8.0}}
    worker = {"pid": 12, "ppid": 11, "cmd": WORKER, "first": 30, "last": 35,
              "by_comm": {"ray::IDLE": 1.0, "ray::Encoder": 3.0}}
    other = {"pid": 21, "ppid": 20, "cmd": WORKER, "first": 1, "last": 2, "by_comm": {"ray::IDLE": 0.5}}
    daemon = {"pid": 30, "ppid": 1, "cmd": "raylet", "first": 0, "last": 40, "by_comm": {"raylet": 2.0}}
    gw = [{"pid": p, "ppid": 5, "cmd": "python -c import sys;exec(eval(sys.stdin.readline()))", "first": 0,
           "last": 40, "by_comm": {"python": 4.0}} for p in (10, 20)]
    att = attribute([raylet, worker, other, daemon, *gw], windows)
    # The raylet's 8 s over gw0's 40 s: 25/40 to a.py, 15/40 to b.py; the worker's 4 s to b.py.
    assert att["files"]["a.py"]["ray daemon: raylet"] == pytest.approx(5.0)
    assert att["files"]["b.py"]["ray daemon: raylet"] == pytest.approx(3.0)
    assert att["files"]["b.py"]["ray worker: Encoder"] == pytest.approx(3.0)
    assert att["files"]["c.py"] == {"ray worker: IDLE, up to its first task": 0.5, "pytest worker": 4.0}
    assert att["worker_starts"] == {"b.py": 1, "c.py": 1}
    assert att["outside_tests"] == {"ray daemon: raylet": 2.0}
    assert att["kinds"]["ray daemon: raylet"] == pytest.approx(10.0)
    table = summary(att)
    assert table["sampled_cpu_s"] == pytest.approx(8 + 4 + 0.5 + 2 + 8)
    assert [r["file"] for r in table["by_file"]] == ["b.py", "a.py", "c.py"]  # 8.5, 7.5, 4.5 s


@pytest.mark.slow
def test_the_sampler_counts_a_busy_child_from_its_start(tmp_path):
    """The real sampler on this machine: a process that spins ~1 s of CPU is found, with
    about that much, under its name."""
    out = tmp_path / "samples.json"
    sampler = subprocess.Popen([sys.executable, "-m", "benchmarks.suite_cpu", "--sample", str(out), "--period", "0.1"],
                               cwd=Path(__file__).resolve().parents[2])
    time.sleep(1.0)  # its first sweep has run
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 1.0: pass\ntime.sleep(0.5)"])
    busy.wait(30)
    sampler.send_signal(signal.SIGTERM)
    sampler.wait(30)
    rec = [r for r in json.loads(out.read_text()) if r["pid"] == busy.pid]
    assert len(rec) == 1 and rec[0]["ppid"] == os.getpid()
    assert 0.7 <= sum(rec[0]["by_comm"].values()) <= 1.3, rec
