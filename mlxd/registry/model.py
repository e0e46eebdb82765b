"""The validated, resolved registry that the rest of the daemon runs on.

``mlxd.registry.loader`` turns a ``models.yaml`` into these frozen objects;
nothing downstream ever sees raw YAML. Equality of two ``ModelSpec`` values is
what hot reload uses to decide whether a model changed.
"""

from __future__ import annotations

import fnmatch

from dataclasses import dataclass, field, fields
from pathlib import Path
import json
from typing import TYPE_CHECKING, Any

from mlxd.registry.kinds import KINDS, PARALLEL, REMOTE, ModelKind
from mlxd.registry.sizing import format_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mlxd.errors import ConfigError

# Qwen3-Reranker's default task, which its model card's prompt gives an
# LLM reranker when the entry names no ``instruction:``.
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

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
    # A reasoning budget for requests that set none (docs/thinking.md).
    reasoning_budget: int | None = None


@dataclass(frozen=True)
class PrefixCacheSpec:
    max_bytes: int
    disk_max_bytes: int
    persist: bool = True
    # Between-turn prefill (mlxd.engine.next_turn): "auto", True or False.
    next_turn: bool | str = "auto"

    @property
    def saves(self) -> bool:
        """Whether the cache is saved to disk and restored: it persists and both bounds leave room."""
        return self.persist and self.max_bytes > 0 and self.disk_max_bytes > 0


@dataclass(frozen=True)
class Footprint:
    """What a resident model costs, in bytes, as estimated before loading."""

    weights: int
    kv_cache: int
    prefix_cache: int
    # A draft model loaded with it (``speculative: {method: draft}``): its
    # weights and its KV cache at this model's context and concurrency.
    draft: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.prefix_cache + self.draft

    def parts(self, row: ModelKind) -> str:
        """The sum in words, each part named as ``row``'s kind holds it: an
        encoder's second part is one forward pass's activations, an audio
        model has none, and only a kind that keeps a prefix cache shows one."""
        named = [("weights", self.weights)]
        if row.encodes:
            named.append(("activations", self.kv_cache))
        elif not row.audio:
            named.append(("KV cache", self.kv_cache))
        if row.prefix_cache:
            named.append(("prefix cache", self.prefix_cache))
        if self.draft:
            named.append(("draft model", self.draft))
        return " + ".join(f"{what} {format_bytes(n)}" for what, n in named)


@dataclass(frozen=True)
class SpeculativeSpec:
    """``speculative:`` resolved: the method, K drafted tokens a step and,
    for ``draft``, the draft model's name and folder."""

    method: str
    tokens: int = 4
    draft_model: str | None = None
    draft_path: Path | None = None
    # ``draft``: the draft's weights over the target's (a decode step's cost
    # is mostly reading them), None where unknown.
    draft_ratio: float | None = None
    # False: every step speculates, whatever the governor measures.
    auto_off: bool = True

    def best_speedup(self) -> float | None:
        """The most a step can gain over plain decoding: every draft kept
        (K + 1 tokens) for one verify pass, costing at least one plain step,
        and K draft steps, each ``draft_ratio`` of one (None: not known, or
        no draft model to pay for)."""
        if self.method != "draft" or self.draft_ratio is None:
            return None
        return (self.tokens + 1) / (1 + self.tokens * self.draft_ratio)

    @property
    def cannot_pay(self) -> str | None:
        """Why this draft can never pay for its steps (a draft about the
        target's size: at best under 1.05x), so that speculation is off from
        the start, the draft not even loaded; None where it may pay, or with
        ``auto_off: false``, which speculates regardless."""
        best = self.best_speedup()
        if not self.auto_off or best is None or best >= 1.05:
            return None
        return (f"the draft weighs {self.draft_ratio:.2f} of this model, so even with every draft kept a step "
                f"gains at most {best:.2f}x; a draft a fraction of its size pays (`auto_off: false` speculates "
                "anyway, to measure)")


