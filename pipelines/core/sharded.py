"""The driver every resumable sharded job uses.

A job describes its output (a `ShardedOutput`: folder, settings, tables) and how many
shards its work has. `ShardedJob` opens the output (a folder holding another
configuration's output is refused unless the job may overwrite it), works out which
shards a previous run already finished, runs a stage over the rest on a Ray Data actor
pool (one task row per shard; the stage writes its shard and returns a small row of
counts), reports each shard as it finishes, and writes the final manifest. A killed job
re-run with the same settings therefore does only the missing shards, and its output is
byte-identical to an uninterrupted run's (`pipelines/core/io.py` says how a shard is
committed). Each shard this run finishes is counted once in the job's metrics (rows
in/out/error from its marker's counts, pipelines/core/job_metrics.py), as it finishes
or, for shards a job commits itself, at `finish()`.

    job = ShardedJob(ShardedOutput(out, "extract", config, ["statements", "errors"]), n)
    if (manifest := job.finished("extract")) is not None:
        return manifest                         # nothing to do (and it said so)
    job.say_resumed()                           # "resuming: 3 of 8 shard(s) already done"
    job.run(stage, workers=cfg.workers, report=lambda row, k, n: shard_line(row["shard"], k, n))
    manifest = job.finish(method=cfg.method)    # extra manifest fields
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from rexeval.pipelines.core import job_metrics
from rexeval.pipelines.core.io import ShardedOutput
from rexeval.pipelines.core.stage import Stage, pool_size


def shard_line(shard: int | str, k: int, n: int, details: str = "", *, unit: str = "shard", label: str = "",
               verb: str = "done", cached: int = 0, elapsed: float | None = None, indent: str = "  ") -> str:
    """The progress line every job prints as one of its shards (or chunks) finishes, in one
    shape: `  [label: ]shard S done (k/n[, 12s])[: details][, C cached]`."""
    counted = f"{k}/{n}" + (f", {elapsed:.0f}s" if elapsed is not None else "")
    return (f"{indent}{label + ': ' if label else ''}{unit} {shard} {verb} ({counted})"
            + (f": {details}" if details else "") + (f", {cached} cached" if cached else ""))


Report = Callable[[dict, int, int], str]
"""(the shard's result row, how many shards of this run are done, how many it has) -> a
progress line."""


def shard_task(shard: int) -> dict:
    """The default task row: just the shard's number (the stage knows its inputs)."""
    return {"shard": shard}


class ShardedJob:
    """One resumable job over `shards` shards of `output` (see the module docstring)."""

    def __init__(self, output: ShardedOutput, shards: int, *, overwrite: bool = False,
                 progress: Callable[[str], None] = print, skip: Collection[int] = ()):
        """`skip`: shards that need no run here (a later stage of the job has them)."""
        self.output = output.open(overwrite=overwrite)
        self.shards = shards
        self.progress = progress
        if self.output.kept_now:
            progress(f"  {self.output.root}: left {len(self.output.kept)} entr(ies) that are not this job's "
                     f"output as they are: {', '.join(self.output.kept[:5])}"
                     + (" ..." if len(self.output.kept) > 5 else ""))
        self.done = self.output.done_shards()
        self.todo = [i for i in range(shards) if i not in self.done and i not in skip]
        self._this_run = set(self.todo)
        self.engines: dict[str, dict] = {}  # an LLM job's stream: per model, its engines' work
        self._counted: set[int] = set()  # shards of this run already in the metrics

    @property
    def complete(self) -> bool:
        """Every shard is done and the manifest is final: a re-run has nothing to do."""
        manifest = self.output.read_manifest()
        return not self.todo and bool(manifest) and manifest.get("status") == "complete"

    def finished(self, job: str) -> dict | None:
        """The final manifest, saying so, when a re-run has nothing to do; else None."""
        if not self.complete:
            return None
        self.progress(f"{job}: {self.output.root} is already complete for these settings")
        return self.output.read_manifest()

    def say_chunks(self, label: str, what: str) -> None:
        """One line before a chunked run: what there is, in how many chunks, how many of
        them an earlier run did ("already done" when all)."""
        if not self.todo:
            self.progress(f"  {label}: already done ({what})")
        else:
            self.progress(f"  {label}: {what} in {self.shards} chunk(s)"
                          + (f", {len(self.done)} already done" if self.done else ""))

    def say_resumed(self, label: str = "resuming", unit: str = "shard(s)") -> None:
        """Report how much an earlier run left done (silent on a fresh start)."""
        if self.done:
            self.progress(f"  {label}: {len(self.done)} of {self.shards} {unit} already done")

    def run(self, stage: Stage, task: Callable[[int], dict] = shard_task, *, workers: int | None = None,
            min_workers: int = 1, report: Report | None = None) -> list[dict]:
        """Run `stage` once per shard still to do, `task(shard)` being its input row, on
        an actor pool of `pool_size(workers, ..., min_workers)` (min, max) actors; report each
        finished shard and return the result rows in the order they finished."""
        from rexeval.pipelines.core.runtime import run_tasks

        rows: list[dict] = []
        if not self.todo:
            return rows
        actors = pool_size(workers, len(self.todo), min_workers)
        self._count_left()
        for k, row in enumerate(run_tasks([task(i) for i in self.todo], stage, actors), 1):
            rows.append(row)
            self._count(row.get("shard") if hasattr(row, "get") else None)
            if report is not None:
                self.progress(report(row, k, len(self.todo)))
        return rows

    def finish(self, **extra) -> dict:
        """The final manifest: the shards' summed counts and `extra` fields."""
        self._count_rest()
        if self.engines:
            extra.setdefault("llm_engines", self.engines)
        return self.output.finish(self.shards, **extra)

    def finish_partial(self, awaiting: int, what: str = "row(s)") -> None:
        """Rows of this run were left for a re-run (their calls failed in transport):
        the manifest stays "running" with the summed counts so far and how many wait, and
        `AwaitingRerun` tells the caller. A plain re-run does the unwritten shards."""
        from rexeval.failures import AwaitingRerun
        from rexeval.pipelines.core.io import write_json_atomic
        from rexeval.pipelines.core.io import MANIFEST

        self._count_rest()
        counts = self.output.total_counts()
        write_json_atomic(self.output.root / MANIFEST,
                          self.output._manifest("running", counts, self.shards, awaiting_rerun=awaiting))
        left = len(self.todo) - len(set(self.output.done_shards()) & set(self.todo))
        raise AwaitingRerun(f"{self.output.job}: {awaiting} {what} await a re-run: their calls failed in "
                            f"transport, so {left} of {self.shards} shard(s) were not written; run the "
                            "same command again to finish them", awaiting=awaiting, counts=counts)

    # -- metrics (never fail the job: a shard not counted is only a gap in a graph) --

    def _count(self, shard: Any) -> None:
        """Record a shard of this run that just finished, from its marker's counts."""
        try:
            shard = int(shard)
        except (TypeError, ValueError):
            return
        if shard in self._counted or shard not in self._this_run or not job_metrics.enabled():
            return
        try:
            counts = self.output.shard_counts(shard)
        except Exception:  # noqa: BLE001  (no marker yet: finish() looks again)
            return
        self._counted.add(shard)
        job_metrics.record_shard(self.output.job, counts)
        self._count_left()

    def _count_rest(self) -> None:
        """Record the shards of this run that `run` did not see finish (a job that
        commits shards itself, or rows without a shard number)."""
        rest = self._this_run - self._counted
        if not rest or not job_metrics.enabled():
            return
        try:
            done = self.output.done_shards()
        except Exception:  # noqa: BLE001
            return
        for shard in sorted(rest & set(done)):
            self._counted.add(shard)
            job_metrics.record_shard(self.output.job, done[shard])
        self._count_left()

    def _count_left(self) -> None:
        job_metrics.record_shards_left(self.output.job, len(self._this_run) - len(self._counted))
