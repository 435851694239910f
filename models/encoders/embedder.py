"""The bi-encoder behind paraphrase clustering (role `embedder`): statements -> unit vectors.

Why unit vectors: clustering and approximate nearest-neighbour search then use the dot
product as the cosine similarity, with no per-pair normalisation. Two ways in:
- `Embedder` (sentence-transformers, CPU or one GPU) for laptops, tests and small jobs;
- `build_vllm_embed_processor` (`ray.data.llm`, vLLM's pooling runner) for big jobs on
  GPU clusters: rows `{"row": i, "statement": s}` in, `{"row": i, "embedding": v}` out.

Prompts: instruction-tuned embedders such as Qwen3-Embedding put an instruction before
the *query* side of asymmetric retrieval and nothing before documents. Paraphrase
similarity is symmetric (both sides are statements of the same kind), so by default no
prompt is used on either path, not even a model's configured default prompt: the same
text then always gives the same vector. `prompt=` adds one (prepended to every text)
when an experiment wants it.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from rexeval.threads import cpu_threads

DEFAULT_EMBED_ENGINE_KWARGS: dict[str, Any] = {
    # Statements are one sentence; a short context keeps vLLM's memory planning small.
    "max_model_len": 512,
}
ERROR_COLUMN = "__inference_error__"  # set by ray.data.llm on rows the engine failed


def resolve_device(device: str = "auto") -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; anything else unchanged."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def torch_dtype(dtype: str, device: str):
    """"auto" -> bfloat16 on CUDA, float32 elsewhere; else the named torch dtype."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype):
        raise TypeError(f"unknown torch dtype {dtype!r}")
    return value


