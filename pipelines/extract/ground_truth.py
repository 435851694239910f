"""Rule-based ground-truth explanations from statement-topic-sentiment triplets.

Seed 000 (III-B) turns a review's triplets into one paragraph without an LLM: group the
statements by polarity, write one sentence per polarity ("The user would appreciate
this product because ...", "... may dislike ...", "... seems indifferent to ..."),
and join the sentences with simple connectors, so every statement survives. The
statement-level metrics (IV-B) score each statement in the same pattern, so the
single-statement sentence is built here too, from the same templates.

Statements come from reviews in the first person ("I love the sound"); the paragraph
talks about "the user", so each statement is rewritten in the third person first.

Everything here is pure (no Ray): `build_explanation` is the readable rule for one
review and `ground_truth_tables` the vectorised one for a whole table; a test checks
that both write the same paragraph.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rexeval.pipelines.core.schema import error_rows, validate_table
from rexeval.pipelines.core.ids import dedup_key

STAGE = "ground-truth"
SYSTEM = "ground_truth"
# Bump when a template or a rewriting rule changes: it is part of the job's config hash,
# so outputs written under older rules are not silently mixed with new ones.
RULES_VERSION = 1
POLARITIES = ("positive", "negative", "neutral")  # also the order of the sentences

# Openers per polarity: (first sentence of the paragraph, a later sentence). After the
# first sentence the user is "they". "However," marks the one contrast the order allows
# (negative after positive); a neutral sentence is neither a contrast nor more of the
# same, so it just starts with "They", as in seed 000's Table I. "Also," is not used:
# each polarity has exactly one sentence, so there is never "more of the same" to add.
#
# Neutral: the seed writes "indifferent to {statement}" ("indifferent to it is a bit
# larger"), which is ungrammatical, since "indifferent to" needs a noun phrase. "the
# fact that {clauses}" makes the clauses one noun phrase and keeps each statement
# verbatim, which a gerund or noun rewrite could not do without a parser.
OPENERS: dict[str, tuple[str, str]] = {
    "positive": ("The user would appreciate this product because ",
                 "They would also appreciate this product because "),  # never later (order)
    "negative": ("The user may dislike that ", "However, they may dislike that "),
    "neutral": ("The user seems indifferent to the fact that ",
                "They seem indifferent to the fact that "),
}

# -- rewriting one statement -----------------------------------------------------------

_NOT_IN_WORD = r"(?<![\w'’])"
_END_OF_WORD = r"(?![\w'’])"
# Adverbs allowed between "I" and "am/was" ("I really was") for the agreement fix.
_ADVERBS = ("really|also|just|never|always|actually|still|definitely|even|only|honestly|"
            "truly|initially|originally|certainly|probably|usually|often|sometimes|"
            "personally|mostly|already|finally|absolutely|not")
_BE_AFTER_I = re.compile(
    rf"{_NOT_IN_WORD}(I)(\s+(?:(?:{_ADVERBS})\s+)?)(am|was)(n['’]t)?{_END_OF_WORD}", re.I)
_BE_BEFORE_I = re.compile(rf"{_NOT_IN_WORD}(am|was)(n['’]t)?(\s+)(I){_END_OF_WORD}", re.I)
_BE_PLURAL = {"am": "are", "was": "were"}
_PRONOUN = re.compile(
    rf"{_NOT_IN_WORD}(?:(I|we)(['’])(m|ve|d|ll|re)|"
    rf"(myself|ourselves|ourself|mine|ours|my|our|me|us|I|we)){_END_OF_WORD}", re.I)
_THIRD = {"i": "they", "we": "they", "me": "them", "us": "them", "my": "their",
          "our": "their", "mine": "theirs", "ours": "theirs", "myself": "themselves",
          "ourselves": "themselves", "ourself": "themselves"}
_DOUBLE_QUOTES = "\"“”«»„`"
_SINGLE_QUOTES = "'‘’"
_TRAILING = ".!?;:,…"
_SPACES = re.compile(r"\s+")


def _strip(statement: str) -> str:
    """Drop surrounding whitespace and quotes and trailing punctuation, repeatedly."""
    s, prev = statement, None
    while s != prev:
        prev = s
        s = s.strip().strip(_DOUBLE_QUOTES).rstrip(_TRAILING).strip()
        # Single quotes go only as one pair around everything: alone, or with another
        # quoted part inside ("'a' and 'b'"), they are apostrophes or inner quotes.
        if (len(s) >= 2 and s[0] in _SINGLE_QUOTES and s[-1] in _SINGLE_QUOTES
                and not re.search(r"\W['‘’]|['‘’]\W", s[1:-1])):
            s = s[1:-1]
    return s


def _sentence_start(text: str, pos: int) -> bool:
    before = text[:pos].rstrip().rstrip(_DOUBLE_QUOTES + _SINGLE_QUOTES + "([").rstrip()
    return not before or before[-1] in ".!?"


def _recase(original: str, third: str, text: str, pos: int) -> str:
    """Give the third-person word the case of the first-person one it replaces."""
    if len(original) > 1 and original.isupper() and original[:2].upper() != "I'":
        return third.upper()  # "MY" -> "THEIR"
    if original[0].isupper():
        # "I" is capitalised by grammar, not by position: keep a capital only where a
        # sentence starts. Other words ("My", "We") keep the capital they had.
        if original[0] == "I" and not _sentence_start(text, pos):
            return third
        return third[0].upper() + third[1:]
    return third


def _pronoun(m: re.Match) -> str:
    text, pos = m.string, m.start()
    if m.group(1):  # a contraction: I'm, we've, ...
        suffix = "re" if m.group(3).lower() == "m" else m.group(3)
        return _recase(m.group(1), "they", text, pos) + m.group(2) + suffix
    word = m.group(4)
    if word == "US":  # the country, not "us"
        return word
    return _recase(word, _THIRD[word.lower()], text, pos)


def _be_after(m: re.Match) -> str:
    pron = _recase(m.group(1), "they", m.string, m.start())
    verb = _BE_PLURAL[m.group(3).lower()]
    verb = verb.upper() if m.group(3).isupper() and len(m.group(3)) > 1 else verb
    return pron + m.group(2) + verb + (m.group(4) or "")


def _be_before(m: re.Match) -> str:
    verb = _BE_PLURAL[m.group(1).lower()]
    if m.group(1)[0].isupper():
        verb = verb.capitalize()
    return verb + (m.group(2) or "") + m.group(3) + "they"


def _lower_first(s: str) -> str:
    """Lower-case the first word's capital unless it looks like a name or acronym."""
    m = re.match(r"[^\w]*(\w[\w'’-]*)", s)
    if not m:
        return s
    word, at = m.group(1), m.start(1)
    if (not word[0].isupper() or word == "I" or any(c.isupper() for c in word[1:])
            or any(c.isdigit() for c in word)):
        return s  # "USB", "iPhone", "McIntosh", "X2" stay as written
    return s[:at] + word[0].lower() + s[at + 1:]


