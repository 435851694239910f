"""One step instance of a study in a driver process of its own.

Why: Ray Tune keeps a process-wide registry of trainables, Serve a client per process
and Ray Data a context per process. Two steps run as threads of one driver share them
by accident (two Tune experiments at once raced in Tune's registry: "dictionary changed
size during iteration"). So every instance runs in a fresh process that joins the
study driver's Ray cluster as a driver of its own (its own Ray job), runs the job's own
run function, and sends its progress lines and its counts back through a pipe.

The processes are forked from a template process (multiprocessing's `forkserver`) that
imported rexeval's jobs, torch and Ray once and never connected to Ray, so a step
starts in milliseconds instead of re-importing for seconds. What a step's process
prints itself (Ray's own log lines, library warnings, Tune's tables) goes to its log
file beside every progress line; with `verbose` it goes to the terminal as well. The
log file is local (it is streamed to): OUT/logs/<instance>.log itself, or for a study
folder under a URI a temporary file the study copies there when the step ends
(`runner.StepLogs`); `log_shown` is where the user finds it.

A study keeps a finished step's process for its next step (`StepPool`): the process
stays the same Ray job, so the job's idle workers, which imported the step's libraries
already, run the next step's tasks instead of new workers starting (about a second of
CPU each, several per step) and the driver does not join the cluster again. Steps
still never share a process at once, so the reasons above hold. A process is kept only
after a step that succeeded and left no actor of its job alive (an actor would keep its
CPUs from the next step), and while it holds under 2 GiB (what a step left in memory
would otherwise add up); otherwise it ends, and Ray cleans its job up as before. The
step's log ends with which. Each step starts with the process's Ray Data context as
the first step found it.
"""
from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Imported once by the template process: what nearly every step needs.
PRELOAD = ["rexeval.pipelines.study.builtin_jobs", "ray", "ray.data", "ray.tune", "ray.serve", "pandas"]

_CONTEXT: list[Any] = []
_CONTEXT_LOCK = threading.Lock()


class StepFailed(RuntimeError):
    """A step's job raised, or its process died; `reason` is the one line a user reads
    ("TypeName: message"), `details` the traceback or where to look. `transport`: nothing
    was wrong with the step (its LLM calls failed in transport, its driver's node was
    lost): a plain re-run does it (the study exits 75, as a job left for a re-run does)."""

    def __init__(self, reason: str, details: str = "", transport: bool = False):
        super().__init__(reason)
        self.reason, self.details, self.transport = reason, details, transport


def is_transport(exc: BaseException) -> bool:
    """Whether a job's exception leaves its work for a re-run (`failures.AwaitingRerun`)."""
    from rexeval.failures import AwaitingRerun

    return isinstance(exc, AwaitingRerun)


@dataclass
class StepCall:
    """Everything the step's process needs (picklable: the job's run function and config
    class travel by reference, so they must be importable, as registered jobs are)."""

    key: str
    target: Any  # the job's run function, or "module:function"
    config: type
    settings: dict[str, Any]
    overwrite: bool
    log_path: str
    ray_address: str | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    log_shown: str = ""  # where the user finds the log (default: log_path)

    @property
    def log_where(self) -> str:
        return self.log_shown or self.log_path


def _context():
    """The forkserver context with rexeval preloaded (spawn where fork is unavailable)."""
    with _CONTEXT_LOCK:
        if not _CONTEXT:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
            if ctx.get_start_method() == "forkserver":
                ctx.set_forkserver_preload(PRELOAD)
            _CONTEXT.append(ctx)
        return _CONTEXT[0]


def ray_connection() -> tuple[str | None, dict[str, Any]]:
    """The running Ray cluster's address and this driver's runtime environment, which a
    step's process reuses (the same code and environment variables on the workers)."""
    import ray

    ctx = ray.get_runtime_context()
    return ctx.gcs_address, dict(ctx.runtime_env or {})


JOIN_TRIES = 3  # a step process that dies while joining the cluster is started again
ACTORS_END_S = 5.0  # how long a finished step's actors get to end before its process is not kept
KEEP_RSS_BYTES = 2 * 2**30  # a step's process holding more than this after its step is not kept


@dataclass
class _Kept:
    """A step's process waiting for its next step, and the pipe it takes calls on."""

    proc: Any
    conn: Any


def _pool_key(call: StepCall) -> tuple:
    """Steps that may share a process: the same cluster, runtime env and terminal use."""
    return call.ray_address, repr(sorted(call.runtime_env.items())), call.verbose


