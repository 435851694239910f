"""Where the test suite's CPU goes: every process's CPU time sampled while the suite runs,
summed by kind of process (a Ray worker by the task or actor it ran, Ray's own daemons,
the pytest workers, the study steps' drivers) and by the test file it served.

Issue 50 asks for the full tier under 20 minutes on 2 cores. The suite is CPU-bound
there (`vmstat` shows 0-4 % idle all through a run), so the way down is less CPU work,
and this is the map of it. No library does this: pytest's `--durations` gives wall time
per test, which on a saturated machine measures the neighbours as much as the test;
`py-spy` follows one process tree, not the hundreds of short-lived Ray workers a suite
starts.

How a process is attributed: a Ray worker, a study step's driver or a CLI run descends from
the pytest worker (xdist's `gw0`, `gw1`) that started its Ray or ran its command; its CPU
is spread over the tests that worker ran while the process lived (a session's raylet
over the whole session, an actor over its test). Processes outside those trees (nodes of
a test's own cluster that daemonized, the machine's own services) are listed apart. A
worker titled `ray::IDLE` is counted in two parts: up to its first task (its start and
that task's imports) and after one (`worker_phase`).

    .venv/bin/python -m benchmarks.suite_cpu                 # the full tier (~37 min on 2 cores)
    .venv/bin/python -m benchmarks.suite_cpu -- tests/serve  # pytest arguments after `--`
    .venv/bin/python -m benchmarks.suite_cpu --analyse DIR   # a run's samples again

The sampler reads /proc twice a second (about 3 % of one core); the run is slower than
CI's by that. Linux only. Results: benchmarks/results/suite_cpu.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine_cpu import machine_cpu_s

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "suite_cpu.json"
RUN_DIR_ENV = "REXEVAL_SUITE_CPU_DIR"  # where the pytest workers log their tests' times
SAMPLES = "samples.json"
RUN = "run.json"  # the pytest command, its exit code, wall and machine CPU
RAY_BINARIES = {"raylet", "gcs_server"}
RAY_SCRIPTS = {"/log_monitor.py": "log_monitor", "/dashboard/dashboard.py": "dashboard",
               "/autoscaler/_private/monitor.py": "autoscaler_monitor"}
RAY_AGENTS = {"DashboardA": "dashboard_agent", "RuntimeEnv": "runtime_env_agent", "_Autoscali": "autoscaler"}


# -- the pytest side: each test's start and end, per xdist worker --------------------------
def pytest_runtest_logstart(nodeid, location):
    _test_log().write(json.dumps({"t": time.time(), "id": nodeid, "ev": "start", "pid": os.getpid()}) + "\n")


def pytest_runtest_logfinish(nodeid, location):
    _test_log().write(json.dumps({"t": time.time(), "id": nodeid, "ev": "end", "pid": os.getpid()}) + "\n")


_LOG: list = []


def _test_log():
    if not _LOG:
        folder = Path(os.environ.get(RUN_DIR_ENV, tempfile.gettempdir()))
        _LOG.append(open(folder / f"tests-{os.getpid()}.jsonl", "a", buffering=1))
    return _LOG[0]


# -- the sampler ----------------------------------------------------------------------------
def _job_of(pid: str) -> str:
    """The Ray job a worker serves ($RAY_JOB_ID in its environment; "" for others)."""
    try:
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"RAY_JOB_ID="):
                return item[11:].decode()
    except OSError:
        pass
    return ""


def sample(out: Path, period: float) -> None:
    """Until SIGTERM: per process, its CPU seconds by the name (`comm`) it had when
    sampled (a Ray worker is renamed after the task it runs). Processes alive at the
    first sweep count from then, not from their start."""
    hz = os.sysconf("SC_CLK_TCK")
    me, records, stop, first = os.getpid(), {}, [], True
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    while not stop:
        now = time.time()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == me:
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                end = stat.rfind(")")
                comm, fields = stat[stat.find("(") + 1:end], stat[end + 2:].split()
                cpu = (int(fields[11]) + int(fields[12])) / hz
                key = f"{pid}:{fields[19]}"  # pid and start time: pids are reused
                rec = records.get(key)
                if rec is None:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    rec = records[key] = {"pid": int(pid), "ppid": int(fields[1]), "cmd": cmd[:300],
                                          "job": _job_of(pid), "first": now, "prev": cpu if first else 0.0,
                                          "by_comm": {}}
                delta, rec["prev"], rec["last"] = cpu - rec["prev"], cpu, now
                comm = worker_phase(comm, rec)
                if delta > 0:
                    rec["by_comm"][comm] = rec["by_comm"].get(comm, 0.0) + delta
            except (OSError, ValueError, IndexError):
                continue  # the process ended between listing and reading
        first = False
        time.sleep(period)
    out.write_text(json.dumps(list(records.values())))


IDLE = "ray::IDLE"
IDLE_AGAIN = "ray::IDLE again"  # not a name Ray gives: `worker_phase`'s, for an idle worker that has run a task


def worker_phase(comm: str, rec: dict) -> str:
    """Ray titles a worker `ray::IDLE` from its start until it begins running a task (or
    an actor's constructor), and again between tasks. The first stretch holds the
    worker's set-up and the import of its first task's function and module (Ray loads
    the function before it retitles the process: Ray Data, pandas, pyarrow, torch...),
    the others the idle loop and the imports of later, different tasks. They are told
    apart: `IDLE_AGAIN` once the process has been seen under any other `ray::` name.
    A task that starts and ends between two sweeps goes unseen, so the first part
    leans high. (An agent is never IDLE, so marking it changes nothing.)"""
    if comm == IDLE:
        return IDLE_AGAIN if rec.get("ran") else IDLE
    if comm.startswith("ray::"):
        rec["ran"] = True
    return comm


# -- the analysis (pure: records and test windows in, tables out) ---------------------------
def kind_of(comm: str, cmd: str) -> str:
    """A process's kind for the table: Ray's daemons and agents by name, a Ray worker by
    the task or actor it ran (Ray names worker processes `ray::<what>`, at most 15
    characters), a worker before Ray titled it, an IDLE worker by whether it has run a
    task yet (`worker_phase`), the pytest workers, the study steps' drivers (forked from the study's template process), anything else by its name."""
    if comm == IDLE:
        return "ray worker: IDLE, up to its first task"
    if comm == IDLE_AGAIN:
        return "ray worker: IDLE, after a task"
    if comm.startswith("ray::"):
        what = comm[5:]
        return "ray agent: " + RAY_AGENTS[what] if what in RAY_AGENTS else "ray worker: " + what
    if comm in RAY_BINARIES:
        return "ray daemon: " + comm
    if "/default_worker.py" in cmd:
        return "ray worker: starting"
    for script, name in RAY_SCRIPTS.items():
        if script in cmd:
            return "ray daemon: " + name
    if "exec(eval(sys.stdin.readline()))" in cmd:
        return "pytest worker"
    if " -m pytest" in cmd:
        return "pytest (xdist's controller)"
    if "forkserver" in cmd or "multiprocessing" in cmd:
        return "study step driver"
    return "other: " + comm


def file_windows(events: list[dict]) -> dict[int, list[list]]:
    """Per pytest process, [start, end, file] spans, a file's consecutive tests merged and
    each span stretched to the next one's start (its module fixtures' teardown and the
    next file's setup happen between them)."""
    open_: dict[str, float] = {}
    spans: dict[int, list] = collections.defaultdict(list)
    for e in sorted(events, key=lambda e: e["t"]):
        if e["ev"] == "start":
            open_[e["id"]] = e["t"]
        elif e["id"] in open_:
            spans[e["pid"]].append((open_.pop(e["id"]), e["t"], e["id"].split("::")[0]))
    out = {}
    for pid, got in spans.items():
        merged: list[list] = []
        for s, e, f in sorted(got):
            if merged and merged[-1][2] == f:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e, f])
        for i in range(len(merged) - 1):
            merged[i][1] = max(merged[i][1], merged[i + 1][0])
        out[pid] = merged
    return out


