"""Stop strings over streamed pieces: pure logic, checked against str.find."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlxd.engine.stops import StopMatcher


def stream(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    out: list[str] = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
        if stopped:
            return out, True
    out.append(matcher.flush())
    return out, False


def expected(text: str, stops: list[str]) -> tuple[str, bool]:
    """Read one character at a time; stop as soon as any stop string is complete."""
    text, stop = expected_stop(text, stops)
    return text, stop is not None


def expected_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """The text before the first stop, and that stop (None: no stop ended it)."""
    for end in range(1, len(text) + 1):
        seen = text[:end]
        hits = sorted((seen.find(s), s) for s in stops if s and s in seen)
        if hits:
            cut, stop = hits[0]
            return seen[:cut], stop
    return text, None


def test_stop_split_across_pieces_is_cut_without_leaking_its_start():
    out, stopped = stream(["</end>"], ["Hello </", "en", "d> tail"])
    assert stopped
    assert out == ["Hello ", "", ""]


def test_text_held_back_is_released_when_it_turns_out_not_to_be_a_stop():
    out, stopped = stream(["STOP"], ["a S", "T", "x and more"])
    assert not stopped
    assert out == ["a ", "", "STx and more", ""]


def test_the_earliest_of_several_stops_wins():
    out, stopped = stream(["world", "lo w"], ["hello world"])
    assert stopped
    assert "".join(out) == "hel"


def test_the_stop_completed_first_wins_however_the_text_is_split():
    # "b" is complete before "<b<" could be; generation would end right there.
    for pieces in (["<b<"], ["<b", "<"], ["<", "b", "<"]):
        out, stopped = stream(["b", "<b<"], pieces)
        assert stopped
        assert "".join(out) == "<"


def test_the_matcher_says_which_stop_ended_the_text():
    matcher = StopMatcher(["never", "</answer>", "END"])
    assert matcher.feed("The result is 4</ans") == ("The result is 4", False)
    assert matcher.matched is None
    assert matcher.feed("wer> and more END") == ("", True)
    assert matcher.matched == "</answer>"


def test_without_stops_every_piece_passes_through_unchanged():
    out, stopped = stream([], ["a", "", "bc"])
    assert (out, stopped) == (["a", "", "bc", ""], False)


alphabet = st.sampled_from("abAB \n<>é")


@given(
    text=st.text(alphabet, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=12),
    stops=st.lists(st.text(alphabet, min_size=1, max_size=5), max_size=3),
)
def test_streamed_output_equals_the_text_before_the_first_stop(text, cuts, stops):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        emitted, stopped = matcher.feed(piece)
        out.append(emitted)
        if stopped:
            break
    out.append(matcher.flush())
    want, want_stop = expected_stop(text, stops)
    assert "".join(out) == want
    assert matcher.stopped == (want_stop is not None)
    assert matcher.matched == want_stop


@given(
    text=st.text(alphabet, max_size=40),
    stops=st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_nothing_emitted_ever_contains_a_stop(text, stops):
    emitted = ""
    matcher = StopMatcher(stops)
    for ch in text:
        piece, stopped = matcher.feed(ch)
        emitted += piece
        assert not any(s in emitted for s in stops)
        if stopped:
            break
