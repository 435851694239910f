"""QuestEval-F1: QuestEval's question generation and answering, with answers scored by
token F1 only (Scialom et al., 2021; seed 000, section IV.A.3, Table V).

Why the name: the published QuestEval score averages three terms per question (token
F1, BERTScore of the answers, and answerability); this variant keeps the first. Scores of
a simplified variant must not be reported as "QuestEval", so every output, table and
option calls this metric `questeval_f1` ("QuestEval-F1"). The published scoring is
`metrics.questeval_published` (metric `questeval`); it shares this module's answer
selection, question generation and question answering (`ask_questions`,
`SpacyAnswerSelector`, and the T5 models of `models.encoders.seq2seq`). The differences
are listed under "Where we differ" below.

Our reading of the method, for one generated explanation h and its reference r:

1. Answer selection. In each text, candidate answers are its named entities and noun
   chunks (spaCy `en_core_web_sm`), entities first, deduplicated (exact text, first
   occurrence kept). As in the public implementation, answers are taken from the first
   `limit_sent` sentences only (default 5; None: the whole text), sentences being cut
   after ".", "!" or "?" when a non-punctuation token follows.
2. Question generation. A T5 question-generation model writes one question for each
   (answer, text) with greedy decoding.
3. Question answering. A T5 question-answering model answers each question on the
   *other* text, greedily. An answer equal to the "unanswerable" marker (the model was
   trained on SQuAD 2.0-style negatives) scores 0; otherwise the score is the token F1
   between the predicted answer and the answer the question was written for, under
   SQuAD normalisation (lower case; punctuation and the articles a/an/the removed;
   whitespace collapsed; F1 = 1 when both sides normalise to nothing, 0 when only one
   does).
4. Aggregation. precision (questeval_f1_p) = mean score of the questions generated from h
   and answered on r (is what the explanation says supported by the reference?);
   recall (questeval_f1_r) = mean score of the questions generated from r and answered on h
   (does the explanation cover the reference?); questeval_f1 = 2PR / (P + R), the harmonic
   mean the seed describes, 0 when P = R = 0.

A side without questions (an empty text, or one where spaCy finds no entity and no noun
chunk) has no mean: with `no_questions="nan"` (default) its P or R is NaN, and so is
questeval_f1 (NaN values are counted apart by `metrics.aggregate`, never averaged as 0).
`no_questions="zero"` follows the public implementation instead, where a direction
without questions scores 0. A question asked on an empty text scores 0 without running
the QA model (as in the public implementation).

Where we differ from the public implementation (QuestEval 0.2.x), on purpose:
- it averages, per question, three scores: token F1, BERTScore of the answers, and
  "answerability" (1 - the QA model's probability of "unanswerable" at the first decoding
  step); we keep only token F1, with "unanswerable" answers at 0;
- it combines precision and recall with an arithmetic mean; the seed reports the
  harmonic mean, which is what `questeval_f1` holds here;
- it does not deduplicate answers across entities and noun chunks; we do;
- it generates at most what the checkpoints' own settings allow (19 tokens under
  transformers' default length); we allow `max_new_tokens` (32);
- its optional question weighter and round-trip consistency filter are not implemented.

Model input formats (options, defaults matching the public T5 checkpoints
ThomasNLG/t5-qg_squad1-en and ThomasNLG/t5-qa_squad2neg-en as the public QuestEval code
calls them; we have not run those checkpoints here, so check the defaults if you use
other ones):
- question generation: `qg_template = "sv1 </s> {answer} </s> {context}"` (the "sv1"
  prefix marks the SQuAD-trained mode of that generator);
- question answering: `qa_template = "{question} </s> {context}"`;
- the QA model's no-answer output: `unanswerable = "unanswerable"`.
"</s>" is T5's end-of-sequence token, read as that special token by its tokenizer.
Inputs are truncated to `max_source_length` tokens (512, as public), which cuts the end
of the context; at most `max_new_tokens` (32) tokens are generated. Both models run
greedy (one beam, no sampling) and are deterministic.

Batching: every distinct text is analysed by spaCy once, every distinct (answer, text)
gets one question and every distinct (question, text) one answer, across the whole call;
model inputs are sorted by length and run in batches of `batch_size`. This module is the
maths; the models live in `models/`: the T5s (`Seq2SeqGenerator`) are loaded once per
(location, device) and kept by `models.encoders.seq2seq` (`get_seq2seq_generator`), the
spaCy pipelines once per name by `models.spacy_pipelines` (`load_spacy`).

Injectable parts (tests, or other models): `questeval_from_components` takes three
callables instead of model locations: `select_answers(texts) -> [answers per text]`,
`generate_questions([(answer, context)]) -> [question]` and
`answer_questions([(question, context)]) -> [answer]`. `ask_questions` is the shared
pass that calls them.

Registered names (per example, higher is better): "questeval_f1", "questeval_f1_p",
"questeval_f1_r". `questeval_f1_scores` computes all three at once.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rexeval.metrics.registry import register_metric
from rexeval.metrics.similarity import _check_pairs
from rexeval.models.encoders.seq2seq import get_seq2seq_generator
from rexeval.models.spacy_pipelines import load_spacy

QUESTEVAL_F1_KEYS = ("questeval_f1", "questeval_f1_p", "questeval_f1_r")
QG_TEMPLATE = "sv1 </s> {answer} </s> {context}"
QA_TEMPLATE = "{question} </s> {context}"
UNANSWERABLE = "unanswerable"
NO_QUESTIONS = ("nan", "zero")
_TEXT_INPUTS = ("generated_explanations", "reference_explanations")

SelectAnswers = Callable[[list[str]], list[list[str]]]
GenerateQuestions = Callable[[list[tuple[str, str]]], list[str]]
AnswerQuestions = Callable[[list[tuple[str, str]]], list[str]]


# ------------------------------------------------------------------ answer comparison

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation, drop a/an/the, collapse spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of two answers after `normalize_answer` (SQuAD): 1 when both are
    empty after normalisation, 0 when only one is."""
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def answer_score(prediction: str, gold: str, unanswerable: str = UNANSWERABLE) -> float:
    """0 for the QA model's no-answer output, else `token_f1(prediction, gold)`."""
    if normalize_answer(prediction) == normalize_answer(unanswerable):
        return 0.0
    return token_f1(prediction, gold)


