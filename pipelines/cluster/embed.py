"""Embed many texts on Ray, resumably: sentence-transformers actors or vLLM's embed task.

Texts are cut into shards; each shard is one task for an actor that holds the encoder
(CPU threads or a GPU, per the job's worker settings) and writes its vectors as a
Parquet shard (`row`, `vector` as a fixed-size float32 list, L2-normalised). A re-run
with the same texts and model skips the finished shards; another model or text set
replaces the folder. With `backend="vllm"` the driver streams the texts through a
`ray.data.llm` embed processor instead (GPU clusters; vLLM is imported on GPU workers only).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from rexeval.pipelines.core.io import ShardedOutput, table_files
from rexeval.pipelines.core.sharded import ShardedJob
from rexeval.pipelines.core.stage import Resources, Stage, use_cpus

TABLE = "embeddings"
_RESULT = pa.schema([("shard", pa.int64()), ("rows", pa.int64()), ("dim", pa.int64())])


def vectors_table(start: int, vectors: np.ndarray) -> pa.Table:
    """Rows `start..start+n` and their vectors, as a Parquet-ready table."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    return pa.table({"row": pa.array(np.arange(start, start + n, dtype=np.int64)),
                     "vector": pa.FixedSizeListArray.from_arrays(flat, d)})


def read_vectors(folder: str | Path, n: int | None = None) -> np.ndarray:
    """All shards of an embeddings folder as one float32 matrix in row order."""
    import pyarrow.parquet as pq

    files = table_files(Path(folder) / TABLE)
    if not files:
        return np.zeros((0, 0), dtype=np.float32)
    table = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("row")
    col = table.column("vector").combine_chunks()
    d = col.type.list_size
    vecs = np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, d)
    rows = table.column("row").to_numpy()
    if n is not None and (len(rows) != n or (n and rows[-1] != n - 1)):
        raise RuntimeError(f"{folder}: expected {n} embedded rows, found {len(rows)}")
    return vecs


class EmbedStage(Stage):
    """Encode one shard of texts per call and write it (batch_size 1: a task is a shard)."""

    name = "embed"
    batch_size = 1

    def __init__(self, output: ShardedOutput, location: str, *, device: str = "auto",
                 batch_size: int = 256, resources: Resources = Resources()):
        self.output, self.location, self.device = output, location, device
        self.encode_batch = batch_size
        self.resources = resources
        self.model = None

    def setup(self) -> None:
        from rexeval.models.encoders.embedder import build_embedder

        use_cpus(self.resources)
        self.model = build_embedder(self.location, device=self.device)

    def process(self, batch: pa.Table) -> pa.Table:
        if self.model is None:  # run without Ray (tests): set up on first use
            self.setup()
        rows = []
        for shard, start, texts in zip(batch.column("shard").to_pylist(),
                                       batch.column("start").to_pylist(),
                                       batch.column("texts").to_pylist()):
            vecs = self.model.encode(texts, batch_size=self.encode_batch)
            self.output.write_shard(shard, {TABLE: vectors_table(start, vecs)}, {"rows": len(texts)})
            rows.append({"shard": shard, "rows": len(texts), "dim": int(vecs.shape[1])})
        return pa.Table.from_pylist(rows, schema=_RESULT)


def embed_texts(texts: Sequence[str], folder: str | Path, *, model_ref: str, location: str,
                digest: str, device: str = "auto", batch_size: int = 256, shard_size: int = 50_000,
                workers: int = 1, resources: Resources = Resources(), backend: str = "sentence-transformers",
                progress: Callable[[str], None] = print) -> np.ndarray:
    """Embed `texts` into `folder` (resuming finished shards) and return the matrix.

    `digest` identifies the text list (see `cluster.nodes.Nodes.digest`); together with
    the model it decides whether existing shards can be reused.
    """
    if not len(texts):  # nothing to embed (e.g. no statement survived): no model load
        return np.zeros((0, 0), dtype=np.float32)
    conf = {"model": model_ref, "texts": digest, "n": len(texts), "shard_size": shard_size,
            "backend": backend}
    n_shards = (len(texts) + shard_size - 1) // shard_size
    job = ShardedJob(ShardedOutput(folder, "embeddings", conf, [TABLE]), n_shards, overwrite=True,
                     progress=progress)
    job.say_resumed("embeddings")
    if job.todo and backend == "vllm":
        _embed_vllm(texts, job.todo, shard_size, job.output, location, batch_size, workers, resources, progress)
    elif job.todo:
        stage = EmbedStage(job.output, location, device=device, batch_size=batch_size, resources=resources)
        job.run(stage, lambda i: {"shard": i, "start": i * shard_size,
                                  "texts": list(texts[i * shard_size:(i + 1) * shard_size])},
                workers=workers, report=lambda row, k, n: (
                    f"  embeddings: shard {row['shard']} done ({k}/{n}): {row['rows']:,} texts, dim {row['dim']}"))
    job.finish()
    return read_vectors(folder, len(texts))


def _embed_vllm(texts, todo, shard_size, out, location, batch_size, workers, resources, progress):
    """vLLM's embed task through `ray.data.llm`, one pass over all missing shards."""
    import ray

    from rexeval.models.encoders.embedder import build_vllm_embed_processor

    rows = [{"row": r, "statement": texts[r]} for i in todo
            for r in range(i * shard_size, min(len(texts), (i + 1) * shard_size))]
    processor = build_vllm_embed_processor(location, batch_size=batch_size, concurrency=workers)
    ds = processor(ray.data.from_items(rows))
    got, failed = [], []
    for r in ds.iter_rows():
        (failed if r.get("embedding") is None else got).append(r)
    if failed:  # a statement without a vector cannot be clustered: stop with the reason
        f = min(failed, key=lambda r: r["row"])
        raise RuntimeError(f"vLLM could not embed {len(failed)} text(s); first: row {f['row']} "
                           f"({texts[f['row']][:80]!r}): {f.get('error')}")
    got = sorted(((r["row"], r["embedding"]) for r in got), key=lambda x: x[0])
    vecs = np.asarray([v for _, v in got], dtype=np.float32)
    by_row = {r: k for k, (r, _) in enumerate(got)}
    for i in todo:
        lo, hi = i * shard_size, min(len(texts), (i + 1) * shard_size)
        shard = vecs[[by_row[r] for r in range(lo, hi)]]
        out.write_shard(i, {TABLE: vectors_table(lo, shard)}, {"rows": hi - lo})
        progress(f"  embeddings (vllm): shard {i} done: {hi - lo:,} texts")
