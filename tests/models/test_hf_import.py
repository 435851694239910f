"""models/hf_import.py: a process that loads an LLM imports no scikit-learn, and nothing
else in it loses scikit-learn. Each case runs in a fresh interpreter (what was imported
before is the point)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_hf_backend_loads_smollm2_without_scikit_learn_and_others_still_see_it():
    got = _fresh("""
import json, sys
from rexeval.models.llm.base import BackendSpec
from rexeval.models.llm.hf_backend import HFBackend
HFBackend(BackendSpec(backend="hf", model="SmolLM2-135M-Instruct", options={}))
loaded = sorted({m.split('.')[0] for m in sys.modules} & {"sklearn", "pandas"})
import transformers.utils, transformers.generation.candidate_generator as cg
print(json.dumps({"loaded": loaded, "others": transformers.utils.is_sklearn_available(),
                  "generator": cg.is_sklearn_available()}))
""")
    assert got == {"loaded": [], "others": True, "generator": False}


@pytest.mark.parametrize("first", ["sklearn", "transformers.generation.candidate_generator"])
def test_a_process_that_has_it_already_imports_transformers_as_it_is(first):
    got = _fresh(f"""
import json, importlib
importlib.import_module({first!r})
from rexeval.models.hf_import import import_transformers
import_transformers()
import transformers.generation.candidate_generator as cg
print(json.dumps({{"generator": cg.is_sklearn_available(), "roc_curve": hasattr(cg, "roc_curve")}}))
""")
    assert got == {"generator": True, "roc_curve": True}
