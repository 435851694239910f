"""The ground-truth job: extracted statements -> explanations + per-statement sentences.

One output shard per input shard (an extract shard holds whole reviews, so shards are
independent), each built by a Ray actor that reads, filters, builds and writes it
(`pipelines.extract.ground_truth` holds the rules). Finished shards are skipped on a re-run.
Input and output may be URIs: the driver lists the input's shards and reads their
footers; each actor reads its own shard.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.extract.config import GROUND_TRUTH_OUTPUTS, GroundTruthConfig
from rexeval.pipelines.extract.ground_truth import RULES_VERSION, STAGE, ground_truth_shard
from rexeval.pipelines.core.io import ShardedOutput, read_table
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.pipelines.core.schema import SchemaError
from rexeval.pipelines.core.stage import Resources, Stage
from rexeval.pipelines.core.inputs import check_schemas, file_record, resolve_stage, statement_files

STAGES = ("auto", "triplet", "candidate", "verified")
TABLES = [GROUND_TRUTH_OUTPUTS.explanations, GROUND_TRUTH_OUTPUTS.sentences, GROUND_TRUTH_OUTPUTS.errors]
COUNT_KEYS = ("in", "out", "statements", "sentences", "duplicates", "errors")


def shard_counts(statements: pa.Table, explanations: pa.Table, sentences: pa.Table,
                 errors: pa.Table) -> dict[str, int]:
    """in = reviews with statements; statements = sentences + duplicates + errors."""
    dropped = statements.num_rows - sentences.num_rows - errors.num_rows
    return {"in": len(pc.unique(statements.column("review_id"))), "out": explanations.num_rows,
            "statements": statements.num_rows, "sentences": sentences.num_rows,
            "duplicates": dropped, "errors": errors.num_rows}


_RESULT = pa.schema([("shard", pa.int64()), *[(k, pa.int64()) for k in COUNT_KEYS],
                     ("schema_error", pa.string())])


class GroundTruthStage(Stage):
    """Build one output shard per call from one input shard (batch_size 1)."""

    name = "ground-truth"
    resources = Resources(cpus=1)
    batch_size = 1

    def __init__(self, output: ShardedOutput, files: dict[int, str], stage: str,
                 rename: dict[str, str] | None = None):
        self.output, self.files, self.stage, self.rename = output, files, stage, rename

    def process(self, batch: pa.Table) -> pa.Table:
        rows = []
        for shard in batch.column("shard").to_pylist():
            try:
                rows.append({"shard": shard, **self.build(shard)})
            except SchemaError as exc:
                # Sent back as data: the driver re-raises the same SchemaError, not a
                # Ray wrapper with a worker traceback.
                rows.append({"shard": shard, "schema_error": json.dumps(dataclasses.asdict(exc))})
        return pa.Table.from_pylist(rows, schema=_RESULT)

    def build(self, shard: int) -> dict[str, int]:
        source = self.files[shard]
        table = read_table(source, "statements", rename=self.rename)
        table = table.filter(pc.equal(table.column("stage"), self.stage))
        explanations, sentences, errors = ground_truth_shard(table, source=source)
        counts = shard_counts(table, explanations, sentences, errors)
        self.output.write_shard(shard, {"explanations": explanations, "sentences": sentences,
                                        "errors": errors}, counts)
        return counts


def run_ground_truth(cfg: GroundTruthConfig, overwrite: bool = False,
                     progress: Callable[[str], None] = print) -> dict:
    """Run the job end to end (resuming finished shards) and return the manifest."""
    t0 = time.time()
    files = statement_files(cfg.input)
    rename = cfg.columns or None
    check_schemas(files, rename)
    stage = resolve_stage(files, cfg.stage, rename)
    conf = {"input": [file_record(f) for f in files],
            "stage": stage, "rules": RULES_VERSION,
            **({"columns": cfg.columns} if cfg.columns else {})}  # no mapping: the hash as before
    job = ShardedJob(ShardedOutput(cfg.out, STAGE, conf, TABLES), len(files), overwrite=overwrite,
                     progress=progress)
    if (manifest := job.finished("ground-truth")) is not None:
        return manifest
    progress(f"ground-truth: {len(files)} shard(s), '{stage}' statements"
             + (" (auto)" if cfg.stage == "auto" else "") + f" -> {cfg.out}")
    job.say_resumed()
    failures = []

    def report(row: dict, k: int, n: int) -> str:
        if row["schema_error"]:
            failures.append(SchemaError(**json.loads(row["schema_error"])))
            return shard_line(row["shard"], k, n, str(failures[-1]), verb="failed")
        return shard_line(row["shard"], k, n, f"reviews={row['in']} explanations={row['out']} "
                          f"sentences={row['sentences']} errors={row['errors']}")

    job.run(GroundTruthStage(job.output, {i: str(f) for i, f in enumerate(files)}, stage, rename),
            workers=cfg.workers, report=report)
    if failures:  # the shards that passed are saved; a re-run after the fix resumes
        raise failures[0]
    manifest = job.finish(stage=stage, stage_requested=cfg.stage)
    manifest["elapsed_s"] = round(time.time() - t0, 2)
    return manifest
