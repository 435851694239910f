"""BERTScore's model: the `bert-score` package's `BERTScorer`, built once per (location,
layers, device) in a process and kept, and the tokenizer length fix that BERTScore,
BARTScore and BLEURT (`bart_bleurt.py`) share.

Why it lives here: it holds weights. The BERTScore maths (greedy matching, idf weights,
baseline rescaling, empty texts) is `metrics/similarity.py`, which asks `get_bertscorer`
for the model and its tokenizer. The cache is behind a lock, so batch workers and
threads share one model. The model is read at layer `num_layers` (None: bert-score's
tuned layer for a known model name, `default_num_layers`).

Tokeniser length: some checkpoints carry no `model_max_length`, and transformers then
reports 1e30, which the Rust tokeniser cannot take as a truncation length (OverflowError
on every text). When the value is missing or larger than the model's position table, it
is set to the model's limit (`max_position_embeddings`, minus the two reserved positions
of RoBERTa-style models; 512 when the config has none), so over-long texts are truncated
rather than crashing the model (`fix_model_max_length`).
"""
from __future__ import annotations

import os

from rexeval.models.process_cache import ProcessCache

# A tokenizer limit above this is transformers' "no limit known" sentinel, not a real one.
_ABSURD_MAX_LENGTH = 1_000_000
# Model types whose position table reserves two entries before the first token.
_OFFSET_POSITION_TYPES = frozenset({"roberta", "xlm-roberta", "camembert", "longformer",
                                    "ibert", "data2vec-text", "xlm-roberta-xl", "mpnet"})


def default_num_layers(model_location: str) -> int:
    """bert-score's tuned layer for a model name (its `model2layers` table), looked up by
    the location itself and then by the folder's base name; ValueError when unknown."""
    from bert_score.utils import model2layers

    for key in (model_location, os.path.basename(os.path.normpath(model_location))):
        if key in model2layers:
            return int(model2layers[key])
    raise ValueError(
        f"bert-score has no default layer for {model_location!r}; pass num_layers "
        "(profile setting bertscore_num_layers, e.g. 6 for all-MiniLM-L6-v2)"
    )


def fix_model_max_length(tokenizer, config) -> int:
    """Give the tokenizer a usable truncation length (see the module docstring)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        offset = 2 if getattr(config, "model_type", "") in _OFFSET_POSITION_TYPES else 0
        limit = int(positions) - offset
    else:
        limit = None
    current = getattr(tokenizer, "model_max_length", None)
    if current is None or current > _ABSURD_MAX_LENGTH:
        tokenizer.model_max_length = limit or 512
    elif limit is not None and current > limit:
        tokenizer.model_max_length = limit
    return int(tokenizer.model_max_length)


_SCORERS: ProcessCache = ProcessCache()  # bert_score.BERTScorer by (location, layers, device)


def get_bertscorer(model_location: str, num_layers: int | None, device: str = "cpu"):
    """The process-wide `bert_score.BERTScorer` for (location, layers, device), built on
    first use (model truncated to `num_layers` layers, tokenizer length fixed).

    Only its model and tokenizer are used: idf weights and rescaling are per call, so one
    cached scorer serves every option safely from several threads.
    """
    from rexeval.models.encoders.embedder import resolve_device

    location = str(model_location)
    layers = default_num_layers(location) if num_layers is None else int(num_layers)
    if layers < 0:
        raise ValueError(f"num_layers must be >= 0, got {num_layers}")
    device = resolve_device(device)

    def build():
        from bert_score import BERTScorer

        scorer = BERTScorer(model_type=location, num_layers=layers, device=device)
        fix_model_max_length(scorer._tokenizer, scorer._model.config)
        return scorer

    return _SCORERS.get((location, layers, device), build)


def clear_bertscorer_cache() -> None:
    """Forget every cached scorer (frees their models once nothing else holds them)."""
    _SCORERS.clear()
