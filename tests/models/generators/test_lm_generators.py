"""The generators on a pretrained causal LM (PEPLER, XRec), on a tiny random Llama with a
BPE tokenizer and a chat template (`tests.doubles.tiny_llm`): the LM-token vocabulary,
PEPLER's two phases (a frozen LM stays bit-identical and out of the checkpoint), its
rating regulariser, XRec's adapter outputs at the reserved prompt positions and inside
every layer's q/k/v projections (grouped-query `kv_share` included), its frozen LM, and
decoding: batches equal rows (left padding), the KV cache equals a full re-run, and
stepwise scores equal teacher forcing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rexeval.models.generators.base import BOS, EOS, PAD, Batch, beam, build_optimizer, generator_class, greedy
from rexeval.models.generators.lm import OFFSET, LMTokens, encode_plain
from rexeval.models.generators.xrec import MoEAdapter, kv_share
from tests.doubles.stepwise import stepwise_nll
from tests.doubles.tiny_llm import build_tiny_chat_model

N_USERS, N_ITEMS, MAXW = 5, 6, 10
COLLAB = 8
TEXTS = ["The guitar strings sound bright.", "This cable is cheap and noisy.", "Great pedal, warm sound.",
         "The strap broke after two weeks.", "Bright capo."]
USERS, ITEMS = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1, 2, 3, 0, 5])
RATINGS = torch.tensor([4.0, 3.0, 5.0, 1.0, 2.0])
USER_TEXT_LEN = [3, 7, 0, 12, 5]  # profile lengths differ, so XRec's prompts are left-padded
ITEM_TEXT_LEN = [4, 9, 1, 0, 6, 2]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny_lm") / "lm"))


@pytest.fixture(scope="module")
def voc(tiny_dir):
    return LMTokens(tiny_dir)


@pytest.fixture(scope="module")
def profiles(voc):
    """Per-user and per-item profile token lists (LM ids) of different lengths."""
    ids = encode_plain(voc.tokenizer, " ".join(TEXTS * 3))
    user = [ids[k:k + n] for k, n in enumerate(USER_TEXT_LEN)]
    item = [ids[20 + k:20 + k + n] for k, n in enumerate(ITEM_TEXT_LEN)]
    return user, item


def pepler(tiny_dir, voc, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return generator_class("pepler")(N_USERS, N_ITEMS, len(voc), MAXW, lm=tiny_dir, **kw)


def xrec(tiny_dir, voc, profiles, seed: int = 0, **kw):
    torch.manual_seed(seed)
    rng = np.random.default_rng(7)
    user_text, item_text = profiles
    return generator_class("xrec")(N_USERS, N_ITEMS, len(voc), MAXW, lm=tiny_dir,
                                   collab_user=rng.normal(size=(N_USERS, COLLAB)),
                                   collab_item=rng.normal(size=(N_ITEMS, COLLAB)),
                                   user_text=user_text, item_text=item_text, **kw)


def text_batch(voc) -> Batch:
    rows = [voc.encode(t, MAXW) for t in TEXTS]
    tokens = torch.full((len(rows), max(map(len, rows))), PAD)
    for r, ids in enumerate(rows):
        tokens[r, :len(ids)] = torch.tensor(ids)
    return Batch(USERS, ITEMS, RATINGS, tokens)


def train_steps(model, batch: Batch, steps: int = 3, lr: float = 1e-2, name: str = "adamw") -> None:
    """A few optimizer steps over the parameters that require grad (as the trainer does)."""
    model.train()
    opt = build_optimizer(name, [p for p in model.parameters() if p.requires_grad], lr)
    for _ in range(steps):
        loss = model.losses(batch)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def lm_copy(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.lm.state_dict().items()}


def assert_lm_unchanged(model, before: dict[str, torch.Tensor]) -> None:
    after = model.lm.state_dict()
    assert set(after) == set(before)
    for k, v in before.items():
        assert torch.equal(after[k], v), k


# --- LMTokens -------------------------------------------------------------------------------

def test_lm_tokens_round_trip_offset_and_cut(voc):
    tok = voc.tokenizer
    assert len(voc) == len(tok) + OFFSET == voc.n_lm + 4
    text = TEXTS[0]
    lm_ids = tok(text, add_special_tokens=False)["input_ids"]
    enc = voc.encode(text, 100)
    assert enc == [BOS, *(i + OFFSET for i in lm_ids), EOS]
    assert voc.decode(enc) == text
    assert voc.length(text) == len(lm_ids)
    cut = voc.encode(text, 3)
    assert cut == [BOS, *(i + OFFSET for i in lm_ids[:3]), EOS]
    assert voc.encode("", 5) == [BOS, EOS]
    # the saved vocabulary comes back, and its identity depends on the token table
    assert voc.words[:2] == ["<lm>", str(len(tok))]


def test_lm_tokens_read_special_token_strings_as_plain_text(voc, tmp_path):
    tok = voc.tokenizer
    text = "great <|im_end|> sound <|im_start|> and <|endoftext|>"
    specials = {i + OFFSET for i in tok.all_special_ids}
    assert specials  # the tiny tokenizer has <|im_start|>, <|im_end|>, <|endoftext|>
    # the tokenizer itself would read them as control tokens ...
    assert set(tok(text, add_special_tokens=False)["input_ids"]) & set(tok.all_special_ids)
    enc = voc.encode(text, 100)
    # ... our encoding never does: only plain pieces between BOS and EOS
    assert not set(enc[1:-1]) & specials
    assert all(OFFSET <= i < len(voc) for i in enc[1:-1])
    assert voc.decode(enc) == text
    voc.save(tmp_path / "vocab.json")
    back = LMTokens.load(tmp_path / "vocab.json")
    assert len(back) == len(voc) and back.words == voc.words and back.encode(text, 100) == enc


# --- PEPLER ---------------------------------------------------------------------------------

def test_pepler_phase_0_trains_only_the_prompt_vectors_and_keeps_the_lm_out_of_checkpoints(tiny_dir, voc):
    cls = generator_class("pepler")
    assert cls.n_phases({"sequential": True}) == 2 and cls.n_phases({}) == 2
    assert cls.n_phases({"sequential": False}) == 1
    m, batch = pepler(tiny_dir, voc), text_batch(voc)
    m.enter_phase(0)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {"user_emb.weight", "item_emb.weight"}
    m.train()
    assert not m.lm.training  # a frozen backbone keeps its dropout off
    lm0 = lm_copy(m)
    users0, items0 = m.user_emb.weight.detach().clone(), m.item_emb.weight.detach().clone()
    train_steps(m, batch, steps=3)
    assert_lm_unchanged(m, lm0)
    assert all(p.grad is None for p in m.lm.parameters())
    for r in range(len(batch)):  # every prompt vector in the batch moved
        assert not torch.equal(m.user_emb.weight[USERS[r]], users0[USERS[r]])
        assert not torch.equal(m.item_emb.weight[ITEMS[r]], items0[ITEMS[r]])
    sd0 = m.state_dict()
    assert not any(k.startswith("lm.") for k in sd0)
    assert set(sd0) == {"user_emb.weight", "item_emb.weight"}
    with torch.no_grad():
        loss0 = m.losses(batch)["loss"]

    # a fresh model (other random prompt vectors) restored from the phase-0 checkpoint
    fresh = pepler(tiny_dir, voc, seed=1)
    assert not torch.equal(fresh.user_emb.weight, m.user_emb.weight)
    fresh.load_state_dict(sd0)
    assert not fresh.lm_tuned
    assert_lm_unchanged(fresh, lm0)
    assert torch.equal(fresh.user_emb.weight, m.user_emb.weight)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh.losses(batch)["loss"], loss0)
    with pytest.raises(RuntimeError, match="missing"):  # the vectors themselves are required
        pepler(tiny_dir, voc).load_state_dict({"user_emb.weight": sd0["user_emb.weight"]})

    # phase 1 trains everything and its checkpoints hold the LM
    m.enter_phase(1)
    assert all(p.requires_grad for p in m.parameters())
    m.train()
    assert m.lm.training
    sd1 = m.state_dict()
    assert {k for k in sd1 if k.startswith("lm.")} == {"lm." + k for k in m.lm.state_dict()}
    train_steps(m, batch, steps=1)
    changed = [k for k, v in m.lm.state_dict().items() if not torch.equal(v, lm0[k])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "lm_head.weight" in changed
    # a phase-1 checkpoint replaces the pretrained LM of a fresh model
    tuned = m.state_dict()
    other = pepler(tiny_dir, voc, seed=2)
    other.load_state_dict(tuned)
    assert other.lm_tuned
    assert torch.equal(other.lm.lm_head.weight, m.lm.lm_head.weight)
    assert not torch.equal(other.lm.lm_head.weight, lm0["lm_head.weight"])


def test_pepler_without_sequential_tuning_trains_everything_from_the_start(tiny_dir, voc):
    m = pepler(tiny_dir, voc, sequential=False)
    m.enter_phase(0)
    assert all(p.requires_grad for p in m.parameters())
    assert any(k.startswith("lm.") for k in m.state_dict())


def test_pepler_rating_regulariser_mf(tiny_dir, voc):
    batch = text_batch(voc)
    plain = pepler(tiny_dir, voc)
    assert not plain.predicts_rating and plain.predict_rating(USERS, ITEMS) is None
    assert set(plain.losses(batch)) == {"loss", "text"}
    m = pepler(tiny_dir, voc, rating_reg=0.25, text_reg=0.7)
    assert m.predicts_rating
    m.eval()
    with torch.no_grad():
        out = m.losses(batch)
        assert set(out) == {"loss", "text", "rating"}
        pred = (m.user_emb.weight[USERS] * m.item_emb.weight[ITEMS]).sum(-1)
        assert torch.allclose(m.predict_rating(USERS, ITEMS), pred)
        mse = ((pred - RATINGS) ** 2).mean()
        assert float(out["rating"]) == pytest.approx(float(mse), rel=1e-6)
        assert float(out["loss"]) == pytest.approx(0.7 * float(out["text"]) + 0.25 * float(out["rating"]),
                                                   rel=1e-6)
        # the same text loss as without a rating head (same seed: same vectors)
        assert float(out["text"]) == pytest.approx(float(plain.losses(batch)["text"]), rel=1e-6)


def test_pepler_rating_regulariser_mlp_head(tiny_dir, voc):
    m = pepler(tiny_dir, voc, rating_reg=1.0, rating_head="mlp")
    hidden = m.hidden
    linears = [layer for layer in m.mlp if isinstance(layer, nn.Linear)]
    assert [tuple(layer.weight.shape) for layer in linears] == [(400, 2 * hidden), (400, 400), (1, 400)]  # the original MLP, num_layers=2
    with torch.no_grad():
        assert all(float(layer.bias.abs().sum()) == 0 and float(layer.weight.abs().max()) <= 0.1 for layer in linears)
    pred = m.predict_rating(USERS, ITEMS)
    assert pred.shape == (len(USERS),)
    with torch.no_grad():
        manual = m.mlp(torch.cat([m.user_emb.weight[USERS], m.item_emb.weight[ITEMS]], -1))[:, 0]
        assert torch.allclose(pred, manual)
        out = m.losses(text_batch(voc))
        assert float(out["rating"]) == pytest.approx(float(((manual - RATINGS) ** 2).mean()), rel=1e-6)
        assert float(out["loss"]) == pytest.approx(float(out["text"]) + float(out["rating"]), rel=1e-6)
    # in sequential phase 0 the rating head trains with the prompt vectors, the LM does not
    m.enter_phase(0)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {"user_emb.weight", "item_emb.weight"} | {f"mlp.{n}" for n, _ in m.mlp.named_parameters()}
    with pytest.raises(ValueError, match="rating_head"):
        pepler(tiny_dir, voc, rating_reg=1.0, rating_head="gbdt")


# --- XRec: the prompt -------------------------------------------------------------------------

def _captured_lm_input(model, user, item):
    """The inputs_embeds, attention mask and positions the LM receives when `begin` runs."""
    seen = {}

    def grab(module, args, kwargs):
        if "prompt" not in seen:
            seen["prompt"] = {k: kwargs[k].detach().clone() for k in ("inputs_embeds", "attention_mask",
                                                                     "position_ids")}

    handle = model.lm.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model.begin(user, item, torch.zeros(len(user)))
    finally:
        handle.remove()
    return seen["prompt"]


def test_xrec_prompt_template_slots_and_profiles(tiny_dir, voc, profiles):
    xm = xrec(tiny_dir, voc, profiles)
    tok = voc.tokenizer
    user_text = profiles[0]
    ids, pu, pi = xm.row_ids(3, 1)
    assert tok.decode(ids[:pu]).endswith("User record: ")
    assert tok.decode(ids[pu + 1:pi]) == "\nItem record: "
    assert ids[pu] == ids[pi] == xm.eos_lm  # the reserved positions' id (their embeddings are replaced)
    rest = ids[pi + 1:]
    n = len(user_text[3])
    start = next(k for k in range(len(rest)) if rest[k:k + n] == user_text[3])
    assert tok.decode(rest[:start]) == "\nUser profile: "
    # the prompt ends with the chat template's assistant header, whose last token BOS stands for
    assert tok.decode([*ids, xm.bos_lm]).endswith("<|im_start|>assistant\n")
    assert xm.to_lm(torch.tensor([BOS])).item() == xm.bos_lm
    lengths = xm.prompt_lengths(USERS, ITEMS)
    assert lengths == [len(xm.row_ids(u, i)[0]) for u, i in zip(USERS.tolist(), ITEMS.tolist())]
    assert len(set(lengths)) > 1  # the rows really have different lengths


def test_xrec_adapter_outputs_replace_the_reserved_positions(tiny_dir, voc, profiles):
    xm = xrec(tiny_dir, voc, profiles).eval()
    with torch.no_grad():
        got = _captured_lm_input(xm, USERS, ITEMS)
        embeds, mask, positions = got["inputs_embeds"], got["attention_mask"], got["position_ids"]
        vec_u = xm.user_adapter(xm.collab_user[USERS])
        vec_i = xm.item_adapter(xm.collab_item[ITEMS])
        table = xm.lm.get_input_embeddings().weight
        width = max(xm.prompt_lengths(USERS, ITEMS))
        assert embeds.shape == (len(USERS), width, xm.hidden)
        for r, (u, i) in enumerate(zip(USERS.tolist(), ITEMS.tolist())):
            ids, pu, pi = xm.row_ids(u, i)
            pad = width - len(ids)
            # left padding: masked out, positions counted over real tokens only
            assert mask[r].tolist() == [0] * pad + [1] * len(ids)
            assert positions[r, pad:].tolist() == list(range(len(ids)))
            assert torch.equal(embeds[r, pad + pu], vec_u[r])
            assert torch.equal(embeds[r, pad + pi], vec_i[r])
            assert not torch.equal(vec_u[r], table[ids[pu]])  # really replaced
            others = [j for j in range(len(ids)) if j not in (pu, pi)]
            assert torch.equal(embeds[r, [pad + j for j in others]], table[[ids[j] for j in others]])
        assert int((mask == 0).sum()) > 0


def test_kv_share_by_hand():
    vec = torch.arange(1.0, 33.0)[None].repeat(2, 1)
    vec[1] *= -1
    assert kv_share(vec, 32, 8) is vec  # no grouped-query attention: the identity
    out = kv_share(vec, 16, 8)  # 4 query heads of 8, 2 kv heads: heads (0,1) -> 0, (2,3) -> 1
    expect = torch.cat([(vec[:, 0:8] + vec[:, 8:16]) / 2, (vec[:, 16:24] + vec[:, 24:32]) / 2], 1)
    assert torch.equal(out, expect)
    assert out[0, 0] == (1 + 9) / 2 and out[0, 8] == (17 + 25) / 2 and out[1, 15] == -(24 + 32) / 2
    quarter = kv_share(vec, 8, 8)  # one kv head for all four query heads
    assert torch.allclose(quarter, vec.reshape(2, 4, 8).mean(1))


class _Recorder:
    """Forward hooks (registered after XRec's, so they see its result) keeping every
    q/k/v projection's input and final output."""

    def __init__(self, lm):
        self.calls: list[tuple[str, nn.Linear, torch.Tensor, torch.Tensor]] = []
        self.handles = []
        for name, module in lm.named_modules():
            if name.endswith(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")):
                self.handles.append(module.register_forward_hook(self._grab(name)))
        assert len(self.handles) == 6  # 2 layers x q, k, v

    def _grab(self, name):
        def hook(module, inputs, output):
            self.calls.append((name, module, inputs[0].detach().clone(), output.detach().clone()))
        return hook

    def deltas(self):
        """(name, output - plain projection of its input) per call."""
        return [(name, out - nn.functional.linear(x, m.weight, m.bias)) for name, m, x, out in self.calls]

    def remove(self):
        for h in self.handles:
            h.remove()


def _slots(xm, user, item):
    width = max(xm.prompt_lengths(user, item))
    pos_u, pos_i = [], []
    for u, i in zip(user.tolist(), item.tolist()):
        ids, pu, pi = xm.row_ids(u, i)
        pos_u.append(width - len(ids) + pu)
        pos_i.append(width - len(ids) + pi)
    return pos_u, pos_i


def test_xrec_adds_the_adapter_outputs_to_every_q_k_v_projection_at_the_slots(tiny_dir, voc, profiles):
    xm = xrec(tiny_dir, voc, profiles).eval()
    head_dim = xm.hidden // xm.lm.config.num_attention_heads
    assert {kind for _, kind, _ in xm.projections} == {"q_proj", "k_proj", "v_proj"} and len(xm.projections) == 6
    with torch.no_grad():
        vec_u = xm.user_adapter(xm.collab_user[USERS])
        vec_i = xm.item_adapter(xm.collab_item[ITEMS])
    pos_u, pos_i = _slots(xm, USERS, ITEMS)
    rec = _Recorder(xm.lm)
    try:
        with torch.no_grad():
            state = xm.begin(USERS, ITEMS, RATINGS)
        deltas = rec.deltas()
        assert len(deltas) == 6
        seen_kv_width = set()
        for name, d in deltas:
            width = d.shape[-1]
            if name.endswith("q_proj"):
                assert width == xm.hidden
            else:
                assert width == xm.hidden // 2  # grouped-query attention: 2 kv heads of 4
                seen_kv_width.add(width)
            want_u, want_i = kv_share(vec_u, width, head_dim), kv_share(vec_i, width, head_dim)
            rows = torch.arange(len(USERS))
            assert torch.allclose(d[rows, pos_u], want_u, atol=1e-5), name
            assert torch.allclose(d[rows, pos_i], want_i, atol=1e-5), name
            rest = d.clone()
            rest[rows, pos_u] = 0
            rest[rows, pos_i] = 0
            assert torch.equal(rest, torch.zeros_like(rest)), name  # nothing else touched
        assert seen_kv_width == {xm.hidden // 2}
        # decoding steps after the prompt are not injected
        rec.calls.clear()
        with torch.no_grad():
            xm.step(state, torch.full((len(USERS), 1), BOS))
        assert len(rec.calls) == 6
        assert all(torch.equal(d, torch.zeros_like(d)) for _, d in rec.deltas())
        # teacher forcing injects at the same positions (the prompt comes first)
        rec.calls.clear()
        with torch.no_grad():
            xm.losses(text_batch(voc))
        for name, d in rec.deltas():
            want = kv_share(vec_u, d.shape[-1], head_dim)
            assert torch.allclose(d[torch.arange(len(USERS)), pos_u], want, atol=1e-5), name
        assert xm._active is None  # the injection ends with the forward pass
    finally:
        rec.remove()


def test_xrec_without_layer_injection_only_replaces_the_inputs(tiny_dir, voc, profiles):
    with_inj = xrec(tiny_dir, voc, profiles).eval()
    without = xrec(tiny_dir, voc, profiles, inject_layers=False).eval()
    assert without.projections == []
    sd = with_inj.state_dict()
    assert all(torch.equal(v, without.state_dict()[k]) for k, v in sd.items())  # same adapters
    rec = _Recorder(without.lm)
    try:
        with torch.no_grad():
            got = _captured_lm_input(without, USERS, ITEMS)
            vec_u = without.user_adapter(without.collab_user[USERS])
        assert len(rec.calls) == 6
        assert all(torch.equal(d, torch.zeros_like(d)) for _, d in rec.deltas())
    finally:
        rec.remove()
    pos_u, _ = _slots(without, USERS, ITEMS)
    assert torch.equal(got["inputs_embeds"][torch.arange(len(USERS)), pos_u], vec_u)
    with torch.no_grad():  # and the injection does change what the model predicts
        a = with_inj.step(with_inj.begin(USERS, ITEMS, RATINGS), torch.full((len(USERS), 1), BOS))[0]
        b = without.step(without.begin(USERS, ITEMS, RATINGS), torch.full((len(USERS), 1), BOS))[0]
    finite = torch.isfinite(a)
    assert not torch.allclose(a[finite], b[finite], atol=1e-4)


# --- XRec: training -------------------------------------------------------------------------

def test_xrec_trains_only_the_adapters(tiny_dir, voc, profiles):
    cls = generator_class("xrec")
    assert cls.n_phases(cls.DEFAULTS) == 1
    xm = xrec(tiny_dir, voc, profiles)
    for phase in (0, 1):
        xm.enter_phase(phase)
        trainable = {n for n, p in xm.named_parameters() if p.requires_grad}
        assert trainable and all(n.startswith(("user_adapter.", "item_adapter.")) for n in trainable)
        assert {n for n, _ in xm.named_parameters() if not n.startswith("lm.")} == trainable
    xm.train()
    assert not xm.lm.training and xm.user_adapter.training
    lm0 = lm_copy(xm)
    ad0 = {k: v.clone() for k, v in xm.state_dict().items()}
    train_steps(xm, text_batch(voc), steps=3, lr=1e-2, name="adam")
    assert_lm_unchanged(xm, lm0)
    assert all(p.grad is None for p in xm.lm.parameters())
    sd = xm.state_dict()
    assert not any(k.startswith("lm.") for k in sd)
    assert not any(k.startswith("collab_") for k in sd)  # the data is not part of the checkpoint
    assert not torch.equal(sd["user_adapter.weight"], ad0["user_adapter.weight"])
    assert not torch.equal(sd["item_adapter.weight"], ad0["item_adapter.weight"])
    # a fresh model restored from it predicts the same
    fresh = xrec(tiny_dir, voc, profiles, seed=3)
    fresh.load_state_dict(sd)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh.losses(text_batch(voc))["loss"], xm.losses(text_batch(voc))["loss"])


# --- decoding ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["pepler", "xrec"])
def model(request, tiny_dir, voc, profiles):
    if request.param == "pepler":
        m = pepler(tiny_dir, voc, seed=4)
    else:
        m = xrec(tiny_dir, voc, profiles, seed=4)
        with torch.no_grad():  # gates that depend on the input (they start at zero)
            for ad in (m.user_adapter, m.item_adapter):
                ad.w_gate.normal_(0, 1.0)
                ad.weight.mul_(20)
    return m.eval()


def test_greedy_on_a_batch_equals_greedy_row_by_row(model):
    together = greedy(model, USERS, ITEMS, RATINGS, 8)
    alone = [greedy(model, USERS[r:r + 1], ITEMS[r:r + 1], RATINGS[r:r + 1], 8)[0] for r in range(len(USERS))]
    assert together == alone
    assert any(together) and len({tuple(t) for t in together}) > 1  # rows really differ
    banned = {i + OFFSET for i in model.tokenizer.all_special_ids}
    for words in together:
        assert len(words) <= 8 and all(OFFSET <= w < model.vocab_size and w not in banned for w in words)


def test_step_log_probs_of_a_batch_equal_each_row_alone(model):
    """Left padding (XRec) leaves every row's next-word distribution as it is alone."""
    prefix = torch.tensor([[BOS, 40, 50, 60]] * len(USERS))
    with torch.no_grad():
        state = model.begin(USERS, ITEMS, RATINGS)
        batch_logp = []
        for t in range(prefix.shape[1]):
            logp, state = model.step(state, prefix[:, :t + 1])
            batch_logp.append(logp)
        for r in range(len(USERS)):
            st = model.begin(USERS[r:r + 1], ITEMS[r:r + 1], RATINGS[r:r + 1])
            for t in range(prefix.shape[1]):
                logp, st = model.step(st, prefix[r:r + 1, :t + 1])
                a, b = batch_logp[t][r], logp[0]
                assert torch.equal(torch.isfinite(a), torch.isfinite(b))
                assert torch.allclose(a[torch.isfinite(a)], b[torch.isfinite(b)], atol=1e-4), (r, t)


def test_kv_cached_steps_equal_a_full_rerun_without_cache(model):
    prefix = torch.tensor([[BOS, 40, 50, 60, 70]] * len(USERS))
    with torch.no_grad():
        state = model.begin(USERS, ITEMS, RATINGS)
        cached = []
        for t in range(prefix.shape[1]):
            logp, state = model.step(state, prefix[:, :t + 1])
            cached.append(logp)
        for r in range(len(USERS)):
            u, i, rt = USERS[r:r + 1], ITEMS[r:r + 1], RATINGS[r:r + 1]
            p = model.prompt(u, i, rt)  # one row: no padding
            assert int(p.mask.sum()) == p.mask.shape[1]
            words = model.lm.get_input_embeddings()(model.to_lm(prefix[r:r + 1]))
            with model.inject(p):
                out = model.lm(inputs_embeds=torch.cat([p.embeds, words], 1), use_cache=False)
            logits = out.logits[0, p.embeds.shape[1]:, : model.n_lm].float()
            ref = logits.log_softmax(-1)
            for t in range(prefix.shape[1]):
                got = cached[t][r]
                lm_part = got[OFFSET:]
                finite = torch.isfinite(lm_part)
                assert torch.allclose(lm_part[finite], ref[t][finite], atol=1e-4), (r, t)
                assert float(got[EOS]) == pytest.approx(float(ref[t][model.eos_lm]), abs=1e-4)
                assert not finite[model.tokenizer.all_special_ids].any()
                assert int((~finite).sum()) == len(set(model.tokenizer.all_special_ids))
                assert torch.isinf(got[[PAD, BOS, 3]]).all()


def test_stepwise_scores_equal_teacher_forcing(model, voc):
    batch = text_batch(voc)
    with torch.no_grad():
        assert stepwise_nll(model, batch) == pytest.approx(float(model.losses(batch)["text"]), abs=1e-4)


def test_beam_gives_valid_words_and_a_batch_equals_its_rows(model):
    together = beam(model, USERS, ITEMS, RATINGS, 6, beam_size=3)
    alone = [beam(model, USERS[r:r + 1], ITEMS[r:r + 1], RATINGS[r:r + 1], 6, beam_size=3)[0]
             for r in range(len(USERS))]
    assert together == alone
    banned = {i + OFFSET for i in model.tokenizer.all_special_ids}
    for words in together:
        assert len(words) <= 6 and all(OFFSET <= w < model.vocab_size and w not in banned for w in words)


# --- MoEAdapter -------------------------------------------------------------------------------

def test_moe_adapter_gates_mixture_and_noise():
    torch.manual_seed(0)
    ad = MoEAdapter(8, 16, n_experts=4, dropout=0.0)
    x = torch.randn(5, 8)
    ad.eval()
    g = ad.gates(x)
    assert g.shape == (5, 4) and torch.allclose(g, torch.full((5, 4), 0.25))  # zero gate: uniform
    with torch.no_grad():
        ad.w_gate.normal_()
        ad.w_noise.normal_()
        ad.bias.normal_()
    g = ad.gates(x)
    assert torch.allclose(g.sum(-1), torch.ones(5), atol=1e-6) and (g >= 0).all()
    assert not torch.allclose(g, torch.full((5, 4), 0.25))
    y = ad(x)
    assert y.shape == (5, 16) and torch.equal(y, ad(x))  # eval: deterministic
    manual = sum(g[:, e, None] * ((x - ad.bias[e]) @ ad.weight[e]) for e in range(4))
    assert torch.allclose(y, manual, atol=1e-6)
    ad.train()  # noisy gating in training
    g1, g2 = ad.gates(x), ad.gates(x)
    assert torch.allclose(g1.sum(-1), torch.ones(5), atol=1e-6)
    assert not torch.allclose(g1, g2) and not torch.equal(ad(x), ad(x))
    quiet = MoEAdapter(8, 16, n_experts=4, dropout=0.0, noisy=False)
    quiet.load_state_dict(ad.state_dict())
    quiet.train()
    assert torch.equal(quiet(x), y)  # without noise (and dropout) training = eval
    dropped = MoEAdapter(8, 16, n_experts=4, dropout=0.5, noisy=False).train()
    assert not torch.equal(dropped(x), dropped(x))
    dropped.eval()
    assert torch.equal(dropped(x), dropped(x))
