"""``session/turns.py``: a server that leaves usage out of its streamed replies is said once,
and the session's token estimate is calibrated from its unstreamed replies only."""

from __future__ import annotations

from typing import Any

from ipy_ctxrecovery import ChatSession
from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.wording import describe
from ipy_ctxrecovery.providers import make_provider


def test_no_usage_in_streams_is_said_once_and_calibrates_from_unstreamed_replies(
        emulator: Any) -> None:
    emu = emulator(stream_usage=False)
    session = ChatSession("emulator", emulator=emu, name="no-stream-usage")
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    start = session.estimator.bytes_per_token
    for i in range(3):
        assert session.send(f"question {i}: " + "context " * 50).text
    told = [e for e in seen if isinstance(e, ev.StreamUsageMissing)]
    assert len(told) == 1
    assert describe(told[0]).startswith("ℹ this server sends no token usage with streamed")
    # Streamed answers said nothing of tokens: the estimate is still the heuristic.
    assert session.estimator.samples == 0 and session.estimator.bytes_per_token == start
    assert session.send("and unstreamed?", stream=False).text
    assert session.estimator.samples == 1 and session.estimator.bytes_per_token != start
    assert len([e for e in seen if isinstance(e, ev.StreamUsageMissing)]) == 1
    session.close()


def test_a_server_with_usage_in_streams_says_nothing_of_it(emulator: Any) -> None:
    session = ChatSession("emulator", emulator=emulator(), name="stream-usage")
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    session.send("hello")
    assert not any(isinstance(e, ev.StreamUsageMissing) for e in seen)
    assert session.estimator.samples == 1
    session.close()


def test_it_is_said_again_for_another_provider(emulator: Any) -> None:
    first, second = emulator(stream_usage=False), emulator(stream_usage=False)
    session = ChatSession("emulator", emulator=first, name="two-servers")
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    session.send("one")
    session.send("two")
    provider = make_provider("emulator", emulator=second)
    session.update(provider=provider)
    session.send("three")
    assert len([e for e in seen if isinstance(e, ev.StreamUsageMissing)]) == 2
    session.close()
    provider.close()
