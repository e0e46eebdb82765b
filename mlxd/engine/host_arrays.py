"""MLX arrays copied out to NumPy on the worker thread."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_numpy(values: Any) -> np.ndarray:
    """Evaluated by ``mx.eval`` first, then copied out.

    ``np.asarray`` of an array not evaluated yet evaluates it through the
    buffer protocol with the GIL held, so the event loop stops while the
    work runs (a speech request's profile had 45 % of the worker's GIL
    samples there, a sentence's audio decoder). ``mx.eval`` lets go of the
    GIL while it waits."""
    import mlx.core as mx

    mx.eval(values)
    return np.array(values)