class StepPool:
    """Finished steps' processes, kept for the study's next steps (see the module's
    docstring); `close()` ends them. Thread-safe: the study runs steps from threads."""

    def __init__(self):
        self._idle: dict[tuple, list[_Kept]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, call: StepCall) -> _Kept | None:
        with self._lock:
            idle = self._idle.get(_pool_key(call), [])
            while idle:
                kept = idle.pop()
                if kept.proc.is_alive():
                    return kept
                _end(kept)
        return None

    def give(self, call: StepCall, kept: _Kept) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(_pool_key(call), []).append(kept)
                return
        _end(kept, stop=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            kept = [k for idle in self._idle.values() for k in idle]
            self._idle.clear()
        for k in kept:
            _end(k, stop=True)


def _end(kept: _Kept, stop: bool = False) -> None:
    """Let a step's process go: told to stop (it leaves Ray and exits), or already ending."""
    try:
        if stop:
            kept.conn.send("stop")
    except (BrokenPipeError, OSError):
        pass
    finally:
        kept.conn.close()
        kept.proc.join(timeout=60)
        if kept.proc.is_alive():
            kept.proc.kill()
            kept.proc.join()


def run_step(call: StepCall, progress: Callable[[str], None], pool: StepPool | None = None) -> dict[str, Any]:
    """Run `call` in its own process; progress lines reach `progress` as they come; the
    job's counts are returned. Raises StepFailed (the job raised, or the process died).

    A process that dies before it has joined the Ray cluster ran nothing of its job (seen
    on a busy 2-core machine: Ray's core worker aborting in its object-store warm-up as
    two steps joined at once); that is a transport failure, so the step is started
    again, up to JOIN_TRIES times in all. With a `pool`, a kept process runs it when one
    is idle, and the process is kept again when the step succeeded and left no actor."""
    for attempt in range(1, JOIN_TRIES + 1):
        joined, outcome, code = _run_step_once(call, progress, pool)
        if outcome is not None or joined or attempt == JOIN_TRIES:
            break
        progress(f"[{call.key}] the step's process ended (exit code {code}) while joining the Ray "
                 f"cluster; starting it again ({attempt + 1}/{JOIN_TRIES})")
    if outcome is None:
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        raise StepFailed(f"StepDied: the step's process ended ({how}) before it reported a result "
                          f"(out of memory? killed?); its log: {call.log_where}", "")
    if outcome[0] == "error":
        raise StepFailed(outcome[1], outcome[2], transport=outcome[3])
    return outcome[1]


def _run_step_once(call: StepCall, progress: Callable[[str], None],
                    pool: StepPool | None = None) -> tuple[bool, tuple | None, int | None]:
    """One process for `call` (a kept one from `pool` when one is idle): (whether it joined
    the cluster, its outcome message or None when it died first, its exit code)."""
    kept = pool.take(call) if pool is not None else None
    if kept is None:
        ctx = _context()
        conn, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_step_main, args=(child, os.getpid()), name="rexeval-step", daemon=False)
        proc.start()
        child.close()
        kept = _Kept(proc, conn)
    joined, outcome, idle = False, None, False
    try:
        kept.conn.send((call, pool is not None))
        while True:
            try:
                msg = kept.conn.recv()
            except EOFError:
                break
            if msg[0] == "line":
                progress(msg[1])
            elif msg[0] == "joined":
                joined = True
            elif msg[0] == "idle":
                idle = True
                break
            else:
                outcome = msg
    except (BrokenPipeError, OSError):
        pass
    if idle and pool is not None:
        pool.give(call, kept)
        return joined, outcome, None
    _end(kept, stop=idle)
    return joined, outcome, kept.proc.exitcode


def hold_service(opener: Callable, log_path: str, progress: Callable[[str], None],
                 ray_address: str | None = None, runtime_env: dict[str, Any] | None = None,
                 verbose: bool = False, log_shown: str = "") -> Callable[[], None]:
    """Start a Serve application in a process of its own, which holds it until the
    returned release is called (or the study driver is gone) and then stops it.

    Why a process: the driver that starts an application keeps long polls open on Serve's
    controller, and when Serve shuts down Ray prints those tasks' failures to that
    driver's terminal; in the holder's process they go to its log. `opener(progress)`
    starts (or joins) the application and returns its release; it must be picklable
    (a module-level function or a partial of one). Raises StepFailed when it cannot start.
    `log_shown`: where the user finds the log (default: `log_path`, the file it streams to)."""
    ctx = _context()
    conn, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_hold_main, args=(opener, child, os.getpid(), log_path, ray_address,
                                                dict(runtime_env or {}), verbose), name="rexeval-serve-holder")
    proc.start()
    child.close()

    def pump(until: str) -> tuple | None:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return None
            if msg[0] == "line":
                progress(msg[1])
            elif msg[0] in (until, "error"):
                return msg

    got = pump("up")
    if got is None or got[0] == "error":
        conn.close()
        proc.join()
        if got is None:
            raise StepFailed(f"ServiceDied: the process holding the Serve application ended (exit code "
                              f"{proc.exitcode}) before it was up; its log: {log_shown or log_path}")
        raise StepFailed(got[1], got[2])

    def release() -> None:
        try:
            conn.send("stop")
            pump("stopped")
        except (BrokenPipeError, EOFError, OSError):
            pass
        finally:
            conn.close()
            proc.join(timeout=120)
    return release


# -- inside the step's process ---------------------------------------------------------


def _watch_parent(pid: int) -> None:
    """End this process when the study driver is gone (killed without its process group)."""
    def watch():
        while True:
            time.sleep(2)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:
                pass
    threading.Thread(target=watch, name="rexeval-parent-watch", daemon=True).start()


