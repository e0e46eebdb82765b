"""The strict schema of ``models.yaml``: every key, its type and range.

Unknown keys are errors. Sizes are parsed here (so a bad size is reported at
its own key); checks that span keys or touch the disk (duplicate names, model
folders, the budget) live in :mod:`mlxd.registry.loader`, which knows where
each key sits in the file.

vllm-mlx registry files are accepted unchanged: its keys are declared below,
either mapped onto ours or listed in ``VLLM_MLX_IGNORED_MODEL_KEYS``.
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mlxd.registry.sizing import KV_BITS_CHOICES, parse_bytes, parse_gb, parse_memory_budget

# Validation context key: the device's memory in bytes, for "70%" budgets.
PHYSICAL_MEMORY = "physical_memory"
# The validation context's kinds table (mlxd.registry.kinds.KINDS unless given).
KINDS_TABLE = "kinds"


def physical_memory_bytes() -> int:
    """What a percentage budget is a share of: the memory MLX's device has
    (GPU memory, Metal's working set, or RAM; see mlxd.registry.device)."""
    from mlxd.registry.device import current_device

    return current_device().memory_bytes


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _next_turn(value: Any) -> Any:
    # One message for every wrong value (a plain union would report one per member).
    if value is None or value is True or value is False or value == "auto":
        return value
    raise ValueError(f"next_turn is auto, true or false, not {value!r}")


def _a_number(value: Any) -> Any:
    # YAML reads true/false/yes/no/on/off as booleans, and pydantic's lax
    # mode would take them as 1 and 0 (`tokens: true` as one drafted token).
    # Other lax inputs stay: a quoted "10" or 4.0 is the number written.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()} "
                         "(YAML reads true/false/yes/no/on/off as a boolean)")
    return value


def _filled(value: Any) -> Any:
    # An empty path is not "none": relative to the registry's folder it
    # would name that folder (images, caches or a model read from there).
    if isinstance(value, str) and not value.strip():
        raise ValueError("cannot be empty: an empty path names the registry's own folder; write `.` if that is meant")
    return value


# Every number key the file acts on is one of these two (sizes refuse
# booleans in parse_bytes; the vllm-mlx keys mlxd ignores keep lax types).
Int = Annotated[int, BeforeValidator(_a_number)]
Float = Annotated[float, BeforeValidator(_a_number)]
ByteSize = Annotated[int, BeforeValidator(parse_bytes)]
NextTurn = Annotated[bool | Literal["auto"], BeforeValidator(_next_turn)]
NonNegativeFloat = Annotated[Float, Field(ge=0)]
PositiveFloat = Annotated[Float, Field(gt=0)]
Names = Annotated[list[str], BeforeValidator(_one_or_many)]
PathText = Annotated[str, BeforeValidator(_filled)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        # `null` for an optional key means its default (docs/registry.md),
        # and a key left with no value (`aliases:`) is null in YAML. A
        # required key or an unknown one keeps its null to be reported.
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].is_required()}


