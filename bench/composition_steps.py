"""What the decode steps right after rows join or leave a batch cost.

    python bench/composition_steps.py --size bench --rows 4 --changes 24

On an H100 the daemon's slow-turn log (bench/app_priority.py --turns) showed
a slow step of 35-60 ms, nearly all of it the worker's CPU, after every
change of a batch's rows (joins and endings alike), against a usual 7-14 ms.
This bench takes one process, mlx-lm's BatchGenerator on the factory's qwen2
model of ``--size``: ``--rows`` rows decode; every few steps one row leaves
and another joins, its prompt already in its own cache as the daemon hands
it over. Each step (``next()``) is timed as the daemon's worker runs it, not
synchronized: wall time and the thread's CPU time. Two ways, alternating in
one run:

- as is: the rearranged caches are evaluated with the next step;
- settled: they are evaluated in a call of their own first
  (``mlxd/engine/batch_settle.py``), so that the step's operations, and the
  CUDA graphs MLX records for them, are those of any other step;
- mlxd batch: mlxd's own batch (``engine/speculative_batch.py``) in plain
  steps, settled too, which merges a joining row's cache into the batch's
  instead of running mlx-lm's prompt batch, its copy and the joining rows'
  own step;
- ends in next(): settled, the leaving row ending inside mlx-lm's step (its
  max_tokens reached, as the daemon's rows end), not removed between steps:
  mlx-lm filters it out after queueing the next step, and the filter reads
  the padding back, which waits for that step.

The last column, the window, is the step before the change, the change and
the three steps after it: the same four steps in every way, wherever the
row leaves.

Prints the steady steps' median and the first three steps after a change
(median and max), wall and CPU, per way, and the memory MLX took from the
device anew over each change's window (its buffer cache had nothing of that
size: on CUDA each new buffer is a ``cudaMallocManaged``, host time in the
step that asks for it); merges the figures into
bench/results/composition_steps.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import environment, prefilled_row, reexec_with_openblas, save, table  # noqa: E402

WAYS = ("as is", "settled", "mlxd batch", "ends in next()")


class Plain:
    """The speculative batch's drafter and governor for a batch that never
    speculates: mlxd's own batch (engine/speculative_batch.py) decoding plain
    steps, which joins rows by merging their caches into the batch's, without
    mlx-lm's prompt batch, its copy and the joining rows' own step."""

    def join(self, histories: list[list[int]], caches: Any = None) -> None:
        pass

    def would_draft(self, then: list[int] | None = None) -> bool:
        return False

    def could_draft_next(self) -> bool:
        return False

    def commit(self, emitted: list[list[int]], drafted: list[int]) -> None:
        pass

    def shadow_counts(self) -> None:
        return None

    def filter(self, keep: list[int]) -> None:
        pass

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass

    def choose(self, batch: int, context: int = 0) -> bool:
        return False

    def record(self, speculative: bool, tokens: int, seconds: float, leaving: bool = False) -> None:
        pass

    def joined(self) -> None:
        pass

    def shadow(self, seen: int, kept: int) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--context", type=int, default=300, help="tokens in each row's cache")
    parser.add_argument("--changes", type=int, default=24, help="changes per way (after a warm-up of 4 each)")
    parser.add_argument("--between", type=int, default=6, help="steps between two changes")
    args = parser.parse_args()
    reexec_with_openblas()
    from mlxd.engine.cuda_attention import prefer_mlx_attention_kernels

    prefer_mlx_attention_kernels()
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator, StopSequences
    from mlx_lm.sample_utils import make_sampler

    from mlxd.engine.batch_settle import settle
    from mlxd.engine.speculative_batch import SpeculativeGenerator
    from mlxd.engine.speculative_core import SpecStats
    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe("qwen2", args.size))
    model, _ = load(str(path))
    sampler = make_sampler(temp=0.7)

    seeds = iter(range(10**6))

    def join(generator: Any, arriving: list[tuple[list[Any], list[int]]]) -> list[int]:
        count = len(arriving)
        caches = [c for c, _ in arriving]
        if isinstance(generator, BatchGenerator):
            return generator.insert([[t[-1]] for _, t in arriving], max_tokens=[10**6] * count,
                                    caches=caches, samplers=[sampler] * count)
        return generator.insert([[t[-1]] for _, t in arriving], max_tokens=[10**6] * count, caches=caches,
                                all_tokens=[t[:-1] for _, t in arriving], samplers=[sampler] * count,
                                logits_processors=[[]] * count, stop_sequences=[StopSequences()] * count)

    def step(generator: Any, way: str) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        generator.next()
        if way != "as is":
            settle(generator)
        return time.perf_counter() - wall, time.thread_time() - cpu

    steady: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    after: dict[str, list[list[tuple[float, float]]]] = {w: [] for w in WAYS}
    generators: dict[str, Any] = {}
    members: dict[str, list[int]] = {}
    for way in WAYS:
        if way == "mlxd batch":
            plain = Plain()
            generators[way] = SpeculativeGenerator(model, plain, 4, plain, SpecStats())  # type: ignore[arg-type]
        else:
            generators[way] = BatchGenerator(model, completion_batch_size=args.rows + 1,
                                             prefill_batch_size=args.rows + 1, prefill_step_size=512)
        members[way] = join(generators[way], [prefilled_row(model, args.context + i, next(seeds)) for i in range(args.rows)])
        for _ in range(8):
            step(generators[way], way)
    windows: dict[str, list[float]] = {w: [] for w in WAYS}
    allocated: dict[str, list[int]] = {w: [] for w in WAYS}
    for change in range(len(WAYS) * (args.changes + 4)):
        way = WAYS[change % len(WAYS)]
        generator, uids = generators[way], members[way]
        arriving = prefilled_row(model, args.context + next(seeds) % 40, next(seeds))
        leaving = uids.pop(0)
        if way == "ends in next()":
            # The row's limit is reached in the next step, which lets it go inside mlx-lm.
            batch = generator._generation_batch
            row = batch.uids.index(leaving)
            batch.max_tokens[row] = batch._num_tokens[row] + 1
        held = mx.get_active_memory() + mx.get_cache_memory()
        before = step(generator, way)
        # One leaves, one joins: the batch keeps its size, its rows change.
        # The change is timed with the first step after it: mlx-lm's insert
        # only queues the row, which its next step moves in; mlxd's merges it.
        wall, cpu = time.perf_counter(), time.thread_time()
        if way != "ends in next()":
            generator.remove([leaving])
            if way != "as is":
                settle(generator)
        uids += join(generator, [arriving])
        changed = (time.perf_counter() - wall, time.thread_time() - cpu)
        first = [step(generator, way) for _ in range(3)]
        first[0] = (first[0][0] + changed[0], first[0][1] + changed[1])
        window = before[0] + sum(w for w, _ in first)
        rest = [step(generator, way) for _ in range(args.between)]
        # What MLX took from the device anew (its buffer cache had no buffer
        # of that size): on CUDA each such buffer is a cudaMallocManaged call.
        grown = mx.get_active_memory() + mx.get_cache_memory() - held
        if change >= 4 * len(WAYS):
            after[way].append(first)
            steady[way] += rest[1:]
            windows[way].append(window)
            allocated[way].append(max(0, grown))
        mx.synchronize()
    for generator in generators.values():
        generator.close()

    rows, results = [], {}
    for way in WAYS:
        figures = {"steady_ms": 1000 * statistics.median(w for w, _ in steady[way]),
                   "steady_cpu_ms": 1000 * statistics.median(c for _, c in steady[way])}
        for i in range(3):
            walls = [f[i][0] for f in after[way]]
            cpus = [f[i][1] for f in after[way]]
            figures[f"after_{i + 1}_ms"] = 1000 * statistics.median(walls)
            figures[f"after_{i + 1}_max_ms"] = 1000 * max(walls)
            figures[f"after_{i + 1}_cpu_ms"] = 1000 * statistics.median(cpus)
        figures["new_device_mb_per_change"] = statistics.mean(allocated[way]) / 1e6
        figures["changes_allocating"] = sum(1 for a in allocated[way] if a > 0)
        figures["window_ms"] = 1000 * statistics.median(windows[way])
        figures["window_max_ms"] = 1000 * max(windows[way])
        results[way] = figures
        rows.append([way, f"{figures['steady_ms']:.1f} ({figures['steady_cpu_ms']:.1f})",
                     *(f"{figures[f'after_{i}_ms']:.1f} / {figures[f'after_{i}_max_ms']:.1f} "
                       f"({figures[f'after_{i}_cpu_ms']:.1f})" for i in (1, 2, 3)),
                     f"{figures['window_ms']:.1f} / {figures['window_max_ms']:.1f}",
                     f"{figures['new_device_mb_per_change']:.2f} ({figures['changes_allocating']}/{len(allocated[way])})"])
    print(f"qwen2-{args.size}, {args.rows} rows, one leaves and one joins every {args.between + 4} steps, "
          f"{args.changes} changes a way; ms: median / max (median CPU of the worker thread)")
    print(table(["way", "steady step", "change + 1st step", "2nd", "3rd", "window",
                 "new device MB a change (changes that allocated)"], rows))
    print(f"wrote {save('composition_steps', f'qwen2-{args.size}-rows{args.rows}', {**results, **environment()})}")


if __name__ == "__main__":
    main()
