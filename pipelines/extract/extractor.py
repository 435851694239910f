"""Reviews -> explanatory, atomic statements (seed 000 triplets, seed 002 two-stage STAR).

`Extractor.run` maps a table of reviews to statement rows and error rows with no Ray
inside, given a `generate` function (any LLM backend, or a scripted double in tests).
Every review ends with statements of its final stage or at least one error row:

- triplets: one call per review with its domain's topic table -> stage "triplet";
- star: candidate extraction -> stage "candidate", then verification of the candidate
  list -> stage "verified" (candidates are kept so extraction quality can be compared
  with and without verification, as in seed 002's Table 2).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import pyarrow as pa

from rexeval.models.llm.base import SamplingParams
from rexeval.pipelines.extract.outputs import CANDIDATES, TRIPLETS
from rexeval.pipelines.core.schema import ERRORS, STATEMENTS
from rexeval.pipelines.extract.statements import TopicMapper, normalise_statement, truncate_words
from rexeval.pipelines.core.ids import dedup_key, statement_id
from rexeval.pipelines.extract.structured import Generate, Outcome, Task, items_json

Method = Literal["triplets", "star"]


@dataclass
class ExtractSettings:
    method: Method = "triplets"
    domain: str | None = None  # overrides each review's category
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=512))
    max_retries: int = 2
    max_review_words: int = 384
    constrained: bool = True  # send the JSON schema to the backend
    model: str = ""  # for provenance
    backend: str = ""
    verify_model: str | None = None  # star: verifier model when it differs


COUNT_KEYS = ("reviews_in", "reviews_out", "reviews_empty", "reviews_failed", "reviews_skipped",
              "statements", "candidates", "item_errors", "truncated_reviews", "llm_calls",
              "cached_calls", "retries", "repaired_answers", "topics_mapped",
              "prompt_tokens", "completion_tokens")


class Extractor:
    """Runs one extraction method over a batch of reviews (see module docstring)."""

    def __init__(self, settings: ExtractSettings, generate: Generate,
                 verify_generate: Generate | None = None,
                 topic_mapper: TopicMapper | None = None):
        from rexeval.prompts import load_prompt

        self.s = settings
        self.generate = generate
        self.verify_generate = verify_generate or generate
        self.topic_mapper = topic_mapper
        self._domains: dict = {}
        if settings.method == "triplets":
            self.prompt = load_prompt("extract_triplets")
        else:
            self.prompt = load_prompt("star_candidates")
            self.verify_prompt = load_prompt("star_verify")

    # -- helpers ---------------------------------------------------------------------

    def _domain(self, name: str | None):
        """The domain's topic table, read once per extractor (not once per review)."""
        from rexeval.prompts import PromptError, load_domain

        if name not in self._domains:
            try:
                self._domains[name] = load_domain(name) if name else None
            except PromptError:
                self._domains[name] = None
        return self._domains[name]

    def _provenance(self, stage: str, outcome: Outcome, prompt_version: str, extra: dict) -> dict:
        model = self.s.verify_model if stage == "verified" and self.s.verify_model else self.s.model
        return {"method": self.s.method, "backend": self.s.backend, "model": model,
                "prompt": prompt_version, "sampling": self.s.sampling.model_dump(),
                "attempts": outcome.attempts, "repairs": sorted(set(outcome.repairs)), **extra}

    # -- one review's work, step by step (the streaming job and `run` share it) --------

    def start(self, review: dict) -> dict:
        """A review's work before any call: its first request, or already settled (an
        empty review, an unknown domain). Work is a plain dict (JSON), so a streaming
        job can carry it between Ray Data passes."""
        from rexeval.pipelines.extract.structured import Outcome

        w = {"review": review, "phase": "done", "convo": None, "outcome": {}, "meta": None,
             "statements": [], "errors": [], "counts": dict.fromkeys(COUNT_KEYS, 0),
             "candidates": [], "ended": False}
        w["counts"]["reviews_in"] = 1
        err = self._err(w)
        text = (review.get("text") or "").strip()
        if not text:
            err("extract", "empty_review", "the review has no text", fld="text")
            w["counts"]["reviews_skipped"] += 1
            w["ended"] = True
            return w
        extra: dict[str, Any] = {}
        kept, words = truncate_words(text, self.s.max_review_words)
        if kept != text:
            w["counts"]["truncated_reviews"] += 1
            extra["review_truncated"] = {"words": words, "kept": self.s.max_review_words}
        if self.s.method == "triplets":
            name = self.s.domain or review.get("category")
            domain = self._domain(name)
            if domain is None:
                from rexeval.prompts import list_domains

                err("extract", "unknown_domain",
                    f"no topic table for domain {name!r} (known: {', '.join(list_domains())}); "
                    "set the review's category or pass --domain", fld="category")
                w["counts"]["reviews_skipped"] += 1
                w["ended"] = True
                return w
            extra["domain"] = domain.domain
            w["convo"] = self.prompt.render(review=kept, domain=domain)
            w["meta"] = {"domain": name, "version": self.prompt.version_for(domain), "extra": extra}
        else:
            w["convo"] = self.prompt.render(review=kept)
            w["meta"] = {"domain": None, "version": self.prompt.version_for(None), "extra": extra}
        w["phase"] = "first"
        w["outcome"] = _outcome_state(Outcome())
        return w

    def request(self, w: dict):
        """The ChatRequest a work in progress sends next (None once settled)."""
        from rexeval.models.llm.base import ChatRequest

        if w["phase"] == "done":
            return None
        return ChatRequest(messages=w["convo"], sampling=self.s.sampling, json_schema=self._task(w).schema)

    def role(self, w: dict) -> str:
        """Which model answers it: "llm", or "verify" for STAR's verification."""
        return "verify" if w["phase"] == "verify" else "llm"

    def advance(self, w: dict, result) -> dict:
        """Take the answer to `request(w)`: ask again with feedback, move to verification,
        or settle the review into statements and error rows."""
        from rexeval.pipelines.extract.structured import Outcome, record_answer

        w = dict(w)
        task = self._task(w)
        out = Outcome(**w["outcome"])
        last = out.attempts >= self.s.max_retries
        nxt = record_answer(out, w["convo"], task, result, self.s.sampling, last, self._feedback)
        if nxt is not None:
            w["convo"], w["outcome"] = nxt, _outcome_state(out)
            return w
        w["counts"] = counts = dict(w["counts"])
        w["statements"], w["errors"] = list(w["statements"]), list(w["errors"])
        self._count_calls(counts, [out])
        ended = [w["ended"]]
        meta = w["meta"]
        if w["phase"] == "first":
            stage = "triplet" if self.s.method == "triplets" else "candidate"
            domain = self._domain(meta["domain"]) if self.s.method == "triplets" else None
            kept = self._settle(0, w["review"], stage, out, meta["version"], meta["extra"], domain, counts,
                                self._err(w), ended)
            w["ended"] = ended[0]
            w["statements"].extend(kept or [])
            counts["statements" if self.s.method == "triplets" else "candidates"] += len(kept or [])
            if self.s.method == "star" and kept:
                cands = [{"statement": k["statement"], "sentiment": k["sentiment"]} for k in kept]
                w["phase"], w["outcome"] = "verify", _outcome_state(Outcome())
                w["convo"] = self.verify_prompt.render(candidates_json=items_json(cands, "statements"))
                return w
        else:
            kept = self._settle(0, w["review"], "verified", out, self.verify_prompt.version_for(None),
                                meta["extra"], None, counts, self._err(w), ended) or []
            w["ended"] = ended[0]
            w["statements"].extend(kept)
            counts["statements"] += len(kept)
        w["phase"], w["convo"], w["outcome"] = "done", None, {}
        return w

    def _task(self, w: dict) -> Task:
        if w["phase"] == "verify":
            return Task(w["convo"], CANDIDATES, CANDIDATES.json_schema() if self.s.constrained else None)
        if self.s.method == "triplets":
            domain = self._domain(w["meta"]["domain"])
            return Task(w["convo"], TRIPLETS, TRIPLETS.json_schema(domain.topic_names) if self.s.constrained else None)
        return Task(w["convo"], CANDIDATES, CANDIDATES.json_schema() if self.s.constrained else None)

    @property
    def _feedback(self):
        from rexeval.prompts import load_prompt

        if not hasattr(self, "_feedback_prompt"):
            self._feedback_prompt = load_prompt("retry_feedback")
        return self._feedback_prompt

    def _err(self, w: dict) -> Callable:
        r = w["review"]

        def err(_i_or_stage, *args, **kw):
            # `_settle` passes the review's index first; `start` does not.
            stage, etype, msg, *rest = args if isinstance(_i_or_stage, int) else (_i_or_stage, *args)
            raw = rest[0] if rest else kw.get("raw")
            fld = rest[1] if len(rest) > 1 else kw.get("fld")
            w["errors"].append({"stage": stage, "source": r.get("source"), "line": r.get("line"),
                                "row_id": r["review_id"], "field": fld, "error_type": etype, "message": msg,
                                "raw": raw if raw is None or isinstance(raw, str)
                                else json.dumps(raw, ensure_ascii=False)})
        return err

    # -- main ------------------------------------------------------------------------

    def run(self, reviews: pa.Table) -> tuple[pa.Table, pa.Table, dict[str, int]]:
        """Statements (STATEMENTS schema), error rows (ERRORS) and counts for `reviews`,
        asking `generate` (and `verify_generate`) one batch per round."""
        from rexeval.pipelines.extract.structured import _safe_generate

        works = [self.start(r) for r in reviews.to_pylist()]
        while True:
            pending = [k for k, w in enumerate(works) if w["phase"] != "done"]
            if not pending:
                break
            for role, generate in (("llm", self.generate), ("verify", self.verify_generate)):
                idx = [k for k in pending if self.role(works[k]) == role]
                if idx:
                    results = _safe_generate(generate, [self.request(works[k]) for k in idx])
                    for k, res in zip(idx, results):
                        works[k] = self.advance(works[k], res)
        return settle_works(works)

    def _settle(self, i, review, stage, out: Outcome, version, extra, domain, counts,
                err: Callable, ended: list) -> list[dict] | None:
        """One answer -> its statement rows, or the error row that ends the review.

        Returns None when the answer failed, [] when it held no usable statement.
        """
        err_stage = "verify" if stage == "verified" else "extract"
        if not out.ok:
            err(i, err_stage, out.error_type, out.message, out.raw)
            counts["reviews_failed"] += 1
            ended[i] = True
            return None
        kept = self._statement_rows(i, review, stage, out, version, extra, domain, counts, err)
        if not kept:
            if out.parsed.item_errors:
                why = "every item of the answer was invalid"
            elif stage == "verified":
                why = "verification kept no statement"
            else:
                why = "the model found no explanatory statement"
            err(i, err_stage, "no_statements", why, out.raw)
            counts["reviews_empty"] += 1
            ended[i] = True
        return kept

    def _count_calls(self, counts: dict, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            counts["llm_calls"] += o.attempts
            counts["retries"] += max(0, o.attempts - 1)
            counts["cached_calls"] += o.cached_calls
            counts["prompt_tokens"] += o.prompt_tokens
            counts["completion_tokens"] += o.completion_tokens
            counts["repaired_answers"] += int(bool(o.repairs))

    def _statement_rows(self, i, review, stage, out: Outcome, version, extra, domain, counts,
                        err: Callable) -> list[dict]:
        """Normalise, map topics, dedup and id the valid items of one answer."""
        err_stage = "verify" if stage == "verified" else "extract"
        for raw, fld, msg in out.parsed.item_errors:
            err(i, err_stage, "invalid_item", msg, raw, fld)
            counts["item_errors"] += 1
        if out.parsed.salvaged:
            err(i, err_stage, "truncated_json",
                "the answer was cut off; its complete items were kept, the last one is lost",
                out.raw)
        items = out.parsed.items
        mapped: dict[int, tuple[str, float]] = {}
        if domain is not None:
            listed = set(domain.topic_names)
            off = [k for k, it in enumerate(items) if it.topic.strip().lower() not in listed]
            if off:
                if self.topic_mapper is None:
                    for k in off:
                        err(i, err_stage, "off_list_topic",
                            f"topic {items[k].topic!r} is not in the {domain.domain} list and no "
                            "embedder is configured to map it", items[k].model_dump(), "topic")
                        counts["item_errors"] += 1
                else:
                    for k, res in zip(off, self.topic_mapper.map(domain, [items[k].topic for k in off])):
                        mapped[k] = res
        seen, kept = set(), []
        product_subject = self.s.method == "star"
        for k, it in enumerate(items):
            if domain is not None and it.topic.strip().lower() not in domain.topic_names and k not in mapped:
                continue  # recorded above as off_list_topic
            text = normalise_statement(it.statement, product_subject=product_subject)
            key = (dedup_key(text), it.sentiment)
            if not key[0] or key in seen:
                continue
            seen.add(key)
            prov_extra = dict(extra)
            topic = None
            if domain is not None:
                topic = it.topic.strip().lower()
                if k in mapped:
                    topic, sim = mapped[k]
                    prov_extra["topic_mapped_from"] = it.topic
                    prov_extra["topic_similarity"] = round(sim, 4)
                    counts["topics_mapped"] += 1
            kept.append({
                "statement_id": statement_id(review["review_id"], stage, text, it.sentiment),
                "review_id": review["review_id"], "user_id": review["user_id"],
                "item_id": review["item_id"], "statement": text, "topic": topic,
                "sentiment": it.sentiment, "stage": stage,
                "provenance": json.dumps(self._provenance(stage, out, version, prov_extra),
                                         sort_keys=True, ensure_ascii=False),
            })
        return kept


def _outcome_state(out) -> dict:
    """An Outcome as JSON (its parsed answer is never carried: it is settled at once)."""
    return {"raw": out.raw, "attempts": out.attempts, "error_type": out.error_type, "message": out.message,
            "prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "cached_calls": out.cached_calls, "repairs": list(out.repairs)}


def settle_works(works: list[dict]) -> tuple[pa.Table, pa.Table, dict[str, int]]:
    """Settled works -> statements, error rows and summed counts (in the works' order)."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    statements, errors = [], []
    for w in works:
        statements.extend(w["statements"])
        errors.extend(w["errors"])
        for k, v in w["counts"].items():
            counts[k] += v
        counts["reviews_out"] += int(not w["ended"])
    # Verification's rows after every first-stage row, as when the stages ran in turn.
    statements.sort(key=lambda r: r["stage"] == "verified")
    errors.sort(key=lambda r: r["stage"] == "verify")
    return _statements_table(statements), _errors_table(errors), counts


def _statements_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=STATEMENTS) if rows else STATEMENTS.empty_table()


def _errors_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ERRORS) if rows else ERRORS.empty_table()
