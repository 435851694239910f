"""The models behind BARTScore and BLEURT (seed 000, IV.A.5): `BartScorer` and
`BleurtScorer`, each loaded once per (location, device) in a process and kept
(`get_bartscorer`, `get_bleurt_scorer`), behind a lock, so batch workers and threads
share it.

Why it lives here: it holds weights. The metrics (the BARTScore directions and their F
score, input checks, registration) are `metrics/learned.py`, whose docstring defines
both scores; this module turns (source, target) or (reference, candidate) pairs into one
float64 value each. Neither class picks a model: the caller passes a *location* (a local
Hugging Face folder, or a hub id on machines with hub access; `models.refs` resolution),
and a missing one is a `ModelUnavailable` that says no PyPI package ships one.

Batching (shared with the pair scorers, `pair_batching.py`): each distinct pair is
scored once; pairs are tokenised once, sorted by length, cut into batches of
`batch_size`, right-padded with an attention mask and run under `torch.inference_mode`.
Padding is masked out, so a pair's score does not depend on the batch it lands in (equal
up to float rounding, ~1e-6). Tokenizers get a usable truncation length as BERTScore's
do (`bertscore_model.fix_model_max_length`).

`BartScorer`: a sequence-to-sequence model (BART); a pair's value is the mean
log-likelihood of the target's tokens as the tokenizer writes them (special tokens
included) given the source. The decoder reads the target shifted right behind the
model's `decoder_start_token_id` (teacher forcing); padding positions are neither
predicted nor counted; texts are truncated to the model's length limit.

`BleurtScorer`: a one-output sequence-regression model reading "[CLS] reference [SEP]
candidate [SEP]" (truncated, the longer text first); a pair's value is its raw logit.
Loading:
- a folder whose config.json says `model_type: "bleurt"` (the PyTorch ports of the
  official checkpoints, e.g. lucadiliello/BLEURT-20-D12) needs the optional
  `bleurt_pytorch` package (`BleurtConfig`, `BleurtForSequenceClassification`,
  `BleurtTokenizer`); without it a clear ModelUnavailable says so;
- anything else loads with `AutoModelForSequenceClassification` + `AutoTokenizer`.
A checkpoint whose head has more than one output (a classifier, e.g. NLI) is refused
with a ValueError naming the folder and its num_labels: BLEURT is a regression.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rexeval.models.encoders.bertscore_model import fix_model_max_length
from rexeval.models.encoders.pair_batching import (
    BatchedPairModel,
    Row,
    check_pairs,
    classifier_logits,
    encoding_rows,
    pad_rows,
    read_config_json,
    resolve_checkpoint,
)
from rexeval.models.process_cache import ProcessCache
from rexeval.models.refs import ModelUnavailable


def _unavailable(metric: str, kind: str):
    def make(ref: str, why: str) -> ModelUnavailable:
        return ModelUnavailable(
            f"{metric} needs a {kind} checkpoint; {ref!r} cannot be used ({why}). No PyPI "
            "package ships one: pass a local Hugging Face folder (or a hub id on a machine "
            "with hub access)."
        )
    return make


# ------------------------------------------------------------------------ BARTScore

class BartScorer(BatchedPairModel):
    """A seq2seq model scoring (source, target) pairs by the mean log-likelihood of the
    target's tokens (see the module docstring). Built by `get_bartscorer`."""

    def __init__(self, location: str, *, model_ref: str | None = None, device: str = "cpu",
                 batch_size: int = 16, dtype: str = "float32"):
        super().__init__(location, model_ref=model_ref, device=device, batch_size=batch_size,
                         dtype=dtype)
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.location)
        self.tokenizer.padding_side = "right"
        self.model = AutoModelForSeq2SeqLM.from_pretrained(
            self.location, dtype=self.dtype).to(self.device).eval()
        config = self.model.config
        self.max_length = fix_model_max_length(self.tokenizer, config)
        start = getattr(config, "decoder_start_token_id", None)
        if start is None:
            start = getattr(getattr(self.model, "generation_config", None),
                            "decoder_start_token_id", None)
        if start is None:
            raise ValueError(f"{self.location}: the model config has no decoder_start_token_id, "
                             "so the target cannot be shifted for teacher forcing")
        self.decoder_start_token_id = int(start)
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = getattr(config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else 0

    def _encode(self, pairs: list[tuple[str, str]]) -> list[Row]:
        def ids(texts):
            return self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]

        sources = ids([s for s, _ in pairs])
        targets = ids([t for _, t in pairs])
        return [{"input_ids": list(s), "target_ids": list(t)} for s, t in zip(sources, targets)]

    def _forward(self, batch: list[Row]) -> np.ndarray:
        import torch

        src = pad_rows(self.tokenizer, [{"input_ids": r["input_ids"]} for r in batch],
                       self.device)
        width = max(len(r["target_ids"]) for r in batch)
        labels = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, row in enumerate(batch):
            labels[i, :len(row["target_ids"])] = torch.tensor(row["target_ids"])
            mask[i, :len(row["target_ids"])] = 1
        decoder_in = torch.full_like(labels, self.pad_token_id)
        decoder_in[:, 0] = self.decoder_start_token_id
        decoder_in[:, 1:] = labels[:, :-1]
        labels, mask, decoder_in = (t.to(self.device) for t in (labels, mask, decoder_in))
        with torch.inference_mode():
            logits = self.model(input_ids=src["input_ids"], attention_mask=src["attention_mask"],
                                decoder_input_ids=decoder_in,
                                decoder_attention_mask=mask).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            token_logp = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            maskf = mask.to(token_logp.dtype)
            mean = (token_logp * maskf).sum(dim=1) / maskf.sum(dim=1).clamp_min(1.0)
        return mean.double().cpu().numpy()

    def score_pairs(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None
                    ) -> np.ndarray:
        """Mean target-token log-likelihood of each (source, target) pair, float64."""
        return self._run(check_pairs(pairs), batch_size).astype(np.float64)


