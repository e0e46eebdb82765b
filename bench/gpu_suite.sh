#!/usr/bin/env bash
# The device figures of issue 16 in one run, through `mlxd serve`, on a lent GPU:
#
#   bash bench/gpu_suite.sh               # on the GPU machine (bench size, bf16)
#   bash bench/gpu_suite.sh --cpu-smoke   # here: the same steps on tiny models, in minutes
#
# 1. device: what MLX and the driver report; the demo built in the device's dtype.
# 2. kernel misses (bench/kernel_misses.py), with an empty kernel cache, then
#    restarted on the cache it filled: what the first requests after a load still
#    compile, first-request TTFT after a load / second, the load split (mlx_lm.load,
#    warm-up, rest) / mlx_lm.load in a fresh process, the device and budget.
# 3. concurrency 1/2/4/8 clients (bench/concurrency.py).
# 4. reload + restore vs reload + recompute at 2k, 8k, 32k tokens (bench/restore_vs_recompute.py).
# 5. per-token overhead against direct mlx-lm (bench/overhead.py).
# 6. a front mlxd on the CPU cores in front of a backend mlxd on the GPU, against
#    asking the backend directly (bench/remote.py): the backend on cores of its own
#    (a team GPU server and a laptop), then every process on every core.
# Then everything in bench/results (figures and logs) goes into $OUT/results.tgz and
# the tables into $OUT/summary.txt. Each step has a time limit and the whole run a
# deadline (SUITE_SECONDS, default 540): a step that no longer fits is skipped, and
# a failed step does not stop the others. STEPS="kernel_misses_fresh overhead ..."
# runs only those (device and build always run), to split the suite over calls.
#
# On the H200 (shared/gpu/README.md): after the kit's part calls,
#   bash .gpu/part2/stage.sh && source /tmp/gpu-env.sh && bash bench/gpu_suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

mode=gpu
[ "${1:-}" = "--cpu-smoke" ] && mode=cpu
if [ "$mode" = cpu ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  SIZE=tiny; PROMPT_TOKENS=500; RESTORE_SIZES="500 2000"; TOKENS=64; ROUNDS=1; REPEATS=3; IMPORT_WAIT=6
else
  PY=${PYTHON:-python3}
  SIZE=bench; PROMPT_TOKENS=2000; RESTORE_SIZES="2000 8000 32000"; TOKENS=128; ROUNDS=2; REPEATS=5; IMPORT_WAIT=15
fi
OUT=${OUT:-$ROOT/gpu-suite-out}
DEADLINE=${SUITE_SECONDS:-540}
LOGS=bench/results/gpu_suite_logs
mkdir -p "$OUT" "$LOGS"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_SECONDS COMMAND...: run it with its log in $LOGS/NAME.log, its
# last lines (the table) in the summary.
step() {
  local name=$1 limit=$2; shift 2
  if [ -n "${STEPS:-}" ] && [[ " device build $STEPS " != *" $name "* ]]; then
    return
  fi
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then
    note "== $name: skipped (${left}s left of ${DEADLINE}s)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  note "== $name: exit $rc after $((SECONDS - started))s (limit ${limit}s)"
  tail -n 14 "$LOGS/$name.log" >>"$SUMMARY"
}

note "mlxd gpu suite ($mode) at $(date -u +%FT%TZ), python $($PY -c 'import sys; print(sys.version.split()[0])')"
step device 120 bash -c "
  (command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv) || echo 'no nvidia-smi'
  $PY - <<'EOF'
import json
import mlx.core as mx
from mlxd.engine.mlx_backend import installed_backends
from mlxd.dtypes import device_dtype
from mlxd.registry.device import current_device
print('mlx', mx.__version__, mx.default_device(), 'backends', installed_backends())
print('device_info', json.dumps({k: v for k, v in mx.device_info().items()}, default=str))
print('device', json.dumps(current_device().as_dict()))
print('demo/bench dtype here:', device_dtype())
EOF
  rm -rf /tmp/mlxd-suite-demo
  $PY -m mlxd demo /tmp/mlxd-suite-demo --size tiny && grep -h torch_dtype /tmp/mlxd-suite-demo/models/*/config.json | sort | uniq -c
"
# Built once here so that no later step's time limit pays for it.
step build 180 "$PY" -c "
from mlxd.factory import ModelRecipe, build_model
from mlxd.dtypes import device_dtype
for size in ('tiny', '$SIZE'):
    print(build_model(ModelRecipe('qwen2', size, dtype=device_dtype())))
"
# The first run fills an empty kernel cache (a fresh machine), the second
# restarts on it; each against plain mlx_lm.load in a fresh process.
KERNELS=$(mktemp -d /tmp/mlxd-suite-kernels.XXXXXX)
for run in fresh warm; do
  step "kernel_misses_$run" 200 "$PY" bench/kernel_misses.py --size "$SIZE" --prompt-tokens "$PROMPT_TOKENS" \
    --import-wait "$IMPORT_WAIT" --kernel-dir "$KERNELS" --label "$run"
done
# shellcheck disable=SC2086
step restore_vs_recompute 150 "$PY" bench/restore_vs_recompute.py --size "$SIZE" --prompt-tokens $RESTORE_SIZES
step concurrency 120 "$PY" bench/concurrency.py --size "$SIZE" --tokens "$TOKENS" --rounds "$ROUNDS"
step overhead 90 "$PY" bench/overhead.py --size "$SIZE" --tokens "$TOKENS" --repeats "$REPEATS"
for placement in apart shared; do
  step "remote_$placement" 240 "$PY" bench/remote.py --size "$SIZE" --tokens "$TOKENS" --placement "$placement"
done

note "== total $((SECONDS))s"
tar -czf "$OUT/results.tgz" bench/results
echo "wrote $OUT/results.tgz and $SUMMARY"
