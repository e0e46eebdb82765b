"""How a relayed transcript stream is framed: whole events passed on as
soon as each ends, whatever line ends the backend writes, and an error event
in place of a half-sent one when the backend breaks off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from mlxd.api.audio.routes import _relayed_events
from mlxd.errors import BackendFailed


def relayed(*reads: bytes, fails: bool = False) -> list[bytes]:
    async def backend() -> AsyncIterator[bytes]:
        for data in reads:
            yield data
        if fails:
            raise BackendFailed("backend `far` stopped answering")

    async def collect() -> list[bytes]:
        return [data async for data in _relayed_events(backend())]

    return asyncio.run(collect())


def test_crlf_events_go_on_as_each_ends_not_at_the_streams_end() -> None:
    first, second = b'data: {"delta": "Hel"}\r\n\r\n', b'data: {"delta": "lo"}\r\n\r\n'
    assert relayed(first[:10], first[10:] + second[:5], second[5:]) == [first, second]
    assert relayed(b"data: 1\r\rdata: 2\r\r") == [b"data: 1\r\rdata: 2\r\r"]


def test_a_break_mid_event_sends_the_whole_events_then_an_error() -> None:
    whole = b"data: {}\n\n"
    sent = relayed(b"", whole + b"data: {\"ha", fails=True)
    assert sent[0] == whole and len(sent) == 2
    assert json.loads(sent[1][6:])["error"]["message"] == "backend `far` stopped answering"