class ServerSection(_Section):
    host: str = "127.0.0.1"
    port: Int = Field(8080, ge=0, le=65535)
    api_keys: Names = []
    # Keys that may generate and read status but change nothing (no load,
    # unload, reload, cancel of others' requests, cache clearing).
    read_only_keys: Names = []
    default_max_tokens: Int = Field(512, ge=1)
    max_request_tokens: Int = Field(32768, ge=1)
    request_timeout_s: PositiveFloat = 300.0
    # Under a day: launchd and systemd are told to wait this long (plus a margin) before a kill.
    shutdown_grace_seconds: Float = Field(30.0, ge=0, lt=86400)
    max_body_bytes: ByteSize = Field(32 << 20, ge=1024)
    max_prompts: Int = Field(32, ge=1)
    allowed_hosts: Names = []
    allowed_origins: Names = []
    max_connections: Int = Field(256, ge=1)
    header_timeout_s: PositiveFloat = 10.0
    body_timeout_s: PositiveFloat = 30.0
    send_timeout_s: PositiveFloat = 30.0
    max_image_memory: ByteSize = Field(1 << 30, ge=1 << 20)
    # Speech routes (docs/audio.md): an upload's size, its decoded length and
    # sample memory (checked from its header, before any decoding or lease),
    # and the longest text /v1/audio/speech reads.
    max_audio_bytes: ByteSize = Field(25 << 20, ge=1024)
    max_audio_seconds: PositiveFloat = 1800.0
    max_audio_memory: ByteSize = Field(512 << 20, ge=1 << 20)
    max_speech_chars: Int = Field(4096, ge=1)

    @field_validator("host")
    @classmethod
    def _a_host(cls, value: str) -> str:
        # The empty host is the wildcard to getaddrinfo and asyncio: every
        # interface, where the default is loopback only.
        if not value.strip():
            raise ValueError("an empty host would listen on every interface; write 0.0.0.0 for that, "
                             "or leave `host` out for 127.0.0.1")
        return value

    @field_validator("api_keys", "read_only_keys")
    @classmethod
    def _real_keys(cls, keys: list[str]) -> list[str]:
        # An empty key would match an empty bearer token: refuse it rather
        # than guess whether the file meant "no keys".
        for key in keys:
            if not key.strip():
                raise ValueError("an API key must not be empty")
            if key != key.strip() or any(ch.isspace() for ch in key):
                raise ValueError("an API key must not contain whitespace")
        return keys


# The same names as model.CONTENTION_STRATEGIES (a test keeps them in step).
ContentionStrategy = Literal["fail", "wait", "wait_then_fail", "preempt", "wait_then_preempt"]


class ContentionSection(_Section):
    strategy: ContentionStrategy = "wait_then_fail"
    # None takes the default; vllm-mlx files write null. 0 or less waits
    # without limit, as in vllm-mlx.
    wait_timeout_s: Float | None = None
    preempt_after_s: NonNegativeFloat | None = None

    @field_validator("wait_timeout_s")
    @classmethod
    def _unbounded_when_not_positive(cls, value: float | None) -> float | None:
        if value is not None and (math.isnan(value) or value <= 0):
            return math.inf
        return value


class PrefixCacheSection(_Section):
    """Every field optional: a model's section overrides the manager's field by field."""

    max_bytes: ByteSize | None = None
    disk_max_bytes: ByteSize | None = None
    persist: bool | None = None
    # Prefill the next turn's known part between turns (docs/prefix-cache.md):
    # auto (when the template moves the prompt), true or false.
    next_turn: NextTurn | None = None


