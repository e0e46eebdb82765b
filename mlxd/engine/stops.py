"""Stop strings over streamed text.

The model's text arrives in pieces that need not line up with a stop string:
``"END"`` may come as ``"E"`` then ``"ND"``. The matcher therefore holds back
the longest tail of the text seen so far that could still be the start of a
stop string, and releases it once the next piece rules that out. The output
never contains a stop string or anything after it, and does not depend on how
the text was split into pieces. Which stop string ended it is kept
(``matched``): the Anthropic surface reports it.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopMatcher:
    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stops if s))
        self._held = ""
        self.stopped = False
        # The stop string that ended the text, once one has.
        self.matched: str | None = None

    @property
    def active(self) -> bool:
        return bool(self._stops)

    @property
    def held(self) -> str:
        return self._held

    def feed(self, text: str) -> tuple[str, bool]:
        """Take the next piece; return (text safe to emit now, whether a stop matched)."""
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buf = self._held + text
        found = _first_stop(buf, self._stops)
        if found is not None:
            cut, self.matched = found
            self._held = ""
            self.stopped = True
            return buf[:cut], True
        keep = _longest_stop_prefix_tail(buf, self._stops)
        split = len(buf) - keep
        self._held = buf[split:]
        return buf[:split], False

    def flush(self) -> str:
        """At the end of generation: the held-back text was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _first_stop(buf: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where to cut ``buf`` and at which stop: the one that is complete first, as if read char by char.

    Generation ends the moment any stop string is complete, so the match that
    *ends* first wins, however the text was split into pieces. Of the stops
    ending there, the longest starts earliest and sets the cut ("<b<" ends
    with "b": in "x<b<" the stop "b" completes first and the cut is at "b").
    """
    end: int | None = None
    for stop in stops:
        at = buf.find(stop)
        if at != -1 and (end is None or at + len(stop) < end):
            end = at + len(stop)
    if end is None:
        return None
    stop = max((s for s in stops if buf.startswith(s, end - len(s))), key=len)
    return end - len(stop), stop


def _longest_stop_prefix_tail(buf: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``buf`` that is a proper prefix of a stop."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(buf)), best, -1):
            if buf.endswith(stop[:length]):
                best = length
                break
    return best
