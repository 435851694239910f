"""Profiles: loading, per-role overrides, and loud failures for missing roles."""
import pytest

from rexeval.models.profiles import (
    ROLES,
    ModelUnavailable,
    ProfileError,
    available_profiles,
    load_profile,
    parse_overrides,
)


def test_both_profiles_define_every_role():
    assert set(available_profiles()) >= {"paper", "local"}
    for name in ("paper", "local"):
        assert set(load_profile(name).roles()) == set(ROLES)


def test_paper_profile_models():
    p = load_profile("paper")
    assert p.llm_backend == "vllm"
    assert p.ref("llm") == "meta-llama/Llama-3.1-8B-Instruct"
    assert p.ref("nli") == "microsoft/deberta-large-mnli"
    assert p.ref("embedder") == "Qwen/Qwen3-Embedding-0.6B"
    assert p.ref("cross_encoder") == "Qwen/Qwen3-Reranker-0.6B"
    assert p.ref("bertscore_model") == "roberta-large"
    assert p.resolve("nli", prepare=False).kind == "hub"


def test_local_profile_models():
    p = load_profile("local")
    assert p.llm_backend == "hf"
    assert p.ref("llm") == "SmolLM2-135M-Instruct"
    assert p.ref("embedder") == p.ref("bertscore_model") == "all-MiniLM-L6-v2"
    assert p.bertscore_num_layers == 6
    assert p.ref("nli") is None and p.ref("cross_encoder") is None
    assert p.resolve("embedder").kind == "package"


def test_require_on_local_nli_says_what_to_do():
    with pytest.raises(ModelUnavailable) as exc:
        load_profile("local").require("nli")
    msg = str(exc.value)
    assert "'local'" in msg and "'nli'" in msg and "--model nli=/path/to/checkpoint" in msg


def test_overrides_replace_single_roles(tmp_path):
    p = load_profile("local", {"nli": str(tmp_path), "llm": "org/other-llm"})
    assert p.require("nli") == str(tmp_path)
    assert p.resolve("nli").kind == "path"
    assert p.ref("llm") == "org/other-llm"
    assert p.ref("embedder") == "all-MiniLM-L6-v2"  # untouched
    assert set(p.overridden) == {"nli", "llm"}


def test_override_to_none_clears_a_role():
    p = load_profile("paper", {"cross_encoder": None})
    with pytest.raises(ModelUnavailable, match="'paper'.*'cross_encoder'"):
        p.require("cross_encoder")


def test_overriding_bertscore_model_resets_layers():
    assert load_profile("local", {"bertscore_model": "roberta-large"}).bertscore_num_layers is None
    p = load_profile("local", {"bertscore_model": "roberta-large", "bertscore_num_layers": "17"})
    assert p.bertscore_num_layers == 17


def test_backend_override_is_validated():
    assert load_profile("paper", {"llm_backend": "hf"}).llm_backend == "hf"
    with pytest.raises(ProfileError, match="llm_backend"):
        load_profile("paper", {"llm_backend": "tensorrt"})


def test_unknown_profile_lists_valid_ones():
    with pytest.raises(ProfileError, match=r"unknown profile 'laptop'.*paper.*local"):
        load_profile("laptop")


def test_unknown_role_lists_valid_ones():
    with pytest.raises(ProfileError, match=r"unknown model role 'nlii'.*nli"):
        load_profile("local", {"nlii": "/x"})
    with pytest.raises(ProfileError, match="valid roles"):
        load_profile("local").require("reranker")


def test_parse_overrides():
    assert parse_overrides(["nli=/x", "llm = y", "cross_encoder=none", "embedder=a=b"]) == {
        "nli": "/x", "llm": "y", "cross_encoder": None, "embedder": "a=b"}
    assert parse_overrides([]) == {}


@pytest.mark.parametrize("bad, match", [
    (["nli"], "ROLE=REF"),
    (["reranker=/x"], "unknown model role 'reranker'"),
    (["nli="], "no value"),
    (["nli=/a", "nli=/b"], "twice"),
])
def test_parse_overrides_errors(bad, match):
    with pytest.raises(ProfileError, match=match):
        parse_overrides(bad)


def test_questeval_bertscore_layer_is_a_setting_reset_with_its_checkpoint():
    assert load_profile("paper").questeval_bertscore_num_layers == 9  # published QuestEval's layer
    assert load_profile("local").questeval_bertscore_num_layers is None
    p = load_profile("paper", {"questeval_bertscore": "/ckpt/other-bert"})
    assert p.questeval_bertscore_num_layers is None  # layer 9 belonged to the paper's checkpoint
    assert p.bertscore_num_layers == 17  # the other layer setting is untouched
    p = load_profile("local", {"questeval_bertscore": "/ckpt/bert", "questeval_bertscore_num_layers": "4"})
    assert p.questeval_bertscore_num_layers == 4
    assert load_profile("paper", {"questeval_bertscore_num_layers": "none"}).questeval_bertscore_num_layers is None
    with pytest.raises(ProfileError, match="questeval_bertscore_num_layers must be an integer"):
        load_profile("paper", {"questeval_bertscore_num_layers": "nine"})
