"""The functions a row of the kinds table names (``mlxd.registry.kinds``),
found when first used: a kind's engine and token counter live in their own
modules, which import their heavy libraries, and only a model of that kind
ever imports them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def named_function(where: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function. Raises ImportError when
    the module (or one of its libraries) cannot be imported or lacks it."""
    module, _, name = where.partition(":")
    found = getattr(importlib.import_module(module), name, None)
    if not callable(found):
        raise ImportError(f"{module} has no function {name}")
    return found
