"""What LLM calls cost: token usage counters and a price table read from YAML.

Why a table the user supplies: prices differ by provider and change often, so the
project ships none it would have to keep true; `models/prices.example.yaml` shows the
format. A model missing from the table has NO price (`cost` gives None, reports say
"no price"), never a silent 0, so a run against an unpriced model is not reported free.

Calls answered from rexeval's call cache (`LLMResult.cached`) reach no model: they are
counted apart (`cached_calls`, `cached_*_tokens`) and cost nothing.

Models that are not billed by the token (a reward model scoring explanations on your own
or a rented GPU) carry a `gpu_hour` price instead: currency per GPU-hour, charged for
the wall time of the work times the GPUs it held (`gpu_cost`; seed 004 prices its
reward-model judge this way, against the LLM judges' token bills).
"""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rexeval.models.llm.base import LLMResult


class ModelPrice(BaseModel):
    """A model's price: per one million tokens (`prompt` and `completion`, together),
    per GPU-hour (`gpu_hour`), or both. An entry with neither prices nothing and is
    refused, so a typo cannot make a model look free."""

    model_config = ConfigDict(extra="forbid")

    prompt: float | None = Field(None, ge=0, description="USD per 1M prompt (input) tokens")
    completion: float | None = Field(None, ge=0, description="USD per 1M completion (output) tokens")
    gpu_hour: float | None = Field(None, ge=0, description="USD per GPU-hour (seconds x GPUs / 3600)")

    @model_validator(mode="after")
    def _some_price(self) -> ModelPrice:
        if (self.prompt is None) != (self.completion is None):
            raise ValueError("give both `prompt` and `completion` (per 1M tokens), or neither")
        if self.prompt is None and self.gpu_hour is None:
            raise ValueError("no price: give `prompt` and `completion` (per 1M tokens) and/or "
                             "`gpu_hour` (per GPU-hour)")
        return self

    @property
    def per_token(self) -> bool:
        return self.prompt is not None


class PriceTable(BaseModel):
    """Model id (exact, or a glob such as "gpt-4o-mini*") -> price. An exact id wins;
    otherwise the first matching pattern in file order."""

    model_config = ConfigDict(extra="forbid")

    currency: str = "USD"
    models: dict[str, ModelPrice] = Field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> PriceTable:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            where = "; ".join(f"{_where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                              for e in exc.errors())
            raise ValueError(f"price table {path}: {where}") from None
        except ValueError as exc:
            raise ValueError(f"price table {path}: {exc}") from None

    def price(self, model_id: str) -> ModelPrice | None:
        if model_id in self.models:
            return self.models[model_id]
        for pattern, price in self.models.items():
            if fnmatch.fnmatchcase(model_id, pattern):
                return price
        return None

    def cost(self, model_id: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        """Cost of these tokens in `currency`, or None when the model has no price."""
        p = self.price(model_id)
        if p is None or not p.per_token:
            return None
        return (prompt_tokens * p.prompt + completion_tokens * p.completion) / 1_000_000

    def gpu_hour_price(self, model_id: str) -> float | None:
        """The model's price per GPU-hour, or None (no entry, or an entry priced by the
        token only). The entry is found as for tokens: exact id, else first pattern."""
        p = self.price(model_id)
        return None if p is None else p.gpu_hour

    def gpu_cost(self, model_id: str, seconds: float, gpus: int | None) -> float | None:
        """Cost of `seconds` of wall time on `gpus` GPUs in `currency`, or None when the
        model has no GPU-hour price."""
        return gpu_cost(seconds, gpus, self.gpu_hour_price(model_id))[1]


def _where(loc: tuple) -> str:
    """A pydantic error location as the YAML path: models.'<model id>'.<field>."""
    return ".".join(repr(part) if i == 1 and loc[0] == "models" else str(part)
                    for i, part in enumerate(loc)) or "(top level)"


def gpu_cost(seconds: float, gpus: int | None, gpu_hour: float | None) -> tuple[float | None, float | None]:
    """(GPU-hours, cost) of work that took `seconds` of wall time holding `gpus` GPUs:
    GPU-hours = seconds x gpus / 3600, cost = GPU-hours x `gpu_hour` (currency per
    GPU-hour). No price gives cost None, never 0; on CPU (gpus 0) the GPU-hours and a
    priced cost are 0; unknown GPUs (None) give None for both."""
    if seconds < 0 or (gpus is not None and gpus < 0):
        raise ValueError(f"seconds and gpus must be >= 0, got {seconds} and {gpus}")
    hours = None if gpus is None else seconds * gpus / 3600
    cost = None if hours is None or gpu_hour is None else hours * gpu_hour
    return hours, cost


def format_cost(cost: float | None, currency: str = "USD") -> str:
    return "no price" if cost is None else f"{cost:.4f} {currency}"


@dataclass
class Usage:
    """Counters over LLM results. `calls` counts every result (cached and failed
    included); tokens and seconds count only the calls a model answered."""

    calls: int = 0
    cached_calls: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0
    seconds: float = 0.0

    def add(self, result: LLMResult) -> Usage:
        self.calls += 1
        if result.error is not None:
            self.errors += 1
        if result.cached:
            self.cached_calls += 1
            self.cached_prompt_tokens += result.prompt_tokens
            self.cached_completion_tokens += result.completion_tokens
        else:
            self.prompt_tokens += result.prompt_tokens
            self.completion_tokens += result.completion_tokens
            self.seconds += result.seconds
        return self

    def add_all(self, results: Iterable[LLMResult]) -> Usage:
        for r in results:
            self.add(r)
        return self

    def merge(self, other: Usage) -> Usage:
        """Add `other`'s counters into this one (e.g. usage from several actors)."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)
        return self

    def cost(self, price_table: PriceTable, model_id: str) -> float | None:
        return price_table.cost(model_id, self.prompt_tokens, self.completion_tokens)

    def as_dict(self, price_table: PriceTable | None = None, model_id: str | None = None) -> dict:
        """The counters; with a price table and a model id also `cost_usd` (None: the
        model has no price in the table)."""
        out = asdict(self)
        out["seconds"] = round(self.seconds, 3)
        if price_table is not None and model_id is not None:
            out["cost_usd"] = self.cost(price_table, model_id)
        return out