def point_of_view(statement: str) -> str:
    """Rewrite a first-person statement about the user in the third person ("they").

    Strips quotes and trailing punctuation, maps I/me/my/mine/myself (and we/us/our/
    ours/ourselves, and the contractions I'm, I've, I'd, I'll, we're, ...) to
    they/them/their/theirs/themselves, fixes "I am/was" -> "they are/were", and
    lower-cases the first letter (so the statement can follow "because"). Only whole
    words change: "mystery", "Iowa", "dummy" stay; "US" (all capitals) is the country.
    """
    s = _strip(statement)
    s = _BE_AFTER_I.sub(_be_after, s)
    s = _BE_BEFORE_I.sub(_be_before, s)
    s = _PRONOUN.sub(_pronoun, s)
    return _lower_first(s)


# Words after "the product" that show it is the subject of a verb ("the product is",
# "the product really", "the product doesn't"), as opposed to a noun compound
# ("the product description is").
_VERBISH = frozenset((
    "is was are were has had have does did do can could will would should may might must "
    "shall seems seemed looks looked feels felt fits fit works worked sounds sounded "
    "comes came arrived broke stopped lasted holds held keeps kept makes made provides "
    "provided runs ran performs performed lacks lacked needs needed gets got stays stayed "
    "offers offered delivers delivered smells tastes cannot really also just never always "
    "definitely still only actually even easily quickly barely simply certainly clearly "
    "truly not itself").split())
_SUBJECT = re.compile(r"(?:the|this)\s+(?:product|item)(['’]s)?(?![\w'’])", re.I)
_IT = re.compile(r"it(?:s|['’]s)?(?![\w'’])", re.I)


def _verb_like(rest: str) -> bool:
    words = re.findall(r"[\w'’]+", rest.lower())
    if not words:
        return False
    first = words[0]
    if first in _VERBISH or first.endswith(("n't", "n’t")):
        return True
    # "the product fits well" / "arrived broken", but not "the product features are"
    if first.endswith(("s", "ed")):
        return len(words) == 1 or words[1] not in _VERBISH
    return False


