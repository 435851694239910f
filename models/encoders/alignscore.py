"""The AlignScore alignment model (role `alignscore`), run on our own pair engine.

AlignScore (Zha et al., 2023; seed 000, eq. 5) is a RoBERTa encoder with three small
heads trained on many "is text B supported by text A" tasks. rexeval uses its 3-way
head (ALIGNED / neutral / contradiction, MNLI's label order; softmax) and reads the
ALIGNED probability, as the AlignScore package does in its "nli_sp" evaluation mode.
This module scores
(premise, hypothesis) pairs; splitting texts into context chunks and claim sentences
and the max-then-mean aggregation live in `metrics/alignment.py`.

What the user supplies (nothing ships on PyPI, and the package's own loader needs
pytorch-lightning and the hub):

1. the checkpoint, `AlignScore-large.ckpt` (or -base) from the `yzha/AlignScore` hub
   repository: a (pytorch-)lightning checkpoint whose `state_dict` holds
   `base_model.*` (a RobertaModel with its pooler), `tri_layer.*` (the 3-way head) and
   parts this module ignores (`mlm_head.*`, `bin_layer.*`, `reg_layer.*`), and whose
   `hyper_parameters["model"]` names the base model ("roberta-large");
2. the base model's config and tokenizer (config.json + tokenizer files; the base
   weights are not needed, the checkpoint holds them). Where they are found, first hit
   wins:
     a. `base_model=` (a folder, or a hub id on hub machines);
     b. the checkpoint's own folder, when `location` is a folder holding the .ckpt and
        config.json (e.g. `/models/alignscore-large/{AlignScore-large.ckpt,
        config.json, tokenizer.json, ...}`);
     c. a sibling folder named after the base model:
        `/models/AlignScore-large.ckpt` + `/models/roberta-large/`;
     d. the base model's hub id from the checkpoint (machines with hub access).
   Offline with none of these, building fails with `ModelUnavailable` saying what to
   pass. To prepare such a folder once on a machine with hub access:
   `AutoConfig.from_pretrained("roberta-large").save_pretrained(d)` and
   `AutoTokenizer.from_pretrained("roberta-large").save_pretrained(d)`.

So `--model alignscore=/models/AlignScore-large.ckpt` works on its own when
`/models/roberta-large/` exists, and `build_alignscore(ckpt, base_model=folder)` names
the folder explicitly.

Loading needs no lightning: the checkpoint is read with `torch.load(weights_only=True)`.
Checkpoints that pickle other objects besides tensors (lightning's AttributeDict, numpy
scalars in callback states) are read again by a restricted unpickler that keeps torch's
weights-only allowlist and turns every other class into an inert placeholder, so no
code from the file runs. Every `base_model.*` weight of the encoder and the `tri_layer`
must be present (nothing is left random); unused heads are ignored.

Pairs are read as "<s> premise </s></s> hypothesis </s>" (premise = a context chunk,
hypothesis = a claim sentence). Efficiency is the shared machinery of
`pair_batching.py`: each distinct pair is scored once; pairs are tokenised in one call,
sorted by length and cut into batches padded to their own longest pair (the package
pads every pair to the tokenizer's model_max_length, 512: same result up to float
rounding, since padding is masked), forward passes under `torch.inference_mode`;
`last_stats` records the work.
Truncation is the NLI engine's (shared code): premise tokens go first, which is the
package's "only_first"; only a hypothesis too long to fit alone is cut too (the package
then switches its whole mini-batch of 32 pairs to "longest_first"; we switch only that
pair, so scores differ only in that rare case).
"""
from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rexeval.models.encoders.nli import NLIScorer, _zip_texts
from rexeval.models.encoders.pair_batching import BatchedPairModel, Row, pad_rows
from rexeval.models.refs import ModelUnavailable, NoModelAtPath, looks_like_path, resolve

ROLE = "alignscore"
ALIGNED = 0
"""Column of ALIGNED in the 3-way head's output (the package reads column 0)."""
BASE_PREFIX = "base_model."
HEAD_PREFIX = "tri_layer."
IGNORED_PREFIXES = ("mlm_head.", "bin_layer.", "reg_layer.", "generator", "discriminator")
"""Checkpoint parts the ALIGNED probability does not use."""
BUFFER_SUFFIXES = ("position_ids", "token_type_ids")
"""Constant buffers older transformers saved with the weights; rebuilt from the config."""


