"""rexeval: a Ray platform for evaluating the explanations recommender systems give.

The product is six packages, each a top-level folder of the repository, installed
under this one namespace (imports run from the first to the last, never back up):

    rexeval.ray_jobs   one thin module per command, and the `rexeval` CLI
    rexeval.pipelines  a package per capability, wiring stages onto Ray
    rexeval.serve      Ray Serve deployments (NLI scorer, LLM judge)
    rexeval.metrics    pure metric functions and their registry
    rexeval.models     everything that holds weights
    rexeval.prompts    prompt templates, rubrics and topic tables
    rexeval.registry   (this folder, below them all) the one registry class every layer uses,
    rexeval.failures   a worker's failure as one line a user can act on,
    rexeval.storage    the one module every layer reads and writes data through (paths, URIs),
    rexeval.threads    and the cap on a process's CPU threads (REXEVAL_MAX_THREADS)

`setup.py` maps the folders with `package_dir`, so an installed rexeval (a wheel or an
editable install) puts nothing but `rexeval` into site-packages. A source checkout used
without installing it (`ray job submit --working-dir .`, `python -m
rexeval.ray_jobs.demo` in the repository root) imports this file from the checkout; the
checkout's root is then added to this package's path, so that `rexeval.pipelines` is
that checkout's `pipelines/` on the driver and on every Ray worker, never a copy
installed elsewhere.
"""
from __future__ import annotations

import os as _os

__version__ = "0.1.0"

LAYERS = ("ray_jobs", "pipelines", "serve", "metrics", "models", "prompts")
"""The product's packages, from the top layer down (see the layering test)."""

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
SOURCE_ROOT: str | None = (
    _ROOT if _os.path.isfile(_os.path.join(_ROOT, "setup.py"))
    and all(_os.path.isdir(_os.path.join(_ROOT, p)) for p in LAYERS) else None)
"""The source checkout this package was imported from, or None when installed."""

if SOURCE_ROOT is not None and SOURCE_ROOT not in __path__:
    __path__.append(SOURCE_ROOT)
