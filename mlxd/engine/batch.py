"""Continuous batching for a text model: many requests, one decode step.

A model with ``max_concurrency`` above 1 serves all its requests through one
mlx-lm ``BatchGenerator``: every decode step advances every sequence in the
batch at once, and requests join and leave the batch between steps. On a CPU
a batched step of four sequences costs little more than a single one, so the
aggregate throughput grows with the number of clients.

The batch loop. One worker stream per engine (``worker.stream``) drives the
batch; it exists only while the engine has work and ends when the last
request has left. Each of its turns is one worker step, so other models'
streams and one-shot calls (loads, unloads, cache saves) run in between:

1. admit new requests: validate and tokenize them, fetch the longest cached
   prefix of the prompt (a request aborted while it waited ends here, without
   touching the model);
2. drop leavers: a request whose consumer went away or that was aborted is
   removed from the batch (``remove([uid])``) — the rest go on untouched;
3. prefill: at most ``prefill_chunk`` prompt tokens in total, one request at a
   time, into that request's own KV cache, exactly as the single path does it.
   A long prompt therefore never holds the worker for more than one chunk,
   and the prompts waiting are taken by their callers' priority class
   (``prefill_order``): an interactive request's prompt goes before the
   bulk prompts queued ahead of it, which go on where they stopped;
4. first token and join: a request whose prompt is in its cache but for
   the last token has that token run through the model on its own cache and
   its first token drawn (its processors and sampler, as the single path
   does; and the next ones the same way while they give no text, up to
   four: ``_first_token``), and that text is handed out at once, before
   the batch's step:
   mlx-lm's ``BatchGenerator`` would give it out only after two batched
   steps, each decoding every other row, which an interactive request
   joining a busy batch waited for. The request then joins the batch with
   its cache holding the whole prompt and the first token as its input
   (``insert(..., caches=)``). A bulk request joining a batch that is
   decoding is the exception: it joins with its prompt's last token as its
   input, and the batch draws its first token in its step, for all the
   rows joining then at once (``_batch_draws_first``);
5. one ``BatchGenerator.next()``: a decode step for every sequence. Each
   token is detokenized with the request's own detokenizer and matched
   against its own stop strings, and the chunks go to the requests'
   consumers, one hand-over per event loop.

What is per request: sampler (temperature, top_p, top_k, min_p, seed),
logits processors (repetition/presence penalty, ``ignore_eos``), the token
stop list (EOS, or nothing with ``ignore_eos``), stop strings, max_tokens and
the detokenizer. A finished request's KV cache (extracted by mlx-lm) goes to
the prefix cache, as on the single path.

Threads: the event loop hands requests over through ``_pending`` (under a
lock, which also decides whether a new batch loop must be started) and flags
them (``cancelled``, ``control.abort_reason``); everything else here is
touched only on the worker. Chunks are delivered to each request's own event
loop, so a batch loop is never tied to the loop that happened to start it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mlxd.caller import PRIORITIES, class_of, urgency
from mlxd.engine.batch_settle import settle
from mlxd.engine.cache_layers import mergeable
from mlxd.engine.checkpoints import checkpoint, plan
from mlxd.engine.logprobs import token_logprob
from mlxd.engine.lifecycle import FirstGenerationPeak, GenerationControl, GenerationCounts
from mlxd.engine.prefix_cache import PrefixCache
from mlxd.engine.reasoning_budget import observe
from mlxd.engine.speculation import Speculation
from mlxd.engine.text_model import Prepared, TextModel
from mlxd.engine.turn_clock import FirstTextClock, TurnClock
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.engine.worker import SKIP, MlxWorker, WorkerStream
from mlxd.errors import MlxdError, ShuttingDown

log = logging.getLogger(__name__)

# How often a waiting consumer checks that the worker is still there: if the
# worker stops before the batch loop ever ran, nobody else would tell it.
_LIVENESS_SECONDS = 1.0

# How many tokens a request joining the batch may draw on its own while they
# give no text (BatchScheduler._first_token): a character of four UTF-8
# bytes, each a token of a byte-level vocabulary.
_SOLO_FOR_TEXT = 4


def prefill_position(waiting: list[int], rank: int) -> int:
    """Where a prompt of class ``rank`` (0 most urgent) joins the prompts
    ``waiting`` to be prefilled (their ranks, in order): behind every one as
    urgent or more, ahead of the less urgent (first come, first served
    within a class)."""
    return next((i for i, other in enumerate(waiting) if other > rank), len(waiting))


def _rank(seq: _Sequence) -> int:
    return urgency(seq.request.priority)


def supports_batching(model: Any) -> bool:
    """Whether every layer of the model's KV cache can be merged into a batch
    (what mlx-lm's server checks). Worker thread."""
    from mlx_lm.models.cache import make_prompt_cache

    try:
        cache = make_prompt_cache(model)
    except Exception:  # noqa: BLE001 - an exotic model simply is not batched
        return False
    return mergeable(cache)


@dataclass(eq=False)
class _Sequence:
    """One request in the batch."""

    request: GenerationRequest
    control: GenerationControl
    loop: asyncio.AbstractEventLoop
    # Event loop side: delivered chunks (or an exception) and who waits for them.
    items: collections.deque[Any] = field(default_factory=collections.deque)
    waiter: asyncio.Future[None] | None = None
    # Set by the consumer when it leaves; read by the worker.
    cancelled: bool = False
    # Worker side.
    prepared: Prepared | None = None
    prompt: Any = None  # the prompt as an mx.array, while prefilling
    cache: list[Any] | None = None  # its own KV cache, until it joins the batch
    done: int = 0  # prompt tokens in ``cache``
    reused: int = 0  # of which came from the prefix cache
    cache_clears: int = 0  # the prefix cache's ``clears`` at its lookup
    marks: collections.deque[Any] = field(default_factory=collections.deque)  # checkpoints still to take
    uid: int | None = None  # its id in the BatchGenerator once it joined
    detokenizer: Any = None
    # Log-probabilities of the tokens since the last chunk (request.logprobs).
    scored: list[Any] = field(default_factory=list)
    # At debug level: when it reached each step on its way to its first text
    # (turn_clock.FIRST_TEXT_PHASES), and the turn it arrived during.
    stamps: dict[str, float] | None = None
    arrived_during: str = ""

    def leaving(self) -> bool:
        return self.cancelled or self.control.abort_reason is not None


class BatchScheduler:
    """Runs one text engine's requests as a continuous batch; see the module docstring.

    It shares the engine's parts, not the engine: the model holder, the
    counts, the first generation's peak measurement and the prefix cache.
    """

    def __init__(
        self,
        name: str,
        worker: MlxWorker,
        model: TextModel,
        counts: GenerationCounts,
        peak: FirstGenerationPeak,
        prefix_cache: PrefixCache | None,
        *,
        max_batch: int,
        prefill_chunk: int = 512,
        speculation: Speculation | None = None,
    ) -> None:
        self._name = name
        self._worker = worker
        self._model = model
        self._counts = counts
        self._peak = peak
        self._prefix = prefix_cache
        self._max_batch = max(1, max_batch)
        self._prefill_chunk = max(1, prefill_chunk)
        # Speculative decoding (engine/speculative_batch.py) in place of mlx-lm's BatchGenerator.
        self._speculation = speculation if speculation is not None and speculation.usable else None
        # Shared with the event loop: the lock covers ``_pending`` and ``_alive``.
        self._lock = threading.Lock()
        self._pending: collections.deque[_Sequence] = collections.deque()
        self._alive = False
        # The batch loop's stream, held so that it is never collected (which
        # would cancel it) while it runs; it never delivers anything itself.
        self._stream: WorkerStream[Any] | None = None
        # Worker side.
        self._generator: Any = None
        self._eos_stops: Any = None
        self._no_stops: Any = None
        self._samplers: dict[tuple[float, float, float, int], Any] = {}
        self._prefilling: collections.deque[_Sequence] = collections.deque()
        self._decoding: dict[int, _Sequence] = {}
        self._outgoing: list[tuple[_Sequence, Any]] = []
        self._peak_others: int | None = None
        # Read by stats(): sequences in the decode batch, batched decode steps.
        self.size = 0
        self.steps = 0
        # Joins and ends of the current turn (for the slow-turn log).
        self._joined = self._ended = 0
        # At debug level: slow first texts, and the last turn, which the
        # requests arriving meanwhile waited for.
        self._first_text = FirstTextClock()
        self._last_turn = ""

    @property
    def alive(self) -> bool:
        """Whether a batch loop exists (it may hold the model)."""
        return self._alive

    # ------------------------------------------------------------ event loop
    async def generate(
        self, request: GenerationRequest, control: GenerationControl
    ) -> AsyncIterator[GenerationChunk]:
        """The request's chunks. Leaving early (close, cancel, disconnect)
        removes the request from the batch at the loop's next turn."""
        seq = _Sequence(request, control, asyncio.get_running_loop())
        if log.isEnabledFor(logging.DEBUG):
            seq.stamps = {"submitted": time.perf_counter()}
        self._submit(seq)
        try:
            while True:
                item = await self._next_item(seq)
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            seq.cancelled = True

    def _submit(self, seq: _Sequence) -> None:
        with self._lock:
            self._pending.append(seq)
            start = not self._alive
            self._alive = True
        if not start:
            return
        try:
            self._stream = self._worker.stream(self._turns)
        except BaseException:
            with self._lock:
                self._pending.remove(seq)
                self._alive = False
            raise

    async def _next_item(self, seq: _Sequence) -> Any:
        while not seq.items:
            waiter = seq.waiter = seq.loop.create_future()
            timer = seq.loop.call_later(_LIVENESS_SECONDS, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                seq.waiter = None
            if not seq.items and not self._worker.running:
                raise ShuttingDown("The model worker shut down.")
        return seq.items.popleft()

    # -------------------------------------------------------- the batch loop
    def _turns(self) -> Iterator[Any]:
        """The batch loop (worker thread): one turn per worker step."""
        # Slow turns are timed and logged at debug level only (turn_clock.py).
        clock = TurnClock() if log.isEnabledFor(logging.DEBUG) else None
        try:
            while True:
                if clock is not None:
                    began = time.perf_counter()
                    clock.start(began, time.thread_time())
                self._joined = self._ended = 0
                arrivals = self._admit_arrivals()
                self._drop_leavers()
                if clock is not None:
                    clock.mark("admit", time.perf_counter(), time.thread_time())
                self._prefill()
                # First tokens go out before the batch's step (which takes a while).
                self._flush()
                if clock is not None:
                    clock.mark("prefill and join", time.perf_counter(), time.thread_time())
                rows = len(self._decoding)
                if self._decoding:
                    # Rows that joined or left are rearranged in a call of their own (batch_settle.py).
                    if self._joined or self._ended:
                        settle(self._generator)
                    ended = self._ended
                    _, responses = self._generator.next()
                    self.steps += 1
                    # A steady step's period is what the pace keeper holds encoder passes to.
                    self._worker.pace.step(time.perf_counter(), rows, steady=not (
                        arrivals or self._joined or self._ended or self._prefilling),
                        urgency=min(map(_rank, self._decoding.values()), default=len(PRIORITIES)))
                    if clock is not None:
                        clock.mark("step", time.perf_counter(), time.thread_time())
                    self._take_step(responses)
                    # mlx-lm moves joining rows in, and lets finished ones go, inside next().
                    if self._joined or self._ended > ended:
                        settle(self._generator)
                self._flush()
                if clock is not None:
                    clock.mark("outputs", time.perf_counter(), time.thread_time())
                    slow = clock.end(time.perf_counter(), rows=rows, arrivals=arrivals, joined=self._joined,
                                     ended=self._ended, prefilling=len(self._prefilling))
                    if slow is not None:
                        log.debug("%s: %s", self._name, slow)
                    self._last_turn = (f"{1000 * (time.perf_counter() - began):.1f} ms, rows {rows}, "
                                       f"joined {self._joined}, ended {self._ended}")
                if self._prefilling or self._decoding:
                    yield SKIP
                    continue
                # No work: let go of the model before saying so (close() waits for it).
                self._drop_generator()
                with self._lock:
                    if not self._pending:
                        self._alive = False
                        return
        except GeneratorExit:
            # The worker is shutting down and closes every stream.
            self._abandon(lambda: ShuttingDown("The model worker shut down."))
            raise
        except Exception:
            log.exception("the batch loop of %s failed", self._name)
            name = self._name
            self._abandon(lambda: MlxdError(f"The model `{name}` failed while generating."))

    def _admit_arrivals(self) -> int:
        """Takes the requests handed over since the last turn; how many."""
        with self._lock:
            arrivals = list(self._pending)
            self._pending.clear()
        counts = self._counts
        now = time.perf_counter()
        for seq in arrivals:
            if seq.stamps is not None:
                seq.stamps["admitted"] = now
                seq.arrived_during = self._last_turn
            if seq.cancelled:
                continue
            if seq.control.abort_reason is not None:
                # Aborted while it waited: end without touching the model
                # (it may be about to be released).
                counts.abort(seq.control)
                self._post(seq, GenerationChunk(text="", finish_reason="abort"))
                continue
            counts.begin(seq.control)
            try:
                self._start(seq)
            except Exception as exc:  # noqa: BLE001 - this request's own failure (e.g. BadRequest)
                counts.end(seq.control)
                self._post(seq, exc)
        return len(arrivals)

    def _start(self, seq: _Sequence) -> None:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        model, tokenizer = self._model.get()
        prepared = self._model.prepare(seq.request, seq.control)
        if self._generator is None:
            self._new_generator(model, tokenizer)
        others = self._peak.begin()
        if others is not None:
            self._peak_others = others
        # A warm-up leaves the user's cache as it found it: no lookup, no entry.
        prefix = None if seq.control.warmup else self._prefix
        # The batch's logits processors see every token in the cache (mlx-lm
        # is given them as ``all_tokens``), so one token left to prefill is
        # enough even with penalties, unlike the single path.
        seq.cache_clears = prefix.clears if prefix is not None else 0
        cache, reused = prefix.fetch(prepared.tokens, 1) if prefix is not None else (None, 0)
        seq.prepared = prepared
        seq.prompt = mx.array(prepared.tokens)
        seq.cache = cache if cache is not None else make_prompt_cache(model)
        seq.done = seq.reused = reused
        if prefix is not None:
            seq.marks = collections.deque(plan(prepared.boundaries, len(prepared.tokens), 1, reused))
        seq.detokenizer = tokenizer.detokenizer
        if seq.stamps is not None:
            seq.stamps["prepared"] = time.perf_counter()
        self._prefilling.insert(prefill_position([_rank(s) for s in self._prefilling], _rank(seq)), seq)

    def _drop_leavers(self) -> None:
        for seq in [s for s in self._prefilling if s.leaving()]:
            self._prefilling.remove(seq)
            self._end_early(seq)
        leavers = [s for s in self._decoding.values() if s.leaving()]
        if not leavers:
            return
        self._generator.remove([s.uid for s in leavers])
        self._ended += len(leavers)
        for seq in leavers:
            del self._decoding[seq.uid]
            self._end_early(seq)
        self.size = len(self._decoding)

    def _end_early(self, seq: _Sequence) -> None:
        """A cancelled request just goes; an aborted one gets its last chunk."""
        if not seq.cancelled:
            self._counts.abort(seq.control)
            assert seq.prepared is not None
            self._post(seq, self._chunk(seq, seq.prepared.stops.flush(), "abort"))
        self._retire(seq)

    def _prefill(self) -> None:
        """Up to one chunk of prompt tokens, then move the prefilled requests into the batch."""
        import mlx.core as mx

        if not self._prefilling:
            return
        model, _ = self._model.get()
        budget = self._prefill_chunk
        ready: list[tuple[_Sequence, list[int] | None]] = []
        while self._prefilling:
            seq = self._prefilling[0]
            left = seq.prompt.size - 1 - seq.done
            if left > 0:
                if budget <= 0:
                    break
                take = min(left, budget, seq.marks[0].position - seq.done if seq.marks else left)
                with mx.stream(self._prefill_stream()):
                    model(seq.prompt[seq.done : seq.done + take][None], cache=seq.cache)
                    mx.eval([c.state for c in seq.cache])
                seq.done += take
                budget -= take
                left -= take
                if seq.marks and seq.marks[0].position == seq.done:
                    assert seq.prepared is not None
                    checkpoint(self._prefix, seq.prepared.tokens[: seq.done], seq.cache,
                               seq.marks.popleft().kind, self._name, seq.cache_clears)
            if left == 0:
                seq = self._prefilling.popleft()
                if seq.stamps is not None:
                    seq.stamps["prefilled"] = time.perf_counter()
                if self._batch_draws_first(seq):
                    ready.append((seq, None))
                    continue
                first = self._first_token(seq)
                if seq.stamps is not None:
                    seq.stamps["drawn"] = time.perf_counter()
                if first is not None:
                    ready.append((seq, first))
        if ready:
            self._join(ready)

    def _prefill_stream(self) -> Any:
        """Worker thread: the stream prompts are prefilled on, beside the
        batch's (mlx-lm's ``generation_stream``). A prompt shares nothing
        with the batch until it joins, so on a stream of its own its forward
        passes need not queue behind the step the batch computes ahead: a
        request's first token then waits for its own prompt, not for the
        decode step in flight as well. Every prefill is waited for here, so
        nothing is left on this stream when the turn ends, and the engines
        on one worker can share it."""
        return self._worker.side_stream()

    def _batch_draws_first(self, seq: _Sequence) -> bool:
        """A bulk request joining a batch that is decoding leaves its last
        prompt token to the batch, which draws its first token there: one
        forward for all the rows joining in this turn instead of one each
        before the step. On an H100 a request's own first token took 4.3 ms,
        and three bulk requests joining together (clients whose answers end
        in the same step) made turns of 48-75 ms against a usual 7-10 ms,
        which interactive requests arriving then waited for
        (bench/join_cost.py, docs/batching.md). Bulk work trades that
        latency for the others'; every other class keeps its first token
        before the batch's step."""
        return bool(self._decoding) and class_of(seq.request.priority) == "bulk"

    def _first_token(self, seq: _Sequence) -> list[int] | None:
        """The prompt's last token through the model on the request's own
        cache and the first token drawn from its logits, as the single path
        (mlx-lm's ``generate_step``) does; taken as the batch takes a token.

        A token may give no text yet (one byte of a character that takes
        several, or the start of what may be a stop string): such a request
        draws its next tokens the same way, up to ``_SOLO_FOR_TEXT``, until
        some text is handed out. Joining first would leave its first text to
        the batch's step after the join, which rearranges the batch and is
        its slowest (on an H100 30-69 ms against a usual 7-12); with the
        factory's random weights a tenth of the first tokens were such bytes.

        Returns the tokens drawn when the request goes on into the batch (its
        cache holds all but the last), None when it ended."""
        import mlx.core as mx

        model, _ = self._model.get()
        prepared = seq.prepared
        assert prepared is not None
        stops = self._no_stops if seq.request.ignore_eos else self._eos_stops
        tokens = list(prepared.tokens)  # what the cache holds
        drawn: list[int] = []
        step_input = seq.prompt[-1:]
        while True:
            with mx.stream(self._prefill_stream()):
                logits = model(step_input[None], cache=seq.cache)[:, -1, :]
                if prepared.processors:
                    # The whole history, built only for the processors that read it.
                    context = mx.array([*tokens, drawn[-1]]) if drawn else seq.prompt
                    for processor in prepared.processors:
                        logits = processor(context, logits)
                logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
                token = self._sampler(seq)(logprobs)
                mx.eval(token, logprobs, [c.state for c in seq.cache])
            if drawn:
                tokens.append(drawn[-1])
            drawn.append(int(token.item()))
            # As mlx-lm's GenerationBatch decides: the length, then an end token.
            reason = "length" if prepared.max_tokens <= len(drawn) else None
            if stops.matcher().advance(drawn[-1]):
                reason = "stop"
            posted = len(self._outgoing)
            text = self._take(seq, drawn[-1], logprobs[0], reason, seq.cache, tokens)
            if text is not None:
                self._finish(seq, text, "stop", seq.cache, tokens)
                return None
            if reason is not None:
                return None
            if len(self._outgoing) > posted or len(drawn) >= _SOLO_FOR_TEXT:
                return drawn
            step_input = token.reshape(1)

    def _join(self, ready: list[tuple[_Sequence, list[int] | None]]) -> None:
        """Insert requests into the batch. One with its first tokens: its
        cache holds the whole prompt and all of them but the last, which the
        batch feeds as its input. One without (``_batch_draws_first``): its
        cache holds all but the prompt's last token, which the batch feeds,
        drawing the first token."""
        prepared = [s.prepared for s, _ in ready]
        assert all(p is not None for p in prepared)
        # The speculative batch verifies warm-up rows at every block width (speculative_batch.py).
        warmups = {"warmups": [s.control.warmup for s, _ in ready]} if self._speculation is not None else {}
        inputs, limits, histories = [], [], []
        for p, (_, drawn) in zip(prepared, ready):
            if drawn is None:
                inputs.append([p.tokens[-1]])
                limits.append(p.max_tokens)
                histories.append(list(p.tokens[:-1]))
            else:
                inputs.append([drawn[-1]])
                limits.append(p.max_tokens - len(drawn))
                histories.append([*p.tokens, *drawn[:-1]])
        uids = self._generator.insert(
            inputs,
            max_tokens=limits,
            caches=[s.cache for s, _ in ready],
            all_tokens=histories,
            samplers=[self._sampler(s) for s, _ in ready],
            logits_processors=[p.processors for p in prepared],
            stop_sequences=[self._no_stops if s.request.ignore_eos else self._eos_stops for s, _ in ready],
            **warmups,
        )
        self._joined += len(ready)
        for (seq, _), uid in zip(ready, uids):
            seq.uid = uid
            seq.cache = seq.prompt = None  # the batch owns a merged copy now
            self._decoding[uid] = seq
        self.size = len(self._decoding)

    def _take_step(self, responses: list[Any]) -> None:
        """A decode step's tokens, handed to their requests."""
        text_stops: list[tuple[_Sequence, str]] = []
        # A speculative step gives several tokens per sequence: none after its stop string.
        stopped: set[int] = set()
        for response in responses:
            seq = self._decoding.get(response.uid)
            if seq is None or response.uid in stopped:
                continue
            text = self._take(seq, response.token, response.logprobs, response.finish_reason,
                              response.prompt_cache, response.all_tokens)
            if text is not None:
                text_stops.append((seq, text))
                stopped.add(response.uid)
        if text_stops:
            # A stop string ended these: take them out of the batch, with their caches.
            caches = self._generator.remove([s.uid for s, _ in text_stops], return_prompt_caches=True)
            for seq, text in text_stops:
                cache, tokens = caches.get(seq.uid, (None, None))
                self._finish(seq, text, "stop", cache, tokens)
        self.size = len(self._decoding)

    def _take(
        self, seq: _Sequence, token: int, logprobs: Any, reason: str | None,
        cache: list[Any] | None, tokens: list[int] | None,
    ) -> str | None:
        """One generated token: counted, scored, detokenized and matched
        against the stop strings; the request ends here when ``reason`` (the
        batch's: "length", or "stop" for an end token) or a stop string says
        so (``cache``, holding ``tokens``, goes to the prefix cache). A stop
        string met while the sequence would go on is the caller's to end, with
        the cache it takes out of the batch: the text before it is returned."""
        assert seq.prepared is not None
        seq.control.completion_tokens += 1
        observe(seq.prepared.reasoning, token)
        if seq.prepared.logprobs is not None and reason != "stop":
            _, tokenizer = self._model.get()
            seq.scored.append(token_logprob(tokenizer, token, logprobs, seq.prepared.logprobs))
        detokenizer = seq.detokenizer
        # "stop" from the batch is the end-of-sequence token: no text of its own.
        if reason != "stop":
            detokenizer.add_token(token)
        if reason is not None:
            detokenizer.finalize()
        stops = seq.prepared.stops
        text, hit = stops.feed(detokenizer.last_segment)
        if hit and reason is None:
            return text
        if hit:
            self._finish(seq, text, "stop", cache, tokens)
        elif reason is not None:
            self._finish(seq, text + stops.flush(), reason, cache, tokens)
        elif text:
            self._post(seq, self._chunk(seq, text))
        return None

    def _finish(
        self, seq: _Sequence, text: str, reason: str, cache: list[Any] | None, tokens: list[int] | None
    ) -> None:
        """A request that ended normally: keep its cache for the next turn
        before its last chunk is handed over, then let it go."""
        self._ended += 1
        if seq.uid is not None:  # it may end at its first token, before joining
            del self._decoding[seq.uid]
        if cache is not None and tokens and self._prefix is not None and not seq.control.warmup:
            self._prefix.keep(list(tokens), cache, self._name, since=seq.cache_clears)
        if self._peak_others is not None:
            self._peak.end(self._peak_others)
            self._peak_others = None
        self._post(seq, self._chunk(seq, text, reason))
        self._retire(seq)

    def _retire(self, seq: _Sequence) -> None:
        self._counts.end(seq.control)
        seq.cache = seq.prompt = None

    def _abandon(self, failure: Callable[[], BaseException]) -> None:
        """End the loop after a failure: every request still here gets ``failure()``."""
        victims = [*self._prefilling, *self._decoding.values()]
        self._prefilling.clear()
        self._decoding.clear()
        for seq in victims:
            self._retire(seq)
        self._drop_generator()
        with self._lock:
            waiting = list(self._pending)
            self._pending.clear()
            self._alive = False
        for seq in [*victims, *waiting]:
            if not seq.cancelled:
                self._post(seq, failure())
        self._flush()

    # -------------------------------------------------------------- helpers
    def _new_generator(self, model: Any, tokenizer: Any) -> None:
        from mlx_lm.generate import BatchGenerator, StopSequences

        self._eos_stops = StopSequences([(t,) for t in getattr(tokenizer, "eos_token_ids", None) or ()])
        self._no_stops = StopSequences()
        if self._speculation is not None:
            self._generator = self._speculation.generator(model)
            return
        self._generator = BatchGenerator(
            model,
            completion_batch_size=self._max_batch,
            # Requests join with their prompt already prefilled (but for one
            # token), so this only says how many may join in one step: all.
            prefill_batch_size=self._max_batch,
            prefill_step_size=self._prefill_chunk,
        )

    def _drop_generator(self) -> None:
        generator, self._generator = self._generator, None
        self._samplers.clear()
        self.size = 0
        if generator is not None:
            generator.close()

    def _sampler(self, seq: _Sequence) -> Any:
        """The request's sampler. Requests without a seed and with the same
        parameters share one, so the batch samples them in one call (greedy
        ones already share mlx-lm's greedy sampler)."""
        assert seq.prepared is not None
        params = seq.request.sampling
        if params.seed is not None or params.temperature == 0:
            return seq.prepared.sampler
        key = (params.temperature, params.top_p, params.min_p, params.top_k)
        shared = self._samplers.get(key)
        if shared is None:
            shared = self._samplers[key] = seq.prepared.sampler
        return shared

    def _chunk(self, seq: _Sequence, text: str, finish: str | None = None) -> GenerationChunk:
        entries = None
        if seq.prepared is not None and seq.prepared.logprobs is not None:
            entries, seq.scored = seq.scored, []
        return GenerationChunk(
            text=text,
            finish_reason=finish,
            prompt_tokens=seq.control.prompt_tokens,
            completion_tokens=seq.control.completion_tokens,
            cached_tokens=seq.reused,
            logprobs=entries,
            stop_sequence=seq.prepared.stops.matched if finish and seq.prepared is not None else None,
            reasoning_tokens=(
                seq.prepared.reasoning_tokens(seq.control.completion_tokens) if finish and seq.prepared else None
            ),
        )

    def _first_text_out(self, seq: _Sequence, item: Any) -> None:
        """Debug level: the request's first text (or its end) goes out now;
        logged with where its time went if that was slow (turn_clock.py)."""
        if not isinstance(item, GenerationChunk) or not (item.text or item.finish_reason):
            return
        assert seq.stamps is not None
        seq.stamps["out"] = time.perf_counter()
        detail = (f"{item.completion_tokens} tokens, {seq.reused} cached"
                  + (f", arrived during a turn of {seq.arrived_during}" if seq.arrived_during else ""))
        slow = self._first_text.end(seq.stamps, class_of(seq.request.priority), detail)
        if slow is not None:
            log.debug("%s: %s", self._name, slow)

    def _post(self, seq: _Sequence, item: Any) -> None:
        self._outgoing.append((seq, item))

    def _flush(self) -> None:
        """Hand this turn's chunks over: one call per event loop, not per chunk."""
        if not self._outgoing:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Sequence, Any]]] = {}
        for seq, item in self._outgoing:
            if seq.stamps is not None and "out" not in seq.stamps:
                self._first_text_out(seq, item)
            by_loop.setdefault(seq.loop, []).append((seq, item))
        self._outgoing = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                # That event loop is closed: its consumers are gone.
                for seq, _ in items:
                    seq.cancelled = True


def _deliver(items: list[tuple[_Sequence, Any]]) -> None:
    """Event loop: put each chunk in its request's inbox and wake the consumer."""
    for seq, item in items:
        seq.items.append(item)
        _wake(seq.waiter)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
