"""The NLI engine (role `nli`): (premise, hypothesis) pairs in, P(entailment / neutral /
contradiction) out.

Used by the statement-level metrics (StEnt, StEnt-bin, StCoh), SummaC-ZS and the NLI Serve
deployment. Any Hugging Face 3-way NLI sequence classifier works (DeBERTa-large-MNLI,
RoBERTa-large-MNLI, ...). Checkpoints disagree on the order of their outputs, so the
order is read from `config.id2label` and every result is returned in one fixed column
order, `ENT, NEU, CON = 0, 1, 2`. A model that is not a 3-way classifier, or whose labels
do not name the three classes, is refused rather than guessed at: a paraphrase or
sentiment model must never be reported as NLI (pass `label_order=` when a checkpoint
only has LABEL_0..LABEL_2 names and its card gives the order).

Efficiency (the shared machinery of `pair_batching.py`): each distinct pair is scored
once; the pairs are tokenised in one call, sorted by token count and cut into batches
(little padding); forward passes run under `torch.inference_mode`; `last_stats` records
pairs, distinct pairs, batches, real and padded tokens and the time spent.
Truncation: a pair longer than max_length loses premise tokens first (the hypothesis is
the statement being checked); only when the hypothesis alone does not fit are both cut
(longest first).

For benchmarks, `prepare_batches` + `forward_batches` split the work so that the forward
passes alone can be timed on batches that are already tokenised, padded and on the device.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rexeval.models.encoders.pair_batching import (
    BatchedPairModel,
    Row,
    check_pairs,
    classifier_logits,
    dedupe,
    encoding_rows,
    length_batches,
    pad_rows,
    read_config_json,
    resolve_checkpoint,
)
from rexeval.models.refs import ModelUnavailable

ROLE = "nli"
ENT, NEU, CON = 0, 1, 2
"""Column of each class in every array this module returns."""
NLI_LABELS = ("entailment", "neutral", "contradiction")
"""Class names in column order."""

LABEL_ALIASES: dict[str, int] = {
    **dict.fromkeys(("entailment", "entail", "entails", "entailed", "ent"), ENT),
    **dict.fromkeys(("neutral", "neutr", "neu"), NEU),
    **dict.fromkeys(("contradiction", "contradict", "contradicts", "contradictory",
                     "contra", "con"), CON),
}
"""Label names (compared case-insensitively, exactly: "not_entailment" is no alias)."""


def label_class(name: object) -> int | None:
    """ENT / NEU / CON for a label name or alias, None for anything else."""
    return LABEL_ALIASES.get(str(name).strip().casefold().replace("-", "_").replace(" ", "_"))


def _labels_text(id2label: dict | None) -> str:
    labels = {int(k): str(v) for k, v in (id2label or {}).items()}
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in sorted(labels.items())) + "}"


def nli_columns(id2label: dict | None, label_order: Sequence[str] | None = None, *,
                model_ref: str = "the checkpoint") -> tuple[int, int, int]:
    """Model output index of entailment, neutral and contradiction (in that order).

    Read from `id2label` ({index: name}), or from `label_order`, the class of each model
    output in index order (e.g. ("contradiction", "neutral", "entailment")), which
    overrides it. ValueError when the three classes cannot be told apart.
    """
    if label_order is not None:
        if isinstance(label_order, str) or len(label_order) != 3:
            raise ValueError(f"label_order must name the class of each of the 3 outputs in "
                             f"index order, e.g. {NLI_LABELS}; got {label_order!r}")
        classes = [label_class(name) for name in label_order]
        source = f"label_order={tuple(label_order)!r}"
    else:
        labels = {int(k): v for k, v in (id2label or {}).items()}
        classes = [label_class(labels.get(i)) for i in range(3)]
        source = f"config.id2label {_labels_text(id2label)}"
    if None in classes or sorted(classes) != [ENT, NEU, CON]:
        raise ValueError(
            f"{model_ref!r}: cannot tell which outputs are entailment, neutral and "
            f"contradiction from {source}. Label names must be those classes (any case) or "
            f"one of the aliases {sorted(LABEL_ALIASES)}, each once. If the model card gives "
            "the order, pass it as label_order=, the class of each output in index order, "
            f"e.g. label_order={NLI_LABELS!r}.")
    return (classes.index(ENT), classes.index(NEU), classes.index(CON))


def _check_nli_config(config: Any, model_ref: str) -> None:
    """Refuse what is not a 3-way sequence classifier (before any weights are loaded)."""
    archs = [str(a) for a in getattr(config, "architectures", None) or []]
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise ValueError(
            f"{model_ref!r} has architectures {archs or 'missing'}, not a "
            "*ForSequenceClassification checkpoint, so it is no NLI classifier. The "
            f"{ROLE!r} role needs a 3-way NLI model such as microsoft/deberta-large-mnli "
            "or roberta-large-mnli.")
    num_labels = int(config.num_labels)
    if num_labels != 3:
        raise ValueError(
            f"{model_ref!r} is a {num_labels}-label classifier "
            f"({_labels_text(config.id2label)}), not a 3-way NLI model (entailment / "
            f"neutral / contradiction). The {ROLE!r} role needs one such as "
            "microsoft/deberta-large-mnli or roberta-large-mnli; 2-way "
            "entailment / not-entailment models are not accepted.")


class NLIScorer(BatchedPairModel):
    """A 3-way NLI sequence classifier reading "[CLS] premise [SEP] hypothesis [SEP]".

    Options: device ("auto" | "cpu" | "cuda[:N]"), batch_size (32), max_length (512 tokens
    per pair, capped at the tokenizer's own limit), num_threads (torch CPU threads,
    process-wide), dtype ("auto": float32 on CPU, bfloat16 on CUDA; or e.g. "float16"),
    label_order (overrides config.id2label, see `nli_columns`).
    """

    def __init__(self, location: str, *, max_length: int = 512,
                 label_order: Sequence[str] | None = None, **options: Any):
        super().__init__(location, max_length=max_length, **options)
        from rexeval.models.hf_import import import_transformers

        transformers = import_transformers()
        AutoConfig, AutoModelForSequenceClassification, AutoTokenizer = (
            transformers.AutoConfig, transformers.AutoModelForSequenceClassification, transformers.AutoTokenizer)

        config = AutoConfig.from_pretrained(self.location)
        _check_nli_config(config, self.model_ref)
        self.id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
        # model output index of ENT, NEU, CON
        self.columns = nli_columns(self.id2label, label_order, model_ref=self.model_ref)
        self.tokenizer = AutoTokenizer.from_pretrained(self.location)
        limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(limit, int) and 0 < limit < 1_000_000:
            self.max_length = min(self.max_length, limit)
        self._specials = self.tokenizer.num_special_tokens_to_add(pair=True)
        if self.max_length <= self._specials + 1:
            raise ValueError(f"max_length={self.max_length} leaves no room for text "
                             f"({self._specials} special tokens per pair)")
        model, info = AutoModelForSequenceClassification.from_pretrained(
            self.location, dtype=self.dtype, output_loading_info=True)
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            raise ValueError(
                f"{self.model_ref!r}: weights {missing[:4]} are missing from the checkpoint "
                "(they would be random), so it is no trained NLI classifier")
        self.model = model.to(self.device).eval()

    # --- public API ---------------------------------------------------------------

    def score(self, premises: Sequence[str], hypotheses: Sequence[str],
              batch_size: int | None = None) -> np.ndarray:
        """float32 [n, 3] probabilities, columns (ENT, NEU, CON), rows in input order;
        row i is P(class | premises[i] -> hypotheses[i]) and sums to 1."""
        return self._run(_zip_texts(premises, hypotheses), batch_size, width=(3,))

    def score_pairs(self, pairs: Sequence[tuple[str, str]],
                    batch_size: int | None = None) -> np.ndarray:
        """`score` for a sequence of (premise, hypothesis) pairs."""
        return self._run(check_pairs(pairs), batch_size, width=(3,))

    def encode(self, premises: Sequence[str], hypotheses: Sequence[str]) -> list[Row]:
        """Tokenised, unpadded rows (`input_ids`, and `token_type_ids` where the model
        has them), truncated to max_length (premise first)."""
        return self._encode(_zip_texts(premises, hypotheses))

    def prepare_batches(self, premises: Sequence[str], hypotheses: Sequence[str],
                        batch_size: int | None = None) -> list[dict[str, Any]]:
        """The padded input tensors, on the device, of the batches `score` would run:
        distinct pairs, sorted by length, batch_size per batch."""
        unique, _ = dedupe(_zip_texts(premises, hypotheses))
        rows = self._encode(unique)
        chunks = length_batches([len(r["input_ids"]) for r in rows],
                                int(batch_size or self.batch_size))
        return [pad_rows(self.tokenizer, [rows[i] for i in chunk], self.device)
                for chunk in chunks]

    def forward_batches(self, batches: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        """Forward passes alone over `prepare_batches` output: one float32 [b, 3] array
        of probabilities (columns ENT, NEU, CON) per batch."""
        return [self._probabilities(batch) for batch in batches]

    # --- BatchedPairModel ---------------------------------------------------------

    def _encode(self, pairs: list[tuple[str, str]]) -> list[Row]:
        if not pairs:
            return []
        tok = self.tokenizer
        premises = [p for p, _ in pairs]
        hypotheses = [h for _, h in pairs]
        # Untruncated first (one call for all); only the too-long pairs are redone.
        rows = encoding_rows(tok(premises, hypotheses, truncation=False, verbose=False))
        long = [i for i, row in enumerate(rows) if len(row["input_ids"]) > self.max_length]
        if long:
            hyp_lengths = [len(ids) for ids in tok([hypotheses[i] for i in long],
                                                   add_special_tokens=False,
                                                   verbose=False)["input_ids"]]
            room = self.max_length - self._specials - 1  # keep >= 1 premise token
            for strategy, group in (
                    ("only_first", [i for i, n in zip(long, hyp_lengths) if n <= room]),
                    ("longest_first", [i for i, n in zip(long, hyp_lengths) if n > room])):
                if group:
                    cut = encoding_rows(tok([premises[i] for i in group],
                                            [hypotheses[i] for i in group],
                                            truncation=strategy, max_length=self.max_length))
                    for i, row in zip(group, cut):
                        rows[i] = row
        return rows

    def _forward(self, batch: list[Row]) -> np.ndarray:
        return self._probabilities(pad_rows(self.tokenizer, batch, self.device))

    def _launch(self, batch: list[Row]):
        return self._device_probabilities(pad_rows(self.tokenizer, batch, self.device))

    def _probabilities(self, inputs: dict[str, Any]) -> np.ndarray:
        return self._device_probabilities(inputs).cpu().numpy().astype(np.float32, copy=False)

    def _device_probabilities(self, inputs: dict[str, Any]):
        """float32 [b, 3] (ENT, NEU, CON) as a tensor on the model's device."""
        import torch

        logits = classifier_logits(self.model, inputs)
        return torch.softmax(logits, dim=-1)[:, list(self.columns)]


