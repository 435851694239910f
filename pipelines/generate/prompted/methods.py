"""The prompted generators by name, what each one plans, and the settings they share.

A method turns the Inputs (the interactions to explain and the reviews it may read)
into a plan: one row per interaction with the exact prompt (`messages`, JSON) an LLM
answers, or, for a method without an LLM, the explanation itself; a row the method
cannot serve carries `skip` (an error type) and `skip_message` instead, so every
interaction ends in an explanation or an error row. `context` (JSON) records what the
method drew on (neighbour ids, the sentences picked), so a reader can audit a prompt.
Planning is pure pandas in the driver; the LLM calls run afterwards as chunks on Ray
(`pipelines/generate/prompted/tasks.py`). Adding a generator is one new module with
`@register_method("name")`: a `PromptedMethod` when it fills one prompt per interaction
(the base carries the loop, so the module is its prompt and what it may see), a `Method`
when it plans otherwise (review extraction writes its answers without an LLM).
"""
from __future__ import annotations

import abc
import json
from typing import Any, ClassVar, NamedTuple

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from rexeval.registry import Registry

PLAN_COLUMNS = ("example_id", "user_id", "item_id", "system", "messages", "explanation", "context", "skip",
                "skip_message", "prompt_version")

_HERE = "rexeval.pipelines.generate.prompted"
METHODS: Registry[type] = Registry("prompted generator", lazy={
    "user_based": f"{_HERE}.similar", "item_based": f"{_HERE}.similar",
    "review_extract": f"{_HERE}.reviews", "review_summary": f"{_HERE}.reviews",
    "preference_logic": f"{_HERE}.preference_logic"}, scan=(_HERE, "@register_method"))
"""Prompted generators by name. The built-ins load on first look-up; any module of this
folder with a `@register_method` class is found when names are listed or a name is not
known yet, so a new generator is one file here."""
register_method = METHODS.register


class PromptedSettings(BaseModel):
    """What the prompted generators condition on and how their answers are read."""

    model_config = ConfigDict(extra="forbid")

    k_users: int = Field(3, ge=1, description="user-based: similar shoppers shown")
    k_items: int = Field(2, ge=1, description="item-based: similar earlier purchases shown")
    liked_rating: float = Field(4.0, description="a rating at least this high counts as 'liked'")
    also_liked: int = Field(3, ge=0, description="user-based: other liked items shown per similar shopper")
    max_history: int = Field(10, ge=0, description="PreferenceLogic: earlier purchases shown")
    max_item_summaries: int = Field(5, ge=0, description="item descriptions: other buyers' headlines shown")
    extract_sentences: int = Field(2, ge=1, description="review extraction: sentences kept at most")
    extract_max_words: int = Field(30, ge=5, description="review extraction: words kept at most")
    summary_reviews: int = Field(8, ge=1, description="review summarisation: reviews shown at most")
    summary_review_words: int = Field(80, ge=10, description="review summarisation: words kept per review")
    min_words: int = Field(5, ge=1, description="shorter answers are sent back")
    max_words: int | None = Field(
        60, ge=5, description="the longest answer kept: a longer one keeps its leading whole sentences that fit, "
        "or is sent back when none does; null (`--set max_words=null`) keeps every answer whole. Unset in a job: "
        "the profile's answer_caps.explain_words (null with `paper`: seed 004 caps no words, its prompt only "
        "asks for 20-30; 60 with `local`)")
    max_tokens: int | None = Field(
        None, ge=8, description="the most tokens the LLM may write per answer; unset: the profile's "
        "answer_caps.explain_tokens: 2048 with `paper`, seed 004's (appendix A), 96 with `local` (ample for "
        "the 15-30 words the prompts ask for, and cheap on a laptop)")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy, reproducible, cacheable")
    max_retries: int = Field(2, ge=0, le=10)
    mf: dict[str, Any] = Field(default_factory=dict, description="BiasedMF settings over its defaults")


