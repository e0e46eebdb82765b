#!/usr/bin/env bash
# The wave-3 benchmarks on a lent GPU, in steps that each have a time limit:
#
#   bash bench/gpu_wave3.sh audio speculative          # one device call
#   bash bench/gpu_wave3.sh distributed apps embeddings  # the next one
#
# The calls that ran apps5-ab, then spec-free, on one H100 (2026-12-07), after
# ../shared/gpu/prepare.sh, bench/gpu_models.sh, bench/gpu_extra.sh --min and
# `git archive REV | tar -x -C .gpu/baseline` here:
#   1. carry [".gpu/part1"]: bash .gpu/part1/stage.sh
#   2. carry [".gpu/part2", ".gpu/extra-min", ".gpu/baseline"]: bash .gpu/part2/stage.sh &&
#      source /tmp/gpu-env.sh && OUT=$OUT bash bench/gpu_wave3.sh apps5-ab; tar -czf $OUT/results.tgz bench/results
#   3-5. carry [".gpu/models-N"]: bash .gpu/models-N/receive.sh, for N = 1, 2, 3
#   6. carry [".gpu/models-4", ".gpu/extra-min"]: bash .gpu/models-4/receive.sh && source /tmp/gpu-env.sh &&
#      export MLXD_WHEELS_DIR=/tmp/mlxd-wheels && OUT=$OUT bash bench/gpu_wave3.sh spec-free; tar ...
# The audio steps (2026-12-07), after calls 1 and 2, with bench/gpu_extra.sh --audio here:
#   carry [".gpu/extra-audio"]: source /tmp/gpu-env.sh && OUT=$OUT bash bench/gpu_wave3.sh audio-bench9; tar ...
# A later call on the same warm machine carries only what it needs (what is not carried is removed).
#
# Steps: audio (bench/audio.py: real-time factor through mlxd / mlx-audio
# direct; audio-bench with models of the real ones' size; audio-bench9: the same, 9 rounds, each case in a run of its own; audio-paired: speech, 15 rounds of 3 calls a side, with the median of the rounds' own ratios; speech: where a
# synthesis's time goes, bench/speech_breakdown.py; speech-prof: the same, then 60 requests with the daemon
# sampled by py-spy; speech15: 15 rounds, each layer's time per round in the JSON), speculative (bench/speculative.py: SmolLM2, code edit and free chat,
# 1/4/8 streams, mlx_lm.server --draft-model beside it), plain-sweep (the same without speculation
# at 1, 2, 3, 4, 5 and 8 streams, twice each: which batch sizes are slow, and whether only at first use),
# steps-sweep (the same batch sizes below the daemon: mlx-lm's BatchGenerator and mlxd's batch),
# batch-overhead (bench/batch_overhead.py: mlxd's batched decode against BatchGenerator in one process,
# profiled with py-spy where it is on PATH; batch-smol: SmolLM2 through chat, as bench/speculative.py
# serves it), join-cost (bench/join_cost.py: a request joining a decoding batch, part by part),
# composition (bench/composition_steps.py: the steps after rows join or leave a batch, as is and with the
# batch settled first, at 4 and 8 rows),
# spec-lookup (bench/speculative.py, plain and prompt lookup only, 1 and 4 streams, twice; spec-lookup8: the same
# at 1, 4 and 8 streams, every target of issue 29's lookup in one daemon; spec-free:
# free chat only, 1/4/8 streams, greedy; spec-free8: 8 streams only, 3 repeats, each run's verify steps;
# spec-free8-prof: plain, then lookup, each sampled by py-spy; think-budget: the zoo's qwen3_5 (a thinking family), 8 streams
# with a reasoning budget, plain and prompt lookup (what agents' requests cost a batch on a GPU); spec-free-t: the same at temperature 0.7; spec-prof: 4 streams,
# the daemon sampled by py-spy with native frames), batch-switch (the same with the daemon's GIL switch interval
# at 0.5 ms), spec-k (the same at K = 4 and 8,
# 1 and 4 streams, each figure the median of 2 runs), rollback (bench/speculative_rollback.py: a
# speculative step's cache work, mlx-lm's roll against the holes), spec-steps (bench/speculative_steps.py
# with distinct rows, which keep different numbers of drafts), spec-warm (the same, free chat and code
# edit, the verify shapes warmed first as the daemon's warm-up does; spec-trace: free chat at 1, 4 and 8 distinct rows,
# BatchGenerator and the governed batch with one governor kept across runs, three times, every governed step printed), distributed
# (bench/distributed.py: bench-size model over 2 ranks, ring), apps
# (bench/app_priority.py; apps5 with a fifth slot, so that 4 bulk clients
# and the interactive one each have one; apps5-p: with priorities only; apps5-p120: the same with 120 idle samples; apps5-prof: the same,
# the daemon sampled by py-spy with native frames (which library the slow steps' CPU is in); apps5-env: the same under MLX settings that
# change what a batch of a new shape costs the worker's CPU: default, no cuDNN attention, no CUDA graphs; apps5-ab: with priorities and 120 idle samples, this tree and the checkout in
# .gpu/baseline in turn; apps5-ab3: the same three times each, samples pooled), embeddings (bench/embeddings.py), chat-embed (bench/chat_beside_embeddings.py: a
# pinned chat stream's pace while 8 clients embed; chat-embed-large: the same beside a random chat model of Qwen2.5-7B's
# shapes in bfloat16, whose decode step waits on its weights rather than on the host (chat-embed-large-tiny: beside the
# factory's tiny encoder, no model parts needed but .gpu/extra, whose mlx-vlm mlx-embeddings imports; 2026-12-07); chat-embed-si: the same with the daemon's GIL switch interval at 5 (Python's default), 1 and 0.25 ms; chat-embed-ab: this tree and .gpu/baseline in turn, twice; chat-embed-large-ab: the 7B-shaped chat beside the tiny encoder, this tree and .gpu/baseline in turn (encoder passes paced to the chat since 2026-12-07: .gpu/baseline is cc5f6d7, the code before; chat-embed-large-ab2: the same, 2 rounds, for a call with less device time left); encoder-shapes: bench/encoder_shapes.py, what queueing an embedding pass costs the worker by how batch shapes vary). SmolLM2's GGUF and
# MiniLM's folder must be in $MLXD_WHEELS_DIR (the device has no network):
# bench/gpu_models.sh packs them into parts for the device calls; bench/gpu_extra.sh the packages
# the kit leaves out (carry .gpu/extra with every call). Logs and bench/results go to $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(pwd)/gpu-out}
mkdir -p "$OUT" bench/results
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
# mlx-embeddings, mlx-vlm and python-multipart, which the kit leaves out (bench/gpu_extra.sh;
# .gpu/extra-min, from its --min, has all but mlx-vlm).
for extra in .gpu/extra .gpu/extra-min .gpu/extra-audio; do
  if [ -d $extra/site ]; then export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)/$extra/site; fi
