"""Request bodies of the embedding and rerank routes, parsed once into the
request path's values (``EmbedInputs``, ``RerankAsk``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from mlxd.api.conversation import encodable
from mlxd.errors import BadRequest

# OpenAI's bound on one request's inputs.
MAX_INPUTS = 2048
MAX_DOCUMENTS = 1000


@dataclass(frozen=True)
class EmbedInputs:
    """Texts, or token id arrays (taken as the model's own ids); exactly one is set."""

    texts: tuple[str, ...] | None = None
    arrays: tuple[tuple[int, ...], ...] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.arrays or ())


@dataclass(frozen=True)
class RerankAsk:
    query: str
    documents: tuple[str, ...]
    top_n: int | None
    return_documents: bool


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


def _texts(texts: tuple[str, ...], param: str) -> tuple[str, ...]:
    """``texts``, refused as a 400 where JSON carried a lone surrogate
    (``"\ud800"``), which the tokenizer cannot take: it failed there as a 500."""
    if not encodable(list(texts)):
        raise BadRequest(f"`{param}` contains an unpaired UTF-16 surrogate; it is not valid Unicode text",
                         param=param)
    return texts


def _inputs(value: object, param: str) -> EmbedInputs:
    """OpenAI's ``input``: a string, strings, a token array or token arrays."""
    if isinstance(value, str):
        return EmbedInputs(texts=_texts((value,), param))
    assert isinstance(value, list)
    if not value:
        raise BadRequest(f"`{param}` must not be empty", param=param)
    # One token array is one input, however long (its length is the model's to cut or refuse).
    if all(isinstance(v, int) for v in value):
        return EmbedInputs(arrays=(tuple(value),))  # type: ignore[arg-type]
    if len(value) > MAX_INPUTS:
        raise BadRequest(f"`{param}` has {len(value)} inputs; at most {MAX_INPUTS} are taken", param=param)
    if all(isinstance(v, str) for v in value):
        return EmbedInputs(texts=_texts(tuple(value), param))  # type: ignore[arg-type]
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not ids:
                raise BadRequest(f"`{param}[{i}]` is an empty token array", param=f"{param}[{i}]")
        return EmbedInputs(arrays=tuple(tuple(v) for v in value))
    raise BadRequest(f"`{param}` mixes strings and token arrays; send one kind", param=param)


# Strict: pydantic would take ``true`` for the token id 1.
TokenArrays = list[list[StrictInt]]
Input = Union[str, list[str], list[StrictInt], TokenArrays]


class EmbeddingsBody(_Body):
    """OpenAI's POST /v1/embeddings."""

    model: str = Field(min_length=1)
    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1)
    user: str | None = None

    def inputs(self) -> EmbedInputs:
        return _inputs(self.input, "input")


class Document(_Body):
    text: str


class RerankBody(_Body):
    """POST /v1/rerank (and /rerank, /v2/rerank): Cohere's and Jina's shape."""

    model: str = Field(min_length=1)
    query: str
    documents: list[Union[str, Document]] = Field(min_length=1)
    top_n: StrictInt | None = Field(None, ge=1)
    return_documents: bool = True

    def ask(self) -> RerankAsk:
        if len(self.documents) > MAX_DOCUMENTS:
            raise BadRequest(f"`documents` has {len(self.documents)} entries; at most {MAX_DOCUMENTS} are taken",
                             param="documents")
        texts = tuple(d if isinstance(d, str) else d.text for d in self.documents)
        return RerankAsk(_texts((self.query,), "query")[0], _texts(texts, "documents"), self.top_n,
                         self.return_documents)


class OllamaEmbedBody(_Body):
    """Ollama's POST /api/embed."""

    model: str = Field(min_length=1)
    input: Union[str, list[str]]
    truncate: bool = True
    dimensions: StrictInt | None = Field(None, ge=1)

    def inputs(self) -> EmbedInputs:
        return _inputs(self.input, "input")


class OllamaEmbeddingsBody(_Body):
    """Ollama's older POST /api/embeddings: one ``prompt``, one vector."""

    model: str = Field(min_length=1)
    prompt: str

    def inputs(self) -> EmbedInputs:
        return EmbedInputs(texts=_texts((self.prompt,), "prompt"))
