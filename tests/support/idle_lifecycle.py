"""The lifecycle members a test engine has when it holds nothing: nothing to
abort, save, close, report or clear. Test fakes inherit these and write only
the members their test is about (the echo kind spells its own out: it shows a
whole engine)."""

from __future__ import annotations

from typing import Any


class IdleLifecycle:
    async def abort_all(self, reason: str) -> int:
        return 0

    async def before_unload(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}

    async def clear_prefix_cache(self) -> bool:
        return False
