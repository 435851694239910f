#!/usr/bin/env bash
# Install a headless browser for the report's browser test
# (tests/pipelines/study/test_report.py, marked slow): Debian's chromium and
# chromium-driver. Idempotent: nothing is done when `chromium` and `chromedriver` are
# already on PATH. Needs root (or sudo) and apt access; the test skips with the reason
# when either program is missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "[install_browser] chromium and chromedriver are already installed:"
  chromium --version 2>/dev/null || true
  chromedriver --version 2>/dev/null || true
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "[install_browser] needs root (or sudo) to run apt-get" >&2
    exit 1
  fi
fi
echo "[install_browser] installing chromium and chromium-driver with apt-get"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
chromium --version
chromedriver --version
echo "[install_browser] done"
