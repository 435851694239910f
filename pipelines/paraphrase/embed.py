"""Embed many texts on Ray, resumably: sentence-transformers actors or vLLM's embed task.

The texts are a Parquet file (`row`, `text`) in the job's storage, written by a worker;
they are cut into shards, and each shard is one task for an actor that holds the encoder
(CPU threads or a GPU, per the job's worker settings), reads its rows of the texts
itself, and writes its vectors as a Parquet shard (`row`, `vector` as a fixed-size
float32 list, L2-normalised). A re-run with the same texts and model skips the finished
shards; another model or text set replaces the folder. With `backend="vllm"` the texts
stream from storage through a `ray.data.llm` embed processor instead (GPU clusters; vLLM
is imported on GPU workers only), and workers write its output. The driver only counts:
no text or vector passes through it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rexeval.pipelines.core.io import ShardedOutput, parquet_schema, read_parquet, table_files
from rexeval.pipelines.core.sharded import ShardedJob, shard_line
from rexeval.pipelines.core.stage import Resources, Stage, pool_size, use_cpus
from rexeval.storage import PathLike, location

TABLE = "embeddings"
_RESULT = pa.schema([("shard", pa.int64()), ("rows", pa.int64()), ("dim", pa.int64())])


def vectors_table(start: int, vectors: np.ndarray) -> pa.Table:
    """Rows `start..start+n` and their vectors, as a Parquet-ready table."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, d = vectors.shape
    flat = pa.array(vectors.reshape(-1), type=pa.float32())
    return pa.table({"row": pa.array(np.arange(start, start + n, dtype=np.int64)),
                     "vector": pa.FixedSizeListArray.from_arrays(flat, d)})


def read_vectors(folder: PathLike, n: int | None = None) -> np.ndarray:
    """All shards of an embeddings folder as one float32 matrix in row order (on the
    worker that needs them)."""
    files = table_files(location(folder) / TABLE)
    if not files:
        return np.zeros((0, 0), dtype=np.float32)
    table = pa.concat_tables([read_parquet(f) for f in files]).sort_by("row")
    col = table.column("vector").combine_chunks()
    d = col.type.list_size
    vecs = np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, d)
    rows = table.column("row").to_numpy()
    if n is not None and (len(rows) != n or (n and rows[-1] != n - 1)):
        raise RuntimeError(f"{folder}: expected {n} embedded rows, found {len(rows)}")
    return vecs


def embedding_dim(folder: PathLike) -> int:
    """The vectors' dimension, from the first shard's schema (no rows read)."""
    files = table_files(location(folder) / TABLE)
    if not files:
        raise RuntimeError(f"{folder}: no embeddings")
    return int(parquet_schema(files[0]).field("vector").type.list_size)


def read_rows(folder: PathLike, rows: np.ndarray) -> np.ndarray:
    """The vectors of global rows `rows` (ascending) from an embeddings folder: only the
    files whose `row` statistics say they hold some, only the rows asked for (an index
    shard's own rows, `pipelines/paraphrase/shards.py`), in the order asked."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    lo, hi = int(rows[0]), int(rows[-1])
    parts = []
    for f in table_files(location(folder) / TABLE):
        with f.open_input() as fh:
            meta = pq.ParquetFile(fh).metadata
        ranges = [_row_range(meta.row_group(g)) for g in range(meta.num_row_groups)]
        if ranges and all(r is not None and (r[1] < lo or r[0] > hi) for r in ranges):
            continue
        t = read_parquet(f)
        have = t.column("row").to_numpy()
        want = np.isin(have, rows)
        if want.any():
            parts.append(t.filter(pa.array(want)))
    table = pa.concat_tables(parts).sort_by("row") if parts else None
    if table is None or table.num_rows != len(rows) or not np.array_equal(table.column("row").to_numpy(), rows):
        found = 0 if table is None else table.num_rows
        raise RuntimeError(f"{folder}: {len(rows)} embedded rows asked for ({lo}-{hi}), {found} found")
    col = table.column("vector").combine_chunks()
    return np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, col.type.list_size)


def _row_range(row_group) -> tuple[int, int] | None:
    """(min, max) of a row group's `row` column from its statistics, None without them."""
    for c in range(row_group.num_columns):
        col = row_group.column(c)
        if col.path_in_schema == "row" and col.statistics is not None and col.statistics.has_min_max:
            return int(col.statistics.min), int(col.statistics.max)
    return None


