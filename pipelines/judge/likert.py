"""The Likert judge of seed 001: an LLM rates recommendation explanations from 1 to 5.

The judge stands in for the user who received the recommendation and rates the
explanation on persuasiveness, transparency, accuracy and satisfaction (any rubric
works). It asks one aspect per call (`single`) or all of them at once (`multi`), with no
example (`zero`), one human-rated example by another user (`one`), or by the same user
for the same system on another item (`personalised`). Unreadable answers go back to the
model through `core.llm.calls.ask`; what stays unreadable becomes NaN with its reason, never
a guess. Seed 001's null policy (an unreadable judge counts as 0) belongs to the
meta-evaluation, and to `ensemble(missing="zero")` here.

Multi-aspect answers are all or nothing: an answer is usable only when every requested
aspect was read (the retry asks for the missing ones), so a row's ratings always come from
one coherent answer. After the last retry every aspect of that row is NaN with the problem,
and the raw answer is kept for inspection.
"""
from __future__ import annotations

import hashlib
import json
import re
from functools import partial
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rexeval.pipelines.core.llm.calls import CallStats, ask

ASPECTS = ("persuasiveness", "transparency", "accuracy", "satisfaction")
ROW_COLUMNS = ("example_id", "system", "user_id", "item_id", "explanation")
POOL_COLUMNS = ("user_id", "item_id", "system", "explanation")
SCORE_COLUMNS = ("example_id", "system", "user_id", "item_id", "judge", "aspect", "score",
                 "shots", "shot_example", "problem", "raw")
LOW, HIGH = 1, 5


class LikertConfig(BaseModel):
    """How the Likert judge asks; temperature 0 by default, as in seed 001."""

    model_config = ConfigDict(extra="forbid")

    aspects: list[str] = Field(default_factory=lambda: list(ASPECTS), min_length=1)
    mode: Literal["single", "multi"] = "multi"
    shots: Literal["zero", "one", "personalised"] = "zero"
    seed: int = 0
    max_retries: int = Field(2, ge=0, le=10)
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    rubric: str = "likert_aspects"
    # Hold the answer to a JSON object of whole numbers 1-5 where the backend can
    # constrain decoding: small models then always answer in range (the parser reads
    # the object like any other answer). False: free text, as seed 001's judges wrote.
    constrained: bool = True

    @model_validator(mode="after")
    def _known_aspects(self) -> LikertConfig:
        from rexeval.prompts.rubrics import load_rubric

        if len(set(self.aspects)) != len(self.aspects):
            raise ValueError(f"aspects repeat a name: {self.aspects}")
        load_rubric(self.rubric).subset(self.aspects)  # raises naming unknown aspects
        return self


# -- reading an answer ---------------------------------------------------------------

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[A-Za-z0-9_-]*")
_MARKUP = re.compile(r"[*#`]")
# "(1-5)", "on a scale of 1 to 5": mentions of the scale are not ratings.
_SCALE = re.compile(r"(?:on\s+a\s+scale\s+(?:of|from)\s+)?\(?\b1\s*(?:-|–|—|to)\s*5\b\)?", re.IGNORECASE)
_NUMBER = r"(\d+(?:\.\d+)?)(?:\s*(?:/|out\s+of)\s*(\d+))?(?![\d.]*\s*%)"
_FILLER = r"\s*(?:\([^)\d]*\))?(?:\s*(?:[:=\-–—>|\"']|\b(?:score|rating|is|of|was)\b))*\s*"
_KEYWORD = re.compile(
    r"\b(?:score|rating|rate\s+(?:it|this(?:\s+explanation)?)(?:\s+(?:a|as|at))?|give\s+it(?:\s+a)?"
    r"|grade)\b" + _FILLER + _NUMBER, re.IGNORECASE)
_BARE = re.compile(r"(?<![\w.])" + _NUMBER)


