"""Waits with a bound (issue 12 item 1): Retry-After past max_retry_wait fails with a
sentence saying when to retry, never sleeps a day nor overflows; a turn never outlasts
turn_timeout, whether the server never answers or its stream stalls."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fakes import FakeProvider, failure
from rawserver import serving

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers.openai import OpenAIProvider

# -- the pure decision --------------------------------------------------------------------------

@pytest.mark.parametrize("attempt, asked, remaining, expected", [
    (1, None, None, 1.0),                # backoff: 1, 2, 4 … at most 30
    (2, None, None, 2.0),
    (9, None, None, 30.0),
    (10_000, None, None, 30.0),          # no overflow for a huge attempt number
    (1, 5.0, None, 5.0),                 # the server's Retry-After, within the bound
    (1, 0.0, None, 0.0),
    (1, math.nan, None, 1.0),            # NaN is no answer: backoff
    (1, -3.0, None, 1.0),
    (1, 60.0, None, 60.0),
    (3, None, 2.5, None),                # backoff 4 s but 2.5 s left of the turn
    (1, 10.0, 20.0, 10.0),
])
def test_retry_wait_decides_from_the_attempt_the_server_and_the_bounds(
        attempt: int, asked: float | None, remaining: float | None,
        expected: float | None) -> None:
    from ipy_ctxrecovery.core.retry import retry_wait

    assert retry_wait(attempt, asked, max_wait=60.0, remaining=remaining).seconds == expected


@pytest.mark.parametrize("asked", [61.0, 86_400.0, math.inf, 1e308])
def test_a_server_asking_for_longer_than_max_retry_wait_is_not_waited_for(asked: float) -> None:
    from ipy_ctxrecovery.core.retry import retry_wait

    plan = retry_wait(1, asked, max_wait=60.0)
    assert plan.give_up and plan.needed == asked and plan.bound == "max_retry_wait"


def test_the_sentence_says_what_was_asked_the_bound_and_when_to_retry() -> None:
    from ipy_ctxrecovery.core.retry import RetryWait, too_long_sentence

    now = time.mktime((2026, 1, 2, 10, 0, 0, 0, 0, -1))
    day = too_long_sentence(RetryWait(None, 86_400.0, 60.0), "rate limited (HTTP 429)", now=now)
    assert day == ("The server answered rate limited (HTTP 429) and asked to wait 1 day before "
                   "retrying, longer than max_retry_wait (1 minute); try again after 10:00 on "
                   "2026-01-03, or raise max_retry_wait with %chat config.")
    ever = too_long_sentence(RetryWait(None, math.inf, 60.0), "rate limited", now=now)
    assert "asked to wait indefinitely" in ever and "try again later" in ever
    soon = too_long_sentence(RetryWait(None, 90.0, 20.0, "turn_timeout"), "overloaded", now=now)
    assert "more than the 20 seconds left of this turn (turn_timeout)" in soon
    assert "try again after 10:01," in soon


# -- in a session ---------------------------------------------------------------------------------

@pytest.mark.parametrize("asked, words", [(86_400.0, "asked to wait 1 day"),
                                          (math.inf, "asked to wait indefinitely")])
def test_a_session_never_sleeps_past_max_retry_wait(asked: float, words: str) -> None:
    sleeps: list[float] = []
    fake = FakeProvider()
    s = ChatSession(provider=fake, sleep=sleeps.append, settings=Settings())
    s.send("first")
    before = s.history
    with pytest.raises(ChatError) as caught:
        fake.script.append(failure(FailureKind.TRANSIENT, "rate limited", status=429,
                                   retry_after=asked))
        s.send("second")
    assert str(caught.value).startswith(f"The server answered HTTP 429 and {words}")
    assert "max_retry_wait" in str(caught.value)
    assert sleeps == [] and s.history == before


@pytest.fixture
def raw_server() -> Iterator[Any]:
    with serving() as start:
        yield start


def _session(port: int, timeout: float) -> ChatSession:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test",
                           max_retries=2, timeout=600)
    provider = OpenAIProvider("gpt-4o-mini", client=client)
    return ChatSession(provider=provider, settings=Settings(turn_timeout=timeout),
                       sleep=lambda s: None)


def test_a_server_that_never_answers_fails_the_turn_at_turn_timeout(raw_server: Any) -> None:
    srv = raw_server(b"")
    s = _session(srv.port, 1.5)
    with pytest.raises(ChatError) as caught:
        s.send("hello")
    assert str(caught.value).startswith("No answer within turn_timeout (1.5 seconds)")
    assert s.history == ()
    s.close()


def test_a_stalled_stream_fails_the_turn_at_turn_timeout(raw_server: Any) -> None:
    chunk = (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
             b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},'
             b'"finish_reason":null}]}\n\n')
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    srv = raw_server(head + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    s = _session(srv.port, 1.5)
    shown: list[str] = []
    with pytest.raises(ChatError, match=r"^No answer within turn_timeout"):
        s.send("hello", on_text=shown.append)
    assert shown == ["Hel"]                      # streamed text reached the caller's thread
    assert s.history == ()
    s.close()


def test_a_real_429_asking_for_a_day_fails_with_one_sentence(raw_server: Any) -> None:
    body = b'{"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}'
    srv = raw_server(b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
                 b"retry-after: inf\r\nconnection: close\r\ncontent-length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body, stall=0)
    s = _session(srv.port, 120)
    with pytest.raises(ChatError) as caught:
        s.send("hello")
    text = str(caught.value)
    assert text.startswith("The server answered HTTP 429 and asked to wait indefinitely")
    assert "\n" not in text
    s.close()
