"""The four explanation generators: interface, shapes, PETER's mask, CER's coherence
term, learning on a fixed batch, and generalising to held-out planted pairs."""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from torch import nn

from rexeval.models.generators.base import (
    BOS,
    EOS,
    GENERATORS,
    PAD,
    TRAIN_KEYS,
    Batch,
    build_optimizer,
    generator_class,
    greedy,
)
from rexeval.models.generators.cer import CER
from rexeval.models.generators.vocab import Vocabulary
from rexeval.models.generators.peter import PETER, peter_mask
from tests.doubles import planted_text as pt
from tests.doubles.seeds import SEED, seeded
from tests.doubles.stepwise import stepwise_nll

NAMES = ["nrt", "att2seq", "peter", "cer"]
V, MAXW, B = 17, 6, 5
TINY = {
    "nrt": {"dim": 8, "hidden": 12, "layers": 2, "rating_layers": 2, "dropout": 0.3},
    "att2seq": {"dim": 8, "hidden": 12, "layers": 2, "dropout": 0.3},
    "peter": {"emsize": 8, "nhead": 2, "nhid": 16, "nlayers": 2, "dropout": 0.3},
    "cer": {"emsize": 8, "nhead": 2, "nhid": 16, "nlayers": 2, "dropout": 0.3},
}
PARTS = {"nrt": {"loss", "text", "rating"}, "att2seq": {"loss", "text"},
         "peter": {"loss", "text", "rating", "context"},
         "cer": {"loss", "text", "rating", "context", "coherence"}}


def tiny(name: str, seed: int = 0, **over):
    torch.manual_seed(seed)
    return generator_class(name)(4, 3, V, MAXW, **{**TINY[name], **over})


