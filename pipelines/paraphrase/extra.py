"""EXTRA baseline: recurring review sentences grouped by MinHash LSH (seed 002, Table 3).

Seed 002 compares STAR's statement extraction and semantic clustering with the EXTRA
benchmark (Li, Zhang & Chen, SIGIR 2021). As seed 002 describes it, EXTRA takes
candidate explanations straight from review sentences with heuristics (sentences that
recur across the corpus, no personal pronouns) and groups paraphrases with
locality-sensitive hashing over n-grams, so it merges little beyond lexical overlap.
This module is *our reading* of that recipe, written from the description, not from
EXTRA's code. Every rule and default is listed here so a reader can judge the row.

Sentences come from `rexeval.models.sentences.split_sentences` (review text cut at line
breaks, by the packaged Punkt model, and after "!"/"?" runs; its docstring has the rules).

Normalisation (`normalise_candidate`)
    NFKC; lowercase; runs of punctuation ("!!", "?!", ",,", "--") collapse to their
    first character, except a run of dots, which becomes an ellipsis "..."; spaces before ",.;:!?" are removed; whitespace collapses to one
    space; punctuation, quotes and symbols (Unicode categories P*, plus *~`^|) are
    stripped at both ends. "Good Job !" -> "good job", "great toy !!" -> "great toy".

Candidate filter (`is_candidate`, on a sentence or its normalised form), first failing
rule gives the reason:
    "empty"       nothing left after normalisation;
    "no_letter"   no letter at all (digits-only, emoticons, punctuation);
    "url"         contains a URL or web address (http://, https://, www., or
                  name.com / .net / .org);
    "too_short"   fewer than `min_words` words (default 2; "great!" is dropped);
    "too_long"    more than `max_words` words (default 20: EXTRA's explanations are
                  short recurring sentences, long ones never recur);
    "pronoun"     a personal pronoun that refers to people: `PEOPLE_PRONOUNS`, first,
                  second and third person, their possessives and reflexives, the
                  contracted forms (i'm, you've, they're ...) and their apostrophe-less
                  spellings (im, ive, youre, theyre ...), plus "u"/"ur"; "US" in
                  capitals is the country, not "us". "it", "its", "this", "that",
                  "one" stay: they refer to the product.
    Words are runs of letters/digits with inner apostrophes ("it's" is one word).

Recurrence (`extra_candidates`)
    Each review's sentences are normalised and filtered; a candidate kept twice in the
    same review, up to case and punctuation (`pipelines.core.ids.dedup_key`, the key
    of `statement_id`), counts once ("duplicate_in_review"). Recurrence is
    counted in *distinct reviews* (default `min_count` 5) on the candidate's MinHash
    LSH group (`recurrence="lsh"`, the default: EXTRA groups near-duplicate sentences
    and keeps the groups that recur, so "so far, so good" is kept when it and "so far
    so good" together occur in 5 reviews; the grouping is `minhash_lsh_clusters` with
    the same threshold and seed as the clustering step, so a group is kept or dropped
    whole and clustering the kept rows gives back the same groups) or on the exact
    normalised form (`recurrence="exact"`). Sentences below the count are dropped as
    "rare". The stats account for every sentence:
    sentences == kept + sum(dropped.values()).

MinHash LSH grouping, representatives and the reduction figure are in
`pipelines/paraphrase/minhash.py`.
"""
from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from rexeval.models.sentences import split_sentences
from rexeval.pipelines.paraphrase.minhash import WORD_PATTERN, minhash_lsh_clusters, words
from rexeval.pipelines.core.schema import STATEMENTS
from rexeval.pipelines.core.ids import dedup_key, statement_id

STAGE = "extra"

# Personal pronouns that refer to people (EXTRA drops sentences about the reviewer,
# the reader or other people). "they" may mean the product ("they sound great" of a
# set of strings), but a word list cannot tell, so it goes with the other forms.
PEOPLE_PRONOUNS: frozenset[str] = frozenset({
    # first person
    "i", "me", "my", "mine", "myself", "we", "us", "our", "ours", "ourselves",
    "i'm", "i've", "i'd", "i'll", "we're", "we've", "we'd", "we'll",
    "im", "ive", "weve",  # not "ill" (ill-fitting) nor "id" (ID)
    # second person
    "you", "your", "yours", "yourself", "yourselves",
    "you're", "you've", "you'd", "you'll", "youre", "youve", "youll", "u", "ur",
    # third person (people)
    "he", "him", "his", "himself", "she", "her", "hers", "herself",
    "he's", "he'd", "he'll", "she's", "she'd", "she'll", "hes", "shes",
    "they", "them", "their", "theirs", "themselves", "themself",
    "they're", "they've", "they'd", "they'll", "theyre", "theyve",
})

