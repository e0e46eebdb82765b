"""Liveness of a gang by progress, not heartbeats: the pure core.

A heartbeat thread stays green while its rank waits forever inside a
collective (mlx#4278, mlx#4475, omlx#3039), so nothing here asks whether a
rank is there: it asks whether each rank has moved within its phase's
deadline. Every rank reports its phase and each unit of progress (a prefill
chunk, a decode step); the shell feeds those in with the time, and asks
``check(now)`` whether the gang still lives. No clock, no I/O: every stall is
a unit test with made-up times.

The verdict names one rank and why. When several stall at once (a stopped
rank holds its peers in the next collective), the one the operating system
says is stopped is named, else the one that has been silent longest, else
the lowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Phase(str, Enum):
    STARTING = "starting"  # spawned, not yet heard from
    LOADING = "loading"
    READY = "ready"  # passed the load barrier, idle
    PREFILL = "prefill"
    DECODE = "decode"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by the daemon (unload or a peer's failure)


@dataclass(frozen=True)
class Deadlines:
    """Seconds a rank may go without progress in each phase."""

    load_s: float = 120.0
    prefill_s: float = 60.0
    decode_step_s: float = 10.0
    # A rank that fails on its own account ("connection to a peer was lost")
    # may be the echo of a peer's death not heard of yet (a rank on another
    # host is heard of over HTTP): the verdict waits this long for a rank
    # killed by a signal to name instead.
    echo_s: float = 1.0

    def of(self, phase: Phase) -> float | None:
        if phase in (Phase.STARTING, Phase.LOADING):
            return self.load_s
        if phase is Phase.PREFILL:
            return self.prefill_s
        if phase is Phase.DECODE:
            return self.decode_step_s
        return None


@dataclass
class RankState:
    rank: int
    host: str
    pid: int | None = None
    phase: Phase = Phase.STARTING
    last_progress: float = 0.0
    memory_bytes: int | None = None


@dataclass(frozen=True)
class Failure:
    """Why the gang is down: the rank to name and what happened to it."""

    rank: int
    reason: str

    def sentence(self) -> str:
        return f"rank {self.rank} {self.reason}"


@dataclass
class GangLiveness:
    deadlines: Deadlines
    ranks: list[RankState] = field(default_factory=list)
    failure: Failure | None = None
    # Ranks that failed on their own account: why, and since when.
    suspects: dict[int, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def starting(cls, hosts: list[str], deadlines: Deadlines, now: float) -> GangLiveness:
        return cls(deadlines, [RankState(i, host, last_progress=now) for i, host in enumerate(hosts)])

    # --- events ----------------------------------------------------------------

    def spawned(self, rank: int, pid: int, now: float) -> None:
        r = self.ranks[rank]
        r.pid, r.last_progress = pid, now

    def progress(self, rank: int, phase: Phase, now: float, memory_bytes: int | None = None) -> None:
        """A rank reported: it entered ``phase`` or moved within it."""
        r = self.ranks[rank]
        if r.phase in (Phase.FAILED, Phase.STOPPED):
            return
        r.phase, r.last_progress = phase, now
        if memory_bytes is not None:
            r.memory_bytes = memory_bytes

    def work_sent(self, now: float) -> None:
        """A request went to every rank: each owes prefill progress from now
        on, whether or not it has said so yet."""
        for r in self.ranks:
            if r.phase is Phase.READY:
                r.phase, r.last_progress = Phase.PREFILL, now

    def work_done(self, now: float) -> None:
        """The request ended (rank 0 said so); followers' last step reports
        may still be on their way, and they owe nothing more."""
        for r in self.ranks:
            if r.phase in (Phase.PREFILL, Phase.DECODE):
                r.phase, r.last_progress = Phase.READY, now

    def suspect(self, rank: int, reason: str, now: float) -> None:
        """A rank failed on its own account (it said so, or exited with a
        status): the gang is down, but whom to name is settled by ``check``
        once ``echo_s`` has passed, unless a rank is killed meanwhile."""
        if self.failure is None and rank not in self.suspects:
            self.suspects[rank] = (reason, now)

    def rank_failed(self, rank: int, reason: str) -> Failure:
        """A rank exited or said it failed: the gang is down, this rank named."""
        if self.failure is None:
            self.failure = Failure(rank, reason)
            self.ranks[rank].phase = Phase.FAILED
        return self.failure

    def stopped(self) -> None:
        """The daemon ended every rank: exits from now on are expected."""
        for r in self.ranks:
            if r.phase is not Phase.FAILED:
                r.phase = Phase.STOPPED

    # --- questions ---------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every rank passed the load barrier: only then is the gang resident."""
        return self.failure is None and all(r.phase in (Phase.READY, Phase.PREFILL, Phase.DECODE)
                                            for r in self.ranks)

    def expects_exit(self) -> bool:
        return self.failure is not None or all(r.phase is Phase.STOPPED for r in self.ranks)

    def check(self, now: float, os_stopped: frozenset[int] = frozenset()) -> Failure | None:
        """The gang's verdict now: None while every rank moves within its
        phase's deadline. ``os_stopped``: ranks the OS shows as stopped
        (SIGSTOP), named first when several are late."""
        if self.failure is not None:
            return self.failure
        if self.suspects and now - min(t for _, t in self.suspects.values()) >= self.deadlines.echo_s:
            rank = min(self.suspects)
            return self.rank_failed(rank, self.suspects[rank][0])
        owing = [r for r in self.ranks if self.deadlines.of(r.phase) is not None]
        late = [r for r in owing if now - r.last_progress > (self.deadlines.of(r.phase) or 0.0)]
        # A stopped rank holds its peers in the next collective, and they may
        # fall late a moment before it does: name it, late or not yet.
        stopped = [r for r in owing if r.rank in os_stopped]
        if stopped and not late:
            # It will make no progress it owes: waiting out the deadline
            # (a minute for a prefill) only keeps the clients waiting.
            return self.rank_failed(stopped[0].rank, f"is stopped (SIGSTOP) while the gang owed "
                                                     f"{_stage(stopped[0].phase)} progress")
        if not late:
            return None
        culprit = stopped[0] if stopped else min(late, key=lambda r: (r.last_progress, r.rank))
        first = min(late, key=lambda r: (r.last_progress, r.rank))
        silent = now - first.last_progress
        limit = self.deadlines.of(first.phase)
        what = f"no {_stage(first.phase)} progress for {silent:.1f} s (deadline {limit:g} s)"
        reason = f"is stopped (SIGSTOP): the gang made {what}" if stopped else f"made {what}"
        return self.rank_failed(culprit.rank, reason)

    def next_deadline(self) -> float | None:
        """When ``check`` could next find a rank late (None: nobody owes progress)."""
        times = [r.last_progress + limit for r in self.ranks if (limit := self.deadlines.of(r.phase)) is not None]
        times += [t + self.deadlines.echo_s for _, t in self.suspects.values()]
        return min(times) if times else None

    def rows(self, now: float) -> list[dict[str, object]]:
        """The ranks as ``/v1/status`` shows them."""
        return [
            {
                "rank": r.rank,
                "host": r.host,
                "pid": r.pid,
                "state": r.phase.value,
                "memory_bytes": r.memory_bytes,
                "last_progress_s": round(max(0.0, now - r.last_progress), 3),
            }
            for r in self.ranks
        ]


def _stage(phase: Phase) -> str:
    return "load" if phase in (Phase.STARTING, Phase.LOADING) else phase.value