def read_texts(texts_at: PathLike) -> list[str]:
    """The `text` column of a texts file (row i is text i), read where it is needed."""
    return read_parquet(texts_at, columns=["text"]).column("text").to_pylist()


class EmbedStage(Stage):
    """Encode one shard of texts per call and write it (batch_size 1: a task is a shard).

    A task names its rows (`start`, `end`); the actor reads the texts from storage (once,
    then keeps them for its next shards), so no text travels through the driver."""

    name = "embed"
    batch_size = 1

    def __init__(self, output: ShardedOutput, location: str, texts_at: PathLike, *, device: str = "auto",
                 batch_size: int = 256, resources: Resources = Resources()):
        self.output, self.location, self.device = output, location, device
        self.texts_at = str(texts_at)
        self.encode_batch = batch_size
        self.resources = resources
        self.model = None
        self._texts: list[str] | None = None

    def setup(self) -> None:
        from rexeval.models.encoders.embedder import build_embedder

        use_cpus(self.resources)
        self.model = build_embedder(self.location, device=self.device)

    def texts(self, start: int, end: int) -> list[str]:
        if self._texts is None:
            self._texts = read_texts(self.texts_at)
        return self._texts[start:end]

    def process(self, batch: pa.Table) -> pa.Table:
        if self.model is None:  # run without Ray (tests): set up on first use
            self.setup()
        rows = []
        for shard, start, end in zip(*(batch.column(c).to_pylist() for c in ("shard", "start", "end"))):
            texts = self.texts(start, end)
            vecs = self.model.encode(texts, batch_size=self.encode_batch)
            self.output.write_shard(shard, {TABLE: vectors_table(start, vecs)}, {"rows": len(texts)})
            rows.append({"shard": shard, "rows": len(texts), "dim": int(vecs.shape[1])})
        return pa.Table.from_pylist(rows, schema=_RESULT)


def embed_texts(texts_at: PathLike, n: int, folder: PathLike, *, model_ref: str, location: str,
                digest: str, device: str = "auto", batch_size: int = 256, shard_size: int = 50_000,
                workers: int = 1, min_workers: int = 1, resources: Resources = Resources(),
                backend: str = "sentence-transformers", progress: Callable[[str], None] = print) -> int:
    """Embed the `n` texts of the file `texts_at` into `folder` (resuming finished
    shards); returns how many shards there are (read them with `read_vectors`). The
    encoder actors (or vLLM engines) are a pool of `min_workers` to `workers`.

    `digest` identifies the text list (see `cluster.nodes.Nodes.digest`); together with
    the model it decides whether existing shards can be reused.
    """
    if not n:  # nothing to embed (e.g. no statement survived): no model load
        return 0
    conf = {"model": model_ref, "texts": digest, "n": n, "shard_size": shard_size,
            "backend": backend}
    n_shards = (n + shard_size - 1) // shard_size
    job = ShardedJob(ShardedOutput(folder, "embeddings", conf, [TABLE]), n_shards, overwrite=True,
                     progress=progress)
    job.say_resumed("embeddings")
    if job.todo and backend == "vllm":
        lo, hi = pool_size(workers, least=min_workers)
        _embed_vllm(texts_at, n, job.todo, shard_size, job.output, location, batch_size,
                    hi if lo == hi else (lo, hi), progress)
    elif job.todo:
        stage = EmbedStage(job.output, location, texts_at, device=device, batch_size=batch_size,
                           resources=resources)
        job.run(stage, lambda i: {"shard": i, "start": i * shard_size, "end": min(n, (i + 1) * shard_size)},
                workers=workers, min_workers=min_workers, report=lambda row, k, m: shard_line(
                    row["shard"], k, m, f"{row['rows']:,} texts, dim {row['dim']}", label="embeddings"))
    job.finish()
    return n_shards


