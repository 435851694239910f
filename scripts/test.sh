#!/usr/bin/env bash
# Install (reusing .venv) and run the test suite. Extra arguments go to pytest.
# The suite runs on REXEVAL_TEST_WORKERS pytest-xdist workers (default 2, whole files
# each, the longest first: tests/conftest.py); REXEVAL_TEST_WORKERS=0 runs it in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
workers=${REXEVAL_TEST_WORKERS:-2}
if [ "$workers" -gt 0 ]; then
  exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest "$@"
