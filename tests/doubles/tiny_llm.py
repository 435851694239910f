"""A tiny randomly initialised chat model (2 layers, a BPE tokenizer trained on a few lines,
a chat template), built offline: it exercises the LLM backends without real weights."""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "The guitar strings sound bright and the tuner holds pitch well.",
    "This cable is cheap, noisy and broke after two weeks of use.",
    '{"statements": ["great sound", "poor build"], "rating": 4}',
    "Return JSON with the topics and sentiments of the review.",
    "pedal amp strap pick capo mic stand drum keyboard violin",
] * 20


def build_tiny_chat_model(folder: Path, *, seed: int = 0, vocab: int = 400, corpus=CORPUS,
                          max_positions: int = 256) -> Path:
    """Byte-level BPE tokenizer + 2-layer Llama with random weights, saved as an HF folder.

    Byte-level so that any text (JSON included) can be written with its vocabulary;
    trained in well under a second on a few sentences.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                     eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     unk_token="<|endoftext|>")
    hf_tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, bos_token_id=hf_tok.bos_token_id,
                         eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id,
                         initializer_range=0.5, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder
