"""Model profiles: a named, complete set of models, one per role, from profiles.yaml.

Why: every stage asks for a model by its role ("nli", "embedder", ...) rather than by
name, so the same job runs the seed papers' models on a GPU cluster (`paper`) or the
packaged offline models on a laptop (`local`), and any single role can be swapped on the
command line (`--model nli=/path/to/checkpoint`, or `--model nli=s3://bucket/ckpt` on a
cluster whose nodes share no disk: each node copies it once where it is loaded, see
`models/refs.py`). A role that a profile leaves empty fails loudly through
`Profile.require` instead of being silently replaced.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Iterable, Literal, Mapping

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from rexeval.models.refs import ModelUnavailable, NoModelAtPath, ResolvedModel, resolve

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
Backend = Literal["hf", "vllm", "openai"]


class ProfileError(ValueError):
    """A profile name, role or override is not valid; the message lists valid ones."""


class ModelSet(BaseModel):
    """One reference (or null) per role. Every role must be written out in the YAML."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    llm: str | None = Field(description="extraction / verification LLM")
    judge_llm: str | None = Field(description="LLM judge (Likert, pairwise, St2Exp)")
    judge_llm_alt: str | None = Field(description="second judge, for judge ensembles")
    embedder: str | None = Field(description="bi-encoder for paraphrase clustering / ANN")
    cross_encoder: str | None = Field(description="pair scorer that filters paraphrase pairs")
    nli: str | None = Field(description="NLI classifier (StEnt, StCoh, SummaC)")
    bertscore_model: str | None = Field(description="encoder behind BERTScore")
    sts: str | None = Field(description="sentence encoder for STS cosine similarity")
    spacy: str | None = Field(description="spaCy pipeline (parsing, QuestEval answer selection)")
    sentence_splitter: str | None = Field(description="Punkt sentence splitter")
    statement_encoder: str | None = Field(
        description="sentence encoder for BPER+'s statement features (ranking benchmark)")
    summac_conv: str | None = Field(description="SummaC-Conv aggregation weights (a .bin file)")
    alignscore: str | None = Field(description="AlignScore checkpoint (a .ckpt file)")
    bartscore: str | None = Field(description="BART sequence-to-sequence model behind BARTScore")
    bleurt: str | None = Field(description="BLEURT regression model (Hugging Face format)")
    questeval_qg: str | None = Field(description="T5 question generator for QuestEval")
    questeval_qa: str | None = Field(description="T5 question answerer for QuestEval")
    questeval_bertscore: str | None = Field(
        description="encoder behind the published QuestEval's answer BERTScore")
    generator_lm: str | None = Field(description="pretrained causal LM behind PEPLER (GPT-2 in the paper)")
    generator_llm: str | None = Field(description="frozen LLM behind XRec (Llama-2-7b-chat in seed 000)")


ROLES: dict[str, str] = {name: f.description or "" for name, f in ModelSet.model_fields.items()}
"""Every role a profile names, with what it is used for."""

LAYER_SETTINGS = {"bertscore_num_layers": "bertscore_model",
                  "questeval_bertscore_num_layers": "questeval_bertscore"}
"""BERTScore layer settings and the role whose checkpoint each belongs to."""

SETTINGS = ("llm_backend", *LAYER_SETTINGS)
"""Non-model profile values that can be overridden like roles."""


class AnswerCaps(BaseModel):
    """How much an LLM may write per answer in seed 004's method (the prompted generators,
    the pairwise judge, the detection test), where a job's own settings give no cap. In
    the profile because the right cap depends on the machine: seed 004 (appendix A) lets
    generation and evaluation write 2,048 tokens and keeps whole answers, which a paper
    run should do by default, while a laptop run wants short, cheap answers. The
    defaults are the `local` values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    explain_tokens: int = Field(96, ge=8, description="tokens per explanation: `generate llm` and the writer "
                                "of `judge detect`")
    explain_words: int | None = Field(60, ge=5, description="the longest explanation kept (a longer one keeps "
                                      "its leading whole sentences); null keeps every answer whole")
    judge_tokens: int = Field(512, ge=8, description="tokens per pairwise verdict, reasoning included: "
                              "`judge pairwise` (ALERT-Gen) and the judge of `judge detect`")


class Profile(BaseModel):
    """A resolved profile: which reference plays each role, the LLM backend, and the
    answer caps of seed 004's jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    llm_backend: Backend
    bertscore_num_layers: int | None = None
    questeval_bertscore_num_layers: int | None = None
    answer_caps: AnswerCaps = Field(default_factory=AnswerCaps)
    models: ModelSet
    notes: dict[str, str] = Field(default_factory=dict)
    overridden: tuple[str, ...] = ()

    def ref(self, role: str) -> str | None:
        """The reference for ``role`` (None when the profile has no model for it)."""
        _check_role(role)
        return getattr(self.models, role)

    def roles(self) -> dict[str, str | None]:
        """All roles and their references, in declaration order."""
        return {role: getattr(self.models, role) for role in ROLES}

    def require(self, role: str) -> str:
        """The reference for ``role``, or ``ModelUnavailable`` saying how to supply one."""
        ref = self.ref(role)
        if ref is None:
            why = self.notes.get(role)
            raise ModelUnavailable(
                f"profile {self.name!r} has no {role!r} model ({ROLES[role]})"
                + (f": {why}" if why else "")
                + f". Pass a checkpoint with `--model {role}=/path/to/checkpoint` "
                f"(a URI such as s3://bucket/checkpoint on a cluster, or a Hugging Face id "
                f"on a machine with hub access)."
            )
        return ref

    def resolve(self, role: str, *, prepare: bool = True,
                cache_dir: str | os.PathLike | None = None) -> ResolvedModel:
        """``require(role)`` then resolve it to a location (see ``models.refs.resolve``):
        call it where the model is loaded, since a URI is copied to this node."""
        try:
            return resolve(self.require(role), prepare=prepare, cache_dir=cache_dir)
        except NoModelAtPath as exc:  # name the role the path was given for
            raise NoModelAtPath(f"the {role} model: {exc}") from None

    def shipped(self, role: str) -> str:
        """``require(role)`` as the location a driver hands to actors on any node
        (``models.refs.shipped_location``: a URI stays the URI); a missing path names
        the role it was given for."""
        from rexeval.models.refs import shipped_location

        try:
            return shipped_location(self.require(role))
        except NoModelAtPath as exc:
            raise NoModelAtPath(f"the {role} model: {exc}") from None


