"""Tiny random AlignScore checkpoints for the tests (no real one ships on PyPI).

`build_tiny_roberta_base(folder)` writes what a user supplies next to AlignScore-large.ckpt
(config.json + tokenizer, no weights) for a 2-layer RoBERTa with a byte-level BPE
tokenizer trained in a fraction of a second. `build_tiny_alignscore(ckpt, base)` writes a
checkpoint in the AlignScore package's format: with the package installed it is the
package's own `BERTAlignModel`, saved by a lightning Trainer (the real format, byte for
byte the same kind of file); without it, the same keys written with plain torch.
The weights are random: the scores are nonsense, but every step between the texts and
the number is the real one.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

CORPUS = [
    "the product is loud and the strings sound bright",
    "the cable is cheap, noisy and broke after two weeks",
    "the tuner holds pitch well and clips on firmly",
    "great value for the money, I would buy it again!",
    "the pedal adds warmth to the amp without any hum",
    "Dr. Smith's strap is comfortable; the buckle feels solid.",
    "It works!!!! What more could you ask for?!",
] * 5

SENTENCES = [
    "The strings sound bright and stay in tune for weeks.",
    "This cable is cheap but it broke after two weeks.",
    "The tuner clips on firmly and reads the pitch fast.",
    "You get great value for the money here.",
    "The pedal adds warmth to the amp without hum.",
    "The strap is comfortable during long gigs.",
    "It is too noisy for recording at home.",
    "The case protects the guitar on the road.",
    "Mr. Jones liked the sound of the 6\" patch cables.",
    "What more could you ask for?!",
    "The knobs feel cheap, although they work.",
]


def long_text(n_sentences: int, start: int = 0) -> str:
    """`n_sentences` sentences cycled from SENTENCES (about 9 words each)."""
    return " ".join(SENTENCES[(start + i * 7) % len(SENTENCES)] for i in range(n_sentences))


def package_available() -> bool:
    return (importlib.util.find_spec("alignscore") is not None
            and importlib.util.find_spec("pytorch_lightning") is not None)


def build_tiny_roberta_base(folder: Path, *, model_max_length: int = 128) -> Path:
    """config.json + tokenizer of a 2-layer RoBERTa (hidden 32); no weights. The folder
    name should contain "roberta": the package picks its encoder class by name."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, RobertaConfig

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")),
        add_prefix_space=False)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
        cls_token="<s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
        model_max_length=model_max_length, model_input_names=["input_ids", "attention_mask"])
    config = RobertaConfig(
        vocab_size=len(hf_tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=model_max_length + 2, type_vocab_size=1,
        pad_token_id=hf_tok.pad_token_id, bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id, initializer_range=0.2)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


def _spread_heads(model, seed: int) -> None:
    """Larger random heads, so ALIGNED probabilities spread over (0, 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in (model.tri_layer, model.bin_layer, model.reg_layer):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 1.5)
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.3)


def build_tiny_alignscore(ckpt: Path, base: Path, *, seed: int = 0,
                          use_package: bool | None = None) -> Path:
    """A random AlignScore checkpoint over the tiny base at `base`, written to `ckpt`.

    use_package: None = the package's own model and a lightning Trainer when installed,
    else plain torch with the same state-dict keys and hyper-parameters.
    """
    import torch

    if use_package is None:
        use_package = package_available()
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if use_package:
        import pytorch_lightning as pl
        from alignscore.model import BERTAlignModel

        model = BERTAlignModel(model=str(base), using_pretrained=False)
        _spread_heads(model, seed)
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu",
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.strategy.connect(model)
        trainer.save_checkpoint(str(ckpt))
        return ckpt

    from transformers import AutoConfig, RobertaForMaskedLM, RobertaModel

    config = AutoConfig.from_pretrained(base)
    model = torch.nn.Module()
    model.base_model = RobertaModel(config)
    model.mlm_head = RobertaForMaskedLM(config).lm_head
    model.bin_layer = torch.nn.Linear(config.hidden_size, 2)
    model.tri_layer = torch.nn.Linear(config.hidden_size, 3)
    model.reg_layer = torch.nn.Linear(config.hidden_size, 1)
    _spread_heads(model, seed)
    torch.save({"state_dict": model.state_dict(),
                "hyper_parameters": {"model": str(base), "using_pretrained": False},
                "pytorch-lightning_version": "2.6.6", "epoch": 0, "global_step": 0},
               str(ckpt))
    return ckpt
