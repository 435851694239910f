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
        return qe.load_spacy("en_core_web_sm")
    except ModelUnavailable as exc:
        pytest.skip(f"spaCy en_core_web_sm not available: {exc}")


def test_spacy_answers_and_sentence_limit(nlp):
    assert qe.load_spacy("en_core_web_sm") is nlp
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


def build_tiny_t5(folder: Path, *, seed: int) -> Path:
    """Word-level tokenizer ($A </s>) + 2-layer T5, saved as an HF folder."""
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
                      decoder_start_token_id=0, dropout_rate=0.0, initializer_factor=5.0)
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


def test_generator_is_greedy_and_batch_independent(tiny_t5s):
    qg, _ = tiny_t5s
    gen = qe.get_seq2seq_generator(qg)
    assert qe.get_seq2seq_generator(qg, "cpu") is gen
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
