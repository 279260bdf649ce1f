"""``failures.py``: :meth:`Failure.repeats` — the same error again on the same body."""

from __future__ import annotations

import dataclasses

from ipy_ctxrecovery.failures import Failure, FailureKind

BASE = Failure(FailureKind.TRANSIENT, "HTTP 500 (server error)", status=500, request_bytes=4096,
               fingerprint="0123456789abcdef")


def test_the_same_status_fingerprint_and_body_size_repeat() -> None:
    again = dataclasses.replace(BASE, reason="said otherwise", retry_after=2.0)
    assert again.repeats(BASE) and BASE.repeats(again)


def test_anything_else_that_differs_or_is_unknown_does_not() -> None:
    for change in ({"status": 502}, {"fingerprint": "fedcba9876543210"},
                   {"request_bytes": 4097}, {"empty_stream": True}):
        assert not dataclasses.replace(BASE, **change).repeats(BASE), change
    for unknown in ({"fingerprint": None}, {"request_bytes": None}):
        other = dataclasses.replace(BASE, **unknown)
        assert not other.repeats(other), unknown


def test_a_new_failure_says_no_empty_stream_and_no_fingerprint() -> None:
    bare = Failure(FailureKind.OTHER, "x")
    assert bare.empty_stream is False and bare.fingerprint is None