# --- reading the checkpoint -------------------------------------------------------------

class _Placeholder(dict):
    """Stands in for any class a checkpoint pickles that is not a tensor or container.

    Takes whatever arguments and state the pickle gives it and keeps them as data
    (dict items stay items: lightning's AttributeDict reads as a dict), running no code
    of the original class.
    """

    _pickled_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any):
        return dict.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()
        self.pickled_args = args

    def __setstate__(self, state: Any) -> None:
        self.pickled_state = state

    def __repr__(self) -> str:
        return f"<placeholder for {self._pickled_name} {dict(self)!r}>"


def _restricted_pickle_module():
    """A pickle module for torch.load whose unpickler resolves only torch's weights-only
    allowlist and maps every other global to a `_Placeholder` subclass."""
    from torch._weights_only_unpickler import _get_allowed_globals

    allowed = _get_allowed_globals()
    placeholders: dict[str, type] = {}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            full = f"{module}.{name}"
            if full in allowed:
                return allowed[full]
            if full not in placeholders:
                placeholders[full] = type(name, (_Placeholder,), {"_pickled_name": full})
            return placeholders[full]

    class Module:
        pass

    module = Module()
    module.Unpickler = Unpickler
    module.load = pickle.load
    module.__name__ = "rexeval_restricted_pickle"
    return module


def _torch_load(path: str) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        pass  # objects besides tensors: read them as inert placeholders
    except RuntimeError as exc:  # a legacy (non-zip) file cannot be memory-mapped
        if "mmap" not in str(exc):
            raise
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            pass
    return torch.load(path, map_location="cpu", weights_only=False,
                      pickle_module=_restricted_pickle_module())


def read_alignscore_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state dict, hyper-parameters) of an AlignScore checkpoint, without lightning.

    Accepts a lightning checkpoint (`state_dict` + `hyper_parameters`) or a bare state
    dict saved with torch.save (then the hyper-parameters are {}). ValueError when the
    file is no such checkpoint.
    """
    path = str(path)
    try:
        obj = _torch_load(path)
    except Exception as exc:
        raise ValueError(f"{path}: cannot read it as a torch checkpoint "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                         ) from exc
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: holds a {type(obj).__name__}, not a checkpoint dict")
    state = obj.get("state_dict", obj)
    hparams = (obj.get("hyper_parameters") or {}) if "state_dict" in obj else {}
    if not isinstance(state, Mapping) or not any(
            isinstance(k, str) and k.startswith(HEAD_PREFIX) for k in state):
        keys = sorted(str(k) for k in (state if isinstance(state, Mapping) else obj))[:6]
        raise ValueError(
            f"{path}: no AlignScore weights in it (no '{HEAD_PREFIX}*' keys; found "
            f"{keys}...). rexeval expects AlignScore-base.ckpt / AlignScore-large.ckpt from "
            "the yzha/AlignScore hub repository, or a lightning checkpoint of the AlignScore "
            "package's BERTAlignModel.")
    return dict(state), dict(hparams) if isinstance(hparams, Mapping) else {}


def split_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(encoder weights without the `base_model.` prefix, tri_layer weights without
    `tri_layer.`); every other part of the checkpoint is dropped."""
    base = {k[len(BASE_PREFIX):]: v for k, v in state.items() if k.startswith(BASE_PREFIX)}
    head = {k[len(HEAD_PREFIX):]: v for k, v in state.items() if k.startswith(HEAD_PREFIX)}
    return base, head


# --- finding the base model's config and tokenizer ----------------------------------------

