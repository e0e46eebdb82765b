"""What the first use of each verify-block shape costs: a speculative batch's
steps on SmolLM2-135M-Instruct, one (rows, block width) pair after another,
each pair run three times in a row, in a fresh process.

    python bench/verify_shapes.py --rows 1 2 4 8 --k 4 --context 600

A device that JIT-compiles its kernels (NVRTC on CUDA) pays for a shape it has
not run before on the step that first runs it; the governor times that step
like any other. The first/second/third columns say which shapes pay, and how
much, so the warm-up (``mlxd.engine.warmup``) knows what to run before users
do. Run it first on a fresh machine (MLX keeps compiled kernels on disk, so a
second run shows warm figures). Prints a table and merges the figures into
bench/results/verify_shapes.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_dtype_option, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402
from bench.speculative import requests, variant  # noqa: E402
from bench.speculative_steps import Forced, prefilled  # noqa: E402


class RepeatDrafter:
    """Drafts of any length the bench asks for: the row's context's last
    token repeated (verification decides what is kept, as for real drafts)."""

    def __init__(self) -> None:
        self.last: list[int] = []

    def join(self, histories: list[list[int]], _caches: Any = None) -> None:
        self.last += [h[-1] for h in histories]

    def propose(self, k: int) -> list[list[int]]:
        return [[t] * k for t in self.last]

    def would_draft(self) -> bool:
        return True

    def could_draft_next(self) -> bool:
        return True

    def commit(self, emitted: list[list[int]], _drafted: list[int]) -> None:
        self.last = [e[-1] if e else t for e, t in zip(emitted, self.last)]

    def filter(self, keep: list[int]) -> None:
        self.last = [self.last[i] for i in keep]

    def settle(self) -> None:
        pass

    def close(self) -> None:
        self.last = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--context", type=int, default=600, help="prompt tokens in each row's cache")
    parser.add_argument("--repeats", type=int, default=3, help="steps per (rows, width) pair")
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    from mlxd.engine.cuda_attention import prefer_mlx_attention_kernels
    prefer_mlx_attention_kernels()
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import StopSequences
    from mlx_lm.sample_utils import greedy_sampler

    from mlxd.engine.speculative_batch import SpeculativeGenerator
    from mlxd.engine.speculative_core import SpecStats
    from mlxd.factory.smollm2 import smollm2_gguf
    from mlxd.gguf.cache import converted_dir

    dtype = model_dtype(args)
    path = converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype=dtype)
    model, tokenizer = load(str(path))
    messages = requests(200)["code_edit"]
    prompts = [list(tokenizer.apply_chat_template(variant(messages, i), add_generation_prompt=True))[: args.context]
               for i in range(max(args.rows))]
    print(f"SmolLM2 ({dtype}), {args.context}-token rows, K={args.k}", flush=True)
    out_rows, results = [], {}
    for rows in args.rows:
        generator = SpeculativeGenerator(model, RepeatDrafter(), args.k, Forced(True), SpecStats())
        caches = [prefilled(model, p, 1)[0] for p in prompts[:rows]]
        generator.insert(
            [[p[-1]] for p in prompts[:rows]], max_tokens=[10_000] * rows, caches=caches,
            all_tokens=[list(p[:-1]) for p in prompts[:rows]], samplers=[greedy_sampler] * rows,
            logits_processors=[[] for _ in range(rows)], stop_sequences=[StopSequences() for _ in range(rows)],
        )
        for width in range(1, args.k + 2):
            times = []
            for _ in range(args.repeats):
                for row in generator._rows:
                    row.want = width - 1
                mx.eval([])
                started = time.perf_counter()
                generator.next()
                mx.eval([layer.state for layer in generator._cache])
                times.append(1000 * (time.perf_counter() - started))
            results[f"{rows}x{width}"] = times
            out_rows.append([rows, width, *[f"{t:.1f}" for t in times]])
            print(" ", out_rows[-1], flush=True)
        generator.close()
    print(table(["rows", "width", *[f"step {i + 1} ms" for i in range(args.repeats)]], out_rows))
    print(f"wrote {save('verify_shapes', f'{dtype}-{args.context}', {'environment': environment(), 'ms': results})}")


if __name__ == "__main__":
    main()
