"""The bi-encoder on the real packaged MiniLM, and the vLLM embed plan inspected on CPU."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from rexeval.models.encoders.embedder import (
    DEFAULT_EMBED_ENGINE_KWARGS,
    ERROR_COLUMN,
    Embedder,
    build_embedder,
    build_vllm_embed_processor,
    from_embed_row,
    l2_normalise,
    resolve_device,
    to_embed_row,
    vllm_embed_processor_config,
)

TEXTS = [
    "the product is very loud",
    "the product makes a lot of noise",
    "the product ships with a spare set of strings and a cleaning cloth in the box",
    "the battery lasts about six hours",
]


@pytest.fixture(scope="module")
def embedder(minilm_location) -> Embedder:
    return build_embedder("all-MiniLM-L6-v2", device="cpu")


def test_shape_dtype_unit_norm(embedder):
    assert embedder.dim == 384 and embedder.device == "cpu"
    assert embedder.model_ref == "all-MiniLM-L6-v2"
    out = embedder.encode(TEXTS)
    assert out.shape == (4, 384) and out.dtype == np.float32
    assert np.abs(np.linalg.norm(out, axis=1) - 1.0).max() < 1e-6


def test_paraphrases_are_closer_than_unrelated(embedder):
    loud, noise, _, battery = embedder.encode(TEXTS)
    assert float(loud @ noise) > float(loud @ battery) + 0.2


def test_deterministic_and_independent_of_batching(embedder):
    a = embedder.encode(TEXTS, batch_size=4)
    assert np.array_equal(a, embedder.encode(TEXTS, batch_size=4))
    one_by_one = np.stack([embedder.encode([t], batch_size=1)[0] for t in TEXTS])
    np.testing.assert_allclose(a, one_by_one, atol=1e-5)
    shuffled = embedder.encode(TEXTS[::-1], batch_size=2)[::-1]  # order is restored
    np.testing.assert_allclose(a, shuffled, atol=1e-5)


def test_prompt_is_opt_in_and_inputs_checked(embedder):
    plain = embedder.encode(TEXTS[:1])
    assert not np.allclose(plain, embedder.encode(TEXTS[:1], prompt="query: "))
    assert embedder.encode([]).shape == (0, 384)
    with pytest.raises(TypeError, match="sequence of strings"):
        embedder.encode("one string")
    with pytest.raises(TypeError, match="item 1"):
        embedder.encode(["ok", 3])


def test_helpers(monkeypatch):
    out = l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float64))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"


# --- vLLM embed processor: plan only, no vLLM on CPU -----------------------------------

def test_embed_config(tiny_bert):
    model = str(tiny_bert[1])
    cfg = vllm_embed_processor_config(model, engine_kwargs={"gpu_memory_utilization": 0.3})
    assert cfg.task_type == "embed" and cfg.engine_kwargs["task_type"] == "embed"
    assert cfg.model_source == model and cfg.batch_size == 256 and cfg.concurrency == 1
    assert cfg.engine_kwargs["max_model_len"] == DEFAULT_EMBED_ENGINE_KWARGS["max_model_len"]
    assert cfg.engine_kwargs["gpu_memory_utilization"] == 0.3
    assert cfg.chat_template_stage is False and cfg.detokenize_stage is False
    cfg = vllm_embed_processor_config(model, batch_size=8, concurrency=[1, 3],
                                      engine_kwargs={"max_model_len": 128})
    assert cfg.batch_size == 8 and cfg.concurrency == (1, 3)
    assert cfg.engine_kwargs["max_model_len"] == 128
    assert "vllm" not in sys.modules


def test_embed_processor_plan_without_vllm(tiny_bert, ray_session):
    model = str(tiny_bert[1])
    proc = build_vllm_embed_processor(model, batch_size=16, concurrency=2,
                                      engine_kwargs={"max_model_len": 256})
    assert proc.processor.list_stage_names() == ["TokenizeStage", "vLLMEngineStage"]
    engine = proc.processor.get_stage_by_name("vLLMEngineStage")
    kw = engine.fn_constructor_kwargs
    assert kw["model"] == model and kw["task_type"] == "embed" and kw["batch_size"] == 16
    assert kw["engine_kwargs"]["task_type"] == "embed"
    assert kw["engine_kwargs"]["max_model_len"] == 256
    assert kw["should_continue_on_error"] is True
    mb = engine.map_batches_kwargs
    assert mb["num_gpus"] == 1
    assert (mb["compute"].min_size, mb["compute"].max_size) == (1, 2)
    assert proc.processor.get_stage_by_name("TokenizeStage").fn_constructor_kwargs["model"] == model

    # preprocess: the statement becomes the prompt; the index column rides along.
    data = proc.processor.preprocess({"row": 7, "statement": "the product is loud"})["__data"]
    assert data["prompt"] == "the product is loud" and data["row"] == 7

    # postprocess: unit float32 embedding + index; failed rows end with the same columns.
    ok = proc.finish(proc.processor.postprocess({"__data": {
        "row": 7, "statement": "s", "prompt": "s", "embeddings": np.array([3.0, 4.0], dtype=np.float32),
        "num_input_tokens": 3}}))
    assert set(ok) == {"row", "embedding", "error"} and ok["row"] == 7 and ok["error"] is None
    assert ok["embedding"].dtype == np.float32
    np.testing.assert_allclose(ok["embedding"], [0.6, 0.8], atol=1e-7)
    # (Ray gives an engine-failed row to the output as it is, internal columns and all.)
    bad = proc.finish({"row": 9, "prompt": "s", "embeddings": None, ERROR_COLUMN: "ValueError: too long"})
    assert bad == {"row": 9, "embedding": None, "error": "ValueError: too long"}
    assert "vllm" not in sys.modules


def test_embed_rows_with_prompt_and_custom_columns():
    assert to_embed_row({"text": "a b"}, text_column="text", prompt="p: ") == {"prompt": "p: a b"}
    out = from_embed_row({"idx": 1, "embeddings": [[0.0, 2.0]]}, index_column="idx")
    assert out["idx"] == 1 and out["embedding"].tolist() == [0.0, 1.0]
    assert from_embed_row({"row": 2})["error"] == "no embedding from the vLLM engine"


@pytest.mark.slow
def test_an_actor_loads_a_model_uri_from_its_own_nodes_checked_copy(tiny_bert, s3_root, ray_session, tmp_path,
                                                                    monkeypatch):
    """The driver ships the URI (the vLLM embed plan keeps it as its source, nothing is
    copied here); a Ray worker with a models cache of its own (another node's disk) copies
    it there and encodes as the local folder does; a copy damaged on that node is copied
    again before it is loaded."""
    import ray

    from rexeval.models import fetch
    from rexeval.storage import location

    src = tiny_bert[1]
    uri = f"{s3_root}/models/tiny-embedder"
    location(uri).upload(src)
    monkeypatch.setattr(fetch, "fetch", lambda *a, **k: pytest.fail("the driver copied the model"))
    assert vllm_embed_processor_config(uri).model_source == uri
    node = tmp_path / "other-node"

    @ray.remote(runtime_env={"env_vars": {"REXEVAL_CACHE": str(node)}})
    def encode(where: str):
        from rexeval.models.encoders.embedder import Embedder

        model = Embedder(where, device="cpu")
        return model.location, model.model_ref, model.encode(TEXTS)

    at, ref, vectors = ray.get(encode.remote(uri))
    copy = fetch.fetched_dir(uri, node / "models")
    assert (at, ref) == (str(copy), uri)
    np.testing.assert_allclose(vectors, Embedder(str(src), device="cpu").encode(TEXTS), atol=1e-6)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short on that node's disk
    at, _, again = ray.get(encode.remote(uri))
    assert at == str(copy) and weights.stat().st_size == (src / "model.safetensors").stat().st_size
    np.testing.assert_allclose(again, vectors, atol=1e-6)
