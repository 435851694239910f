"""Review-based explanations (seed 004, §5.1): what other buyers wrote about the item,
taken as it is (review extraction) or condensed by an LLM (review summarisation).

Both read only the item's known reviews written by other shoppers: never the review
being explained (it is not in the known data) nor anything else the shopper wrote about
the item.

Review extraction needs no LLM. Seed 004 cites extractive explainers (Chen et al. 2021,
Xie et al. 2022) without fixing a rule, so ours is a scored sentence selection, stated
here in full:
1. the item's other reviews are cut into sentences (`models.sentences.split_sentences`);
2. candidates are the sentences the EXTRA filter keeps (`pipelines.paraphrase.extra.
   is_candidate`: 4 to `extract_max_words` words, a letter, no URL, no personal pronoun,
   so "It stays in tune for weeks" is kept and "I bought it for my son" is not); when no
   sentence passes, every sentence of 4 to `extract_max_words` words is a candidate;
3. each candidate is scored by the cosine between its TF-IDF vector and the mean vector
   of all the item's candidates (scikit-learn, IDF over the whole known corpus): a
   sentence that says what many buyers say about the item scores high, a one-off aside
   low; ties go to the earlier review, then the earlier sentence;
4. the best sentence is kept, then the next best ones while the total stays within
   `extract_max_words` words, at most `extract_sentences`, skipping near-repeats (cosine
   over 0.8 with a kept one); they are joined in score order.
`context` records the review ids the sentences came from.

Review summarisation: the LLM reads up to `summary_reviews` of the item's other reviews
(most helpful, then most recent first; each cut to `summary_review_words` words) with the
item description, and writes a short, non-personalised summary. Interactions with the
same item and the same review set share one prompt, so the LLM answers it once.

An item without any other review in the known data is an error row (`no_reviews`).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from rexeval.pipelines.generate.prompted.methods import (Method, PromptedMethod, PromptedSettings, Skip,
                                                         register_method)

NEAR_REPEAT = 0.8
MIN_SENTENCE_WORDS = 4


def _others(known: pd.DataFrame) -> dict[str, pd.DataFrame]:
    cols = ["review_id", "user_id", "item_id", "rating", "timestamp", "text", "helpful_votes"]
    k = known[cols].copy()
    k["helpful_votes"] = pd.to_numeric(k["helpful_votes"], errors="coerce").fillna(0)
    k = k.sort_values(["helpful_votes", "timestamp", "review_id"], ascending=[False, False, True], kind="stable")
    return {i: g for i, g in k.groupby("item_id", sort=False)}


def _other_reviews(by_item: dict[str, pd.DataFrame], target) -> pd.DataFrame | None:
    """The item's known reviews by other shoppers than the target's, or None."""
    reviews = by_item.get(target.item_id)
    reviews = None if reviews is None else reviews[reviews["user_id"] != target.user_id]
    return None if reviews is None or reviews.empty else reviews


def candidate_sentences(reviews: pd.DataFrame, sentences: Mapping[str, list[str]], max_words: int) -> pd.DataFrame:
    """Candidate sentences of the reviews (review_id, position, sentence), step 2;
    `sentences` holds each review's sentences, split once for the whole plan."""
    from rexeval.pipelines.paraphrase.extra import is_candidate

    rows, fallback = [], []
    for order, r in enumerate(reviews.itertuples(index=False)):
        for pos, s in enumerate(sentences[r.review_id]):
            n = len(s.split())
            if n < MIN_SENTENCE_WORDS or n > max_words:
                continue
            row = {"review_id": r.review_id, "order": order, "position": pos, "sentence": s.strip()}
            (rows if is_candidate(s, min_words=MIN_SENTENCE_WORDS, max_words=max_words)[0] else fallback).append(row)
    return pd.DataFrame(rows or fallback, columns=["review_id", "order", "position", "sentence"])


