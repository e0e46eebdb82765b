"""The validated, resolved registry that the rest of the daemon runs on.

``mlxd.registry.loader`` turns a ``models.yaml`` into these frozen objects;
nothing downstream ever sees raw YAML. Equality of two ``ModelSpec`` values is
what hot reload uses to decide whether a model changed.
"""

from __future__ import annotations

import fnmatch

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlxd.errors import ConfigError

CONTENTION_STRATEGIES = ("fail", "wait", "wait_then_fail", "preempt", "wait_then_preempt")


@dataclass(frozen=True)
class SamplingDefaults:
    """Per-model defaults; a request's explicit value (0 included) always wins."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class PrefixCacheSpec:
    max_bytes: int
    disk_max_bytes: int
    persist: bool = True


@dataclass(frozen=True)
class Footprint:
    """What a resident model costs, in bytes, as estimated before loading."""

    weights: int
    kv_cache: int
    prefix_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.prefix_cache


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path
    # As written in the file: a local path or a Hugging Face repo id.
    source: str
    kind: str = "text"  # "text" (mlx-lm) or "vision" (mlx-vlm)
    aliases: tuple[str, ...] = ()
    description: str = ""
    preload: bool = False
    pinned: bool = False
    # Resolved against the manager default; 0 means never.
    idle_unload_seconds: float = 0.0
    max_context: int = 4096
    max_concurrency: int = 1
    max_queue: int = 64
    kv_bits: int | None = None
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    prefix_cache: PrefixCacheSpec = field(
        default_factory=lambda: PrefixCacheSpec(max_bytes=256 << 20, disk_max_bytes=1 << 30)
    )
    footprint: Footprint = field(default_factory=lambda: Footprint(0, 0, 0))
    # vllm-mlx's ``estimated_memory_gb``: when set it replaces the computed footprint.
    memory_override_bytes: int | None = None
    trust_remote_code: bool = False
    # Vision inputs: local files only under this folder; remote URLs only if allowed.
    local_image_dir: Path | None = None
    allow_remote_images: bool = False
    # The registry's ``tool_parser:`` (None: guess from the chat template).
    tool_parser: str | None = None
    # Why the model's files on disk cannot be used (missing folder, corrupt
    # weights, bad config.json). Such a model stays registered but failed, so
    # one bad download never keeps the other models from serving.
    broken: str | None = None

    @property
    def charge_bytes(self) -> int:
        """Bytes the residency manager reserves for this model before it loads."""
        if self.memory_override_bytes is not None:
            return self.memory_override_bytes
        return self.footprint.total

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    # Fields that change what is in memory: a change to any of these needs the
    # engine reloaded. Everything else applies live (see registry.diff).
    RELOAD_FIELDS = (
        "path",
        "source",
        "kind",
        "max_context",
        "max_concurrency",
        "kv_bits",
        "trust_remote_code",
        "prefix_cache",
        # The engine resolves the tool-call format when it loads.
        "tool_parser",
        "broken",
    )

    def needs_reload_from(self, old: ModelSpec) -> bool:
        return any(getattr(self, f) != getattr(old, f) for f in self.RELOAD_FIELDS)

    def changed_fields(self, old: ModelSpec) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(old, f.name)]


@dataclass(frozen=True)
class ContentionSpec:
    strategy: str = "wait_then_fail"
    wait_timeout_s: float = 30.0
    preempt_after_s: float = 0.0


@dataclass(frozen=True)
class ManagerSpec:
    memory_budget_bytes: int
    default_idle_unload_seconds: float = 900.0
    contention: ContentionSpec = field(default_factory=ContentionSpec)
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "mlxd")
    # How long a waiting request may be passed over while another model keeps
    # being served, before the scheduler stops admitting the resident one.
    max_pass_over_s: float = 30.0
    # First retry delay after a failed load; doubles up to the cap.
    load_retry_backoff_s: float = 5.0
    load_retry_backoff_max_s: float = 300.0


@dataclass(frozen=True)
class ServerSpec:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    default_max_tokens: int = 512
    max_request_tokens: int = 32768
    request_timeout_s: float = 300.0
    shutdown_grace_seconds: float = 30.0
    # Request-path bounds (docs/configuration.md, "Security and limits").
    max_body_bytes: int = 32 << 20
    max_prompts: int = 32
    # Host names (beyond loopback names and IP literals) and browser origins
    # (beyond the daemon's own) that may reach the API.
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_connections: int = 256
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # Decoded image pixels held at once, across every request.
    max_image_memory_bytes: int = 1 << 30


def is_pattern(alias: str) -> bool:
    return any(c in alias for c in "*?[")


@dataclass(frozen=True)
class Registry:
    source_path: Path | None
    file_hash: str
    manager: ManagerSpec
    server: ServerSpec
    models: tuple[ModelSpec, ...]
    # The broken models' problems, located (file, line, key): ``mlxd check``
    # reports them as errors, the daemon logs them and serves the rest.
    problems: tuple[ConfigError, ...] = field(default=(), compare=False)

    def lookup(self, name: str) -> ModelSpec | None:
        """Exact names and aliases first; then aliases that are glob
        patterns (``claude-*``), in file order, first match wins, so one
        local model can answer every name an agent asks for."""
        for spec in self.models:
            if name in spec.names():
                return spec
        for spec in self.models:
            if any(is_pattern(a) and fnmatch.fnmatchcase(name, a) for a in spec.aliases):
                return spec
        return None

    def model_names(self) -> list[str]:
        """Every name a client may use: model names and aliases."""
        return [n for spec in self.models for n in spec.names()]
