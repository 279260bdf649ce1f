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

Workers are reused: a thread started per call cost more than a small request's whole send
on a busy machine (its start is a hand-over of the GIL and a wake-up of the caller). A
worker whose call was abandoned is never given another: it ends with that call. The call
is told at once (``on_abandon``: the provider closes its connection), so a server that
trickles bytes keeps neither the thread nor the socket.

The turn's local work is bounded by the same deadline: :func:`checker` gives a callable
that the long loops of a turn (masking a large answer, read_file's scan) call now and
then; past the deadline it raises a :class:`ChatError` naming that work, not the server.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from humanfriendly import format_timespan

from ..core.wording import local_work_over
from ..errors import ChatError
from ..failures import Failure, FailureKind

__all__ = ["Check", "call_with_deadline", "checker", "deadline_error", "local_work_error"]

T = TypeVar("T")
TextCallback = Callable[[str], None]
Check = Callable[[], None]
"""Raises :class:`ChatError` once the turn's deadline has passed; returns otherwise."""


class _Abandoned(Exception):
    """Raised inside the abandoned worker's stream to end it."""


_END = object()
"""What a job returns when its worker should end instead of waiting for another."""


class _Worker:
    """A daemon thread that runs one call at a time; idle ones wait in ``_idle``."""

    IDLE_SECONDS: ClassVar[float] = 60.0   # an idle worker ends after this long unused
    _idle: ClassVar[list[_Worker]] = []
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="ctxrecovery-request", daemon=True).start()

    @classmethod
    def take(cls) -> _Worker:
        """An idle worker (a new one when none is idle); it runs what it is given next."""
        with cls._lock:
            if cls._idle:
                return cls._idle.pop()
        return cls()

    def give(self, job: Callable[[], object]) -> None:
        self._inbox.put(job)

    def _loop(self) -> None:
        while True:
            try:
                job = self._inbox.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self in self._idle:     # not handed a job meanwhile: end
                        self._idle.remove(self)
                        return
                continue                       # a job is on its way
            if job() is _END:
                return                         # its call was abandoned: the thread ends

    @classmethod
    def _forget(cls) -> None:
        # A forked child has none of its parent's threads: a job given to one would never run.
        cls._idle = []
        cls._lock = threading.Lock()


os.register_at_fork(after_in_child=_Worker._forget)


def deadline_error(timeout: float, request_bytes: int | None = None) -> ChatError:
    """The one sentence for a turn that ran out of time waiting for the server (not
    retried: it is the bound)."""
    reason = (f"No answer within turn_timeout ({format_timespan(timeout, max_units=2)}): the "
              "server did not answer or its reply stalled; try again, or raise "
              "turn_timeout with %chat config if answers here take longer.")
    return ChatError(Failure(FailureKind.OTHER, reason, request_bytes=request_bytes), reason)


def local_work_error(timeout: float, work: str) -> ChatError:
    """The one sentence for a turn whose time ran out in its own work (``work``: what was
    running, e.g. "the tool read_file"), not waiting for the server."""
    reason = local_work_over(format_timespan(timeout, max_units=2), work)
    return ChatError(Failure(FailureKind.OTHER, reason), reason)


def checker(deadline: float | None, timeout: float, work: str, *,
            clock: Callable[[], float] = time.monotonic) -> Check:
    """A :data:`Check` for ``work`` against ``deadline`` (a ``clock()`` value; None: never
    raises). ``timeout`` is the turn's whole budget, for the sentence."""
    if deadline is None:
        return _never

    def check() -> None:
        if clock() >= deadline:
            raise local_work_error(timeout, work)

    return check


def _never() -> None:
    return None


def call_with_deadline(call: Callable[[TextCallback | None], T], on_text: TextCallback | None,
                       deadline: float | None, *, timeout: float,
                       clock: Callable[[], float] = time.monotonic,
                       meanwhile: Callable[[], None] | None = None,
                       on_abandon: Callable[[], None] | None = None) -> T:
    """``call(text_callback)`` finished before ``deadline`` (a ``clock()`` value).

    ``deadline`` None: called directly. ``timeout`` is the turn's whole budget, for the
    error's sentence. Whatever ``call`` raises is raised here. ``meanwhile`` is run on the
    calling thread once the call is under way (before it when called directly): work that
    need not delay the call, done while it waits on the network. ``on_abandon`` is run on
    the calling thread when the call is given up (the deadline, an interrupt): it tells
    the call to stop and release what it holds (its connection).
    """
    if deadline is None:
        if meanwhile is not None:
            meanwhile()
        return call(on_text)
    if deadline - clock() <= 0:
        # Nothing was sent: the turn's own work (a tool, masking) used the time.
        raise local_work_error(timeout, "the turn's own work (tools, masking, saving)")
    results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    abandoned = threading.Event()

    def relay(text: str) -> None:
        if abandoned.is_set():
            raise _Abandoned()
        results.put(("text", text))

    def work() -> object:
        try:
            outcome: tuple[str, Any] = ("done", call(relay if on_text is not None else None))
        except BaseException as e:  # handed to the caller's thread, which raises it
            outcome = ("error", e)
        with _Worker._lock:
            if abandoned.is_set():
                return _END            # nobody waits for it: the thread ends with the call
            # Idle again before the caller hears of it, so its next call reuses this worker.
            _Worker._idle.append(worker)
        results.put(outcome)
        return None

    worker = _Worker.take()
    worker.give(work)
    try:
        if meanwhile is not None:
            meanwhile()
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
        with _Worker._lock:
            abandoned.set()
        if on_abandon is not None:
            on_abandon()
        raise
