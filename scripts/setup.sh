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
# Debian packages, installed when missing (as root, or with password-less sudo).
apt_install() {
  reason="$1"; shift
  command -v apt-get >/dev/null 2>&1 || return 0
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q "$@" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$@" >/dev/null; }) ||
      echo "warning: could not install $*; $reason" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get install -y -q "$@" >/dev/null || echo "warning: could not install $*; $reason" >&2
  else
    echo "hint: 'sudo apt-get install $*': $reason" >&2
  fi
}
if [ "$(uname -s)" = Linux ]; then
  # MLX's Linux CPU wheel ships the reference BLAS; Debian's OpenBLAS is ~20x
  # faster for f32 matmuls. mlxd preloads it when it is installed (docs/performance.md).
  ls /usr/lib/*-linux-gnu/libopenblas.so.0 >/dev/null 2>&1 ||
    apt_install "MLX will use its slow bundled BLAS" libopenblas0-pthread
  # The dashboard test drives a real headless Chromium (tests/monitoring/test_dashboard.py).
  if [ "${1:-}" = "--tests" ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
    apt_install "the dashboard test needs them" chromium chromium-driver
  fi
fi
# The coding-agent CLIs the agent tests drive (tests/agents/test_agent_clis.py),
# from npm into .agents/ (no global install, no root): the versions docs/agents.md was checked with.
AGENT_CLIS="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0"
if [ "${1:-}" = "--tests" ]; then
  if command -v npm >/dev/null 2>&1; then
    if [ ! -x .agents/node_modules/.bin/claude ] || [ ! -x .agents/node_modules/.bin/codex ]; then
      mkdir -p .agents
      # shellcheck disable=SC2086
      npm install --prefix .agents --no-audit --no-fund --loglevel=error $AGENT_CLIS >/dev/null ||
        echo "warning: could not install $AGENT_CLIS; the agent CLI tests will fail" >&2
    fi
  else
    echo "hint: install Node 20+ and re-run: the agent CLI tests need claude and codex from npm" >&2
  fi
fi