def answer_caps(name: str) -> AnswerCaps:
    """The answer caps of profile `name` (ProfileError when there is no such profile):
    what a job's validator fills its unset caps from."""
    return load_profile(name).answer_caps


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ProfileError(f"unknown model role {role!r}; valid roles: {', '.join(ROLES)}")


@lru_cache(maxsize=4)
def _read_profiles(path: str) -> dict:
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of profile names")
    return data


def available_profiles(path: str | os.PathLike = PROFILES_FILE) -> list[str]:
    """Names of the profiles defined in ``path``."""
    return list(_read_profiles(str(path)))


def _null(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if value.casefold() in ("none", "null") else value


def load_profile(name: str = "local", overrides: Mapping[str, str | None] | None = None,
                 *, path: str | os.PathLike = PROFILES_FILE) -> Profile:
    """Load profile ``name`` and apply ``overrides`` ({role or setting: ref or None}).

    Overriding ``bertscore_model`` without ``bertscore_num_layers`` (or
    ``questeval_bertscore`` without ``questeval_bertscore_num_layers``) resets that layer
    count to None (bert-score's own default for the new checkpoint), since the profile's
    count belonged to its own model.
    """
    data = _read_profiles(str(path))
    if name not in data:
        raise ProfileError(f"unknown profile {name!r}; valid profiles: {', '.join(data)}")
    raw = dict(data[name] or {})
    raw["models"] = dict(raw.get("models") or {})
    overrides = dict(overrides or {})

    for key, value in overrides.items():
        if key in ROLES:
            raw["models"][key] = _null(value)
        elif key == "llm_backend":
            raw["llm_backend"] = _null(value)
        elif key in LAYER_SETTINGS:
            value = _null(value)
            try:
                raw[key] = None if value is None else int(value)
            except ValueError:
                raise ProfileError(f"{key} must be an integer, got {value!r}") from None
        else:
            raise ProfileError(
                f"unknown model role {key!r}; valid roles: {', '.join(ROLES)} "
                f"(settings: {', '.join(SETTINGS)})"
            )
    for setting, role in LAYER_SETTINGS.items():
        if role in overrides and setting not in overrides:
            raw[setting] = None

    try:
        return Profile(name=name, overridden=tuple(overrides), **raw)
    except ValidationError as exc:
        raise ProfileError(f"profile {name!r} in {path} is invalid:\n{exc}") from None


def parse_overrides(items: Iterable[str]) -> dict[str, str | None]:
    """Parse CLI flags like ``["nli=/ckpt", "llm=org/model", "cross_encoder=none"]``.

    ``none`` / ``null`` clears a role. Raises ``ProfileError`` on a missing ``=``, an
    unknown role, an empty value, or a role given twice.
    """
    out: dict[str, str | None] = {}
    for item in items:
        if "=" not in item:
            raise ProfileError(f"model override {item!r} must look like ROLE=REF (e.g. nli=/path/to/checkpoint)")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in ROLES and key not in SETTINGS:
            raise ProfileError(
                f"unknown model role {key!r} in {item!r}; valid roles: {', '.join(ROLES)} "
                f"(settings: {', '.join(SETTINGS)})"
            )
        if not value:
            raise ProfileError(f"model override {item!r} has no value; use {key}=none to clear the role")
        if key in out:
            raise ProfileError(f"model role {key!r} given twice")
        out[key] = _null(value)
    return out


def coerce_overrides(value):
    """A job config's `models` field: a mapping as is, or CLI-style ["ROLE=REF", ...]."""
    if isinstance(value, (list, tuple)):
        return parse_overrides(value)
    return value


ModelOverrides = Annotated[dict[str, str | None], BeforeValidator(coerce_overrides)]
"""role -> model ref, as typed config fields declare it (accepts --model ROLE=REF lists)."""
