"""The mlx-lm logits processor that keeps one sequence inside its grammar.

mlx-lm calls a processor as ``processor(tokens, logits)`` once per decode
step, before sampling, with every token so far (prompt included); the last
of them is the token sampled at the previous step. So the first call only
computes the mask, and each later call first feeds the previous token to
the matcher. The same processor works in ``stream_generate`` and in a
``BatchGenerator`` row (``logits`` is then that row, shape ``(1, vocab)``).

The mask is llguidance's bitmask (one bit per token), filled by the Rust
matcher, unpacked with numpy and applied with ``mx.where``, so it works on
every MLX backend (llguidance's own ``mlx.py`` helper needs Metal). Once the
grammar is complete the matcher allows only EOS, so a finished output stops; one cut
short by ``max_tokens`` ends with finish_reason "length" and ``complete``
stays false.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# llguidance's error text carries the whole grammar (a client's schema,
# megabytes perhaps): a log line keeps its first line, clipped.
LOG_LIMIT = 300


def clipped(why: str, limit: int = LOG_LIMIT) -> str:
    """``why`` on one line, at most ``limit`` characters. A multi-line error
    (llguidance's regex errors: the pattern, a caret under the fault, then
    the reason) keeps every line but the caret's: its first line alone said
    only "regex parse error:"."""
    lines = [line.strip() for line in why.strip().splitlines() if line.strip().strip("^~")]
    line = " ".join(lines) or "unknown error"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _log_clipped(why: str) -> None:
    log.warning("constrained decoding left its grammar: %s", clipped(why))


class GrammarProcessor:
    def __init__(
        self, matcher: Any, vocab_size: int, eos_token_ids: list[int],
        report: Callable[[str], None] | None = None,
    ) -> None:
        """``report``: told why, when the output leaves its grammar (the
        compiler's ``report_failure``, which logs once per grammar)."""
        import llguidance.numpy as llg_numpy

        self._report = report or _log_clipped
        self._matcher = matcher
        self._vocab = vocab_size
        self._eos = eos_token_ids
        self._bitmask = llg_numpy.allocate_token_bitmask(1, vocab_size)
        self._fill = llg_numpy.fill_next_token_bitmask
        self._started = False
        self.failed: str | None = None

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole sentence of the grammar."""
        return self.failed is None and self._matcher.is_accepting()

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np

        # Reading the previous token waits only for the last step's sampling;
        # this step's model call is queued by mlx-lm after every row's
        # processor, so the masks are ready by then and its pipelining stays.
        token = int(tokens[-1].item()) if self._started and self.failed is None else None
        if token is not None and not self._matcher.consume_token(token):
            self._fail(f"token {token} was not allowed: {self._matcher.get_error()}")
        self._started = True
        if self.failed is not None:
            return self._only_eos(logits)
        self._fill(self._matcher, self._bitmask, 0)
        if self._matcher.is_error():
            self._fail(self._matcher.get_error())
            return self._only_eos(logits)
        bits = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")[: self._vocab]
        allowed = mx.array(bits.view(np.bool_))
        width = logits.shape[-1]
        if width > self._vocab:
            allowed = mx.concatenate([allowed, mx.zeros((width - self._vocab,), dtype=mx.bool_)])
        elif width < self._vocab:
            allowed = allowed[:width]
        return mx.where(allowed, logits, mx.array(float("-inf"), dtype=logits.dtype))

    def _fail(self, why: str) -> None:
        # Should not happen (the sampler only sees allowed tokens); end the
        # output rather than let it run on unconstrained.
        self.failed = why
        self._report(why)

    def _only_eos(self, logits: Any) -> Any:
        import mlx.core as mx

        keep = mx.zeros((logits.shape[-1],), dtype=mx.bool_)
        if self._eos:
            keep[mx.array(self._eos)] = True
        return mx.where(keep, logits, mx.array(float("-inf"), dtype=logits.dtype))
