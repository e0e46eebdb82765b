"""The settings several entries of ``models.yaml`` read: the ``manager`` and
``server`` sections, and the per-entry settings that fall back on them or on
the file's folder (sampling defaults, prefix cache, image folder, paths)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxd.registry.document import Document, Loc
from mlxd.registry.kinds import ModelKind, a_model_of
from mlxd.registry.model import (
    ContentionSpec,
    ManagerSpec,
    ModelSpec,
    PrefixCacheSpec,
    SamplingDefaults,
    ServerSpec,
)
from mlxd.registry.schema import ENCODER_KEYS, GENERATION_KEYS, ManagerSection, ModelEntry, RegistryFile
from mlxd.registry.sizing import parse_memory_budget

DEFAULT_MEMORY_BUDGET = "70%"
# Defaults come from the contract dataclasses so the two can never disagree.
DEFAULT_MODEL = ModelSpec(name="", path=Path(), source="")
_DEFAULT_MANAGER = ManagerSpec(memory_budget_bytes=1)


class Sections:
    """The validated file with its shared sections built once, on first use."""

    def __init__(
        self, doc: Document, parsed: RegistryFile, base_dir: Path, physical_memory: int,
        kinds: Mapping[str, ModelKind],
    ) -> None:
        self.doc = doc
        self.kinds = kinds
        self.parsed = parsed
        self.base_dir = base_dir
        self.physical_memory = physical_memory
        self._manager: ManagerSpec | None = None
        self._server: ServerSpec | None = None

    def manager(self) -> ManagerSpec:
        if self._manager is None:
            self._manager = self._build_manager(self.parsed.manager)
        return self._manager

    def server(self) -> ServerSpec:
        if self._server is None:
            s = self.parsed.server
            if s.default_max_tokens > s.max_request_tokens:
                raise self.doc.error(
                    ("server", "default_max_tokens"),
                    f"{s.default_max_tokens} is above server.max_request_tokens "
                    f"({s.max_request_tokens})",
                )
            self._server = ServerSpec(
                host=s.host,
                port=s.port,
                api_keys=tuple(s.api_keys),
                read_only_keys=tuple(s.read_only_keys),
                default_max_tokens=s.default_max_tokens,
                max_request_tokens=s.max_request_tokens,
                request_timeout_s=s.request_timeout_s,
                shutdown_grace_seconds=s.shutdown_grace_seconds,
                max_body_bytes=s.max_body_bytes,
                max_prompts=s.max_prompts,
                allowed_hosts=tuple(s.allowed_hosts),
                allowed_origins=tuple(s.allowed_origins),
                max_connections=s.max_connections,
                header_timeout_s=s.header_timeout_s,
                body_timeout_s=s.body_timeout_s,
                send_timeout_s=s.send_timeout_s,
                max_image_memory_bytes=s.max_image_memory,
                max_audio_bytes=s.max_audio_bytes,
                max_audio_seconds=s.max_audio_seconds,
                max_audio_memory_bytes=s.max_audio_memory,
                max_speech_chars=s.max_speech_chars,
            )
        return self._server

    def _build_manager(self, m: ManagerSection) -> ManagerSpec:
        both = self._either(("manager",), m, "memory_budget", "memory_budget_gb")
        budget = (
            both
            if both is not None
            else parse_memory_budget(DEFAULT_MEMORY_BUDGET, self.physical_memory)
        )
        idle = self._either(("manager",), m, "default_idle_unload_seconds", "idle_unload_seconds")
        if idle is None:
            idle = _DEFAULT_MANAGER.default_idle_unload_seconds
        policy = m.contention_policy
        defaults = ContentionSpec()
        contention = ContentionSpec(
            strategy=policy.strategy,
            wait_timeout_s=defaults.wait_timeout_s
            if policy.wait_timeout_s is None
            else policy.wait_timeout_s,
            preempt_after_s=defaults.preempt_after_s
            if policy.preempt_after_s is None
            else policy.preempt_after_s,
        )
        if (
            contention.strategy == "wait_then_preempt"
            and contention.preempt_after_s > contention.wait_timeout_s
        ):
            raise self.doc.error(
                ("manager", "contention_policy", "preempt_after_s"),
                f"{contention.preempt_after_s:g} s is after wait_timeout_s "
                f"({contention.wait_timeout_s:g} s), so preemption would never start",
            )
        if m.load_retry_backoff_s > m.load_retry_backoff_max_s:
            raise self.doc.error(
                ("manager", "load_retry_backoff_s"),
                f"{m.load_retry_backoff_s:g} s is above load_retry_backoff_max_s "
                f"({m.load_retry_backoff_max_s:g} s)",
            )
        return ManagerSpec(
            memory_budget_bytes=budget,
            default_idle_unload_seconds=max(0.0, idle),
            contention=contention,
            cache_dir=self.local_path(m.cache_dir),
            max_pass_over_s=m.max_pass_over_s,
            load_retry_backoff_s=m.load_retry_backoff_s,
            load_retry_backoff_max_s=m.load_retry_backoff_max_s,
        )

    def _either(self, loc: Loc, section: Any, ours: str, theirs: str) -> Any:
        """One value set under two spellings (ours and vllm-mlx's): both is an error."""
        a, b = getattr(section, ours), getattr(section, theirs)
        if a is not None and b is not None:
            raise self.doc.error((*loc, theirs), f"set either `{ours}` or `{theirs}`, not both")
        return a if a is not None else b

    def local_path(self, raw: str) -> Path:
        p = Path(raw).expanduser()
        return p if p.is_absolute() else self.base_dir / p

    def prefix_cache(self, entry: ModelEntry) -> PrefixCacheSpec:
        fields: dict[str, Any] = {}
        for name in ("max_bytes", "disk_max_bytes", "persist", "next_turn"):
            for section in (entry.prefix_cache, self.parsed.manager.prefix_cache):
                value = getattr(section, name)
                if value is not None:
                    fields[name] = value
                    break
            else:
                fields[name] = getattr(DEFAULT_MODEL.prefix_cache, name)
        return PrefixCacheSpec(**fields)

    def sampling(self, i: int, entry: ModelEntry) -> SamplingDefaults:
        d = entry.defaults
        limit = self.server().max_request_tokens
        if d.max_tokens is not None and d.max_tokens > limit:
            raise self.doc.error(
                ("models", i, "defaults", "max_tokens"),
                f"{d.max_tokens} is above server.max_request_tokens ({limit})",
            )
        return SamplingDefaults(**d.model_dump())

    def image_dir(self, i: int, entry: ModelEntry) -> Path | None:
        if entry.local_image_dir is None:
            return None
        folder = self.local_path(entry.local_image_dir)
        if not folder.is_dir():
            raise self.doc.error(
                ("models", i, "local_image_dir"), f"folder {folder} does not exist"
            )
        return folder.resolve()

    def check_kind_keys(self, i: int, entry: ModelEntry, row: ModelKind) -> None:
        """A key the entry's kind does not read is an error at its line:
        accepted, it would do nothing while `mlxd check` showed it."""
        for keys, reads, who in (
            (ENCODER_KEYS, row.encodes, "`kind: embedding` and `kind: rerank` entries"),
            # (Reached by encoders only: the row above refuses it elsewhere.)
            (("matryoshka",), row.name == "embedding", "`kind: embedding` entries"),
            (GENERATION_KEYS, row.generates, "models that generate text (`kind: text` or `vision`)"),
        ):
            for key in keys:
                if not reads and _set(entry, key):
                    raise self.doc.error(("models", i, key),
                                         f"`{key}` is for {who}; `{entry.name}` is {a_model_of(row.name)}")


def _set(entry: ModelEntry, key: str) -> bool:
    """``key`` is written with a value other than its default (``null``,
    ``defaults: {}`` or ``allow_remote_images: false`` say nothing)."""
    return key in entry.model_fields_set and getattr(entry, key) != ModelEntry.model_fields[key].default
