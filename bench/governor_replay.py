"""The auto-off on real token streams, timed by a model of a GPU's step costs.

    python bench/governor_replay.py --workload free_chat --rows 1 --requests 6

A governed run's speed on a GPU depends on which steps the governor makes
speculate; measured there, each run's figure moves by more than the rule
changes it (one H100's plain decoding moved from 123 to 92 tok/s between
two repeats). This bench separates the two: SmolLM2 decodes on this
machine through mlxd's speculative batch with prompt lookup and the real
governor, one governor kept across ``--requests`` requests as a daemon's
engine keeps one, but every step the governor is told of takes the time a
cost model gives its kind (``--costs``: plain, a read-back that found no
drafts, a verify step, the step leaving speculation, in plain steps; the
defaults are an H100's at one row, 2026-12-07: 8.4-10.6 ms plain,
11.3-13.7 speculating, `bench/speculative_steps.py --keep-governor`). The
tokens are the model's own, so how often drafts come and how many are
kept is real. Prints, per request, the modeled speed over plain decoding
and the steps of each kind, and their total.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_dtype_option, model_dtype, reexec_with_openblas, table  # noqa: E402
from bench.speculative import requests, variant  # noqa: E402
from bench.speculative_steps import prefilled  # noqa: E402

KINDS = ("plain", "read-back", "verify", "leaving", "untimed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="free_chat", choices=["code_edit", "free_chat"])
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--costs", type=float, nargs=4, default=[1.0, 1.3, 1.45, 1.5],
                        metavar=("PLAIN", "READ_BACK", "VERIFY", "LEAVING"))
    parser.add_argument("--noise", type=float, default=0.0,
                        help="each step's modeled time times exp(N(0, NOISE)): a GPU host's step-to-step spread")
    parser.add_argument("--seed", type=int, default=0)
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()

    from mlx_lm import load
    from mlx_lm.generate import StopSequences
    from mlx_lm.sample_utils import greedy_sampler

    from mlxd.engine.speculative_batch import SpeculativeGenerator
    from mlxd.engine.speculative_core import SpecStats
    from mlxd.engine.speculative_drafters import PromptLookup
    from mlxd.engine.speculative_governor import Governor
    from mlxd.factory.smollm2 import smollm2_gguf
    from mlxd.gguf.cache import converted_dir

    import random
    spread = random.Random(args.seed)
    cost = dict(zip(("plain", "read-back", "verify", "leaving"), args.costs), untimed=args.costs[0])
    path = converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype=model_dtype(args))
    model, tokenizer = load(str(path))
    messages = requests(args.lines)[args.workload]

    class Clocked(Governor):
        """The real governor, told the modeled time of each step instead of the measured one."""

        def __init__(self) -> None:
            super().__init__()
            self.kind: str | None = None  # the step chosen last, once known
            self.steps: list[str] = []
            self.times: list[float] = []
            self.verified = False

        def choose(self, batch: int, context: int = 0) -> bool:
            self._close()
            self.kind = "untimed"
            return super().choose(batch, context)

        def record(self, speculative: bool, tokens: int, seconds: float, leaving: bool = False) -> None:
            if leaving:
                self.kind = "leaving"
            elif not speculative:
                self.kind = "plain"
            else:
                self.kind = "verify" if self.verified else "read-back"
            self.verified = False
            self.times.append(cost[self.kind] * math.exp(spread.gauss(0, args.noise)))
            super().record(speculative, tokens, self.times[-1] / 1000, leaving)

        def _close(self) -> None:
            if self.kind is not None:
                self.steps.append(self.kind)
            self.kind = None

    governor = Clocked()
    rows_out = []
    totals = {k: 0 for k in KINDS}
    made_all = 0
    for request in range(args.requests):
        prompts = [list(tokenizer.apply_chat_template(variant(messages, i + request * args.rows),
                                                        add_generation_prompt=True)) for i in range(args.rows)]
        generator = SpeculativeGenerator(model, PromptLookup(args.k), args.k, governor, SpecStats())
        verify = generator._verify

        def flagged(rows: Any, verify: Any = verify) -> Any:
            governor.verified = True
            return verify(rows)
        generator._verify = flagged  # type: ignore[method-assign]
        caches = [prefilled(model, p, 1)[0] for p in prompts]
        generator.insert([[p[-1]] for p in prompts], max_tokens=[args.tokens] * args.rows, caches=caches,
                         all_tokens=[list(p[:-1]) for p in prompts], samplers=[greedy_sampler] * args.rows,
                         logits_processors=[[] for _ in prompts], stop_sequences=[StopSequences() for _ in prompts])
        governor.joined()
        governor.steps = []
        made = 0
        while generator._rows:
            made += len(generator.next()[1])
        governor._close()
        generator.close()
        counts = {k: governor.steps.count(k) for k in KINDS}
        modeled = sum(cost[k] * n for k, n in counts.items())
        plain = made / args.rows * cost["plain"]  # one token a row a step
        rows_out.append([request + 1, made, f"{plain / modeled:.3f}", *(counts[k] for k in KINDS),
                         "on" if governor.active else "off"])
        print(" ", rows_out[-1], flush=True)
        for k in KINDS:
            totals[k] += counts[k]
        made_all += made
    modeled = sum(cost[k] * n for k, n in totals.items())
    rows_out.append(["all", made_all, f"{made_all / args.rows * cost['plain'] / modeled:.3f}",
                     *(totals[k] for k in KINDS), ""])
    print(f"SmolLM2, {args.workload}, {args.rows} row(s), {args.tokens} tokens, K={args.k}, "
          f"costs in plain steps {dict(zip(KINDS, args.costs))}")
    print(table(["request", "tokens", "x plain (modeled)", *KINDS, "at the end"], rows_out))


if __name__ == "__main__":
    main()
