"""The NLI Serve deployment on 127.0.0.1: batched answers equal in-process scoring, bad
requests get 4xx, a burst beyond capacity gets 503s and the service keeps answering."""
from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from rexeval.serve.nli import (
    NLIServeConfig,
    RequestError,
    ServeLimits,
    ServeNLIClient,
    parse_pairs,
    start_nli_service,
)
from tests.doubles.nli import scripted_probs
from tests.doubles.ports import free_port



# -- request validation (no Serve) ---------------------------------------------------


def test_parse_pairs_limits_and_shapes():
    lim = ServeLimits(max_body_bytes=200, max_pairs=2, max_chars=10)
    assert parse_pairs(b'{"pairs": [["a b", "c"]]}', lim) == [("a b", "c")]
    cases = [(b"{not json", 400), (b'{"pairs": "x"}', 422), (b'[1, 2]', 422),
             (b'{"pairs": [["a"]]}', 422), (b'{"pairs": [["a", 3]]}', 422),
             (b'{"pairs": [["a","b"],["a","b"],["a","b"]]}', 413),
             (json.dumps({"pairs": [["x" * 11, "y"]]}).encode(), 413), (b" " * 201, 413)]
    for body, status in cases:
        with pytest.raises(RequestError) as err:
            parse_pairs(body, lim)
        assert err.value.status == status, body


# -- the deployment -------------------------------------------------------------------


@pytest.fixture
def serve_app(ray_session):
    from ray import serve

    started = []
    serve.shutdown()  # a Serve left running keeps its old HTTP port; start from a clean state

    def start(cfg: NLIServeConfig):
        port = free_port()
        handle = start_nli_service(cfg, port=port)
        started.append(port)
        return handle, f"http://127.0.0.1:{port}/nli"

    yield start
    serve.shutdown()


@pytest.mark.slow
def test_http_and_handle_answers_equal_in_process_scoring(serve_app, tiny_nli):
    from rexeval.models.encoders.nli import NLIScorer

    cfg = NLIServeConfig(model=str(tiny_nli), max_batch_pairs=8, batch_wait_timeout_s=0.05)
    handle, url = serve_app(cfg)
    pairs = [["the strings are bright", "the product is loud"], ["it is cheap", "it is not cheap"],
             ["a", "b"], ["the case fits", "the case fits well"], ["the strings are bright", "the product is loud"]]
    local = NLIScorer(str(tiny_nli), device="cpu").score([p for p, _ in pairs], [h for _, h in pairs])

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*[client.post(url, json={"pairs": pairs[i:i + 2]})
                                          for i in range(0, len(pairs), 2)])

    answers = asyncio.run(burst())
    got = [row for r in answers for row in r.json()["probs"]]
    assert all(r.status_code == 200 for r in answers)
    np.testing.assert_allclose(got, local, atol=1e-5)
    assert answers[0].json()["labels"] == ["entailment", "neutral", "contradiction"]
    via_handle = handle.score.remote([tuple(p) for p in pairs]).result()
    np.testing.assert_allclose(via_handle, local, atol=1e-5)
    client = ServeNLIClient(handle, chunk=2)
    np.testing.assert_allclose(client.score([p for p, _ in pairs], [h for _, h in pairs]), local, atol=1e-5)
    # Requests larger than one batch (8 pairs) are split inside the replica, over HTTP
    # and through the client's default 256-pair chunks.
    many = pairs * 5
    local_many = np.concatenate([local] * 5)
    big = httpx.post(url, json={"pairs": many}, timeout=60)
    assert big.status_code == 200
    np.testing.assert_allclose(big.json()["probs"], local_many, atol=1e-5)
    np.testing.assert_allclose(ServeNLIClient(handle).score([p for p, _ in many], [h for _, h in many]),
                               local_many, atol=1e-5)
    bad = httpx.post(url, content=b"{oops", timeout=30)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]
    big = httpx.post(url, json={"pairs": [["a", "b"]] * (cfg.limits.max_pairs + 1)}, timeout=30)
    assert big.status_code == 413


@pytest.mark.slow
def test_overload_gets_503_then_service_recovers(serve_app):
    cfg = NLIServeConfig(model=".", scorer="tests.doubles.nli:ScriptedNLI", scorer_options={"delay_s": 0.5},
                         max_ongoing_requests=1, max_queued_requests=1, max_batch_pairs=1)
    _, url = serve_app(cfg)
    body = {"pairs": [["the case fits well", "the case fits"]]}

    async def burst(n):
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*[client.post(url, json=body) for _ in range(n)])

    codes = [r.status_code for r in asyncio.run(burst(12))]
    assert codes.count(503) >= 1 and codes.count(200) >= 1
    assert set(codes) <= {200, 503}
    after = httpx.post(url, json=body, timeout=60)
    assert after.status_code == 200
    assert after.json()["probs"][0] == pytest.approx(scripted_probs(*body["pairs"][0]))
