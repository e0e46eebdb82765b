"""One rank of a gang: ``python -m mlxd.distributed.rank``, started by the
daemon (``distributed/gang.py``) with ``MLX_RANK``, ``MLX_HOSTFILE`` and the
spec in ``MLXD_GANG_*`` variables; never by ``mlx.launch``.

It joins the group, loads its shard, passes the load barrier, then runs
what the daemon sends on stdin (JSON lines, ``distributed/wire.py``) as a
continuous batch of up to ``MLXD_GANG_MAX_BATCH`` requests, and reports on
its own event channel (the original stdout; fd 1 is pointed at stderr so
that no library's print can corrupt it).

Every rank runs the same step program over the same rows, so every
collective inside the model meets its peers. Rank 0 leads: after each step
it samples every row's token, decides which rows end (end token,
max_tokens, a cancel from the daemon) and how many of the waiting messages
every rank takes before the next step, and one ``all_sum`` hands all of
that to the followers. A follower never reads a cancel or its queue's
length itself: two ranks that stop, or admit, at different steps would
leave one waiting in a collective forever.
"""

from __future__ import annotations

import collections
import faulthandler
import json
import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from mlxd.distributed import wire
from mlxd.distributed.rank_batch import Prefill, Row, RowBatch
from mlxd.engine import cache_layers

# How long a rank whose daemon went away may take to finish by itself.
ORPHAN_GRACE_S = 5.0


class Reporter:
    """The rank's event channel: one JSON line per event, flushed at once
    (the daemon's liveness reads progress from it)."""

    def __init__(self, out: TextIO, rank: int) -> None:
        self._out = out
        self._rank = rank
        self._lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        line = wire.encode({"ev": kind, "rank": self._rank, **fields})
        with self._lock:
            self._out.write(line)
            self._out.flush()


def _read_commands(source: TextIO, inbox: queue.Queue[dict[str, Any] | None], cancels: set[str]) -> None:
    """Stdin reader thread: cancels are noted at once (rank 0 reads them
    between steps), everything else is queued in order. EOF: the daemon is
    gone, and so is the reason to live."""
    for line in source:
        message = wire.decode(line)
        if message is None:
            continue
        if message.get("op") == "cancel":
            cancels.add(str(message.get("id")))
        else:
            inbox.put(message)
    inbox.put(None)
    # A rank waiting in a collective never reads the queue again: without
    # its daemon (killed, or it closed the channel) it must not outlive it.
    timer = threading.Timer(ORPHAN_GRACE_S, os._exit, args=(0,))
    timer.daemon = True
    timer.start()


def _arm_load_deadline() -> None:
    """End this process if it has not loaded within the gang's load deadline
    (and a grace, for a live daemon to end it first). Rank 0 of a ring whose
    peer never came waits in accept for ever holding the GIL, so neither the
    stdin reader nor any Python thread can end it when its daemon died
    meanwhile (killed, out of memory); faulthandler's watchdog is a thread
    of C that needs no GIL."""
    limit = float(os.environ.get("MLXD_GANG_LOAD_TIMEOUT_S") or 0)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + ORPHAN_GRACE_S, exit=True)


