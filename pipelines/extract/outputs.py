"""Strict output models for every extraction prompt, and the parse -> repair -> validate step.

A small model's answer is rarely clean JSON: it may sit inside prose or a code fence,
be cut off at the token limit, use the other prompt's shape, or carry a wrong label.
`parse_output` turns raw text into validated items plus item-level problems, and says
precisely why when it cannot (so the caller can retry with that reason, then record an
error row with the raw text). Repairs are recorded, never silent.

Schemas are bounded (maxItems, maxLength, no extra keys) because constrained decoding
of an unbounded list lets a small model repeat items until the token limit.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rexeval.prompts.loader import SENTIMENTS  # defined once, with the prompts
MAX_STATEMENTS = 20
MAX_STATEMENT_CHARS = 240

# Labels a model commonly writes instead of ours; anything else is an invalid label.
_SENTIMENT_ALIASES = {
    "positive": "positive", "pos": "positive", "+": "positive",
    "negative": "negative", "neg": "negative", "-": "negative",
    "neutral": "neutral", "neu": "neutral", "neut": "neutral",
}


class Triplet(BaseModel):
    """Seed 000: one atomic statement with its domain topic and polarity."""

    model_config = ConfigDict(extra="forbid")
    statement: str = Field(min_length=1, max_length=MAX_STATEMENT_CHARS)
    topic: str = Field(min_length=1, max_length=40)
    sentiment: Literal["positive", "negative", "neutral"]


class Candidate(BaseModel):
    """Seed 002: one candidate (or verified) statement with its polarity."""

    model_config = ConfigDict(extra="forbid")
    statement: str = Field(min_length=1, max_length=MAX_STATEMENT_CHARS)
    sentiment: Literal["positive", "negative", "neutral"]


class QualityJudgement(BaseModel):
    """Seed 002 Table 2: is one statement explanatory, is it atomic."""

    model_config = ConfigDict(extra="forbid")
    explanatory: bool
    atomic: bool


@dataclass(frozen=True)
class OutputSpec:
    """What a prompt must return: a list of items (bare or under `key`), or one object."""

    name: str
    item: type[BaseModel]
    container: Literal["array", "object_list", "object"]
    key: str | None = None  # list key for container == "object_list"

    def json_schema(self, topics: list[str] | None = None) -> dict[str, Any]:
        """Bounded JSON schema for constrained decoding (topics become an enum)."""
        item = _item_schema(self.item, topics)
        if self.container == "object":
            return item
        array = {"type": "array", "items": item, "maxItems": MAX_STATEMENTS}
        if self.container == "array":
            return array
        return {"type": "object", "properties": {self.key: array}, "required": [self.key],
                "additionalProperties": False}


def _item_schema(model: type[BaseModel], topics: list[str] | None) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        if f.annotation is bool:
            props[name] = {"type": "boolean"}
        elif name == "sentiment":
            props[name] = {"type": "string", "enum": list(SENTIMENTS)}
        elif name == "topic" and topics:
            props[name] = {"type": "string", "enum": list(topics)}
        else:
            limit = MAX_STATEMENT_CHARS if name == "statement" else 40
            props[name] = {"type": "string", "minLength": 1, "maxLength": limit}
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


TRIPLETS = OutputSpec("triplets", Triplet, "array")
CANDIDATES = OutputSpec("candidates", Candidate, "object_list", "statements")
QUALITY = OutputSpec("quality", QualityJudgement, "object")


@dataclass
class Parsed:
    """Outcome of parsing one answer.

    `error_type` is set when the answer as a whole is unusable (the caller retries);
    otherwise `items` holds the valid items and `item_errors` one (raw item, field,
    message) per item that failed validation.
    """

    items: list[BaseModel] = field(default_factory=list)
    item_errors: list[tuple[Any, str | None, str]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    error_type: str | None = None
    message: str = ""
    salvaged: bool = False  # items recovered from a cut-off answer

    @property
    def ok(self) -> bool:
        return self.error_type is None


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


def _decode_first(text: str) -> tuple[Any] | None:
    """The first complete JSON array or object inside `text`, skipping prose around it."""
    dec = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            value, _ = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        return (value,)
    return None


def _looks_truncated(text: str) -> bool:
    """An opening bracket whose JSON never closes: the answer was cut off."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        return False
    depth, in_str, esc = 0, False, False
    for ch in text[start:]:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return False
    return depth > 0