def _has_config(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def find_base_model(checkpoint: Path, hparams: Mapping[str, Any], base_model: str | None,
                    checkpoint_dir: Path | None = None) -> str:
    """Where the base model's config and tokenizer are (module docstring, a-d): a local
    folder, or a hub id. ModelUnavailable when an explicit `base_model` path does not
    exist or no local candidate exists and the checkpoint names no base model."""
    if base_model is not None:
        if not isinstance(base_model, str) or not base_model.strip():
            raise _unavailable(str(checkpoint), f"empty base_model {base_model!r}")
        try:
            return resolve(base_model).location  # a URI: this node's copy
        except NoModelAtPath:
            raise _unavailable(str(checkpoint), f"base_model {base_model!r}: no such folder") from None
    named = str(hparams.get("model") or "").strip()
    candidates: list[Path] = []
    if checkpoint_dir is not None:
        candidates.append(checkpoint_dir)
    if named:
        candidates.append(checkpoint.parent / Path(named).name)
    for folder in candidates:
        if _has_config(folder):
            return str(folder)
    if named and Path(named).expanduser().is_dir():
        return str(Path(named).expanduser())  # the checkpoint names a local folder
    if named and not looks_like_path(named):
        return named  # a hub id: works on machines with hub access
    looked = ", ".join(str(c) for c in candidates) or "nowhere"
    raise _unavailable(str(checkpoint), _base_help(named, looked))


def _base_help(named: str, looked: str) -> str:
    name = named or "the base model"
    return (f"the config and tokenizer of its base model {name!r} were not found (looked "
            f"for config.json in: {looked}). Pass base_model=/path/to/folder (config.json "
            "and the tokenizer files of roberta-large for AlignScore-large, roberta-base for "
            f"AlignScore-base), or put that folder next to the checkpoint, named "
            f"{Path(named).name or 'roberta-large'!r}")


# --- the model ------------------------------------------------------------------------------

def _position_limit(config: Any) -> int | None:
    """Longest input the position embeddings allow (RoBERTa-style models reserve
    pad_token_id + 1 positions), None when the config does not say."""
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0:
        return None
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        n -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return n


def _alignment_module(config: Any, base_state: dict[str, Any], head_state: dict[str, Any],
                      model_ref: str):
    """The encoder (with its pooler) and the 3-way head, weights from the checkpoint."""
    import torch
    from transformers import AutoModel

    class AlignHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base_model = AutoModel.from_config(config)
            self.tri_layer = torch.nn.Linear(config.hidden_size, 3)

        def forward(self, **inputs):
            pooled = self.base_model(**inputs).pooler_output
            return self.tri_layer(pooled)

    module = AlignHead()
    if getattr(module.base_model, "pooler", None) is None:
        raise ValueError(f"{model_ref!r}: the base model {config.model_type!r} has no pooler; "
                         "AlignScore's heads read the pooled first token")
    state = {**{BASE_PREFIX + k: v for k, v in base_state.items()},
             **{HEAD_PREFIX + k: v for k, v in head_state.items()}}
    missing, unexpected = module.load_state_dict(state, strict=False)
    unexpected = [k for k in unexpected if not k.endswith(BUFFER_SUFFIXES)]
    missing = [k for k in missing if not k.endswith(BUFFER_SUFFIXES)]
    if missing or unexpected:
        raise ValueError(
            f"{model_ref!r}: the checkpoint does not fit a {type(module.base_model).__name__} "
            f"built from the base config ({len(missing)} weights missing, e.g. {missing[:3]}; "
            f"{len(unexpected)} unexpected, e.g. {unexpected[:3]}). Is base_model the model "
            "the checkpoint was trained from (roberta-large for AlignScore-large, "
            "roberta-base for AlignScore-base)?")
    return module


class AlignScorer(BatchedPairModel):
    """AlignScore's ALIGNED probability for (premise, hypothesis) pairs.

    `checkpoint`: the .ckpt file; `base_model`: where the base model's config and
    tokenizer are (folder or hub id; None: found as the module docstring says, with
    `checkpoint_dir` the folder the user named, if any).
    Options: device ("auto" | "cpu" | "cuda[:N]"), batch_size (32), max_length (None:
    the tokenizer's model_max_length, as the package does, capped by the position
    embeddings), num_threads (torch CPU threads, process-wide), dtype ("auto":
    float32 on CPU, bfloat16 on CUDA; "float32" for the package's numbers on GPU).
    """

    def __init__(self, checkpoint: str, *, base_model: str | None = None,
                 checkpoint_dir: str | None = None, max_length: int | None = None,
                 **options: Any):
        super().__init__(checkpoint, max_length=max_length or 0, **options)
        from transformers import AutoConfig, AutoTokenizer

        path = Path(self.location)
        state, self.hparams = read_alignscore_checkpoint(path)
        self.base_model = find_base_model(
            path, self.hparams, base_model, Path(checkpoint_dir) if checkpoint_dir else None)
        try:
            config = AutoConfig.from_pretrained(self.base_model)
            self.tokenizer = AutoTokenizer.from_pretrained(self.base_model)
        except (OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _unavailable(self.model_ref, f"cannot load the config and tokenizer of its "
                                               f"base model {self.base_model!r} ({first}). "
                               + _base_help(str(self.hparams.get("model") or ""),
                                            self.base_model)) from exc
        limits = [n for n in (getattr(self.tokenizer, "model_max_length", None),
                              _position_limit(config))
                  if isinstance(n, int) and 0 < n < 1_000_000]
        if max_length:
            self.max_length = min([int(max_length), *limits])
        else:
            self.max_length = min(limits) if limits else 512
        self._specials = self.tokenizer.num_special_tokens_to_add(pair=True)
        if self.max_length <= self._specials + 1:
            raise ValueError(f"max_length={self.max_length} leaves no room for text "
                             f"({self._specials} special tokens per pair)")
        base_state, head_state = split_state(state)
        del state
        module = _alignment_module(config, base_state, head_state, self.model_ref)
        self.model = module.to(device=self.device, dtype=self.dtype).eval()

    # --- public API ---------------------------------------------------------------

    def aligned_prob(self, premises: Sequence[str], hypotheses: Sequence[str],
                     batch_size: int | None = None) -> np.ndarray:
        """float32 [n]: P(ALIGNED) of the 3-way head for premises[i] -> hypotheses[i]
        (premise = the context chunk, hypothesis = the claim sentence)."""
        return self._run(_zip_texts(premises, hypotheses), batch_size)

    def encode(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[Row]:
        """Tokenised, unpadded rows, truncated to max_length (premise first)."""
        return self._encode(_zip_texts(premises, hypotheses))

    # --- BatchedPairModel ---------------------------------------------------------

    # Premise-first truncation, one tokenizer call for all pairs: the NLI engine's code,
    # which needs only `tokenizer`, `max_length` and `_specials`.
    _encode = NLIScorer._encode

    def _forward(self, batch: list[Row]) -> np.ndarray:
        import torch

        inputs = pad_rows(self.tokenizer, batch, self.device)
        with torch.inference_mode():
            logits = self.model(**inputs).float()
        probs = torch.softmax(logits, dim=-1)[:, ALIGNED]
        return probs.cpu().numpy().astype(np.float32, copy=False)


# --- building one from a reference -----------------------------------------------------

def _unavailable(ref: str, why: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"{ROLE} model {ref!r}: {why}. No PyPI package ships an AlignScore checkpoint, so "
        "the local profile has none and AlignScore is skipped; to run it, download "
        "AlignScore-large.ckpt (hub repository yzha/AlignScore) and pass "
        f"`--model {ROLE}=/path/to/AlignScore-large.ckpt`, with the roberta-large config "
        "and tokenizer in /path/to/roberta-large/ (or given as base_model=).")


def _find_checkpoint(ref: str) -> tuple[Path, Path | None]:
    """(the .ckpt file, the folder the user named or None)."""
    if not isinstance(ref, str) or not ref.strip():
        raise _unavailable(str(ref), "empty reference")
    path = Path(ref.strip()).expanduser()
    if path.is_file():
        return path.resolve(), None
    if path.is_dir():
        found = sorted(path.glob("*.ckpt"))
        if len(found) == 1:
            return found[0].resolve(), path.resolve()
        names = [f.name for f in found]
        what = f"{len(found)} .ckpt files {names}" if found else "no .ckpt file"
        raise _unavailable(ref, f"the folder holds {what}; name the checkpoint file itself")
    raise _unavailable(ref, "no such file or folder (AlignScore checkpoints are files, "
                            "not hub models)")


def build_alignscore(location: str, device: str = "auto", **options: Any) -> AlignScorer:
    """An `AlignScorer` for a checkpoint reference.

    `location`: the .ckpt file, or a folder holding exactly one .ckpt (and then possibly
    the base config and tokenizer too). `options`: base_model (folder or hub id of the
    base model's config + tokenizer, see the module docstring), batch_size, max_length,
    dtype, num_threads. A missing checkpoint or base config raises `ModelUnavailable`
    saying what to pass; a file that is no AlignScore checkpoint raises ValueError.
    """
    checkpoint, folder = _find_checkpoint(location)
    return AlignScorer(str(checkpoint), model_ref=str(location), device=device,
                       checkpoint_dir=str(folder) if folder else None, **options)