def _bare_mlx_lm() -> None:
    """Make ``mlx_lm`` importable without its ``__init__``, which imports
    transformers (2-3 s per rank here, paid again at every load of the gang);
    a rank needs only the model classes, the cache and the samplers."""
    import importlib.util
    import types

    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("mlx_lm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules["mlx_lm"] = package


def always_trimmable(model: Any) -> bool:
    """Whether every cache this model makes can be trimmed at any length,
    which lets the daemon copy and cut a longer entry for a shorter prompt.
    A fresh cache says too little: a sliding-window layer trims until its
    window wraps, and an SSM layer's state never does."""
    from mlx_lm.models.cache import make_prompt_cache

    return not cache_layers.may_outgrow_trimming(make_prompt_cache(model))


def _load(path: str, mode: str, group: Any) -> Any:
    """The model with only this rank's shard of the weights evaluated."""
    import mlx.core as mx

    model = _build(Path(path))
    if mode == "pipeline":
        if not hasattr(getattr(model, "model", None), "pipeline"):
            raise ValueError(f"mlx-lm's {type(model).__module__} has no pipeline split; use mode: tensor")
        model.model.pipeline(group)
    else:
        if not hasattr(model, "shard"):
            raise ValueError(f"mlx-lm's {type(model).__module__} has no tensor split; use mode: pipeline")
        model.shard(group)
    mx.eval(model.parameters())
    return model


def _build(path: Path) -> Any:
    """mlx-lm's model class with the folder's weights, lazily (nothing is
    read until the shard is evaluated). Architectures mlx-lm reaches through
    a remapping, or quantized per layer, go through its own loader."""
    import importlib

    import mlx.core as mx
    import mlx.nn as nn

    config = json.loads((path / "config.json").read_text())
    quant = config.get("quantization")
    try:
        arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    except (ImportError, KeyError):
        arch = None
    if arch is None or (isinstance(quant, dict) and any(isinstance(v, dict) for v in quant.values())):
        from mlx_lm.utils import load_model

        return load_model(path, lazy=True, strict=False)[0]
    model = arch.Model(arch.ModelArgs.from_dict(config))
    weights: dict[str, Any] = {}
    for file in sorted(path.glob("model*.safetensors")):
        weights.update(mx.load(str(file)))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    if isinstance(quant, dict):
        nn.quantize(model, group_size=quant["group_size"], bits=quant["bits"], mode=quant.get("mode", "affine"),
                    class_predicate=lambda p, m: f"{p}.scales" in weights)
    model.load_weights(list(weights.items()), strict=False)
    return model


def collective_stream(backend: str) -> Any:
    """Where the rank's own small collectives run: the ring and jaccl move
    CPU buffers (as mlx-lm's barrier does), NCCL only GPU ones."""
    import mlx.core as mx

    return mx.default_device() if backend == "nccl" else mx.cpu


def _barrier(group: Any, backend: str) -> None:
    import mlx.core as mx

    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=collective_stream(backend)))