def _salvage_objects(text: str) -> list[Any]:
    """Complete `{...}` objects inside a cut-off answer (its last item is lost)."""
    dec = json.JSONDecoder()
    out, i = [], text.find("{")
    # Skip an outer {"statements": [ wrapper: items are the innermost flat objects.
    while 0 <= i < len(text):
        try:
            value, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict) and not any(isinstance(v, (list, dict)) for v in value.values()):
            out.append(value)
            i = text.find("{", end)
        else:
            i = text.find("{", i + 1)
    return out


def normalise_sentiment(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return _SENTIMENT_ALIASES.get(value.strip().lower())


def _validate_items(raw_items: list[Any], spec: OutputSpec, parsed: Parsed) -> None:
    for raw in raw_items:
        if isinstance(raw, dict) and "sentiment" in raw:
            label = normalise_sentiment(raw["sentiment"])
            if label is not None and label != raw["sentiment"]:
                raw = {**raw, "sentiment": label}
                parsed.repairs.append("sentiment_label")
        if isinstance(raw, dict) and isinstance(raw.get("statement"), str):
            raw = {**raw, "statement": raw["statement"].strip()}
        try:
            parsed.items.append(spec.item.model_validate(raw))
        except ValidationError as exc:
            err = exc.errors()[0]
            fld = ".".join(str(p) for p in err["loc"]) or None
            parsed.item_errors.append((raw, fld, f"{err['msg']} (got {_short(err.get('input'))})"))


def _short(value: Any, n: int = 80) -> str:
    s = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return s if len(s) <= n else s[: n - 3] + "..."


def _unwrap(value: Any, spec: OutputSpec, parsed: Parsed) -> list[Any] | dict | None:
    """Accept the other common shape (bare list <-> {"key": list}) as a recorded repair."""
    if spec.container == "object":
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
            parsed.repairs.append("unwrapped_single_item_list")
            return value[0]
        return value if isinstance(value, dict) else None
    if isinstance(value, list):
        if spec.container == "object_list":
            parsed.repairs.append("wrapped_bare_list")
        return value
    if isinstance(value, dict):
        if spec.key and isinstance(value.get(spec.key), list):
            if spec.container == "array":
                parsed.repairs.append("unwrapped_object")
            return value[spec.key]
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(value) == 1 and len(lists) == 1:
            parsed.repairs.append("unwrapped_object")
            return lists[0]
        if "statement" in value:  # a single item instead of a list
            parsed.repairs.append("wrapped_single_item")
            return [value]
    return None


def parse_output(text: str | None, spec: OutputSpec, *, salvage: bool = False) -> Parsed:
    """Parse, repair and validate one answer against `spec` (see `Parsed`)."""
    parsed = Parsed()
    if text is None or not text.strip():
        parsed.error_type, parsed.message = "empty_output", "the model returned no text"
        return parsed
    body = text.strip()
    fence = _FENCE.search(body)
    if fence:
        body = fence.group(1).strip()
        parsed.repairs.append("code_fence")
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        found = None if _looks_truncated(body) else _decode_first(body)
        if found is None:
            if _looks_truncated(body):
                if salvage and spec.container != "object":
                    objects = _salvage_objects(body)
                    if objects:
                        parsed.salvaged = True
                        parsed.repairs.append("salvaged_truncated")
                        _validate_items(objects, spec, parsed)
                        if parsed.items:
                            return parsed
                        parsed.items, parsed.item_errors = [], []
                parsed.error_type = "truncated_json"
                parsed.message = "the JSON answer is cut off before it closes"
            else:
                parsed.error_type = "no_json"
                parsed.message = "no JSON value found in the answer"
            return parsed
        (value,) = found
        parsed.repairs.append("extracted_from_prose")
    shaped = _unwrap(value, spec, parsed)
    if shaped is None:
        parsed.error_type = "wrong_shape"
        want = {"array": "a JSON array of objects", "object": "one JSON object",
                "object_list": f'an object {{"{spec.key}": [...]}}'}[spec.container]
        parsed.message = f"expected {want}, got {type(value).__name__}"
        return parsed
    if spec.container == "object":
        _validate_items([shaped], spec, parsed)
    else:
        _validate_items(list(shaped)[:MAX_STATEMENTS], spec, parsed)
        if len(shaped) > MAX_STATEMENTS:
            for raw in list(shaped)[MAX_STATEMENTS:]:
                parsed.item_errors.append((raw, None, f"more than {MAX_STATEMENTS} items"))
    if (spec.container == "object" or shaped) and not parsed.items:
        # Every item failed: the answer as a whole is wrong (e.g. wrong keys); retry it.
        raw, fld, msg = parsed.item_errors[0]
        parsed.error_type = "invalid_items"
        parsed.message = f"no valid item: {fld or 'item'}: {msg}"
    return parsed
