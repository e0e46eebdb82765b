"""Which of a gang's kept KV caches a prompt starts from, decided once.

Every rank keeps the same entries (each its own shard of every layer's KV,
or its own layers), so the daemon decides for all of them and sends the
decision with the request: ranks that chose on their own could disagree
(a pipeline's ranks hold different byte counts, so a byte bound evicts
differently) and then feed different prompt lengths into one collective.

An entry is the token ids its cache holds. A prompt starts from the entry
that shares the longest prefix with it (all but its last token, which is
always run); an entry longer than that prefix is copied and the copy
trimmed, so the entry stays for the conversation it came from (two agents
over one system prompt each keep theirs). An entry the prompt extends
whole is taken as it is and kept again, longer, when the request ends.
Caches that cannot be trimmed (linear attention) serve only prompts that
extend them whole. Entries beyond ``max_bytes`` (rank 0's share, as its
ranks report it) or ``max_entries`` go least recently used first.

The entries outlive the gang as a manifest (``saved``, ``adopt``): the
token ids here, each rank's shard of the KV in its own files.

Pure: token ids and byte counts in, decisions out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Reuse:
    """What the ranks do before a request's prefill."""

    source: int | None  # the entry to start from (None: a fresh cache)
    trim: int  # tokens trimmed off its end
    copy: bool  # start from a copy, keeping the entry as it is
    keep_as: int  # the id the request's cache is kept under when it ends
    shared: int  # prompt tokens the cache holds once trimmed

    def message(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    nbytes: int


class GangPrefixPlan:
    def __init__(self, max_bytes: int, max_entries: int = 8, trimmable: bool = True) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.trimmable = trimmable
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next_id = 1
        self.hits = self.misses = self.tokens_reused = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def plan(self, tokens: Sequence[int]) -> Reuse:
        keep_as = self._next_id
        self._next_id += 1
        best, shared = None, 0
        for entry_id, entry in reversed(self._entries.items()):  # most recent first wins ties
            n = self._usable(entry.tokens, tokens)
            if n > shared:
                best, shared = entry_id, n
        if best is None:
            self.misses += 1
            return Reuse(None, 0, False, keep_as, 0)
        self.hits += 1
        self.tokens_reused += shared
        entry = self._entries[best]
        if shared == len(entry.tokens):
            del self._entries[best]  # extended in place, kept again under keep_as
            return Reuse(best, 0, False, keep_as, shared)
        self._entries.move_to_end(best)
        return Reuse(best, len(entry.tokens) - shared, True, keep_as, shared)

    def kept(self, reuse: Reuse, tokens: Sequence[int], nbytes: int) -> list[int]:
        """The request ended and its cache holds ``tokens``: the entries the
        ranks drop now to stay within the bounds (its own last, if it alone
        is too large)."""
        if not tokens:
            return self.forget(reuse)
        self._entries[reuse.keep_as] = _Entry(tuple(tokens), nbytes)
        dropped = []
        while self._entries and (len(self._entries) > self.max_entries or self.nbytes > self.max_bytes):
            entry_id, _ = self._entries.popitem(last=False)
            dropped.append(entry_id)
        return dropped

    def forget(self, reuse: Reuse) -> list[int]:
        """The request ended without the daemon learning what its cache holds
        (its client left first): the ranks drop it."""
        self._entries.pop(reuse.keep_as, None)
        return [reuse.keep_as]

    def figures(self) -> dict[str, int]:
        """Under status's names for a prefix cache's figures."""
        return {"memory_entries": self.entries, "memory_bytes": self.nbytes, "hits": self.hits,
                "misses": self.misses, "tokens_reused": self.tokens_reused}

    def saved(self) -> list[tuple[int, tuple[int, ...], int]]:
        """Each entry as a manifest records it: id, tokens, rank 0's bytes
        (least recently used first, the order ``adopt`` takes them back in)."""
        return [(entry_id, e.tokens, e.nbytes) for entry_id, e in self._entries.items()]

    def adopt(self, entry_id: int, tokens: Sequence[int], nbytes: int) -> None:
        """An entry the ranks restored from disk under ``entry_id``."""
        self._entries[entry_id] = _Entry(tuple(tokens), nbytes)
        self._next_id = max(self._next_id, entry_id + 1)

    def clear(self) -> list[int]:
        dropped = list(self._entries)
        self._entries.clear()
        return dropped

    def _usable(self, entry: tuple[int, ...], tokens: Sequence[int]) -> int:
        """Prompt tokens ``entry`` can hold for ``tokens`` (0: none)."""
        limit = len(tokens) - 1
        shared = 0
        for a, b in zip(entry, tokens[:limit]):
            if a != b:
                break
            shared += 1
        if shared == len(entry) or self.trimmable:
            return shared
        return 0
