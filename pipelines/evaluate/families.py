"""The metric families `rexeval evaluate` runs, one registered class each.

A family is the unit that shares a model: BERTScore P/R/F1 come from one pass, the
eight StEnt/StCoh values from one set of NLI pairs. Each family says which metrics it
writes, which profile roles it needs, whether it needs statement sets, and how to score
a batch of examples (columns of `pipelines.evaluate.inputs.EXAMPLES`). The job asks
`unavailable()` before running it, so a missing model or data file is reported as a
skipped family with its reason, never replaced by something else. Adding a metric
family is one new class with `@register_family`.

Model-backed families load their model once per Ray actor in `setup()`. The NLI
families do not load a model at all: they call the NLI scorer through
`EvalContext.nli_client()`, normally the Serve deployment the job shares.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rexeval.metrics.registry import TEXTS_GROUP, group_metrics
from rexeval.registry import Registry


@dataclass
class EvalContext:
    """What families need from the job, picklable so it travels to Ray actors."""

    locations: dict[str, str] = field(default_factory=dict)  # role -> resolved location
    refs: dict[str, str] = field(default_factory=dict)  # role -> reference as given
    bertscore_num_layers: int | None = None
    questeval_bertscore_num_layers: int | None = None  # None: bert-score's default for the checkpoint's name
    device: str = "cpu"
    empty: str = "skip"
    unparseable: str = "zero"
    st2exp_population: str = "both"  # metrics/st2exp.py POPULATIONS
    nli_service: str = "none"  # none (in process) | serve:<app name> | http(s)://host:port/route
    nli_scorer: str = "rexeval.models.encoders.nli:NLIScorer"
    feature_vocabulary: tuple[str, ...] = ()
    llm: dict[str, Any] = field(default_factory=dict)  # backend, model, options, cache, max_retries
    only: dict[str, tuple[str, ...]] = field(default_factory=dict)  # family -> the metrics asked by name

    def nli_client(self):
        """The NLI scorer families call: the shared Serve deployment, a remote one over
        HTTP, or (nli_service "none") a model loaded in this process."""
        from rexeval.registry import load_object
        from rexeval.serve.nli import HttpNLIClient, ServeNLIClient

        if self.nli_service.startswith("serve:"):
            return ServeNLIClient.connect(app_name=self.nli_service.split(":", 1)[1])
        if self.nli_service.startswith(("http://", "https://")):
            return HttpNLIClient(self.nli_service)
        cls = load_object(self.nli_scorer)
        return cls(self.locations.get("nli", ""), model_ref=self.refs.get("nli"), device=self.device)


class Family:
    """One group of metrics computed together (see module docstring). The metrics a
    family writes are those registered with its name as their group
    (`rexeval.metrics.registry.group_metrics`)."""

    name: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()
    needs_statements: ClassVar[bool] = False
    uses_nli: ClassVar[bool] = False  # through EvalContext.nli_client(); the "nli" role is
    # only needed when no service address is given
    uses_llm: ClassVar[bool] = False
    batch_size: ClassVar[int] = 256
    in_all: ClassVar[bool] = True  # run by "all" (the default); False: only when asked for by name
    computes_subset: ClassVar[bool] = False  # scores only `wanted()`; the others compute every
    # metric of the family (their model's one pass gives them all) and the job keeps those asked

    def __init__(self, ctx: EvalContext):
        self.ctx = ctx

    @classmethod
    def metrics(cls) -> tuple[str, ...]:
        return group_metrics(cls.name, kind="per_example")

    def wanted(self) -> tuple[str, ...]:
        """The metrics this run asks of the family: those named (`--metrics rouge-1-f`),
        else all of them."""
        return self.ctx.only.get(self.name) or self.metrics()

    @classmethod
    def needs_references(cls, asked: tuple[str, ...] = ()) -> bool:
        """Whether the metrics asked of the family (`asked`; all of them when empty)
        compare with a reference, so an explanation without one is an error row. Every
        model family does; the texts family asks its metrics' declared inputs."""
        return True

    @classmethod
    def unavailable(cls, ctx: EvalContext) -> str | None:
        """Why this family cannot run here beyond missing roles (data, packages), or None."""
        return None

    def setup(self) -> None:
        """Load models (once per actor)."""

    def score(self, batch: dict[str, list]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """{metric: float64 [B]} and counts for a batch of examples."""
        raise NotImplementedError


FAMILIES: Registry[type[Family]] = Registry("metric family", base=Family)
register_family = FAMILIES.register


def _texts(batch: dict[str, list]) -> tuple[list[str], list[str]]:
    return list(batch["explanation"]), list(batch["reference"])


# ------------------------------------------------------------------- no model


@register_family("overlap")
class Overlap(Family):
    """Sentence BLEU-1/4, ROUGE-1/2/L P/R/F against the reference, and FMR."""

    batch_size = 1024

    def score(self, batch):
        from rexeval.metrics.features import extract_features, feature_matches
        from rexeval.metrics.text_overlap import rouge_scores, sentence_bleu_scores

        gen, ref = _texts(batch)
        out = {"sentence-bleu-1": sentence_bleu_scores(gen, ref, max_n=1),
               "sentence-bleu-4": sentence_bleu_scores(gen, ref, max_n=4), **rouge_scores(gen, ref)}
        vocab = self.ctx.feature_vocabulary
        feats = [extract_features(g, vocab) for g in gen]
        out["fmr"] = feature_matches(feats, [t or None for t in batch["ref_topics"]])
        return out, {}


@register_family("meteor")
class Meteor(Family):
    """NLTK's METEOR per explanation against the reference; needs NLTK's WordNet data, else
    skipped with the reason."""

    batch_size = 512

    @classmethod
    def unavailable(cls, ctx):
        from rexeval.metrics.text_overlap import meteor_unavailable_reason

        return meteor_unavailable_reason()

    def score(self, batch):
        from rexeval.metrics.text_overlap import meteor_scores

        return {"meteor": meteor_scores(*_texts(batch))}, {}


@register_family(TEXTS_GROUP)
class Texts(Family):
    """The metrics that need no model (`metrics.registry.TEXTS_GROUP`): each registered
    function of (explanations, references).

    Not part of "all", which is seed 000's metrics: they run when asked for (`--metrics
    texts` or a metric's own name), so adding one never changes an existing study's tables."""

    in_all = False
    computes_subset = True
    batch_size = 1024

    @classmethod
    def needs_references(cls, asked=()):
        from rexeval.metrics.registry import reads_references

        return any(reads_references(m) for m in asked or cls.metrics())

    def score(self, batch):
        from rexeval.metrics.registry import METRICS

        gen, ref = _texts(batch)
        return {m: np.asarray(METRICS.lookup(m)(gen, ref), dtype=np.float64) for m in self.wanted()}, {}


# ------------------------------------------------------------- encoder models


@register_family("bertscore")
class BertScore(Family):
    """BERTScore precision, recall and F1 (`bertscore_model`, at the profile's layer) from one
    pass."""

    roles = ("bertscore_model",)
    batch_size = 256

    def score(self, batch):
        from rexeval.metrics.similarity import bertscore

        got = bertscore(*_texts(batch), self.ctx.locations["bertscore_model"], self.ctx.bertscore_num_layers,
                        device=self.ctx.device)
        return {"bertscore-p": got["bertscore_p"], "bertscore-r": got["bertscore_r"],
                "bertscore-f1": got["bertscore_f1"]}, {}


@register_family("sts")
class Sts(Family):
    """Semantic textual similarity: the cosine of the explanation's and the reference's sentence
    embeddings."""

    roles = ("sts",)

    def setup(self):
        from rexeval.models.encoders.embedder import Embedder

        self.encoder = Embedder(self.ctx.locations["sts"], model_ref=self.ctx.refs.get("sts"),
                                device=self.ctx.device)

    def score(self, batch):
        from rexeval.metrics.similarity import sts

        return {"sts": sts(*_texts(batch), self.encoder)}, {}


# ------------------------------------------------------------------ NLI based


@register_family("statement_nli")
class StatementNLI(Family):
    """StEnt, StEnt-bin and StCoh (seed 000 eq. 9-11) on statement sentences."""

    roles = ("nli",)
    needs_statements = True
    uses_nli = True

    def setup(self):
        self.scorer = self.ctx.nli_client()

    def score(self, batch):
        from rexeval.pipelines.evaluate.statement_nli import score_statement_nli

        got = score_statement_nli(batch["gen_sentences"], batch["ref_sentences"], self.scorer,
                                  empty=self.ctx.empty)
        return got.values, got.counts


@register_family("summac_zs")
class SummacZS(Family):
    """SummaC-ZS (eq. 4): generated sentences checked against reference sentences."""

    roles = ("nli",)
    uses_nli = True

    def setup(self):
        self.scorer = self.ctx.nli_client()

    def score(self, batch):
        from rexeval.metrics.summac import summac_zs_scores

        return {"summac_zs": summac_zs_scores(*_texts(batch), self.scorer, empty=self.ctx.empty)}, {}


@register_family("summac_conv")
class SummacConv(Family):
    """SummaC-Conv: the package's trained head over histograms of each generated sentence's
    NLI scores against the reference sentences."""

    roles = ("nli", "summac_conv")
    uses_nli = True

    def setup(self):
        from rexeval.models.encoders.summac_head import load_conv_head

        self.scorer = self.ctx.nli_client()
        self.head = load_conv_head(self.ctx.locations["summac_conv"], device=self.ctx.device)

    def score(self, batch):
        from rexeval.metrics.summac import summac_conv_scores

        return {"summac_conv": summac_conv_scores(*_texts(batch), self.scorer, self.head,
                                                  empty=self.ctx.empty)}, {}


@register_family("alignscore")
class AlignScore(Family):
    """AlignScore (eq. 5): the package's `.ckpt` read without lightning, chunks of the
    explanation checked against the reference."""

    roles = ("alignscore",)
    batch_size = 128

    def setup(self):
        from rexeval.models.encoders.alignscore import build_alignscore

        self.scorer = build_alignscore(self.ctx.locations["alignscore"], device=self.ctx.device)

    def score(self, batch):
        from rexeval.metrics.alignment import alignscore_scores

        return {"alignscore": alignscore_scores(*_texts(batch), self.scorer, empty=self.ctx.empty)}, {}


# --------------------------------------------------------- generative models


@register_family("bartscore")
class BartScore(Family):
    """BARTScore: mean log p(reference | explanation) per token under a BART model."""

    roles = ("bartscore",)
    batch_size = 128

    def score(self, batch):
        from rexeval.metrics.learned import bartscore_scores

        return {"bartscore": bartscore_scores(*_texts(batch), self.ctx.locations["bartscore"],
                                              device=self.ctx.device)}, {}


@register_family("bleurt")
class Bleurt(Family):
    """BLEURT: the logit of a one-output sequence-classification model on (reference,
    explanation)."""

    roles = ("bleurt",)

    def score(self, batch):
        from rexeval.metrics.learned import bleurt_scores

        return {"bleurt": bleurt_scores(*_texts(batch), self.ctx.locations["bleurt"], device=self.ctx.device)}, {}


@register_family("questeval_f1")
class QuestEvalF1(Family):
    """QuestEval's QG/QA with token-F1 answer scoring only (not the published score: see
    metrics/questeval.py)."""

    roles = ("questeval_qg", "questeval_qa", "spacy")
    batch_size = 64

    def score(self, batch):
        from rexeval.metrics.questeval import questeval_f1_scores

        got = questeval_f1_scores(*_texts(batch), self.ctx.locations["questeval_qg"],
                                  self.ctx.locations["questeval_qa"], device=self.ctx.device,
                                  spacy_model=self.ctx.refs.get("spacy") or "en_core_web_sm")
        return {m: got[m] for m in self.metrics()}, {}


@register_family("questeval")
class QuestEval(Family):
    """The published QuestEval score (answerability, token F1 and BERTScore of the
    answers, both directions averaged: see metrics/questeval_published.py)."""

    roles = ("questeval_qg", "questeval_qa", "questeval_bertscore", "spacy")
    batch_size = 64

    def score(self, batch):
        from rexeval.metrics.questeval_published import questeval, questeval_bertscore_layers

        where = self.ctx.locations
        layers = self.ctx.questeval_bertscore_num_layers or questeval_bertscore_layers(
            self.ctx.refs.get("questeval_bertscore"), where["questeval_bertscore"])
        got = questeval(*_texts(batch), where["questeval_qg"], where["questeval_qa"],
                        where["questeval_bertscore"], bertscore_num_layers=layers,
                        spacy_model=self.ctx.refs.get("spacy") or "en_core_web_sm",
                        device=self.ctx.device)
        return {"questeval": got}, {}


@register_family("st2exp")
class St2Exp(Family):
    """St2Exp-P/R/F1 (eq. 6-8): an LLM verifier votes on each statement against the
    other side's whole explanation."""

    roles = ("judge_llm",)
    needs_statements = True
    uses_llm = True
    batch_size = 64
    # Given by the job, not loaded in `setup`: the streamed chunk's `Recorder` or
    # `Replayer` (`evaluate.pipeline.FamilyChunk`), or any backend when used in-process.
    llm = None

    def score(self, batch):
        from rexeval.pipelines.evaluate.st2exp import score_st2exp

        got, _ = score_st2exp(batch["gen_sentences"], list(batch["reference"]), batch["ref_sentences"],
                              list(batch["explanation"]), self.llm, unparseable=self.ctx.unparseable,
                              empty=self.ctx.empty, population=self.ctx.st2exp_population,
                              max_retries=int(self.ctx.llm.get("max_retries", 1)))
        return got.values, got.counts


def corpus_metrics() -> tuple[str, ...]:
    """The one-value-per-system metrics `corpus_scores` computes (group "corpus")."""
    return group_metrics("corpus", kind="corpus")


def corpus_scores(explanations: list[str], references: list[str], vocabulary: tuple[str, ...]) -> dict[str, float]:
    """One value per system: corpus BLEU-1/4, USR, and FCR/DIV over the features the
    explanations mention (features: the reference statements' topics)."""
    from rexeval.metrics.features import (extract_features, feature_coverage_ratio, feature_diversity,
                                          unique_sentence_ratio)
    from rexeval.metrics.text_overlap import bleu_1, bleu_4

    feats = [extract_features(e, vocabulary) for e in explanations]
    # Without features (no reference topics) FCR and DIV are undefined, not 0: "–" in the
    # tables, as FMR's missing values are.
    return {"bleu-1": bleu_1(explanations, references), "bleu-4": bleu_4(explanations, references),
            "usr": unique_sentence_ratio(explanations),
            "fcr": feature_coverage_ratio(feats, vocabulary),
            "div": feature_diversity(feats) if vocabulary else float("nan")}


# ------------------------------------------------------------------ selection by name

ALL = "all"

RENAMED = {"questeval_p": "questeval_f1_p", "questeval_r": "questeval_f1_r"}
RENAMED_WHY = ("the published QuestEval (`questeval`) has no precision or recall: it averages its "
               "two directions into one score. Precision and recall exist only in rexeval's "
               "variant that scores answers by token F1 only (QuestEval-F1, see "
               "metrics/questeval.py and metrics/questeval_published.py)")


def asked_metrics(names: list[str]) -> dict[str, tuple[str, ...]]:
    """family -> the metrics `names` asks of it by their own names, for the families
    asked only that way (a family named whole, or by "all", computes all its metrics)."""
    by_metric = {m: f for f, cls in FAMILIES.items() for m in cls.metrics()}
    by_metric.update({m: "corpus" for m in corpus_metrics()})
    whole = {x for x in names if x in FAMILIES or x == "corpus"}
    if ALL in names:
        whole |= {f for f, cls in FAMILIES.items() if cls.in_all} | {"corpus"}
    out: dict[str, list[str]] = {}
    for x in names:
        if x in by_metric and by_metric[x] not in whole:
            out.setdefault(by_metric[x], []).append(x)
    return {f: tuple(dict.fromkeys(ms)) for f, ms in out.items()}


def references_needed(families: list[str], asked: dict[str, tuple[str, ...]]) -> bool:
    """Whether any family of this run compares with references (the corpus metrics do:
    BLEU against them, DIV and FCR over their features). False only for a run of
    reference-free metrics alone, which then scores explanations that have none."""
    return any(f == "corpus" or FAMILIES[f].needs_references(asked.get(f, ())) for f in families)


def select_families(names: list[str], skip: list[str]) -> list[str]:
    """Family names from family or metric names ("all" = every family)."""
    by_metric = {m: f for f, cls in FAMILIES.items() for m in cls.metrics()}
    by_metric.update({m: "corpus" for m in corpus_metrics()})

    def expand(items: list[str]) -> list[str]:
        out = []
        for x in items:
            if x == ALL:
                out += [*(f for f, cls in FAMILIES.items() if cls.in_all), "corpus"]
            elif x in FAMILIES or x == "corpus":
                out.append(x)
            elif x in by_metric:
                out.append(by_metric[x])
            elif x in RENAMED:
                raise ValueError(f"{x!r} is now {RENAMED[x]!r}: {RENAMED_WHY}")
            else:
                import difflib

                close = [m for m in by_metric if m.startswith(x)] or difflib.get_close_matches(x, list(by_metric), 4)
                hint = f"; did you mean {', '.join(close[:6])}?" if close else ""
                raise ValueError(f"unknown metric or family {x!r}{hint} (families: "
                                 f"{', '.join([*FAMILIES, 'corpus'])})")
        return list(dict.fromkeys(out))

    drop = set(expand(skip))
    return [f for f in expand(names) if f not in drop]
