"""Warming a freshly loaded text model before it is reported ``loaded``.

The first use of each kernel is compiled: NVRTC on CUDA (a bench-size model's
first 2k-token request took 13.9 s there, the next one 0.16 s), g++ for MLX's
CPU kernels. Whoever sends the first request would pay for it. So the loader
sends the shapes real traffic uses through the engine's own ``generate``
before handing the engine over: a prompt of one full prefill chunk plus a
rest (chunked prefill, then mlx-lm's prefill and a few decode steps), and,
when the model batches (max_concurrency > 1), several short requests at once
(the batched prefill and decode). Compiled kernels land in MLX's on-disk
kernel cache (``mlxd.engine.kernel_cache``), so a restarted daemon warms in
well under a second.

Sampling's kernels are compiled by two short requests with temperature,
top-p, min-p and top-k on, one with a seed (its own key) and one without: the
values are kernel inputs (``mlxd.engine.sampling_kernels``), so any value a
client sends later runs on them. The seeded one also has the penalties and
logprobs, and on GPUs a last request decodes under a JSON grammar: on an H200 each of
those paths compiled its own gather/scatter kernels on first use, 2.4-8.3 s
for whoever sent it first.

A last, timed prompt of a chunk measures this device's prefill speed (kernels
are compiled by then), which the prefix cache's restore-or-recompute
decision needs (``mlxd.engine.restore_policy``). Warm-up requests leave
nothing behind (``GenerationRequest.warmup``): they neither read nor fill
the prefix cache and are not counted, and greedy output depends only on the
prompt, so the first user's answer is the same as without warming.

Where it runs (``decide_mode``): a model whose kernels this machine is known
to have compiled (``mlxd.engine.warmup_marker``) warms before the engine is
handed over, as that takes a second or two; otherwise compiling the whole
plan would delay the first request by up to a minute (57 s on an H200 with
an empty kernel cache, for kernels that request mostly did not need), so the
engine is handed over at once and the plan runs in the background
(``mlxd.engine.warmup_background``), only while no user request is in
flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlxd.engine.types import Constraint, GenerationRequest, SamplingParams
from mlxd.errors import describe_exception

log = logging.getLogger(__name__)

# Decode steps each warm-up request runs: the first step after a prefill and
# the steady-state step differ (cache growth, sampler), so more than one.
DECODE_STEPS = 3
SHORT_PROMPT_TOKENS = 16
# Tokens kept free under max_context for the reply and the chat template.
CONTEXT_MARGIN = 16
# Batch sizes a batching model is warmed at on a GPU: 2 to this.
MAX_WARM_BATCH = 8
# Batch sizes a speculative model's verify shapes are warmed at: 1 to this.
MAX_SPECULATIVE_WARM_BATCH = 8
# The passage warm-up prompts repeat, in characters.
SAMPLE_CHARS = 1200
# Source code takes 3-4 characters a token with real tokenizers; erring long
# keeps a full prefill chunk in the warm-up.
CHARS_PER_TOKEN = 4
# On the CPU backend kernels are compiled per fused operation, not per
# sequence length, and kept on disk, so a short prompt is all that is worth
# sending (the CPU pays for every warm-up token at its slow prefill speed:
# SmolLM2's 4-bit kernels prefilled ~7 tokens/s on this loaded 2-core machine).
CPU_PREFILL_TOKENS = 32
CPU_WARM_BATCH = 2
# The CPU's sampled pair: a prompt of a few tokens and one token, sampled
# after its prefill.
CPU_SAMPLED_PROMPT_TOKENS = 4


@dataclass(frozen=True)
class WarmupRun:
    prompt_tokens: int
    max_tokens: int
    concurrent: int = 1
    timed: bool = False  # measures prefill speed (runs after the kernels are compiled)
    # "greedy"; "sampled": every sampling filter on, the second request also
    # seeded, with penalties and logprobs; "shared": every filter on, no seed,
    # the same for every request (one sampler for the batch); "constrained":
    # under a JSON grammar.
    kind: str = "greedy"
    # Request i asks for ``max_tokens + i``: the rows leave the batch one at a
    # time, so its filter (gathers of the caches and the tokens) is compiled.
    staggered: bool = False


# Where the warm-up runs (``decide_mode``): before the engine is handed over,
# or after, while the engine has no user request.
LOAD = "load"
BACKGROUND = "background"
MODES = (LOAD, BACKGROUND)


@dataclass(frozen=True)
class WarmupReport:
    seconds: float
    requests: int
    prefill_tokens_per_s: float | None
    error: str | None = None
    mode: str = LOAD
    # Runs a user request pushed aside (run again once the engine was idle).
    preempted: int = 0
    # False while a background warm-up has not finished yet.
    done: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide_mode(*, device: str, known_compiled: bool, forced: str | None = None) -> tuple[str, str]:
    """Where the warm-up runs, and why (for the log).

    ``forced`` is ``MLXD_WARMUP`` (``load`` or ``background``; anything
    else, ``auto`` included, decides). Metal ships its kernels precompiled,
    so its warm-up is short wherever it runs: in the load, as always. A
    device that JIT-compiles (CUDA, the CPU) warms in the load only when a
    completed warm-up of the same kernels is known to be in its kernel cache
    (a second or two then); otherwise compiling the plan would hold back the
    first request, so it runs in the background."""
    if forced in MODES:
        return forced, f"MLXD_WARMUP={forced}"
    if device == "metal":
        return LOAD, "Metal's kernels are precompiled"
    if known_compiled:
        return LOAD, "its kernels are in the kernel cache"
    return BACKGROUND, "its kernels are not known to be compiled on this machine"


def plan_warmup(
    *, max_context: int, prefill_chunk: int, max_concurrency: int, batching: bool, device: str = "gpu",
    speculative_tokens: int = 0,
) -> tuple[WarmupRun, ...]:
    """The requests that compile the kernels traffic will use, in order.

    GPUs get two full prefill chunks and a rest: the shape every long prompt
    is cut into, and attention over more keys than queries, whose kernels
    are not the first chunk's (a first 2k-token request on an H200 took
    0.97 s after a one-chunk warm-up, the next one 0.35 s; 0.26 and 0.25 s
    after two). ``device == "cpu"`` gets only ``_cpu_plan``'s short sampled
    pair and timed prompt.

    A model that speculates (``speculative_tokens``: its K) on a GPU then
    verifies blocks of every width, 1 to K + 1, at every batch size it may
    run, 1 to ``MAX_SPECULATIVE_WARM_BATCH`` (``speculative_runs``)."""
    room = max(1, max_context - DECODE_STEPS - CONTEXT_MARGIN)
    if device == "cpu":
        return _cpu_plan(room, max_concurrency, batching)
    long = min(2 * prefill_chunk + SHORT_PROMPT_TOKENS, room)
    short = min(SHORT_PROMPT_TOKENS, room)
    runs = [WarmupRun(long, DECODE_STEPS)]
    if batching and max_concurrency > 1:
        runs += batch_runs(short, max_concurrency)
    runs.append(WarmupRun(short, DECODE_STEPS, 2, kind="sampled"))
    runs.append(WarmupRun(min(prefill_chunk, room), 1, timed=True))
    runs.append(WarmupRun(short, DECODE_STEPS, kind="constrained"))
    if speculative_tokens > 0:
        runs += speculative_runs(short, speculative_tokens, max_concurrency if batching else 1)
    return tuple(runs)


def batch_runs(prompt_tokens: int, max_concurrency: int) -> list[WarmupRun]:
    """Requests that arrive together, at every batch size from 2 to
    ``max_concurrency`` (at most ``MAX_WARM_BATCH``), all with the same
    sampling parameters and no seed, as an app's clients send them. They
    join the batch together (mlx-lm merges, splits and extends their caches)
    and the batch draws their tokens in one call of their shared sampler
    (``BatchScheduler._sampler``), a kernel traced per batch size. On an
    H100, with only a batch of 4 greedy requests warmed, the first
    contended run of bench/app_priority.py (4 bulk clients at temperature
    0.7 and an interactive one: batches of 5) gave one interactive request
    its first token after 1.4-2.2 s and its first bulk requests 3.3-4x their
    solo time; the next daemon on that machine, its kernels on disk, had
    neither. Batch sizes 2 to 5 and several requests joining at once are
    what that run met cold.

    The rows end one step apart (``staggered``): rows ending together empty
    the batch, which gathers nothing, while a row leaving a batch that goes
    on gathers the others' caches and next tokens, and MLX's CUDA backend
    compiles a gather module (every rank, through NVRTC) for each dtype
    pair on first use. A py-spy profile of the daemon through two
    prompt-lookup runs at 4 streams on an H100 (bench/gpu_wave3.sh
    spec-prof) found a fifth of the worker's samples compiling gathers under
    the batch's filter, and that run's first code-edit run at 24 tok/s
    against 104 for the second."""
    return [WarmupRun(prompt_tokens, DECODE_STEPS, rows, kind="shared", staggered=True)
            for rows in range(2, min(max_concurrency, MAX_WARM_BATCH) + 1)]


def speculative_runs(prompt_tokens: int, k: int, max_concurrency: int) -> list[WarmupRun]:
    """Warm-up rows verify a block a step, its width cycling from K + 1 down
    to 1 (``engine/speculative_batch.py``): tokens for one whole cycle when
    every draft is kept, and one more step of each width (some three cycles
    when every draft is rejected). On an H200 the first two steps of each pair of
    batch size and width were 2-5 times slower than the next, for batch sizes
    between the powers of two too (bench/verify_shapes.py), so every batch
    size is warmed."""
    steps = (k + 1) * (k + 2) // 2 + k + 1
    # Rows leaving one at a time compile the batch's gathers (``batch_runs``).
    return [WarmupRun(prompt_tokens, steps, rows, staggered=rows > 1)
            for rows in range(1, min(max_concurrency, MAX_SPECULATIVE_WARM_BATCH) + 1)]


def _cpu_plan(room: int, max_concurrency: int, batching: bool) -> tuple[WarmupRun, ...]:
    """On the CPU the warm-up saves the first user almost nothing: MLX keeps
    the CPU kernels it compiles on disk (``$TMPDIR/mlx/<version>/cpu``) and a
    fresh process loads them in milliseconds, while every warm-up token costs
    the CPU's slow prefill. Kernels are compiled per fused operation, not per
    length or batch size, so only the least that compiles each path once is
    kept. The sampled pair: with an empty kernel cache the first sampled
    request compiled for 3.2 s, and tests/engine/test_sampling_kernels.py
    checks that a client's first one compiles nothing after the warm-up. It
    passes with prompts of a few tokens and one token each, sampled after
    the prefill: decode steps compile nothing new. The two run side by side,
    so a batching model's batch prefills them and draws their one token (it
    runs no step for them; its steps compile nothing new either, which that
    test checks on a batching model). Then the timed short prompt
    (the prefill speed the restore-or-recompute decision needs), last, when
    nothing is left to compile in it. Before (a greedy batched pair, 16-token
    sampled prompts of 3 steps): bench/cold_breakdown.py. The grammar
    request compiles nothing there, and building the grammar's tokenizer at
    every load grew a CPU daemon by ~10 KB a load/unload cycle
    (bench/load_cycles.py: 15 KB against 5 KB without)."""
    sampled = WarmupRun(min(CPU_SAMPLED_PROMPT_TOKENS, room), 1, CPU_WARM_BATCH, kind="sampled")
    return (sampled, WarmupRun(min(CPU_PREFILL_TOKENS, room), 1, timed=True))


def _passage() -> str:
    # Real text: a random model fed repeated words can stop at once.
    import argparse

    source = Path(argparse.__file__).read_text(encoding="utf-8")
    start = source.index("class ArgumentParser(")
    return source[start : start + SAMPLE_CHARS]


def prompt_texts(lengths: Sequence[int], max_chars: int) -> list[str]:
    """Prompts of about ``lengths[i]`` tokens each (at most ``max_chars``
    characters, so even one token per character fits the context): real
    source text repeated, each opening with its own line so that no prompt is
    a prefix of another (the prefix cache would serve it instead of
    prefilling).

    Sized by characters, without the tokenizer: tokenizing here with each
    freshly loaded tokenizer grew the process by ~60 KB a load/unload cycle
    (measured), which a daemon that swaps models for weeks cannot afford.
    """
    passage = _passage()
    texts = []
    for number, n in enumerate(lengths):
        size = max(1, min(int(n * CHARS_PER_TOKEN), max_chars))
        text = f"# part {number}\n" + passage * (size // len(passage) + 1)
        texts.append(text[:size])
    return texts


# Any values do: they are kernel inputs. Each filter on, so each is compiled.
WARM_SAMPLING = SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05, top_k=40)
GREEDY = SamplingParams(temperature=0.0)


WARM_PENALTIES = dict(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
WARM_LOGPROBS = 3
# Needs a few tokens to complete, so a warm-up's 3 steps stay inside it.
WARM_SCHEMA = '{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}'


def warmup_request(run: WarmupRun, index: int, prompt: str, request_id: str, chat: bool) -> GenerationRequest:
    text: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    extra: dict[str, Any] = {}
    sampling = GREEDY
    if run.kind in ("shared", "sampled"):
        sampling = WARM_SAMPLING
        if run.kind == "sampled" and index % 2:
            sampling = dataclasses.replace(WARM_SAMPLING, seed=index, **WARM_PENALTIES)
            extra["logprobs"] = WARM_LOGPROBS
    elif run.kind == "constrained":
        # The grammar decides when to end; suppressing the end would leave no token allowed.
        return GenerationRequest(request_id=request_id, max_tokens=run.max_tokens, sampling=GREEDY,
                                 constraint=Constraint("json_schema", WARM_SCHEMA), warmup=True, **text)
    return GenerationRequest(request_id=request_id, max_tokens=run.max_tokens + (index if run.staggered else 0),
                             sampling=sampling, ignore_eos=True, warmup=True, **text, **extra)


async def _one(engine: Any, request: GenerationRequest) -> tuple[float, bool]:
    """Run one request to its end; returns seconds to its first token (the
    acceptance before it comes before the prefill) and whether it was
    aborted (a user request came, or the engine closed)."""
    started = time.perf_counter()
    first: float | None = None
    aborted = False
    stream = engine.generate(request)
    try:
        async for chunk in stream:
            if first is None and (chunk.completion_tokens > 0 or chunk.finish_reason is not None):
                first = time.perf_counter() - started
            aborted = aborted or chunk.finish_reason == "abort"
    finally:
        closer = getattr(stream, "aclose", None)
        if closer is not None:
            await closer()
    return (first if first is not None else time.perf_counter() - started), aborted


async def warm_up(engine: Any, runs: Sequence[WarmupRun], *, max_chars: int, mode: str = LOAD) -> WarmupReport:
    """Send ``runs`` through ``engine.generate``; never raises (a model that
    cannot run a warm-up prompt fails its first request the same way, with
    the error a user can read).

    Each run waits until the engine has no user request (``wait_idle``);
    a run a user request pushed aside is run again once it has gone, so
    every kernel of the plan is compiled and the timed run measures a
    prefill nobody interrupted. Before the engine is handed over nobody
    can push a run aside: an abort there means the engine closed."""
    started = time.perf_counter()
    requests = preempted = 0
    rate: float | None = None
    error: str | None = None
    try:
        prompts = prompt_texts([r.prompt_tokens for run in runs for r in [run] * run.concurrent], max_chars)
        texts = iter(prompts)
        for number, run in enumerate(runs):
            batch = [next(texts) for _ in range(run.concurrent)]
            while True:
                await engine.wait_idle()
                if engine.closed:
                    raise asyncio.CancelledError
                # The first one as a chat message: compiles the chat template once, too.
                results = await asyncio.gather(*(
                    _one(engine, warmup_request(run, i, text, f"warmup-{number}-{i}", chat=number == 0))
                    for i, text in enumerate(batch)
                ))
                if not any(aborted for _, aborted in results):
                    break
                preempted += 1
            requests += run.concurrent
            if run.timed and results[0][0] > 0:
                rate = run.prompt_tokens / results[0][0]
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        error = describe_exception(exc)
        log.warning("warm-up of %s failed (the model stays loaded): %s", getattr(engine, "name", "?"), error)
    return WarmupReport(round(time.perf_counter() - started, 4), requests,
                        round(rate, 1) if rate else None, error, mode, preempted)
