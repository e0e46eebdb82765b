"""Restore a saved prefix-cache entry, or let the next request recompute it?

Restoring an entry reads its file and turns the bytes back into KV arrays;
recomputing it prefills its tokens. Which is faster depends on the device:
on a CPU a bench-size model prefills ~75 tokens/s, so restoring 2,000 tokens
(25 MB, milliseconds to read) wins by far; a GPU prefills tens of thousands
of tokens a second, and an entry read from a slow disk can cost more than
computing it again. The decision therefore uses two rates measured on this
machine: the prefill speed (timed at warm-up, mlxd.engine.warmup) and the
restore speed (bytes per second of read plus decode, timed on the entries
restored so far). Without a measurement an entry is restored: that is never
much worse than recomputing on the devices where rates are unknown.

Pure: numbers in, a decision out.
"""

from __future__ import annotations

from dataclasses import dataclass

# Opening a file, parsing its header, copying arrays into the cache: paid per
# entry whatever its size.
ENTRY_OVERHEAD_S = 0.002


@dataclass(frozen=True)
class Rates:
    prefill_tokens_per_s: float | None = None
    restore_bytes_per_s: float | None = None


@dataclass(frozen=True)
class Decision:
    restore: bool
    restore_s: float | None
    recompute_s: float | None
    reason: str


def _known(rate: float | None) -> bool:
    return rate is not None and rate > 0


def decide(tokens: int, nbytes: int, rates: Rates, *, overhead_s: float = ENTRY_OVERHEAD_S) -> Decision:
    """Restore ``nbytes`` holding ``tokens`` tokens iff that is expected to be
    faster than prefilling those tokens."""
    prefill, restore = rates.prefill_tokens_per_s, rates.restore_bytes_per_s
    recompute_s = tokens / prefill if _known(prefill) else None  # type: ignore[operator]
    restore_s = overhead_s + nbytes / restore if _known(restore) else None  # type: ignore[operator]
    if recompute_s is None or restore_s is None:
        missing = "prefill" if recompute_s is None else "restore"
        return Decision(True, restore_s, recompute_s, f"no measured {missing} rate yet: restore")
    if restore_s < recompute_s:
        return Decision(True, restore_s, recompute_s,
                        f"restore {restore_s * 1000:.1f} ms < recompute {recompute_s * 1000:.1f} ms")
    return Decision(False, restore_s, recompute_s,
                    f"recompute {recompute_s * 1000:.1f} ms <= restore {restore_s * 1000:.1f} ms")


@dataclass
class RateMeter:
    """Bytes per second over every timed restore so far (a restore's
    duration includes the read and the decode)."""

    nbytes: int = 0
    seconds: float = 0.0

    def record(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.nbytes += nbytes
            self.seconds += seconds

    @property
    def rate(self) -> float | None:
        return self.nbytes / self.seconds if self.seconds > 0 else None