class ManagerSection(_Section):
    memory_budget: int | None = None
    # vllm-mlx spelling: a number of GB, or a string with a gb/mb/b suffix.
    memory_budget_gb: int | None = None
    default_idle_unload_seconds: NonNegativeFloat | None = None
    # vllm-mlx spelling of default_idle_unload_seconds (0 or less: never).
    idle_unload_seconds: Float | None = None
    contention_policy: ContentionSection = ContentionSection()
    cache_dir: PathText = "~/.cache/mlxd"
    max_pass_over_s: NonNegativeFloat = 30.0
    load_retry_backoff_s: PositiveFloat = 5.0
    load_retry_backoff_max_s: PositiveFloat = 300.0
    prefix_cache: PrefixCacheSection = PrefixCacheSection()

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _budget(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        context = info.context or {}
        total = context.get(PHYSICAL_MEMORY) or physical_memory_bytes()
        return parse_memory_budget(value, total)

    @field_validator("memory_budget_gb", mode="before")
    @classmethod
    def _budget_gb(cls, value: Any) -> Any:
        return None if value is None else parse_gb(value)


class SamplingSection(_Section):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: Float | None = Field(None, ge=0, le=2)
    top_p: Float | None = Field(None, gt=0, le=1)
    top_k: Int | None = Field(None, ge=0)
    min_p: Float | None = Field(None, ge=0, le=1)
    repetition_penalty: Float | None = Field(None, gt=0)
    presence_penalty: Float | None = Field(None, ge=-2, le=2)
    frequency_penalty: Float | None = Field(None, ge=-2, le=2)
    max_tokens: Int | None = Field(None, ge=1)
    seed: Int | None = Field(None, ge=0, lt=2**64)
    # Reasoning tokens before the answer, for a request that sets no budget
    # (Codex sends only an effort): docs/thinking.md.
    reasoning_budget: Int | None = Field(None, ge=0)


# vllm-mlx per-model keys mlxd accepts so their files load unchanged, but does
# not act on (its engine options have no counterpart here).
VLLM_MLX_IGNORED_MODEL_KEYS = (
    "continuous_batching",
    "enable_mtp",
    "prefill_step_size",
    "specprefill",
    "specprefill_threshold",
    "specprefill_keep_pct",
    "specprefill_backbone_pct",
    "specprefill_draft_model",
    "prefix_trie_cache",
    "prefix_trie_cache_size",
    "prefix_trie_cache_memory_mb",
    "stream_interval",
    "gpu_memory_utilization",
)

# Keys only embedding and rerank entries take.
ENCODER_KEYS = ("truncate", "matryoshka", "batch_tokens")
# Keys only a model that generates text reads (its KV cache, sampling,
# chat template, parsers, images): on an embedding, rerank or audio entry
# they would be accepted and do nothing while `mlxd check` showed them.
GENERATION_KEYS = (
    "max_context", "kv_bits", "defaults", "prefix_cache", "tool_parser", "reasoning_parser",
    "chat_template_kwargs", "local_image_dir", "allow_remote_images",
)

class SpeculativeSection(_Section):
    """``speculative:`` on a text model: how it drafts tokens that one
    forward pass of the model then verifies, K at a time (docs/speculative.md)."""

    method: Literal["prompt_lookup", "draft", "mtp"]
    # Drafted tokens per step (K): each step verifies K + 1 positions.
    tokens: Int = Field(4, ge=1, le=16)
    # ``method: draft``: the registry model that drafts (same tokenizer).
    draft_model: str | None = Field(None, min_length=1)
    # false: speculate at every step, paying or not (to measure what the
    # mechanism costs); the auto-off is for serving.
    auto_off: bool = True


# Where a model's files are: ``path`` is ours; vllm-mlx also accepts these.
LOCATION_KEYS = ("path", "source", "model")


class ParallelSection(_Section):
    """``parallel:``: one model over a gang of ranks (docs/distributed.md)."""

    mode: Literal["tensor", "pipeline"] = "tensor"
    # A count of local ranks, or one host per rank: ``local`` or a backend's name.
    ranks: int | list[str]
    transport: Literal["ring", "jaccl", "nccl", "any"] = "any"
    # jaccl: the RDMA device that joins each rank's host to each other's
    # (row i, column j; null on the diagonal), as `mlx.distributed_config
    # --backend jaccl` writes them into its hostfile's `rdma` lists.
    rdma_devices: list[list[str | None]] | None = None
    # Liveness by progress: how long a rank may go without it in each phase.
    load_timeout_s: PositiveFloat = 120.0
    prefill_timeout_s: PositiveFloat = 60.0
    step_timeout_s: PositiveFloat = 10.0

    @field_validator("ranks", mode="before")
    @classmethod
    def _ranks(cls, value: Any) -> Any:
        count = value if isinstance(value, int) and not isinstance(value, bool) else None
        if count is None:
            if not isinstance(value, list) or not all(isinstance(h, str) and h.strip() for h in value):
                raise ValueError("give a number of local ranks (`ranks: 2`) or one host per rank "
                                 "(`ranks: [local, studio2]`)")
            count = len(value)
        if not 2 <= count <= 64:
            raise ValueError(f"a gang has 2 to 64 ranks, got {count}")
        return value

    @field_validator("rdma_devices")
    @classmethod
    def _rdma_devices(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        ranks = info.data.get("ranks")
        problem = rdma_devices_problem(value, ranks if isinstance(ranks, int) else len(ranks or []))
        if problem:
            raise ValueError(problem)
        return value


def rdma_devices_problem(devices: Any, n: int) -> str | None:
    """Why ``devices`` is not jaccl's matrix for ``n`` ranks (None: it is):
    the registry's check, and a hosting mlxd's of what a daemon sent it."""
    square = isinstance(devices, list) and len(devices) == n and all(
        isinstance(row, list) and len(row) == n for row in devices)
    named = square and all(device is None if i == j else isinstance(device, str) and bool(device.strip())
                           for i, row in enumerate(devices) for j, device in enumerate(row))
    if named:
        return None
    return (f"one row per rank, {n} rows of {n}: null where a rank meets itself, "
            "else the RDMA device (e.g. `rdma_en5`) that joins the two hosts")


class ModelEntry(_Section):
    name: str = Field(min_length=1)
    path: PathText | None = None
    source: PathText | None = None
    model: PathText | None = None
    allow_download: bool = False
    aliases: Names = []
    description: str = ""
    kind: str | None = None  # a row of the kinds table the file is read with
    preload: bool = False
    pinned: bool = False
    idle_unload_seconds: NonNegativeFloat | None = None
    max_context: Int | None = Field(None, ge=1)
    max_concurrency: Int = Field(1, ge=1)
    max_queue: Int = Field(64, ge=0)
    kv_bits: Int | None = None
    defaults: SamplingSection = SamplingSection()
    prefix_cache: PrefixCacheSection = PrefixCacheSection()
    trust_remote_code: bool = False
    local_image_dir: PathText | None = None
    allow_remote_images: bool = False
    # Served by a backend (a name under ``backends:``) instead of locally.
    backend: str | None = Field(None, min_length=1)
    # The backend's name for the model (default: this entry's name).
    remote_model: str | None = Field(None, min_length=1)
    # mlx-lm's tool parser module (or llama3_json, or none); unset: guessed
    # from the chat template as mlx-lm does.
    tool_parser: str | None = None
    # How the model marks its reasoning (docs/thinking.md); unset: mlx-lm's
    # detection from the vocabulary (think markers, gpt-oss's harmony).
    reasoning_parser: str | None = None
    # Chat-template variables every request gets (``enable_thinking: false``),
    # under what a request's own ``chat_template_kwargs`` say.
    chat_template_kwargs: dict[str, Any] | None = None
    # Failover: served by one of these (entry names, or `backend:model` for
    # a model on a backend that has no entry of its own), tried in the order
    # `strategy` picks for each request.
    targets: Names | None = Field(None, min_length=2)
    strategy: Literal["warm", "spillover"] | None = None
    # Embedding and rerank entries (docs/embeddings.md).
    truncate: bool | None = None
    matryoshka: bool | None = None
    batch_tokens: Int | None = Field(None, ge=16)
    # An LLM reranker's task (its prompt's ``<Instruct>:``; docs/embeddings.md).
    instruction: str | None = None
    # One model over several processes or machines (mx.distributed).
    parallel: ParallelSection | None = None
    speculative: SpeculativeSection | None = None

    # vllm-mlx keys with a meaning here.
    estimated_memory_gb: PositiveFloat | None = None
    mllm: bool | None = None  # true means kind: vision

    # vllm-mlx keys accepted and ignored (see VLLM_MLX_IGNORED_MODEL_KEYS).
    continuous_batching: bool | None = None
    enable_mtp: bool | None = None
    prefill_step_size: int | None = Field(None, ge=1)
    specprefill: bool | None = None
    specprefill_threshold: int | None = Field(None, ge=0)
    specprefill_keep_pct: float | None = Field(None, ge=0, le=1)
    specprefill_backbone_pct: float | None = Field(None, ge=0, le=1)
    specprefill_draft_model: str | None = None
    prefix_trie_cache: bool | None = None
    prefix_trie_cache_size: int | None = Field(None, ge=0)
    prefix_trie_cache_memory_mb: int | None = Field(None, ge=0)
    stream_interval: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)

    @field_validator("name", "aliases")
    @classmethod
    def _clean_names(cls, value: Any) -> Any:
        for name in [value] if isinstance(value, str) else value:
            if not name or name != name.strip():
                raise ValueError(f"a model name cannot be empty or start/end with spaces: {name!r}")
        return value

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str | None, info: ValidationInfo) -> str | None:
        from mlxd.registry.kinds import KINDS

        kinds = (info.context or {}).get(KINDS_TABLE) or KINDS
        if value is not None and value not in kinds:
            names = [repr(k) for k in kinds]
            choices = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
            close = _closest_kind(value, kinds)
            hint = f"; did you mean `{close}`?" if close else ""
            raise ValueError(f"input should be {choices}, got {value!r}{hint}")
        return value

    @field_validator("instruction")
    @classmethod
    def _instruction(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("an instruction cannot be empty; leave `instruction` out for the model card's default")
        return value

    @field_validator("kv_bits")
    @classmethod
    def _kv_bits(cls, value: int | None) -> int | None:
        if value is not None and value not in KV_BITS_CHOICES:
            choices = ", ".join(map(str, KV_BITS_CHOICES))
            raise ValueError(
                f"must be one of {choices} (the widths mlx-lm's quantized KV cache supports)"
            )
        return value

    @field_validator("tool_parser")
    @classmethod
    def _tool_parser(cls, value: str | None) -> str | None:
        from mlxd.tools.formats import known_parsers

        if value is not None and value not in known_parsers():
            raise ValueError(f"unknown tool parser {value!r}; choose from {', '.join(known_parsers())}")
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _reasoning_parser(cls, value: str | None) -> str | None:
        from mlxd.tools.reasoning import known_parsers

        if value is not None and value not in known_parsers():
            raise ValueError(f"unknown reasoning parser {value!r}; choose from {', '.join(known_parsers())}")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        from mlxd.tools.reasoning import reserved_template_keys

        taken = sorted(set(value or ()) & reserved_template_keys())
        if taken:
            raise ValueError(f"{taken[0]!r} is not a template variable mlxd lets a registry set "
                             "(it is an argument of apply_chat_template itself)")
        return value

    def location(self) -> tuple[str, str] | None:
        """The (key, value) naming the model's files, if exactly one is set."""
        given = [(k, getattr(self, k)) for k in LOCATION_KEYS if getattr(self, k) is not None]
        return given[0] if len(given) == 1 else None


# What other servers and libraries call a kind mlxd names otherwise.
_KIND_SYNONYMS = {"chat": "text", "llm": "text", "generate": "text", "vlm": "vision", "stt": "transcription",
                  "asr": "transcription", "tts": "speech", "reranker": "rerank", "embed": "embedding"}


def _closest_kind(value: str, kinds: Any) -> str | None:
    word = value.strip().lower()
    guess = _KIND_SYNONYMS.get(word, word)
    if guess in kinds:
        return guess
    close = difflib.get_close_matches(guess, list(kinds), n=1, cutoff=0.6)
    return close[0] if close else None


class TimeoutsSection(_Section):
    """Seconds. ``first_byte`` runs from sending the request to the
    backend's first event (its model load, on an mlxd backend, and for a
    server that sends nothing before its first token, the prefill); ``idle``
    is the longest silence allowed after it."""

    connect: PositiveFloat = 5.0
    first_byte: PositiveFloat = 600.0
    idle: PositiveFloat = 120.0


class BackendSection(_Section):
    url: str
    kind: Literal["mlxd", "openai"] = "openai"
    # The name of an environment variable holding the key: the key itself
    # never sits in the file (nor in status, logs or the reload report).
    api_key_env: str | None = Field(None, min_length=1)
    max_concurrency: Int = Field(8, ge=1)
    timeouts: TimeoutsSection = TimeoutsSection()
    # How often the background poll asks the backend how it is (bounded so a
    # typo cannot turn it into a flood or into never).
    poll_interval_s: Float = Field(10.0, ge=1, le=300)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        # A key inside the url would be shown by /v1/status and log lines:
        # refused, and the value not echoed.
        parts = urlsplit(value)
        if "@" in parts.netloc:
            raise ValueError("must not carry credentials (user:password@); put the key in an environment "
                             "variable and name it in `api_key_env`")
        if parts.query or parts.fragment or "?" in value or "#" in value:
            raise ValueError("must not carry a query string or fragment (where keys hide); put the key in an "
                             "environment variable and name it in `api_key_env`")
        if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
            raise ValueError(f"must be an http:// or https:// URL ending in /v1, got {value!r}")
        return value.rstrip("/")


Priority = Literal["interactive", "default", "bulk"]
RouteGroup = Literal["generation", "embeddings", "audio"]
PositiveInt = Annotated[Int, Field(ge=1)]


class AppEntry(_Section):
    """One application and its key, scope, priority and limits (docs/apps.md).
    The key itself never stands here: an environment variable or a file
    holds it, or the file keeps its sha256; ``key: none`` is the app of
    keyless loopback requests."""

    name: str = Field(min_length=1)
    key: str | None = None
    key_env: str | None = Field(None, min_length=1)
    key_file: str | None = Field(None, min_length=1)
    key_sha256: str | None = None
    models: Names = ["*"]
    routes: list[RouteGroup] = ["generation", "embeddings", "audio"]
    admin: bool = False
    priority: Priority = "default"
    max_concurrency: PositiveInt | None = None
    rpm: PositiveInt | None = None
    tpm: PositiveInt | None = None
    tokens_per_day: PositiveInt | None = None

    @field_validator("key")
    @classmethod
    def _only_none(cls, value: str | None) -> str | None:
        if value is not None and value != "none":
            # Never echo it: it may be the key.
            raise ValueError("`key` may only be `none` (a keyless loopback app); keep the key "
                             "itself in `key_env`, `key_file` or as `key_sha256`")
        return value

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 64 or any(c not in "0123456789abcdef" for c in value.lower())):
            raise ValueError("`key_sha256` must be 64 hex digits (`printf %s KEY | sha256sum`)")
        return value.lower() if value is not None else None


