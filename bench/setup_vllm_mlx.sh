#!/usr/bin/env bash
# vllm-mlx for bench/servers.py, in a venv of its own under ~/.cache/mlxd-bench.
#
# vllm-mlx 0.6.0 pins mlx-lm<0.32 and pulls in gradio, torch(vision), opencv
# and more; installing it into mlxd's environment would downgrade mlx-lm.
# Here it is installed without its dependencies into a separate venv that
# sees mlxd's site-packages through a .pth file, so it runs the very same
# mlx, mlx-lm, transformers, uvicorn and uvloop as mlxd and mlx_lm.server (a
# fair comparison), and mlxd's environment is never written to. Serving a
# local text model needs nothing else.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
VERSION="${VLLM_MLX_VERSION:-0.6.0}"
VENV="${VLLM_MLX_VENV:-$HOME/.cache/mlxd-bench/vllm-mlx}"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
BASE="$("$PY" -c 'import sys; print(sys._base_executable)')"

"$BASE" -m venv "$VENV"
OWN="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" > "$OWN/zz-mlxd-site.pth"
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/python" -m pip download --quiet --no-deps --dest "$WHEELS" "vllm-mlx==$VERSION"
"$VENV/bin/python" -m pip install --quiet --no-deps "$WHEELS"/vllm_mlx-*.whl
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("vllm-mlx", m.version("vllm-mlx"), "on mlx", m.version("mlx"), "mlx-lm", m.version("mlx-lm"))
PY
echo "installed: $VENV/bin/vllm-mlx"
