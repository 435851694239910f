"""Study jobs for the runner's tests. Module-level, as every study job must be: each
step runs in a process of its own, which imports its job by name."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path


def boom(cfg, overwrite, progress):
    """A step whose job fails as a real one does (its service is down)."""
    raise RuntimeError("the model server is down")


def whoami(cfg, progress):
    """Where the step ran: its process, its Ray job, what else ran in that process, and
    what `tamper` left in its Ray Data context."""
    import ray
    import ray.data

    progress(f"whoami: pid {os.getpid()}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "ray_job": ray.get_runtime_context().get_job_id(),
              "threads": sorted(t.name for t in threading.enumerate()),
              "probe": ray.data.DataContext.get_current().get_config("rexeval_probe")}
    (out / "whoami.json").write_text(json.dumps(record))
    return {"counts": {"pid": os.getpid()}}


def tamper(cfg, progress):
    """`whoami`, then a change to the process's Ray Data context the next step must not see."""
    import ray.data

    counts = whoami(cfg, progress)
    ray.data.DataContext.get_current().set_config("rexeval_probe", "left by tamper")
    return counts


_HELD: list = []


class Held:
    """An actor that does nothing but stay."""

    def ping(self):
        return True


def holds_an_actor(cfg, progress):
    """`whoami`, then an actor of the step's job that outlives the step (its handle kept)."""
    import ray

    counts = whoami(cfg, progress)
    _HELD.append(ray.remote(num_cpus=0)(Held).remote())
    ray.get(_HELD[-1].ping.remote())
    return counts