class Runner:
    """The step program, the same on every rank: requests join a continuous
    batch (``distributed/rank_batch.py``), every step decodes all its rows."""

    def __init__(self, model: Any, group: Any, report: Reporter, cancels: set[str], eos: set[int],
                 backend: str = "ring", max_batch: int = 1) -> None:
        self.model = model
        self.group = group
        self.rank = group.rank()
        self.report = report
        self.cancels = cancels
        self.eos = eos
        self.peak_reported = 0  # the peak last reported (a bigger batch holds more)
        # The KV caches kept after requests, by the ids the daemon gave them:
        # the daemon decides for every rank which one a prompt starts from
        # and which go (distributed/prefix_plan.py), so the ranks stay alike.
        self.entries: dict[int, list[Any]] = {}
        # Rank 0's grammar compiler, made on the first constrained request.
        self.grammars: Any = None
        import mlx.core as mx

        # Its own stream, as mlx-lm's generate keeps one (mlx_lm.generate
        # itself is not imported: it would pull transformers in).
        self.stream = mx.new_stream(mx.default_device())
        self.collectives = collective_stream(backend)
        self.batch = RowBatch()
        self.prefilling: collections.deque[Prefill] = collections.deque()  # admitted, not yet decoding
        self.max_batch = max(1, max_batch)
        from mlx_lm.models.cache import make_prompt_cache

        self.batchable = cache_layers.mergeable(make_prompt_cache(model))

    # --- the step program ----------------------------------------------------------

    def serve(self, inbox: queue.Queue[dict[str, Any] | None], other: Any) -> None:
        """Runs what the daemon sends until it says exit (or goes away).

        Every rank takes the same messages at the same points of the step
        program: with nothing to do, each takes the next message in order;
        while rows decode, rank 0's decision after each batched step says how
        many of the waiting messages every rank takes before the next step
        (the followers wait for theirs: the daemon sent every rank the same
        ones). A new request's prompt is prefilled a chunk at a time between
        the batch's steps, so a long prompt never holds the other rows for
        more than one chunk, the most urgent class's prompts first.
        ``other`` runs a message that is not a generation."""
        agreed = 0
        while True:
            if not self.batch and not self.prefilling and agreed == 0:
                agreed = 1
            while agreed:
                agreed -= 1
                message = inbox.get()
                if message is None or message.get("op") == "exit":
                    return
                if message.get("op") == "generate":
                    self.admit(message)
                else:
                    other(message)
            if self.prefilling:
                self.prefill()
            if self.batch:
                agreed = self.step(inbox)

    def admit(self, message: dict[str, Any]) -> None:
        """A request's row, and its prompt queued for prefill on its own
        cache (a kept entry's, when the daemon chose one)."""
        rid = str(message["id"])
        tokens: list[int] = list(message["tokens"])
        reuse = message.get("reuse")
        row = Row(rid, len(tokens), int(message["max_tokens"]), int(reuse["keep_as"]) if reuse else None,
                  top=message.get("logprobs"))
        if self.rank == 0:
            row.sampler, row.processors = self._sampling(message, self.eos)
            if message.get("constraint"):
                row.processors.append(self._grammar(message))
        cache, done = self._reuse(reuse)
        self.report.send("phase", id=rid, phase="prefill", reused=done)
        self.prefilling.append(Prefill(row, cache, tokens, done, max(1, int(message.get("prefill_step", 512))),
                                       urgency=int(message.get("urgency", 1))))

    def prefill(self) -> None:
        """One chunk of the most urgent prompt waiting; once only its last token is
        left, that token runs as the row's first decode step and the row
        joins the batch (or ends, if its first token ends it). mlx-lm's
        generate_step order, so the logits (and greedy tokens) are those of
        one process."""
        import mlx.core as mx

        # The most urgent class first, first come first served within one (a
        # bulk prompt goes on where it stopped): every rank holds the same
        # prompts, so every rank picks the same one.
        head = min(self.prefilling, key=lambda waiting: waiting.urgency)
        row, cache, tokens = head.row, head.cache, head.tokens
        if head.prompt is None:
            head.prompt = mx.array(tokens)
        prompt = head.prompt
        if len(tokens) - head.done > 1:
            n = min(head.chunk, len(tokens) - head.done - 1)
            with mx.stream(self.stream):
                self.model(prompt[head.done:head.done + n][None], cache=cache)
                mx.eval([c.state for c in cache])
            head.done += n
            self.report.send("progress", id=row.rid, phase="prefill", done=head.done)
            return
        self.prefilling.remove(head)
        row.history = prompt
        with mx.stream(self.stream):
            logits = self.model(prompt[head.done:][None], cache=cache)[:, -1, :]
        _, (token,), (stop,), scored = self._decide([row], logits, None)
        self._advance([row], [token], [stop], scored)
        if stop:
            self._end(row, cache, token)
        else:
            self.batch.join(row, cache)

    def step(self, inbox: queue.Queue[dict[str, Any] | None]) -> int:
        """One decode step of every row; the rows that ended leave. Returns
        how many waiting messages every rank takes next."""
        import mlx.core as mx

        rows = list(self.batch.rows)
        with mx.stream(self.stream):
            logits = self.model(self.batch.inputs(), cache=self.batch.cache)[:, -1, :]
        admit, tokens, stops, scored = self._decide(rows, logits, inbox)
        self._advance(rows, tokens, stops, scored)
        leaving = {i for i, stop in enumerate(stops) if stop}
        caches = self.batch.leave(leaving)
        for i in sorted(leaving):
            self._end(rows[i], caches[i], tokens[i])
        return admit

    def _decide(self, rows: list[Row], logits: Any, inbox: queue.Queue[dict[str, Any] | None] | None
                ) -> tuple[int, list[int], list[bool], list[dict[str, Any]]]:
        """Rank 0 draws each row's token and says whether the row ends (an
        end token, max_tokens, a cancel) and how many waiting messages every
        rank takes next (none when ``inbox`` is None); one ``all_sum`` hands
        all of it to the followers. Last, each row's scores (rank 0, for
        logprobs; empty elsewhere)."""
        import mlx.core as mx

        scored: list[dict[str, Any]] = [{} for _ in rows]
        with mx.stream(self.stream):
            if self.rank == 0:
                drawn = []
                for i, row in enumerate(rows):
                    row_logits = logits[i:i + 1]
                    for processor in row.processors:
                        row_logits = processor(row.history, row_logits)
                    logprobs = row_logits - mx.logsumexp(row_logits, keepdims=True)
                    drawn.append((row.sampler(logprobs).reshape(-1), logprobs))
                picked = mx.concatenate([t for t, _ in drawn]).tolist()
                stops = []
                for i, (row, token) in enumerate(zip(rows, picked)):
                    if row.top is not None:
                        scored[i] = _scored(drawn[i][1], int(token), row.top)
                    stops.append(token in self.eos or row.step + 1 >= row.max_tokens or row.rid in self.cancels)
                admit = self._admissible(inbox, len(rows) - sum(stops)) if inbox is not None else 0
                decision = mx.array([float(admit), *map(float, picked), *(1.0 if s else 0.0 for s in stops)])
            else:
                mx.eval(logits)
                decision = mx.zeros((1 + 2 * len(rows),))
            decision = mx.distributed.all_sum(decision, group=self.group, stream=self.collectives)
            values = decision.tolist()
        n = len(rows)
        return int(values[0]), [int(v) for v in values[1:1 + n]], [v > 0.5 for v in values[1 + n:]], scored

    def _admissible(self, inbox: queue.Queue[dict[str, Any] | None], staying: int) -> int:
        """Rank 0: how many of the messages waiting, in order, every rank
        takes before the next step: up to the first request the batch has no
        room for (one row at a time for a model whose caches cannot merge)."""
        room = (self.max_batch if self.batchable else 1) - staying - len(self.prefilling)
        with inbox.mutex:
            waiting = list(inbox.queue)
        taken = 0
        for message in waiting:
            if message is not None and message.get("op") == "generate":
                if room <= 0:
                    break
                room -= 1
            taken += 1
        return taken

    def _advance(self, rows: list[Row], tokens: list[int], stops: list[bool], scored: list[dict[str, Any]]) -> None:
        """Every row's decided token: rank 0 reports it (with its scores),
        a follower reports its step; the token is each row's next input."""
        import mlx.core as mx

        for i, (row, token, stop) in enumerate(zip(rows, tokens, stops)):
            row.step += 1
            row.token = token
            if self.rank == 0:
                self.report.send("token", id=row.rid, t=token, **scored[i])
                if not stop and row.processors:  # only they read the tokens so far
                    row.history = mx.concatenate([row.history, mx.array([token])])
        if self.rank != 0:
            self.report.send("progress", phase="decode", rows=len(rows))

    def _end(self, row: Row, cache: list[Any], token: int) -> None:
        """The row is done: its cache kept under the daemon's id, and its end
        reported with what the cache holds and how many rows go on."""
        reason = "stop" if token in self.eos else "abort" if row.rid in self.cancels else "length"
        kept: dict[str, Any] = {}
        if row.keep_as is not None:
            self.entries[row.keep_as] = cache
            kept = {"cached": row.cached, "entry_bytes": cache_layers.nbytes(cache)}
        self.cancels.discard(row.rid)
        busy = len(self.batch) + len(self.prefilling)  # rows it still owes steps to
        self.report.send("end", id=row.rid, reason=reason, steps=row.step, busy=busy, **kept, **self._memory())

    def _reuse(self, reuse: dict[str, Any] | None) -> tuple[list[Any], int]:
        """The cache the daemon chose for this prompt and how many of its
        tokens it holds: a kept entry (taken, or copied to keep it), trimmed
        to the prefix the two share, or a fresh one."""
        import copy

        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        source = reuse.get("source") if reuse else None
        if source is None or int(source) not in self.entries:
            return make_prompt_cache(self.model), 0
        assert reuse is not None
        cache = copy.deepcopy(self.entries[int(source)]) if reuse["copy"] else self.entries.pop(int(source))
        if reuse["trim"]:
            trim_prompt_cache(cache, int(reuse["trim"]))
        return cache, int(reuse["shared"])

    def evict(self, ids: list[int]) -> None:
        for entry_id in ids:
            self.entries.pop(int(entry_id), None)

    def save(self, folder: str | None, ids: list[int]) -> list[int]:
        """This rank's shard of the kept entries ``ids``, written under
        ``folder`` (the daemon's prefix cache dir for this gang; None on a
        host that gave none) in mlx-lm's prompt-cache files, in place of
        what was saved before; the ids written."""
        from mlx_lm.models.cache import save_prompt_cache

        if folder is None:
            return []
        out = Path(folder) / f"rank{self.rank}"
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.safetensors"):
            old.unlink()
        saved = []
        for entry_id in ids:
            cache = self.entries.get(int(entry_id))
            if cache is None:
                continue
            part = out / f"{int(entry_id)}.part.safetensors"
            save_prompt_cache(str(part), cache, {"entry": str(int(entry_id))})
            part.replace(out / f"{int(entry_id)}.safetensors")
            saved.append(int(entry_id))
        return saved

    def restore(self, folder: str | None, counts: dict[str, int]) -> dict[str, int]:
        """The saved entries (id: the tokens the daemon's manifest says each
        holds) read back as kept entries; each one restored, with its bytes.
        A file that is missing, unreadable or of another length is left out:
        the daemon keeps only the entries every rank restored."""
        import mlx.core as mx
        from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache

        if folder is None:
            return {}
        layers = len(make_prompt_cache(self.model))
        restored = {}
        for key, count in counts.items():
            path = Path(folder) / f"rank{self.rank}" / f"{int(key)}.safetensors"
            try:
                cache = load_prompt_cache(str(path))
                mx.eval(cache_layers.arrays_of(cache))
            except Exception:  # noqa: BLE001 (any unreadable file is one entry less)
                continue
            if len(cache) != layers or cache_layers.positions(cache) not in (None, int(count)):
                continue
            self.entries[int(key)] = cache
            restored[str(int(key))] = cache_layers.nbytes(cache)
        return restored

    def _memory(self) -> dict[str, int]:
        import mlx.core as mx

        peak = int(mx.get_peak_memory())
        if peak <= self.peak_reported:
            return {}
        self.peak_reported = peak
        return {"peak_bytes": peak}

    def _grammar(self, message: dict[str, Any]) -> Any:
        """The request's grammar as the text engine applies it, last of the
        processors. The compiler needs the Hugging Face tokenizer, loaded on
        the first constrained request only (it pulls transformers in)."""
        from mlxd.engine.types import Constraint
        from mlxd.grammar.processor import GrammarProcessor

        if self.grammars is None:
            from mlx_lm.tokenizer_utils import load as load_tokenizer

            from mlxd.grammar.compiler import GrammarCompiler

            path = Path(os.environ["MLXD_GANG_PATH"])
            tokenizer = load_tokenizer(path, {"trust_remote_code": True}, eos_token_ids=sorted(self.eos) or None)
            self.grammars = GrammarCompiler(tokenizer, int(message["vocab_size"]))
        grammars = self.grammars
        given = message["constraint"]
        matcher = grammars.matcher(Constraint(str(given["kind"]), str(given["text"])))
        return GrammarProcessor(matcher, grammars.mask_size, grammars.eos_token_ids)

    @staticmethod
    def _sampling(message: dict[str, Any], eos: set[int]) -> tuple[Any, list[Any]]:
        """Rank 0's sampler and logits processors, as the text engine builds them."""
        from mlxd.engine import sampling
        from mlxd.engine.types import SamplingParams

        params = SamplingParams(**message.get("sampling", {}))
        vocab = int(message["vocab_size"])
        processors = []
        if message.get("logit_bias"):
            # First, as the text engine orders them: the penalties see biased logits.
            bias = {int(k): float(v) for k, v in message["logit_bias"].items()}
            processors.append(sampling.bias_tokens(bias, vocab))
        processors += sampling.make_logits_processors(params)
        if message.get("ignore_eos"):
            processors.append(sampling.suppress_tokens(eos, vocab))
        return sampling.make_sampler(params, vocab), processors


