"""User-based and item-based explanations (seed 004, §5.1, after Kouki et al. 2019 and Lu
et al. 2023): a BiasedMF trained on the known ratings (`prompted/mf.py`, a Tune trial)
finds the nearest users or items by the cosine of their latent factors, and an LLM
writes the method's sentence from them.

- user-based: among the other shoppers who reviewed the recommended item in the known
  data (those who rated it `liked_rating` or more when there are any, else all of
  them), the `k_users` whose factors are closest to the shopper's; each is shown with
  their rating of the item and up to `also_liked` other items they liked (their most
  recent first). The prompt holds the item and those shoppers, nothing of the shopper's
  own reviews. Seed 004's wording, "users with similar tastes to yours like this item.
  They have also purchased these items", asks for exactly this.
- item-based: among the shopper's purchases strictly before the interaction, the
  `k_items` whose factors are closest to the recommended item's, shown with the
  shopper's rating ("this item is similar to one you've already bought").

An item is named by its title, or by the reviewer's headline (or first words) when the
data has no titles (`context.history_lines`). Rows the method cannot serve are error
rows: `cold_user` / `cold_item` (no known rating, so no factors), `no_neighbour` (no
other shopper reviewed the item), `no_history` (no earlier purchase with factors).
Where seed 004 used Claude-3-Sonnet to write the sentence, we use the profile's `llm`.
"""
from __future__ import annotations

import pandas as pd

from rexeval.pipelines.core.context import history_lines, item_facts, prepare_reviews
from rexeval.pipelines.generate.prompted.methods import PromptedMethod, PromptedSettings, Skip, register_method


def known_lines(known: pd.DataFrame) -> pd.DataFrame:
    """The known reviews (user_id, item_id, rating, timestamp, review_id) with `line`,
    how the item is named in a prompt ("<title or headline> (rated r/5)"), most recent
    first."""
    r = prepare_reviews(known)
    lines = history_lines(r, item_facts(r)["item_title"]).str.removeprefix("- ")
    out = r[["user_id", "item_id", "rating", "timestamp", "review_id"]].assign(line=lines.astype(object))
    out["rating"] = pd.to_numeric(out["rating"], errors="coerce")
    return out.sort_values(["timestamp", "review_id"], ascending=False, kind="stable").reset_index(drop=True)


def _rating(v) -> str:
    return f"{v:g}/5" if pd.notna(v) else "unrated"


@register_method("user_based")
class UserBased(PromptedMethod):
    """A BiasedMF (Tune trial) finds shoppers with similar tastes who bought the item;
    the LLM says so and names what else they liked."""

    prompt = "explain_user_based"
    needs_mf = True
    conditions_on = ("the item's description; the `k_users` (3) shoppers whose BiasedMF factors are closest to "
                     "the user's, among those who reviewed the item (those who rated it ≥ 4 when any), each with "
                     "their rating of it and up to 3 other items they liked")
    never_sees = "anything the user wrote"
    errors = ("cold_user", "no_neighbour")

    def prepare(self, inputs, settings: PromptedSettings, mf=None) -> dict:
        lines = known_lines(inputs.known)
        return {"mf": mf, "uidx": mf.user_index(),
                "by_item": {k: g for k, g in lines.groupby("item_id", sort=False)},
                "by_user": {k: g for k, g in lines.groupby("user_id", sort=False)}}

    def fill(self, t, c, settings: PromptedSettings, state: dict):
        from rexeval.models.recommenders.biased_mf import nearest  # torch: imported when it runs, not for --help

        mf, uidx = state["mf"], state["uidx"]
        if t.user_id not in uidx:
            return Skip("cold_user", f"user {t.user_id} has no review in the known data, so BiasedMF has no "
                        "factors for them")
        raters = state["by_item"].get(t.item_id)
        raters = None if raters is None else raters[(raters["user_id"] != t.user_id)
                                                   & raters["user_id"].isin(uidx.keys())]
        if raters is None or raters.empty:
            return Skip("no_neighbour", f"no other shopper reviewed item {t.item_id} in the known data")
        raters = raters.drop_duplicates("user_id")  # each one's latest review of the item
        liked = raters[raters["rating"] >= settings.liked_rating]
        pool = liked if not liked.empty else raters
        found = nearest(mf.user_factors, uidx[t.user_id], [uidx[v] for v in pool["user_id"]], settings.k_users)
        rated = dict(zip(pool["user_id"], pool["rating"]))
        blocks, ids, sims = [], [], []
        for n, (j, sim) in enumerate(found, 1):
            v = mf.user_ids[j]
            theirs = state["by_user"][v]
            others = theirs[(theirs["item_id"] != t.item_id) & (theirs["rating"] >= settings.liked_rating)]
            others = others.drop_duplicates("item_id").head(settings.also_liked)
            text = f"Shopper {n} (taste similarity {sim:.2f}) rated this item {_rating(rated[v])}."
            if len(others):
                text += " Also liked: " + "; ".join(others["line"]) + "."
            blocks.append(text)
            ids.append(v)
            sims.append(round(float(sim), 4))
        return ({"item_description": c.item_description, "neighbours": "\n".join(blocks)},
                {"neighbours": ids, "similarities": sims})


@register_method("item_based")
class ItemBased(PromptedMethod):
    """The BiasedMF finds the shopper's earlier purchases closest to the item; the LLM
    says the item resembles them."""

    prompt = "explain_item_based"
    needs_mf = True
    conditions_on = ("the item's description; the `k_items` (2) of the user's purchases before the interaction "
                     "whose factors are closest to the item's, with the user's ratings")
    never_sees = "other shoppers' choices"
    errors = ("cold_item", "no_history")

    def prepare(self, inputs, settings: PromptedSettings, mf=None) -> dict:
        lines = known_lines(inputs.known)
        return {"mf": mf, "iidx": mf.item_index(),
                "by_user": {k: g for k, g in lines.groupby("user_id", sort=False)}}

    def fill(self, t, c, settings: PromptedSettings, state: dict):
        from rexeval.models.recommenders.biased_mf import nearest  # torch: imported when it runs, not for --help

        mf, iidx = state["mf"], state["iidx"]
        if t.item_id not in iidx:
            return Skip("cold_item", f"item {t.item_id} has no review in the known data, so BiasedMF has no "
                        "factors for it")
        mine = state["by_user"].get(t.user_id)
        if mine is not None:
            when = float(t.timestamp) if pd.notna(t.timestamp) else float("inf")
            mine = mine[(mine["timestamp"] < when) & (mine["item_id"] != t.item_id)
                        & mine["item_id"].isin(iidx.keys())].drop_duplicates("item_id")
        if mine is None or mine.empty:
            return Skip("no_history", f"user {t.user_id} bought nothing before this interaction in the known data")
        line_of = dict(zip(mine["item_id"], mine["line"]))
        found = nearest(mf.item_factors, iidx[t.item_id], [iidx[i] for i in mine["item_id"]], settings.k_items)
        items = [mf.item_ids[j] for j, _ in found]
        text = "\n".join(f"- {line_of[i]} (similarity {sim:.2f})" for i, (_, sim) in zip(items, found))
        return ({"item_description": c.item_description, "similar_items": text},
                {"similar_items": items, "similarities": [round(float(s), 4) for _, s in found]})
