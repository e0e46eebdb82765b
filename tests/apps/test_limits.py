"""The per-app limits core, on a clock the test turns: each limit refuses
at its bound with the Retry-After of its own reset, and lets requests in
again once that reset has come."""

from __future__ import annotations

from mlxd.api.limits import DAY, LimitBook, Limits

T0 = 1_700_000_000.0  # some second of some UTC day


def test_rpm_refuses_the_request_past_the_limit_until_the_oldest_leaves_the_minute():
    book, limits = LimitBook(), Limits(rpm=2)
    first = book.admit("a", limits, T0)
    assert first.admitted and first.headers()["x-ratelimit-remaining-requests"] == "1"
    book.release("a")
    assert book.admit("a", limits, T0 + 10).admitted
    book.release("a")
    refused = book.admit("a", limits, T0 + 20)
    assert not refused.admitted and refused.refused_by == "rpm"
    # The first request leaves the window at T0 + 60: 40 s from now.
    assert refused.retry_after == 40
    assert refused.headers() == {"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0",
                                 "x-ratelimit-reset-requests": "40s"}
    assert not book.admit("a", limits, T0 + 59.9).admitted
    assert book.admit("a", limits, T0 + 60).admitted
    # Another app's window is its own.
    assert book.admit("b", limits, T0 + 20).admitted


def test_tpm_counts_the_tokens_finished_requests_spent_in_the_last_minute():
    book, limits = LimitBook(), Limits(tpm=100)
    book.spend("a", 30, T0)
    book.spend("a", 80, T0 + 5)
    refused = book.admit("a", limits, T0 + 10)
    # 110 tokens in the window; below 100 once the 30 of T0 have left it.
    assert not refused.admitted and refused.refused_by == "tpm" and refused.retry_after == 50
    assert refused.headers()["x-ratelimit-remaining-tokens"] == "0"
    admitted = book.admit("a", limits, T0 + 60)
    assert admitted.admitted and admitted.headers()["x-ratelimit-remaining-tokens"] == "20"


def test_tokens_per_day_resets_at_midnight_utc():
    book, limits = LimitBook(), Limits(tokens_per_day=1000)
    midnight = (T0 // DAY + 1) * DAY
    book.spend("a", 1000, midnight - 3600)
    refused = book.admit("a", limits, midnight - 600)
    assert not refused.admitted and refused.refused_by == "tokens_per_day" and refused.retry_after == 600
    assert refused.headers()["x-ratelimit-reset-tokens-day"] == "600s"
    assert book.admit("a", limits, midnight).admitted
    # Tokens a restart found in today's activity count toward today.
    book.restore_day("b", 999, midnight + 5)
    assert book.admit("b", limits, midnight + 6).admitted
    book.spend("b", 1, midnight + 7)
    assert not book.admit("b", limits, midnight + 8).admitted


def test_max_concurrency_holds_a_slot_until_release():
    book, limits = LimitBook(), Limits(max_concurrency=2)
    assert book.admit("a", limits, T0).admitted and book.admit("a", limits, T0).admitted
    refused = book.admit("a", limits, T0)
    assert not refused.admitted and refused.refused_by == "max_concurrency" and refused.retry_after == 1
    assert book.active("a") == 2
    book.release("a")
    assert book.admit("a", limits, T0).admitted


def test_a_refused_request_takes_no_slot_and_counts_no_request():
    book, limits = LimitBook(), Limits(rpm=1, max_concurrency=5)
    assert book.admit("a", limits, T0).admitted
    for _ in range(3):
        assert not book.admit("a", limits, T0 + 1).admitted
    assert book.active("a") == 1
    assert book.admit("a", limits, T0 + 60).admitted
