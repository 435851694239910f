"""Encoders: seed 002's paraphrase clustering (a bi-encoder and a pair scorer) and the
NLI engine of seed 000's factuality metrics.

The bi-encoder (`Embedder`, role `embedder`) turns statements into unit vectors so that
candidate paraphrase pairs can be found by cosine similarity at scale (also on GPUs
through `build_vllm_embed_processor`); the pair scorer (`PairScorer`, role
`cross_encoder`) then reads both statements of a candidate pair together and gives the
probability that they are paraphrases. The NLI engine (`NLIScorer`, role `nli`) gives
P(entailment, neutral, contradiction) per (premise, hypothesis) pair; both pair models
share the batching of `pair_batching.py`. The models behind seed 000's other model-based
metrics live here too (their maths is in `metrics/`): AlignScore (`alignscore.py`),
BERTScore's (`bertscore_model.py`), BARTScore's and BLEURT's (`bart_bleurt.py`),
QuestEval's T5s (`seq2seq.py`) and SummaC-Conv's trained head (`summac_head.py`). Torch, transformers and sentence-transformers are
imported only when a model is built, and vLLM never on this side.
"""
from rexeval.models.encoders.embedder import (  # noqa: F401
    DEFAULT_EMBED_ENGINE_KWARGS,
    Embedder,
    build_embedder,
    build_vllm_embed_processor,
    vllm_embed_processor_config,
)
from rexeval.models.encoders.nli import (  # noqa: F401
    CON,
    ENT,
    NEU,
    NLIScorer,
    build_nli,
)
from rexeval.models.encoders.pair_batching import BatchStats  # noqa: F401
from rexeval.models.encoders.pair_scorer import (  # noqa: F401
    PAIR_SCORERS,
    CrossEncoderScorer,
    PairScorer,
    RerankerLLMScorer,
    build_pair_scorer,
    detect_pair_scorer_kind,
    register_pair_scorer,
)
