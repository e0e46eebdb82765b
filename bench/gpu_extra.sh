#!/usr/bin/env bash
# The pure-Python packages the GPU benchmarks need that the device's kit
# (shared/gpu/prepare.sh, run without extras) leaves out: mlx-embeddings (the
# encoder engine and embeddings.py's direct case), the part of mlx-vlm it
# imports, and python-multipart (Starlette reads an uploaded audio file only
# with it: without it the audio bench's first transcription is a 400). Copied
# from this checkout's .venv, 18 MB, into .gpu/extra/site (ignored by git):
#
#   bash bench/gpu_extra.sh
#   bash bench/gpu_extra.sh --min   # .gpu/extra-min: mlx-embeddings and python-multipart only
#
# The 0.5 MB of --min fit beside the kit's part 2 (42 MB) and .gpu/baseline
# (6 MB) in one call, so a step that only generates (apps5-ab, spec-free with
# the models sent first) can run in the call that installs the kit: on a
# machine that may be taken back, one call fewer.
#
# Carry ".gpu/extra" with every device call that runs a benchmark (a path not
# carried is removed there), after the kit's and the models' calls;
# bench/gpu_wave3.sh puts .gpu/extra/site on PYTHONPATH when it is there.
#
#   bash bench/gpu_extra.sh --audio # .gpu/extra-audio (19 MB): mlx-audio and what it needs
#                                   # beyond the device image, wheels for CPython 3.12 from PyPI
#                                   # (miniaudio needs cffi), and mlx-embeddings: carried
#                                   # with the audio steps (beside part 2 it makes 61 MB of 64)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --audio ]; then
  DEST=.gpu/extra-audio
  rm -rf "$DEST"
  mkdir -p "$DEST/site"
  .venv/bin/pip install -q --target "$DEST/site" --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --implementation cp \
    'mlx-audio==0.6.2' miniaudio soundfile sounddevice python-multipart cffi pycparser
  SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -r "$SITE/mlx_embeddings" "$DEST/site/"
  rm -rf "$DEST/site/bin"
  find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
  echo "$(du -sh "$DEST" | cut -f1) in $DEST: carry [\"$DEST\"] with the audio steps"
  exit 0
fi
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DEST=.gpu/extra
PACKAGES=(mlx_embeddings mlx_vlm python_multipart multipart)
if [ "${1:-}" = --min ]; then
  DEST=.gpu/extra-min
  PACKAGES=(mlx_embeddings python_multipart multipart)
fi
rm -rf "$DEST"
mkdir -p "$DEST/site"
for package in "${PACKAGES[@]}"; do
  [ -d "$SITE/$package" ] || { echo "not in $SITE: $package (scripts/setup.sh --tests installs it)" >&2; exit 2; }
  cp -r "$SITE/$package" "$DEST/site/"
done
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
echo "$(du -sh "$DEST" | cut -f1) in $DEST: carry [\"$DEST\"] with each benchmark call"