def _clean(text: str) -> tuple[str, str | None]:
    """Drop reasoning blocks, code fences and Markdown emphasis; say if nothing is left."""
    text = _THINK.sub(" ", text)
    if re.search(r"<think>", text, re.IGNORECASE):
        return "", "the answer stopped inside a <think> block, before any rating"
    if re.search(r"</think>", text, re.IGNORECASE):
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    text = _MARKUP.sub("", _FENCE.sub(" ", text))
    text = _SCALE.sub(" ", text)
    if not text.strip():
        return "", "the answer is empty"
    return text, None


def _aliases(aspect: str) -> list[str]:
    return sorted({aspect, aspect.replace("_", " "), aspect.replace("_", "-")}, key=len, reverse=True)


def _aspect_pattern(aspect: str) -> re.Pattern:
    names = "|".join(re.escape(a) for a in _aliases(aspect))
    return re.compile(r"(?<![A-Za-z])(?:" + names + r")(?![A-Za-z])" + _FILLER + _NUMBER, re.IGNORECASE)


def _value(number: str, denominator: str | None) -> tuple[float, str | None]:
    """A matched number as a float, and what is wrong with it as a 1-5 rating (if anything)."""
    v = float(number)
    if denominator is not None and int(denominator) != HIGH:
        return v, f"{number}/{denominator} is not on the 1-5 scale"
    if not v.is_integer():
        return v, f"{number} is not a whole number"
    if not LOW <= v <= HIGH:
        return v, f"{_fmt(v)} is outside 1-5"
    return v, None


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _json_ratings(text: str) -> dict[str, Any]:
    """Key -> value from every JSON object in the text (one nested level flattened)."""
    found: dict[str, Any] = {}
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        for k, v in obj.items():
            items = v.items() if isinstance(v, dict) else [(k, v)]
            for kk, vv in items:
                if isinstance(vv, (int, float, str)) and not isinstance(vv, bool):
                    found.setdefault(str(kk).strip().lower().replace(" ", "_").replace("-", "_"), vv)
    return found


def _json_value(v: Any) -> tuple[float | None, str | None]:
    if isinstance(v, (int, float)):
        return _value(str(v), None)
    m = re.fullmatch(r"\s*" + _NUMBER + r"\s*", str(v))
    if not m:
        return None, f"{v!r} is not a number"
    return _value(m.group(1), m.group(2))


def _from_json(text: str, aspects: list[str]) -> dict[str, list[tuple[float | None, str | None]]]:
    data = _json_ratings(text)
    out = {a: [_json_value(data[a])] for a in aspects if a in data}
    if len(aspects) == 1 and not out:
        numeric = [v for v in data.values() if _json_value(v)[0] is not None]
        if len(numeric) == 1:
            out = {aspects[0]: [_json_value(numeric[0])]}
    return out


def _from_text(text: str, aspects: list[str]) -> dict[str, list[tuple[float | None, str | None]]]:
    out = {}
    for a in aspects:
        hits = [_value(m.group(1), m.group(2)) for m in _aspect_pattern(a).finditer(text)]
        if hits:
            out[a] = hits
    return out


def _single_fallback(text: str) -> tuple[list[tuple[float, str | None]], str | None]:
    """One rating without the aspect's name: after "score"/"rating", else the only number."""
    for pattern in (_KEYWORD, _BARE):
        hits = [_value(m.group(1), m.group(2)) for m in pattern.finditer(text)]
        if hits:
            return hits, None
    return [], "no rating found"


def _decide(aspect: str, hits: list[tuple[float | None, str | None]]) -> tuple[int | None, str | None]:
    values = sorted({v for v, _ in hits if v is not None})
    if len(values) > 1:
        return None, f"{aspect} got several different ratings ({', '.join(_fmt(v) for v in values)})"
    bad = next((p for _, p in hits if p is not None), None)
    if bad is not None:
        return None, f"{aspect}: {bad}"
    return int(values[0]), None


def scores_schema(aspects: list[str]) -> dict:
    """A bounded JSON schema: one whole number 1-5 per aspect, nothing else."""
    return {"type": "object", "additionalProperties": False, "required": list(aspects),
            "properties": {a: {"type": "integer", "enum": [1, 2, 3, 4, 5]} for a in aspects}}


