"""QuestEval: answer comparison, aggregation with scripted QG / QA stand-ins (golden
values by hand), spaCy answer selection, and one end-to-end run with tiny random T5s."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rexeval.metrics import questeval as qe
from rexeval.metrics.questeval import (
    answer_score,
    harmonic_f1,
    normalize_answer,
    questeval_from_components,
    questeval_f1_scores,
    token_f1,
)
from rexeval.metrics.registry import get_metric
from rexeval.models.encoders.seq2seq import get_seq2seq_generator
from rexeval.models.spacy_pipelines import load_spacy

# ------------------------------------------------------------------ answer comparison


def test_squad_normalisation_and_token_f1():
    assert normalize_answer("  The  Strings, of an Amp! ") == "strings of amp"
    assert token_f1("the red Strings", "strings") == pytest.approx(2 / 3)  # P 1/2, R 1
    assert token_f1("An amp.", "amp") == 1.0
    assert token_f1("loud", "quiet") == 0.0
    assert token_f1("strings strings cable", "strings cable cable") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0
    assert token_f1("the", "") == 1.0  # both normalise to nothing
    assert token_f1("", "strings") == 0.0
    assert answer_score("Unanswerable.", "unanswerable") == 0.0  # the marker always scores 0
    assert answer_score("no answer", "x", unanswerable="no answer") == 0.0
    assert answer_score("the strings", "strings") == 1.0


def test_harmonic_mean_edges():
    p = np.array([0.5, 0.0, 1.0, np.nan, 0.3])
    r = np.array([1 / 3, 0.0, 0.0, 0.4, np.nan])
    f = harmonic_f1(p, r)
    assert f[0] == pytest.approx(0.4)
    assert f[1] == 0.0 and f[2] == 0.0
    assert math.isnan(f[3]) and math.isnan(f[4])


# --------------------------------------------------------- scripted QG / QA stand-ins

CAND = "the strings sound bright and the case is cheap"
REF = "the strings sound bright and the cable is noisy"
ANSWERS = {
    CAND: ["the strings", "the case"],
    REF: ["the strings", "the cable", "the strings"],  # a duplicate, dropped
    "no nouns here": [],
}
QA_SCRIPT = {
    # questions from the candidate, asked on the reference (precision)
    ("Q[the strings]", REF): "strings",            # F1 1 after normalisation
    ("Q[the case]", REF): "unanswerable",          # 0
    # questions from the reference, asked on the candidate (recall)
    ("Q[the strings]", CAND): "bright strings",    # F1 2/3 against "the strings"
    ("Q[the cable]", CAND): "the case",            # 0
    # the reference's questions asked on a candidate without answers of its own
    ("Q[the strings]", "no nouns here"): "unanswerable",
    ("Q[the cable]", "no nouns here"): "unanswerable",
}


class Script:
    """Scripted components that record every call."""

    def __init__(self):
        self.texts: list[list[str]] = []
        self.qg: list[list[tuple[str, str]]] = []
        self.qa: list[list[tuple[str, str]]] = []

    def select_answers(self, texts):
        self.texts.append(list(texts))
        return [ANSWERS[t] for t in texts]

    def generate_questions(self, pairs):
        self.qg.append(list(pairs))
        return [f"Q[{a}]" for a, _ in pairs]

    def answer_questions(self, pairs):
        self.qa.append(list(pairs))
        return [QA_SCRIPT[p] for p in pairs]

    def run(self, cands, refs, **kw):
        return questeval_from_components(
            cands, refs, select_answers=self.select_answers,
            generate_questions=self.generate_questions,
            answer_questions=self.answer_questions, **kw)


def test_golden_values_with_scripted_models():
    s = Script()
    out = s.run([CAND, CAND], [REF, REF])  # the same pair twice
    p, r = 0.5, (2 / 3 + 0) / 2
    assert np.allclose(out["questeval_f1_p"], [p, p])
    assert np.allclose(out["questeval_f1_r"], [r, r])
    assert np.allclose(out["questeval_f1"], [2 * p * r / (p + r)] * 2)
    assert out["questeval_f1"][0] == pytest.approx(0.4)
    assert all(v.dtype == np.float64 and v.shape == (2,) for v in out.values())
    # every distinct text, (answer, text) and (question, text) computed once, in one call
    assert s.texts == [[CAND, REF]]
    assert len(s.qg) == 1 and sorted(s.qg[0]) == sorted(
        [("the strings", CAND), ("the case", CAND), ("the strings", REF), ("the cable", REF)])
    assert len(s.qa) == 1 and sorted(s.qa[0]) == sorted(k for k in QA_SCRIPT if CAND in k
                                                        or REF in k)


def test_directions_swap_precision_and_recall():
    out = Script().run([REF], [CAND])
    assert out["questeval_f1_p"][0] == pytest.approx(1 / 3)
    assert out["questeval_f1_r"][0] == pytest.approx(0.5)
    assert out["questeval_f1"][0] == pytest.approx(0.4)  # F1 is symmetric


def test_sides_without_questions():
    s = Script()
    out = s.run(["", "no nouns here", CAND], [REF, REF, ""])
    # empty candidate: no questions of its own (P NaN); the reference's questions asked
    # on an empty text score 0 without calling the QA model
    assert math.isnan(out["questeval_f1_p"][0]) and out["questeval_f1_r"][0] == 0.0
    assert math.isnan(out["questeval_f1"][0])
    # a candidate where no answer is found: same
    assert math.isnan(out["questeval_f1_p"][1]) and out["questeval_f1_r"][1] == 0.0
    # empty reference: P 0 (questions asked on nothing), R NaN
    assert out["questeval_f1_p"][2] == 0.0 and math.isnan(out["questeval_f1_r"][2])
    assert all(pair[1].strip() for call in s.qa for pair in call)
    zero = Script().run(["", "no nouns here", CAND], [REF, REF, ""], no_questions="zero")
    for key in ("questeval_f1", "questeval_f1_p", "questeval_f1_r"):
        assert np.array_equal(zero[key], [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="no_questions"):
        Script().run([CAND], [REF], no_questions="skip")


def test_component_contract_checked():
    with pytest.raises(ValueError, match="1 candidates but 2 references"):
        Script().run([CAND], [REF, REF])
    with pytest.raises(ValueError, match="generate_questions returned 1 results for 4"):
        questeval_from_components([CAND], [REF], select_answers=Script().select_answers,
                                  generate_questions=lambda pairs: ["q"],
                                  answer_questions=lambda pairs: ["a"] * len(pairs))
    empty = Script().run([], [])
    assert all(v.shape == (0,) for v in empty.values())


def test_registered():
    for name in ("questeval_f1", "questeval_f1_p", "questeval_f1_r"):
        info = get_metric(name)
        assert info.kind == "per_example" and info.higher_is_better and info.description
        assert info.inputs == ("generated_explanations", "reference_explanations")


# ---------------------------------------------------------------------------- spaCy

@pytest.fixture(scope="module")
def nlp():
    from rexeval.models.refs import ModelUnavailable

    try:
        return load_spacy("en_core_web_sm")
    except ModelUnavailable as exc:
        pytest.skip(f"spaCy en_core_web_sm not available: {exc}")


def test_spacy_answers_and_sentence_limit(nlp):
    assert load_spacy("en_core_web_sm") is nlp
    doc = nlp("One amp. Two cables! Three pedals? Four strings.")
    assert qe.leading_sentences(doc, 2) == "One amp. Two cables!"
    assert qe.leading_sentences(doc, 4) == doc.text
    assert qe.leading_sentences(doc, None) == doc.text
    select = qe.SpacyAnswerSelector(nlp, limit_sent=1)
    [answers] = select(["The strings from Fender sound bright. The case is cheap."])
    assert "the case" not in [a.lower() for a in answers]  # second sentence cut
    assert "Fender" in answers and "The strings" in answers
    [all_answers] = qe.SpacyAnswerSelector(nlp, limit_sent=None)(
        ["The strings from Fender sound bright. The case is cheap."])
    assert "The case" in all_answers
    with pytest.raises(ValueError, match="limit_sent"):
        qe.SpacyAnswerSelector(nlp, limit_sent=0)


# ------------------------------------------------------------------ tiny T5 end to end

T5_CORPUS = [
    "sv1 </s> the strings </s> the strings sound bright and the case is cheap",
    "what sounds bright ? </s> the cable is noisy and broke after two weeks",
    "unanswerable the user would appreciate this product because the tuner holds pitch",
    "the user may dislike the pedal because the sound is thin",
] * 5


def build_tiny_t5(folder: Path, *, seed: int, initializer_factor: float = 5.0) -> Path:
    """Word-level tokenizer ($A </s>) + 2-layer T5, saved as an HF folder. The large
    default `initializer_factor` gives peaked outputs (distinct greedy texts); a small one
    gives flat next-token distributions (probabilities far from 0 and 1)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    specials = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2 as in T5's vocabulary
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(T5_CORPUS, trainers.WordLevelTrainer(
        special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>")
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(hf_tok), d_model=32, d_kv=8, d_ff=64, num_layers=2,
                      num_decoder_layers=2, num_heads=4, pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0, dropout_rate=0.0,
                      initializer_factor=initializer_factor)
    model = T5ForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_t5s(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("tiny-t5")
    return (str(build_tiny_t5(root / "qg", seed=1)), str(build_tiny_t5(root / "qa", seed=2)))


def manual_greedy(location: str, prompt: str, steps: int) -> str:
    """Greedy decoding written out: argmax token by token until </s> or `steps` tokens."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(location)
    model = AutoModelForSeq2SeqLM.from_pretrained(location).eval()
    enc = tok(prompt, return_tensors="pt")
    out = [model.config.decoder_start_token_id]
    with torch.no_grad():
        for _ in range(steps):
            logits = model(**enc, decoder_input_ids=torch.tensor([out])).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] == model.config.eos_token_id:
                break
    return tok.decode(out[1:], skip_special_tokens=True).strip()


@pytest.mark.slow
def test_generator_is_greedy_and_batch_independent(tiny_t5s):
    qg, _ = tiny_t5s
    gen = get_seq2seq_generator(qg)
    assert get_seq2seq_generator(qg, "cpu") is gen
    prompts = [qe.QG_TEMPLATE.format(answer="the strings", context=T5_CORPUS[0]),
               "the pedal",
               qe.QG_TEMPLATE.format(answer="the cable", context=T5_CORPUS[1] + " " + T5_CORPUS[3]),
               "the pedal"]
    one = gen.generate(prompts, batch_size=1, max_new_tokens=6)
    many = gen.generate(prompts, batch_size=8, max_new_tokens=6)
    assert one == many and one[1] == one[3]
    assert one[0] == manual_greedy(qg, prompts[0], 6)
    assert one[2] == manual_greedy(qg, prompts[2], 6)
    assert any(one)  # the tiny model does write something


def test_end_to_end_tiny_t5(tiny_t5s, nlp):
    qg, qa = tiny_t5s
    cands = ["The strings sound bright and the case is cheap.",
             "",
             "The user may dislike the pedal because the sound is thin.",
             "The strings sound bright and the case is cheap."]
    refs = ["The user would appreciate this product because the strings sound bright.",
            "The cable is noisy.",
            "The user may dislike the pedal because the sound is thin.",
            "The user would appreciate this product because the strings sound bright."]
    out = questeval_f1_scores(cands, refs, qg, qa, batch_size=4, max_new_tokens=5)
    assert set(out) == {"questeval_f1", "questeval_f1_p", "questeval_f1_r"}
    assert all(v.shape == (4,) and v.dtype == np.float64 for v in out.values())
    for i in (0, 2, 3):
        for key in out:
            assert 0.0 <= out[key][i] <= 1.0
    assert math.isnan(out["questeval_f1_p"][1]) and out["questeval_f1_r"][1] == 0.0
    assert np.array_equal(out["questeval_f1"][[0]], out["questeval_f1"][[3]])
    again = questeval_f1_scores(cands, refs, qg, qa, batch_size=1, max_new_tokens=5)
    for key in out:
        assert np.array_equal(out[key], again[key], equal_nan=True)
    # the registered one-score functions agree
    p = qe.questeval_f1_precision(cands[:1], refs[:1], qg, qa, max_new_tokens=5)
    assert p[0] == out["questeval_f1_p"][0]
    with pytest.raises(ValueError, match="qa_template"):
        questeval_f1_scores(cands, refs, qg, qa, qa_template="{question}")


# ------------------------------------------------- published QuestEval (metric `questeval`)

H = "the strings sound bright and the case is cheap"
R = "the cable is noisy"
R_DUP = "the strings sound bright and the cable is noisy"
NO_ANSWERS = "no nouns here"
HUMS = "it hums"
PUB_ANSWERS = {
    H: ["the strings", "the case"],
    R: ["the cable"],
    R_DUP: ["the strings", "the cable", "the strings"],  # a duplicate, kept as published
    NO_ANSWERS: [],
    HUMS: [],
}
PUB_QA = {  # (question, context) -> (predicted answer, answerability)
    ("Q[the strings]", R): ("strings", 0.9),
    ("Q[the case]", R): ("unanswerable", 0.2),
    ("Q[the cable]", H): ("the cable case", 0.6),
    ("Q[the cable]", NO_ANSWERS): ("unanswerable", 0.1),
    ("Q[the strings]", HUMS): ("bright strings", 0.8),
    ("Q[the cable]", HUMS): ("the cable case", 0.6),
}
PUB_SIM = {  # (predicted, gold) -> BERTScore F1
    ("strings", "the strings"): 1.02,       # a little above 1: clipped to 1
    ("unanswerable", "the case"): -0.1,     # below 0: clipped to 0
    ("the cable case", "the cable"): 0.7,
    ("unanswerable", "the cable"): 0.3,
    ("bright strings", "the strings"): 0.9,
}


class PublishedScript(Script):
    """Scripted components for the published scoring; records every call."""

    def __init__(self):
        super().__init__()
        self.sim: list[list[tuple[str, str]]] = []

    def select_answers(self, texts):
        self.texts.append(list(texts))
        return [PUB_ANSWERS[t] for t in texts]

    def answer_questions(self, pairs):
        self.qa.append(list(pairs))
        return [PUB_QA[p] for p in pairs]

    def answer_similarity(self, pairs):
        self.sim.append(list(pairs))
        return [PUB_SIM[p] for p in pairs]

    def run(self, cands, refs, **kw):
        from rexeval.metrics.questeval_published import questeval_published_from_components

        return questeval_published_from_components(
            cands, refs, select_answers=self.select_answers,
            generate_questions=self.generate_questions,
            answer_questions=self.answer_questions,
            answer_similarity=self.answer_similarity, **kw)


def test_published_golden_value_by_hand():
    """Explanation H has two questions, reference R one.
    R questioned with H's questions (2 questions, 6 values):
      answerability 0.9, 0.2; BERTScore 1.02 -> 1, -0.1 -> 0; token F1 "strings" vs
      "the strings" = 1, "unanswerable" vs "the case" = 0; mean = 3.1 / 6 = 31/60.
    H questioned with R's question (1 question, 3 values):
      answerability 0.6; BERTScore 0.7; token F1 "cable case" vs "cable" = P 1/2, R 1 ->
      2/3; mean = (0.6 + 0.7 + 2/3) / 3 = 59/90.
    questeval = arithmetic mean = (31/60 + 59/90) / 2 = (93 + 118) / 360 = 211/360."""
    s = PublishedScript()
    out = s.run([H, H], [R, R])  # the same pair twice
    assert out.dtype == np.float64 and out.shape == (2,)
    assert np.allclose(out, [211 / 360] * 2)
    assert out[0] == pytest.approx(0.5861111)
    # not the harmonic mean of the two directions (QuestEval-F1's combination)
    p, r = 31 / 60, 59 / 90
    assert out[0] != pytest.approx(2 * p * r / (p + r))
    # every distinct text, question, QA input and answer pair computed once, in one call
    assert s.texts == [[H, R]]
    assert len(s.qa) == 1 and sorted(s.qa[0]) == sorted(
        [("Q[the strings]", R), ("Q[the case]", R), ("Q[the cable]", H)])
    assert len(s.sim) == 1 and sorted(s.sim[0]) == sorted(
        [("strings", "the strings"), ("unanswerable", "the case"), ("the cable case", "the cable")])
    # symmetric: swapping explanation and reference gives the same score
    assert PublishedScript().run([R], [H])[0] == pytest.approx(211 / 360)


def test_published_keeps_duplicate_answers():
    """R_DUP has "the strings" twice: its question is asked (answered once) and counted
    twice. HUMS has no answers, so that direction scores 0.
    HUMS questioned with R_DUP's questions: answerability 0.8, 0.6, 0.8; BERTScore 0.9,
    0.7, 0.9; token F1 "bright strings" vs "strings" 2/3 (twice), "cable case" vs "cable"
    2/3; sum = 2.2 + 2.5 + 2 = 6.7 over 9 values. questeval = (6.7/9 + 0) / 2 = 67/180.
    (Deduplicated it would be (0.8 + 0.6 + 0.9 + 0.7 + 4/3) / 6 / 2 = 13/36.)"""
    s = PublishedScript()
    out = s.run([HUMS], [R_DUP])
    assert out[0] == pytest.approx(67 / 180)
    assert sorted(s.qg[0]) == sorted([("the strings", R_DUP), ("the cable", R_DUP)])
    assert sorted(s.qa[0]) == sorted([("Q[the strings]", HUMS), ("Q[the cable]", HUMS)])


def test_published_empty_texts_and_no_questions():
    """An empty (or blank) text on either side: 0 with no model call for that pair.
    NO_ANSWERS has no questions: its direction scores 0; R's one question asked on it
    gives answerability 0.1, BERTScore 0.3, token F1 0 -> 0.4 / 3; questeval = 0.4/3/2
    = 1/15."""
    s = PublishedScript()
    out = s.run(["", "  ", NO_ANSWERS, H], [R, R, R, "\n"])
    assert np.allclose(out, [0.0, 0.0, 1 / 15, 0.0])
    assert s.texts == [[NO_ANSWERS, R]]  # the pairs with an empty side are not analysed
    assert s.qa == [[("Q[the cable]", NO_ANSWERS)]]
    assert PublishedScript().run([], []).shape == (0,)
    assert np.array_equal(PublishedScript().run([NO_ANSWERS], [HUMS]), [0.0])


def test_published_component_contract_checked():
    from rexeval.metrics.questeval_published import questeval_published_from_components

    s = PublishedScript()
    with pytest.raises(TypeError, match=r"\(answer, answerability\) pairs"):
        questeval_published_from_components(
            [H], [R], select_answers=s.select_answers, generate_questions=s.generate_questions,
            answer_questions=lambda pairs: ["strings"] * len(pairs),
            answer_similarity=s.answer_similarity)
    with pytest.raises(ValueError, match="answer_similarity returned 1 results for 3"):
        questeval_published_from_components(
            [H], [R], select_answers=s.select_answers, generate_questions=s.generate_questions,
            answer_questions=s.answer_questions, answer_similarity=lambda pairs: [0.5])


def test_published_registered_and_layer_lookup():
    from rexeval.metrics.questeval_published import questeval_bertscore_layers

    info = get_metric("questeval")
    assert info.group == "questeval" and info.higher_is_better and info.kind == "per_example"
    assert info.inputs == ("generated_explanations", "reference_explanations")
    assert "published" in info.description
    # bert-score's own table: layer 9 for the public encoder, looked up by name or folder
    assert questeval_bertscore_layers(None, "bert-base-multilingual-cased") == 9
    assert questeval_bertscore_layers("/models/x", "/cache/bert-base-multilingual-cased") == 9
    with pytest.raises(ValueError, match="bertscore_num_layers"):
        questeval_bertscore_layers("/models/unknown-encoder")


def test_spacy_sentences_joined_as_published(nlp):
    doc = nlp("One amp. Two cables! Three pedals? Four strings.")
    assert qe.sentence_texts(doc) == ["One amp.", "Two cables!", "Three pedals?", "Four strings."]
    assert qe.sentence_texts(nlp("")) == []
    select = qe.SpacyAnswerSelector(nlp, limit_sent=1, join_sentences=True)
    [answers] = select(["The strings from Fender sound bright. The case is cheap."])
    assert "Fender" in answers and "the case" not in [a.lower() for a in answers]


@pytest.fixture(scope="module")
def flat_qa(tmp_path_factory) -> str:
    """A tiny T5 whose first-step probabilities are neither ~0 nor ~1."""
    return str(build_tiny_t5(tmp_path_factory.mktemp("flat-t5") / "qa", seed=3,
                             initializer_factor=0.3))


def test_answerability_is_one_minus_first_step_probability(flat_qa):
    """generate_scored's probability = softmax of the logits of a direct forward pass with
    only the decoder start token, at the token asked for; texts as `generate` gives."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    qa = flat_qa
    gen = get_seq2seq_generator(qa)
    tok = AutoTokenizer.from_pretrained(qa)
    model = AutoModelForSeq2SeqLM.from_pretrained(qa).eval()
    token = gen.first_token_id("unanswerable")
    assert token == tok.convert_tokens_to_ids("unanswerable") != tok.unk_token_id
    prompts = [qe.QA_TEMPLATE.format(question="what sounds bright ?", context=T5_CORPUS[0]),
               "the pedal",
               qe.QA_TEMPLATE.format(question="the cable", context=T5_CORPUS[1] + " " + T5_CORPUS[3])]
    one = gen.generate_scored(prompts, token, batch_size=1, max_new_tokens=4)
    many = gen.generate_scored(prompts, token, batch_size=3, max_new_tokens=4)
    assert [t for t, _ in one] == gen.generate(prompts, batch_size=2, max_new_tokens=4)
    for prompt, (_, p_one), (_, p_many) in zip(prompts, one, many):
        enc = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                           decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id]])
                           ).logits[0, -1]
        expected = float(torch.softmax(logits.double(), dim=-1)[token])
        assert 1e-3 < expected < 0.5  # a probability that tells something
        assert p_one == pytest.approx(expected, rel=1e-4)
        assert p_many == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen.generate_scored(prompts, 10 ** 6)
    # max_new_tokens=None: the checkpoint sets no length, so transformers' 20 less the start
    assert gen.default_max_new_tokens == 19


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    pytest.importorskip("bert_score")
    from tests.doubles.tiny_encoders import build_tiny_bert

    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "model", 2))


