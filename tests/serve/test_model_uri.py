"""The NLI app's model as a URI: the driver only checks it exists (a missing one is
refused before Serve starts, naming it), and the replica copies it to its own node and
answers as the same checkpoint loaded from a local folder."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from rexeval.models import fetch
from rexeval.models.refs import ModelUnavailable
from rexeval.storage import location
from rexeval.serve.nli import NLIServeConfig, ServeNLIClient, start_nli_service
from tests.doubles.ports import free_port



def test_missing_model_uri_is_refused_before_serve_starts(s3_root, monkeypatch):
    from rexeval.serve import nli

    uri = f"{s3_root}/no-model"
    monkeypatch.setattr(nli.serve, "start", lambda *a, **k: pytest.fail("Serve started"))
    with pytest.raises(ModelUnavailable, match=f"model URI {uri} not found"):
        start_nli_service(NLIServeConfig(model=uri))


@pytest.mark.slow
def test_nli_replica_loads_a_model_uri_on_its_node(ray_session, s3_root, tiny_nli, monkeypatch):
    from ray import serve

    from rexeval.models.encoders.nli import NLIScorer

    uri = f"{s3_root}/models/tiny-nli"
    location(uri).upload(tiny_nli)
    # The driver (this process) must not copy the model: only the replica does.
    monkeypatch.setattr(fetch, "fetch", lambda *a, **k: pytest.fail("the driver fetched the model"))
    serve.shutdown()
    try:
        handle = start_nli_service(NLIServeConfig(model=uri, max_batch_pairs=4), port=free_port())
        premises, hypotheses = ["the strings are bright", "it is cheap"], ["the product is loud", "it is not"]
        local = NLIScorer(str(tiny_nli), device="cpu").score(premises, hypotheses)
        np.testing.assert_allclose(ServeNLIClient(handle).score(premises, hypotheses), local, atol=1e-5)
        assert handle.info.remote().result()["model"] == uri
        # The replica ran on this machine, so its node's copy is the one this process would use.
        assert fetch.fetched(uri) is not None
    finally:
        serve.shutdown()
        shutil.rmtree(fetch.fetched_dir(uri), ignore_errors=True)
