"""What giving back a verified block costs a speculative batch, per step:
mlx-lm's ``BatchKVCache`` (one row's dropped positions rolled to its front,
every row of every layer moved) against mlxd's ``HoledKVCache`` (the
positions masked where they are), and, as the floor, a step whose rows all
give back the same number (no row of its own to move), on a cache of
SmolLM2-135M's shape (30 layers, 3 KV heads of 64), rows of the same context.

    python bench/speculative_rollback.py --contexts 512 2048 8192 --rows 4 8

Each step: a block of K + 1 = 5 positions written into every row, then one
position given back by all rows and 0-3 more by each (as rows keeping
different numbers of drafts do), then one plain decode position: the time
from the block's write to the decode's keys, mask and attention evaluated.
Prints a table and merges the figures into bench/results/speculative_rollback.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_dtype_option, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402

LAYERS, HEADS, DIM, BLOCK = 30, 3, 64, 5


def build(kind: str, rows: int, context: int, dtype: Any) -> list[Any]:
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from mlxd.engine.holed_kv_cache import HoledKVCache

    layers = []
    for _ in range(LAYERS):
        cache = BatchKVCache([0] * rows)
        shape = (rows, HEADS, context, DIM)
        cache.update_and_fetch(mx.random.normal(shape).astype(dtype), mx.random.normal(shape).astype(dtype))
        layers.append(HoledKVCache.adopt(cache) if kind == "holed" else cache)
    mx.eval([layer.state for layer in layers])
    return layers


def step(layers: list[Any], rows: int, dtype: Any, roll: list[int]) -> float:
    import mlx.core as mx

    started = time.perf_counter()
    block = mx.zeros((rows, HEADS, BLOCK, DIM), dtype=dtype)
    one = mx.zeros((rows, HEADS, 1, DIM), dtype=dtype)
    outs = []
    for layer in layers:
        layer.update_and_fetch(block, block)
        layer.trim(1)
        layer.prepare(right_padding=roll)
        layer.finalize()
        mask = layer.make_mask(1)
        keys, values = layer.update_and_fetch(one, one)
        outs.append(mx.fast.scaled_dot_product_attention(one, keys, values, scale=1.0, mask=mask))
    mx.eval(outs)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=3)
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    import mlx.core as mx

    dtype = getattr(mx, model_dtype(args))
    results, lines = [], []
    for rows in args.rows:
        roll = [i % 4 for i in range(rows)]
        for context in args.contexts:
            figures = {}
            for kind in ("uniform", "rolled", "holed"):
                layers = build(kind, rows, context, dtype)
                gives = [0] * rows if kind == "uniform" else roll
                step(layers, rows, dtype, gives)  # kernels warmed, the buffer grown
                figures[kind] = statistics.median(step(layers, rows, dtype, gives) for _ in range(args.steps)) * 1000
                del layers
            results.append({"rows": rows, "context": context, **{f"{k}_ms": v for k, v in figures.items()},
                            "rolled_over_holed": figures["rolled"] / figures["holed"]})
            lines.append([rows, context, *(f"{figures[k]:.1f}" for k in ("uniform", "rolled", "holed")),
                          f"{figures['rolled'] / figures['holed']:.1f}x"])
            print(lines[-1], flush=True)
    print(table(["rows", "context", "uniform ms/step", "mlx-lm roll ms/step", "holes ms/step", "roll / holes"],
                lines))
    path = save("speculative_rollback", model_dtype(args),
                {"environment": environment(), "layers": LAYERS, "heads": HEADS, "dim": DIM, "block": BLOCK,
                 "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
