"""The cluster job's encoders given as URIs reach its embedding and pair-scoring stages as
the URIs (each actor copies them on its own node): the driver copies only what it reads
to check (the pair scorer's kind, when asked to detect it), never the embedders."""
from __future__ import annotations

from rexeval.models import fetch
from rexeval.pipelines.paraphrase.config import ClusterConfig
from rexeval.pipelines.paraphrase.pipeline import resolve_encoders
from rexeval.storage import location
from tests.doubles.tiny_encoders import build_tiny_bert


def test_the_encoders_reach_the_stages_as_uris(s3_root, tmp_path):
    embedder, cross, quality = (f"{s3_root}/models/{name}" for name in ("embedder", "cross", "quality"))
    location(embedder).upload(build_tiny_bert(tmp_path / "embedder", 1))
    location(cross).upload(build_tiny_bert(tmp_path / "cross", 2))
    location(quality).upload(build_tiny_bert(tmp_path / "quality", 1))
    cfg = ClusterConfig(input=str(tmp_path), out=str(tmp_path / "out"), quality_embedder=quality,
                        models={"embedder": embedder, "cross_encoder": cross})
    enc = resolve_encoders(cfg)
    assert (enc["embedder_location"], enc["cross_location"], enc["quality_location"]) == (embedder, cross, quality)
    assert enc["cross_kind"] == "cross_encoder"  # read from the driver's copy of the pair scorer
    assert fetch.fetched(embedder) is None and fetch.fetched(quality) is None
