"""Speculative decoding step by step, below the daemon: what one decode step
costs in mlx-lm's BatchGenerator, in mlxd's speculative batch with every
step plain, with every step speculative, and with the governor deciding, on
the same prefilled rows of SmolLM2-135M-Instruct.

    python bench/speculative_steps.py --lines 200 --tokens 96 --rows 1 8

Per configuration: decode tok/s (all rows, first step excluded), ms per step,
tokens per step, and for speculation the acceptance rate, accepted tokens per
step and where a step's time goes (``--profile``: the verify forward, the
drawing, the rollback). The HTTP bench (bench/speculative.py) gives the
figures a user sees; this one says which part of a step costs. Prints a table
and merges the figures into bench/results/speculative_steps.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_dtype_option, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402
from bench.speculative import requests, variant  # noqa: E402


class Forced:
    """A governor that always says the same: every step plain or every step speculative."""

    def __init__(self, speculate: bool) -> None:
        self.speculate = speculate
        self.active = speculate
        self.speedup = None

    def choose(self, batch: int, context: int = 0) -> bool:
        return self.speculate

    def record(self, speculative: bool, tokens: int, seconds: float, leaving: bool = False) -> None:
        pass

    def joined(self) -> None:
        pass

    def shadow(self, seen: int, kept: int) -> None:
        pass


class StepParts:
    """``--profile``: where a speculative step's time goes. Wraps the model,
    the cache's roll-back (which evaluates itself) and the drafter so that
    each is evaluated and timed where it is called (the syncs make the whole
    step slower; the parts are the point)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def timed(self, part: str, call: Any) -> Any:
        import mlx.core as mx

        def run(*args: Any, **kwargs: Any) -> Any:
            mx.eval([])  # what was queued before is not this part's
            started = time.perf_counter()
            out = call(*args, **kwargs)
            if isinstance(out, mx.array):
                mx.eval(out)
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - started
            return out
        return run

    def model(self, model: Any) -> Any:
        parts = self

        class Timed:
            def __getattr__(self, name: str) -> Any:
                return getattr(model, name)

            def __call__(self, inputs: Any, cache: Any = None) -> Any:
                width = inputs.shape[1]
                return parts.timed("forward, 1 position" if width == 1 else "forward, block", model)(inputs, cache=cache)
        return Timed()

    def report(self, steps: int) -> str:
        return ", ".join(f"{part} {1000 * s / steps:.1f}" for part, s in sorted(self.seconds.items()))


_PREFILLED: dict[tuple[int, ...], list[Any]] = {}


