"""QuestEval as published (Scialom et al., 2021; QuestEval 0.2.x, text-to-text with a
reference): metric `questeval`, the score seed 000's Table V names "QuestEval".

It shares answer selection, question generation and question answering with the token-F1
variant QuestEval-F1 (`metrics.questeval`: `ask_questions`, `SpacyAnswerSelector`, and
the same models); only the answers kept and the scoring differ. This module is the maths;
the models are in `models/` (the T5s, `Seq2SeqGenerator`, in `models.encoders.seq2seq`;
spaCy in `models.spacy_pipelines`; the answer BERTScore's encoder in
`models.encoders.bertscore_model`). Our reading of the public code, for one generated
explanation h and its reference r:

1. Answers. In each text, its named entities and then its noun chunks (spaCy), taken from
   the first `limit_sent` sentences (default 5) joined by one space, with the sentence
   rule of `metrics.questeval`. Answers are NOT deduplicated: an answer found twice (as an
   entity and as a noun chunk, or twice in the text) is asked about twice and counts twice.
2. Questions. One per (answer, text), by the T5 question generator, greedy.
3. Answers to the other side's questions, by the T5 question answerer, greedy. From the
   same generate call comes the answerability: 1 - the softmax probability of one token
   at the first decoding step (the answerer was trained to say "unanswerable" when the
   text does not hold the answer).
4. Per question asked on a text, three values: answerability; token F1 (SQuAD
   normalisation, `metrics.questeval.token_f1`) of the predicted against the gold answer
   (the answer the question was written for); BERTScore F1 of the predicted against the
   gold answer. Each is clipped to [0, 1].
5. A direction's score is the mean of all those values together: the answerabilities,
   BERTScores and F1s of all its questions in one list (so, with n questions, the mean of
   3n values, i.e. the mean of the three per-kind means). A direction without questions
   (no entity, no noun chunk on the questioning side) scores 0.
6. questeval = the arithmetic mean of the two directions (h questioned with r's
   questions, r questioned with h's). An example with an empty text on either side scores
   0, with no model run for it.

No precision / recall is reported: the public code has none (the two directions are only
averaged). P/R and the harmonic mean the seed's text describes are QuestEval-F1's.

Where we differ from the public code, and why:
- The answerability token. The public code hard-codes token id 73, which its comment calls
  the "unanswerable" token of T5's vocabulary ("unanswerable" is several SentencePiece
  pieces in T5, so the id can only be that of its first piece). We derive it from the QA
  tokenizer as the first token of `unanswerable` (default "unanswerable"), so that other
  checkpoints and vocabularies work; `unanswerable_token_id=73` pins the public id (we
  had no T5 vocabulary offline to check that both agree).
- BERTScore. The public code calls Hugging Face's `bertscore` metric with
  bert-base-multilingual-cased and that metric's defaults (bert-score's default layer,
  9 for that model; no idf; no baseline rescaling). We call `metrics.similarity.bertscore`
  (the same `bert-score` package, the same conventions: an empty answer scores 0) with the
  checkpoint of the profile role `questeval_bertscore` and `bertscore_num_layers` (None:
  bert-score's default layer for the checkpoint's name, see `questeval_bertscore_layers`).
- A text of only whitespace counts as empty here (the public code treats only "" so).
- Decoding. As public: greedy, inputs truncated to 512 tokens, at most as many tokens as
  the checkpoint's own length setting allows (`max_new_tokens=None`: transformers'
  default of 20 positions, start token included, i.e. 19 tokens), decoded with the
  tokenizer's space clean-up. The checkpoint's other generation settings are not read;
  inputs are padded per batch rather than to 512 (masked, so equal up to float rounding),
  and the tokenizer is the one `AutoTokenizer` loads (the fast T5 tokenizer) rather than
  the SentencePiece one.
- Not implemented: the public code's on-disk cache of per-text results, its question
  weighter and round-trip consistency options (off by default there), several
  references per example (max over them there), and its source-based and data-to-text
  modes.

Injectable parts (tests, other models): `questeval_published_from_components` takes four
callables: `select_answers(texts) -> [answers per text]`,
`generate_questions([(answer, context)]) -> [question]`,
`answer_questions([(question, context)]) -> [(answer, answerability)]` and
`answer_similarity([(predicted, gold)]) -> [BERTScore F1]`.

Registered name (per example, higher is better): "questeval".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rexeval.metrics.questeval import (
    QA_TEMPLATE,
    QG_TEMPLATE,
    UNANSWERABLE,
    GenerateQuestions,
    SelectAnswers,
    SpacyAnswerSelector,
    _call_checked,
    ask_questions,
    check_seq2seq_options,
    model_question_generator,
    token_f1,
)
from rexeval.metrics.registry import register_metric
from rexeval.metrics.similarity import _check_pairs, bertscore
from rexeval.models.encoders.bertscore_model import default_num_layers
from rexeval.models.encoders.seq2seq import get_seq2seq_generator
from rexeval.models.spacy_pipelines import load_spacy

_TEXT_INPUTS = ("generated_explanations", "reference_explanations")
PUBLISHED_BERTSCORE_MODEL = "bert-base-multilingual-cased"

ScoredAnswers = Callable[[list[tuple[str, str]]], list[tuple[str, float]]]
AnswerSimilarity = Callable[[list[tuple[str, str]]], Sequence[float]]


def questeval_published_from_components(candidates: Sequence[str], references: Sequence[str], *,
                                        select_answers: SelectAnswers,
                                        generate_questions: GenerateQuestions,
                                        answer_questions: ScoredAnswers,
                                        answer_similarity: AnswerSimilarity) -> np.ndarray:
    """The published QuestEval score per pair with injected components (float64 array).

    Each callable gets a list of distinct inputs and returns one result per input:
    `select_answers` texts (-> their answers, kept as given, duplicates included),
    `generate_questions` (answer, context) pairs (-> a question), `answer_questions`
    (question, context) pairs (-> (answer, answerability)), `answer_similarity`
    (predicted, gold) answer pairs (-> BERTScore F1). See the module docstring.
    """
    cands, refs = _check_pairs(candidates, references)
    both = [i for i, (c, r) in enumerate(zip(cands, refs)) if c.strip() and r.strip()]
    asked = ask_questions([cands[i] for i in both], [refs[i] for i in both],
                          select_answers=select_answers, generate_questions=generate_questions,
                          answer_questions=answer_questions, dedupe_answers=False)
    for key, got in asked.predicted.items():
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise TypeError(f"answer_questions must return (answer, answerability) pairs; got "
                            f"{got!r} for {key!r}")

    def rows(source: str, target: str) -> list[tuple[str, str, float]]:
        """(gold, predicted, answerability) per question of `source` asked on `target`."""
        out = []
        for gold, question in asked.asked(source, target):
            predicted, answerability = asked.predicted[(question, target)]
            out.append((gold, predicted, float(answerability)))
        return out

    directions = [d for i in both for d in ((refs[i], cands[i]), (cands[i], refs[i]))]
    sim_inputs = list(dict.fromkeys((pred, gold) for source, target in directions
                                    for gold, pred, _ in rows(source, target)))
    sims = _call_checked(answer_similarity, sim_inputs, "answer_similarity")
    similarity = dict(zip(sim_inputs, np.asarray(sims, dtype=np.float64)))

    def direction_score(source: str, target: str) -> float:
        got = rows(source, target)
        if not got:
            return 0.0
        values = ([a for _, _, a in got] + [similarity[(p, g)] for g, p, _ in got]
                  + [token_f1(p, g) for g, p, _ in got])
        return float(np.mean(np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)))

    scores = np.zeros(len(cands), dtype=np.float64)
    for i in both:
        scores[i] = (direction_score(refs[i], cands[i]) + direction_score(cands[i], refs[i])) / 2
    return scores


def questeval_bertscore_layers(*names: str | None) -> int:
    """bert-score's default layer for the first of `names` (model references or
    locations) it knows, e.g. 9 for bert-base-multilingual-cased, the public choice."""
    for name in names:
        if name:
            try:
                return default_num_layers(str(name))
            except ValueError:
                continue
    raise ValueError(
        f"QuestEval's answer BERTScore needs a layer: bert-score has no default one for "
        f"{[n for n in names if n]}; pass bertscore_num_layers=, or keep the checkpoint in a "
        f"folder named after the model it is (bert-score knows layers by name; the published "
        f"score uses layer 9 of {PUBLISHED_BERTSCORE_MODEL})")


@register_metric(
    "questeval",
    group="questeval",
    inputs=_TEXT_INPUTS,
    description="QuestEval, the published scoring: per question generated on one side and "
                "answered on the other, answerability, token F1 and BERTScore of the answers, "
                "averaged per direction; the mean of the two directions",
)
def questeval(candidates: Sequence[str], references: Sequence[str], qg_location: str,
              qa_location: str, bertscore_location: str, *,
              bertscore_num_layers: int | None = None, spacy_model: str = "en_core_web_sm",
              device: str = "cpu", batch_size: int = 16, bertscore_batch_size: int = 64,
              qg_template: str = QG_TEMPLATE, qa_template: str = QA_TEMPLATE,
              unanswerable: str = UNANSWERABLE, unanswerable_token_id: int | None = None,
              limit_sent: int | None = 5, max_source_length: int = 512,
              max_new_tokens: int | None = None,
              select_answers: SelectAnswers | None = None) -> np.ndarray:
    """The published QuestEval score of each generated explanation against its reference,
    with T5 QG / QA models from `qg_location` / `qa_location` and the BERTScore encoder at
    `bertscore_location` (layer `bertscore_num_layers`, None: bert-score's default for its
    name). `unanswerable_token_id` (None: the first token of `unanswerable`) is the token
    whose first-step probability answerability reads; `max_new_tokens` None: the
    checkpoints' own length limit. `select_answers` replaces the spaCy answer selection.
    See the module docstring."""
    cands, refs = _check_pairs(candidates, references)
    check_seq2seq_options(batch_size, qg_template, qa_template)
    if int(bertscore_batch_size) < 1:
        raise ValueError(f"bertscore_batch_size must be >= 1, got {bertscore_batch_size}")
    layers = (questeval_bertscore_layers(bertscore_location) if bertscore_num_layers is None
              else int(bertscore_num_layers))
    options = dict(batch_size=int(batch_size), max_source_length=max_source_length,
                   max_new_tokens=max_new_tokens, clean_up_spaces=True)
    if select_answers is None:
        select_answers = SpacyAnswerSelector(load_spacy(spacy_model), limit_sent,
                                             join_sentences=True)

    def answer_questions(pairs: list[tuple[str, str]]) -> list[tuple[str, float]]:
        model = get_seq2seq_generator(qa_location, device)
        token = (model.first_token_id(unanswerable) if unanswerable_token_id is None
                 else int(unanswerable_token_id))
        got = model.generate_scored([qa_template.format(question=q, context=c) for q, c in pairs],
                                    token, **options)
        return [(text, 1.0 - prob) for text, prob in got]

    def answer_similarity(pairs: list[tuple[str, str]]) -> np.ndarray:
        return bertscore([p for p, _ in pairs], [g for _, g in pairs], bertscore_location, layers,
                         batch_size=int(bertscore_batch_size), device=device)["bertscore_f1"]

    return questeval_published_from_components(
        cands, refs, select_answers=select_answers,
        generate_questions=model_question_generator(qg_location, device, qg_template, **options),
        answer_questions=answer_questions, answer_similarity=answer_similarity)
