"""Per-token log-probabilities for a request that asks for them (OpenAI's
``logprobs`` / ``top_logprobs``). Worker thread: they come from the
distribution mlx-lm sampled from (after penalties and the grammar's mask)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# OpenAI's own bound on top_logprobs.
MAX_TOP = 20


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    # The token's own bytes: a character that takes several bytes may be
    # split over tokens, and a client joins these to rebuild the text.
    raw: bytes
    # The ``top`` most likely tokens at this step, most likely first, each
    # (text, bytes, logprob).
    top: tuple[tuple[str, bytes, float], ...] = ()


def token_logprob(tokenizer: Any, token: int, logprobs: Any, top: int) -> TokenLogprob:
    """The entry for ``token`` drawn from ``logprobs`` (the step's
    log-softmax over the vocabulary)."""
    import mlx.core as mx

    row = logprobs.reshape(-1).astype(mx.float32)
    spell = TokenSpelling(tokenizer)
    alternatives: tuple[tuple[str, bytes, float], ...] = ()
    if top > 0:
        k = min(top, row.size)
        ids = mx.argpartition(-row, kth=k - 1)[:k]
        values = row[ids].tolist()
        pairs = sorted(zip(ids.tolist(), values), key=lambda p: -p[1])
        # Tokens a grammar masked out (-inf) are no alternatives (nor valid JSON).
        alternatives = tuple((*spell(i), float(v)) for i, v in pairs if math.isfinite(v))
    text, raw = spell(token)
    return TokenLogprob(text, float(row[token].item()), raw, alternatives)


class TokenSpelling:
    """A token's bytes and the text OpenAI shows for it: the text where the
    bytes are whole UTF-8, else ``bytes:\\xNN...`` (as OpenAI writes a piece
    of a character). The bytes come from mlx-lm's detokenizer's own table, so
    byte-level BPE and SentencePiece byte tokens spell what they stand for
    rather than the replacement character a lone decode gives."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._table = _byte_table(tokenizer)

    def __call__(self, token: int) -> tuple[str, bytes]:
        raw = self._table(token) if self._table is not None else None
        if raw is None:
            text = self._tokenizer.decode([token])
            return text, text.encode("utf-8")
        try:
            return raw.decode("utf-8"), raw
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw


def _byte_table(tokenizer: Any) -> Any:
    """A function from a token id to its bytes, or None where the
    tokenizer's detokenizer keeps no table (mlx-lm's naive one)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, _byte_decoder

    detokenizer = getattr(tokenizer, "_detokenizer", None)
    table = getattr(detokenizer, "tokenmap", None)
    if table is None:
        return None
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        space = "\u2581".encode("utf-8")
        return lambda token: table[token].replace(space, b" ") if token < len(table) else None
    if isinstance(detokenizer, BPEStreamingDetokenizer):
        decoder = _byte_decoder()

        def bpe(token: int) -> bytes | None:
            if token >= len(table):
                return None
            out = bytearray()
            for char in table[token]:
                byte = decoder.get(char)
                out.extend(bytes([byte]) if byte is not None else char.encode("utf-8"))
            return bytes(out)

        return bpe
    return None