def tiny_batch(seed: int = 0) -> Batch:
    """Rows of different lengths: BOS w.. EOS PAD.. (one at the length cap, one empty)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [MAXW, 3, 0, 1, 4]
    tokens = torch.full((B, MAXW + 2), PAD)
    for r, n in enumerate(lengths):
        tokens[r, 0] = BOS
        tokens[r, 1:n + 1] = torch.randint(4, V, (n,), generator=gen)
        tokens[r, n + 1] = EOS
    return Batch(torch.tensor([0, 1, 2, 3, 1]), torch.tensor([0, 1, 2, 0, 2]),
                 torch.tensor([1.0, 2.4, 3.6, 4.0, 5.0]), tokens)


@pytest.mark.parametrize("name", NAMES)
def test_registered_with_defaults_and_sources(name):
    cls = generator_class(name)
    assert name in GENERATORS and cls.name == name
    assert set(TRAIN_KEYS) <= set(cls.DEFAULTS) and cls.SOURCE
    params = inspect.signature(cls.__init__).parameters
    model_keys = set(cls.model_kwargs(cls.DEFAULTS))
    assert model_keys == set(params) - {"self", "n_users", "n_items", "vocab_size", "max_words"}
    for key in (*model_keys, "vocab_size", "max_words"):  # constructor defaults are the paper's
        assert params[key].default == cls.DEFAULTS[key], key
    build_optimizer(cls.DEFAULTS["optimizer"], tiny(name).parameters(), cls.DEFAULTS["lr"],
                    cls.DEFAULTS["weight_decay"])


@pytest.mark.parametrize("name", NAMES)
def test_losses_are_finite_scalars(name):
    out = tiny(name).losses(tiny_batch())
    assert set(out) == PARTS[name]
    for key, value in out.items():
        assert value.dim() == 0 and torch.isfinite(value), key
    out["loss"].backward()


@pytest.mark.parametrize("name", NAMES)
def test_step_gives_log_probabilities_with_batch_first_state(name):
    model, batch = tiny(name).eval(), tiny_batch()
    state = model.begin(batch.user, batch.item, batch.rating)
    prefix = batch.tokens[:, :1]
    for t in range(3):
        logp, state = model.step(state, prefix)
        assert logp.shape == (B, V)
        assert torch.allclose(logp.exp().sum(-1), torch.ones(B), atol=1e-5)
        assert all(v.shape[0] == B for v in state.values())
        prefix = torch.cat([prefix, logp.argmax(-1, keepdim=True)], 1)
    rating = model.predict_rating(batch.user, batch.item)
    if model.predicts_rating:
        assert rating.shape == (B,) and torch.isfinite(rating).all()
    else:
        assert rating is None


@pytest.mark.parametrize("name", NAMES)
def test_stepwise_decoding_scores_match_teacher_forcing(name):
    """Feeding the target word by word through begin/step gives the same mean NLL as
    losses()["text"]: training and decoding compute the same distribution."""
    model, batch = tiny(name).eval(), tiny_batch()
    with torch.no_grad():
        assert stepwise_nll(model, batch) == pytest.approx(float(model.losses(batch)["text"]), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_dropout_only_in_training(name):
    model, batch = tiny(name, dropout=0.5), tiny_batch()
    with torch.no_grad():
        assert float(model.losses(batch)["loss"]) != float(model.losses(batch)["loss"])
        model.eval()
        assert float(model.losses(batch)["loss"]) == float(model.losses(batch)["loss"])


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("name", NAMES)
def test_loss_decreases_on_a_fixed_batch(name):
    model, batch = tiny(name, seed=seeded(), dropout=0.0), tiny_batch(seeded())
    with torch.no_grad():
        text_before = float(model.losses(batch)["text"])
    history = pt.train(model, batch, steps=30, lr=2e-2, seed=seeded())
    with torch.no_grad():
        text_after = float(model.losses(batch)["text"])
    assert history[-1] < 0.7 * history[0], history
    assert text_after < 0.7 * text_before, (text_before, text_after)  # not only the rating term


def test_peter_mask_cell_by_cell():
    x, o = True, False  # x: may not attend
    expected = torch.tensor([
        # u  i  w0 w1 w2 w3   (keys)
        [o, o, x, x, x, x],  # user sees user and item
        [o, o, x, x, x, x],  # item sees user and item
        [o, o, o, x, x, x],  # w0 = BOS
        [o, o, o, o, x, x],
        [o, o, o, o, o, x],
        [o, o, o, o, o, o],
    ])
    mask = peter_mask(2, 4)
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    assert torch.equal(peter_mask(2, 0), torch.zeros(2, 2, dtype=torch.bool))


def test_peter_hidden_states_respect_the_mask():
    model, batch = tiny("peter").eval(), tiny_batch()
    words = batch.tokens[:, :-1].clone()
    other = words.clone()
    other[:, 3:] = 5  # change the later words only
    swapped = batch.item.flip(0)
    with torch.no_grad():
        h = model.encode(batch.user, batch.item, words)
        assert torch.allclose(h[:, :5], model.encode(batch.user, batch.item, other)[:, :5], atol=1e-6)
        h_item = model.encode(batch.user, swapped, words)
        assert not torch.allclose(h[:, 0], h_item[:, 0])  # the user position sees the item
        assert torch.allclose(model.predict_rating(batch.user, batch.item), model.rate(h[:, 0]), atol=1e-6)


def test_cer_adds_coherence_inside_the_rating_weight_as_the_original():
    """CER = PETER's objective + rating_reg * MSE(explanation rating, predicted rating)
    (JMRaczynski/CER, seed 000's baselines/CER): PETER's own parts are unchanged."""
    batch = tiny_batch()
    peter = tiny("peter").eval()
    cer = tiny("cer").eval()
    missing, unexpected = cer.load_state_dict(peter.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("explanation_mlp.") for k in missing)
    with torch.no_grad():
        p, c = peter.losses(batch), cer.losses(batch)
        for key in p:
            if key != "loss":
                assert float(c[key]) == pytest.approx(float(p[key]), abs=1e-6), key
        _, hidden = cer.forward_losses(batch)
        by_hand = float(((cer.explanation_rating(hidden, batch.tokens) - cer.rate(hidden[:, 0])) ** 2).mean())
        assert float(c["coherence"]) == pytest.approx(by_hand, rel=1e-5) and by_hand > 0
        assert float(c["loss"]) == pytest.approx(float(p["loss"]) + cer.rating_reg * by_hand, rel=1e-5, abs=1e-6)


def test_cer_coherence_max_pools_the_explanation_positions_through_its_own_mlp():
    batch = tiny_batch()
    cer = tiny("cer").eval()
    with torch.no_grad():
        _, hidden = cer.forward_losses(batch)
        got = cer.explanation_rating(hidden, batch.tokens)
        for r in range(B):
            n = int((batch.tokens[r, :-1] != PAD).sum())  # positions reading BOS, w1 .. wn
            want = cer.explanation_mlp(hidden[r, 2:2 + n].max(0).values)
            assert float(got[r]) == pytest.approx(float(want), rel=1e-5, abs=1e-5)
            assert float(got[r]) != pytest.approx(float(cer.rate(hidden[r, 2:2 + n].max(0).values)), abs=1e-6)
    assert issubclass(CER, PETER) and "coherence_reg" not in CER.DEFAULTS


@pytest.mark.parametrize("variant", [{}, {"attention": False, "cell_start": "zeros"}], ids=["paper", "seed000"])
def test_att2seq_writes_the_same_whatever_the_test_rating(variant):
    """No label leak: by default Att2Seq never reads the example's true rating."""
    model, batch = tiny("att2seq", **variant).eval(), tiny_batch()
    assert not model.uses_rating and model.rating_emb is None
    low, high = torch.full((B,), 1.0), torch.full((B,), 5.0)
    with torch.no_grad():
        a = model.step(model.begin(batch.user, batch.item, low), batch.tokens[:, :1])[0]
        b = model.step(model.begin(batch.user, batch.item, high), batch.tokens[:, :1])[0]
    assert torch.equal(a, b)
    assert greedy(model, batch.user, batch.item, low, MAXW) == greedy(model, batch.user, batch.item, high, MAXW)
    assert generator_class("att2seq").system_name({"rating_input": False}) == "att2seq"


def test_att2seq_rating_variant_conditions_on_the_rating_level_and_says_so():
    model, batch = tiny("att2seq", rating_input=True).eval(), tiny_batch()
    prefix = batch.tokens[:, :1]
    with torch.no_grad():
        a = model.step(model.begin(batch.user, batch.item, torch.full((B,), 2.2)), prefix)[0]
        b = model.step(model.begin(batch.user, batch.item, torch.full((B,), 1.8)), prefix)[0]
        c = model.step(model.begin(batch.user, batch.item, torch.full((B,), 4.0)), prefix)[0]
    assert torch.allclose(a, b)  # both round to 2
    assert not torch.allclose(a, c)
    assert generator_class("att2seq").system_name({"rating_input": True}) == "att2seq+rating"


def test_att2seq_seed000_variant_has_no_attention_and_zero_cells():
    model, batch = tiny("att2seq", attention=False, cell_start="zeros").eval(), tiny_batch()
    assert not hasattr(model, "attend") and not hasattr(model, "combine")
    state = model.begin(batch.user, batch.item, batch.rating)
    assert torch.equal(state["c"], torch.zeros_like(state["c"]))
    with torch.no_grad():  # the top LSTM state goes straight to the softmax
        top, _ = model.lstm(model.word_emb(batch.tokens[:, :1]),
                            (state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous()))
        want = model.out(top[:, -1]).log_softmax(-1)
        assert torch.allclose(model.step(state, batch.tokens[:, :1])[0], want, atol=1e-6)


@pytest.mark.parametrize("level,want", [("round", 3), ("truncate", 2)])
def test_nrt_rating_level_rounds_or_truncates_the_prediction(level, want):
    model = tiny("nrt", rating_level=level).eval()
    last = model.rating_mlp[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(2.7)  # every prediction is 2.7
        onehot = nn.functional.one_hot(torch.tensor([want - 1]), 5).float()
        user, item = torch.tensor([0]), torch.tensor([0])
        ui = torch.cat([model.user_emb(user), model.item_emb(item)], -1)
        h0 = torch.tanh(model.start(torch.cat([ui, onehot], -1)))
        got = model.begin(user, item, torch.tensor([5.0]))["hidden"]
        assert torch.allclose(got, h0.view(1, model.layers, model.hidden), atol=1e-6)


def test_planted_rows_cover_every_pair_and_keep_everyone_in_training():
    rows = pt.planted_rows()
    assert len(rows) == 144 and len({(r["user"], r["item"]) for r in rows}) == 144
    train_rows, held = pt.split(rows)
    assert len(held) == round(0.2 * 144)
    assert {r["user"] for r in train_rows} == set(range(12)) == {r["item"] for r in train_rows}
    assert rows == pt.planted_rows() and rows != pt.planted_rows(seed=1)
    assert all(1 <= r["rating"] <= 5 for r in rows)
    assert len({r["text"] for r in rows}) == 144  # each pair its own sentence


def held_out_report(name: str) -> tuple[float, float, float]:
    """(held-out perplexity, unigram perplexity, share of held-out pairs written exactly)."""
    model, vocab, train_batch, valid, held = pt.trained_planted(name)
    with torch.no_grad():
        ppl = math.exp(float(model.losses(valid)["text"]))
    out = greedy(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS)
    exact = sum(o == pt.words_of(vocab, r["text"]) for o, r in zip(out, held)) / len(held)
    return ppl, pt.unigram_perplexity(train_batch, valid), exact


# A model that ignores the user (or the item) can do no better than guessing its two
# words: perplexity exp((ln 4 + ln 3) / 7 tokens) = 1.43 on the planted texts.
BLIND_PPL = math.exp((math.log(4) + math.log(3)) / 7)


@pytest.mark.learning
@pytest.mark.parametrize("name", NAMES)
def test_planted_pairs_are_written_for_unseen_pairs(name):
    ppl, unigram, exact = held_out_report(name)
    assert ppl < 0.5 * unigram, (ppl, unigram)
    assert ppl < 0.5 * (1 + BLIND_PPL), ppl
    assert exact >= 0.7, exact


@pytest.mark.learning
@pytest.mark.parametrize("name", ["nrt", "peter", "cer"])
def test_planted_ratings_are_predicted_for_unseen_pairs(name):
    model, _, _, valid, _ = pt.trained_planted(name)
    with torch.no_grad():
        rmse = float((model.predict_rating(valid.user, valid.item) - valid.rating).pow(2).mean().sqrt())
    spread = float(valid.rating.std())
    assert rmse < 0.5 * spread, (rmse, spread)


@pytest.mark.slow
@pytest.mark.learning
def test_a_cased_reference_is_matched_by_a_cased_generation():
    """Case survives vocabulary, training and decoding: PETER trained on planted texts
    with capitals ("The warm Gibson sings loudly.") writes held-out pairs' texts with the
    references' case, so a case-sensitive metric compares like with like."""
    brands = {"guitar": "Gibson", "pedal": "Boss", "strap": "Ernie", "cable": "Mogami"}

    def cased(text: str) -> str:
        for low, brand in brands.items():
            text = text.replace(low, brand)
        return "T" + text[1:]

    rows = [{**r, "text": cased(r["text"])} for r in pt.planted_rows(seed=SEED)]
    train_rows, held = pt.split(rows)
    vocab = Vocabulary.build([r["text"] for r in train_rows], size=100)
    kwargs, steps, lr = pt.SMALL["peter"]
    torch.manual_seed(SEED)
    model = generator_class("peter")(12, 12, len(vocab), pt.MAX_WORDS, **kwargs)
    pt.train(model, pt.make_batch(train_rows, vocab, pt.MAX_WORDS), steps, lr, SEED)
    valid = pt.make_batch(held, vocab, pt.MAX_WORDS)
    out = [vocab.decode(ids) for ids in greedy(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS)]
    exact = sum(o == r["text"] for o, r in zip(out, held)) / len(held)
    assert exact >= 0.7, (exact, out[:3], [r["text"] for r in held[:3]])
    assert all(o.startswith("The ") for o in out if o)


@pytest.mark.slow
@pytest.mark.learning
def test_a_model_blind_to_the_user_fails_the_planted_check():
    """The planted check has teeth: the same training with every user id replaced by 0."""
    rows = [{**r, "user": 0} for r in pt.planted_rows(seed=SEED)]
    train_rows, held = pt.split(rows)
    vocab = pt.Vocabulary.build([r["text"] for r in train_rows], size=100)
    kwargs, steps, lr = pt.SMALL["nrt"]
    torch.manual_seed(SEED)
    model = generator_class("nrt")(12, 12, len(vocab), pt.MAX_WORDS, **kwargs)
    pt.train(model, pt.make_batch(train_rows, vocab, pt.MAX_WORDS), steps, lr, SEED)
    valid = pt.make_batch(held, vocab, pt.MAX_WORDS)
    out = greedy(model, valid.user, valid.item, valid.rating, pt.MAX_WORDS)
    exact = sum(o == pt.words_of(vocab, r["text"]) for o, r in zip(out, held)) / len(held)
    with torch.no_grad():
        ppl = math.exp(float(model.losses(valid)["text"]))
    assert exact < 0.4 and ppl > 0.5 * (1 + BLIND_PPL), (exact, ppl)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_runs_on_cuda(name):
    model, batch = tiny(name).cuda(), tiny_batch().to("cuda")
    model.losses(batch)["loss"].backward()
    out = greedy(model, batch.user, batch.item, batch.rating, MAXW)
    assert len(out) == B