@dataclass(frozen=True)
class ParallelSpec:
    """A model served by a gang of ranks: how it is split, on which hosts
    (one per rank, ``local`` or a backend's name), over which transport
    (resolved from ``any`` for this device), and the liveness deadlines."""

    mode: str
    hosts: tuple[str, ...]
    transport: str
    load_timeout_s: float = 120.0
    prefill_timeout_s: float = 60.0
    step_timeout_s: float = 10.0
    # The hosts of ranks on other machines: (backend name, its /v1 root, the
    # variable holding its key), each an mlxd that starts its rank itself.
    remotes: tuple[tuple[str, str, str | None], ...] = ()
    # jaccl: the RDMA device joining rank i's host to rank j's (None on the diagonal).
    rdma_devices: tuple[tuple[str | None, ...], ...] | None = None

    @property
    def size(self) -> int:
        return len(self.hosts)

    def as_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "mode": self.mode, "ranks": list(self.hosts), "transport": self.transport,
            "load_timeout_s": self.load_timeout_s, "prefill_timeout_s": self.prefill_timeout_s,
            "step_timeout_s": self.step_timeout_s}
        if self.rdma_devices is not None:
            shown["rdma_devices"] = [list(row) for row in self.rdma_devices]
        return shown


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path
    # As written in the file: a local path or a Hugging Face repo id.
    source: str
    kind: str = "text"  # a row of the kinds table (mlxd.registry.kinds): "text", "vision", ...
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
    # Remote entries: the backend (a name in ``Registry.backends``) serving
    # the model and its name there. None for local models.
    backend: str | None = None
    remote_model: str | None = None
    # Made for a failover target written ``backend:model`` rather than
    # declared as an entry: it queues and leases like one, but clients
    # cannot ask for it by that name (only through the failover entry).
    implicit: bool = False
    # Where it draws its capacity from: None, its own max_concurrency;
    # else every model of the group shares one max_concurrency (the models
    # on one backend: ``backend:<name>``).
    capacity_group: str | None = None
    # Whether it takes memory here: one that does not is never charged to
    # the budget nor evicted to free memory (a remote entry).
    holds_memory: bool = True
    # The registry's ``tool_parser:`` (None: guess from the chat template).
    tool_parser: str | None = None
    # The registry's ``reasoning_parser:`` (None: mlx-lm's detection).
    reasoning_parser: str | None = None
    # The registry's ``chat_template_kwargs:``, as (name, JSON text) pairs
    # (the spec is frozen and hashable); requests' own go over them.
    chat_template_kwargs: tuple[tuple[str, str], ...] = ()
    # Why the model's files on disk cannot be used (missing folder, corrupt
    # weights, bad config.json). Such a model stays registered but failed, so
    # one bad download never keeps the other models from serving.
    broken: str | None = None
    # Embedding and rerank entries: an input past the model's length is cut
    # (true) or refused with a 400 (false); ``dimensions`` may shorten the
    # vectors only of a model trained for it (Matryoshka); a forward pass
    # holds at most ``batch_tokens`` padded tokens.
    truncate: bool = True
    matryoshka: bool = False
    batch_tokens: int = 4096
    # An LLM reranker's instruction (None: RERANK_INSTRUCTION, the model
    # card's); read per request, so a change applies live.
    instruction: str | None = None
    # Served by a gang of ranks (``parallel:``); None: one process, the daemon's.
    parallel: ParallelSpec | None = None
    # Speculative decoding (None: off).
    speculative: SpeculativeSpec | None = None

    def __post_init__(self) -> None:
        if self.backend is not None:
            # A backend's entries share its max_concurrency and hold no memory
            # here; the residency core reads only these two, never the backend.
            if self.capacity_group is None:
                object.__setattr__(self, "capacity_group", f"backend:{self.backend}")
            object.__setattr__(self, "holds_memory", False)

    def template_defaults(self) -> dict[str, Any]:
        """The registry's ``chat_template_kwargs:`` as a fresh dict."""
        return {name: json.loads(text) for name, text in self.chat_template_kwargs}

    @property
    def is_remote(self) -> bool:
        return self.backend is not None

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
        # A remote entry moved to another backend or model: requests in
        # flight finish where they started (the old engine drains).
        "backend",
        "remote_model",
        # The engine resolves the tool-call and reasoning formats when it loads.
        "tool_parser",
        "reasoning_parser",
        "broken",
        # The engine's batching queue is built with it.
        "batch_tokens",
        # Another split, rank list or transport is another gang.
        "parallel",
        # The drafter (and a draft model's weights) load with the engine.
        "speculative",
    )

    def needs_reload_from(self, old: ModelSpec) -> bool:
        return any(getattr(self, f) != getattr(old, f) for f in self.RELOAD_FIELDS)

    def changed_fields(self, old: ModelSpec) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(old, f.name)]