def score_unique(pairs: list[tuple[str, str]], scorer) -> tuple[np.ndarray, int]:
    """Probabilities [len(pairs), 3] with each distinct pair scored once; and how many
    distinct pairs there were. `scorer` is anything with `score(premises, hypotheses)
    -> [N, 3]`: an `NLIScorer`, a client of the NLI Serve deployment, a test double.
    Shared by the statement-level NLI metrics and SummaC, which repeat many pairs."""
    if not pairs:
        return np.zeros((0, 3), dtype=np.float32), 0
    index: dict[tuple[str, str], int] = {}
    inverse = np.fromiter((index.setdefault(p, len(index)) for p in pairs), dtype=np.int64, count=len(pairs))
    unique = list(index)
    probs = np.asarray(scorer.score([p for p, _ in unique], [h for _, h in unique]), dtype=np.float32)
    if probs.shape != (len(unique), 3):
        raise ValueError(f"the NLI scorer returned shape {probs.shape}, expected ({len(unique)}, 3)")
    return probs[inverse], len(unique)


def _zip_texts(premises: Sequence[str], hypotheses: Sequence[str]) -> list[tuple[str, str]]:
    for name, texts in (("premises", premises), ("hypotheses", hypotheses)):
        if isinstance(texts, (str, bytes)):
            raise TypeError(f"{name} must be a sequence of strings, not one string")
    premises, hypotheses = list(premises), list(hypotheses)
    if len(premises) != len(hypotheses):
        raise ValueError(f"premises and hypotheses differ in length "
                         f"({len(premises)} vs {len(hypotheses)}); they are read as pairs")
    return check_pairs(list(zip(premises, hypotheses)))


