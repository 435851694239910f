"""The text-to-text models (T5) that QuestEval runs: question generation and question
answering (`Seq2SeqGenerator`), each loaded once per (location, device) in a process and
kept (`get_seq2seq_generator`), behind a lock, so batch workers and threads share it.

Why it lives here: it holds weights. QuestEval's maths (answer selection, which question
is asked on which text, answer F1, answerability, the aggregation) is
`metrics/questeval.py` (QuestEval-F1) and `metrics/questeval_published.py` (the
published score); they ask this module for the models. The spaCy pipeline of their
answer selection is `models/spacy_pipelines.py`; `clear_questeval_cache` forgets both.

Generation: greedy (one beam, no sampling), so deterministic; each distinct prompt runs
once, prompts are sorted by token count and batched, inputs are truncated to
`max_source_length` tokens, at most `max_new_tokens` are generated (None: what the
checkpoint's own length setting allows, `default_max_new_tokens`). `generate_scored`
also gives, from the same pass, the probability of one token at the first decoding step
(published QuestEval's answerability). No PyPI package ships the QuestEval checkpoints:
a missing one is a `ModelUnavailable` that says to pass local folders.
"""
from __future__ import annotations

from collections.abc import Sequence

from rexeval.models.process_cache import ProcessCache

_SEQ2SEQ: ProcessCache[Seq2SeqGenerator] = ProcessCache()  # by (location, device)


class Seq2SeqGenerator:
    """A text-to-text model (T5) answering prompts greedily, each distinct prompt once,
    prompts sorted by length and batched. Built by `get_seq2seq_generator`."""

    def __init__(self, location: str, *, model_ref: str | None = None, device: str = "cpu"):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        from rexeval.models.encoders.embedder import resolve_device

        self.location = str(location)
        self.model_ref = model_ref or self.location
        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.location)
        self.tokenizer.padding_side = "right"
        self.model = AutoModelForSeq2SeqLM.from_pretrained(self.location).to(self.device).eval()
        config = self.model.config
        gen = getattr(self.model, "generation_config", None)

        def token(name: str):
            value = getattr(config, name, None)
            return value if value is not None else getattr(gen, name, None)

        self.special = {name: token(name) for name in
                        ("decoder_start_token_id", "eos_token_id", "pad_token_id", "bos_token_id")}
        if self.special["pad_token_id"] is None:
            self.special["pad_token_id"] = self.tokenizer.pad_token_id
        if self.special["decoder_start_token_id"] is None:
            raise ValueError(f"{self.location}: the model config has no decoder_start_token_id")

    @property
    def default_max_new_tokens(self) -> int:
        """The length limit `generate` falls back to: what the checkpoint's own generation
        settings allow (`max_length`, transformers' default 20), less the decoder start
        token that `max_length` counted in the transformers the public QuestEval used."""
        limit = getattr(getattr(self.model, "generation_config", None), "max_length", None)
        return max(int(limit or 20) - 1, 1)

    def first_token_id(self, text: str) -> int:
        """The id of the first token of `text` (no special tokens added)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"{self.model_ref}: {text!r} has no tokens")
        return int(ids[0])

    def generate(self, prompts: Sequence[str], *, batch_size: int = 16,
                 max_source_length: int = 512, max_new_tokens: int | None = 32,
                 clean_up_spaces: bool | None = None) -> list[str]:
        """Greedy output text (special tokens removed, stripped) for each prompt.
        `max_new_tokens=None`: `default_max_new_tokens`; `clean_up_spaces`: the
        tokenizer's decoding clean-up (" ?" -> "?"...), None for its own default."""
        texts, _ = self._generate(prompts, None, batch_size, max_source_length,
                                  max_new_tokens, clean_up_spaces)
        return texts

    def generate_scored(self, prompts: Sequence[str], token_id: int, *, batch_size: int = 16,
                        max_source_length: int = 512, max_new_tokens: int | None = 32,
                        clean_up_spaces: bool | None = None) -> list[tuple[str, float]]:
        """`generate`, each text with the probability (softmax of the first decoding
        step's scores) that the model gave `token_id` as its first output token, read
        from the same greedy pass."""
        vocab = self.model.get_output_embeddings().weight.shape[0]
        if not 0 <= int(token_id) < vocab:
            raise ValueError(f"{self.model_ref}: token id {token_id} outside the vocabulary "
                             f"(0..{vocab - 1})")
        texts, probs = self._generate(prompts, int(token_id), batch_size, max_source_length,
                                      max_new_tokens, clean_up_spaces)
        return list(zip(texts, probs))

    def _generate(self, prompts: Sequence[str], token_id: int | None, batch_size: int,
                  max_source_length: int, max_new_tokens: int | None,
                  clean_up_spaces: bool | None) -> tuple[list[str], list[float]]:
        import torch
        from transformers import GenerationConfig

        from rexeval.models.encoders.pair_batching import dedupe, length_batches

        prompts = list(prompts)
        if not prompts:
            return [], []
        unique, inverse = dedupe(prompts)
        ids = self.tokenizer(unique, truncation=True, max_length=int(max_source_length))["input_ids"]
        scored = token_id is not None
        limit = self.default_max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        config = GenerationConfig(num_beams=1, do_sample=False, max_new_tokens=limit,
                                  output_scores=scored, return_dict_in_generate=scored,
                                  **self.special)
        decode = {} if clean_up_spaces is None else {"clean_up_tokenization_spaces": clean_up_spaces}
        out: list[str] = [""] * len(unique)
        probs: list[float] = [float("nan")] * len(unique)
        for chunk in length_batches([len(x) for x in ids], int(batch_size)):
            batch = self.tokenizer.pad([{"input_ids": ids[i]} for i in chunk], padding=True,
                                       return_tensors="pt")
            with torch.inference_mode():
                generated = self.model.generate(
                    input_ids=batch["input_ids"].to(self.device),
                    attention_mask=batch["attention_mask"].to(self.device),
                    generation_config=config)
            sequences = generated.sequences if scored else generated
            texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=True, **decode)
            for i, text in zip(chunk, texts):
                out[i] = text.strip()
            if scored:
                first = torch.softmax(generated.scores[0].float(), dim=-1)[:, token_id]
                for i, prob in zip(chunk, first.cpu().tolist()):
                    probs[i] = float(prob)
        return [out[i] for i in inverse], [probs[i] for i in inverse]


def get_seq2seq_generator(location: str, device: str = "cpu") -> Seq2SeqGenerator:
    """The process-wide `Seq2SeqGenerator` for (location, device), loaded on first use."""
    from rexeval.models.encoders.embedder import resolve_device
    from rexeval.models.encoders.pair_batching import resolve_checkpoint
    from rexeval.models.refs import ModelUnavailable

    key = (str(location), resolve_device(device))

    def unavailable(ref: str, why: str) -> ModelUnavailable:
        return ModelUnavailable(
            f"QuestEval needs T5 question-generation and question-answering "
            f"checkpoints; {ref!r} cannot be used ({why}). No PyPI package ships "
            "them: pass local Hugging Face folders (or hub ids with hub access).")

    def build() -> Seq2SeqGenerator:
        return Seq2SeqGenerator(resolve_checkpoint(key[0], unavailable), model_ref=key[0], device=key[1])

    return _SEQ2SEQ.get(key, build)


def clear_questeval_cache() -> None:
    """Forget the cached spaCy pipelines and seq2seq models."""
    from rexeval.models.spacy_pipelines import clear_spacy_cache

    _SEQ2SEQ.clear()
    clear_spacy_cache()
