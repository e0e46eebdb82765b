"""What an app's non-admin key reads of the daemon's figures: its own.
/v1/history keeps the models it may use; /metrics keeps the samples of its
own app and of the models it may use, and every daemon-wide figure (memory,
uptime) with no app or model on it. An admin key reads everything."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mlxd.caller import Caller

# Labels whose value is a model's (or a failover entry's) name.
_MODEL_LABELS = ("model", "target")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Names = Callable[[str], tuple[str, ...]]


def scoped(caller: Caller) -> bool:
    """Whether ``caller`` reads only its own figures."""
    return caller.app is not None and not caller.admin


def history_view(document: dict[str, Any], caller: Caller, names_of: Names) -> dict[str, Any]:
    models = {n: v for n, v in document["models"].items() if caller.may_use(*names_of(n))}
    return {**document, "models": models}


def metrics_view(text: bytes, caller: Caller, names_of: Names) -> bytes:
    """The Prometheus exposition ``text`` without the samples of other apps
    and of models ``caller`` may not use (HELP and TYPE lines stay)."""
    kept = [line for line in text.split(b"\n") if _keeps(line.decode(), caller, names_of)]
    return b"\n".join(kept)


def _keeps(line: str, caller: Caller, names_of: Names) -> bool:
    if line.startswith("#") or "{" not in line:
        return True
    labels = dict(_LABEL.findall(line[line.index("{"):line.rindex("}") + 1]))
    if "app" in labels and labels["app"] != caller.app:
        return False
    return all(caller.may_use(*names_of(labels[k])) for k in _MODEL_LABELS if k in labels)
