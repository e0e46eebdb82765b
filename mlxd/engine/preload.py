"""Importing the engines' heavy libraries at start-up, off the request path.

``import mlx_lm`` pulls in transformers (and torch, where installed): 5 s on
this 2-core CPU, 11 s on the H200 image. Left lazy, it lands in the first
load of every daemon process, i.e. in some user's first request. The daemon
starts it on a background thread as it starts serving; a load that comes
sooner waits for the rest of it (``StartupImports.wait``), never pays for a
second one. (mlx-lm's generation stream is thread-local, so importing
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
from collections.abc import Iterable, Mapping

from mlxd.registry.kinds import KINDS, ModelKind
from mlxd.thread_names import name_this_thread

log = logging.getLogger(__name__)

def modules_for(kinds: Iterable[str], table: Mapping[str, ModelKind] = KINDS) -> tuple[str, ...]:
    """The libraries the engines of ``kinds`` import (their rows' ``imports``), once each."""
    names: list[str] = []
    for kind in kinds:
        row = table.get(kind)
        for name in row.imports if row is not None else ():
            if name not in names:
                names.append(name)
    return tuple(names)


def _import_all(names: tuple[str, ...]) -> None:
    name_this_thread()
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


class StartupImports:
    """The background import, and a way for loads to wait for it.

    A load that came while the import ran used to import the same package on
    the worker thread at the same time; two threads inside one package's
    circular imports can see a half-initialised module, and the load failed
    with ImportError (seen with mlx_vlm: a vision model loaded right after
    start-up). Loads wait here first, then import what is already imported.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self, kinds: Iterable[str], table: Mapping[str, ModelKind] = KINDS) -> threading.Thread:
        thread = threading.Thread(target=_import_all, args=(modules_for(kinds, table),), name="mlxd-preimport",
                                  daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def wait(self) -> None:
        """Blocks until the background import is over (at once if none ran)."""
        if self._thread is not None:
            self._thread.join()
