"""A text model's in-memory prefix cache.

Agents and chat apps resend the same long system prompt on every turn. The
prefix cache keeps the cache state of processed prompts keyed by their token
ids; a new request reuses the longest cached prefix and only prefills the
rest. It works for every cache layer type mlx-lm makes
(``engine/cache_layers.py``):

- an entry whose layers can all be trimmed (full attention) serves every
  prefix of its tokens: a lookup copies it and trims the copy to the shared
  part, and shorter entries it covers are dropped;
- an entry that cannot be trimmed (a sliding window that wrapped, SSM or
  linear-attention state) serves exactly its own tokens. The engines
  therefore keep *checkpoints* of such caches where the next request is
  likely to continue (``engine/checkpoints.py``): the system prompt's end,
  where the chat template's rendering of the conversation with an answer
  appended leaves the prompt, and the end of the prompt; plus, as for every
  model, the end of a finished generation.

Entries are kinds: ``reply`` (a finished generation, prompt and reply),
``prompt`` and ``system`` (checkpoints). An entry is *superseded* once a
newer entry extends it (the conversation moved on); superseded entries are
evicted first, at most ``max_superseded`` are kept, and ``system``
checkpoints never count as superseded (other conversations start from them).
The byte bound counts every entry, checkpoints included.

The positions a cache holds always equal its number of tokens where a layer
can count them (checked on insert and on lookup): a mismatch would silently
corrupt the output. A lookup leaves at least ``keep`` tokens to prefill: one,
because the model must see a token to produce logits, or more when a
repetition/presence penalty needs its look-back window.

Everything here touches MLX and runs on the worker thread. The counters are
plain ints the event loop may read at any time (``stats``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxd.engine import cache_layers

log = logging.getLogger(__name__)

# Superseded entries (a newer one extends them) still serve a retried or
# edited turn; this many of the most recent are kept.
MAX_SUPERSEDED = 4


@dataclass(frozen=True)
class Snapshot:
    """One cached prefix, as the save path sees it: read-only references."""

    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int
    kind: str = "reply"
    trimmable: bool = True


@dataclass(eq=False)
class _Entry:
    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int
    kind: str
    trimmable: bool
    used: int
    superseded: bool = False


@dataclass(eq=False)
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    entry: _Entry | None = None


class PrefixCache:
    """A byte-bounded cache of model caches keyed by token prefix. Worker thread only."""

    def __init__(self, max_bytes: int, max_entries: int = 512, max_superseded: int = MAX_SUPERSEDED) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.max_entries = max_entries
        self.max_superseded = max_superseded
        self._root = _Node()
        self._entries: dict[tuple[int, ...], _Entry] = {}
        self._clock = 0
        self._bytes = 0
        self._trimmable = 0
        # Read by the event loop for /v1/status; written here only.
        self.entries = 0
        self.nbytes = 0
        self.checkpoint_entries = 0
        self.checkpoint_bytes = 0
        self.hits = 0
        self.misses = 0
        self.tokens_reused = 0
        # Clears so far: a request reads it when it looks the cache up and
        # hands it to ``keep``, so one under way during a clear keeps nothing.
        self.clears = 0

    # ------------------------------------------------------------- lookup
    def fetch(self, tokens: Sequence[int], keep: int = 1, *, count: bool = True) -> tuple[list[Any] | None, int]:
        """A private copy of the cache for the longest cached prefix of
        ``tokens`` and how many tokens it covers, leaving at least ``keep``
        tokens to prefill; ``(None, 0)`` on a miss. ``count=False``: the
        engine's own lookup (a between-turn prefill), left out of the hits,
        misses and tokens reused, which describe requests."""
        found = self._nearest(tokens, len(tokens) - max(1, keep))
        if found is None:
            self.misses += count
            return None, 0
        entry, reused = found
        cut = len(entry.tokens) - reused
        cache = cache_layers.prefix_copy(entry.cache, reused) if cut else None
        if cache is None:
            cache = copy.deepcopy(entry.cache)
            if cut:
                cache_layers.trim(cache, cut)
        if cache_layers.positions(cache) not in (None, reused):
            log.warning("prefix cache entry of %d tokens holds %s positions; dropped",
                        len(entry.tokens), cache_layers.positions(entry.cache))
            self._remove(entry)
            self._count()
            self.misses += count
            return None, 0
        self._touch(entry)
        if count:
            self.hits += 1
            self.tokens_reused += reused
        return cache, reused

    def longest(self, tokens: Sequence[int]) -> int:
        """How many tokens of ``tokens`` a ``fetch`` would give (at most all
        but one), without copying anything or counting a lookup."""
        found = self._nearest(tokens, len(tokens) - 1)
        return found[1] if found is not None else 0

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry for exactly ``tokens`` is kept (it is then marked used)."""
        entry = self._entries.get(tuple(tokens))
        if entry is not None:
            self._touch(entry)
        return entry is not None

    def _nearest(self, tokens: Sequence[int], limit: int) -> tuple[_Entry, int] | None:
        """The entry to start from and how many tokens it gives, at most ``limit``."""
        if limit <= 0:
            return None
        node, depth, exact = self._root, 0, None
        for token in tokens:
            if node.entry is not None and depth <= limit:
                exact = node.entry
            child = node.children.get(token)
            if child is None:
                break
            node, depth = child, depth + 1
        else:
            if node.entry is not None and depth <= limit:
                exact = node.entry
        exact_len = len(exact.tokens) if exact is not None else 0
        target = min(depth, limit)
        if target > exact_len and self._trimmable:
            longer = self._shortest_trimmable(node, target)
            if longer is not None:
                return longer, target
        return (exact, exact_len) if exact is not None else None

    def _shortest_trimmable(self, node: _Node, target: int) -> _Entry | None:
        """The shortest entry below ``node`` that can be trimmed to ``target`` tokens."""
        level = [node]
        while level:
            found = [n.entry for n in level if n.entry is not None and n.entry.trimmable
                     and cache_layers.can_trim(n.entry.cache, len(n.entry.tokens) - target)]
            if found:
                return found[0]
            level = [c for n in level for c in n.children.values()]
        return None

    # ------------------------------------------------------------- insert
    def insert(self, tokens: Sequence[int], cache: list[Any], kind: str = "reply") -> bool:
        """Keep ``cache`` for ``tokens``; ``cache`` is copied (compacted).

        A generation's cache may hold fewer tokens than it produced (its last
        token may not have been fed): the key is cut to the positions the
        cache holds. A cache that holds more is trimmed when it can be and
        otherwise not kept; so is one that cannot say how many it holds,
        unless ``kind`` is a checkpoint (whose count the caller knows).
        Returns whether the entry was kept.
        """
        if self.max_bytes <= 0:
            return False
        key = tuple(tokens)
        held = cache_layers.positions(cache)
        if held == cache_layers.DISAGREE or (held is None and kind == "reply"):
            return False
        if held is not None and held < len(key):
            key = key[:held]
        entry_cache = cache_layers.compact(cache)
        if held is not None and held > len(key):
            if not cache_layers.can_trim(entry_cache, held - len(key)):
                return False
            cache_layers.trim(entry_cache, held - len(key))
            entry_cache = cache_layers.compact(entry_cache)
        if not key:
            return False
        size = cache_layers.nbytes(entry_cache)
        if size > self.max_bytes:
            # Keeping it would evict everything else and then itself.
            return False
        self._add(_Entry(key, entry_cache, size, kind, cache_layers.can_trim(entry_cache, len(key)), 0))
        self._bound()
        self._count()
        return True

    def keep(self, tokens: Sequence[int], cache: list[Any], model: str, kind: str = "reply", *,
             since: int) -> bool:
        """``insert`` where the answer is already complete: a cache problem
        is logged and must not fail the request. Nothing is kept if the
        cache was cleared after ``since`` (``clears`` at the request's
        lookup): what an operator emptied stays empty, its KV included.
        Whether an entry was kept."""
        if since != self.clears:
            return False
        try:
            return self.insert(tokens, cache, kind)
        except Exception:
            log.exception("keeping the prefix cache of a %s generation failed", model)
            return False

    def _add(self, entry: _Entry) -> None:
        old = self._entries.get(entry.tokens)
        if old is not None:
            self._remove(old)
        node, ancestors = self._root, []
        for token in entry.tokens:
            if node.entry is not None:
                ancestors.append(node.entry)
            node = node.children.setdefault(token, _Node())
        node.entry = entry
        self._entries[entry.tokens] = entry
        self._bytes += entry.nbytes
        self._trimmable += entry.trimmable
        self._touch(entry)
        for ancestor in ancestors:
            if entry.trimmable and ancestor.trimmable:
                # The new entry trims down to it: it only takes space.
                self._remove(ancestor)
            elif ancestor.kind != "system":
                ancestor.superseded = True

    def _touch(self, entry: _Entry) -> None:
        self._clock += 1
        entry.used = self._clock
        # Used again (a retried turn, a side request): live until extended again.
        entry.superseded = False

    def _bound(self) -> None:
        def over() -> bool:
            return self._bytes > self.max_bytes or len(self._entries) > self.max_entries

        superseded = sorted((e for e in self._entries.values() if e.superseded), key=lambda e: e.used)
        while len(superseded) > self.max_superseded:
            self._remove(superseded.pop(0))
        while over() and self._entries:
            victims = [e for e in self._entries.values() if e.superseded] or list(self._entries.values())
            self._remove(min(victims, key=lambda e: e.used))

    def _node(self, tokens: Sequence[int]) -> _Node | None:
        node = self._root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def _remove(self, entry: _Entry) -> None:
        if self._entries.get(entry.tokens) is not entry:
            return
        del self._entries[entry.tokens]
        self._bytes -= entry.nbytes
        self._trimmable -= entry.trimmable
        path = [self._root]
        for token in entry.tokens:
            path.append(path[-1].children[token])
        path[-1].entry = None
        for depth in range(len(entry.tokens), 0, -1):
            node = path[depth]
            if node.entry is not None or node.children:
                break
            del path[depth - 1].children[entry.tokens[depth - 1]]

    # ------------------------------------------------------------ the rest
    def snapshot(self) -> list[Snapshot]:
        """Every entry, most recently used first. The caches are shared, not
        copied: stored entries are never mutated (lookups copy them)."""
        ordered = sorted(self._entries.values(), key=lambda e: e.used, reverse=True)
        return [Snapshot(e.tokens, e.cache, e.nbytes, e.kind, e.trimmable) for e in ordered]

    def entry_keys(self) -> list[tuple[int, ...]]:
        """The entries' token keys, most recently used first: a read-only
        query for explaining a lookup (``engine/cache_explain.py``)."""
        return [entry.tokens for entry in self.snapshot()]

    def restore(self, entries: Sequence[tuple[Sequence[int], list[Any], str]]) -> int:
        """Fill an empty cache with entries read from disk, given most recently
        used first, so that the first ends up the most recent. Returns how
        many entries the cache then holds."""
        for tokens, cache, kind in reversed(list(entries)):
            self.insert(tokens, cache, kind)
        return self.entries

    def clear(self) -> None:
        self.clears += 1
        self._root = _Node()
        self._entries.clear()
        self._bytes = 0
        self._trimmable = 0
        self._count()

    def _count(self) -> None:
        entries = list(self._entries.values())
        self.entries = len(entries)
        self.nbytes = sum(e.nbytes for e in entries)
        checkpoints = [e for e in entries if e.kind != "reply"]
        self.checkpoint_entries = len(checkpoints)
        self.checkpoint_bytes = sum(e.nbytes for e in checkpoints)