_BART: ProcessCache[BartScorer] = ProcessCache()  # by (location, device)
_BLEURT: ProcessCache[BleurtScorer] = ProcessCache()


def _cached(cache: ProcessCache, location: str, device: str, build):
    from rexeval.models.encoders.embedder import resolve_device

    key = (str(location), resolve_device(device))
    return cache.get(key, lambda: build(*key))


def get_bartscorer(model_location: str, device: str = "cpu") -> BartScorer:
    """The process-wide `BartScorer` for (location, device), loaded on first use."""
    def build(location: str, dev: str) -> BartScorer:
        path = resolve_checkpoint(location, _unavailable("BARTScore", "sequence-to-sequence (BART)"))
        return BartScorer(path, model_ref=location, device=dev)

    return _cached(_BART, model_location, device, build)


def clear_learned_cache() -> None:
    """Forget every cached BARTScore / BLEURT model."""
    _BART.clear()
    _BLEURT.clear()


# --------------------------------------------------------------------------- BLEURT

class BleurtScorer(BatchedPairModel):
    """A one-output sequence-regression model scoring (reference, candidate) pairs by its
    raw logit. Built by `get_bleurt_scorer`."""

    def __init__(self, location: str, *, model_ref: str | None = None, device: str = "cpu",
                 batch_size: int = 32, dtype: str = "float32"):
        super().__init__(location, model_ref=model_ref, device=device, batch_size=batch_size,
                         dtype=dtype)
        ref = model_ref or location
        raw, _ = read_config_json(self.location, ref, _unavailable("BLEURT", "BLEURT"),
                                  "its kind cannot be detected")
        architectures = [str(a) for a in raw.get("architectures") or []]
        self.is_bleurt_port = (raw.get("model_type") == "bleurt"
                               or any(a.startswith("Bleurt") for a in architectures))
        if self.is_bleurt_port:
            config_cls, model_cls, tokenizer_cls = _bleurt_pytorch_classes(self.location)
        else:
            from transformers import (
                AutoConfig,
                AutoModelForSequenceClassification,
                AutoTokenizer,
            )

            config_cls, model_cls, tokenizer_cls = (AutoConfig, AutoModelForSequenceClassification,
                                                    AutoTokenizer)
        config = config_cls.from_pretrained(self.location)
        self.num_labels = int(config.num_labels)
        if self.num_labels != 1:
            labels = ", ".join(str(v) for _, v in sorted((config.id2label or {}).items()))
            raise ValueError(
                f"{self.location}: BLEURT needs a regression head with one output, but this "
                f"checkpoint has num_labels={self.num_labels} ({labels}); a classifier (e.g. "
                "an NLI model) is not a BLEURT model")
        self.tokenizer = tokenizer_cls.from_pretrained(self.location)
        self.tokenizer.padding_side = "right"
        self.model = model_cls.from_pretrained(self.location, dtype=self.dtype).to(self.device).eval()
        self.max_length = fix_model_max_length(self.tokenizer, self.model.config)

    def _encode(self, pairs: list[tuple[str, str]]) -> list[Row]:
        return encoding_rows(self.tokenizer([r for r, _ in pairs], [c for _, c in pairs],
                                            truncation=True, max_length=self.max_length))

    def _forward(self, batch: list[Row]) -> np.ndarray:
        logits = classifier_logits(self.model, pad_rows(self.tokenizer, batch, self.device))
        return logits[:, 0].double().cpu().numpy()

    def score_pairs(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None
                    ) -> np.ndarray:
        """Regression output for each (reference, candidate) pair, float64."""
        return self._run(check_pairs(pairs), batch_size).astype(np.float64)


def _bleurt_pytorch_classes(location: str):
    """(config, model, tokenizer) classes of the optional `bleurt_pytorch` package."""
    try:
        from bleurt_pytorch import (
            BleurtConfig,
            BleurtForSequenceClassification,
            BleurtTokenizer,
        )
    except Exception as exc:  # missing, or failing to import under this transformers
        raise ModelUnavailable(
            f"{location} is a BLEURT-PyTorch checkpoint (model_type 'bleurt'), which loads "
            f"only through the optional `bleurt_pytorch` package: {type(exc).__name__}: {exc}"
        ) from exc
    return BleurtConfig, BleurtForSequenceClassification, BleurtTokenizer


def get_bleurt_scorer(model_location: str, device: str = "cpu") -> BleurtScorer:
    """The process-wide `BleurtScorer` for (location, device), loaded on first use."""
    def build(location: str, dev: str) -> BleurtScorer:
        path = resolve_checkpoint(location, _unavailable("BLEURT", "BLEURT"))
        return BleurtScorer(path, model_ref=location, device=dev)

    return _cached(_BLEURT, model_location, device, build)