def parse_scores(text: str, aspects: list[str] | tuple[str, ...]) -> tuple[dict[str, int] | None, str | None]:
    """{aspect: 1..5} for every aspect, or (None, what is wrong) to send back to the model.

    Reads "aspect: N" lines with prose, Markdown, "N/5" or code fences around them, or a
    JSON object; <think> blocks are ignored. With one aspect, a lone number (or the one
    after "score"/"rating") is enough. Never guesses: a missing aspect, a number outside
    1-5 or two different numbers for one aspect is a problem naming the aspect.
    """
    aspects = list(aspects)
    if not aspects:
        raise ValueError("parse_scores needs at least one aspect")
    text, problem = _clean(text or "")
    if problem:
        return None, problem
    found = _from_json(text, aspects) or _from_text(text, aspects)
    if len(aspects) == 1 and not found:
        hits, problem = _single_fallback(text)
        if problem:
            return None, problem
        found = {aspects[0]: hits}
    problems, scores = [], {}
    missing = [a for a in aspects if a not in found]
    if missing:
        problems.append(f"no rating for {', '.join(missing)}")
    for a in aspects:
        if a in found:
            value, why = _decide(a, found[a])
            if why:
                problems.append(why)
            else:
                scores[a] = value
    if problems:
        return None, "; ".join(problems)
    return scores, None


# -- one-shot examples ---------------------------------------------------------------

def example_key(user_id: Any, item_id: Any, system: Any) -> str:
    """A rated example's identity: one user's rating of one system's explanation of one item."""
    return f"{user_id}|{item_id}|{system}"


def _draw(seed: int, key: str, n: int) -> int:
    """An index in [0, n) fixed by (seed, key): the same pick whatever the row order."""
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def _rated_pool(pool: pd.DataFrame, aspects: list[str]) -> pd.DataFrame:
    """Pool rows with a human rating for every requested aspect, in a fixed order."""
    needed = list(POOL_COLUMNS) + [f"human_{a}" for a in aspects]
    missing = [c for c in needed if c not in pool.columns]
    if missing:
        raise ValueError(f"the one-shot pool lacks column(s) {missing}; it needs {needed} "
                         "(item_description optional)")
    rated = pool.dropna(subset=[f"human_{a}" for a in aspects]).copy()
    for c in ("user_id", "item_id", "system"):
        rated[c] = rated[c].astype(str)
    return rated.sort_values(["user_id", "item_id", "system", "explanation"], kind="stable").reset_index(drop=True)


def _example_block(r: dict, aspects: list[str], same_user: bool) -> dict:
    return {"item": _item_text(r), "explanation": _text(r["explanation"]),
            "ratings": {a: _fmt(float(r[f"human_{a}"])) for a in aspects},
            "same_user": same_user, "key": example_key(r["user_id"], r["item_id"], r["system"])}


def select_examples(rows: pd.DataFrame, pool: pd.DataFrame, shots: str, aspects: list[str],
                    seed: int) -> list[dict | None]:
    """The one-shot example for each row (None: no eligible example, so zero-shot).

    `one`: a rated example of ANOTHER user; `personalised`: the same user's rating of the
    same system's explanation of a DIFFERENT item (seed 001, section 2.3.2). Candidates
    are sorted, and the pick is drawn from a hash of (seed, shots, the row's key), so it
    does not depend on the order of rows or of the pool.
    """
    if shots not in ("one", "personalised"):
        raise ValueError(f"shots must be 'one' or 'personalised' to select examples, got {shots!r}")
    rated = _rated_pool(pool, aspects)
    records = rated.to_dict("records")
    users = rated["user_id"].tolist()
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault((r["user_id"], r["system"]), []).append(i)
    others: dict[str, list[int]] = {}
    picks: list[dict | None] = []
    for row in rows.to_dict("records"):
        user, item, system = str(row["user_id"]), str(row["item_id"]), str(row["system"])
        if shots == "personalised":
            cands = [i for i in groups.get((user, system), []) if records[i]["item_id"] != item]
        else:
            if user not in others:
                others[user] = [i for i, u in enumerate(users) if u != user]
            cands = others[user]
        if not cands:
            picks.append(None)
            continue
        key = json.dumps([shots, str(row["example_id"]), user, item, system])
        picks.append(_example_block(records[cands[_draw(seed, key, len(cands))]], aspects,
                                    same_user=shots == "personalised"))
    return picks


