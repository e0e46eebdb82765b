"""The Responses store's bounds: stored conversations a client makes the
daemon keep, by count and by bytes (a data: URL image is megabytes)."""

from __future__ import annotations

from mlxd.api.conversation import ImagePart, Message, TextPart
from mlxd.api.responses.store import ResponseStore


def said(text: str, image: str | None = None) -> tuple[Message, ...]:
    parts = (TextPart(text),) + ((ImagePart(image, "input[0]"),) if image else ())
    return (Message("user", parts), Message("assistant", "ok"))


def test_the_oldest_responses_go_past_the_byte_bound_the_newest_stays():
    store = ResponseStore(keep=256, keep_bytes=1000)
    store.put("a", "app", said("x" * 400))
    store.put("b", "app", said("y", image="data:image/png;base64," + "A" * 400))
    assert store.get("a", "app") is not None and store.get("b", "app") is not None
    store.put("c", "app", said("z" * 400))
    assert store.get("a", "app") is None and store.get("c", "app") is not None
    # One conversation past the bound alone is still the one to continue.
    store.put("d", "app", said("w" * 5000))
    assert [store.get(r, "app") is not None for r in "abcd"] == [False, False, False, True]


def test_the_count_bound_and_the_owner_still_hold():
    store = ResponseStore(keep=2)
    for rid in "abc":
        store.put(rid, "app", said(rid))
    assert store.get("a", "app") is None and store.get("c", "app") is not None
    assert store.get("c", "other") is None


def test_a_stored_response_object_counts_toward_the_byte_bound():
    # Its instructions and tools are in no conversation, and a client makes them any size.
    store = ResponseStore(keep=256, keep_bytes=1000)
    store.put("a", "app", said("x"), {"id": "a", "instructions": "i" * 600})
    store.put("b", "app", said("y"), {"id": "b", "instructions": "i" * 600})
    assert store.get("a", "app") is None and store.stored("b", "app").response["id"] == "b"