_LETTER = re.compile(r"[^\W\d_]")
_URL = re.compile(r"(?:https?://|www\.)\S+|\b\S+\.(?:com|net|org)\b", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
_PUNCT_RUN = re.compile(r"([!?.,;:*~\-])[!?.,;:*~\-]+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_END_SYMBOLS = set("*~`^|")


def _strip_ends(s: str) -> str:
    def junk(c: str) -> bool:
        return c.isspace() or c in _END_SYMBOLS or unicodedata.category(c).startswith("P")

    i, j = 0, len(s)
    while i < j and junk(s[i]):
        i += 1
    while j > i and junk(s[j - 1]):
        j -= 1
    return s[i:j]


def _collapse_run(m: re.Match) -> str:
    run = m.group(0)
    return "..." if set(run) == {"."} else run[0]


def normalise_candidate(sentence: str) -> str:
    """Lowercase, collapse punctuation runs and spaces, strip punctuation at the ends."""
    s = unicodedata.normalize("NFKC", sentence).lower()
    s = _PUNCT_RUN.sub(_collapse_run, s)
    s = _SPACE_BEFORE_PUNCT.sub(r"\1", s)
    s = _SPACE.sub(" ", s)
    return _strip_ends(s)


def is_candidate(sentence: str, min_words: int = 2, max_words: int = 20) -> tuple[bool, str]:
    """(keep, reason): "ok" or the first rule that fails (see the module doc)."""
    s = sentence.strip()
    if not s or not normalise_candidate(s):
        return False, "empty"
    if not _LETTER.search(s):
        return False, "no_letter"
    if _URL.search(s):
        return False, "url"
    ws = words(s)
    if len(ws) < min_words:
        return False, "too_short"
    if len(ws) > max_words:
        return False, "too_long"
    raw = WORD_PATTERN.findall(s.replace("\u2019", "'"))
    if any(w.lower() in PEOPLE_PRONOUNS and w != "US" for w in raw):
        return False, "pronoun"
    return True, "ok"


# -- candidates ------------------------------------------------------------------------


def _review_rows(reviews: Any) -> Iterable[dict]:
    cols = ("review_id", "user_id", "item_id", "text")
    if isinstance(reviews, pa.Table):
        missing = [c for c in cols if c not in reviews.column_names]
        if missing:
            raise ValueError(f"reviews table lacks columns {missing}")
        data = {c: reviews.column(c).to_pylist() for c in cols}
        return (dict(zip(cols, vals)) for vals in zip(*(data[c] for c in cols)))
    return reviews


def extra_candidates(reviews: Any, min_count: int = 5, *, min_words: int = 2,
                     max_words: int = 20, recurrence: str = "lsh",
                     lsh_threshold: float = 0.9, num_perm: int = 128, ngram: int = 2,
                     seed: int = 1) -> tuple[pa.Table, dict]:
    """Reviews -> EXTRA candidate rows (STATEMENTS schema, stage "extra") and stats.

    `reviews`: a pa.Table or dicts with review_id, user_id, item_id, text. A candidate
    row per (review, normalised sentence) that passes `is_candidate` and recurs in
    `min_count` distinct reviews (exactly, or by LSH group with `recurrence="lsh"`).
    Stats count every sentence: sentences == kept + sum(dropped.values()).
    """
    if recurrence not in ("exact", "lsh"):
        raise ValueError(f"recurrence must be 'exact' or 'lsh', got {recurrence!r}")
    dropped: Counter[str] = Counter()
    n_reviews = n_sentences = 0
    # (review, original sentence, normalised) of the sentences that pass the filter
    pending: list[tuple[dict, str, str]] = []
    for review in _review_rows(reviews):
        n_reviews += 1
        seen: set[str] = set()
        for sent in split_sentences(review.get("text")):
            n_sentences += 1
            norm = normalise_candidate(sent)
            ok, reason = is_candidate(sent, min_words=min_words, max_words=max_words)
            if not ok:
                dropped[reason] += 1
                continue
            key = dedup_key(norm)  # the key statement_id hashes
            if key in seen:
                dropped["duplicate_in_review"] += 1
                continue
            seen.add(key)
            pending.append((review, sent, norm))

    # Distinct reviews per normalised text: each (review, text) appears once in pending.
    text_reviews = Counter(norm for _, _, norm in pending)
    if recurrence == "exact":
        support = text_reviews
    else:
        distinct = list(text_reviews)
        labels = minhash_lsh_clusters(distinct, threshold=lsh_threshold, num_perm=num_perm,
                                      ngram=ngram, seed=seed)
        group_of = dict(zip(distinct, labels.tolist()))
        group_reviews: dict[int, set] = defaultdict(set)
        for review, _, norm in pending:
            group_reviews[group_of[norm]].add(review["review_id"])
        support = {t: len(group_reviews[group_of[t]]) for t in distinct}

    rows: dict[str, list] = {f.name: [] for f in STATEMENTS}
    for review, sent, norm in pending:
        if support[norm] < min_count:
            dropped["rare"] += 1
            continue
        rid = str(review["review_id"])
        rows["statement_id"].append(statement_id(rid, STAGE, norm, None))
        rows["review_id"].append(rid)
        rows["user_id"].append(str(review["user_id"]))
        rows["item_id"].append(str(review["item_id"]))
        rows["statement"].append(norm)
        rows["topic"].append(None)
        rows["sentiment"].append(None)
        rows["stage"].append(STAGE)
        rows["provenance"].append(json.dumps({"method": STAGE, "sentence": sent},
                                             ensure_ascii=False))
    table = pa.table(rows, schema=STATEMENTS)
    kept = table.num_rows
    stats = {
        "reviews": n_reviews,
        "sentences": n_sentences,
        "kept": kept,
        "dropped": dict(sorted(dropped.items())),
        "distinct_kept": len(set(rows["statement"])),
        "min_count": min_count,
        "min_words": min_words,
        "max_words": max_words,
        "recurrence": recurrence,
    }
    if recurrence == "lsh":
        stats.update(lsh_threshold=lsh_threshold, num_perm=num_perm, ngram=ngram, seed=seed)
    assert n_sentences == kept + sum(dropped.values()), stats
    return table, stats
