#!/usr/bin/env bash
# Creates .venv and installs mlxd with everything the demo and the tests need.
# Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.mlxd-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[vision,test]"
  touch "$stamp"
fi
# MLX's Linux CPU wheel ships the reference BLAS; Debian's OpenBLAS is ~20x
# faster for f32 matmuls. mlxd preloads it when it is installed (docs/performance.md).
if [ "$(uname -s)" = Linux ] && ! ls /usr/lib/*-linux-gnu/libopenblas.so.0 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libopenblas0-pthread >/dev/null; }) ||
        echo "warning: could not install libopenblas0-pthread; MLX will use its slow bundled BLAS" >&2
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo apt-get install -y -q libopenblas0-pthread >/dev/null ||
        echo "warning: could not install libopenblas0-pthread; MLX will use its slow bundled BLAS" >&2
    else
      echo "hint: 'sudo apt-get install libopenblas0-pthread' makes MLX ~20x faster on this CPU" >&2
    fi
  fi
fi
# The dashboard test drives a real headless Chromium (tests/monitoring/test_dashboard.py).
if [ "$(uname -s)" = Linux ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
  if command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null; }) ||
        echo "warning: could not install chromium and chromium-driver; the dashboard test will fail" >&2
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo apt-get install -y -q chromium chromium-driver >/dev/null ||
        echo "warning: could not install chromium and chromium-driver; the dashboard test will fail" >&2
    else
      echo "hint: 'sudo apt-get install chromium chromium-driver' is needed by the dashboard test" >&2
    fi
  fi
fi