def template_pairs(kwargs: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """``chat_template_kwargs:`` as ModelSpec keeps them."""
    return tuple((name, json.dumps(value)) for name, value in (kwargs or {}).items())


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
    # Not admin: they generate and read, and change nothing.
    read_only_keys: tuple[str, ...] = ()
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
    # A client that takes none of its answer for this long is cut off.
    send_timeout_s: float = 30.0
    # Decoded image pixels held at once, across every request.
    max_image_memory_bytes: int = 1 << 30
    # Speech routes: upload size, decoded seconds and sample bytes, TTS text length.
    max_audio_bytes: int = 25 << 20
    max_audio_seconds: float = 1800.0
    max_audio_memory_bytes: int = 512 << 20
    max_speech_chars: int = 4096


@dataclass(frozen=True)
class AppSpec:
    """An application (``apps:``): its key as a sha256 (None: ``key: none``,
    keyless loopback requests), what it may use and how it is limited."""

    name: str
    key_sha256: str | None
    models: tuple[str, ...] = ("*",)
    routes: tuple[str, ...] = ("generation", "embeddings", "audio")
    admin: bool = False
    priority: str = "default"
    max_concurrency: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    tokens_per_day: int | None = None
    # The file its key is read from (``key_file``), which the reload watcher
    # watches: a key rotated there applies as an edit of the registry does.
    key_file: Path | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        # Never the hash in a log line either: it names the key.
        return f"AppSpec(name={self.name!r}, admin={self.admin}, priority={self.priority!r})"


def is_pattern(alias: str) -> bool:
    return any(c in alias for c in "*?[")


@dataclass(frozen=True)
class BackendSpec:
    """An existing server that serves some registry names (another mlxd,
    vLLM, SGLang, mlx_lm.server: anything OpenAI-compatible)."""

    name: str
    # Ends in /v1 (the OpenAI root), no trailing slash.
    url: str
    kind: str = "openai"  # "openai" | "mlxd" (mlxd adds /v1/status)
    # The environment variable holding the bearer key; never the key itself.
    api_key_env: str | None = None
    max_concurrency: int = 8
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 600.0
    idle_timeout_s: float = 120.0
    poll_interval_s: float = 10.0


FAILOVER_STRATEGIES = ("warm", "spillover")


@dataclass(frozen=True)
class FailoverSpec:
    """A name served by one of several targets (local models, remote
    entries, models on a backend), tried in an order ``strategy`` picks per
    request: "warm" prefers a target that has the model loaded already,
    "spillover" the first that is not at capacity (mlxd.failover.choice)."""

    name: str
    # The targets' ModelSpec names, in the file's order.
    targets: tuple[str, ...]
    strategy: str = "warm"
    aliases: tuple[str, ...] = ()
    description: str = ""
    # Over each target's own defaults; a request's values over both.
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    local_image_dir: Path | None = None
    allow_remote_images: bool = False

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def _matches(names: tuple[str, ...], name: str) -> bool:
    return any(is_pattern(a) and fnmatch.fnmatchcase(name, a) for a in names[1:])


@dataclass(frozen=True)
class Registry:
    source_path: Path | None
    file_hash: str
    manager: ManagerSpec
    server: ServerSpec
    models: tuple[ModelSpec, ...]
    backends: tuple[BackendSpec, ...] = ()
    failovers: tuple[FailoverSpec, ...] = ()
    # None: no ``apps:`` (flat server keys only); () would be an app list
    # with no app, which asks every request for a key no one has.
    apps: tuple[AppSpec, ...] | None = None
    # The broken models' problems, located (file, line, key): ``mlxd check``
    # reports them as errors, the daemon logs them and serves the rest.
    problems: tuple[ConfigError, ...] = field(default=(), compare=False)
    # The kinds table the file was read with (its ``kind:`` values are rows).
    kinds: Mapping[str, ModelKind] = field(default_factory=lambda: KINDS, compare=False)

    def kind_of(self, spec: ModelSpec) -> ModelKind:
        """What ``spec`` is served as: its kind's row, or the remote row for
        a model served by a backend."""
        if spec.is_remote:
            return REMOTE
        return PARALLEL if spec.parallel is not None else self.kinds[spec.kind]

    def backend(self, name: str) -> BackendSpec | None:
        return next((b for b in self.backends if b.name == name), None)

    def entries(self) -> tuple[ModelSpec | FailoverSpec, ...]:
        """What clients can name: models (not the implicit failover
        targets) and failover entries."""
        return (*(m for m in self.models if not m.implicit), *self.failovers)

    def find(self, name: str) -> ModelSpec | FailoverSpec | None:
        """Exact names and aliases first; then aliases that are glob
        patterns (``claude-*``), models before failover entries, each in
        file order, first match wins, so one entry can answer every name an
        agent asks for."""
        entries = self.entries()
        return next((e for e in entries if name in e.names()), None) or next(
            (e for e in entries if _matches(e.names(), name)), None
        )

    def lookup(self, name: str) -> ModelSpec | None:
        """The model ``name`` resolves to (None for a failover entry)."""
        found = self.find(name)
        return found if isinstance(found, ModelSpec) else None

    def failover(self, name: str) -> FailoverSpec | None:
        return next((f for f in self.failovers if f.name == name), None)

    def model_names(self) -> list[str]:
        """Every name a client may use: entry names and aliases."""
        return [n for entry in self.entries() for n in entry.names()]