def attribute(records: list[dict], windows: dict[int, list[list]]) -> dict:
    """CPU seconds by kind, by test file (with each file's kinds and worker starts), and
    those of processes outside every pytest worker's tree."""
    by_pid = {}
    for r in records:
        by_pid.setdefault(r["pid"], r)

    def owner(r: dict) -> int | None:
        seen = set()
        while r is not None and r["pid"] not in seen:
            if r["pid"] in windows:
                return r["pid"]
            seen.add(r["pid"])
            r = by_pid.get(r["ppid"])
        return None

    kinds: collections.Counter = collections.Counter()
    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    starts: collections.Counter = collections.Counter()
    outside: collections.Counter = collections.Counter()
    for r in records:
        for comm, cpu in r["by_comm"].items():
            kinds[kind_of(comm, r["cmd"])] += cpu
        total = sum(r["by_comm"].values())
        w = owner(r)
        if w is None:
            if total > 0:
                outside[kind_of(max(r["by_comm"], key=r["by_comm"].get), r["cmd"])] += total
            continue
        a, b = r["first"], r.get("last", r["first"])
        spans = [(max(a, s), min(b, e), f) for s, e, f in windows[w] if min(b, e) > max(a, s)]
        if not spans:
            spans = [(0.0, 1.0, f) for s, e, f in windows[w] if s <= a <= e][:1] or [(0.0, 1.0, "(between files)")]
        if "/default_worker.py" in r["cmd"]:
            starts[spans[0][2]] += 1
        length = sum(e - s for s, e, _ in spans)
        for s, e, f in spans:
            for comm, cpu in r["by_comm"].items():
                files[f][kind_of(comm, r["cmd"])] += cpu * (e - s) / length
    return {"kinds": dict(kinds), "files": {f: dict(c) for f, c in files.items()},
            "worker_starts": dict(starts), "outside_tests": dict(outside)}


