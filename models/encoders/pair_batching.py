"""What every model that reads two texts together shares: pair checks, de-duplication,
tokenise-once length bucketing, padding, statistics, and finding the checkpoint.

Used by the paraphrase pair scorers (`pair_scorer.py`, role `cross_encoder`) and the NLI
engine (`nli.py`, role `nli`). A model subclasses `BatchedPairModel` and writes two
methods: `_encode(pairs)` (the tokenizer's unpadded row for each pair) and
`_forward(rows)` (one float32 result row per input row). `_run` then
  1. scores each distinct (a, b) pair once and copies the result to every occurrence
     (statement-level metrics ask the same question many times: one reference statement
     against every statement of several generated explanations);
  2. tokenises the distinct pairs in one call, sorts them by token count and cuts the
     sorted list into batches, so a batch holds pairs of similar length and little
     padding;
  3. gives the results back in input order, and records what it did in `last_stats`.
Results equal one-at-a-time scoring up to float rounding (padding is masked out).

On a GPU a model that also writes `_launch` (a batch's result as a device tensor, not
waited for) can take an overlapped loop (`overlap`): a background thread tokenises the
next chunk of distinct pairs (`OVERLAP_CHUNK_BATCHES` batches' worth, sorted by length
within the chunk) while the main thread pads batches into pinned memory and queues their
forward passes; results stay on the device and come back in one copy at the end. It pays
only where the GPU, not the CPU, is the bottleneck. Measured on an H200
(benchmarks/gpu_check.py, results in benchmarks/results/gpu/): for a BERT-large-size
classifier in bfloat16 (the size of the seeds' NLI models) `score` went from 0.75x to
0.95x of the forward passes alone; for a MiniLM-size one, whose forward passes are
shorter than the tokenising and padding in Python, the thread's share of the GIL made
`score` 10-30% slower than the plain loop (medians of 3). So "auto" overlaps on CUDA for
models of at least `OVERLAP_MIN_PARAMETERS` parameters only.
"""
from __future__ import annotations

import abc
import json
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rexeval.models.encoders.embedder import set_common_options, torch_dtype
from rexeval.models.refs import ModelUnavailable, NoModelAtPath, resolve

Row = dict[str, Any]
"""One tokenised pair, unpadded: at least `input_ids` (its length is the sort key)."""

OVERLAP_CHUNK_BATCHES = 32
"""Batches' worth of pairs tokenised at a time by the overlapped loop (see module doc)."""
OVERLAP_MIN_PARAMETERS = 100_000_000
"""The smallest model "auto" overlaps on CUDA (MiniLM, 23M: slower; BERT-large, 335M: faster)."""


def check_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """`pairs` as a list of (str, str) tuples; TypeError naming the first bad one."""
    if isinstance(pairs, (str, bytes)):
        raise TypeError("pairs must be a sequence of (text, text) pairs, not one string")
    out = []
    for i, pair in enumerate(pairs):
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(s, str) for s in pair)):
            raise TypeError(f"pair {i} must be two strings, got {pair!r}")
        out.append((pair[0], pair[1]))
    return out


def dedupe(items: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """(distinct items in first-seen order, index of each input in that list)."""
    first: dict[Any, int] = {}
    inverse = np.fromiter((first.setdefault(item, len(first)) for item in items),
                          dtype=np.int64, count=len(items))
    return list(first), inverse


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices sorted by length (stable, shortest first), cut into runs of batch_size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


@dataclass
class BatchStats:
    """What the last call did. `padded_tokens` counts the cells of the padded input
    tensors (real + padding), i.e. what the model computed over; `real_tokens` the
    tokens of the distinct pairs. Seconds are wall time: tokenising, and padding +
    forward passes + copying back."""

    pairs: int = 0
    unique_pairs: int = 0
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    encode_seconds: float = 0.0
    forward_seconds: float = 0.0

    @property
    def pad_tokens(self) -> int:
        """Padding cells: padded_tokens - real_tokens."""
        return self.padded_tokens - self.real_tokens

    @property
    def padding_fraction(self) -> float:
        """Share of the computed cells that are padding (0 with no input)."""
        return self.pad_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "pad_tokens": self.pad_tokens,
                "padding_fraction": self.padding_fraction}


