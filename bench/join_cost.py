"""What a request joining a decoding batch costs, part by part.

    python bench/join_cost.py --size bench --rows 4 --joining 1 3

On an H100 the daemon's slow-turn log (bench/app_priority.py --turns) put
the tail of an interactive request's time to first token, and of the bulk
requests' times, in the turns where requests joined the batch: 50-75 ms
against 7-10 ms for a usual turn, with two or three bulk requests joining.
This bench runs the same path in one process on the qwen2 model of the
factory's ``--size``: ``--rows`` rows decode; every few steps ``--joining``
requests, their prompts already in their own caches as the daemon's prefix
cache hands them over, draw their first token as the daemon does
(``engine/batch.py``: one forward each on its own cache) and are inserted
into mlx-lm's BatchGenerator; they leave again a few steps later. Each part
is timed with the device synchronized around it, so the parts' times add up
to more than an unsynchronized step and say where the time goes:

- first tokens: the joining requests' own forwards and draws;
- merge: mlx-lm merging their caches into one batch cache;
- split: moving them from the prompt batch to a generation batch (which
  deep-copies the prompt batch's cache);
- new rows' step: the generation batch's first step, for the joining rows alone;
- extend: appending them to the decoding batch's caches;
- batch step: the decoding batch's own step in that call.

Prints a table (median ms over ``--joins`` joins, the first join apart:
a shape's first use) and merges the figures into bench/results/join_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import environment, prefilled_row, reexec_with_openblas, save, table  # noqa: E402

PARTS = ("first tokens", "merge", "split", "new rows' step", "extend", "batch step")


class Parts:
    """Wraps mlx-lm's join steps so that each is synchronized and timed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    def timed(self, part: str, call: Any) -> Any:
        import mlx.core as mx

        def run(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return call(*args, **kwargs)
            mx.synchronize()
            started = time.perf_counter()
            out = call(*args, **kwargs)
            mx.synchronize()
            self.seconds[part] += time.perf_counter() - started
            return out
        return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--rows", type=int, default=4, help="rows decoding when the others join")
    parser.add_argument("--joining", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--context", type=int, default=300, help="tokens in each row's cache")
    parser.add_argument("--joins", type=int, default=12)
    args = parser.parse_args()
    reexec_with_openblas()
    from mlxd.engine.cuda_attention import prefer_mlx_attention_kernels

    prefer_mlx_attention_kernels()
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlxd.factory import ModelRecipe, build_model

    # The module (the package's ``generate`` attribute is the function).
    mlx_generate = sys.modules["mlx_lm.generate"]
    path = build_model(ModelRecipe("qwen2", args.size))
    model, _ = load(str(path))
    sampler = make_sampler(temp=0.7)
    parts = Parts()
    mlx_generate._merge_caches = parts.timed("merge", mlx_generate._merge_caches)
    prompt_batch = mlx_generate.PromptProcessingBatch
    prompt_batch.split = parts.timed("split", prompt_batch.split)
    generation_batch = mlx_generate.GenerationBatch
    generation_batch.__init__ = parts.timed("new rows' step", generation_batch.__init__)
    generation_batch.extend = parts.timed("extend", generation_batch.extend)
    generation_batch.next = parts.timed("batch step", generation_batch.next)

    def first_token(cache: list[Any], tokens: list[int]) -> int:
        logits = model(mx.array(tokens[-1:])[None], cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs)
        mx.eval(token, logprobs)
        return int(token.item())

    results: dict[str, Any] = {}
    rows = []
    for joining in args.joining:
        generator = BatchGenerator(model, completion_batch_size=args.rows + joining,
                                   prefill_batch_size=args.rows + joining, prefill_step_size=512)
        base = [prefilled_row(model, args.context + i, i) for i in range(args.rows)]
        generator.insert([[t[-1]] for _, t in base], max_tokens=[10**6] * args.rows, caches=[c for c, _ in base],
                         samplers=[sampler] * args.rows)
        for _ in range(8):
            generator.next()
        plain: list[float] = []
        joins: list[dict[str, float]] = []
        for join in range(args.joins + 1):
            for _ in range(4):
                mx.synchronize()
                started = time.perf_counter()
                generator.next()
                mx.synchronize()
                plain.append(time.perf_counter() - started)
            arriving = [prefilled_row(model, args.context // 2 + 3 * join + i, 100 + join * 10 + i) for i in range(joining)]
            parts.seconds.clear()
            parts.on = True
            mx.synchronize()
            started = time.perf_counter()
            firsts = [first_token(c, t) for c, t in arriving]
            parts.seconds["first tokens"] = time.perf_counter() - started
            uids = generator.insert([[f] for f in firsts], max_tokens=[10**6] * joining,
                                    caches=[c for c, _ in arriving], samplers=[sampler] * joining)
            generator.next()
            mx.synchronize()
            whole = time.perf_counter() - started
            parts.on = False
            joins.append({**parts.seconds, "whole": whole})
            for _ in range(3):
                generator.next()
            generator.remove(uids)
        generator.close()
        later = joins[1:]
        usual = statistics.median(plain)
        figures = {part: statistics.median(j.get(part, 0.0) for j in later) for part in (*PARTS, "whole")}
        results[f"{joining} joining"] = {"rows": args.rows, "plain_step_ms": 1000 * usual,
                                         "first_join_ms": 1000 * joins[0]["whole"],
                                         **{f"{k}_ms": 1000 * v for k, v in figures.items()}}
        rows.append([joining, f"{1000 * usual:.1f}", f"{1000 * joins[0]['whole']:.1f}", f"{1000 * figures['whole']:.1f}",
                     *(f"{1000 * figures[p]:.1f}" for p in PARTS)])
    print(f"qwen2-{args.size}, {args.rows} rows decoding, caches of ~{args.context} tokens; ms, synchronized parts")
    print(table(["joining", "plain step", "first join", "join", *PARTS], rows))
    print(f"wrote {save('join_cost', f'qwen2-{args.size}-rows{args.rows}', {**results, **environment()})}")


if __name__ == "__main__":
    main()
