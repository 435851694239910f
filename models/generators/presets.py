"""Named settings tables of the trained generators: `paper` (each original paper and its
authors' code) and `seed000` (what seed 000 ran to produce its Tables III-VII).

`generate train --preset NAME` (and `preset:` in a study step) starts from one of them;
`--set key=value` then overrides single values. Every value carries its source: a file
and line of seed 000's released code (the authors' `factual_explainable_recommendation`
repository, `baselines/<model>/main.sh|main.py|module.py`) or the paper/code it comes
from, and says so where a value is our own choice or where seed 000 did something we do
not offer. `paper` values are the models' `DEFAULTS` (plus `COMMON`), so the classes stay
the one place they are written; `SEED000` lists its values in full. `tests/models/
generators/test_presets.py` pins both tables against a hand-written copy of the sources,
and docs/methods/generators.md prints them (`python -m rexeval.models.generators.presets`).

Beyond the tables: `seed000` cuts explanation targets at `max_words` too (seed 000 pads or
cuts every target at 128 words), where `paper` lets explanation targets take the 95th
percentile of their training lengths (`fixed_length`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rexeval.models.generators.declared import generator_facts

COMMON = {"epochs": 100, "patience": 5, "seed": 0, "select": "loss"}
"""Trainer settings every model has (a model's DEFAULTS may change one: XRec's 1 epoch)."""

SELECT = ("loss", "ppl", "text_rating")
"""Validation objectives that choose the best epoch: the training objective, the text
perplexity, or text NLL + rating MSE unweighted (PETER's, NRT's and PEPLER-reg's
original early-stopping value; CER's counts its coherence term in the rating part)."""


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    fixed_length: bool  # explanation targets cut at max_words too (else: their 95th percentile)


PRESETS = {
    "paper": Preset("paper", "each original paper's settings (its authors' code where the paper is silent)", False),
    "seed000": Preset("seed000", "what seed 000 ran (its released baselines/*/main.sh and main.py)", True),
}
DEFAULT_PRESET = "paper"

_SH = "baselines/{}/main.sh:{}"
_PY = "baselines/{}/main.py:{}"


def _seed(model: str, where: str, line: int, note: str = "") -> str:
    path = (_SH if where == "sh" else _PY if where == "py" else "baselines/{}/" + where + ":{}").format(model, line)
    return f"seed 000 {path}" + (f" ({note})" if note else "")


# --- paper: the source of every default (values: the model's DEFAULTS / COMMON) ---------

_PETER_CODE = "PETER (Li et al. ACL 2021) and lileipisces/PETER main.py"
PAPER_SOURCES: dict[str, dict[str, str]] = {
    "nrt": {
        "optimizer": "NRT (Li et al. SIGIR 2017): AdaDelta (PETER's authors' port warns it can make every "
                     "sentence the same; seed000 trains with Adam)",
        "lr": "lipiji/NRT-theano: lr 1.0 (its drop to 0.1 after two epochs is not reproduced)",
        "lr_decay": "none (the Theano schedule is not a plateau decay)",
        "weight_decay": "NRT paper: L2 1e-4, as the optimizer's weight decay",
        "clip": "our choice", "batch_size": "lipiji/NRT-theano: batch 200",
        "vocab_size": "lileipisces/NRT: 20,000 words", "max_words": "lipiji/NRT-theano: tips of at most 20 words",
        "dim": "NRT paper: latent factors 300", "hidden": "NRT paper: GRU hidden 400", "layers": "NRT paper: one GRU layer",
        "rating_layers": "lileipisces/NRT: 4 sigmoid hidden layers", "dropout": "none in the original",
        "rating_reg": "our choice: equal task weights",
        "rating_level": "our choice: the paper does not say how a real rating becomes a level",
        "epochs": "our choice (seed 000's 100)", "patience": "PETER's endure_times 5", "seed": "our choice",
        "select": "lileipisces/NRT: text NLL + rating MSE on validation",
    },
    "att2seq": {
        "optimizer": "Att2Seq (Dong et al. EACL 2017): RMSProp", "lr": "Att2Seq paper: 0.002",
        "rmsprop_alpha": "Att2Seq paper: decay 0.95", "lr_decay": "none", "weight_decay": "none",
        "clip": "Att2Seq paper: gradient clipping 5", "batch_size": "lileipisces/Att2Seq: 50",
        "vocab_size": "PETER's setting, so all models see the same targets",
        "max_words": "PETER's 15 words (review targets)", "dim": "Att2Seq paper: attribute embeddings 64",
        "hidden": "Att2Seq paper: LSTM of 512", "layers": "Att2Seq paper: 2 layers", "dropout": "Att2Seq paper: 0.2",
        "rating_input": "our choice: no test-time label (the paper conditions on the rating; see the docstring)",
        "attention": "Att2Seq paper: attention over the attributes", "cell_start": "our choice: encoder for h and c",
        "epochs": "our choice (seed 000's 100)", "patience": "PETER's endure_times 5", "seed": "our choice",
        "select": "validation text NLL",
    },
    "peter": {
        **{k: f"{_PETER_CODE}: {v}" for k, v in {
            "optimizer": "SGD", "lr": "1.0", "lr_decay": "x0.25 when validation does not improve",
            "weight_decay": "none", "clip": "1.0", "batch_size": "128", "vocab_size": "20,000",
            "max_words": "15 words", "emsize": "512", "nhead": "2", "nhid": "2048", "nlayers": "2",
            "dropout": "0.2", "rating_reg": "0.1", "context_reg": "1.0", "text_reg": "1.0",
            "epochs": "100", "patience": "endure_times 5", "select": "text NLL + rating MSE on validation"}.items()},
        "seed": "our choice",
    },
    "pepler": {
        "optimizer": "PEPLER (Li et al. TOIS 2023) and lileipisces/PEPLER main.py: AdamW", "lr": "lileipisces/PEPLER: 0.001",
        "lr_decay": "none", "weight_decay": "transformers' AdamW default 0", "clip": "none in lileipisces/PEPLER",
        "batch_size": "lileipisces/PEPLER: 128", "vocab_size": "the backbone's own", "max_words": "lileipisces/PEPLER: 20 tokens",
        "lm": "the profile's generator_lm role (GPT-2 in `paper`)", "dtype": "bfloat16 on a GPU, else float32",
        "sequential": "PEPLER paper: sequential tuning, the paper's main variant (main.py)",
        "rating_reg": "main.py trains no rating (reg.py: 0.01 with MF, 1 with the MLP)",
        "rating_head": "reg.py: MF", "text_reg": "lileipisces/PEPLER: 1.0",
        "epochs": "lileipisces/PEPLER: 100", "patience": "lileipisces/PEPLER: endure_times 5", "seed": "our choice",
        "select": "main.py: validation text loss (= the objective)",
    },
    "xrec": {
        "optimizer": "XRec (Ma et al. EMNLP 2024) and HKUDS/XRec explainer: Adam", "lr": "HKUDS/XRec: 1e-4",
        "lr_decay": "none", "weight_decay": "HKUDS/XRec explainer: Adam without weight decay", "clip": "none", "batch_size": "HKUDS/XRec: 1",
        "vocab_size": "the backbone's own", "max_words": "HKUDS/XRec: up to 128 new tokens", "epochs": "HKUDS/XRec: 1 epoch",
        "lm": "the profile's generator_llm role (a Llama in `paper`)", "dtype": "bfloat16 on a GPU, else float32",
        "n_experts": "HKUDS/XRec: 8", "adapter_dropout": "HKUDS/XRec: 0.2", "noisy_gating": "HKUDS/XRec: on",
        "inject_layers": "XRec paper: adapter outputs in every layer", "gcn_dim": "HKUDS/XRec encoder: 64",
        "gcn_layers": "HKUDS/XRec encoder: 4", "gcn_lr": "HKUDS/XRec encoder: 1e-3", "gcn_reg": "HKUDS/XRec encoder: 1e-6",
        "gcn_batch_size": "HKUDS/XRec encoder: 1024", "gcn_epochs": "HKUDS/XRec encoder: 300",
        "gcn_patience": "HKUDS/XRec encoder: stops after 10 epochs without a better validation Recall@20 (ours: AUC)",
        "gcn_reg_mode": "HKUDS/XRec lightgcn.py: reg x squared norms of the batch's propagated rows, not divided",
        "gcn_combine": "HKUDS/XRec lightgcn.py: layers summed", "gcn_init": "HKUDS/XRec lightgcn.py: Xavier uniform",
        "profile_reviews": "our choice", "profile_length": "our choice", "profile_tokens": "our choice",
        "patience": "one epoch: unused", "seed": "our choice", "select": "one epoch: unused",
    },
}
PAPER_SOURCES["cer"] = {
    **{k: v.replace(_PETER_CODE, "CER (Raczynski et al. ECAI 2023) trains with PETER's settings;"
                    " " + _PETER_CODE) for k, v in PAPER_SOURCES["peter"].items()},
    "rating_reg": "JMRaczynski/CER: 0.1, weighting the rating and the coherence terms together",
}
PAPER_COMMON: dict[str, dict[str, Any]] = {
    "nrt": {"select": "text_rating"}, "peter": {"select": "text_rating"}, "cer": {"select": "text_rating"},
}
"""Where a paper's common settings differ from COMMON."""


# --- seed000: every value seed 000 ran, with the line it comes from ----------------------

_PETERLIKE_LINES = {"PETER": (330, 344), "CER": (333, 347)}
"""main.py's lines of the selecting sum and of the plateau step: CER's main.py has three more
lines before them than PETER's (read in the authors' repository at 6549831)."""


def _peterlike(m: str) -> dict[str, tuple[Any, str]]:
    select, step = _PETERLIKE_LINES[m]
    return {
        "optimizer": ("sgd", _seed(m, "py", 144, "torch.optim.SGD")),
        "lr": (1.0, _seed(m, "sh", 14)), "lr_decay": (0.25, _seed(m, "py", 145, f"StepLR gamma 0.25, stepped at line "
                                                                        f"{step} after an epoch that does not improve")),
        "weight_decay": (0.0, _seed(m, "py", 144, "no weight decay")), "clip": (1.0, _seed(m, "sh", 15)),
        "batch_size": (32, _seed(m, "sh", 17)), "vocab_size": (20000, _seed(m, "sh", 20)),
        "max_words": (128, _seed(m, "sh", 27, "--words 128")), "emsize": (512, _seed(m, "sh", 9)),
        "nhead": (2, _seed(m, "sh", 10)), "nhid": (2048, _seed(m, "sh", 11)), "nlayers": (2, _seed(m, "sh", 12)),
        "dropout": (0.2, _seed(m, "sh", 13)), "rating_reg": (0.1, _seed(m, "sh", 22)),
        "context_reg": (1.0, _seed(m, "sh", 23)), "text_reg": (1.0, _seed(m, "sh", 24)),
        "epochs": (100, _seed(m, "sh", 16)),
        "patience": (100, _seed(m, "sh", 21, "--endure_times 100: with 100 epochs it never stops early")),
        "seed": (42, _seed(m, "sh", 18)),
        "select": ("text_rating", _seed(m, "py", select, "val_t_loss + val_r_loss")),
    }


SEED000: dict[str, dict[str, tuple[Any, str]]] = {
    "nrt": {
        "optimizer": ("adam", _seed("NRT", "py", 125, "torch.optim.Adam")), "lr": (0.001, _seed("NRT", "sh", 18)),
        "lr_decay": (1.0, _seed("NRT", "py", 125, "no schedule")),
        "weight_decay": (0.002, _seed("NRT", "sh", 14, "--l2_reg 0.001 times the sum of squared parameters "
                                      "added to the loss (main.py:150-151): its gradient is Adam weight decay 0.002")),
        "clip": (0.0, _seed("NRT", "py", 152, "backward then step, no clipping")), "batch_size": (64, _seed("NRT", "sh", 17)),
        "vocab_size": (20000, _seed("NRT", "sh", 16)), "max_words": (128, _seed("NRT", "sh", 15, "--words 128")),
        "dim": (512, _seed("NRT", "sh", 9, "--emsize 512")), "hidden": (512, _seed("NRT", "sh", 10, "--nhid 512")),
        "layers": (1, _seed("NRT", "module.py", 70, "one GRU layer")),
        "rating_layers": (4, _seed("NRT", "sh", 11, "--nlayers 4")),
        "dropout": (0.0, _seed("NRT", "module.py", 70, "no dropout")), "rating_reg": (1.0, _seed("NRT", "sh", 12)),
        "rating_level": ("truncate", _seed("NRT", "module.py", 54, "clamp, then cast to int64")),
        "epochs": (100, _seed("NRT", "sh", 19)),
        "patience": (100, _seed("NRT", "py", 37, "endure_times 100: never stops early")),
        "seed": (42, _seed("NRT", "sh", 20)), "select": ("text_rating", _seed("NRT", "py", 257)),
    },
    "att2seq": {
        "optimizer": ("rmsprop", _seed("Att2Seq", "py", 92, "torch.optim.RMSprop")),
        "rmsprop_alpha": (0.99, _seed("Att2Seq", "py", 92, "torch's default alpha")),
        "lr": (0.002, _seed("Att2Seq", "sh", 16)), "lr_decay": (1.0, _seed("Att2Seq", "py", 92, "no schedule")),
        "weight_decay": (0.0, _seed("Att2Seq", "py", 92)), "clip": (5.0, _seed("Att2Seq", "py", 271)),
        "batch_size": (64, _seed("Att2Seq", "sh", 15)), "vocab_size": (20000, _seed("Att2Seq", "sh", 14)),
        "max_words": (128, _seed("Att2Seq", "sh", 13, "--review_length 128")),
        "dim": (64, _seed("Att2Seq", "sh", 9)), "hidden": (512, _seed("Att2Seq", "sh", 10)),
        "layers": (2, _seed("Att2Seq", "sh", 11)), "dropout": (0.2, _seed("Att2Seq", "sh", 12, "between LSTM layers")),
        "rating_input": (False, _seed("Att2Seq", "py", 245, "'Att2Seq without rating input'")),
        "attention": (False, _seed("Att2Seq", "module.py", 58, "no attention: the LSTM's output goes to the softmax")),
        "cell_start": ("zeros", _seed("Att2Seq", "module.py", 71, "c0 = zeros")),
        "epochs": (100, _seed("Att2Seq", "sh", 17)),
        "patience": (100, _seed("Att2Seq", "py", 99, "no early stopping: all 100 epochs")),
        "seed": (42, _seed("Att2Seq", "sh", 18)),
        "select": ("loss", _seed("Att2Seq", "py", 120, "it keeps the epoch of best validation BLEU-4 of greedy "
                                 "outputs; not offered here: the validation text NLL selects")),
    },
    "peter": _peterlike("PETER"),
    "cer": _peterlike("CER"),
    "pepler": {
        "optimizer": ("adamw", _seed("PEPLER", "py", 291, "torch.optim.AdamW")),
        "lr": (0.001, _seed("PEPLER", "sh", 10)), "lr_decay": (1.0, _seed("PEPLER", "py", 291, "no schedule")),
        "weight_decay": (0.01, _seed("PEPLER", "py", 291, "torch AdamW's default weight decay")),
        "clip": (0.0, _seed("PEPLER", "py", 55, "no clipping")), "batch_size": (32, _seed("PEPLER", "sh", 12)),
        "vocab_size": (0, "the backbone's own (GPT-2)"),
        "max_words": (128, _seed("PEPLER", "sh", 13, "--review_length 128 GPT-2 tokens, <bos> and <eos> included")),
        "lm": (None, "the profile's generator_lm role (seed 000: gpt2, main.py:284)"),
        "dtype": ("auto", "bfloat16 on a GPU, else float32 (seed 000: float32)"),
        "sequential": (False, _seed("PEPLER", "py", 291, "one optimizer over every parameter: the "
                                    "recommendation-as-regularisation variant")),
        "rating_reg": (0.01, _seed("PEPLER", "py", 345)),
        "rating_head": ("mlp", _seed("PEPLER", "py", 349, "--use_mf defaults to false: the MLP")),
        "text_reg": (1.0, _seed("PEPLER", "py", 347)), "epochs": (100, _seed("PEPLER", "sh", 11)),
        "patience": (100, _seed("PEPLER", "py", 343, "endure_times 100: never stops early")),
        "seed": (42, _seed("PEPLER", "sh", 9)), "select": ("text_rating", _seed("PEPLER", "py", 217)),
    },
    "xrec": {
        "optimizer": ("adam", "seed 000 baselines/XRec/explainer/main.py:36"),
        "lr": (1e-4, "seed 000 baselines/XRec/explainer/main.sh:5"), "lr_decay": (1.0, "no schedule"),
        "weight_decay": (0.0, "seed 000 baselines/XRec/explainer/main.py:36 (Adam without weight decay: the 1e-6 main.sh:6 passes is not used)"), "clip": (0.0, "no clipping"),
        "batch_size": (1, "seed 000 baselines/XRec/explainer/main.sh:4"), "vocab_size": (0, "the backbone's own"),
        "max_words": (128, "HKUDS/XRec: up to 128 new tokens"),
        "epochs": (1, "seed 000 baselines/XRec/explainer/main.sh:3"),
        "lm": (None, "the profile's generator_llm role (seed 000: Llama-2-7b-chat, explainer/models/explainer.py)"),
        "dtype": ("auto", "bfloat16 on a GPU, else float32 (seed 000: 8-bit weights, half adapters)"),
        "n_experts": (8, "seed 000 baselines/XRec/explainer/models/explainer.py:89"),
        "adapter_dropout": (0.2, "seed 000 baselines/XRec/explainer/models/explainer.py:89"),
        "noisy_gating": (True, "seed 000 baselines/XRec/explainer/models/explainer.py:89"),
        "inject_layers": (True, "seed 000 baselines/XRec/explainer/models/modeling_explainer.py:363 (q, k, v while the prompt is read)"),
        "gcn_dim": (64, "seed 000 baselines/XRec/encoder/train_encoder.sh:8"),
        "gcn_layers": (4, "seed 000 baselines/XRec/encoder/train_encoder.sh:7"),
        "gcn_lr": (1e-3, "seed 000 baselines/XRec/encoder/train_encoder.sh:5"),
        "gcn_reg": (1e-6, "seed 000 baselines/XRec/encoder/train_encoder.sh:6"),
        "gcn_batch_size": (1024, "seed 000 baselines/XRec/encoder/train_encoder.sh:4"),
        "gcn_epochs": (300, "seed 000 baselines/XRec/encoder/train_encoder.sh:3"),
        "gcn_patience": (10, "seed 000 baselines/XRec/encoder/train_encoder.py:85 (10 epochs without a better "
                         "validation Recall@20; ours counts validation AUC)"),
        "gcn_reg_mode": ("output_sum", "seed 000 baselines/XRec/encoder/models/lightgcn.py:54 (reg x squared norms "
                         "of the batch's propagated rows, not divided by the batch)"),
        "gcn_combine": ("sum", "seed 000 baselines/XRec/encoder/models/lightgcn.py:33 (layers summed)"),
        "gcn_init": ("xavier", "seed 000 baselines/XRec/encoder/models/lightgcn.py:18 (Xavier uniform)"),
        "profile_reviews": (8, "our choice (seed 000: baselines/NL_profiles, its own prompts)"),
        "profile_length": (128, "our choice"), "profile_tokens": (128, "our choice"),
        "patience": (1, "one epoch: unused"), "select": ("loss", "one epoch: unused"),
        "seed": (42, "our choice: seed 000's XRec scripts set no seed (explainer and encoder main.sh, "
                     "utils/parse.py); 42 is the seed its other five models' main.sh pass (e.g. "
                     "baselines/PETER/main.sh:18)"),
    },
}


def paper_values(model: str) -> dict[str, Any]:
    """The `paper` preset's values of `model`: COMMON, the paper's common overrides, DEFAULTS."""
    facts = generator_facts(model)
    return {**COMMON, **PAPER_COMMON.get(facts.name, {}), **facts.defaults}


def table(preset: str, model: str) -> dict[str, tuple[Any, str]]:
    """{setting: (value, source)} of `model` in `preset`."""
    name = generator_facts(model).name
    check_preset(preset)
    if preset == "seed000":
        if name not in SEED000:
            raise ValueError(f"seed 000 did not run {name!r}, so the seed000 preset has no settings for it: "
                             "use --preset paper (its class's DEFAULTS)")
        return dict(SEED000[name])
    # A generator added beside the built-in ones (one file) has no sourced table here:
    # its values are its class's DEFAULTS, and say so.
    sources = PAPER_SOURCES.get(name, {})
    own = f"{name}'s DEFAULTS (models/generators)"
    return {k: (v, sources.get(k, own)) for k, v in paper_values(name).items()}


def values(preset: str, model: str) -> dict[str, Any]:
    return {k: v for k, (v, _) in table(preset, model).items()}


def check_preset(preset: str) -> Preset:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use {' or '.join(PRESETS)}")
    return PRESETS[preset]


def markdown(models: tuple[str, ...] = ("nrt", "att2seq", "peter", "cer", "pepler", "xrec")) -> str:
    """The docs' presets tables (docs/methods/generators.md): one per preset, a row per generator, `value` then (source) per setting."""
    out = []
    for name, p in PRESETS.items():
        out.append(f"**`{name}`**: {p.description}.\n\n| generator | settings (source) |\n|---|---|")
        for m in models:
            cells = "; ".join(f"`{k}` {v!r} ({src})" for k, (v, src) in table(name, m).items())
            out.append(f"| {m} | {cells} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
