#!/usr/bin/env bash
# The trained models the GPU benchmarks read (SmolLM2's GGUF for speculative.py,
# batch_overhead.py --size smollm2 and the speculative steps; MiniLM's folder for
# embeddings.py), packed for a lent GPU, which has no network and takes at most
# 64 MiB a call:
#
#   bash bench/gpu_models.sh            # here, after scripts/setup.sh fetched them
#
# writes .gpu/models-1 ... .gpu/models-N (ignored by git, like the kit) and prints
# one device call per part. Each call copies its part to /tmp on the device; the
# last one unpacks them all into /tmp/mlxd-wheels and checks them; then
#   export MLXD_WHEELS_DIR=/tmp/mlxd-wheels
# before the benchmarks (bench/gpu_wave3.sh). Make the calls right after the kit's
# (shared/gpu/README.md): a machine idle for ~30 s is given back with its /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=${MLXD_WHEELS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mlxd/wheels}
PART_MB=${GPU_PART_MB:-55}
names=()
for name in SmolLM2-135M-Instruct.Q4_1.gguf all-MiniLM-L6-v2; do
  if [ -e "$SOURCE/$name" ]; then names+=("$name"); else echo "not in $SOURCE (scripts/setup.sh fetches it): $name" >&2; fi
done
[ ${#names[@]} -gt 0 ] || { echo "nothing to pack" >&2; exit 2; }
rm -rf .gpu/models-*
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -cf "$work/models.tar" -C "$SOURCE" "${names[@]}"
sum=$(sha256sum "$work/models.tar" | cut -d' ' -f1)
split -b "${PART_MB}M" -d -a 2 "$work/models.tar" "$work/part."
parts=("$work"/part.*)
total=${#parts[@]}
for i in "${!parts[@]}"; do
  n=$((i + 1))
  dir=.gpu/models-$n
  mkdir -p "$dir"
  mv "${parts[$i]}" "$dir/"
  cat >"$dir/receive.sh" <<EOF
#!/usr/bin/env bash
# Part $n of $total of the benchmark models ($(IFS=,; echo "${names[*]}")).
set -e
mkdir -p /tmp/mlxd-model-parts
cp "\$(dirname "\$0")"/part.* /tmp/mlxd-model-parts/
if [ "\$(ls /tmp/mlxd-model-parts | wc -l)" -lt $total ]; then
  echo "models: part $n of $total here; make the next call right away"; exit 0
fi
mkdir -p /tmp/mlxd-wheels
cat /tmp/mlxd-model-parts/part.* >/tmp/mlxd-models.tar
echo "$sum  /tmp/mlxd-models.tar" | sha256sum -c --quiet - || { echo "models: a part is missing or damaged" >&2; exit 3; }
tar -xf /tmp/mlxd-models.tar -C /tmp/mlxd-wheels && rm -f /tmp/mlxd-models.tar
echo "models: in /tmp/mlxd-wheels (export MLXD_WHEELS_DIR=/tmp/mlxd-wheels)"
EOF
  chmod +x "$dir/receive.sh"
done
echo "$total device calls, one right after the other (after the kit's):"
for n in $(seq 1 "$total"); do
  echo "  carry [\".gpu/models-$n\"]  command: bash .gpu/models-$n/receive.sh"
done
echo "then: source /tmp/gpu-env.sh && export MLXD_WHEELS_DIR=/tmp/mlxd-wheels && OUT=\$OUT bash bench/gpu_wave3.sh ..."
