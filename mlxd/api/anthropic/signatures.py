"""A thinking block's ``signature``, holding the reasoning it does not show.

Claude Code asks for ``thinking.display: "omitted"``: its thinking blocks
come back with their text empty, and it sends them back so with the next
turn. Anthropic's signature carries the hidden reasoning (encrypted), so its
model still sees what it thought before its tool call. mlxd's carries it too,
compressed, not encrypted: the next turn's prompt then holds the reasoning
the model wrote, as its template renders it (Qwen3's keeps the reasoning of
the turns since the last user message), instead of an empty think block, so
the model keeps its chain of thought through a tool loop and the prefix
cache keeps the turn it cached. A client could write such a signature by
hand; it could as well send the reasoning as text, which any request may.

A signature mlxd did not write (a conversation begun on Anthropic's API) is
no reasoning, as before. Pure: no MLX, no API types.
"""

from __future__ import annotations

import base64
import binascii
import zlib

PREFIX = "mlxd-reasoning-1."
# The most reasoning a signature gives back: far above any reasoning budget,
# far below what a crafted one could inflate to.
MAX_BYTES = 4 * 1024 * 1024


def sign(reasoning: str) -> str:
    """The signature of a thinking block whose reasoning is not shown."""
    if not reasoning:
        return ""
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(reasoning.encode("utf-8"))).decode("ascii")


def reasoning_of(signature: object) -> str:
    """The reasoning a signature of ``sign`` holds; "" for any other."""
    if not isinstance(signature, str) or not signature.startswith(PREFIX):
        return ""
    try:
        packed = base64.urlsafe_b64decode(signature[len(PREFIX):])
        inflate = zlib.decompressobj()
        text = inflate.decompress(packed, MAX_BYTES)
        if inflate.unconsumed_tail:
            return ""
        return text.decode("utf-8")
    except (binascii.Error, ValueError, zlib.error, UnicodeDecodeError):
        return ""