# --- building one from a reference -----------------------------------------------------

def _unavailable(ref: str, why: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"{ROLE} model {ref!r}: {why}. No PyPI package ships an NLI model, so the local "
        "profile has none and the NLI-based metrics (StEnt, StCoh, SummaC) are skipped; to "
        f"run them, pass a 3-way NLI checkpoint with `--model {ROLE}=/path/to/checkpoint` "
        "(e.g. a saved microsoft/deberta-large-mnli or roberta-large-mnli), or a Hugging "
        "Face id on a machine with hub access.")


def build_nli(ref: str, device: str = "auto", **options: Any) -> NLIScorer:
    """An `NLIScorer` for a model reference (local path, or hub id on hub machines),
    resolved through `models.refs.resolve`; `options` go to `NLIScorer` (batch_size,
    max_length, dtype, label_order, ...). A reference that names no existing path or
    reachable model raises `ModelUnavailable` saying how to supply one."""
    location = resolve_checkpoint(ref, _unavailable)
    read_config_json(location, ref, _unavailable, "it cannot be an NLI classifier")
    try:
        return NLIScorer(location, model_ref=ref, device=device, **options)
    except OSError as exc:  # transformers' "not a local folder and not on the hub"
        raise _unavailable(ref, f"cannot load it ({str(exc).splitlines()[0]})") from exc
