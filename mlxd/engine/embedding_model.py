"""An embedding or rerank model in memory, and one forward pass over a batch.

The encoders are mlx-embeddings' own model classes (BERT, XLM-RoBERTa,
ModernBERT, Qwen3, Gemma...), loaded by ``mlx_embeddings.utils.load_model``.
What a sentence-transformers folder says about its output is read here and
applied to the encoder's hidden states: the pooling (``1_Pooling``: mean,
CLS or last token), the ``Normalize`` module, the longest input
(``sentence_bert_config.json``). A folder without those files gets the
pooling mlx-embeddings' class does itself.

A cross-encoder (``BertForSequenceClassification``,
``XLMRobertaForSequenceClassification``: bge-reranker, ms-marco MiniLM) is
the same encoder under a ``bert.``/``roberta.`` prefix plus a classifier
head, which mlx-embeddings does not carry: the head is built here over its
encoder, and the score is the first logit through the activation the folder
names (sentence-transformers' sigmoid when it names none).

Tokenizing uses the folder's ``tokenizer.json`` directly (the ``tokenizers``
library, safe to call from any thread); everything else runs on the MLX
worker thread.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlxd.engine.embedding_batch import Batch
from mlxd.files import read_json_object

log = logging.getLogger(__name__)

POOLING_MODES = ("mean", "cls", "lasttoken", "max", "model")


@dataclass(frozen=True)
class OutputRecipe:
    """How the encoder's hidden states become what a client gets."""

    pooling: str = "model"
    normalize: bool = True
    # The longest input in tokens (specials included).
    max_length: int = 512