done

step() {
  local name=$1 limit=$2; shift 2
  echo "== $name (at most ${limit}s): $*"
  local started=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "== $name: exit $rc after $((SECONDS - started))s"
}

for name in "$@"; do
  case $name in
    audio) step audio 150 "$PY" bench/audio.py --rounds 3 ;;
    audio-bench) step audio-bench 240 "$PY" bench/audio.py --size bench --rounds 3 ;;
    audio-bench9) step audio-bench9-speech 300 "$PY" bench/audio.py --size bench --rounds 9 --cases speech
                  step audio-bench9-transcription 300 "$PY" bench/audio.py --size bench --rounds 9 --cases transcription ;;
    audio-paired) step audio-paired-speech 300 "$PY" bench/audio.py --size bench --rounds 15 --calls 3 --cases speech ;;
    speech) step speech 200 "$PY" bench/speech_breakdown.py --size bench --rounds 5 ;;
    speech15) step speech15 330 "$PY" bench/speech_breakdown.py --size bench --rounds 15 ;;
    speech-prof) step speech-prof 200 "$PY" bench/speech_breakdown.py --size bench --rounds 3 --profile 60 ;;
    speculative) step speculative 440 "$PY" bench/speculative.py ;;
    plain-sweep) step plain-sweep 300 "$PY" bench/speculative.py --methods plain --streams 1 2 3 4 5 8 --repeats 2 ;;
    steps-sweep) step steps-sweep 200 "$PY" bench/speculative_steps.py --rows 1 2 3 4 5 8 --only BatchGenerator "spec batch, plain" --repeats 2 --distinct --tokens 160 ;;
    batch-overhead) step batch-overhead 240 "$PY" bench/batch_overhead.py --size bench --rows 1 2 4 8 --profile ;;
    batch-switch) step batch-switch 150 "$PY" bench/batch_overhead.py --size bench --rows 1 4 8 --switch-interval 0.0005 ;;
    spec-k) step spec-k 480 "$PY" bench/speculative.py --k 4 8 --streams 1 4 --repeats 2 ;;
    rollback) step rollback 200 "$PY" bench/speculative_rollback.py --contexts 2048 8192 32768 --rows 4 8 ;;
    spec-steps) step spec-steps 240 "$PY" bench/speculative_steps.py --rows 4 8 --distinct --only plain speculating --profile ;;
    spec-trace) step spec-trace 300 "$PY" bench/speculative_steps.py --workload free_chat --rows 1 4 8 --tokens 160 --repeats 3 --distinct --keep-governor --only BatchGenerator governor --trace ;;
    spec-warm) step spec-warm-free 200 "$PY" bench/speculative_steps.py --workload free_chat --rows 1 8 --tokens 160 --repeats 2 --warm
               step spec-warm-code 200 "$PY" bench/speculative_steps.py --workload code_edit --distinct --rows 1 4 8 --tokens 160 --warm ;;
    distributed) step distributed 170 "$PY" bench/distributed.py --size bench --transport ring --tokens 64 --repeats 3 ;;
    apps) step apps 150 "$PY" bench/app_priority.py --size bench --seconds 20 ;;
    apps5-ab) step apps5-ab 300 "$PY" bench/app_priority.py --size bench --seconds 20 --concurrency 5 --turns --priorities-only --idle-samples 120 --baseline .gpu/baseline ;;
    apps5-ab3) step apps5-ab3 580 "$PY" bench/app_priority.py --size bench --seconds 20 --concurrency 5 --priorities-only --idle-samples 120 --baseline .gpu/baseline --repeats 3 ;;
    apps5-prof) step apps5-prof 200 "$PY" bench/app_priority.py --size bench --seconds 20 --concurrency 5 --turns --priorities-only --profile ;;
    apps5-p) step apps5-p 200 "$PY" bench/app_priority.py --size bench --seconds 20 --concurrency 5 --turns --priorities-only ;;
    apps5-p120) step apps5-p120 220 "$PY" bench/app_priority.py --size bench --seconds 20 --concurrency 5 --turns --priorities-only --idle-samples 120 ;;
    apps5-env) for v in MLXD_BENCH=default MLX_CUDA_USE_CUDNN_SDPA=0 MLX_USE_CUDA_GRAPHS=0; do
        step "apps5-env-${v%%=*}" 150 env "$v" "$PY" bench/app_priority.py --size bench --seconds 15 --concurrency 5 --turns --priorities-only
      done ;;
    apps5) step apps5 300 "$PY" bench/app_priority.py --size bench --seconds 20 --concurrency 5 --turns ;;
    composition) step composition 200 "$PY" bench/composition_steps.py --size bench --rows 4 --changes 24 \
      && step composition-8 200 "$PY" bench/composition_steps.py --size bench --rows 8 --changes 24 ;;
    join-cost) step join-cost 120 "$PY" bench/join_cost.py --size bench --rows 4 --joining 1 3 ;;
    spec-prof) step spec-prof 300 "$PY" bench/speculative.py --methods plain lookup --streams 4 --repeats 2 --profile ;;
    spec-free8) step spec-free8 240 "$PY" bench/speculative.py --methods plain lookup --workloads free_chat --streams 8 --repeats 3 ;;
    spec-free8-prof) for m in plain lookup; do
        step spec-free8-prof-$m 160 "$PY" bench/speculative.py --methods $m --workloads free_chat --streams 8 --repeats 2 --profile
        cp bench/results/speculative-profile.txt "$OUT/speculative-profile-$m.txt"; done ;;
    think-budget) step think-budget 240 "$PY" bench/speculative.py --model "$("$PY" -c 'from mlxd.factory.zoo_build import build_family; print(build_family("qwen3_5"))')" \
        --budget 10000 --methods plain lookup --workloads free_chat --streams 8 --repeats 3 --tokens 300 ;;
    spec-free) step spec-free 300 "$PY" bench/speculative.py --methods plain lookup --workloads free_chat --streams 1 4 8 --repeats 2 ;;
    spec-free-t) step spec-free-t 300 "$PY" bench/speculative.py --methods plain lookup --workloads free_chat --streams 1 4 8 --repeats 2 --temperature 0.7 ;;
    spec-lookup8) step spec-lookup8 560 "$PY" bench/speculative.py --methods plain lookup --streams 1 4 8 --repeats 2 ;;
    spec-lookup) step spec-lookup 280 "$PY" bench/speculative.py --methods plain lookup --streams 1 4 --repeats 2 ;;
    batch-smol) step batch-smol 150 "$PY" bench/batch_overhead.py --size smollm2 --chat --rows 1 4 8 ;;
    chat-embed) step chat-embed 200 "$PY" bench/chat_beside_embeddings.py --tokens 256 --rounds 3 ;;
    chat-embed-large) step chat-embed-large 560 "$PY" bench/chat_beside_embeddings.py --chat large --tokens 256 --rounds 3 ;;
    chat-embed-large-tiny) step chat-embed-large-tiny 560 "$PY" bench/chat_beside_embeddings.py --chat large --embedder tiny --tokens 256 --rounds 3 ;;
    chat-embed-large-ab2) step chat-embed-large-ab2 420 "$PY" bench/chat_beside_embeddings.py --chat large --embedder tiny --tokens 256 --rounds 2 --baseline .gpu/baseline ;;
    chat-embed-large-ab) step chat-embed-large-ab 580 "$PY" bench/chat_beside_embeddings.py --chat large --embedder tiny --tokens 256 --rounds 3 --baseline .gpu/baseline ;;
    encoder-shapes) step encoder-shapes 150 "$PY" bench/encoder_shapes.py --passes 400 ;;
    chat-embed-si) step chat-embed-si 420 "$PY" bench/chat_beside_embeddings.py --tokens 256 --rounds 3 --switch-intervals 0.001 0.00025 ;;
    chat-embed-ab) step chat-embed-ab 400 "$PY" bench/chat_beside_embeddings.py --tokens 256 --rounds 3 --repeats 2 --baseline .gpu/baseline ;;
    embeddings-ab) step embeddings-ab 420 "$PY" bench/embeddings.py --texts 256 --rounds 3 --baseline .gpu/baseline ;;
    embeddings) step embeddings 150 "$PY" bench/embeddings.py --texts 256 --rounds 3 --client-threads ;;
    *) echo "unknown step $name" ;;
  esac
done
tar -czf "$OUT/results-$(date +%H%M%S).tgz" bench/results 2>/dev/null