def subject_pronoun(statement: str) -> str:
    """Refer to the product as "it", as seed 000 does ("because it is very comfortable").

    "the/this product (or item) ..." becomes "it ...", "the product's" becomes "its",
    and a leading "It" is lower-cased. Other subjects ("the strings", "they") are kept:
    without a parser we cannot tell whether they mean the product.
    """
    m = _SUBJECT.match(statement)
    if m:
        rest = statement[m.end():]
        if m.group(1):
            return "its" + rest
        return "it" + rest if _verb_like(rest) else statement
    m = _IT.match(statement)
    if m:
        return statement[0].lower() + statement[1:]
    return statement


def clause(statement: str) -> str:
    """A statement as it appears in the paragraph (one line, third person, "it")."""
    return subject_pronoun(point_of_view(_SPACES.sub(" ", statement)))


# -- one review ---------------------------------------------------------------------


def join_clauses(clauses: list[str]) -> str:
    """"a", "a and b", "a, b and c" (no Oxford comma, as in seed 000's examples)."""
    clauses = list(clauses)
    if len(clauses) <= 1:
        return "".join(clauses)
    return ", ".join(clauses[:-1]) + " and " + clauses[-1]


def polarity(label) -> str:
    """A sentiment label, matched case-insensitively; anything else is a ValueError."""
    norm = label.strip().lower() if isinstance(label, str) else None
    if norm not in POLARITIES:
        raise ValueError(f"unknown sentiment label {label!r} "
                         f"(expected {', '.join(POLARITIES[:-1])} or {POLARITIES[-1]})")
    return norm


def _compose(groups: dict[str, list[str]]) -> str:
    sentences = []
    for pol in POLARITIES:
        if groups.get(pol):
            opener = OPENERS[pol][0 if not sentences else 1]
            sentences.append(opener + join_clauses(groups[pol]) + ".")
    return " ".join(sentences)


def build_explanation(triplets: list[dict]) -> str:
    """The ground-truth paragraph for one review's triplets (statement, sentiment, ...).

    Statements are deduplicated (ignoring case, spaces and punctuation; the first one
    is kept, in order) and grouped positive, negative, neutral; a statement with
    nothing left after cleaning is skipped. No statements -> "".
    """
    groups: dict[str, list[str]] = {}
    seen: set[str] = set()
    for t in triplets:
        pol = polarity(t.get("sentiment"))
        c = clause(t["statement"])
        key = dedup_key(c)
        if not key or key in seen:
            continue
        seen.add(key)
        groups.setdefault(pol, []).append(c)
    return _compose(groups)


def statement_sentence(statement: str, sentiment: str) -> str:
    """One statement in the ground-truth pattern, for the statement-level metrics."""
    pol = polarity(sentiment)
    c = clause(statement)
    if not dedup_key(c):
        raise ValueError(f"statement {statement!r} has no words")
    return OPENERS[pol][0] + c + "."


# -- whole tables -------------------------------------------------------------------


def ground_truth_tables(statements: pa.Table) -> tuple[pa.Table, pa.Table]:
    """EXPLANATIONS (one row per review) and SENTENCES (one per kept statement).

    Same rules as `build_explanation`; a row with a missing or unknown sentiment raises
    ValueError naming the label and the review (`ground_truth_shard` records it instead).
    """
    explanations, sentences, errors = ground_truth_shard(statements)
    bad = errors.filter(pc.equal(errors.column("field"), "sentiment"))
    if bad.num_rows:
        raise ValueError(bad.column("message")[0].as_py())
    return explanations, sentences