def select_sentences(cands: pd.DataFrame, vectorizer, max_sentences: int, max_words: int) -> pd.DataFrame:
    """The chosen sentences in score order (steps 3 and 4), with their `score`."""
    from sklearn.preprocessing import normalize

    x = normalize(vectorizer.transform(cands["sentence"]))
    centre = normalize(np.asarray(x.mean(axis=0)))
    scored = cands.assign(score=np.asarray(x @ centre.T).ravel(), row=np.arange(len(cands)))
    scored = scored.sort_values(["score", "order", "position"], ascending=[False, True, True], kind="stable")
    kept, words = [], 0
    for r in scored.itertuples(index=False):
        n = len(r.sentence.split())
        if kept and (words + n > max_words or len(kept) >= max_sentences):
            continue
        if any(float((x[r.row] @ x[k.row].T).toarray()[0, 0]) > NEAR_REPEAT for k in kept):
            continue
        kept.append(r)
        words += n
    return pd.DataFrame(kept, columns=list(scored.columns)).drop(columns="row")


@register_method("review_extract")
class ReviewExtract(Method):
    """The most typical sentences of other buyers' reviews of the item (TF-IDF centroid
    score; no LLM)."""

    uses_llm = False
    conditions_on = "other buyers' reviews of the item (no LLM)"
    never_sees = "the user's reviews"
    errors = ("no_reviews", "no_sentence")

    def plan(self, inputs, settings: PromptedSettings, contexts: pd.DataFrame, mf=None) -> pd.DataFrame:
        from sklearn.feature_extraction.text import TfidfVectorizer

        from rexeval.models.sentences import split_sentences

        by_item = _others(inputs.known)
        known = inputs.known
        sentences = {rid: split_sentences(text) for rid, text in zip(known["review_id"], known["text"].fillna(""))}
        corpus = [x for split in sentences.values() for x in split]
        vectorizer = TfidfVectorizer(sublinear_tf=True, stop_words="english").fit(corpus or ["empty"])
        picked: dict[tuple, pd.DataFrame] = {}
        rows = []
        for t in inputs.targets.itertuples(index=False):
            reviews = _other_reviews(by_item, t)
            if reviews is None:
                rows.append(self.row(t, skip="no_reviews", skip_message=(
                    f"no other shopper reviewed item {t.item_id} in the known data")))
                continue
            key = (t.item_id, tuple(reviews["review_id"]))
            if key not in picked:
                cands = candidate_sentences(reviews, sentences, settings.extract_max_words)
                picked[key] = (select_sentences(cands, vectorizer, settings.extract_sentences,
                                                settings.extract_max_words) if len(cands) else cands)
            chosen = picked[key]
            if chosen.empty:
                rows.append(self.row(t, skip="no_sentence", skip_message=(
                    f"the reviews of item {t.item_id} have no sentence of {MIN_SENTENCE_WORDS} to "
                    f"{settings.extract_max_words} words")))
                continue
            rows.append(self.row(t, explanation=" ".join(chosen["sentence"]),
                                 context={"reviews": list(chosen["review_id"]),
                                          "scores": [round(float(s), 4) for s in chosen["score"]]}))
        return self.frame(rows, version="tfidf-centroid-1")


@register_method("review_summary")
class ReviewSummary(PromptedMethod):
    """The LLM summarises other buyers' reviews of the item."""

    prompt = "explain_review_summary"
    conditions_on = ("up to 8 of other buyers' reviews of the item (most helpful, then most recent; 80 words "
                     "each) and its description")
    never_sees = "the user's reviews"
    errors = ("no_reviews",)

    def prepare(self, inputs, settings: PromptedSettings, mf=None) -> dict[str, pd.DataFrame]:
        return _others(inputs.known)

    def fill(self, target, context, settings: PromptedSettings, state: dict[str, pd.DataFrame]):
        reviews = _other_reviews(state, target)
        if reviews is None:
            return Skip("no_reviews", f"no other shopper reviewed item {target.item_id} in the known data")
        shown = reviews.head(settings.summary_reviews)
        items = []
        for r in shown.itertuples(index=False):
            words = str(r.text or "").split()
            cut = len(words) > settings.summary_review_words
            items.append({"rating": f"{r.rating:g}" if pd.notna(r.rating) else "?",
                          "text": " ".join(words[:settings.summary_review_words]), "cut": cut})
        return ({"item_description": context.item_description, "reviews": items},
                {"reviews": list(shown["review_id"])})
