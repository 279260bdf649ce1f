"""The per-turn deadline: a provider call that cannot outlast what is left of the turn.

SDK timeouts bound each socket read, not a call: the SDK retries a timeout on its own
(``max_retries``, 2 by default) and the session retries transient failures again, so a
server that never answers held a cell for 600 s × 9 attempts; a stream that sends a byte
now and then never times out at all. :func:`call_with_deadline` runs the provider call in
a worker thread and waits at most the time left. Streamed text is handed back to the
calling thread, which alone calls ``on_text`` (display code, widgets). When the deadline
passes (or the caller is interrupted) the call is abandoned: the caller gets
:class:`ChatError` at once, and the worker stops at its stream's next chunk (or when its
own SDK timeout fires) without calling anything of the caller's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from humanfriendly import format_timespan

from ..errors import ChatError
from ..failures import Failure, FailureKind

__all__ = ["call_with_deadline", "deadline_error"]

T = TypeVar("T")
TextCallback = Callable[[str], None]


class _Abandoned(Exception):
    """Raised inside the abandoned worker's stream to end it."""


def deadline_error(timeout: float, request_bytes: int | None = None) -> ChatError:
    """The one sentence for a turn that ran out of time (not retried: it is the bound)."""
    reason = (f"No answer within turn_timeout ({format_timespan(timeout, max_units=2)}): the "
              "server did not answer or its reply stalled; try again, or raise "
              "turn_timeout with %chat config if answers here take longer.")
    return ChatError(Failure(FailureKind.OTHER, reason, request_bytes=request_bytes), reason)


def call_with_deadline(call: Callable[[TextCallback | None], T], on_text: TextCallback | None,
                       deadline: float | None, *, timeout: float,
                       clock: Callable[[], float] = time.monotonic) -> T:
    """``call(text_callback)`` finished before ``deadline`` (a ``clock()`` value).

    ``deadline`` None: called directly. ``timeout`` is the turn's whole budget, for the
    error's sentence. Whatever ``call`` raises is raised here.
    """
    if deadline is None:
        return call(on_text)
    if deadline - clock() <= 0:
        raise deadline_error(timeout)
    results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    abandoned = threading.Event()

    def relay(text: str) -> None:
        if abandoned.is_set():
            raise _Abandoned()
        results.put(("text", text))

    def work() -> None:
        try:
            results.put(("done", call(relay if on_text is not None else None)))
        except BaseException as e:  # handed to the caller's thread, which raises it
            results.put(("error", e))

    threading.Thread(target=work, name="ctxrecovery-request", daemon=True).start()
    try:
        while True:
            left = deadline - clock()
            if left <= 0:
                raise deadline_error(timeout)
            try:
                kind, value = results.get(timeout=left)
            except queue.Empty:
                raise deadline_error(timeout) from None
            if kind == "text":
                assert on_text is not None
                on_text(value)
            elif kind == "done":
                return value
            else:
                raise value
    except BaseException:
        abandoned.set()
        raise