def _embed_vllm(texts_at, n, todo, shard_size, out, model, batch_size, workers, progress):
    """vLLM's embed task through `ray.data.llm`, one pass over all missing shards: the
    texts stream from storage to the engines, whose output workers write as pieces under
    `_vllm/`; then one task per shard gathers its rows from the pieces and commits it."""
    import ray

    from rexeval.models.encoders.embedder import build_vllm_embed_processor

    texts_at = location(texts_at)
    pieces = out.root / "_vllm"
    pieces.rmtree()  # a killed pass's pieces: this pass embeds the same rows again
    ds = ray.data.read_parquet(texts_at.path, filesystem=texts_at.fs, columns=["row", "text"])
    ds = ds.map_batches(_InShards(todo, shard_size), batch_format="pyarrow")
    processor = build_vllm_embed_processor(model, batch_size=batch_size, concurrency=workers,
                                           text_column="text")
    processor(ds).map(_as_piece).write_parquet(pieces.path, filesystem=pieces.fs)
    commit = ray.remote(commit_vllm_shard)
    refs = {i: commit.remote(str(pieces), str(texts_at), out, i, i * shard_size, min(n, (i + 1) * shard_size))
            for i in todo}
    for i, ref in refs.items():
        progress(f"  embeddings (vllm): shard {i} done: {ray.get(ref):,} texts")
    pieces.rmtree()


class _InShards:
    """Keeps the rows of the given shards (a picklable batch filter for Ray Data)."""

    def __init__(self, shards, shard_size: int):
        self.shards, self.shard_size = pa.array(sorted(shards), pa.int64()), shard_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        shard = pc.divide(batch.column("row"), self.shard_size)  # integer division: rows are >= 0
        return batch.filter(pc.is_in(shard, value_set=self.shards))


def _as_piece(row: dict) -> dict:
    """An embed output row as plain columns: the vector's float32 bytes (None if failed)."""
    vec = row.get("embedding")
    return {"row": int(row["row"]), "error": row.get("error"),
            "vector": None if vec is None else np.asarray(vec, dtype=np.float32).tobytes()}


def commit_vllm_shard(pieces: str, texts_at: str, out: ShardedOutput, shard: int, lo: int, hi: int) -> int:
    """Rows lo..hi of the vLLM pass's pieces, in order, written as the shard (a worker's
    task). A row the engine could not embed stops the job with its reason: a statement
    without a vector cannot be clustered."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    at = location(pieces)
    table = pads.dataset(at.path, filesystem=at.fs, format="parquet").to_table(
        filter=(pc.field("row") >= lo) & (pc.field("row") < hi)).sort_by("row")
    failed = table.filter(pc.is_valid(table.column("error")))
    if failed.num_rows:
        row = failed.column("row")[0].as_py()
        text = read_texts(texts_at)[row]
        raise RuntimeError(f"vLLM could not embed {failed.num_rows} text(s) of shard {shard}; first: row "
                           f"{row} ({text[:80]!r}): {failed.column('error')[0].as_py()}")
    rows = table.column("row").to_numpy()
    if len(rows) != hi - lo or (len(rows) and (rows[0] != lo or rows[-1] != hi - 1)):
        raise RuntimeError(f"vLLM returned {len(rows)} of the {hi - lo} rows of shard {shard}")
    vecs = np.frombuffer(b"".join(table.column("vector").to_pylist()), dtype=np.float32).reshape(hi - lo, -1)
    out.write_shard(shard, {TABLE: vectors_table(lo, vecs)}, {"rows": hi - lo})
    return hi - lo