@pytest.mark.slow
def test_published_end_to_end_tiny_models(tiny_t5s, tiny_bert, nlp):
    """The full metric on tiny random models equals the scoring recomputed from parts
    computed independently: greedy decoding by hand, answerability by a direct forward
    pass, BERTScore through `metrics.similarity.bertscore`."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from rexeval.metrics.questeval_published import questeval, questeval_published_from_components
    from rexeval.metrics.similarity import bertscore

    qg, qa = tiny_t5s  # a peaked QA model: its answers are words, so BERTScore has work
    cands = ["The strings sound bright and the case is cheap.", "",
             "The strings sound bright and the case is cheap."]
    refs = ["The user would appreciate this product because the strings sound bright.",
            "The cable is noisy.",
            "The user would appreciate this product because the strings sound bright."]
    kw = dict(bertscore_num_layers=2, batch_size=4, max_new_tokens=4)
    out = questeval(cands, refs, qg, qa, tiny_bert, **kw)
    assert out.shape == (3,) and out.dtype == np.float64
    assert out[1] == 0.0 and out[0] == out[2] and 0.0 < out[0] <= 1.0
    again = questeval(cands, refs, qg, qa, tiny_bert, **{**kw, "batch_size": 1})
    assert np.allclose(out, again, atol=1e-6)

    tok = AutoTokenizer.from_pretrained(qa)
    model = AutoModelForSeq2SeqLM.from_pretrained(qa).eval()
    token = tok.convert_tokens_to_ids("unanswerable")

    def answer_by_hand(pairs):
        got = []
        for q, c in pairs:
            prompt = qe.QA_TEMPLATE.format(question=q, context=c)
            enc = tok(prompt, return_tensors="pt")
            with torch.no_grad():
                logits = model(**enc, decoder_input_ids=torch.tensor(
                    [[model.config.decoder_start_token_id]])).logits[0, -1]
            got.append((manual_greedy(qa, prompt, 4),
                        1.0 - float(torch.softmax(logits.double(), -1)[token])))
        return got

    expected = questeval_published_from_components(
        cands[:1], refs[:1],
        select_answers=qe.SpacyAnswerSelector(nlp, 5, join_sentences=True),
        generate_questions=lambda pairs: [manual_greedy(qg, qe.QG_TEMPLATE.format(
            answer=a, context=c), 4) for a, c in pairs],
        answer_questions=answer_by_hand,
        answer_similarity=lambda pairs: bertscore([p for p, _ in pairs], [g for _, g in pairs],
                                                  tiny_bert, 2)["bertscore_f1"])
    assert out[0] == pytest.approx(expected[0], abs=1e-5)
    assert 0.0 < expected[0] < 1.0


@pytest.mark.slow
def test_evaluate_families_call_both_scores_with_the_profile_roles(tiny_t5s, tiny_bert, nlp, monkeypatch):
    """The `questeval` and `questeval_f1` families of `rexeval evaluate` score a batch as the
    metric functions do, with the roles' locations and the profile's spaCy reference."""
    from rexeval.metrics import questeval_published as qp
    from rexeval.pipelines.evaluate.families import FAMILIES, EvalContext

    qg, qa = tiny_t5s
    # bert-score knows layers by model name; the tiny BERT has two.
    monkeypatch.setattr(qp, "questeval_bertscore_layers", lambda *names: 2)
    ctx = EvalContext(locations={"questeval_qg": qg, "questeval_qa": qa, "questeval_bertscore": tiny_bert,
                                 "spacy": "unused"},
                      refs={"spacy": "en_core_web_sm", "questeval_bertscore": "tiny"})
    batch = {"explanation": ["The strings sound bright.", ""],
             "reference": ["The strings sound bright and the case is cheap.", "The cable is noisy."]}
    got, counts = FAMILIES["questeval"](ctx).score(batch)
    want = qp.questeval(batch["explanation"], batch["reference"], qg, qa, tiny_bert, bertscore_num_layers=2)
    assert set(got) == {"questeval"} and counts == {}
    assert np.allclose(got["questeval"], want, atol=1e-6) and got["questeval"][1] == 0.0
    got_f1, _ = FAMILIES["questeval_f1"](ctx).score(batch)
    want_f1 = questeval_f1_scores(batch["explanation"], batch["reference"], qg, qa)
    assert set(got_f1) == {"questeval_f1", "questeval_f1_p", "questeval_f1_r"}
    for key, values in want_f1.items():
        assert np.allclose(got_f1[key], values, equal_nan=True)


def test_the_evaluate_family_takes_the_profile_layer_before_the_name_lookup(monkeypatch):
    """`questeval_bertscore_num_layers` (a profile setting) decides the answer BERTScore's
    layer; unset, bert-score's default for the checkpoint's name does."""
    from rexeval.metrics import questeval_published as qp
    from rexeval.pipelines.evaluate.families import FAMILIES, EvalContext

    seen = []
    monkeypatch.setattr(qp, "questeval", lambda *a, bertscore_num_layers, **kw: seen.append(
        bertscore_num_layers) or [0.5] * len(a[0]))
    where = {"questeval_qg": "/qg", "questeval_qa": "/qa", "questeval_bertscore": "/m/bert-base-multilingual-cased"}
    batch = {"explanation": ["a"], "reference": ["b"]}
    FAMILIES["questeval"](EvalContext(locations=where, questeval_bertscore_num_layers=4)).score(batch)
    FAMILIES["questeval"](EvalContext(locations=where)).score(batch)
    assert seen == [4, 9]