def count_fallbacks(scores: pd.DataFrame) -> int:
    """Rows judged zero-shot because a one-shot run found no eligible example for them."""
    fell = scores[(scores["shots"] != "zero") & scores["shot_example"].isna()]
    return int(fell[["example_id", "system"]].drop_duplicates().shape[0])


# -- judging -------------------------------------------------------------------------

def _text(value: Any) -> str:
    """A cell as prompt text: missing (None, NaN, NA) is the empty string, not "nan"."""
    return "" if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)) else str(value)


def _item_text(r: dict) -> str:
    """The item's description, or its id when there is none (seed 001 showed the title)."""
    return _text(r.get("item_description")).strip() or str(r["item_id"])


def _check_rows(rows: pd.DataFrame | list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows
    missing = [c for c in ROW_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"rows to judge lack column(s) {missing}; they need {list(ROW_COLUMNS)} "
                         "(item_description optional)")
    df = df.reset_index(drop=True).copy()
    for c in ("example_id", "system", "user_id", "item_id"):
        df[c] = df[c].astype(str)
    return df


def _expected(aspects: list[str]) -> str:
    if len(aspects) == 1:
        return "one whole number from 1 to 5"
    return ("one line per aspect written \"aspect: N\" (N a whole number from 1 to 5) for "
            + ", ".join(aspects))


def _rows_out(df: pd.DataFrame, judge: str, cfg: LikertConfig, picks: list[dict | None],
              per_row: list[dict[str, Any]]) -> pd.DataFrame:
    out = []
    for r, ex, answers in zip(df.to_dict("records"), picks, per_row):
        for aspect in cfg.aspects:
            a = answers[aspect]
            value = a.value if isinstance(a.value, dict) else None
            problem = None
            if value is None:
                problem = f"backend error: {a.error}" if a.error else a.problem
            out.append({"example_id": r["example_id"], "system": r["system"], "user_id": r["user_id"],
                        "item_id": r["item_id"], "judge": judge, "aspect": aspect,
                        "score": float(value[aspect]) if value else float("nan"),
                        "shots": cfg.shots, "shot_example": ex["key"] if ex else None,
                        "problem": problem, "raw": a.raw})
    return _typed(pd.DataFrame(out, columns=list(SCORE_COLUMNS)))


def _typed(scores: pd.DataFrame) -> pd.DataFrame:
    """Nullable text columns typed as strings, so a chunk where all are missing still
    writes a string column (not Arrow's null type) and chunks concatenate."""
    return scores.astype({c: "string" for c in ("problem", "shot_example", "raw")})


def judge_likert(llm, rows: pd.DataFrame | list[dict], cfg: LikertConfig,
                 examples: pd.DataFrame | None = None) -> tuple[pd.DataFrame, CallStats]:
    """Scores in long format (one row per explanation and aspect) and the run's counts.

    `rows`: example_id, system, user_id, item_id, explanation, optional item_description
    (the item id is shown when it is missing). `examples`: the human-rated pool for
    one-shot runs (user_id, item_id, system, explanation, item_description,
    human_<aspect>...). `scores.attrs["fallbacks"]` counts rows that found no eligible
    example and were judged zero-shot (also `count_fallbacks`).
    """
    from rexeval.models.llm.base import SamplingParams
    from rexeval.prompts import load_prompt
    from rexeval.prompts.rubrics import load_rubric

    df = _check_rows(rows)
    rubric = load_rubric(cfg.rubric)
    items = [rubric.item(a) for a in cfg.aspects]
    if cfg.shots == "zero":
        picks: list[dict | None] = [None] * len(df)
    elif examples is None:
        raise ValueError(f"shots={cfg.shots!r} needs a pool of human-rated examples (examples=)")
    else:
        picks = select_examples(df, examples, cfg.shots, cfg.aspects, cfg.seed)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens)
    stats = CallStats()
    records = df.to_dict("records")
    per_row: list[dict[str, Any]] = [{} for _ in records]
    if cfg.mode == "multi":
        prompt = load_prompt("likert_multi")
        convs = [prompt.render(aspects=items, item=_item_text(r), explanation=_text(r["explanation"]),
                               example=ex) for r, ex in zip(records, picks)]
        answers, _ = ask(llm, convs, partial(parse_scores, aspects=cfg.aspects), sampling=sampling,
                         json_schema=scores_schema(cfg.aspects) if cfg.constrained else None,
                         max_retries=cfg.max_retries, expected=_expected(cfg.aspects), stats=stats)
        for slot, a in zip(per_row, answers):
            slot.update({aspect: a for aspect in cfg.aspects})
    else:
        prompt = load_prompt("likert_single")
        for item in items:
            convs = [prompt.render(aspect=item, item=_item_text(r), explanation=_text(r["explanation"]),
                                   example=ex) for r, ex in zip(records, picks)]
            answers, _ = ask(llm, convs, partial(parse_scores, aspects=[item.name]), sampling=sampling,
                             json_schema=scores_schema([item.name]) if cfg.constrained else None,
                             max_retries=cfg.max_retries, expected=_expected([item.name]), stats=stats)
            for slot, a in zip(per_row, answers):
                slot[item.name] = a
    scores = _rows_out(df, llm.model_id, cfg, picks, per_row)
    scores.attrs["fallbacks"] = sum(ex is None for ex in picks) if cfg.shots != "zero" else 0
    return scores, stats