class Method(abc.ABC):
    """A prompted generator: `plan` makes one PLAN_COLUMNS row per interaction.

    A subclass's docstring opens with what it does in a sentence or two (`--help` and
    docs/methods/prompted-generators.md print that first paragraph beside its name);
    `conditions_on`, `never_sees` and `errors` fill the rest of its row on that page.
    """

    name = "method"
    uses_llm = True
    needs_mf = False
    asked_words = "15 to 30"  # the length its prompt asks for (retry messages repeat it)
    conditions_on = ""  # what its prompt (or its answer, without an LLM) is made from
    never_sees = ""  # what it is kept from, beyond the review it explains (no method reads that)
    errors: tuple[str, ...] = ()  # the `skip` types of its error rows

    @abc.abstractmethod
    def plan(self, inputs, settings: PromptedSettings, contexts: pd.DataFrame, mf=None) -> pd.DataFrame:
        """One PLAN_COLUMNS row per interaction of `inputs.targets`, in their order;
        `contexts` are their `build_contexts` rows, `mf` the BiasedMF when `needs_mf`."""

    def row(self, target, *, messages: list[dict] | None = None, explanation: str | None = None,
            context: dict | None = None, skip: str | None = None, skip_message: str | None = None) -> dict:
        return {"example_id": target.example_id, "user_id": target.user_id, "item_id": target.item_id,
                "system": self.name, "messages": None if messages is None else json.dumps(messages),
                "explanation": explanation,
                "context": json.dumps(context or {}, ensure_ascii=False, sort_keys=True),
                "skip": skip, "skip_message": skip_message}

    def frame(self, rows: list[dict], version: str) -> pd.DataFrame:
        df = pd.DataFrame(rows, columns=[c for c in PLAN_COLUMNS if c != "prompt_version"])
        df["prompt_version"] = version
        for c in ("messages", "explanation", "skip", "skip_message"):
            df[c] = df[c].astype(object).where(df[c].notna(), None)
        return df


def method(name: str) -> Method:
    return METHODS.lookup(name)()


def method_names() -> list[str]:
    return METHODS.names()


class Skip(NamedTuple):
    """An interaction a method cannot serve: the error row's `skip` type and its reason."""

    type: str
    message: str


class PromptedMethod(Method):
    """A generator that fills one prompt per interaction; the base carries the loop.

    A subclass gives `prompt` (a prompt file's name, or an inline prompt's YAML text) and
    what the prompt may see: either `sees`, the context columns (`build_contexts`) the
    prompt renders under their own names, each with the error row written when it is
    empty, or its own `fill` for anything more (neighbours, reviews). `prepare` builds
    what `fill` reads once per plan. `errors` gathers the `sees` rows' types by itself.
    """

    prompt: ClassVar[str] = ""
    sees: ClassVar[dict[str, Skip]] = {}  # context column -> the error row when it is empty (message: str.format
    # over the interaction's fields, e.g. "{item_id}")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.errors = tuple(dict.fromkeys((*cls.__dict__.get("errors", ()), *(s.type for s in cls.sees.values()))))

    def template(self):
        """The prompt template: inline YAML when `prompt` spans lines, else a prompt file."""
        from rexeval.prompts import inline_prompt, load_prompt

        if "\n" in self.prompt:
            return inline_prompt(self.prompt, origin=type(self).__module__)
        return load_prompt(self.prompt)

    def prepare(self, inputs, settings: PromptedSettings, mf=None) -> Any:
        """What `fill` reads, built once per plan (None by default)."""
        return None

    def fill(self, target, context, settings: PromptedSettings, state: Any) -> tuple[dict, dict] | Skip:
        """(the prompt's variables, the row's `context` record) for one interaction, or a
        Skip. By default both are the `sees` columns of its context row."""
        values = {}
        for column, skip in self.sees.items():
            value = getattr(context, column)
            if not str(value or "").strip():
                return Skip(skip.type, skip.message.format(**target._asdict()))
            values[column] = value
        return values, dict(values)

    def version(self, template) -> str:
        """The plan's `prompt_version`: the template's."""
        return str(template.version)

    def plan(self, inputs, settings: PromptedSettings, contexts: pd.DataFrame, mf=None) -> pd.DataFrame:
        template = self.template()
        state = self.prepare(inputs, settings, mf)
        rows = []
        for t, c in zip(inputs.targets.itertuples(index=False), contexts.itertuples(index=False)):
            filled = self.fill(t, c, settings, state)
            if isinstance(filled, Skip):
                rows.append(self.row(t, skip=filled.type, skip_message=filled.message))
                continue
            variables, record = filled
            rows.append(self.row(t, messages=self.render(template, variables), context=record))
        return self.frame(rows, version=self.version(template))

    def render(self, template, variables: dict) -> list[dict]:
        """The messages of one prompt."""
        return template.render(**variables)
