"""Study jobs for the runner's tests. Module-level, as every study job must be: each
stage runs in a process of its own, which imports its job by name."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path


def boom(cfg, overwrite, progress):
    """A stage whose job fails as a real one does (its service is down)."""
    raise RuntimeError("the model server is down")


def whoami(cfg, progress):
    """Where the stage ran: its process, its Ray job, and what else ran in that process."""
    import ray

    progress(f"whoami: pid {os.getpid()}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "ray_job": ray.get_runtime_context().get_job_id(),
              "threads": sorted(t.name for t in threading.enumerate())}
    (out / "whoami.json").write_text(json.dumps(record))
    return {"counts": {"pid": os.getpid()}}