# -- ensembles -----------------------------------------------------------------------

def ensemble(scores: pd.DataFrame, judges: list[str] | None = None,
             missing: Literal["skip", "zero"] = "skip") -> pd.DataFrame:
    """Several judges' scores averaged per (example_id, system, aspect) (seed 001, section 5).

    `missing="skip"` averages the readable scores (NaN when none is); `missing="zero"`
    applies seed 001's null policy first: an unreadable or absent judge score counts as 0.
    `n_judges` is how many scores entered each mean.
    """
    if missing not in ("skip", "zero"):
        raise ValueError(f"missing must be 'skip' or 'zero', got {missing!r}")
    present = list(dict.fromkeys(scores["judge"]))
    judges = list(judges) if judges is not None else sorted(present)
    absent = [j for j in judges if j not in present]
    if absent or not judges:
        raise ValueError(f"judge(s) {absent} not in the scores; present: {present}")
    part = scores[scores["judge"].isin(judges)]
    keys = ["example_id", "system", "aspect"]
    dup = part.duplicated(keys + ["judge"])
    if dup.any():
        first = part[dup].iloc[0]
        raise ValueError(f"judge {first['judge']!r} scored {tuple(first[keys])} more than once "
                         "(several shots settings?); filter the scores first")
    wide = part.pivot(index=keys, columns="judge", values="score").reindex(columns=judges)
    unread = wide.isna().sum(axis=1)
    if missing == "zero":
        mean, n = wide.fillna(0.0).mean(axis=1), pd.Series(len(judges), index=wide.index)
    else:
        mean, n = wide.mean(axis=1, skipna=True), wide.notna().sum(axis=1)
    meta = part.groupby(keys, sort=False).agg(
        user_id=("user_id", "first"), item_id=("item_id", "first"),
        shots=("shots", lambda s: "+".join(sorted(set(s)))))
    out = meta.join(pd.DataFrame({"score": mean, "n_judges": n.astype(int), "unread": unread}))
    verb = "counted as 0" if missing == "zero" else "skipped"
    out["problem"] = [None if u == 0 else ("no judge gave a readable score" if pd.isna(s)
                      else f"{u} of {len(judges)} judges unreadable, {verb}")
                      for u, s in zip(out["unread"], out["score"])]
    out = out.reset_index()
    out["judge"] = f"ensemble({'+'.join(judges)})"
    out["shot_example"], out["raw"] = None, None
    return _typed(out[list(SCORE_COLUMNS) + ["n_judges"]])
