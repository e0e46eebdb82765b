"""Stream frame templates. Text deltas are nearly every frame of a stream;
building their event object and encoding it whole for every token costs the
event loop more than the rest of the token's path. So each framer renders
its text-delta frame once per stream (per choice or content block) with a
marker for the text, through the very encoder it uses for every other
frame, and cuts it around the marker. Joined around ``encode_text(text)``
(the function that encoder uses for strings) a template gives the frame the
encoder would have written, byte for byte.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring as encode_text

# One encoder for every frame: json.dumps with options builds a new one per call.
encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# Stands in for the text while a template is made.
MARK = "\x00"


def cut(rendered: str, mark: str = MARK) -> tuple[str, str]:
    """What comes before and after the last occurrence of the encoded
    ``mark`` in ``rendered`` (the text must be the frame's last string)."""
    head, found, tail = rendered.rpartition(encode_text(mark))
    if not found:
        raise ValueError("the frame does not hold the marker")
    return head, tail


__all__ = ["MARK", "cut", "encode", "encode_text"]