def harmonic_f1(precision: np.ndarray, recall: np.ndarray) -> np.ndarray:
    """2PR / (P + R) elementwise; 0 where P + R == 0; NaN where either is NaN."""
    p = np.asarray(precision, dtype=np.float64)
    r = np.asarray(recall, dtype=np.float64)
    total = p + r
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(total > 0, 2 * p * r / np.where(total > 0, total, 1.0), 0.0)
    return np.where(np.isnan(p) | np.isnan(r), np.nan, f)


# ------------------------------------------------------------------- the metric core

def _dedupe_answers(answers: Sequence[str]) -> list[str]:
    seen: dict[str, None] = {}
    for a in answers:
        a = a.strip()
        if a and a not in seen:
            seen[a] = None
    return list(seen)


def _call_checked(fn: Callable, inputs: list, what: str) -> list:
    if not inputs:
        return []
    out = list(fn(inputs))
    if len(out) != len(inputs):
        raise ValueError(f"{what} returned {len(out)} results for {len(inputs)} inputs")
    return out


@dataclass(frozen=True)
class AskedQuestions:
    """What the QG / QA pass of one call produced: each distinct non-empty text's answers
    (as `select_answers` gave them, deduplicated or not), one question per distinct
    (answer, text), and one QA output per distinct (question, other text)."""

    answers: dict[str, list[str]]
    questions: dict[tuple[str, str], str]
    predicted: dict[tuple[str, str], Any]

    def asked(self, source: str, target: str) -> list[tuple[str, str]]:
        """(gold answer, question) pairs of `source`, to be answered on `target`, one per
        answer of `source` (so duplicated answers are asked twice)."""
        return [(a, self.questions[(a, source)]) for a in self.answers.get(source, [])]


