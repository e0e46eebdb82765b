"""What logit_bias costs per token: decode tok/s of biased requests / unbiased ones.

Engine level (TextEngine on the MlxWorker, as the daemon runs it), greedy,
the same number of tokens either way (both decode past EOS, ``ignore_eos``).
The biased requests carry ``--entries`` biases (small ones, from -5 to 5, so
the text stays the model's own kind of text), which mlxd adds as one
vector over the vocabulary per step. Runs alternate after a warm-up; the
best run of each is reported (the machine is shared: slow runs measure the
neighbours), with the ratio of medians and the CPU time per token beside it.

- single: one request at a time (``max_concurrency: 1``, stream_generate);
- batch of 4: four concurrent requests on a ``max_concurrency: 4`` engine
  (BatchGenerator), all biased / all unbiased; aggregate tok/s.

    python bench/logit_bias.py --size tiny
    python bench/logit_bias.py --size small --max-tokens 96 --repeats 3

Prints a table and merges the figures into bench/results/logit_bias.json
(one entry per size). Timing only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PROMPT, environment, reexec_with_openblas, save, table  # noqa: E402
from bench.engine_ab import compare, single_and_batched  # noqa: E402


def biases(entries: int, vocab_size: int) -> dict[int, float]:
    step = max(1, vocab_size // entries)
    return {token: float((i % 11) - 5) for i, token in enumerate(range(0, vocab_size, step)) if i < entries}


def request(rid: str, max_tokens: int, bias: dict[int, float] | None):
    from mlxd.engine.types import GenerationRequest, SamplingParams

    return GenerationRequest(request_id=rid, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
                             prompt=PROMPT, ignore_eos=True, logit_bias=bias)


async def bench(size: str, max_tokens: int, repeats: int, entries: int) -> dict[str, Any]:
    result: dict[str, Any] = {"size": size, "max_tokens": max_tokens, "repeats": repeats, "entries": entries}
    async for label, rows, engine in single_and_batched(size):
        bias = biases(entries, engine.vocab_size)
        result["vocab_size"] = engine.vocab_size
        result[label] = await compare(engine, lambda rid, n, biased: request(rid, n, bias if biased else None),
                                      "biased", rows, max_tokens, repeats)
    result.update(environment())
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nqwen2-{result['size']} (vocabulary {result['vocab_size']}): {result['max_tokens']} tokens a request, "
        f"{result['entries']} biases, best of {result['repeats']}, BLAS: {result['blas']}, "
        f"load average {result['load_average']:.1f}"
    )
    rows = [
        [label, r["rows"], r["free_tok_s"], r["biased_tok_s"], f"{r['ratio']:.3f}", f"{r['ratio_of_medians']:.3f}",
         r["free_cpu_ms_per_token"], r["biased_cpu_ms_per_token"]]
        for label, r in (("single", result["single"]), ("batch of 4", result["batch_of_4"]))
    ]
    headers = ["run", "rows", "free tok/s", "biased tok/s", "ratio", "of medians", "free CPU ms/tok",
               "biased CPU ms/tok"]
    print(table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--entries", type=int, default=300, help="biased token ids per request")
    args = parser.parse_args()
    max_tokens = args.max_tokens or {"tiny": 128, "small": 96, "bench": 32}[args.size]
    repeats = args.repeats or {"tiny": 5, "small": 3, "bench": 2}[args.size]
    reexec_with_openblas()
    result = asyncio.run(bench(args.size, max_tokens, repeats, args.entries))
    print_table(result)
    print(f"saved to {save('logit_bias', args.size, result)}")


if __name__ == "__main__":
    main()
