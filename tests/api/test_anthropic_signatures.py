"""A thinking block's signature holding the reasoning it does not show
(mlxd/api/anthropic/signatures.py): it gives back exactly what it holds, and
nothing for a signature it did not write or one inflated past its bound."""

from __future__ import annotations

import base64
import zlib

from mlxd.api.anthropic.signatures import MAX_BYTES, PREFIX, reasoning_of, sign


def test_a_signature_gives_back_the_reasoning_it_holds():
    text = "Let me think: the file is YAML, so… 日本語 and\nnewlines.\n" * 50
    signature = sign(text)
    assert signature.startswith(PREFIX) and signature.isascii()
    # Compressed: a long reasoning makes a shorter signature.
    assert len(signature) < len(text.encode())
    assert reasoning_of(signature) == text
    assert sign("") == ""


def test_other_signatures_hold_no_reasoning():
    for foreign in (None, 3, "", "EqQBCkgIARABGAIiQL", PREFIX + "not base64!", PREFIX + "aGVsbG8=",
                    PREFIX + base64.urlsafe_b64encode(zlib.compress(b"\xff\xfe")).decode()):
        assert reasoning_of(foreign) == ""


def test_a_signature_that_inflates_past_the_bound_holds_nothing():
    bomb = PREFIX + base64.urlsafe_b64encode(zlib.compress(b"a" * (MAX_BYTES + 1))).decode()
    assert len(bomb) < 20_000
    assert reasoning_of(bomb) == ""
