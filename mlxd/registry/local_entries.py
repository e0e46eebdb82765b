"""A local entry of ``models.yaml`` -> its :class:`ModelSpec`: the model's
files found (a folder, a Hugging Face repo id, a ``.gguf`` file), its kind,
context and footprint worked out, and its fit in the memory budget checked.

A problem with the model's files on disk is not raised: the model comes back
``broken`` and its located error is kept in ``problems``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mlxd.errors import ConfigError, clip
from mlxd.registry.document import Loc
from mlxd.registry.kinds import PARALLEL, ModelKind, a_model_of
from mlxd.registry.model import Footprint, ModelSpec, ParallelSpec, PrefixCacheSpec, template_pairs
from mlxd.registry.parallel import LOCAL, hosts_of, parallel_spec, placement_problem, split_problem
from mlxd.registry.resolve import (
    Downloader,
    audio_kind_problem,
    detect_kind,
    is_llm_reranker,
    read_model_config,
    resolve_model_dir,
)
from mlxd.registry.schema import ENCODER_KEYS, LOCATION_KEYS, VLLM_MLX_IGNORED_MODEL_KEYS, ModelEntry
from mlxd.registry.sections import DEFAULT_MODEL, Sections
from mlxd.registry.speculative import entry_spec
from mlxd.registry.sizing import (
    encoder_activation_bytes,
    format_bytes,
    kv_cache_bytes,
    max_position_embeddings,
    weights_bytes,
)

logger = logging.getLogger("mlxd.registry.loader")

DEFAULT_MAX_CONTEXT = DEFAULT_MODEL.max_context
# Requests an embedding or rerank model serves at once unless its entry says.
ENCODER_CONCURRENCY = 64


class LocalEntries:
    """Builds the local entries; ``problems`` collects the broken ones' errors."""

    def __init__(self, sections: Sections, env: Mapping[str, str] | None, downloader: Downloader | None) -> None:
        self.s = sections
        self.env = env
        self.downloader = downloader
        self.problems: list[ConfigError] = []

    def model(self, i: int, entry: ModelEntry) -> ModelSpec:
        here: Loc = ("models", i)
        if entry.remote_model is not None:
            raise self.s.doc.error(
                (*here, "remote_model"), "`remote_model` needs a `backend` to name the model on"
            )
        located = entry.location()
        if located is None:
            given = [k for k in LOCATION_KEYS if getattr(entry, k) is not None]
            if given:
                raise self.s.doc.error(
                    (*here, given[1]),
                    f"set only one of `{'`, `'.join(given)}`; they all name the model's files",
                )
            raise self.s.doc.error(
                here, f"model `{entry.name}` needs a `path` (a folder or a Hugging Face repo id)"
            )
        location_key, source = located
        at_location: Loc = (*here, location_key)
        self._note_ignored_keys(i, entry)

        override = None
        if entry.estimated_memory_gb is not None:
            override = int(entry.estimated_memory_gb * 1024**3)
        broken: str | None = None
        try:
            folder = resolve_model_dir(
                source,
                base_dir=self.s.base_dir,
                allow_download=entry.allow_download,
                env=self.env,
                downloader=self.downloader,
                gguf_cache=self.s.manager().cache_dir,
            )
            config = read_model_config(folder)
            weights = weights_bytes(folder)
        except ConfigError as exc:
            broken = exc.detail
            folder, config, weights = self.s.local_path(source), {}, 0
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            # Whatever one model's files provoke (a parser's RecursionError,
            # a Rust panic, a bug of ours) fails that model alone; a registry
            # read by serve, check or a reload must survive any file.
            broken = f"cannot read `{source}` ({type(exc).__name__}: {clip(str(exc), 200)})"
            folder, config, weights = self.s.local_path(source), {}, 0

        kind = entry.kind or ("vision" if entry.mllm else detect_kind(config, folder))
        if broken is None and entry.kind is not None and (mismatch := audio_kind_problem(kind, config, folder)):
            broken, at_location = mismatch, (*here, "kind")
        row = self.s.kinds[kind]
        parallel = None
        if entry.parallel is not None:
            parallel = self._parallel(i, entry, kind)
            row = PARALLEL
            if broken is None and (problem := split_problem(parallel, config, folder)) is not None:
                broken, at_location = problem, (*here, "parallel", "ranks")
        self.s.check_kind_keys(i, entry, row)
        if entry.instruction is not None:
            self._check_instruction(i, entry, kind, config if broken is None else None)
        max_context = self._max_context(i, entry, config)
        prefix_cache = self.s.prefix_cache(entry)
        if not row.prefix_cache:
            # An engine that keeps no prefix cache (vision): reserving memory
            # for one would only crowd other models out.
            prefix_cache = PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False)
        kv = 0  # estimated_memory_gb stands in for what cannot be computed
        if broken is None and row.encodes:
            kv = encoder_activation_bytes(config, entry.batch_tokens or ModelSpec.batch_tokens)
        elif broken is None and not row.audio:
            try:
                kv = kv_cache_bytes(config, max_context, entry.max_concurrency, entry.kv_bits)
            except ConfigError as exc:
                if override is None:
                    broken = exc.detail  # config.json lacks the model's dimensions
        if broken is not None:
            self.problems.append(self.s.doc.error(at_location, broken))
            weights = 0
        if parallel is not None:
            # Ranks on other hosts hold their share of the weights and KV
            # cache there: this budget is charged only the local ranks' part.
            local = sum(1 for h in parallel.hosts if h == LOCAL)
            weights, kv = weights * local // parallel.size, kv * local // parallel.size
        footprint = Footprint(weights=weights, kv_cache=kv, prefix_cache=prefix_cache.max_bytes)

        spec = ModelSpec(
            name=entry.name,
            path=folder,
            source=source,
            kind=kind,
            aliases=tuple(entry.aliases),
            description=entry.description,
            preload=entry.preload,
            pinned=entry.pinned,
            idle_unload_seconds=(
                self.s.manager().default_idle_unload_seconds
                if entry.idle_unload_seconds is None
                else entry.idle_unload_seconds
            ),
            max_context=max_context,
            max_concurrency=self._max_concurrency(entry, row),
            max_queue=entry.max_queue,
            kv_bits=entry.kv_bits,
            defaults=self.s.sampling(i, entry),
            prefix_cache=prefix_cache,
            footprint=footprint,
            memory_override_bytes=override,
            trust_remote_code=entry.trust_remote_code,
            local_image_dir=self.s.image_dir(i, entry),
            allow_remote_images=entry.allow_remote_images,
            tool_parser=entry.tool_parser,
            reasoning_parser=entry.reasoning_parser,
            chat_template_kwargs=template_pairs(entry.chat_template_kwargs),
            broken=broken,
            parallel=parallel,
            speculative=entry_spec(self.s.doc, i, entry, kind, config),
            instruction=entry.instruction,
            **{key: getattr(entry, key) for key in ENCODER_KEYS if getattr(entry, key) is not None},
        )
        self._check_fits(here, spec, row)
        return spec

    def _parallel(self, i: int, entry: ModelEntry, kind: str) -> ParallelSpec:
        """``parallel:`` checked where it can be without the model's files:
        a text model, every rank placeable."""
        assert entry.parallel is not None
        at: Loc = ("models", i, "parallel")
        if kind != "text":
            raise self.s.doc.error(at, f"`parallel` splits text models; `{entry.name}` is {a_model_of(kind)}")
        if entry.speculative is not None:
            raise self.s.doc.error(("models", i, "speculative"),
                                   "speculative decoding does not run on a parallel model's ranks yet")
        from mlxd.registry.device import current_device

        backends = self.s.parsed.backends
        named = {h for h in hosts_of(entry.parallel) if h in backends}
        remotes = tuple((h, backends[h].url.rstrip("/"), backends[h].api_key_env) for h in sorted(named))
        spec = parallel_spec(entry.parallel, current_device().kind, remotes)
        problem = placement_problem(spec, {name: b.kind for name, b in backends.items()})
        if problem is not None:
            where, why = problem
            if where == "transport":
                key: Loc = (*at, "transport")
            else:
                key = (*at, "ranks", where) if isinstance(entry.parallel.ranks, list) else (*at, "ranks")
            raise self.s.doc.error(key, why)
        return spec

    def _max_context(self, i: int, entry: ModelEntry, config: Mapping[str, Any]) -> int:
        trained = max_position_embeddings(config)
        if entry.max_context is None:
            return min(DEFAULT_MAX_CONTEXT, trained) if trained else DEFAULT_MAX_CONTEXT
        if trained and entry.max_context > trained:
            logger.warning(
                "%s:%d: models[%d].max_context %d is beyond the %d positions `%s` was trained "
                "for; output past that point may degrade",
                self.s.doc.label,
                self.s.doc.line_of(("models", i, "max_context")),
                i,
                entry.max_context,
                trained,
                entry.name,
            )
        return entry.max_context

    def _check_instruction(self, i: int, entry: ModelEntry, kind: str, config: Mapping[str, Any] | None) -> None:
        """Only an LLM reranker reads an instruction; ``config`` is None when
        the model's files cannot be read (the entry is broken anyway)."""
        at: Loc = ("models", i, "instruction")
        if kind != "rerank":
            raise self.s.doc.error(at, f"`instruction` is for `kind: rerank` entries served by an LLM reranker; "
                                   f"`{entry.name}` is of kind `{kind}`")
        if config is not None and not is_llm_reranker(config):
            arch = ", ".join(map(str, config.get("architectures") or ())) or "no architectures"
            raise self.s.doc.error(at, f"`{entry.name}` is a cross-encoder ({arch}): it reads the query and "
                                   "the document only; `instruction` is for LLM rerankers (a *ForCausalLM "
                                   "folder, Qwen3-Reranker)")

    @staticmethod
    def _max_concurrency(entry: ModelEntry, row: ModelKind) -> int:
        """An encoder's requests hold their lease only while their inputs are
        batched with everyone else's, so many may hold one at once."""
        if row.encodes and "max_concurrency" not in entry.model_fields_set:
            return ENCODER_CONCURRENCY
        return entry.max_concurrency

    def draft_bytes(self, target: ModelSpec, draft: ModelSpec) -> int:
        """A draft model's weights and its KV cache at the target's context
        and concurrency (it holds the same sequences)."""
        try:
            kv = kv_cache_bytes(read_model_config(draft.path), target.max_context, target.max_concurrency)
        except ConfigError:
            kv = draft.footprint.kv_cache
        return draft.footprint.weights + kv

    def check_fits(self, here: Loc, spec: ModelSpec) -> None:
        self._check_fits(here, spec, self.s.kinds[spec.kind])

    def _check_fits(self, here: Loc, spec: ModelSpec, row: ModelKind) -> None:
        budget = self.s.manager().memory_budget_bytes
        if spec.charge_bytes <= budget:
            return
        needs, has = format_bytes(spec.charge_bytes), format_bytes(budget)
        if needs == has:  # rounding hid the difference
            needs, has = f"{spec.charge_bytes:,} bytes", f"{budget:,} bytes"
        if spec.memory_override_bytes is not None:
            why = "estimated_memory_gb"
        else:
            lower = ("lower batch_tokens" if row.encodes else "lower max_context, max_concurrency or "
                     "prefix_cache.max_bytes, or set kv_bits" if row.generates else "raise manager.memory_budget")
            why = f"{spec.footprint.parts(row)}; {lower}"
        raise self.s.doc.error(here, f"`{spec.name}` needs {needs} but the budget is {has} ({why})")

    def _note_ignored_keys(self, i: int, entry: ModelEntry) -> None:
        for key in VLLM_MLX_IGNORED_MODEL_KEYS:
            if key in entry.model_fields_set:
                logger.info(
                    "%s:%d: models[%d].%s is a vllm-mlx setting mlxd does not use; ignored",
                    self.s.doc.label,
                    self.s.doc.line_of(("models", i, key)),
                    i,
                    key,
                )
