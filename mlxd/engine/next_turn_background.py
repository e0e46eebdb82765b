"""Between-turn prefills of one text engine, in the background.

When a chat answer ends normally (``next_turn.skip_reason``), the next
prompt's known part (``next_turn.next_prompt``: the history, the answer and
what the template writes before the next user message) is rendered on the
model's tokenizing thread and prefilled on the MLX worker, then kept as a
prefix cache entry (kind ``prompt``). As the background warm-up does
(``engine/warmup_background.py``), it gives way to users:

- it starts only once no user request is in flight, and a user request that
  arrives pushes it aside within one step (``EngineBase.yielding``): the
  worker steps it one prefill chunk at a time, and it checks its control
  before each one;
- pushed aside, it keeps what it prefilled so far (a complete cache for
  those tokens, as a checkpoint is), so the request that arrived, most
  likely the next turn itself, prefills only the rest;
- its lookup is not counted in the prefix cache's hits and reuse, nor its
  tokens in the engine's prompt tokens; ``prefills`` and ``tokens`` count it.

``auto`` (``next_turn.wanted``) probes the template once per model, on the
first answer that could have a next turn; a template that moves nothing
(every family but Mistral's) costs that one probe and nothing after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from mlxd.engine import next_turn
from mlxd.engine.lifecycle import GenerationControl
from mlxd.engine.text_model import feed
from mlxd.engine.types import GenerationRequest
from mlxd.engine.worker import SKIP, MlxWorker
from mlxd.tools.splitter import split_answer

log = logging.getLogger(__name__)


class NextTurnPrefill:
    """One text engine's between-turn prefills (event loop, but for the
    worker's steps). At most one runs; a newer answer replaces it."""

    def __init__(self, engine: Any, worker: MlxWorker, setting: Any, *, prefill_chunk: int) -> None:
        self._engine = engine
        self._worker = worker
        self.setting = setting
        self._chunk = max(1, prefill_chunk)
        # ``auto``'s decision for this model, once probed (None: not yet).
        self._wanted: bool | None = None if setting == next_turn.AUTO else bool(setting)
        # Prefills not finished yet; only the newest one (``_latest``) starts.
        self._tasks: set[asyncio.Task[None]] = set()
        self._latest: object = None
        # Read by stats: prefills that kept an entry, and the tokens they prefilled.
        self.prefills = 0
        self.tokens = 0
        # Written on the worker: a prefill step holds the model.
        self.running = False

    def watches(self, request: GenerationRequest) -> bool:
        """Whether ``request``'s answer could start a prefill, as far as is
        known before it ends: when not, its stream is not watched at all (the
        setting off, ``auto`` probed off, no prefix cache, n > 1, a warm-up)."""
        return self._wanted is not False and next_turn.skip_reason(
            request, "stop", setting=self.setting, cache_on=self._engine.prefix_cache is not None) is None

    def after(self, request: GenerationRequest, control: GenerationControl, text: str,
              finish_reason: str | None, since: int) -> None:
        """Event loop, before an answer's last chunk goes out: start the
        next turn's prefill when this answer can have one. ``since``: the
        prefix cache's ``clears`` before the answer's lookup; a clear since
        then emptied the cache of this conversation, and it stays out."""
        engine = self._engine
        why = next_turn.skip_reason(request, finish_reason, setting=self.setting,
                                    cache_on=engine.prefix_cache is not None)
        if why is not None or self._wanted is False or control.prompt_ids is None or engine.closed:
            return
        if engine.prefix_cache.clears != since:
            return
        answer = split_answer(engine.tool_format, text, request.tools_to_parse(), engine.reasoning_format,
                              opens=control.opens_reasoning)
        calls = tuple(call.as_openai() for call in answer.tool_calls)
        self._latest = latest = object()
        task = asyncio.ensure_future(
            self._run(request, list(control.prompt_ids), next_turn.Answer(answer.content, calls), latest))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: GenerationRequest, prompt: list[int], answer: next_turn.Answer,
                   latest: object) -> None:
        engine = self._engine
        try:
            # Not while a user request runs (the one that answered included):
            # it would wait behind these renders on the tokenizing thread.
            await engine.wait_idle()
            if latest is not self._latest:
                return  # a newer answer's next turn replaced it
            with engine.yielding(f"next-turn-{request.request_id}") as control:
                sequences = await self._sequences(request, prompt, answer, control)
                if sequences and control.abort_reason is None:
                    async for _ in self._worker.stream(lambda: self._prefill(sequences, control)):
                        pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a prefill nobody asked for must never fail anything
            log.debug("%s: no between-turn prefill: %s", engine.name, exc)

    async def _sequences(self, request: GenerationRequest, prompt: list[int], answer: next_turn.Answer,
                         control: GenerationControl) -> list[list[int]]:
        """What to prefill: the next prompt's known part, then the whole
        prompts of repeated messages (``next_turn.repeated_prompt``), one
        piece at a time on the tokenizing thread and none once a user request
        came: its tokenizing waits for one piece at most (the known part's
        two renders, or one repeat's)."""
        model = self._engine.model
        if self._wanted is None:
            lost = await model.with_tokenizer(next_turn.probe_loss)
            self._wanted = next_turn.wanted(self.setting, lost)
            log.info("%s: between-turn prefill %s (its template's next turn gives up %s tokens of a prompt)",
                     self._engine.name, "on" if self._wanted else "off", lost)
        if not self._wanted or control.abort_reason is not None:
            return []
        tokens = await model.with_tokenizer(lambda tokenizer: next_turn.next_prompt(tokenizer, request, answer))
        if not next_turn.worth(self.setting, prompt, tokens) or len(tokens) > model.max_context:
            return []
        out = [tokens]
        for text in next_turn.recent_user_texts(request.messages or [], next_turn.MAX_REPEATS):
            if control.abort_reason is not None:
                break
            repeat = await model.with_tokenizer(
                lambda tokenizer, text=text: next_turn.repeated_prompt(tokenizer, request, answer, tokens, text))
            if repeat is not None and len(repeat) <= model.max_context:
                out.append(repeat)
        return out

    def _prefill(self, sequences: list[list[int]], control: GenerationControl) -> Iterator[Any]:
        """Worker thread: the new message's known part, then the repeats
        that cost at most ``REPEAT_COST`` times as much."""
        budget: int | None = None
        # From the first step to the last (close() waits while it is set).
        self.running = True
        try:
            for i, tokens in enumerate(sequences):
                if i:
                    yield SKIP  # each sequence starts a step of its own
                done = yield from self._one(tokens, control, budget)
                if budget is None:
                    budget = next_turn.REPEAT_COST * max(1, done)
        finally:
            self.running = False

    def _one(self, tokens: list[int], control: GenerationControl, budget: int | None) -> Iterator[Any]:
        """Prefill ``tokens`` from their longest cached prefix, one chunk per
        step, unless more than ``budget`` are left, and keep the cache (what
        is done of it when a user pushed it aside). Returns the tokens it prefilled."""
        import mlx.core as mx

        engine = self._engine
        prefix = engine.prefix_cache
        if control.abort_reason is not None or prefix is None or prefix.holds(tokens):
            return 0
        model, _ = engine.model.get()
        if budget is not None and len(tokens) - prefix.longest(tokens) > budget:
            return 0
        since = prefix.clears
        cache, reused = prefix.fetch(tokens, 1, count=False)
        if cache is None:
            from mlx_lm.models.cache import make_prompt_cache

            cache = make_prompt_cache(model)
        prompt = mx.array(tokens)
        done = reused
        while done < len(tokens) and control.abort_reason is None:
            upto = min(done + self._chunk, len(tokens))
            feed(model, prompt[done:upto], cache, engine.spec.kv_bits)
            done = upto
            if done < len(tokens):
                yield SKIP
        # Counted only when kept: one a clear emptied (``since``) prefilled
        # nothing the next turn can use, and status said it had.
        if done > reused and prefix.keep(tokens[:done], cache, engine.name, "prompt", since=since):
            self.prefills += 1
            self.tokens += done - reused
        return done - reused

    async def wait(self) -> None:
        """Until the prefills started so far have ended (tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """Stop (the engine closes) and wait until they have let go of the model."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