def ask_questions(cands: list[str], refs: list[str], *, select_answers: SelectAnswers,
                  generate_questions: GenerateQuestions, answer_questions: Callable,
                  dedupe_answers: bool = True) -> AskedQuestions:
    """Answer selection, QG and QA for every pair, both ways, each in one call.

    Answers are selected in every distinct non-empty text (`dedupe_answers`: stripped,
    empty ones dropped, repeats dropped, first kept; else kept exactly as given); a
    question is generated once per distinct (answer, text); each question of one side is
    answered on the other side, once per distinct (question, text), never on an empty text.
    `answer_questions` may return any value per input (QuestEval-F1: the answer;
    published QuestEval: (answer, answerability)).
    """
    # 1. answers of every distinct non-empty text
    texts = list(dict.fromkeys(t for t in (*cands, *refs) if t.strip()))
    found = _call_checked(select_answers, texts, "select_answers")
    answers = {t: _dedupe_answers(a) if dedupe_answers else list(a) for t, a in zip(texts, found)}

    # 2. one question per distinct (answer, text)
    qg_inputs = list(dict.fromkeys((a, t) for t in texts for a in answers[t]))
    questions = dict(zip(qg_inputs, _call_checked(generate_questions, qg_inputs,
                                                   "generate_questions")))
    unanswered = AskedQuestions(answers, questions, {})

    # 3. one answer per distinct (question, other text)
    directions = [(c, r) for c, r in zip(cands, refs)] + [(r, c) for c, r in zip(cands, refs)]
    qa_inputs = list(dict.fromkeys(
        (q, target) for source, target in directions if target.strip()
        for _, q in unanswered.asked(source, target)))
    predicted = dict(zip(qa_inputs, _call_checked(answer_questions, qa_inputs, "answer_questions")))
    return AskedQuestions(answers, questions, predicted)


def questeval_from_components(candidates: Sequence[str], references: Sequence[str], *,
                              select_answers: SelectAnswers,
                              generate_questions: GenerateQuestions,
                              answer_questions: AnswerQuestions,
                              unanswerable: str = UNANSWERABLE,
                              no_questions: str = "nan") -> dict[str, np.ndarray]:
    """QuestEval-F1 P / R / harmonic mean per pair with injected answer selection, QG and QA.

    Each callable gets a list and returns a list of the same length: `select_answers`
    the distinct non-empty texts (-> their candidate answers), `generate_questions`
    distinct (answer, context) pairs (-> one question each), `answer_questions` distinct
    (question, context) pairs (-> one answer each). Returns float64 arrays under
    "questeval_f1", "questeval_f1_p", "questeval_f1_r" (see the module docstring).
    """
    cands, refs = _check_pairs(candidates, references)
    if no_questions not in NO_QUESTIONS:
        raise ValueError(f"no_questions must be one of {NO_QUESTIONS}, got {no_questions!r}")
    n = len(cands)
    asked = ask_questions(cands, refs, select_answers=select_answers,
                          generate_questions=generate_questions,
                          answer_questions=answer_questions)

    # 4. per-direction means
    empty = np.nan if no_questions == "nan" else 0.0

    def mean_score(source: str, target: str) -> float:
        pairs = asked.asked(source, target)
        if not pairs:
            return empty
        if not target.strip():
            return 0.0
        return float(np.mean([answer_score(asked.predicted[(q, target)], gold, unanswerable)
                              for gold, q in pairs]))

    precision = np.array([mean_score(c, r) for c, r in zip(cands, refs)], dtype=np.float64)
    recall = np.array([mean_score(r, c) for c, r in zip(cands, refs)], dtype=np.float64)
    if n == 0:
        precision = recall = np.zeros(0, dtype=np.float64)
    return {"questeval_f1": harmonic_f1(precision, recall), "questeval_f1_p": precision,
            "questeval_f1_r": recall}