def summary(att: dict, top: int = 40) -> dict:
    """The tables sorted, rounded, with shares of the total."""
    total = sum(att["kinds"].values())
    kinds = sorted(att["kinds"].items(), key=lambda kv: -kv[1])
    files = sorted(((f, sum(c.values()), c) for f, c in att["files"].items()), key=lambda x: -x[1])
    return {
        "sampled_cpu_s": round(total, 1),
        "by_kind": [{"kind": k, "cpu_s": round(v, 1), "share": round(v / total, 4)} for k, v in kinds if v >= 0.5],
        "by_file": [{"file": f, "cpu_s": round(v, 1), "worker_starts": att["worker_starts"].get(f, 0),
                     "top_kinds": {k: round(x, 1) for k, x in sorted(c.items(), key=lambda kv: -kv[1])[:5]}}
                    for f, v, c in files[:top]],
        "outside_tests": {k: round(v, 1) for k, v in sorted(att["outside_tests"].items(), key=lambda kv: -kv[1])
                          if v >= 0.5},
    }


def analyse(folder: Path) -> dict:
    records = json.loads((folder / SAMPLES).read_text())
    events = [json.loads(line) for f in sorted(folder.glob("tests-*.jsonl")) for line in f.read_text().splitlines()]
    return summary(attribute(records, file_windows(events)))


def run_suite(folder: Path, pytest_args: list[str], workers: int, period: float) -> dict:
    """The suite as scripts/test.sh runs it (`-n workers --dist loadfile`), sampled."""
    env = {**os.environ, RUN_DIR_ENV: str(folder), "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    sampler = subprocess.Popen([sys.executable, "-m", "benchmarks.suite_cpu", "--sample", str(folder / SAMPLES),
                                "--period", str(period)], cwd=REPO)
    cpu0, t0 = machine_cpu_s(), time.time()
    cmd = [sys.executable, "-m", "pytest", "-p", "benchmarks.suite_cpu", "-p", "no:cacheprovider",
           *(["-n", str(workers), "--dist", "loadfile"] if workers else []), *(pytest_args or ["-m", "not gpu"])]
    try:
        rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        wall, cpu = time.time() - t0, machine_cpu_s() - cpu0
    finally:
        sampler.send_signal(signal.SIGTERM)  # it writes its samples and ends
        sampler.wait(60)
    return {"pytest": " ".join(cmd[1:]), "exit_code": rc, "wall_s": round(wall, 1), "machine_cpu_s": round(cpu, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (as scripts/test.sh; 0: one process)")
    ap.add_argument("--period", type=float, default=0.5, help="seconds between two sweeps of /proc")
    ap.add_argument("--analyse", type=Path, help="only analyse the samples and test logs in this folder")
    ap.add_argument("--keep", type=Path, help="keep the samples and test logs in this folder")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--sample", type=Path, help=argparse.SUPPRESS)  # the sampler's own process
    ap.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --); default: -m 'not gpu'")
    a = ap.parse_args()
    if a.sample:
        return sample(a.sample, a.period)
    if a.analyse:
        folder = a.analyse
        run = json.loads((folder / RUN).read_text()) if (folder / RUN).is_file() else {}
    else:
        folder = a.keep or Path(tempfile.mkdtemp(prefix="suite-cpu-"))
        folder.mkdir(parents=True, exist_ok=True)
        run = run_suite(folder, a.pytest_args, a.workers, a.period)
        (folder / RUN).write_text(json.dumps(run))
    try:
        command = run.get("command") or "python -m benchmarks.suite_cpu" + "".join(f" {x}" for x in sys.argv[1:])
        result = {"command": command, "machine": f"{os.cpu_count()} CPUs", **run, **analyse(folder)}
    finally:
        if not (a.analyse or a.keep):
            shutil.rmtree(folder, ignore_errors=True)  # the samples: ~1 MB for a full run
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"sampled {result['sampled_cpu_s']:.0f} CPU-s" + (f" in {run['wall_s']:.0f} s" if run else ""))
    for row in result["by_kind"][:25]:
        print(f"  {row['cpu_s']:8.1f}  {100 * row['share']:5.1f} %  {row['kind']}")
    print("by test file:")
    for row in result["by_file"][:25]:
        print(f"  {row['cpu_s']:8.1f}  {row['worker_starts']:4d} workers  {row['file']}")
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
