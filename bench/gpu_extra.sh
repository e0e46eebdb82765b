#!/usr/bin/env bash
# The pure-Python packages the GPU benchmarks need that the device's kit
# (shared/gpu/prepare.sh, run without extras) leaves out: mlx-embeddings (the
# encoder engine and embeddings.py's direct case), the part of mlx-vlm it
# imports, and python-multipart (Starlette reads an uploaded audio file only
# with it: without it the audio bench's first transcription is a 400). Copied
# from this checkout's .venv, 18 MB, into .gpu/extra/site (ignored by git):
#
#   bash bench/gpu_extra.sh
#
# Carry ".gpu/extra" with every device call that runs a benchmark (a path not
# carried is removed there), after the kit's and the models' calls;
# bench/gpu_wave3.sh puts .gpu/extra/site on PYTHONPATH when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf .gpu/extra
mkdir -p .gpu/extra/site
for package in mlx_embeddings mlx_vlm python_multipart multipart; do
  [ -d "$SITE/$package" ] || { echo "not in $SITE: $package (scripts/setup.sh --tests installs it)" >&2; exit 2; }
  cp -r "$SITE/$package" .gpu/extra/site/
done
find .gpu/extra -name __pycache__ -prune -exec rm -rf {} +
echo "$(du -sh .gpu/extra | cut -f1) in .gpu/extra: carry [\".gpu/extra\"] with each benchmark call"