class BatchedPairModel(abc.ABC):
    """Options shared by the pair models, and the batching loop.

    Options: device ("auto" | "cpu" | "cuda[:N]"), batch_size (pairs per forward pass),
    max_length (tokens per pair; longer pairs are truncated), num_threads (torch CPU
    threads, process-wide), dtype ("auto": float32 on CPU, bfloat16 on CUDA; or a torch
    dtype name such as "float16"), overlap ("auto": on CUDA for a model that writes
    `_launch` and has at least `OVERLAP_MIN_PARAMETERS` parameters; True or False to
    force it; see the module docstring).
    """

    last_stats: BatchStats = BatchStats()

    def __init__(self, location: str, *, model_ref: str | None = None, device: str = "auto",
                 batch_size: int = 32, max_length: int = 256, num_threads: int | None = None,
                 dtype: str = "auto", overlap: bool | str = "auto"):
        set_common_options(self, location, model_ref, device, batch_size, num_threads)
        self.max_length = int(max_length)
        self.dtype = torch_dtype(dtype, self.device)
        self.last_stats = BatchStats()
        if overlap not in ("auto", True, False):
            raise ValueError(f"overlap must be 'auto', True or False, got {overlap!r}")
        self.overlap = overlap

    @abc.abstractmethod
    def _encode(self, pairs: list[tuple[str, str]]) -> list[Row]:
        """Tokenizer output of every pair, unpadded (`input_ids` and the like)."""

    @abc.abstractmethod
    def _forward(self, batch: list[Row]) -> np.ndarray:
        """float32 results for one batch of `_encode` rows, one row per pair."""

    def _launch(self, batch: list[Row]):
        """`_forward`'s result as a torch tensor, for the overlapped loop. A model writes
        its own to leave the result on the device, not waited for; one that keeps this
        default (`_forward`, on the CPU) is never overlapped."""
        import torch

        return torch.from_numpy(np.asarray(self._forward(batch), dtype=np.float32))

    def overlaps(self) -> bool:
        """Whether `_run` takes the overlapped loop (see the module docstring)."""
        if type(self)._launch is BatchedPairModel._launch or self.overlap is False:
            return False
        if self.overlap is True:
            return True
        model = getattr(self, "model", None)
        size = sum(p.numel() for p in model.parameters()) if model is not None else 0
        return str(self.device).startswith("cuda") and size >= OVERLAP_MIN_PARAMETERS

    def _run(self, pairs: list[tuple[str, str]], batch_size: int | None = None,
             width: tuple[int, ...] = ()) -> np.ndarray:
        """`_forward` results for checked `pairs`, in input order, each distinct pair
        computed once; an empty input gives a float32 array of shape (0, *width)."""
        size = int(batch_size or self.batch_size)
        if size < 1:
            raise ValueError(f"batch_size must be >= 1, got {size}")
        stats = BatchStats(pairs=len(pairs))
        if not pairs:
            self.last_stats = stats
            return np.zeros((0, *width), dtype=np.float32)
        unique, inverse = dedupe(pairs)
        stats.unique_pairs = len(unique)
        if self.overlaps():
            out = self._run_overlapped(unique, size, stats)
            self.last_stats = stats
            return out[inverse]
        start = time.perf_counter()
        rows = self._encode(unique)
        stats.encode_seconds = time.perf_counter() - start
        lengths = [len(row["input_ids"]) for row in rows]
        start = time.perf_counter()
        out: np.ndarray | None = None
        for chunk in length_batches(lengths, size):
            result = np.asarray(self._forward([rows[i] for i in chunk]), dtype=np.float32)
            if out is None:
                out = np.empty((len(rows), *result.shape[1:]), dtype=np.float32)
            out[chunk] = result
            stats.batches += 1
            stats.real_tokens += sum(lengths[i] for i in chunk)
            stats.padded_tokens += len(chunk) * max(lengths[i] for i in chunk)
        stats.forward_seconds = time.perf_counter() - start
        self.last_stats = stats
        return out[inverse]

    def _tokenising_twin(self) -> BatchedPairModel:
        """A shallow copy with a tokenizer of its own, for the tokenising thread: a fast
        tokenizer is not safe to use from two threads at once (its padding and truncation
        settings are state that `pad_rows` and `_encode` both set)."""
        import copy

        twin = self.__dict__.get("_twin")
        if twin is None:
            twin = copy.copy(self)
            twin.tokenizer = copy.deepcopy(self.tokenizer)
            self._twin = twin
        return twin

    def _run_overlapped(self, unique: list[tuple[str, str]], size: int, stats: BatchStats) -> np.ndarray:
        """The GPU loop: tokenise chunk k+1 in a thread while chunk k's batches are padded
        and queued; one copy back at the end. `encode_seconds` counts only the time spent
        waiting for a chunk's tokens; `forward_seconds` the rest."""
        import torch

        chunk = size * OVERLAP_CHUNK_BATCHES
        starts = list(range(0, len(unique), chunk))
        encode = self._tokenising_twin()._encode
        launched: list[tuple[np.ndarray, Any]] = []
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pair-tokenise") as pool:
            pending = pool.submit(encode, unique[:chunk])
            for k, first in enumerate(starts):
                waited = time.perf_counter()
                rows = pending.result()
                stats.encode_seconds += time.perf_counter() - waited
                if k + 1 < len(starts):
                    pending = pool.submit(encode, unique[starts[k + 1]:starts[k + 1] + chunk])
                lengths = [len(row["input_ids"]) for row in rows]
                for part in length_batches(lengths, size):
                    launched.append((np.asarray(part, dtype=np.int64) + first,
                                     self._launch([rows[i] for i in part])))
                    stats.batches += 1
                    stats.real_tokens += sum(lengths[i] for i in part)
                    stats.padded_tokens += len(part) * max(lengths[i] for i in part)
        values = torch.cat([t for _, t in launched]).float().cpu().numpy()
        out = np.empty((len(unique), *values.shape[1:]), dtype=np.float32)
        out[np.concatenate([i for i, _ in launched])] = values
        stats.forward_seconds = time.perf_counter() - start - stats.encode_seconds
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_ref!r}, device={self.device!r})"


