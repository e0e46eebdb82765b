"""Loading an mlx-lm model onto the worker thread and measuring what it costs.

Before the engine is handed back, i.e. before the model is reported loaded,
it is warmed up when that is quick (mlxd.engine.warmup: its kernels are
known to be compiled here), else warmed in the background once handed over
(mlxd.engine.warmup_background), and, with a cache dir, its saved prefix
cache is restored.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from mlxd.engine import memory
from mlxd.engine.batch import supports_batching
from mlxd.engine.cache_store.folder import CacheStore
from mlxd.engine.cache_store.persistence import PrefixCachePersistence, forget_saved
from mlxd.engine.fingerprint import model_fingerprint
from mlxd.engine.lifecycle import load_on_worker, measured_load
from mlxd.engine.cache_entry import CacheLayout, model_cache_layout
from mlxd.engine.cache_layers import may_outgrow_trimming
from mlxd.engine.speculative_cache import unsupported_layers
from mlxd.engine.ssm_lengths import pass_ssm_lengths
from mlxd.engine.text import TextEngine
from mlxd.engine.text_model import LoadedText, quantize_kv
from mlxd.engine.warmup import CONTEXT_MARGIN, LOAD, WarmupReport, decide_mode, plan_warmup, warm_up
from mlxd.engine.warmup_background import BackgroundWarmup
from mlxd.engine.warmup_marker import model_marker
from mlxd.engine.worker import MlxWorker
from mlxd.errors import ModelLoadFailed, describe_exception
from mlxd.registry.device import current_device
from mlxd.registry.model import ModelSpec

log = logging.getLogger(__name__)

# `load` or `background` overrides where the warm-up runs (decide_mode).
WARMUP_ENV = "MLXD_WARMUP"


async def load_text_engine(
    spec: ModelSpec, worker: MlxWorker, *, prefill_chunk: int = 512, cache_dir: Path | None = None,
    warmup: str | None = None,
) -> TextEngine:
    """Load ``spec`` with ``mlx_lm.load`` on the worker and wrap it as a TextEngine.

    If the caller is cancelled mid-load, the load still finishes on the worker
    (it cannot be interrupted) and the model is then unloaded, so a cancelled
    load never leaves memory behind.

    ``cache_dir`` (the manager's) turns on prefix cache persistence under
    ``cache_dir/prefix/<fingerprint>/`` when the spec asks for it; the saved
    entries are restored here. A restore problem is logged, never fatal.

    ``warmup`` ("load" or "background") says where the warm-up runs; None
    decides (``decide_mode``, ``$MLXD_WARMUP``).
    """
    fingerprint = await _fingerprint(spec) if cache_dir is not None and spec.prefix_cache.saves else None
    store = None
    if fingerprint is not None and cache_dir is not None:
        store = CacheStore(Path(cache_dir) / "prefix", fingerprint, spec.prefix_cache.disk_max_bytes)
        # In use from here to the engine's close: no cache-dir bound removes
        # the folder while the model loads, restores or serves.
        await asyncio.to_thread(store.hold)
    try:
        loaded = await load_on_worker(worker, load_text_model, spec, _unload)
    except BaseException:
        if store is not None:
            store.release()
        raise
    engine = TextEngine(spec, worker, loaded, prefill_chunk=prefill_chunk)
    engine.cache_store = store
    try:
        background = await _warm(engine, spec, worker, prefill_chunk, warmup)
    except asyncio.CancelledError:
        asyncio.ensure_future(engine.close())
        raise
    if store is not None and engine.prefix_cache is not None:
        engine.persistence = PrefixCachePersistence(
            store, worker, engine.prefix_cache, layout=lambda: _kv_layout(engine),
            prefill_rate=lambda: _prefill_rate(engine),
        )
        try:
            await engine.persistence.restore()
        except asyncio.CancelledError:
            asyncio.ensure_future(engine.close())
            raise
    if background is not None:
        engine.background_warmup = background
        background.start()
    return engine


async def _warm(
    engine: TextEngine, spec: ModelSpec, worker: MlxWorker, chunk: int, forced: str | None
) -> BackgroundWarmup | None:
    """Warm now, or return the background warm-up to start once the engine is ready."""
    device = await worker.call(current_device)
    speculates = engine.speculation is not None and engine.speculation.usable
    runs = plan_warmup(max_context=spec.max_context, prefill_chunk=chunk, max_concurrency=spec.max_concurrency,
                       batching=engine.batching, device=device.kind,
                       speculative_tokens=engine.speculation.tokens if speculates else 0)
    model, _ = engine.model.get()
    marker = await worker.call(model_marker, model, Path(spec.path), device.kind, device.name,
                               kv_bits=spec.kv_bits, batching=engine.batching, runs=runs)
    known = marker is not None and await asyncio.to_thread(marker.known)
    mode, why = decide_mode(device=device.kind, known_compiled=known, forced=forced or os.environ.get(WARMUP_ENV))

    async def note(report: WarmupReport) -> None:
        if marker is not None and report.error is None:
            await asyncio.to_thread(marker.write, spec.name, report.as_dict())

    room = max(1, spec.max_context - CONTEXT_MARGIN - max(r.max_tokens for r in runs))
    if mode != LOAD:
        log.info("%s is served at once and warms up in the background: %s", spec.name, why)
        return BackgroundWarmup(engine, runs, max_chars=room, on_done=note)
    engine.warmup = await warm_up(engine, runs, max_chars=room)
    log.info("%s warmed up in the load in %.2fs (%s; %d requests, prefill %s tok/s)", spec.name,
             engine.warmup.seconds, why, engine.warmup.requests, engine.warmup.prefill_tokens_per_s)
    await note(engine.warmup)
    return None


def _prefill_rate(engine: TextEngine) -> float | None:
    return engine.warmup.prefill_tokens_per_s if engine.warmup is not None else None


def _kv_layout(engine: TextEngine) -> CacheLayout:
    """Worker thread: what a restored entry must look like for this model."""
    model, _ = engine.model.get()
    return model_cache_layout(model, engine.spec.kv_bits)


async def clear_saved_prefix_cache(spec: ModelSpec, cache_dir: Path) -> int:
    """An unloaded model's saved prefix cache, removed (an operator's clear
    reaches it too, or its next load would bring the entries back). Returns
    how many entries were removed."""
    fingerprint = await _fingerprint(spec) if spec.prefix_cache.saves else None
    if fingerprint is None:
        return 0
    return await forget_saved(CacheStore(Path(cache_dir) / "prefix", fingerprint, spec.prefix_cache.disk_max_bytes))


async def _fingerprint(spec: ModelSpec) -> str | None:
    try:
        return await asyncio.to_thread(model_fingerprint, spec.path, spec.kv_bits)
    except OSError as exc:
        log.warning("prefix cache of %s not persisted: %s", spec.name, describe_exception(exc))
        return None


def load_text_model(spec: ModelSpec) -> LoadedText:
    """Worker thread: ``mlx_lm.load`` plus the active memory it added."""
    import mlx_lm

    def load() -> tuple[Any, Any, Any]:
        model, tokenizer = mlx_lm.load(str(spec.path), trust_remote_code=spec.trust_remote_code)
        pass_ssm_lengths(model)
        draft = None
        s = spec.speculative
        if s is not None and s.method == "draft" and s.draft_path is not None and not s.cannot_pay:
            # Loaded, measured and unloaded with the target: one footprint.
            draft, _ = mlx_lm.load(str(s.draft_path))
            pass_ssm_lengths(draft)
        return model, tokenizer, draft

    done = measured_load(spec, load, memory.release_memory)
    model, tokenizer, draft = done.result
    try:
        _refuse_unquantisable(spec, model)
    except ModelLoadFailed:
        # Dropped before the memory is given back: nothing may hold the weights.
        done = model = tokenizer = draft = None
        memory.release_memory()
        raise
    return LoadedText(
        model, tokenizer, load_bytes=done.load_bytes, load_seconds=done.load_seconds,
        batchable=supports_batching(model),
        checkpoints=_needs_checkpoints(model),
        draft=draft,
        unspeculative=_unspeculative(spec, model, draft),
    )


def _refuse_unquantisable(spec: ModelSpec, model: Any) -> None:
    """Worker thread: one token through ``model`` on its cache quantised as
    ``kv_bits`` asks. Some attention cannot read a quantised cache (gpt-oss's
    sinks: "Quantized SDPA does not support attention sinks"), which would
    fail every request with a 500; the load fails instead, saying why."""
    if spec.kv_bits is None:
        return
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    quantize_kv(cache, spec.kv_bits)
    try:
        mx.eval(model(mx.array([[0]]), cache=cache))
    except Exception as exc:  # noqa: BLE001 - whatever the model's attention raises
        raise ModelLoadFailed(
            f"The model `{spec.name}` cannot use a quantised KV cache (`kv_bits: {spec.kv_bits}`): "
            f"{describe_exception(exc)}. Remove `kv_bits` from its entry."
        ) from None


def _unspeculative(spec: ModelSpec, model: Any, draft: Any) -> str | None:
    """Why the loaded model (or its draft) cannot roll back a speculative batch."""
    from mlx_lm.models.cache import make_prompt_cache

    if spec.speculative is None:
        return None
    if spec.speculative.cannot_pay:
        return spec.speculative.cannot_pay
    odd = unsupported_layers(make_prompt_cache(model))
    if odd:
        return f"its cache has {', '.join(sorted(odd))} layers, which a speculative batch cannot roll back"
    if draft is not None:
        odd = unsupported_layers(make_prompt_cache(draft))
        if odd:
            return f"the draft model's cache has {', '.join(sorted(odd))} layers, which a draft cannot give back"
    return None


def _needs_checkpoints(model: Any) -> bool:
    from mlx_lm.models.cache import make_prompt_cache

    try:
        return may_outgrow_trimming(make_prompt_cache(model))
    except Exception:  # noqa: BLE001 - an exotic model: no checkpoints, the cache still works
        return False


def _unload(loaded: LoadedText) -> None:
    """Worker thread: drop the model's references there, then give the memory back."""
    loaded.model = None
    loaded.tokenizer = None
    loaded.draft = None
    memory.release_memory()
