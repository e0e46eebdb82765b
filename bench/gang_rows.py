"""A gang's continuous batch without the ring: the ranks' step program
(``mlxd/distributed/rank.py``'s ``Runner``) in one process on a group of
one, fed N requests at once, so what it measures is the program and the
model, not a transport or a busy machine's scheduler (on a 2-core machine
two ring ranks spin on both cores and the daemon waits for one).

    python bench/gang_rows.py                       # tiny model, 1 / 4 / 8 rows
    python bench/gang_rows.py --size small --tokens 64 --rows 1 2 4 8

Aggregate tokens/s over the requests' whole run (their prefills included),
the median of --rounds rounds after a warm-up round, and the ratio to one
row. Prints a table and merges the figures into bench/results/gang_rows.json.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import environment, reexec_with_openblas, save, table  # noqa: E402


class Events:
    """The rank's event channel: counts the rows that ended and says exit
    once all of a round's did."""

    def __init__(self) -> None:
        self.ended = 0
        self.want = 0
        self.inbox: queue.Queue[dict[str, Any] | None] | None = None

    def write(self, line: str) -> None:
        if '"ev":"end"' in line:
            self.ended += 1
            if self.ended == self.want and self.inbox is not None:
                self.inbox.put({"op": "exit"})

    def flush(self) -> None:
        pass


def request(i: int, prompt: int, tokens: int) -> dict[str, Any]:
    ids = [(31 * i + 7 * j) % 2000 + 3 for j in range(prompt)]
    return {"op": "generate", "id": str(i), "tokens": ids, "max_tokens": tokens, "vocab_size": 2048,
            "sampling": {"temperature": 0.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", help="factory size: tiny, small, bench")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens a request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reexec_with_openblas()

    import mlx.core as mx

    from mlxd.distributed import rank as rank_program
    from mlxd.factory import ModelRecipe, build_model

    group = mx.distributed.init()
    model = rank_program._load(str(build_model(ModelRecipe("qwen2", args.size))), "tensor", group)
    events = Events()
    runner = rank_program.Runner(model, group, rank_program.Reporter(events, 0), set(), set(),
                                 max_batch=max(args.rows))
    rates: dict[int, list[float]] = {}
    for rows in args.rows:
        rates[rows] = []
        for _ in range(args.rounds + 1):
            inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
            events.ended, events.want, events.inbox = 0, rows, inbox
            for i in range(rows):
                inbox.put(request(i, args.prompt, args.tokens))
            started = time.perf_counter()
            runner.serve(inbox, lambda message: None)
            rates[rows].append(rows * args.tokens / (time.perf_counter() - started))
        rates[rows] = rates[rows][1:]  # the first round compiles and warms
    medians = {rows: statistics.median(r) for rows, r in rates.items()}
    one = medians.get(1)
    print(table(["rows", "aggregate tok/s (median)", "vs 1 row", "rounds"],
                [[rows, f"{m:.1f}", f"{m / one:.2f}x" if one else "", len(rates[rows])] for rows, m in medians.items()]))
    result = {"environment": environment(), "tokens": args.tokens, "prompt": args.prompt,
              "tok_s": {str(k): v for k, v in rates.items()}, "median": {str(k): v for k, v in medians.items()}}
    print(f"wrote {save('gang_rows', args.size, json.loads(json.dumps(result)))}")


if __name__ == "__main__":
    main()
