"""The ranks' step program (``distributed/rank.py``'s ``Runner``) in one
process, on a group of one, so the order of its events is the order of its
work: what it admits when, how prompts interleave with the batch's steps,
and that every row decodes what it decodes alone. The gang tests run the
same program over real ranks (tests/distributed/test_gang_e2e.py)."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable

import mlx.core as mx
import pytest

from mlxd.distributed import rank as rank_program
from mlxd.factory import ModelRecipe, build_model

pytestmark = pytest.mark.mlx


class Events:
    """The rank's event channel, read back; says exit once ``want`` rows ended."""

    def __init__(self) -> None:
        self.lines: list[dict] = []
        self.inbox: queue.Queue | None = None
        self.want = 0
        # (event test, message): the message reaches the inbox once an event passes the test.
        self.later: list[tuple[Callable[[dict], bool], dict]] = []

    def write(self, line: str) -> None:
        event = json.loads(line)
        self.lines.append(event)
        for when, message in list(self.later):
            if when(event):
                self.later.remove((when, message))
                self.inbox.put(message)
        if event["ev"] == "end" and sum(e["ev"] == "end" for e in self.lines) == self.want:
            self.inbox.put({"op": "exit"})

    def flush(self) -> None:
        pass


@pytest.fixture(scope="module")
def model():
    path = build_model(ModelRecipe("qwen2", "tiny"))
    return rank_program._load(str(path), "tensor", mx.distributed.init())


def _run(model, messages: list[dict], max_batch: int = 8, later: list | None = None) -> Events:
    events = Events()
    events.later = list(later or [])
    runner = rank_program.Runner(model, mx.distributed.init(), rank_program.Reporter(events, 0), set(), set(),
                                 max_batch=max_batch)
    inbox: queue.Queue = queue.Queue()
    events.inbox = inbox
    events.want = sum(m["op"] == "generate" for m in [*messages, *(m for _, m in events.later)])
    for message in messages:
        inbox.put(message)
    runner.serve(inbox, lambda message: None)
    return events


def _ask(rid: str, prompt: int, max_tokens: int, **extra) -> dict:
    tokens = [(31 * int(rid, 36) + 7 * i) % 500 + 3 for i in range(prompt)]
    return {"op": "generate", "id": rid, "tokens": tokens, "max_tokens": max_tokens, "vocab_size": 1000,
            "sampling": {"temperature": 0.0}, **extra}


def _tokens(events: Events, rid: str) -> list[int]:
    return [e["t"] for e in events.lines if e["ev"] == "token" and e["id"] == rid]


def _where(events: Events, ev: str, rid: str) -> list[int]:
    return [i for i, e in enumerate(events.lines) if e["ev"] == ev and e.get("id") == rid]


def test_a_long_prompt_is_prefilled_between_the_running_rows_steps(model):
    short, long = _ask("a", 20, 40), _ask("b", 1200, 4, prefill_step=256)
    together = _run(model, [short, long])
    progress = _where(together, "progress", "b")
    assert len(progress) == 5  # 1199 prompt tokens before its first step, in chunks of 256
    # The running row decoded between the long prompt's chunks, not after all of them.
    between = [i for i in _where(together, "token", "a") if progress[0] < i < progress[-1]]
    assert len(between) >= 3
    assert _tokens(together, "a") == _tokens(_run(model, [short]), "a")
    assert _tokens(together, "b") == _tokens(_run(model, [long]), "b")


def test_no_more_rows_than_max_batch_decode_at_once_and_the_next_waits_for_a_free_one(model):
    asks = [_ask(rid, 12, n) for rid, n in (("a", 10), ("b", 30), ("c", 8))]
    events = _run(model, asks, max_batch=2)
    (ended_a,), (started_c,) = _where(events, "end", "a"), _where(events, "phase", "c")
    assert started_c > ended_a  # c is admitted only once a's row is free
    assert _where(events, "phase", "b")[0] < ended_a  # b decoded beside a
    assert all(e["reason"] == "length" for e in events.lines if e["ev"] == "end")
    for ask in asks:
        assert _tokens(events, ask["id"]) == _tokens(_run(model, [ask]), ask["id"])


def test_each_row_ends_with_what_its_cache_holds_for_the_prefix_cache(model):
    asks = [_ask("a", 12, 10, reuse={"source": None, "trim": 0, "copy": False, "keep_as": 1, "shared": 0}),
            _ask("b", 25, 3, reuse={"source": None, "trim": 0, "copy": False, "keep_as": 2, "shared": 0})]
    events = _run(model, asks)
    ends = {e["id"]: e for e in events.lines if e["ev"] == "end"}
    # The prompt and every token decided but the last, which was never fed.
    assert (ends["a"]["cached"], ends["b"]["cached"]) == (12 + 9, 25 + 2)
    assert ends["a"]["entry_bytes"] > 0 and ends["b"]["entry_bytes"] > 0


def test_an_interactive_prompt_is_prefilled_before_a_bulk_prompt_that_came_first(model):
    decoding = _ask("a", 20, 60)
    bulk = _ask("b", 1200, 2, prefill_step=256, urgency=2)
    interactive = _ask("i", 700, 2, prefill_step=256, urgency=0)
    # The interactive request arrives once the bulk prompt's prefill has begun.
    events = _run(model, [decoding, bulk], later=[(lambda e: e["ev"] == "progress" and e.get("id") == "b",
                                                    interactive)])
    bulk_chunks, interactive_chunks = _where(events, "progress", "b"), _where(events, "progress", "i")
    assert len(bulk_chunks) == 5 and len(interactive_chunks) == 3
    # Every chunk of the interactive prompt, and its first token, came between
    # the bulk prompt's chunks: it went ahead, and the bulk prompt went on.
    first_token = _where(events, "token", "i")[0]
    assert bulk_chunks[0] < interactive_chunks[0] and first_token < bulk_chunks[-1]
    for ask in (bulk, interactive):
        assert _tokens(events, ask["id"]) == _tokens(_run(model, [ask]), ask["id"])
