"""LLM rerankers (Qwen3-Reranker style): a causal LM, loaded by mlx-lm,
that reads the model card's prompt holding the query and one document and answers
"yes" or "no"; a document's relevance is the probability of "yes" against
"no" at the prompt's last position, softmax(logit_no, logit_yes)[yes].

The prompt is the model card's: a system turn asking for a yes/no judgement,
the user turn ``<Instruct>: ...\\n<Query>: ...\\n<Document>: ...`` (the
instruction is the entry's ``instruction:``, else the card's), and an
assistant turn opened with an empty think block. A long document is cut so
that the whole prompt fits the model's length (the prefix and suffix are
always whole).

Rows are padded on the right: the model is causal, so a row's last real
position never sees the padding after it, and only that position's hidden
state goes through the head (not the whole vocabulary at every position).
Tokenizing uses the backend ``tokenizers`` object transformers built for
the folder (the ids transformers gives, and no per-call settings to race on
between threads); the forward pass runs on the MLX worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlxd.engine.embedding_batch import Batch
from mlxd.engine.embedding_model import Encoded
from mlxd.files import read_json_object
from mlxd.registry.model import RERANK_INSTRUCTION

SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
          'Note that the answer can only be "yes" or "no".')
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
# Qwen3-Reranker's own bound on a prompt; a model trained shorter gets its own.
MAX_LENGTH = 8192


def pair_text(query: str, document: str, instruction: str | None = None) -> str:
    """The user turn of one (query, document) pair; ``instruction`` None:
    the model card's."""
    return f"<Instruct>: {instruction or RERANK_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"


class PromptTokenizer:
    """(query, documents) -> one prompt's token ids per document."""

    def __init__(self, backend: Any, max_length: int) -> None:
        self._tokenizer = backend
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.prefix = self._tokenizer.encode(PREFIX, add_special_tokens=False).ids
        self.suffix = self._tokenizer.encode(SUFFIX, add_special_tokens=False).ids
        self.max_length = max_length
        if max_length <= len(self.prefix) + len(self.suffix):
            raise ValueError(f"the model reads {max_length} tokens, fewer than the reranking prompt itself")
        self.vocab_size = self._tokenizer.get_vocab_size()

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return int(found) if found is not None else None

    def pairs(self, query: str, documents: Sequence[str], instruction: str | None = None) -> Encoded:
        room = self.max_length - len(self.prefix) - len(self.suffix)
        done = self._tokenizer.encode_batch([pair_text(query, d, instruction) for d in documents],
                                            add_special_tokens=False)
        ids = [self.prefix + e.ids[:room] + self.suffix for e in done]
        return Encoded(ids, None, [i for i, e in enumerate(done) if len(e.ids) > room])


class LoadedLlmReranker:
    """The causal LM on the worker; ``score`` runs one batch of prompts."""

    dimensions = 0

    def __init__(self, model: Any, yes_id: int, no_id: int, pad_id: int = 0) -> None:
        self.model = model
        self.yes_id = yes_id
        self.no_id = no_id
        self.pad_id = pad_id

    def score(self, batch: Batch) -> Any:
        """Worker thread: P(yes) against P(no) after each row's prompt; not
        evaluated yet (``host_arrays.to_numpy``)."""
        import mlx.core as mx

        lengths = [row.length for row in batch.rows]
        ids = np.full((len(lengths), batch.width), self.pad_id, dtype=np.int32)
        for i, row in enumerate(batch.rows):
            ids[i, : row.length] = row.ids
        last = _last_logits(self.model, mx.array(ids), mx.array(np.array(lengths, dtype=np.int32) - 1))
        pair = last[:, mx.array([self.no_id, self.yes_id])].astype(mx.float32)
        return mx.softmax(pair, axis=-1)[:, 1]


def _last_logits(model: Any, ids: Any, last: Any) -> Any:
    """The logits at each row's ``last`` position only."""
    import mlx.core as mx

    rows = mx.arange(ids.shape[0])
    body = getattr(model, "model", None)
    if body is None:  # no separate body and head: the whole vocabulary everywhere
        return model(ids)[rows, last]
    hidden = body(ids)[rows, last]
    head = getattr(model, "lm_head", None)
    return head(hidden) if head is not None else body.embed_tokens.as_linear(hidden)


def load_llm_reranker(folder: Path) -> tuple[LoadedLlmReranker, PromptTokenizer]:
    """Worker thread: the model through mlx-lm, its tokenizer, the yes/no ids."""
    from mlx_lm.utils import load

    model, wrapper = load(str(folder))
    model.eval()
    config = read_json_object(folder / "config.json")
    limit = int(config.get("max_position_embeddings") or MAX_LENGTH)
    tokenizer_max = read_json_object(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(tokenizer_max, int) and tokenizer_max > 0:
        limit = min(limit, tokenizer_max)
    tokenizer = PromptTokenizer(wrapper._tokenizer.backend_tokenizer, min(limit, MAX_LENGTH))
    yes, no = tokenizer.token_id("yes"), tokenizer.token_id("no")
    if yes is None or no is None:
        raise ValueError('an LLM reranker\'s vocabulary must hold "yes" and "no" as single tokens')
    pad = wrapper._tokenizer.pad_token_id
    return LoadedLlmReranker(model, yes, no, pad_id=int(pad) if isinstance(pad, int) else 0), tokenizer
