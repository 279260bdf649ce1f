"""providers/_guard.py against hostile servers on 127.0.0.1, with the real SDKs: a reply
larger than max_reply is refused unread with one sentence, and a turn given up at its
deadline leaves neither its thread nor its socket behind."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hostile_server import hostile_server

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.errors import ChatError


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with hostile_server() as p:
        yield p


def client(wire: str, port: int, mode: str) -> Any:
    if wire == "openai":
        return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/{mode}/v1",
                             api_key="sk-test-key-1234", max_retries=0)
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}/{mode}",
                               api_key="sk-ant-test-1234", max_retries=0)


def session(wire: str, port: int, mode: str, **settings: Any) -> ChatSession:
    model = "openai:gpt-4o" if wire == "openai" else "anthropic:claude-sonnet-4-5"
    return ChatSession(model, client=client(wire, port, mode), settings=Settings(**settings))


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def settled(baseline: tuple[int, int]) -> tuple[int, int]:
    """(threads, sockets) once they are back at ``baseline`` or after 10 s of waiting."""
    end = time.monotonic() + 10
    while True:
        now = (threading.active_count(), sockets())
        if (now[0] <= baseline[0] and now[1] <= baseline[1]) or time.monotonic() > end:
            return now
        time.sleep(0.1)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize(("mode", "stream"), [("trickle-sse", True), ("trickle-json", False)])
def test_timed_out_turns_release_their_thread_and_socket(port: int, wire: str, mode: str,
                                                         stream: bool) -> None:
    s = session(wire, port, mode, turn_timeout=1.0)
    baseline = (threading.active_count(), sockets())
    for _ in range(4):
        with pytest.raises(ChatError, match="turn_timeout"):
            s.send("hello", stream=stream)
    threads, socks = settled(baseline)
    s.close()
    assert threads <= baseline[0], f"{threads - baseline[0]} thread(s) left running"
    assert socks <= baseline[1], f"{socks - baseline[1]} socket(s) left open"


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_silent_server_is_shut_out_too(port: int, wire: str) -> None:
    s = session(wire, port, "silent", turn_timeout=1.0)
    baseline = (threading.active_count(), sockets())
    for _ in range(3):
        with pytest.raises(ChatError, match="turn_timeout"):
            s.send("hello", stream=False)
    threads, socks = settled(baseline)
    s.close()
    assert threads <= baseline[0] and socks <= baseline[1]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize(("status", "how"), [(200, "length"), (200, "chunked"),
                                             (500, "length"), (500, "chunked"),
                                             (400, "chunked")])
def test_a_reply_over_max_reply_is_refused_unread(port: int, wire: str, status: int,
                                                  how: str) -> None:
    # 80 MB against a 1 MB bound: refused with one sentence naming the bound and how to
    # raise it, long before the body could have been read, parsed and masked.
    s = session(wire, port, f"big-{status}-80-{how}", max_reply=1024 * 1024,
                turn_timeout=120.0)
    with pytest.raises(ChatError) as caught:
        s.send("hello", stream=False)
    sentence = str(caught.value)
    assert "max_reply (1 MB)" in sentence and "%chat config" in sentence
    assert "\n" not in sentence
    if status >= 400:
        assert f"HTTP {status} error body" in sentence
    if how == "length":
        assert "(80 MB)" in sentence and "max_reply=128MB" in sentence
    assert s.history == ()
    s.close()


@pytest.mark.parametrize("how", ["length", "chunked"])
def test_the_default_bound_refuses_a_60_mb_answer_at_once(port: int, how: str) -> None:
    # The case: a 60 MB unstreamed answer with turn_timeout=20 ended after 410 s.
    s = session("openai", port, f"big-200-60-{how}", turn_timeout=20.0)
    started = time.monotonic()
    with pytest.raises(ChatError, match=r"larger than max_reply \(32 MB\)"):
        s.send("hello", stream=False)
    assert time.monotonic() - started < 20      # a guard with a wide margin: ~1 s here
    s.close()


def test_the_users_own_requests_through_the_client_are_left_alone(port: int) -> None:
    c = client("openai", port, "big-200-2-length")
    s = ChatSession("openai:gpt-4o", client=c, settings=Settings(max_reply=1024 * 1024))
    with pytest.raises(ChatError, match="max_reply"):
        s.send("hello", stream=False)
    # The same client outside the session's send: the 2 MB body is read whole.
    raw = c.post("/chat/completions", body={}, cast_to=httpx2.Response)
    assert len(raw.content) == 2 * 1024 * 1024
    s.close()
