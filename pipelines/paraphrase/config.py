"""Settings of `rexeval cluster` (seed 002's STAR clustering, or the EXTRA baseline)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rexeval.models.profiles import ModelOverrides
from rexeval.pipelines.core.outputs import REPORT_OUTPUT, Output, Outputs, table_outputs
from rexeval.pipelines.core.read_paths import ReadPath
from rexeval.pipelines.paraphrase.shards import INDEX_SHARD_GIB
from rexeval.pipelines.core.stage import CPUS_PER_WORKER, MEMORY_PER_WORKER

# What `rexeval cluster` writes in its folder (pipelines/core/outputs.py); `statements`
# only for EXTRA, which makes its own from the review sentences.
CLUSTER_OUTPUTS = table_outputs("clusters", "canonical", "errors", "statements") | Outputs(
    report=Output(REPORT_OUTPUT, "seed 002's Table 3 numbers, the size histogram, examples"),
    report_md=Output("report.md", "the same as Markdown"),
    sizes=Output("cluster_sizes.csv", "clusters and statements per cluster size"),
    sizes_figure=Output("cluster_sizes.png", "the size histogram"),
    work=Output("_work", "nodes, embeddings, pairs and pair scores (resumable work files)", folder=True),
)



class ClusterConfig(BaseModel):
    """Settings of `rexeval cluster` (YAML keys = these names)."""

    model_config = ConfigDict(extra="forbid")

    input: ReadPath = Field(description="`rexeval extract` folder or a statements table (Parquet, CSV, TSV or "
                            "JSON lines, gzipped or not); for --method extra also an `rexeval ingest` folder / "
                            "reviews table")
    out: str = Field(description="output folder")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "statements or reviews table (e.g. {statement: text})")
    method: Literal["star", "extra"] = "star"
    stage: Literal["auto", "triplet", "candidate", "verified"] = Field(
        "auto", description="statements to cluster; auto: verified if any exist, else triplet")
    profile: str = "local"
    models: ModelOverrides = Field(default_factory=dict, description="role -> model ref")
    bi_encoder_only: bool = Field(False, description="skip the cross-encoder even if configured")
    k: int = Field(128, ge=1, description="neighbours per statement (seed 002: 128)")
    tau_pair: float = Field(0.90, ge=-1, le=1, description="cosine for a candidate pair")
    cross_threshold: float = Field(0.90, ge=0, le=1, description="pair probability to keep (>)")
    cross_kind: str = Field("auto", description="auto (read the checkpoint), cross_encoder, "
                            "reranker_llm, or package.module:Class of your own PairScorer")
    tau_intra: float = Field(0.85, ge=-1, le=1, description="cohesion below which a component is refined")
    tau_remerge: float = Field(0.90, ge=-1, le=1, description="pivot similarity to merge groups")
    index: Literal["auto", "flat", "ivf", "hnsw"] = "auto"
    nprobe: int | None = Field(None, ge=1)
    device: str = Field("auto", description="encoder device: auto, cpu, cuda")
    embed_backend: Literal["sentence-transformers", "vllm"] = "sentence-transformers"
    embed_batch_size: int = Field(256, ge=1)
    shard_size: int = Field(50_000, ge=1, description="texts (or pairs) per work shard")
    pair_batch_size: int = Field(64, ge=1)
    workers: int = Field(1, ge=1, description="the most encoder and pair-scorer actors (each loads the model)")
    min_workers: int = Field(1, ge=1, description="the fewest of those actors (at most `workers`)")
    cpus_per_worker: float | None = Field(None, gt=0, description=CPUS_PER_WORKER + "; also the threads "
                                          "of the one-process steps (nodes, FAISS, the graph)")
    gpus_per_worker: float = Field(0.0, ge=0)
    memory_per_worker: float | None = Field(None, gt=0, description=MEMORY_PER_WORKER)
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each worker actor asks for, e.g. "
        "{accel: 1} for a node type of the cluster's own; an autoscaler starts that type for them")
    neighbour_workers: int = Field(1, ge=1, description="FAISS index shards at least, each on a Ray actor "
                                   "of its own (1: one index in the step's process)")
    index_shard_gib: float = Field(INDEX_SHARD_GIB, gt=0, description="the most vectors (GiB) one index "
                                   "shard holds: a group needs more shards above it")
    quality_embedder: str | None = Field(None, description="model for SSE/SSB (default: the embedder)")
    examples: int = Field(5, ge=0)
    extra_min_count: int = Field(5, ge=1, description="EXTRA: reviews a sentence must recur in")
    extra_threshold: float = Field(0.9, gt=0, le=1, description="EXTRA: Jaccard to merge")
    extra_ngram: int = Field(2, ge=1)
    extra_num_perm: int = Field(128, ge=16)

    @field_validator("cross_kind")
    @classmethod
    def _cross_kind(cls, v: str) -> str:
        if v not in ("auto", "cross_encoder", "reranker_llm") and ":" not in v:
            raise ValueError("must be auto, cross_encoder, reranker_llm or package.module:Class")
        return v
