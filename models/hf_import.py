"""transformers imported without scikit-learn, for the processes that only load a model.

Any of transformers' Auto classes imports `transformers.generation.candidate_generator`,
which imports `sklearn.metrics` (and so scipy and pandas) when scikit-learn is installed,
for one function (`roc_curve`, used by assisted decoding's confidence threshold, which
rexeval never runs). Every fresh process that loads an LLM pays it: a study's model
actors, judge replicas and trained-generator workers, where nothing else asks for
scikit-learn. Building the `hf` backend on SmolLM2 costs such a process 4.3 s of CPU
through this module against 4.9 s (`benchmarks/bench_model_import.py`; scipy.optimize
still comes, through transformers' loss functions).

transformers supports running without scikit-learn: this imports that one module as if
scikit-learn were absent, so that module alone does without it (assisted decoding with a
confidence threshold then says scikit-learn is missing); everything else in the process,
transformers' other checks included, still sees scikit-learn. Where scikit-learn is
already imported there is nothing to save and transformers is imported as it is.
"""
from __future__ import annotations

import sys


def import_transformers():
    """`transformers`, with its candidate generator imported without scikit-learn unless
    scikit-learn is loaded already or the generator is."""
    if "sklearn" not in sys.modules and "transformers.generation.candidate_generator" not in sys.modules:
        import transformers.utils as hf_utils

        present = hf_utils.is_sklearn_available
        hf_utils.is_sklearn_available = lambda: False
        try:
            import transformers.generation.candidate_generator  # noqa: F401
        finally:
            hf_utils.is_sklearn_available = present
    import transformers

    return transformers
