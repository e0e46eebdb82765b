"""A parallel model as one engine: the Engine contract over a gang of ranks.

The daemon never joins the group. It keeps the tokenizer (the prompt is
tokenized with the model's chat template here, exactly as for a local
model, and grammars are compiled here first), sends each request's token
ids to every rank, and turns rank 0's tokens back into text with mlx-lm's
streaming detokenizer and mlxd's stop strings. So every surface, the fair queue, status and metrics see an
engine like any other.

Up to ``max_concurrency`` requests decode side by side as one continuous
batch on the ranks. Ranks in a collective must all run the same step, and
two requests interleaved differently on two ranks is how tensor-parallel
ranks deadlock (omlx#3039), so the daemon sends every rank the same
messages in one order (``_turn``) and rank 0 decides, step by step, when
the others take them (``distributed/rank.py``).

When the gang fails (a rank exits or stops making progress), every request
in flight ends with ``ModelFailed`` (an error event on streams) and
``failure()`` returns, which the residency shell turns into a failed model
with backoff (``ResidencyCore.engine_failed``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxd.caller import urgency
from mlxd.distributed import saved_cache
from mlxd.distributed.gang import LOCAL, Gang, GangPlan
from mlxd.distributed.liveness import Deadlines, Failure
from mlxd.distributed.prefix_plan import GangPrefixPlan, Reuse
from mlxd.engine.contract import AnswerFormats, GenerationEngine
from mlxd.engine.local_output import LocalOutput
from mlxd.engine.logprobs import TokenLogprob, TokenSpelling
from mlxd.engine.prompt import check_context, prompt_tokens
from mlxd.engine.sampling import check_bias_ids
from mlxd.engine.stops import StopMatcher
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.errors import BadRequest, ModelFailed, ModelUnloaded
from mlxd.grammar.compiler import GrammarCompiler
from mlxd.registry.model import ModelSpec
from mlxd.tools import formats as tool_formats
from mlxd.tools import reasoning as reasoning_formats
from mlxd.tools.output_request import OutputRequest

log = logging.getLogger("mlxd.distributed")


class GangEngine(GenerationEngine):
    kind = "gang"
    batching = False  # set per entry in __init__
    wants_image_urls = False

    def __init__(self, spec: ModelSpec, gang: Gang, tokenizer: Any, vocab_size: int, load_seconds: float) -> None:
        self.name = spec.name
        self.spec = spec
        self.gang = gang
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        # Compiles each request's grammar here first, so that a bad schema is
        # a 400 before a stream's 200; rank 0 compiles its own to decode under.
        self.grammars = GrammarCompiler(tokenizer, vocab_size)
        self.tool_format = tool_formats.resolve(tokenizer, spec.tool_parser)
        self.reasoning_format = reasoning_formats.resolve(tokenizer, spec.reasoning_parser)
        # Output is settled as a text engine settles it.
        self.output = LocalOutput(self.tool_format, self.reasoning_format, self.grammars, vocab_size)
        self.load_seconds = load_seconds
        # Requests decode side by side on the ranks (a continuous batch of
        # up to max_concurrency rows), when the model's caches can merge.
        self.batching = spec.max_concurrency > 1
        # Orders what goes to the ranks (see _generate) and keeps save,
        # restore and clear between requests.
        self._turn = asyncio.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self.generations = 0
        self.tokens_generated = 0
        self.aborted = 0
        # The ranks' kept KV caches, decided here for all of them: rank 0's
        # share bounded so that all ranks together hold about max_bytes.
        share = spec.prefix_cache.max_bytes // max(1, len(gang.plan.hosts))
        self.prefix = GangPrefixPlan(share, trimmable=gang.trimmable)
        # The requests sent, until their ranks' end events say what their caches hold.
        self._sent: dict[str, _Request] = {}
        self._asks = itertools.count(1)

    # --- the contract ---------------------------------------------------------------

    @property
    def measured_bytes(self) -> int | None:
        """This machine's share: its ranks' memory (a rank on another host
        is that host's to budget)."""
        shares = [r.memory_bytes for r in self.gang.liveness.ranks if r.host == LOCAL]
        if any(s is None for s in shares):
            return None
        return sum(s for s in shares if s is not None)

    async def failure(self) -> str:
        """Returns once the gang has failed: which rank, and why."""
        failure = await asyncio.shield(self.gang.failed)
        return failure.sentence()

    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        return await self.output.settle(requests, output, name)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if self._closed:
            raise ModelUnloaded(self.name)
        self._refuse_unsupported(request)
        tokenizer = self._tokenizer
        tokens = await asyncio.to_thread(prompt_tokens, tokenizer, request)
        check_context(len(tokens), request, self.spec.max_context)
        yield GenerationChunk(text="", prompt_tokens=len(tokens))
        max_tokens = min(request.max_tokens, max(1, self.spec.max_context - len(tokens)))
        sent: _Request | None = None
        try:
            async with self._turn:
                # The plan and the send in one order for every rank: what a
                # prompt starts from, and what the ranks evict, must reach
                # them all in the order it was decided.
                self._raise_if_failed()
                await self._settle()
                rid = f"{request.request_id}-{next(self._ids)}"
                sent = _Request(rid, self.gang.subscribe(rid), self.prefix.plan(tokens), tokens)
                self._sent[rid] = sent
                await asyncio.shield(self.gang.send_all({
                    "op": "generate", "id": rid, "tokens": tokens, "max_tokens": max_tokens,
                    "vocab_size": self.vocab_size, "sampling": _sampling(request),
                    "ignore_eos": request.ignore_eos, "logprobs": request.logprobs,
                    "logit_bias": {str(k): v for k, v in (request.logit_bias or {}).items()},
                    "constraint": _constraint(request), "reuse": sent.reuse.message(),
                    "urgency": urgency(request.priority),
                }))
                self.generations += 1
            async for chunk in self._relay(sent, len(tokens), request.stop, request.logprobs is not None):
                yield chunk
        finally:
            if sent is not None:
                sent.relayed = True
                if sent.end is None and not self.gang.failed.done():
                    # A stop string matched, or the client left: the ranks
                    # end its row at their next step (its end event settles
                    # it then).
                    await self.gang.send_leader({"op": "cancel", "id": sent.rid})
                elif sent.end is not None:
                    async with self._turn:
                        await self._settle()

    def _ended(self) -> list[_Request]:
        """The requests whose answers are over and whose end event is in:
        their caches can be settled now."""
        ended = []
        for sent in list(self._sent.values()):
            if not sent.relayed:
                continue  # its relay still reads its events
            while sent.end is None and not sent.inbox.empty():
                event = sent.inbox.get_nowait()
                if isinstance(event, dict):
                    sent.note(event)
            if sent.end is not None or self.gang.failed.done():
                ended.append(sent)
        return ended

    async def _settle(self) -> None:
        """Keep each ended request's cache as the ranks kept it (or have them
        drop it when its contents are unknown), then drop what the bounds
        leave no room for. Under ``_turn``."""
        drop: list[int] = []
        for sent in self._ended():
            self._sent.pop(sent.rid, None)
            self.gang.unsubscribe(sent.rid)
            if self.gang.failed.done():
                continue
            if sent.end is None or "cached" not in sent.end:
                drop += self.prefix.forget(sent.reuse)
            else:
                held = int(sent.end["cached"])
                fed = [*sent.prompt, *sent.decided][:held]
                drop += self.prefix.kept(sent.reuse, fed, int(sent.end.get("entry_bytes") or 0))
        if drop and not self.gang.failed.done():
            await self.gang.send_all({"op": "evict", "ids": drop})

    async def _quiet(self) -> None:
        """Under ``_turn``: wait until no request is on the ranks, and settle
        those whose answers are over (save, restore and clear need the ranks
        between requests; an answer still being read settles itself)."""
        await self.gang.idle.wait()
        await self._settle()

    async def _relay(
        self, sent: _Request, n_prompt: int, stop: list[str], scoring: bool = False,
    ) -> AsyncIterator[GenerationChunk]:
        tokenizer = self._tokenizer
        detokenizer = tokenizer.detokenizer
        detokenizer.reset()
        eos = set(tokenizer.eos_token_ids)
        stops = StopMatcher(stop)
        produced = reused = 0
        scored: list[TokenLogprob] = []
        spell = TokenSpelling(tokenizer)

        def chunk(text: str, finish: str | None = None) -> GenerationChunk:
            entries = scored[:] if scoring else None
            scored.clear()
            return GenerationChunk(text=text, finish_reason=finish, prompt_tokens=n_prompt,
                                   completion_tokens=produced, cached_tokens=reused, logprobs=entries)

        while True:
            event = await sent.inbox.get()
            if isinstance(event, Failure):
                raise ModelFailed(f"The parallel model `{self.name}` failed: {event.sentence()}.")
            sent.note(event)
            if event["ev"] == "phase":
                reused = int(event.get("reused") or 0)
            elif event["ev"] == "token":
                token = int(event["t"])
                if token in eos:
                    continue  # the end event follows with reason "stop"
                produced += 1
                self.tokens_generated += 1
                if scoring:
                    text, raw = spell(token)
                    scored.append(TokenLogprob(
                        text, float(event.get("lp", 0.0)), raw,
                        tuple((*spell(int(i)), float(v)) for i, v in event.get("top", []) if math.isfinite(v)),
                    ))
                detokenizer.add_token(token)
                text, stopped = stops.feed(detokenizer.last_segment)
                if stopped:
                    last = chunk(text, "stop")
                    last.stop_sequence = stops.matched
                    yield last
                    return
                if text:
                    yield chunk(text)
            elif event["ev"] == "end":
                detokenizer.finalize()
                text, stopped = stops.feed(detokenizer.last_segment)
                reason = str(event.get("reason") or "length")
                if reason == "abort":
                    self.aborted += 1
                last = chunk(text + ("" if stopped else stops.flush()), "stop" if stopped else reason)
                last.stop_sequence = stops.matched
                yield last
                return

    def _refuse_unsupported(self, request: GenerationRequest) -> None:
        if request.logit_bias:
            check_bias_ids(request.logit_bias, self.vocab_size)
        if request.max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
        if request.reasoning_budget is not None:
            raise BadRequest(f"`{self.name}` is a parallel model; a reasoning budget is not enforced by its ranks "
                             "yet.", param="reasoning")

    def _raise_if_failed(self) -> None:
        if self.gang.failed.done():
            raise ModelFailed(f"The parallel model `{self.name}` failed: {self.gang.failed.result().sentence()}.")
        if self._closed:
            raise ModelUnloaded(self.name)

    async def abort_all(self, reason: str) -> int:
        running = [sent.rid for sent in self._sent.values() if not sent.relayed]
        for rid in running:
            await self.gang.send_leader({"op": "cancel", "id": rid})
        return len(running)

    @property
    def saved_folder(self) -> Path | None:
        """Where the ranks save their entries when the gang goes (None: they do not)."""
        return self.gang.plan.cache_folder

    @property
    def _ask_timeout(self) -> float:
        """How long every rank may take to save or restore: as long as a load."""
        return self.spec.parallel.load_timeout_s if self.spec.parallel else 60.0

    async def before_unload(self) -> None:
        """Every rank saves its shard of the kept entries; the manifest lists
        those that all of them wrote (a gang that failed saves nothing: its
        ranks are gone)."""
        folder = self.saved_folder
        if folder is None or self._closed or self.gang.failed.done():
            return None
        async with self._turn:
            await self._quiet()
            entries = _within(self.prefix.saved(), self.spec.prefix_cache.disk_max_bytes // max(1, len(self.gang.plan.hosts)))
            if self.gang.failed.done():
                return None
            answers = await self.gang.ask_all(
                {"op": "save", "id": f"save-{next(self._asks)}", "ids": [i for i, _, _ in entries]},
                self._ask_timeout)
            if answers is None:
                log.warning("prefix cache of %s not saved: a rank did not answer", self.name)
                return None
            written = set.intersection(*(set(a.get("ids") or ()) for a in answers)) if answers else set()
            kept = [e for e in entries if e[0] in written]
            try:
                await asyncio.to_thread(saved_cache.write_manifest, folder, kept)
            except OSError as exc:
                log.warning("prefix cache of %s not saved: %s", self.name, exc)
                return None
            log.info("prefix cache of %s saved: %d of %d entries on every rank", self.name, len(kept), len(entries))
        return None

    async def restore_saved(self) -> int:
        """The entries the last gang saved, read back by every rank; those
        that all of them restored are kept (the others dropped where they
        were read). Returns how many."""
        folder = self.saved_folder
        saved = await asyncio.to_thread(saved_cache.read_manifest, folder) if folder is not None else []
        if not saved:
            return 0
        answers = await self.gang.ask_all(
            {"op": "restore", "id": f"restore-{next(self._asks)}",
             "counts": {str(e["id"]): len(e["tokens"]) for e in saved}},
            self._ask_timeout)
        if answers is None:
            return 0
        read = [{int(k): int(v) for k, v in (a.get("bytes") or {}).items()} for a in answers]
        everywhere = set.intersection(*(set(r) for r in read))
        partial = sorted(set().union(*read) - everywhere)
        if partial:
            await self.gang.send_all({"op": "evict", "ids": partial})
        leader = next((r for a, r in zip(answers, read) if a.get("rank") == 0), read[0])
        for entry in saved:
            if entry["id"] in everywhere:
                self.prefix.adopt(entry["id"], entry["tokens"], leader[entry["id"]])
        log.info("prefix cache of %s restored: %d of %d saved entries", self.name, len(everywhere), len(saved))
        return len(everywhere)

    async def clear_prefix_cache(self) -> bool:
        async with self._turn:
            await self._quiet()
            drop = self.prefix.clear()
            if drop and not self.gang.failed.done():
                await self.gang.send_all({"op": "evict", "ids": drop})
            if self.saved_folder is not None:
                await asyncio.to_thread(saved_cache.forget, self.saved_folder)
        return True

    async def close(self) -> None:
        """The whole gang goes: every rank's process group ended and waited for."""
        if self._closed:
            return
        self._closed = True
        await self.gang.stop()

    def stats(self) -> dict[str, Any]:
        gang = self.gang
        failure = gang.failed.result() if gang.failed.done() else None
        return {
            "kind": self.kind,
            "mode": gang.plan.mode,
            "transport": gang.plan.transport,
            "ranks": gang.liveness.rows(time.monotonic()),
            "failed_rank": failure.rank if failure else None,
            "failure": failure.sentence() if failure else None,
            "in_flight": sum(1 for sent in self._sent.values() if not sent.relayed),
            "generations": self.generations,
            "tokens_generated": self.tokens_generated,
            "aborted": self.aborted,
            "prefix_cache": self.prefix.figures(),
            "measured_bytes": self.measured_bytes,
            "load_seconds": round(self.load_seconds, 3),
            "closed": self._closed,
        }


@dataclass
class _Request:
    """One request sent to the ranks, and what the daemon has heard of it."""

    rid: str
    inbox: asyncio.Queue[dict[str, Any] | Failure]
    reuse: Reuse
    prompt: list[int]
    decided: list[int] = field(default_factory=list)
    end: dict[str, Any] | None = None
    relayed: bool = False  # its answer is over (its end event may still be on its way)

    def note(self, event: dict[str, Any]) -> None:
        if event.get("ev") == "token":
            self.decided.append(int(event["t"]))
        elif event.get("ev") == "end":
            self.end = event


def _within(entries: list[tuple[int, tuple[int, ...], int]], share: int) -> list[tuple[int, tuple[int, ...], int]]:
    """The most recently used entries whose rank-0 bytes fit ``share`` (the
    disk bound over the ranks), in their order."""
    kept, total = [], 0
    for entry in reversed(entries):
        if total + entry[2] > share:
            break
        kept.append(entry)
        total += entry[2]
    return kept[::-1]


def _constraint(request: GenerationRequest) -> dict[str, str] | None:
    c = request.constraint
    return {"kind": c.kind, "text": c.text} if c is not None else None


def _sampling(request: GenerationRequest) -> dict[str, Any]:
    s = request.sampling
    return {
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "seed": s.seed,
    }


def _load_tokenizer(path: Path) -> tuple[Any, int]:
    """The daemon's half of the model: its tokenizer and logits width (no weights)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import load_config

    config = load_config(path)
    tokenizer = load_tokenizer(path, {"trust_remote_code": True}, eos_token_ids=config.get("eos_token_id"))
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or tokenizer.vocab_size
    return tokenizer, int(vocab)


async def load_gang_engine(spec: ModelSpec, worker: Any = None, *, cache_dir: Path | None = None) -> GangEngine:
    """Start the gang and wait for every rank's load barrier; the engine
    exists only once the whole gang is resident."""
    parallel = spec.parallel
    assert parallel is not None, spec.name
    started = time.monotonic()
    tokenizer, vocab = await asyncio.to_thread(_load_tokenizer, spec.path)
    plan = GangPlan(
        name=spec.name, path=spec.path, mode=parallel.mode, hosts=parallel.hosts,
        transport=parallel.transport, eos=tuple(sorted(tokenizer.eos_token_ids)),
        deadlines=Deadlines(parallel.load_timeout_s, parallel.prefill_timeout_s, parallel.step_timeout_s),
        remotes={name: (url, os.environ.get(key_env) if key_env else None) for name, url, key_env in parallel.remotes},
        cache_folder=await saved_cache.gang_folder(spec, cache_dir),
        max_batch=spec.max_concurrency,
        rdma_devices=parallel.rdma_devices,
    )
    gang = Gang(plan)
    await gang.start()
    engine = GangEngine(spec, gang, tokenizer, vocab, time.monotonic() - started)
    try:
        await engine.restore_saved()
    except BaseException:
        await engine.close()
        raise
    return engine
