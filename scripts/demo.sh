#!/usr/bin/env bash
# Install (reusing .venv) and run the demo job on the embedded sample, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
exec .venv/bin/rexeval demo "$@"