# -------------------------------------------------------------------- spaCy answers

def _sentence_starts(doc) -> list[int]:
    """Token index where each sentence starts: a sentence ends after ".", "!" or "?" once
    a non-punctuation token follows (the public implementation's rule)."""
    starts = [0]
    ended = False
    for token in doc:
        if ended and not token.is_punct:
            starts.append(token.i)
            ended = False
        elif token.text in (".", "!", "?"):
            ended = True
    return starts


def leading_sentences(doc, limit: int | None) -> str:
    """The text of the first `limit` sentences of a spaCy doc, a sentence ending after
    ".", "!" or "?" once a non-punctuation token follows (None: the whole text)."""
    if limit is None:
        return doc.text
    starts = _sentence_starts(doc)
    if len(starts) <= limit:
        return doc.text
    return doc[0:starts[limit]].text


def sentence_texts(doc) -> list[str]:
    """Each sentence's text (cut as `leading_sentences` cuts), without the whitespace
    that follows it; none for an empty doc."""
    if not len(doc):
        return []
    starts = _sentence_starts(doc)
    return [doc[a:b].text for a, b in zip(starts, [*starts[1:], len(doc)])]


class SpacyAnswerSelector:
    """`select_answers` from a spaCy pipeline: entities, then noun chunks, of the first
    `limit_sent` sentences (deduplicated, or not, by the caller).

    The first sentences are the original text up to the cut (`join_sentences=False`,
    QuestEval-F1) or, as the published QuestEval does, the sentence texts joined by one
    space, which is also re-parsed when the text has no more than `limit_sent` sentences
    (`join_sentences=True`); the two differ only where sentences are separated by other
    whitespace than one space."""

    def __init__(self, nlp, limit_sent: int | None = 5, *, join_sentences: bool = False):
        if limit_sent is not None and int(limit_sent) < 1:
            raise ValueError(f"limit_sent must be >= 1 or None, got {limit_sent}")
        self.nlp = nlp
        self.limit_sent = None if limit_sent is None else int(limit_sent)
        self.join_sentences = bool(join_sentences)

    def _first_sentences(self, doc) -> str:
        if self.join_sentences:
            return " ".join(sentence_texts(doc)[:self.limit_sent])
        return leading_sentences(doc, self.limit_sent)

    def __call__(self, texts: list[str]) -> list[list[str]]:
        docs = list(self.nlp.pipe(texts))
        if self.limit_sent is not None:
            cut = [self._first_sentences(d) for d in docs]
            redo = [i for i, (d, c) in enumerate(zip(docs, cut)) if c != d.text]
            for i, doc in zip(redo, self.nlp.pipe([cut[i] for i in redo])):
                docs[i] = doc
        return [[e.text for e in d.ents] + [c.text for c in d.noun_chunks] for d in docs]


