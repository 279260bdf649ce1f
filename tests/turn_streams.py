"""Recorded event streams of real turns, for the turn card and panel tests.

Each helper runs a real :class:`ChatSession` against the emulator (or a scripted fake) and
returns the events of the turn it is about, in the order the session emitted them, with
the streamed text deltas interleaved as ``str`` items.
"""

from __future__ import annotations

from typing import Any

from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.session import ChatSession
from ipy_ctxrecovery.settings import Settings

KB = 1024
LOREM = ("The quick brown fox jumps over the lazy dog while the proxy counts every byte "
         "of the request body. ")
Stream = list[ev.Event | str]


def record(session: ChatSession, text: str, **kwargs: Any) -> Stream:
    """The events (and text deltas) of one ``send``."""
    stream: Stream = []
    unsubscribe = session.subscribe(stream.append)
    try:
        session.send(text, on_text=stream.append, **kwargs)
    finally:
        unsubscribe()
    return stream


def primed_for_413(emulator: Any, name: str = "s413") -> ChatSession:
    """A session behind a 32 KB body limit, primed to just under it (no cap known yet)."""
    emu = emulator(max_body=32 * KB, context_window=200_000)
    session = ChatSession("emulator", emulator=emu, settings=Settings(), name=name)
    for i in range(3):
        session.send(f"part {i}: " + LOREM * 95, stream=False)
    return session


def recovery_413(emulator: Any) -> tuple[ChatSession, Stream]:
    """A turn whose request is rejected with a 413 and recovered by a summary."""
    session = primed_for_413(emulator)
    return session, record(session, "Compare them with this one: " + LOREM * 40)


def routine(emulator: Any) -> tuple[ChatSession, Stream]:
    emu = emulator(context_window=200_000)
    session = ChatSession("emulator", emulator=emu, settings=Settings(), name="routine")
    return session, record(session, "hello [[words 12]]")


def events_only(stream: Stream) -> list[ev.Event]:
    return [e for e in stream if not isinstance(e, str)]