# --- Hugging Face tokenizers and sequence classifiers ----------------------------------

ROW_KEYS = ("input_ids", "token_type_ids")
"""What a row keeps of the tokenizer output; `pad` rebuilds the attention mask."""


def encoding_rows(enc: Any) -> list[Row]:
    """A batched tokenizer output split into one unpadded row per pair."""
    keys = [k for k in ROW_KEYS if k in enc]
    return [dict(zip(keys, vals)) for vals in zip(*(enc[k] for k in keys))]


def pad_rows(tokenizer: Any, rows: list[Row], device: str) -> dict[str, Any]:
    """Rows padded to the longest one (the tokenizer's padding side), as tensors on
    `device`, with the attention mask. To CUDA through pinned memory, not waited for
    (a copy from pageable memory would wait for the GPU's queued work first)."""
    padded = tokenizer.pad(rows, padding=True, return_tensors="pt")
    if str(device).startswith("cuda"):
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in padded.items()}
    return {k: v.to(device) for k, v in padded.items()}


def classifier_logits(model: Any, inputs: dict[str, Any]):
    """float32 logits [batch, num_labels] of a sequence classifier for padded inputs."""
    import torch

    with torch.inference_mode():
        return model(**inputs).logits.float()


# --- finding the checkpoint ------------------------------------------------------------

Unavailable = Callable[[str, str], ModelUnavailable]
"""(ref, why) -> the role's ModelUnavailable, whose message says how to supply a model."""


def resolve_checkpoint(ref: str, unavailable: Unavailable) -> str:
    """Where `ref` is (see `models.refs.resolve`); `unavailable(ref, why)` is raised for an
    empty reference or a path that does not exist."""
    if not isinstance(ref, str) or not ref.strip():
        raise unavailable(str(ref), "empty reference")
    try:
        return resolve(ref, prepare=True).location
    except NoModelAtPath:
        raise unavailable(ref, "no such file or folder") from None


def read_config_json(location: str, ref: str, unavailable: Unavailable,
                     consequence: str = "") -> tuple[dict, str]:
    """The checkpoint's config.json as a dict, and where it was read from.

    A local folder without one is a ValueError (it is not a checkpoint; `consequence`,
    e.g. "its kind cannot be detected", ends the message); a hub id whose config cannot
    be fetched is `unavailable(ref, why)`.
    """
    path = Path(location)
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise ValueError(f"{file} not found: {ref!r} is not a Hugging Face checkpoint "
                             f"folder{', so ' + consequence if consequence else ''}")
    else:
        try:
            from huggingface_hub import hf_hub_download

            file = Path(hf_hub_download(location, "config.json"))
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise unavailable(ref, f"cannot get its config.json ({type(exc).__name__}: "
                                   f"{first})") from exc
    try:
        return json.loads(file.read_text()), str(file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{file}: cannot read the checkpoint config ({exc})") from exc
