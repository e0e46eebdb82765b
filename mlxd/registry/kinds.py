"""The kinds of model mlxd serves, as one table.

A kind is one row here and one engine module: the engine factory builds it
with ``engine``, the start-up pre-import reads ``imports``, planning reads
``routes``, ``takes_images`` and ``grammars``, and token counting reads
``token_counter``. Nothing else branches on a kind's name, so a new kind
(embeddings, rerank, speech) touches no other room.

``engine`` and ``token_counter`` name functions as ``"module:function"``,
imported when first used: the registry is the bottom layer and must not
import the engines (nor their libraries) to know what kinds there are.

- ``engine``: ``async (spec, worker, cache_dir) -> Engine``, the load.
- ``token_counter``: ``(spec) -> count``, run once per model folder (kept),
  where ``count(messages, tools, images) -> int`` counts a prompt's tokens
  with the model's own template, without loading the weights.

A remote entry is not a kind but a placement: its model's kind is whatever
its backend serves, so it has a row of its own (``REMOTE``) that the registry
picks for it (``Registry.kind_of``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# What a request asks to be done, by the path it came in on.
CHAT = "chat"
COMPLETION = "completion"
# /v1/embeddings and Ollama's /api/embed; /v1/rerank (docs/embeddings.md).
EMBED = "embed"
RERANK = "rerank"
# /v1/audio/transcriptions and /translations; /v1/audio/speech and /voices (docs/audio.md).
TRANSCRIBE = "transcribe"
SPEAK = "speak"
# Where each is asked for: what a request that reached a model of the wrong
# kind is told to use instead.
ROUTE_PATHS = MappingProxyType({
    CHAT: "POST /v1/chat/completions, /v1/messages or /v1/responses",
    COMPLETION: "POST /v1/completions",
    EMBED: "POST /v1/embeddings (or Ollama's /api/embed)",
    RERANK: "POST /v1/rerank",
    TRANSCRIBE: "POST /v1/audio/transcriptions or /v1/audio/translations",
    SPEAK: "POST /v1/audio/speech",
})


@dataclass(frozen=True)
class ModelKind:
    name: str
    # "module:function" loading the engine; None: not loaded here (remote).
    engine: str | None
    # Libraries its engine imports, pre-imported at start-up off the request path.
    imports: tuple[str, ...] = ()
    # The request types it serves (CHAT, COMPLETION, ...).
    routes: frozenset[str] = frozenset({CHAT, COMPLETION})
    takes_images: bool = False
    # "module:function" making its token counter; None: it counts no tokens.
    token_counter: str | None = None
    # Tools and response_format become a grammar and a tool-call format here.
    grammars: bool = False
    # Keeps a prefix (KV) cache; one that does not reserves no memory for one.
    prefix_cache: bool = False
    # What to install when the engine's module cannot be imported.
    install_hint: str = ""
    # An encoder (embedding, rerank) reads inputs and generates nothing: no
    # KV cache, its memory beside the weights is one forward pass of
    # ``batch_tokens``; many requests hold it at once (their inputs are
    # batched in the engine); its entries take truncate / matryoshka /
    # batch_tokens.
    encodes: bool = False
    # An audio model (transcription, speech): its config.json has no KV
    # cache to size, so its memory beside the weights is what its first
    # request measures (the footprint every engine keeps); it runs one
    # request at a time unless its entry says otherwise.
    audio: bool = False
    # "module:function" removing an unloaded model's saved prefix cache (an
    # operator's clear reaches the disk copy too); read for prefix_cache kinds.
    clears_saved: str = "mlxd.engine.loader:clear_saved_prefix_cache"

    @property
    def generates(self) -> bool:
        """It serves chat or completion requests: its engine implements the
        generation contract (``mlxd.engine.contract.GenerationEngine``)."""
        return bool(self.routes & {CHAT, COMPLETION})


TEXT = ModelKind(
    name="text",
    engine="mlxd.engine.loader:load_text_engine",
    imports=("mlx_lm",),
    token_counter="mlxd.engine.token_count:text_counter",
    grammars=True,
    prefix_cache=True,
)
VISION = ModelKind(
    name="vision",
    engine="mlxd.engine.vision:load_vision_engine",
    imports=("mlx_vlm",),
    takes_images=True,
    token_counter="mlxd.engine.token_count:vision_counter",
    grammars=True,
    install_hint="mlx-vlm is not installed (pip install 'mlxd[vision]')",
)
def _encoder(name: str, route: str) -> ModelKind:
    """An embedding or rerank kind: mlx-embeddings' encoders, one route each."""
    return ModelKind(
        name=name,
        engine="mlxd.engine.embedding:load_encoder_engine",
        imports=("mlx_embeddings.utils",),
        routes=frozenset({route}),
        install_hint="mlx-embeddings is not installed (pip install 'mlxd[embeddings]')",
        encodes=True,
    )


EMBEDDING = _encoder("embedding", EMBED)
RERANK_KIND = _encoder("rerank", RERANK)
def _audio(name: str, route: str, loader: str, imports: str) -> ModelKind:
    """A speech-to-text or text-to-speech kind: mlx-audio's models, one route each."""
    return ModelKind(
        name=name,
        engine=f"mlxd.engine.audio:{loader}",
        imports=(imports,),
        routes=frozenset({route}),
        install_hint="mlx-audio is not installed (pip install 'mlxd[audio]')",
        audio=True,
    )


TRANSCRIPTION = _audio("transcription", TRANSCRIBE, "load_transcription_engine", "mlx_audio.stt.utils")
SPEECH = _audio("speech", SPEAK, "load_speech_engine", "mlx_audio.tts.utils")
# A remote entry's images go to its backend, which decides whether its
# model sees them (a text model's server answers 400 itself); its tools and
# response_format are its backend's to apply.
REMOTE = ModelKind(name="remote", engine=None, takes_images=True)

# A text model served by a gang of ranks (``parallel:``) is, like a remote
# entry, a placement: its row is picked by ``Registry.kind_of``. The daemon
# keeps only its tokenizer; rank 0 decodes under the grammars; the ranks
# keep the KV caches of past requests, within prefix_cache.max_bytes over
# all of them (distributed/prefix_plan.py), saved by each local rank when
# the gang goes and restored when it loads (distributed/saved_cache.py).
PARALLEL = ModelKind(
    name="parallel",
    engine="mlxd.distributed.engine:load_gang_engine",
    imports=("mlx_lm",),
    token_counter="mlxd.engine.token_count:text_counter",
    grammars=True,
    prefix_cache=True,
    clears_saved="mlxd.distributed.saved_cache:clear_saved_gang_cache",
)

KINDS: Mapping[str, ModelKind] = MappingProxyType(
    {k.name: k for k in (TEXT, VISION, EMBEDDING, RERANK_KIND, TRANSCRIPTION, SPEECH)})


def a_model_of(kind: str) -> str:
    """``"an embedding model"``, ``"a text model"``: a kind in a message."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} model"
