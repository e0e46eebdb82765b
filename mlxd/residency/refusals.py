"""What the residency core tells a request it turns away for a model that
failed to load or does not fit: the client's message and when to retry.
Pure functions of plain values."""

from __future__ import annotations

from mlxd.errors import CapacityUnavailable, ModelLoadFailed

GB = 1024**3


def load_failed(model: str, last_error: str | None, retry_at: float | None, now: float,
                *, while_loaded: bool = False) -> ModelLoadFailed:
    """``while_loaded``: the model broke while resident (a parallel model's
    rank died), not in a load."""
    retry = max(1.0, (retry_at or now) - now)
    what = "failed" if while_loaded else "failed to load"
    return ModelLoadFailed(
        f"Model `{model}` {what}: {_sentence(last_error)} Retrying in {retry:.0f} s.",
        retry_after=retry,
    )


def no_capacity(model: str, need: int, free: int, budget: int, last_load_seconds: float | None,
                waited: float | None = None, holders: tuple[tuple[str, bool, int], ...] = ()) -> CapacityUnavailable:
    """``holders``: the models holding the rest, as (name, pinned, requests in flight)."""
    # A swap takes about as long as a load; say so rather than guess low.
    retry = max(1.0, 2 * (last_load_seconds or 1.0))
    waited_text = f" after waiting {waited:.0f} s" if waited else ""
    held = ", ".join(f"`{name}` ({'pinned' if pinned else f'{active} request(s) in flight' if active else 'idle'})"
                     for name, pinned, active in holders)
    # Pinned models stay until an operator moves them: waiting will not help, saying "in use" misled.
    pinned_only = bool(holders) and all(pinned for _, pinned, _ in holders)
    advice = "; unpin or unload one (`mlxd unload NAME`) to make room" if pinned_only else ""
    return CapacityUnavailable(
        f"Cannot load `{model}` within the memory budget{waited_text}: it needs "
        f"{need / GB:.2f} GB, {max(0, free) / GB:.2f} GB of "
        f"{budget / GB:.2f} GB is free" + (f", the rest held by {held}{advice}." if held else
                                          " and the other models are in use."),
        retry_after=retry,
    )


def _sentence(text: str | None) -> str:
    """``text`` ending as one sentence: an error that ends with its own stop
    gets no second one."""
    text = (text or "").strip()
    return text if text.endswith((".", "!", "?")) else text + "."