def _open_log(path: str, verbose: bool) -> int:
    """The process's log file (appended to); unless `verbose`, the process's own output
    (Ray's, libraries') goes there too instead of the terminal."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if not verbose:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log, 1)
        os.dup2(log, 2)
    return log


def _step_main(conn, parent_pid: int) -> None:
    """A step's process: runs the calls it is sent, one at a time, until told to stop, or
    until a step fails or the process may not be kept (then it ends, and its Ray job with it)."""
    _watch_parent(parent_pid)
    data_context = None
    try:
        while True:
            try:
                sent = conn.recv()
            except EOFError:
                return
            if sent == "stop":
                return
            call, keep = sent
            if data_context is not None:
                import ray.data

                ray.data.DataContext._set_current(copy.deepcopy(data_context))
            kept, data_context = _run_call(call, conn, data_context, keep)
            if not kept:
                return
            conn.send(("idle",))
    finally:
        conn.close()
        import ray

        if ray.is_initialized():
            ray.shutdown()


def _run_call(call: StepCall, conn, data_context, keep: bool):
    """One step in this process, its output in its own log: (whether the process stays
    for a next step, the Ray Data context as the first step of this process found it).
    Only a `keep` call whose step succeeded may stay, and only when `why_not_kept` finds
    nothing; the log says which."""
    from rexeval.pipelines.core.study_registry import StudyJob, build_config, counts_of

    log = _open_log(call.log_path, call.verbose)

    def say(line: str) -> None:
        os.write(log, (line + "\n").encode("utf-8", "replace"))
        conn.send(("line", line))

    try:
        import ray
        import ray.data

        from rexeval.pipelines.core.runtime import init_ray

        say(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: step {call.key}")
        if not ray.is_initialized():
            init_ray(address=call.ray_address, runtime_env=call.runtime_env, quiet=not call.verbose)
            data_context = copy.deepcopy(ray.data.DataContext.get_current())
        conn.send(("joined",))
        job = StudyJob(call.key, call.config, call.target)
        result = job.run(build_config(job, call.settings), call.overwrite, say)
        conn.send(("done", counts_of(result if isinstance(result, dict) else {})))
    except BaseException as exc:  # noqa: BLE001  (every failure is reported to the study driver)
        tb = traceback.format_exc()
        os.write(log, tb.encode("utf-8", "replace"))
        conn.send(("error", f"{type(exc).__name__}: {exc}", tb, is_transport(exc)))
        os.close(log)
        return False, data_context
    try:
        if not keep:
            return False, data_context
        why = why_not_kept()
        os.write(log, (f"this process ends here: {why}\n" if why else
                       "this process may run a later step of the study\n").encode())
        return why is None, data_context
    finally:
        os.close(log)


def why_not_kept(wait_s: float = ACTORS_END_S, max_rss: int = KEEP_RSS_BYTES) -> str | None:
    """Why this process must not run another step, or None: an actor its job made
    (detached ones aside) is still alive after `wait_s` (Ray ends an actor whose last
    handle went asynchronously; one that stays would hold its CPUs from the next step),
    or the process holds more than `max_rss` bytes (what its steps left in memory)."""
    import psutil
    import ray
    from ray._private import state

    gc.collect()  # handles and arrays held in reference cycles
    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    deadline = time.monotonic() + wait_s
    while True:
        alive = [a for a in state.actors(job_id=job, actor_state_name="ALIVE").values() if not a.get("IsDetached")]
        if not alive:
            break
        if time.monotonic() > deadline:
            names = sorted({a.get("ActorClassName") or "?" for a in alive})
            return f"{len(alive)} actor(s) of its Ray job still alive ({', '.join(names)})"
        time.sleep(0.2)
    rss = psutil.Process().memory_info().rss
    if rss > max_rss:
        return f"it holds {rss / 2**30:.1f} GiB (more than {max_rss / 2**30:.1f} GiB)"
    return None


def _hold_main(opener, conn, parent_pid: int, log_path: str, ray_address, runtime_env, verbose: bool) -> None:
    log = _open_log(log_path, verbose)
    _watch_parent(parent_pid)

    def say(line: str) -> None:
        os.write(log, (line + "\n").encode("utf-8", "replace"))
        try:
            conn.send(("line", line))
        except (BrokenPipeError, OSError):
            pass

    release = None
    try:
        from rexeval.pipelines.core.runtime import init_ray

        init_ray(address=ray_address, runtime_env=runtime_env, quiet=not verbose)
        release = opener(say)
        conn.send(("up",))
        try:
            conn.recv()  # "stop", or EOF: the study driver is gone
        except EOFError:
            pass
    except BaseException as exc:  # noqa: BLE001  (reported to the study driver)
        tb = traceback.format_exc()
        os.write(log, tb.encode("utf-8", "replace"))
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", tb))
        except (BrokenPipeError, OSError):
            pass
    finally:
        try:
            if release is not None:
                release()
            conn.send(("stopped",))
        except (BrokenPipeError, OSError):
            pass
        finally:
            conn.close()
            os.close(log)
