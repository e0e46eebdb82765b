"""What an embedding pass costs the MLX worker's thread, by how its batches' shapes vary.

A chat stream beside embedding clients (bench/chat_beside_embeddings.py) lost
a tenth of the worker's time on an H100 to ``mx.async_eval`` of the
embedding passes: queueing a pass, not running it. On CUDA, MLX records a
pass into a CUDA graph and updates an instantiated graph in place only where
the pass records the same kernels (cuBLAS picks its kernels by shape), and
dynamic batching gives nearly every pass a new (rows, width). This times, per
pass, building the graph (``LoadedEncoder.embed``), queueing it
(``mx.async_eval``) and waiting for it, over three sequences of batch shapes:

- ``as is``: each batch's own shape (rows 1-8, width 8-40 tokens);
- ``bucketed``: the same batches padded up (rows to a power of two, width to
  a multiple of 8: 20 shapes);
- ``one shape``: every batch 8 rows of 40 tokens, the floor;
- ``bucketed, compiled``: the bucketed shapes through a compiled encoder
  (``LoadedEncoder(compiled=True)``: ``mx.compile`` of the forward, pooling
  and normalization, one trace per shape). Its first pass at each shape (the
  trace, and the fused kernels' compiling) is timed apart, before the rest,
  and printed under the table.

Only the shapes matter here (the inputs are random token ids).

    python bench/encoder_shapes.py                 # MiniLM's shape, random weights
    python bench/encoder_shapes.py --passes 400

Prints a table of medians and 90th percentiles (ms) and merges the figures
into bench/results/encoder_shapes.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import environment, reexec_with_openblas, save, table  # noqa: E402


def batches(count: int, seed: int) -> list[tuple[int, int]]:
    """(rows, width) of ``count`` batches as 8 clients' short texts make them."""
    draw = random.Random(seed)
    return [(draw.randint(1, 8), draw.randint(8, 40)) for _ in range(count)]


def bucketed(rows: int, width: int) -> tuple[int, int]:
    return 1 << (rows - 1).bit_length(), -(-width // 8) * 8


def time_passes(encoder: Any, shapes: list[tuple[int, int]], vocab: int) -> dict[str, list[float]]:
    import mlx.core as mx

    from mlxd.engine.embedding_batch import Batch, Row

    draw = random.Random(1)
    out: dict[str, list[float]] = {"build": [], "queue": [], "wait": []}
    for rows, width in shapes:
        batch = Batch(tuple(Row(request=0, index=i, ids=tuple(draw.randrange(5, vocab) for _ in range(width)))
                            for i in range(rows)))
        started = time.perf_counter()
        result = encoder.embed(batch)
        built = time.perf_counter()
        mx.async_eval(result)
        queued = time.perf_counter()
        mx.eval(result)
        done = time.perf_counter()
        out["build"].append(built - started)
        out["queue"].append(queued - built)
        out["wait"].append(done - queued)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    reexec_with_openblas()
    from mlxd.engine.embedding_model import LoadedEncoder, load_embedder
    from mlxd.factory.encoders import EncoderRecipe, build_encoder

    # all-MiniLM-L6-v2's shape: 6 layers, 384 wide, 12 heads.
    folder = build_encoder(EncoderRecipe(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                         intermediate_size=1536, max_seq_length=256))
    encoder, tokenizer = load_embedder(folder)
    compiled = LoadedEncoder(encoder.model, encoder.recipe, pad_id=encoder.pad_id, dimensions=encoder.dimensions,
                             compiled=True)
    shapes = batches(args.passes, args.seed)
    bucket_shapes = [bucketed(*shape) for shape in shapes]
    ways = {"as is": (encoder, shapes), "bucketed": (encoder, bucket_shapes),
            "one shape": (encoder, [(8, 40)] * args.passes), "bucketed, compiled": (compiled, bucket_shapes)}
    for way_encoder, shape_list in ways.values():  # kernels compiled, first graphs made
        if way_encoder is compiled:
            # Its first pass at each shape, timed apart: the trace (and the fused kernels' compiling).
            first = time_passes(compiled, sorted(set(bucket_shapes)), tokenizer.vocab_size)
        time_passes(way_encoder, shape_list[:50], tokenizer.vocab_size)
    figures: dict[str, Any] = {}
    for name, (way_encoder, shape_list) in ways.items():
        times = time_passes(way_encoder, shape_list, tokenizer.vocab_size)
        figures[name] = {part: {"median_ms": 1000 * statistics.median(v), "p90_ms": 1000 * sorted(v)[int(0.9 * len(v))]}
                         for part, v in times.items()}
    rows = [[name, *(f"{f[part]['median_ms']:.3f} / {f[part]['p90_ms']:.3f}" for part in ("build", "queue", "wait"))]
            for name, f in figures.items()]
    print(table(["batches", "build ms (median / p90)", "async_eval ms", "wait ms"], rows))
    print(f"\n{args.passes} passes a way, MiniLM's shape, random weights")
    first_ms = {part: (1000 * statistics.median(v), 1000 * max(v)) for part, v in first.items()}
    print(f"compiled, first pass at each of its {len(first['build'])} shapes (ms, median / max): "
          + ", ".join(f"{part} {median:.1f} / {top:.1f}" for part, (median, top) in first_ms.items()))
    result = {"passes": args.passes, "environment": environment(), "ways": figures,
              "compiled_first_pass": {"shapes": len(first["build"]),
                                      **{part: {"median_ms": median, "max_ms": top}
                                         for part, (median, top) in first_ms.items()}}}
    print(f"-> {save('encoder_shapes', str(args.passes), result)}")


if __name__ == "__main__":
    main()
