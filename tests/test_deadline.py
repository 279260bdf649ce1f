"""call_with_deadline's workers: reused between calls, never while a call is abandoned."""

from __future__ import annotations

import threading
import time

import pytest

from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.session.deadline import _Worker, call_with_deadline


def _thread_of_call() -> int:
    return call_with_deadline(lambda _: threading.get_ident(), None,
                              time.monotonic() + 30, timeout=30)


def test_consecutive_calls_reuse_one_worker() -> None:
    first = _thread_of_call()
    assert first != threading.get_ident()          # the call ran in a worker
    assert _thread_of_call() == first


def test_an_abandoned_worker_is_not_reused_until_its_call_ends() -> None:
    release, started = threading.Event(), threading.Event()
    stuck: list[int] = []

    def hang(_: object) -> None:
        stuck.append(threading.get_ident())
        started.set()
        release.wait(30)

    with pytest.raises(ChatError, match="turn_timeout"):
        call_with_deadline(hang, None, time.monotonic() + 0.2, timeout=0.2)
    assert started.wait(10)
    # The abandoned call is still running: the next call gets another worker and answers.
    assert _thread_of_call() != stuck[0]
    idle = len(_Worker._idle)
    release.set()
    # Once its call has ended it is idle again (last in, so first out): no thread is lost.
    deadline = time.monotonic() + 10
    while len(_Worker._idle) <= idle and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _thread_of_call() == stuck[0]


def test_an_error_in_the_call_is_raised_in_the_caller() -> None:
    def fail(_: object) -> None:
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        call_with_deadline(fail, None, time.monotonic() + 30, timeout=30)
    _thread_of_call()                               # the worker survived the error


def test_meanwhile_runs_on_the_calling_thread_while_the_call_is_in_flight() -> None:
    # The call waits for what ``meanwhile`` does: run after the call, it would time out.
    done = threading.Event()
    ran_on: list[int] = []

    def meanwhile() -> None:
        ran_on.append(threading.get_ident())
        done.set()

    result = call_with_deadline(lambda _: done.wait(10), None, time.monotonic() + 30,
                                timeout=30, meanwhile=meanwhile)
    assert result is True and ran_on == [threading.get_ident()]
    # Without a deadline the call runs here: meanwhile goes first, on the same thread.
    order: list[str] = []
    call_with_deadline(lambda _: order.append("call"), None, None, timeout=0,
                       meanwhile=lambda: order.append("meanwhile"))
    assert order == ["meanwhile", "call"]
