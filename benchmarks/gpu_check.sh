#!/usr/bin/env bash
# The GPU check in one device call (see benchmarks/gpu_check.py for what it measures).
#   bash benchmarks/gpu_check.sh prepare   # here, with network to PyPI: fills .gpucarry/
#   bash benchmarks/gpu_check.sh run       # on the GPU machine: writes into $OUT (or --out)
# The device call: command "bash benchmarks/gpu_check.sh run", carry [".gpucarry"].
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpucarry
case "${1:-}" in
  prepare)
    PY=${PYTHON:-.venv/bin/python}
    grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$CARRY/" >> .git/info/exclude; }
    rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
    # What the GPU machine lacks (Python 3.12 there): pydantic for rexeval's models, and
    # faiss-cpu for the neighbours check; each pinned to the version this venv runs.
    pins=()
    for pkg in pydantic pydantic-core annotated-types typing-inspection faiss-cpu; do
      pins+=("$pkg==$("$PY" -m pip show "$pkg" 2>/dev/null | awk '/^Version:/{print $2}')")
    done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$CARRY/wheels" "${pins[@]}"
    "$PY" benchmarks/gpu_check.py --prepare-assets "$CARRY/assets" > /dev/null
    du -sh "$CARRY" ;;
  run)
    shift
    [ -d "$CARRY/wheels" ] || { echo "no $CARRY/wheels: run 'bash benchmarks/gpu_check.sh prepare' first and carry $CARRY" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/gpu-check-site "$CARRY"/wheels/*.whl
    export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    exec python3 benchmarks/gpu_check.py --device cuda --assets "$CARRY/assets" --out "${OUT:-benchmarks/results/gpu}" \
      --work /tmp/gpu-check-work "$@" ;;
  *)
    echo "usage: bash benchmarks/gpu_check.sh prepare|run [gpu_check.py options]" >&2; exit 2 ;;
esac