def check_seq2seq_options(batch_size: int, qg_template: str, qa_template: str) -> None:
    """ValueError for a batch size below 1 or a template without its fields."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for name, template, fields in (("qg_template", qg_template, ("{answer}", "{context}")),
                                   ("qa_template", qa_template, ("{question}", "{context}"))):
        missing = [f for f in fields if f not in template]
        if missing:
            raise ValueError(f"{name} must contain {missing}: {template!r}")


def model_question_generator(qg_location: str, device: str, qg_template: str,
                             **options) -> GenerateQuestions:
    """`generate_questions` from the T5 at `qg_location` (loaded on first call);
    `options` go to `models.encoders.seq2seq.Seq2SeqGenerator.generate`."""
    def generate_questions(pairs: list[tuple[str, str]]) -> list[str]:
        model = get_seq2seq_generator(qg_location, device)
        return model.generate([qg_template.format(answer=a, context=c) for a, c in pairs],
                              **options)

    return generate_questions


def questeval_f1_scores(candidates: Sequence[str], references: Sequence[str], qg_location: str,
                     qa_location: str, *, spacy_model: str = "en_core_web_sm",
                     device: str = "cpu", batch_size: int = 16,
                     qg_template: str = QG_TEMPLATE, qa_template: str = QA_TEMPLATE,
                     unanswerable: str = UNANSWERABLE, limit_sent: int | None = 5,
                     max_source_length: int = 512, max_new_tokens: int = 32,
                     no_questions: str = "nan",
                     select_answers: SelectAnswers | None = None) -> dict[str, np.ndarray]:
    """QuestEval-F1 of each generated explanation against its reference with T5 QG / QA
    models from `qg_location` / `qa_location`: float64 arrays under "questeval_f1" (harmonic
    mean of P and R), "questeval_f1_p" and "questeval_f1_r". See the module docstring for the
    method, the options and what differs from the public implementation.
    `select_answers` replaces the spaCy answer selection when given.
    """
    cands, refs = _check_pairs(candidates, references)
    check_seq2seq_options(batch_size, qg_template, qa_template)
    options = dict(batch_size=int(batch_size), max_source_length=max_source_length,
                   max_new_tokens=max_new_tokens)
    if select_answers is None:
        select_answers = SpacyAnswerSelector(load_spacy(spacy_model), limit_sent)

    def answer_questions(pairs: list[tuple[str, str]]) -> list[str]:
        model = get_seq2seq_generator(qa_location, device)
        return model.generate([qa_template.format(question=q, context=c) for q, c in pairs],
                              **options)

    return questeval_from_components(
        cands, refs, select_answers=select_answers,
        generate_questions=model_question_generator(qg_location, device, qg_template, **options),
        answer_questions=answer_questions, unanswerable=unanswerable, no_questions=no_questions)


@register_metric(
    "questeval_f1",
    group="questeval_f1",
    inputs=_TEXT_INPUTS,
    description="QuestEval-F1 (QuestEval with token-F1 answer scoring only, not the "
                "published score): harmonic mean of QG/QA precision (explanation's questions "
                "answered on the reference) and recall (reference's questions answered "
                "on the explanation), token-F1 answer matching",
)
def questeval_f1(candidates: Sequence[str], references: Sequence[str], qg_location: str,
              qa_location: str, **kw) -> np.ndarray:
    """QuestEval-F1 (harmonic mean) per interaction (see `questeval_f1_scores`)."""
    return questeval_f1_scores(candidates, references, qg_location, qa_location, **kw)["questeval_f1"]


@register_metric(
    "questeval_f1_p",
    group="questeval_f1",
    inputs=_TEXT_INPUTS,
    description="QuestEval-F1 precision: questions generated from the explanation, answered "
                "on the reference (factual consistency)",
)
def questeval_f1_precision(candidates: Sequence[str], references: Sequence[str], qg_location: str,
                        qa_location: str, **kw) -> np.ndarray:
    """QuestEval-F1 precision per interaction (see `questeval_f1_scores`)."""
    return questeval_f1_scores(candidates, references, qg_location, qa_location,
                            **kw)["questeval_f1_p"]


@register_metric(
    "questeval_f1_r",
    group="questeval_f1",
    inputs=_TEXT_INPUTS,
    description="QuestEval-F1 recall: questions generated from the reference, answered on "
                "the explanation (relevance / coverage)",
)
def questeval_f1_recall(candidates: Sequence[str], references: Sequence[str], qg_location: str,
                     qa_location: str, **kw) -> np.ndarray:
    """QuestEval-F1 recall per interaction (see `questeval_f1_scores`)."""
    return questeval_f1_scores(candidates, references, qg_location, qa_location,
                            **kw)["questeval_f1_r"]