def ground_truth_shard(statements: pa.Table, source: str | None = None
                       ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """`ground_truth_tables`, recording bad rows in an ERRORS table instead of raising.

    A statement with a missing or unknown sentiment, or with no words, becomes an error
    row and is left out; the review's other statements are kept. A review left without
    statements gets no explanation. Duplicates within a review are dropped silently
    (they are counted by the caller as statements - sentences - errors).
    Vectorised: each distinct statement string is rewritten once; grouping, ordering
    and string assembly run in Arrow/NumPy.
    """
    t = validate_table(statements, "statements", source=source or "<memory>")
    n = t.num_rows
    # Rewrite each distinct statement once.
    enc = pc.dictionary_encode(t.column("statement").combine_chunks())
    clauses_u = [clause(s) for s in enc.dictionary.to_pylist()]
    dedup_u = [dedup_key(c) for c in clauses_u]
    keys_u = pd.factorize(pd.Series(dedup_u, dtype=object))[0]
    empty_u = np.array([not k for k in dedup_u], dtype=bool)
    sidx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    labels = pc.utf8_lower(pc.utf8_trim_whitespace(t.column("sentiment")))
    pol = pc.fill_null(pc.index_in(labels, value_set=pa.array(POLARITIES)), -1)
    pol = pol.to_numpy().astype(np.int64)

    bad_label = pol < 0
    no_words = ~bad_label & empty_u[sidx]
    errors = _errors(t, bad_label, no_words, source)
    ok = ~(bad_label | no_words)

    # Order by review, then input order; drop duplicates within a review (first kept).
    rid = t.column("review_id")
    order = pc.sort_indices(pa.table({"r": rid, "i": pa.array(np.arange(n))}),
                            sort_keys=[("r", "ascending"), ("i", "ascending")]).to_numpy()
    order = order[ok[order]]
    rcode = pd.factorize(rid.take(pa.array(order)).to_numpy())[0]  # ascending with order
    dup = pd.DataFrame({"r": rcode, "k": keys_u[sidx[order]]}).duplicated().to_numpy()
    order, rcode = order[~dup], rcode[~dup]
    pol_o = pol[order]
    clause_o = pa.array(clauses_u, pa.string()).take(pa.array(sidx[order]))
    take = pa.array(order)

    openers_first = pa.array([OPENERS[p][0] for p in POLARITIES], pa.string())
    sentences = pa.table({
        "statement_id": t.column("statement_id").take(take),
        "review_id": rid.take(take),
        "sentence": pc.binary_join_element_wise(
            openers_first.take(pa.array(pol_o)), clause_o, ".", ""),
        "topic": t.column("topic").take(take),
        "sentiment": pa.array(POLARITIES, pa.string()).take(pa.array(pol_o)),
    })
    explanations = _paragraphs(t, order, rcode, pol_o, clause_o)
    return (validate_table(explanations, "explanations"), validate_table(sentences, "sentences"),
            errors)


def _paragraphs(t: pa.Table, order: np.ndarray, rcode: np.ndarray, pol_o: np.ndarray,
                clause_o: pa.Array) -> pa.Table:
    """Assemble one paragraph per review from rows ordered by (review, input order)."""
    m = len(order)
    # Sentences follow polarity order: re-sort stably by (review, polarity).
    by_pol = np.lexsort((np.arange(m), pol_o, rcode))
    r, p = rcode[by_pol], pol_o[by_pol]
    new_review = np.ones(m, bool)
    new_review[1:] = r[1:] != r[:-1]
    new_group = new_review.copy()
    new_group[1:] |= p[1:] != p[:-1]
    last_in_group = np.ones(m, bool)
    last_in_group[:-1] = new_group[1:]
    # Text before each clause: an opener at a group's start (" "-separated from the
    # previous sentence), else ", " or " and " before the group's last clause.
    leads = [OPENERS[q][0] for q in POLARITIES] + [" " + OPENERS[q][1] for q in POLARITIES] + [", ", " and "]
    lead = np.where(new_group, np.where(new_review, p, len(POLARITIES) + p),
                    np.where(last_in_group, 2 * len(POLARITIES) + 1, 2 * len(POLARITIES)))
    pieces = pc.binary_join_element_wise(
        pa.array(leads, pa.string()).take(pa.array(lead)),
        clause_o.take(pa.array(by_pol)),
        pa.array(["", "."], pa.string()).take(pa.array(last_in_group.astype(np.int64))), "")
    starts = np.flatnonzero(new_review)
    offsets = pa.array(np.append(starts, m).astype(np.int32))
    text = pc.binary_join(pa.ListArray.from_arrays(offsets, pieces), "")
    first = pa.array(order[by_pol][starts])
    return pa.table({
        "example_id": t.column("review_id").take(first),
        "system": pa.array([SYSTEM] * len(starts), pa.string()),
        "user_id": t.column("user_id").take(first),
        "item_id": t.column("item_id").take(first),
        "explanation": text,
        "reference": pa.nulls(len(starts), pa.string()),
    })


def _errors(t: pa.Table, bad_label: np.ndarray, no_words: np.ndarray, source: str | None) -> pa.Table:
    rows = []
    for i in np.flatnonzero(bad_label | no_words):
        row = {k: t.column(k)[int(i)].as_py()
               for k in ("statement_id", "review_id", "statement", "topic", "sentiment")}
        if bad_label[i]:
            label = row["sentiment"]
            what = "missing sentiment label" if label is None else f"unknown sentiment label {label!r}"
            etype, field = ("missing_sentiment" if label is None else "unknown_sentiment"), "sentiment"
            message = (f"review {row['review_id']}: {what} for statement {row['statement_id']} "
                       f"(expected {', '.join(POLARITIES[:-1])} or {POLARITIES[-1]})")
        else:
            etype, field = "empty_statement", "statement"
            message = (f"review {row['review_id']}: statement {row['statement_id']} has no words "
                       "left after removing quotes and punctuation")
        rows.append({"source": source, "row_id": row["statement_id"], "field": field,
                     "error_type": etype, "message": message,
                     "raw": json.dumps(row, ensure_ascii=False, sort_keys=True)})
    return error_rows(STAGE, rows)
