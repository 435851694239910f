"""Reading an explanation out of an answer: an over-long answer keeps its leading whole
sentences (each once) when they fit, as a small model's repetition loop otherwise wastes
the call; a run-on answer without a sentence end is still refused."""
from rexeval.pipelines.generate.prompted.parse import parse_explanation

LOOP = "This strap feels solid on stage. " * 12 + "This strap feels"


def test_a_repetition_loop_keeps_its_first_sentence_once():
    assert parse_explanation(LOOP) == ("This strap feels solid on stage.", None)


def test_leading_sentences_are_kept_while_they_fit():
    first = "You loved your last capo, and this one clamps just as gently."  # 12 words
    second = "It will keep every string in tune through a long set on stage."  # 13 words
    third = " ".join(["more"] * 40) + "."
    assert parse_explanation(f"{first} {second} {third}", max_words=30) == (f"{first} {second}", None)


def test_no_whole_sentence_that_fits_is_still_refused():
    value, problem = parse_explanation(" ".join(["word"] * 70) + ".", max_words=60)
    assert value is None and "70 words" in problem and "20 to 30 words" in problem
    value, problem = parse_explanation("Great. " + " ".join(["word"] * 70), min_words=5)
    assert value is None  # "Great." alone is shorter than min_words
    value, problem = parse_explanation(LOOP, asked="15 to 30 words", min_words=7)
    assert value is None and "15 to 30 words" in problem


def test_an_answer_cut_by_the_token_limit_keeps_its_whole_sentences():
    cut = "This capo clamps gently and keeps every string in tune. It is a product that"
    assert parse_explanation(cut) == ("This capo clamps gently and keeps every string in tune.", None)
    # No whole sentence before the fragment (or too short a one): the text stays as it is.
    assert parse_explanation("Great tone and a solid build for every gig you play")[0].endswith("play")
    assert parse_explanation("Nice. It keeps every string in tune on stage", min_words=5)[0].endswith("stage")


def test_an_answer_that_copies_the_prompts_data_blocks_is_refused():
    value, problem = parse_explanation("The item: <<<ITEM Title unknown. Category: instruments. ITEM>>> great")
    assert value is None and "<<<" in problem