def set_common_options(obj, location: str, model_ref: str | None, device: str, batch_size: int,
                       num_threads: int | None) -> None:
    """The options every local encoder takes: where the weights are (a model URI, as a
    driver ships it, is this node's checked copy: `refs.on_node`), the name to report,
    the device, the batch size and torch's CPU threads (process-wide)."""
    import torch

    from rexeval.models.refs import on_node

    if num_threads:
        torch.set_num_threads(cpu_threads(num_threads))
    obj.model_ref = model_ref or str(location)
    obj.location = on_node(str(location))
    obj.device = resolve_device(device)
    obj.batch_size = int(batch_size)
    if obj.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm in float32 (all-zero rows stay zero).

    Done explicitly even when the model normalises itself: half-precision GPU outputs
    and some poolers leave norms a few 1e-3 away from 1, and the clustering thresholds
    are cosine values.
    """
    matrix = np.asarray(matrix, dtype=np.float32)
    if matrix.ndim == 1:
        return l2_normalise(matrix[None])[0]
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1, keepdims=True)
    return (matrix / np.maximum(norms, 1e-12).astype(np.float32)).astype(np.float32)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("encode() takes a sequence of strings, not one string")
    texts = list(texts)
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"encode() needs strings; item {bad[0]} is {type(texts[bad[0]]).__name__}")
    return texts


class Embedder:
    """A sentence-transformers bi-encoder that returns float32, L2-normalised rows.

    sentence-transformers already sorts each call's inputs by length (less padding) and
    restores their order, so this class does not sort again.

    Options: device ("auto" | "cpu" | "cuda" | "cuda:N"), batch_size (64, the default of
    `encode`), num_threads (torch CPU threads; process-wide), dtype ("auto": float32 on
    CPU, bfloat16 on CUDA, or a torch dtype name), max_length (tokens; the model's own
    limit when None), model_kwargs / processor_kwargs (passed to sentence-transformers;
    e.g. processor_kwargs={"padding_side": "left"} as Qwen3-Embedding's card suggests).
    """

    def __init__(self, location: str, *, model_ref: str | None = None, device: str = "auto",
                 batch_size: int = 64, num_threads: int | None = None, dtype: str = "auto",
                 max_length: int | None = None, model_kwargs: dict[str, Any] | None = None,
                 processor_kwargs: dict[str, Any] | None = None):
        from sentence_transformers import SentenceTransformer

        set_common_options(self, location, model_ref, device, batch_size, num_threads)
        model_kwargs = {"dtype": torch_dtype(dtype, self.device), **(model_kwargs or {})}
        self.model = SentenceTransformer(self.location, device=self.device,
                                         model_kwargs=model_kwargs,
                                         processor_kwargs=processor_kwargs)
        if max_length:
            self.model.max_seq_length = int(max_length)
        self.model.eval()

    @property
    def dim(self) -> int:
        """Length of one embedding."""
        return int(self.model.get_embedding_dimension())

    def encode(self, texts: Sequence[str], batch_size: int | None = None,
               prompt: str | None = None) -> np.ndarray:
        """`[len(texts), dim]` float32 array of unit rows, in the order of `texts`.

        `prompt` is prepended to every text; None means none at all (see the module
        docstring for why a model's default prompt is not applied).
        """
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(texts, batch_size=int(batch_size or self.batch_size),
                                prompt=prompt or "",  # "" overrides a default prompt
                                convert_to_numpy=True, normalize_embeddings=False,
                                show_progress_bar=False)
        return l2_normalise(out)

    def __repr__(self) -> str:
        return f"Embedder({self.model_ref!r}, device={self.device!r})"


def build_embedder(ref: str, device: str = "auto", **options: Any) -> Embedder:
    """An `Embedder` for a model reference (a URI, path, packaged model such as
    "all-MiniLM-L6-v2", or hub id), resolved through `models.refs.resolve` here, where it
    is loaded."""
    from rexeval.models.refs import resolve

    return Embedder(resolve(ref).location, model_ref=ref, device=device, **options)


# --- vLLM on GPU clusters, through ray.data.llm ------------------------------------------

def vllm_embed_processor_config(model: str, *, batch_size: int = 256,
                                concurrency: int | Sequence[int] = 1,
                                engine_kwargs: dict[str, Any] | None = None,
                                accelerator_type: str | None = None):
    """`vLLMEngineProcessorConfig` for embeddings (vLLM's pooling runner, `task_type="embed"`).

    No chat template and no detokenising: the statement text is the whole prompt, and
    the tokenise stage runs on CPU workers ahead of the engine. `engine_kwargs` are
    merged over DEFAULT_EMBED_ENGINE_KWARGS; `concurrency` n is a pool of 1..n engine
    replicas, [m, n] a pool of m..n. Builds no engine and imports no vLLM. A model URI
    stays the `model_source`: Ray's engine stage copies it on the node it runs on.
    """
    from ray.data.llm import vLLMEngineProcessorConfig

    from rexeval.models.refs import shipped_location

    conc = (tuple(int(c) for c in concurrency) if isinstance(concurrency, (list, tuple))
            else int(concurrency))
    return vLLMEngineProcessorConfig(
        model_source=shipped_location(model),
        task_type="embed",
        engine_kwargs={**DEFAULT_EMBED_ENGINE_KWARGS, **(engine_kwargs or {})},
        batch_size=int(batch_size),
        concurrency=conc,
        accelerator_type=accelerator_type,
        chat_template_stage=False,
        tokenize_stage=True,
        detokenize_stage=False,
        should_continue_on_error=True,
    )


def to_embed_row(row: dict[str, Any], *, text_column: str = "statement",
                 prompt: str | None = None) -> dict[str, Any]:
    """Our row -> the embed stage's input: `prompt` is the text to embed (the tokenise
    stage turns it into `tokenized_prompt`). Other input columns ride along untouched."""
    return {"prompt": (prompt or "") + str(row[text_column])}


def from_embed_row(row: dict[str, Any], *, index_column: str = "row") -> dict[str, Any]:
    """An engine output row -> `{index_column, "embedding", "error"}`; the engine's
    `embeddings` are L2-normalised here (float32), failed rows get embedding None."""
    out = {index_column: row.get(index_column)}
    error = row.get(ERROR_COLUMN) or None
    if error or row.get("embeddings") is None:
        out.update(embedding=None, error=str(error or "no embedding from the vLLM engine"))
        return out
    vector = np.asarray(row["embeddings"], dtype=np.float32).reshape(-1)
    out.update(embedding=l2_normalise(vector), error=None)
    return out


def build_vllm_embed_processor(model: str, *, batch_size: int = 256,
                               concurrency: int | Sequence[int] = 1,
                               engine_kwargs: dict[str, Any] | None = None,
                               accelerator_type: str | None = None,
                               text_column: str = "statement", index_column: str = "row",
                               prompt: str | None = None):
    """A `ray.data.llm` Processor: rows `{index_column, text_column}` in, rows
    `{index_column, "embedding", "error"}` out (embedding: unit float32 vector, or None
    with `error` set when the engine failed that row).

    Building it starts/joins Ray (ray.data.llm calls `ray.init`) and reads the
    tokenizer's files, but imports no vLLM: the engine actors do, on GPU workers.
    """
    from ray.data.llm import build_processor

    from rexeval.models.llm.vllm_backend import FinishedRows

    processor = build_processor(
        vllm_embed_processor_config(model, batch_size=batch_size, concurrency=concurrency,
                                    engine_kwargs=engine_kwargs,
                                    accelerator_type=accelerator_type),
        preprocess=lambda row: to_embed_row(row, text_column=text_column, prompt=prompt),
        postprocess=lambda row: from_embed_row(row, index_column=index_column),
    )
    return FinishedRows(processor, functools.partial(_embed_row, index_column=index_column))


def _embed_row(row: dict[str, Any], index_column: str) -> dict[str, Any]:
    """A processor's output row -> {index_column, embedding, error} (an engine-failed row
    too: `FinishedRows`)."""
    if row.get(ERROR_COLUMN):
        return from_embed_row(row, index_column=index_column)
    return {k: row.get(k) for k in (index_column, "embedding", "error")}