def output_recipe(folder: Path, config: dict[str, Any]) -> OutputRecipe:
    """Pure: the folder's sentence-transformers files -> its OutputRecipe."""
    trained = int(config.get("max_position_embeddings") or 512)
    tokenizer_max = read_json_object(folder / "tokenizer_config.json").get("model_max_length")
    limit = min(trained, int(tokenizer_max)) if isinstance(tokenizer_max, int) and tokenizer_max > 0 else trained
    seq = read_json_object(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(seq, int) and seq > 0:
        limit = min(limit, seq)
    if config.get("model_type") == "xlm-roberta" or config.get("model_type") == "xlm_roberta":
        # Its positions start after the padding index.
        limit = min(limit, trained - int(config.get("pad_token_id", 1)) - 1)
    modules = _read_modules(folder)
    if not modules:
        return OutputRecipe(max_length=limit)
    pooling = "mean"
    pool_dir = next((m for m in modules if m.get("type", "").endswith("Pooling")), None)
    if pool_dir is not None:
        settings = read_json_object(folder / str(pool_dir.get("path", "")) / "config.json")
        if settings.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif settings.get("pooling_mode_lasttoken"):
            pooling = "lasttoken"
        elif settings.get("pooling_mode_max_tokens"):
            pooling = "max"
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    return OutputRecipe(pooling=pooling, normalize=normalize, max_length=limit)


def _read_modules(folder: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


@dataclass(frozen=True)
class Encoded:
    """A request's inputs as token ids, and which of them were cut."""

    ids: list[list[int]]
    types: list[list[int]] | None
    truncated: list[int]

    @property
    def tokens(self) -> int:
        return sum(len(i) for i in self.ids)


class TextTokenizer:
    """The folder's ``tokenizer.json``, set to cut at the model's length."""

    def __init__(self, folder: Path, max_length: int) -> None:
        from tokenizers import Tokenizer

        self.max_length = max_length
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length, strategy="longest_first")
        self.vocab_size = self._tokenizer.get_vocab_size()
        pad = self._tokenizer.token_to_id("[PAD]")
        if pad is None:
            pad = self._tokenizer.token_to_id("<pad>")
        self.pad_id = pad if pad is not None else 0

    def texts(self, texts: Sequence[str]) -> Encoded:
        done = self._tokenizer.encode_batch(list(texts))
        return Encoded([e.ids for e in done], None, [i for i, e in enumerate(done) if e.overflowing])

    def pairs(self, query: str, documents: Sequence[str]) -> Encoded:
        done = self._tokenizer.encode_batch([(query, d) for d in documents])
        return Encoded([e.ids for e in done], [e.type_ids for e in done],
                       [i for i, e in enumerate(done) if e.overflowing])

    def token_arrays(self, arrays: Sequence[Sequence[int]]) -> Encoded:
        """Token ids as given (no special tokens added), cut to the length."""
        cut = [i for i, a in enumerate(arrays) if len(a) > self.max_length]
        return Encoded([list(a[: self.max_length]) for a in arrays], None, cut)


# A compiled pass (``LoadedEncoder(compiled=True)``) runs at bucketed shapes:
# ``mx.compile`` traces once per input shape, and dynamic batching gives
# nearly every pass a (rows, width) of its own. Rows are padded up to a power
# of two, the width to a multiple of 8 up to 64 and to a quarter of its octave
# above (at most a quarter of it padding), so a few tens of traces cover
# short texts. A bucket over this many padded tokens runs uncompiled at its
# own shape instead: a pass that large is the device's arithmetic, not the
# host's launching, and padding it up would add arithmetic.
COMPILED_MAX_TOKENS = 8192


def bucket_rows(rows: int) -> int:
    return 1 << (rows - 1).bit_length()


def bucket_width(width: int) -> int:
    if width <= 64:
        return -(-width // 8) * 8
    step = 1 << (width.bit_length() - 3)
    return -(-width // step) * step


class LoadedEncoder:
    """The model on the worker: ``embed`` and ``score`` run one batch each.

    ``model`` is dropped (set to None) on unload; nothing else holds it.

    ``compiled``: each pass runs through ``mx.compile`` of the whole forward
    (encoder, pooling, normalization or head), at a bucketed shape
    (``bucket_rows``, ``bucket_width``). The padding rows are all padding
    (mask 0) and their outputs are sliced off. A traced pass replays its
    graph from MLX's cache instead of running the modules' Python, and fuses
    the elementwise work into fewer kernels. Opt-in: on an H100 it built a
    MiniLM pass 0.2 ms sooner but queued it no faster, and its first pass
    on a fresh machine spent 40 s compiling kernels (docs/embeddings.md), so
    the loaders leave it off; bench/encoder_shapes.py measures it."""

    def __init__(self, model: Any, recipe: OutputRecipe, *, head: Any = None, activation: str = "sigmoid",
                 pad_id: int = 0, dimensions: int = 0, compiled: bool = False) -> None:
        self._model = model
        self.recipe = recipe
        self.head = head
        self.activation = activation
        self.pad_id = pad_id
        self.dimensions = dimensions
        self.compiled = compiled
        params = inspect.signature(model.__call__).parameters
        self._takes_types = "token_type_ids" in params
        # A compiled function per thread that runs passes, and per forward:
        # (thread id, "_embed" or "_score") -> function. MLX keeps compiled
        # traces in a cache per thread, and a compiled function's destructor
        # empties only the cache of the thread that last called it: one
        # function called from two threads (the first pass on the worker,
        # the rest on the pass thread on CUDA) would leave the other
        # thread's traces, with the weights they hold, behind after an
        # unload.
        self._compiled: dict[tuple[int, str], Callable[..., Any]] = {}

    @property
    def model(self) -> Any:
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        # Unload: the compiled traces hold the weights as constants; dropping
        # the functions erases them from MLX's caches.
        self._model = model
        self._compiled.clear()

    def _inputs(self, batch: Batch, rows: int = 0, width: int = 0) -> tuple[Any, Any, Any]:
        """The batch as ids, mask and token types, padded to ``rows`` x ``width``
        (at least the batch's own)."""
        import mlx.core as mx

        rows, width = max(rows, len(batch.rows)), max(width, batch.width)
        ids = np.full((rows, width), self.pad_id, dtype=np.int32)
        mask = np.zeros((rows, width), dtype=np.float32)
        types = np.zeros((rows, width), dtype=np.int32)
        for i, row in enumerate(batch.rows):
            ids[i, : row.length] = row.ids
            mask[i, : row.length] = 1.0
            if row.types:
                types[i, : row.length] = row.types
        return mx.array(ids), mx.array(mask), mx.array(types)

    def _run(self, batch: Batch, forward: Callable[[Any, Any, Any], Any]) -> Any:
        """``forward`` over the batch: compiled at the batch's bucket when the
        encoder is, the padding rows' outputs sliced off."""
        if not self.compiled:
            return forward(*self._inputs(batch))
        rows = bucket_rows(len(batch.rows))
        width = min(bucket_width(batch.width), max(self.recipe.max_length, batch.width))
        if rows * width > COMPILED_MAX_TOKENS:
            return forward(*self._inputs(batch))
        key = (threading.get_ident(), forward.__name__)
        compiled = self._compiled.get(key)
        if compiled is None:
            import mlx.core as mx

            compiled = self._compiled[key] = mx.compile(forward)
        return compiled(*self._inputs(batch, rows, width))[: len(batch.rows)]

    def _encode(self, ids: Any, mask: Any, types: Any) -> Any:
        if self._takes_types:
            return self._model(ids, attention_mask=mask, token_type_ids=types)
        return self._model(ids, attention_mask=mask)

    def embed(self, batch: Batch) -> Any:
        """Worker thread: one vector per row, float32, pooled as the folder
        says; not evaluated yet (``host_arrays.to_numpy``)."""
        return self._run(batch, self._embed)

    def _embed(self, ids: Any, mask: Any, types: Any) -> Any:
        import mlx.core as mx

        pooled = _pool(self._encode(ids, mask, types), mask, self.recipe.pooling)
        if self.recipe.normalize or self.recipe.pooling == "model":
            # An all-padding row pools to zeros (its mask sums to 0): the
            # floor keeps it at zeros, not NaN.
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return pooled.astype(mx.float32)

    def score(self, batch: Batch) -> Any:
        """Worker thread: one relevance score per (query, document) row; not
        evaluated yet (``host_arrays.to_numpy``)."""
        return self._run(batch, self._score)

    def _score(self, ids: Any, mask: Any, types: Any) -> Any:
        import mlx.core as mx

        logits = self.head(self._encode(ids, mask, types))[:, 0].astype(mx.float32)
        if self.activation == "sigmoid":
            logits = mx.sigmoid(logits)
        return logits


def _pool(out: Any, mask: Any, mode: str) -> Any:
    import mlx.core as mx

    if mode == "model":
        return out.text_embeds
    hidden = out.last_hidden_state.astype(mx.float32)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mx.sum(mask, axis=1).astype(mx.int32) - 1
        return hidden[mx.arange(hidden.shape[0]), last]
    weights = mask[:, :, None]
    if mode == "max":
        return mx.max(mx.where(weights > 0, hidden, -1e9), axis=1)
    return mx.sum(hidden * weights, axis=1) / mx.maximum(mx.sum(weights, axis=1), 1e-9)


def load_embedder(folder: Path) -> tuple[LoadedEncoder, TextTokenizer]:
    """Worker thread: an embedding model and its tokenizer."""
    from mlx_embeddings.utils import load_model

    config = read_json_object(folder / "config.json")
    recipe = output_recipe(folder, config)
    model = load_model(folder)
    tokenizer = TextTokenizer(folder, recipe.max_length)
    dims = int(config.get("hidden_size") or 0)
    return LoadedEncoder(model, recipe, pad_id=tokenizer.pad_id, dimensions=dims), tokenizer


# The classification architectures a cross-encoder may be, and the prefix
# its encoder's weights have in the checkpoint.
CROSS_ENCODERS = {
    "BertForSequenceClassification": "bert.",
    "XLMRobertaForSequenceClassification": "roberta.",
}


def is_cross_encoder(config: dict[str, Any]) -> bool:
    return any(a in CROSS_ENCODERS for a in config.get("architectures") or ())


def load_cross_encoder(folder: Path) -> tuple[LoadedEncoder, TextTokenizer]:
    """Worker thread: mlx-embeddings' encoder with a classification head."""
    import importlib

    import mlx.core as mx
    from mlx_embeddings.utils import load_config

    from mlxd.engine.rerank_heads import BertHead, RobertaHead

    config = load_config(folder)
    arch = next((a for a in config.get("architectures") or () if a in CROSS_ENCODERS), None)
    if arch is None:
        raise ValueError(f"not a cross-encoder: architectures {config.get('architectures')}")
    prefix = CROSS_ENCODERS[arch]
    module = importlib.import_module(f"mlx_embeddings.models.{config['model_type'].replace('-', '_')}")
    args = module.ModelArgs.from_dict(config)
    if hasattr(args, "add_pooling_layer"):
        # XLM-R's head reads the first token itself; BERT's reads the pooler.
        args.add_pooling_layer = False
    encoder = module.Model(args)
    weights: dict[str, Any] = {}
    for file in sorted(folder.glob("model*.safetensors")):
        weights.update(mx.load(str(file)))
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels") or 1)
    head = (BertHead if prefix == "bert." else RobertaHead)(args.hidden_size, labels)
    encoder_weights = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    encoder_weights = encoder.sanitize(encoder_weights) if hasattr(encoder, "sanitize") else encoder_weights
    if prefix == "roberta.":
        encoder_weights = {k: v for k, v in encoder_weights.items() if not k.startswith("pooler.")}
    encoder.load_weights(list(encoder_weights.items()))
    head_weights = {k: v for k, v in weights.items() if k.startswith("classifier.")}
    if prefix == "roberta.":
        # transformers' XLM-R head is the ``classifier`` module itself.
        head_weights = {k[len("classifier."):]: v for k, v in head_weights.items()}
    head.load_weights(list(head_weights.items()))
    mx.eval(encoder.parameters(), head.parameters())
    encoder.eval()
    recipe = output_recipe(folder, config)
    tokenizer = TextTokenizer(folder, recipe.max_length)
    activation = _activation(config)
    return LoadedEncoder(encoder, recipe, head=head, activation=activation, pad_id=tokenizer.pad_id), tokenizer


def _activation(config: dict[str, Any]) -> str:
    """sentence-transformers' choice: the folder's ``activation_fn`` if it
    names one (Identity: raw logits), else sigmoid for a one-label model."""
    named = str((config.get("sentence_transformers") or {}).get("activation_fn") or "")
    if named.endswith("Identity"):
        return "identity"
    return "sigmoid"