def prefilled(model: Any, tokens: list[int], rows: int) -> list[list[Any]]:
    """``rows`` copies of the prompt's cache, prefilled once per prompt."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = _PREFILLED.get(tuple(tokens))
    if cache is None:
        cache = _PREFILLED[tuple(tokens)] = make_prompt_cache(model)
        prompt = mx.array(tokens[:-1])
        for start in range(0, prompt.size, 512):
            model(prompt[start : start + 512][None], cache=cache)
            mx.eval([c.state for c in cache])
    out = []
    for _ in range(rows):
        copy = make_prompt_cache(model)
        for mine, theirs in zip(copy, cache):
            mine.keys, mine.values, mine.offset = mx.array(theirs.keys), mx.array(theirs.values), theirs.offset
        out.append(copy)
    return out


def decode(generator: Any, model: Any, tokens: list[int] | list[list[int]], rows: int, limit: int,
           warmup: bool = False, sampler: Any = None) -> dict[str, Any]:
    """``tokens``: one prompt for every row, or one per row (``--distinct``);
    ``warmup``: the rows are the daemon's warm-up rows (every block width)."""
    from mlx_lm.generate import StopSequences
    from mlx_lm.sample_utils import greedy_sampler

    prompts = tokens if tokens and isinstance(tokens[0], list) else [tokens] * rows
    caches = prefilled(model, prompts[0], rows) if len({tuple(p) for p in prompts}) == 1 else [
        prefilled(model, p, 1)[0] for p in prompts]
    generator.insert(
        [[p[-1]] for p in prompts], max_tokens=[limit] * rows, caches=caches,
        all_tokens=[list(p[:-1]) for p in prompts], samplers=[sampler or greedy_sampler] * rows,
        logits_processors=[[] for _ in range(rows)], stop_sequences=[StopSequences() for _ in range(rows)],
        **({"warmups": [True] * rows} if warmup else {}),
    )
    out: list[list[int]] = [[] for _ in range(rows)]
    steps: list[tuple[float, int]] = []
    cpu: list[float] = []
    host: list[float] = []
    idle = 0
    while idle < 3:
        started, cpu_started, host_started = time.perf_counter(), time.process_time(), time.thread_time()
        _, responses = generator.next()
        took = time.perf_counter() - started
        cpu.append(time.process_time() - cpu_started)
        host.append(time.thread_time() - host_started)
        if not responses:
            # BatchGenerator's first call only takes the rows in.
            idle += 1
            continue
        for r in responses:
            out[r.uid].append(r.token)
        steps.append((took, len(responses)))
        if all(len(o) >= limit for o in out):
            break
    generator.close()
    timed = steps[1:]
    seconds = sum(s for s, _ in timed)
    made = sum(n for _, n in timed)
    # CPU seconds of the process (MLX's thread and OpenBLAS's together): on a
    # loaded machine less noisy than the wall clock, which the tok/s use.
    cpu_s = sum(cpu[-len(timed):])
    # CPU seconds of this thread alone: MLX computes on a thread of its own
    # (on every backend), so this is the host's share of a step (building
    # the graph, Python), which a fast GPU does not hide when it is larger
    # than the step's compute, and which the 2-core host's noise barely moves.
    host_s = sum(host[-len(timed):])
    return {"tok_s": made / seconds, "cpu_ms_per_token": 1000 * cpu_s / made,
            "host_ms_per_step": 1000 * host_s / len(timed), "ms_per_step": 1000 * seconds / len(timed),
            "tokens_per_step": made / len(timed), "steps": len(steps), "text": out[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--workload", default="code_edit", choices=["code_edit", "free_chat"])
    parser.add_argument("--only", nargs="*", default=None, help="configurations to run (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="run the configurations this many times, interleaved")
    parser.add_argument("--distinct", action="store_true",
                        help="each row asks for another function renamed (code_edit), so rows keep different "
                             "numbers of drafts and give back different numbers of positions, as real streams do; "
                             "by default every row is the same request")
    parser.add_argument("--profile", action="store_true",
                        help="also time each part of a speculating step (the verify forward, the roll-back, the "
                             "drafter), each evaluated where it is called, and the rest of the step")
    parser.add_argument("--warm", action="store_true",
                        help="before each row count, verify every block width at it as the daemon's warm-up does "
                             "(mlxd.engine.warmup.speculative_runs), so no configuration pays first uses of shapes")
    parser.add_argument("--trace", action="store_true",
                        help="print each governed step: chosen (S/p), then the kind recorded (p/s/l), its tokens "
                             "and ms, and the governor after it (+ on, - off)")
    parser.add_argument("--keep-governor", action="store_true",
                        help="one governor across the governed runs, as a daemon's engine keeps one")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="every row samples at this temperature with one shared sampler (default greedy)")
    parser.add_argument("--model", type=Path, default=None,
                        help="another mlx-lm folder in SmolLM2's place (a tiny factory model's steps are short: "
                             "on a CPU the host's work per step then weighs as on a fast GPU)")
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    # The daemon's attention kernels (engine/cuda_attention.py): with cuDNN's,
    # every verified block (more than one query row) has a new key length and
    # builds its own execution plan, which mlxd serve never does.
    from mlxd.engine.cuda_attention import prefer_mlx_attention_kernels
    prefer_mlx_attention_kernels()
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    from mlxd.engine.speculative_batch import SpeculativeGenerator
    from mlxd.engine.speculative_core import SpecStats
    from mlxd.engine.speculative_drafters import PromptLookup
    try:
        from mlxd.engine.speculative_governor import Governor
    except ImportError:  # a checkout from before the governor had its module (for before/after runs)
        from mlxd.engine.speculative_core import Governor  # type: ignore[attr-defined,no-redef]
    from mlxd.factory.smollm2 import smollm2_gguf
    from mlxd.gguf.cache import converted_dir

    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(temp=args.temperature) if args.temperature else None
    dtype = model_dtype(args)
    path = args.model or converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype=dtype)
    model, tokenizer = load(str(path))
    messages = requests(args.lines)[args.workload]
    tokens = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def prompts(rows: int) -> Any:
        if not args.distinct:
            return tokens
        return [list(tokenizer.apply_chat_template(variant(messages, i), add_generation_prompt=True))
                for i in range(rows)]
    load_avg = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"SmolLM2 ({dtype}), {args.workload}{', distinct rows' if args.distinct else ''}, "
          f"{args.lines} lines ({len(tokens)} prompt tokens), "
          f"{args.tokens} tokens, K={args.k}; load: {load_avg}", flush=True)

    def spec(governor: Any) -> tuple[Any, SpecStats]:
        stats = SpecStats()
        return SpeculativeGenerator(model, PromptLookup(), args.k, governor, stats), stats

    class Tallied(Governor):  # type: ignore[misc,valid-type]
        """The governor, counting what it chose and what each kind of step
        it timed took: where a governed run's time goes against plain steps."""

        def __init__(self) -> None:
            super().__init__()
            self.tally: dict[str, list[float]] = {}
            self.trace: list[str] = []  # --trace: one entry a step

        def choose(self, batch: int, context: int = 0) -> bool:
            chosen = super().choose(batch, context)
            self.tally.setdefault("chosen speculative" if chosen else "chosen plain", []).append(0.0)
            self.trace.append("S" if chosen else "p")
            return chosen

        def record(self, speculative: bool, tokens: int, seconds: float, leaving: bool = False) -> None:
            kind = "leaving" if leaving else "speculative" if speculative else "plain"
            self.tally.setdefault(kind, []).append(seconds)
            super().record(speculative, tokens, seconds, leaving)
            if args.trace:  # (formatted only when asked: the governed steps are timed)
                # What the step was, its tokens, its ms, and the governor after it (+ on, - off).
                self.trace[-1] += f"{kind[0]}{tokens}:{1000 * seconds:.1f}{'+' if self.active else '-'}"

        def report(self) -> str:
            return ", ".join(f"{k} {len(v)}" + (f" ({1000 * sum(v) / len(v):.1f} ms)" if any(v) else "")
                             for k, v in sorted(self.tally.items()))

    shared: list[Any] = []

    def governor() -> Any:
        # --keep-governor: one governor for every governed run, as a daemon's
        # engine keeps one across its requests (the trial of each mix once).
        if args.keep_governor and shared:
            shared[0].tally = {}
            return shared[0]
        shared[:] = [Tallied()]
        return shared[0]

    configs = {
        "BatchGenerator": lambda: (BatchGenerator(model, completion_batch_size=64, prefill_batch_size=64), None),
        "spec batch, plain": lambda: spec(Forced(False)),
        "spec batch, speculating": lambda: spec(Forced(True)),
        "spec batch, governor": lambda: spec(governor()),
    }
    if args.profile:
        configs["spec batch, speculating, profiled"] = lambda: profiled(spec(Forced(True)))
    parts = StepParts()

    def profiled(made: tuple[Any, SpecStats]) -> tuple[Any, SpecStats]:
        from mlxd.engine import speculative_cache

        generator, stats = made
        parts.seconds.clear()
        generator.model = parts.model(model)
        generator.drafter.propose = parts.timed("drafter", generator.drafter.propose)
        generator.drafter.commit = parts.timed("drafter", generator.drafter.commit)
        speculative_cache.roll_back = parts.timed("roll-back", original_roll_back)
        return generator, stats

    from mlxd.engine import speculative_cache
    original_roll_back = speculative_cache.roll_back
    decode(BatchGenerator(model), model, tokens[:64], 1, 4)  # warm-up: JIT-compiled kernels
    results: dict[str, Any] = {}
    rows_out = []
    warmed: set[int] = set()
    for rows, repeat in [(r, i) for r in args.rows for i in range(args.repeats)]:
        base = None
        if args.warm and rows not in warmed:
            from mlxd.engine.warmup import speculative_runs
            warmed.add(rows)
            for n in range(1, rows + 1):
                decode(spec(Governor())[0], model, prompts(n), n, speculative_runs(16, args.k, n)[-1].max_tokens, warmup=True)
        for name, make in configs.items():
            if args.only and not any(o in name for o in args.only):
                continue
            generator, stats = make()
            r = decode(generator, model, prompts(rows), rows, args.tokens, sampler=sampler)
            if "profiled" in name:
                speculative_cache.roll_back = original_roll_back
                step_ms = r["ms_per_step"]
                # The parts' seconds cover every step; the table's ms/step leaves out the first.
                print(f"  {rows} rows, ms per step ({step_ms:.1f} in all): {parts.report(r['steps'])}", flush=True)
                r["parts_ms_per_step"] = {k: 1000 * v / r["steps"] for k, v in parts.seconds.items()}
            if stats is not None:
                r["acceptance_rate"] = stats.acceptance_rate
                r["accepted_per_step"] = stats.accepted_per_step
            if isinstance(getattr(generator, "governor", None), Governor):
                r["active"] = generator.governor.active
                r["speedup"] = generator.governor.speedup
                r["steps_by_kind"] = {k: [len(v), sum(v)] for k, v in generator.governor.tally.items()}
                print(f"  {rows} rows, governor's steps: {generator.governor.report()}", flush=True)
                if args.trace:
                    print(f"  trace: {' '.join(generator.governor.trace)}", flush=True)
                generator.governor.trace = []
            base = base or r
            results[f"{rows}/{name}" + (f"/{repeat}" if args.repeats > 1 else "")] = {
                k: v for k, v in r.items() if k != "text"}
            rows_out.append([rows, name, f"{r['tok_s']:.1f}", f"{r['tok_s'] / base['tok_s']:.2f}x",
                             f"{r['cpu_ms_per_token']:.1f}", f"{base['cpu_ms_per_token'] / r['cpu_ms_per_token']:.2f}x",
                             f"{r['ms_per_step']:.1f}", f"{r['host_ms_per_step']:.2f}", f"{r['tokens_per_step']:.2f}",
                             "-" if r.get("acceptance_rate") is None else f"{r['acceptance_rate']:.2f}",
                             "-" if r.get("accepted_per_step") is None else f"{r['accepted_per_step']:.2f}",
                             "yes" if r["text"] == base["text"] else "no"])
            print(" ", rows_out[-1], flush=True)
    print(table(["rows", "configuration", "tok/s", "vs first", "cpu ms/token", "vs first (cpu)", "ms/step", "host ms/step", "tokens/step", "acceptance",
                 "per row step", "same text"], rows_out))
    key = f"{args.workload}-{args.lines}-lines-{args.tokens}-tokens" + ("-distinct" if args.distinct else "")
    print(f"wrote {save('speculative_steps', key, {'environment': environment(), 'uptime': load_avg, 'runs': results})}")


if __name__ == "__main__":
    main()
