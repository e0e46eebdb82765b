"""Importing the engines' heavy libraries at start-up, off the request path.

``import mlx_lm`` pulls in transformers (and torch, where installed): 5 s on
this 2-core CPU, 11 s on the H200 image. Left lazy, it lands in the first
load of every daemon process, i.e. in some user's first request. The daemon
starts it on a background thread as it starts serving; a load that comes
sooner waits on Python's import lock for the rest of the same import, never
for a second one. (mlx-lm's generation stream is thread-local, so importing
it off the worker thread is safe.)

Once they are in, what start-up built (modules, fastapi's and pydantic's
tables, transformers) is moved out of the garbage collector's sight
(``gc.freeze``): those objects live as long as the process, and every full
collection walked all of them, ~125,000 objects, a 0.2 s pause measured here
in the middle of a model load, and the same pause lands between two tokens
of whatever is streaming then.
"""

from __future__ import annotations

import gc
import importlib
import logging
import threading
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

MODULES = {"text": ("mlx_lm",), "vision": ("mlx_vlm",)}


def modules_for(kinds: Iterable[str]) -> tuple[str, ...]:
    names: list[str] = []
    for kind in kinds:
        for name in MODULES.get(kind, ()):
            if name not in names:
                names.append(name)
    return tuple(names)


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        started = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:  # the load that needs it reports the error to its user
            log.warning("pre-import of %s failed: %s", name, exc)
            continue
        log.info("imported %s in %.1fs", name, time.perf_counter() - started)
    gc.collect()
    gc.freeze()


def import_in_background(kinds: Iterable[str]) -> threading.Thread:
    thread = threading.Thread(target=_import_all, args=(modules_for(kinds),), name="mlxd-preimport", daemon=True)
    thread.start()
    return thread