class RegistryFile(_Section):
    server: ServerSection = ServerSection()
    manager: ManagerSection = ManagerSection()
    backends: dict[str, BackendSection] = {}
    # None: no apps, every key is a flat server.api_keys entry.
    apps: list[AppEntry] | None = None
    models: list[ModelEntry] = Field(min_length=1)


# The only keys a remote entry may set: everything else describes local files,
# memory or the MLX engine, which a remote entry has none of. (Where images
# may come from is the front's business: it reads them and sends their bytes.)
REMOTE_KEYS = (
    "name", "aliases", "description", "defaults", "max_queue", "backend", "remote_model",
    "local_image_dir", "allow_remote_images", "chat_template_kwargs",
    # What the backend's model is, when it is not a chat model: an
    # embedding or rerank entry relays /v1/embeddings or /v1/rerank.
    "kind",
)


# The only keys a failover entry may set: it is a name over its targets,
# which hold the models, their memory and their queues.
FAILOVER_KEYS = (
    "name", "aliases", "description", "defaults", "targets", "strategy", "local_image_dir", "allow_remote_images",
)


def section_for_path(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The schema class of the mapping at ``loc`` (to list its valid keys)."""
    current: type[BaseModel] = RegistryFile
    keyed = False  # the next part is a key of a mapping (a backend's name)
    for part in loc:
        if isinstance(part, int):
            continue
        if keyed:
            keyed = False
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        target = _model_class(field.annotation)
        if target is None:
            return None
        keyed = getattr(field.annotation, "__origin__", None) is dict
        current = target
    return current


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_class(arg)
        if found is not None:
            return found
    return None
