"""Saves prefix cache entries in a loop until it is killed (for the SIGKILL test).

    python save_loop.py CACHE_ROOT FINGERPRINT FIRST_INDEX

Entry ``i`` holds tokens ``token_ids(i)`` and KV arrays whose every value is
``expected_value(i, layer)``, so a reader can tell a complete entry from a
torn one. Each entry is written and committed the way the daemon does it;
the disk bound makes commits delete old entries too, and each round also
rewrites the previous (committed) entry, as a second saver of the same
prefix would. Prints the index after each commit.
"""

from __future__ import annotations

import sys
from pathlib import Path

LAYERS = 4
SHAPE = (1, 2, 1024, 128)  # 1 MB per array, 8 MB per entry
DISK_MAX_BYTES = 40 << 20


def token_ids(index: int) -> list[int]:
    return [index * 10_000 + t for t in range(SHAPE[2])]


def expected_value(index: int, layer: int) -> float:
    return float(index * 16 + layer)


def make_cache(index: int) -> list:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    cache = []
    for layer in range(LAYERS):
        c = KVCache()
        c.keys = mx.full(SHAPE, expected_value(index, layer))
        c.values = mx.full(SHAPE, -expected_value(index, layer))
        c.offset = SHAPE[2]
        cache.append(c)
    return cache


def main(root: Path, fingerprint: str, first: int) -> None:
    from mlxd.engine.cache_store.folder import CacheStore, entry_name
    from mlxd.engine.cache_entry import encode_entry

    store = CacheStore(root, fingerprint, DISK_MAX_BYTES)
    index = first
    while True:
        entries = []
        for i in (index - 1, index) if index > first else (index,):
            tokens = token_ids(i)
            payload = encode_entry(tokens, make_cache(i), fingerprint)
            entries.append(store.write_entry(entry_name(tokens), payload, len(tokens)))
        store.commit(entries, drop=set(), save_seconds=0.0)
        print(index, flush=True)
        index += 1


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