def _scored(logprobs: Any, token: int, top: int) -> dict[str, Any]:
    """The sampled token's log-probability and the ``top`` most likely ids
    with theirs (the daemon decodes them: it holds the tokenizer)."""
    import mlx.core as mx

    row = logprobs.reshape(-1).astype(mx.float32)
    alternatives: list[list[float]] = []
    if top > 0:
        k = min(top, row.size)
        ids = mx.argpartition(-row, kth=k - 1)[:k]
        alternatives = sorted(([int(i), float(v)] for i, v in zip(ids.tolist(), row[ids].tolist())),
                              key=lambda p: -p[1])
    return {"lp": float(row[token].item()), "top": alternatives}


def main() -> int:
    _bare_mlx_lm()
    import mlx.core as mx

    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    rank = int(os.environ["MLX_RANK"])
    report = Reporter(events, rank)
    report.send("phase", phase="load", pid=os.getpid())
    path, mode = os.environ["MLXD_GANG_PATH"], os.environ.get("MLXD_GANG_MODE", "tensor")
    backend = os.environ.get("MLXD_GANG_BACKEND", "ring")
    _arm_load_deadline()
    try:
        group = mx.distributed.init(strict=True, backend=backend)
        model = _load(path, mode, group)
        _barrier(group, backend)
        faulthandler.cancel_dump_traceback_later()
    except Exception as exc:  # the daemon names this rank and why
        report.send("failed", phase="load", error=f"{type(exc).__name__}: {exc}"[:500])
        return 1
    report.send("ready", memory_bytes=int(mx.get_active_memory()), size=group.size(),
                trimmable=always_trimmable(model))
    eos = {int(t) for t in json.loads(os.environ.get("MLXD_GANG_EOS", "[]"))}
    inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
    cancels: set[str] = set()
    threading.Thread(target=_read_commands, args=(sys.stdin, inbox, cancels), daemon=True).start()
    runner = Runner(model, group, report, cancels, eos, backend,
                    max_batch=int(os.environ.get("MLXD_GANG_MAX_BATCH", "1")))

    def other(message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "evict":
            runner.evict(list(message.get("ids") or []))
        elif op in ("save", "restore"):
            # The daemon asks only while no request is in flight, so no
            # collective is: a rank that cannot write or read its files
            # answers with fewer entries.
            folder = os.environ.get("MLXD_GANG_CACHE_DIR")
            try:
                if op == "save":
                    report.send("saved", id=message.get("id"), ids=runner.save(folder, list(message.get("ids") or [])))
                else:
                    report.send("restored", id=message.get("id"), bytes=runner.restore(folder, message.get("counts") or {}))
            except Exception as exc:  # noqa: BLE001
                report.send("saved" if op == "save" else "restored", id=message.get("id"),
                            error=f"{type(exc).__name__}: {exc}"[:300])

    try:
        runner.serve(inbox, other)
    except Exception as exc:  # a rank that cannot follow takes the gang down
        report.send("failed", phase="decode", error=f"{type(exc).__name__}: {exc}"[:500])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
