"""Tiny random BERT classifiers and a tiny causal-LM reranker, built offline in well under a
second: no paraphrase cross-encoder, NLI model or reranker ships on PyPI, so the code that
reads such checkpoints is exercised on these (their scores are nonsense; the plumbing is real)."""
from __future__ import annotations

from pathlib import Path

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
    from tests.doubles.tiny_llm import build_tiny_chat_model

    build_tiny_chat_model(folder, seed=seed, vocab=500, corpus=CORPUS, max_positions=1024)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    for word in ("yes", "no"):
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
    return folder
