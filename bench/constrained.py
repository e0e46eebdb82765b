"""What constrained decoding costs: decode tok/s with a JSON-schema constraint / without.

Engine level (TextEngine on the MlxWorker, as the daemon runs it), greedy,
the same number of tokens either way: the free runs decode past EOS
(``ignore_eos``), the constrained ones follow a schema too long to finish
within ``max_tokens`` (an array of at least 50 nested objects with enums,
bounded strings and integers), so both end at ``max_tokens``. Runs alternate
after a warm-up; the best run of each is reported (the machine is shared:
slow runs measure the neighbours), with the ratio of medians beside it.

- single: one request at a time (``max_concurrency: 1``, stream_generate);
- batch of 4: four concurrent requests on a ``max_concurrency: 4`` engine
  (BatchGenerator), all constrained / all free; aggregate tok/s;
- compile: building the llguidance tokenizer, compiling a large schema
  (200 properties, nested), and a cached grammar's copy.

``--daemon`` measures the same through a `mlxd serve` process instead:
streamed /v1/chat/completions with ``response_format: json_schema`` against
the same requests without (``ignore_eos``), single and 4 concurrent clients,
tok/s from the first streamed token to the last (HTTP, SSE framing and the
tool-call splitting path included).

    python bench/constrained.py --size tiny
    python bench/constrained.py --size tiny --daemon
    python bench/constrained.py --size small --max-tokens 96 --repeats 3

Prints a table and merges the figures into bench/results/constrained.json
(one entry per size). Timing only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PROMPT, environment, reexec_with_openblas, save, table  # noqa: E402
from bench.engine_ab import compare, single_and_batched  # noqa: E402

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "kind": {"enum": ["cat", "dog", "bird", "fish"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "home": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "owned": {"type": "boolean"}},
            "required": ["zip", "owned"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "age", "home"],
    "additionalProperties": False,
}
# Longer than any max_tokens used here: the constrained runs end at max_tokens.
LONG = {"type": "array", "items": ITEM, "minItems": 50}


def large_schema(n: int = 200) -> dict[str, Any]:
    """A wide, nested schema of the kind agent frameworks send."""
    kinds = [
        {"type": "string", "maxLength": 64},
        {"type": "integer", "minimum": -1000, "maximum": 1000},
        {"type": "number"},
        {"type": "boolean"},
        {"enum": [f"v{i}" for i in range(12)]},
        {"type": "array", "items": {"type": "string", "format": "date-time"}, "maxItems": 8},
        ITEM,
        {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}]},
    ]
    props = {f"field_{i}": kinds[i % len(kinds)] for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)[: n // 2], "additionalProperties": False}


def request(rid: str, max_tokens: int, constrained: bool):
    from mlxd.engine.types import Constraint, GenerationRequest, SamplingParams

    return GenerationRequest(
        request_id=rid,
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0),
        prompt=PROMPT,
        ignore_eos=not constrained,
        constraint=Constraint.json_schema(LONG) if constrained else None,
    )


def compile_times(tokenizer: Any, vocab: int) -> dict[str, Any]:
    from mlxd.engine.types import Constraint
    from mlxd.grammar.compiler import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, vocab)
    started = time.perf_counter()
    compiler.ll_tokenizer()
    tokenizer_ms = (time.perf_counter() - started) * 1000
    schema = Constraint.json_schema(large_schema())
    started = time.perf_counter()
    compiler.matcher(schema)
    compile_ms = (time.perf_counter() - started) * 1000
    cached = []
    for _ in range(20):
        started = time.perf_counter()
        compiler.matcher(schema)
        cached.append((time.perf_counter() - started) * 1000)
    return {
        "ll_tokenizer_ms": round(tokenizer_ms, 1),
        "large_schema_bytes": len(schema.text),
        "large_schema_compile_ms": round(compile_ms, 2),
        "cached_copy_ms": round(statistics.median(cached), 3),
    }


async def bench(size: str, max_tokens: int, repeats: int) -> dict[str, Any]:
    result: dict[str, Any] = {"size": size, "max_tokens": max_tokens, "repeats": repeats}
    async for label, rows, engine in single_and_batched(size):
        result[label] = await compare(engine, request, "constrained", rows, max_tokens, repeats)
        if label == "single":
            _, tokenizer = engine.model.get()
            result["compile"] = compile_times(tokenizer, engine.grammars._vocab_size)
    result.update(environment())
    return result


async def streamed(client: Any, max_tokens: int, constrained: bool) -> tuple[float, float, int]:
    """(first token time, last token time, tokens) of one streamed chat request."""
    import json

    body: dict[str, Any] = {
        "model": "bench", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "long", "schema": LONG}}
    else:
        body["ignore_eos"] = True
    first = last = 0.0
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            now = time.perf_counter()
            if any(c["delta"].get("content") for c in chunk["choices"]):
                first = first or now
                last = now
            if chunk.get("usage") and not chunk["choices"]:
                tokens = chunk["usage"]["completion_tokens"]
    return first, last, tokens


async def daemon_rate(url: str, rows: int, max_tokens: int, constrained: bool) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        results = await asyncio.gather(*(streamed(client, max_tokens, constrained) for _ in range(rows)))
    for *_, tokens in results:
        assert tokens == max_tokens, (tokens, max_tokens)
    start = max(first for first, _, _ in results)
    end = max(last for _, last, _ in results)
    generated = sum(tokens for *_, tokens in results) - rows
    return generated / (end - start) if end > start else float("nan")


def daemon_bench(size: str, max_tokens: int, repeats: int) -> dict[str, Any]:
    from bench.common import daemon
    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe(arch="qwen2", size=size))
    result: dict[str, Any] = {"size": size, "max_tokens": max_tokens, "repeats": repeats, "through": "daemon"}
    for label, concurrency, rows in (("single", 1, 1), ("batch_of_4", 4, 4)):
        model = {"name": "bench", "path": str(path), "max_concurrency": concurrency, "max_context": 8192,
                 "prefix_cache": {"max_bytes": 0}}
        with daemon([model]) as url:
            asyncio.run(daemon_rate(url, rows, 16, True))  # warm-up: load, JIT kernels, grammar compile
            asyncio.run(daemon_rate(url, rows, 16, False))
            free, constrained = [], []
            for _ in range(repeats):
                free.append(asyncio.run(daemon_rate(url, rows, max_tokens, False)))
                constrained.append(asyncio.run(daemon_rate(url, rows, max_tokens, True)))
        f, c = max(free), max(constrained)
        result[label] = {
            "rows": rows, "free_tok_s": round(f, 1), "constrained_tok_s": round(c, 1), "ratio": round(c / f, 3),
            "ratio_of_medians": round(statistics.median(constrained) / statistics.median(free), 3),
            "free_runs": [round(x, 1) for x in free], "constrained_runs": [round(x, 1) for x in constrained],
        }
    result.update(environment())
    return result


def print_daemon_table(result: dict[str, Any]) -> None:
    print(
        f"\nqwen2-{result['size']} through mlxd serve (streamed chat): {result['max_tokens']} tokens a request, "
        f"best of {result['repeats']}, load average {result['load_average']:.1f}"
    )
    rows = [
        [label, r["rows"], r["free_tok_s"], r["constrained_tok_s"], f"{r['ratio']:.3f}", f"{r['ratio_of_medians']:.3f}"]
        for label, r in (("single", result["single"]), ("batch of 4", result["batch_of_4"]))
    ]
    print(table(["run", "rows", "free tok/s", "json_schema tok/s", "ratio", "of medians"], rows))


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nqwen2-{result['size']}: {result['max_tokens']} tokens a request, best of {result['repeats']}, "
        f"BLAS: {result['blas']}, load average {result['load_average']:.1f}"
    )
    rows = [
        [label, r["rows"], r["free_tok_s"], r["constrained_tok_s"], f"{r['ratio']:.3f}", f"{r['ratio_of_medians']:.3f}",
         r["free_cpu_ms_per_token"], r["constrained_cpu_ms_per_token"], f"{r['cpu_ratio']:.3f}"]
        for label, r in (("single", result["single"]), ("batch of 4", result["batch_of_4"]))
    ]
    headers = ["run", "rows", "free tok/s", "json_schema tok/s", "ratio", "of medians",
               "free CPU ms/tok", "json CPU ms/tok", "CPU ratio"]
    print(table(headers, rows))
    c = result["compile"]
    print(
        f"llguidance tokenizer: {c['ll_tokenizer_ms']} ms; large schema ({c['large_schema_bytes']} bytes): "
        f"compile {c['large_schema_compile_ms']} ms, cached copy {c['cached_copy_ms']} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--daemon", action="store_true", help="through a `mlxd serve` process and HTTP")
    args = parser.parse_args()
    max_tokens = args.max_tokens or {"tiny": 128, "small": 96, "bench": 32}[args.size]
    repeats = args.repeats or {"tiny": 5, "small": 3, "bench": 2}[args.size]
    if args.daemon:
        result = daemon_bench(args.size, max_tokens, repeats)
        print_daemon_table(result)
        print(f"saved to {save('constrained', f'{args.size}-daemon', result)}")
        return
    reexec_with_openblas()
    result = asyncio.run(bench(args.size, max_tokens, repeats))
    print_table(result)
    print(f"saved to {save('constrained', args.size, result)}")


if __name__ == "__main__":
    main()
