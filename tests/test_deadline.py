"""call_with_deadline's workers: reused between calls, never after a call was abandoned;
and the checks that bound a turn's own work."""

from __future__ import annotations

import threading
import time

import pytest

from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.session.deadline import _Worker, call_with_deadline, checker


def _thread_of_call() -> int:
    return call_with_deadline(lambda _: threading.get_ident(), None,
                              time.monotonic() + 30, timeout=30)


def test_consecutive_calls_reuse_one_worker() -> None:
    first = _thread_of_call()
    assert first != threading.get_ident()          # the call ran in a worker
    assert _thread_of_call() == first


def test_an_abandoned_worker_is_never_reused_and_ends_with_its_call() -> None:
    release, started = threading.Event(), threading.Event()
    stuck: list[threading.Thread] = []
    told: list[int] = []

    def hang(_: object) -> None:
        stuck.append(threading.current_thread())
        started.set()
        release.wait(30)

    with pytest.raises(ChatError, match="turn_timeout"):
        call_with_deadline(hang, None, time.monotonic() + 0.2, timeout=0.2,
                           on_abandon=lambda: told.append(threading.get_ident()))
    assert started.wait(10)
    assert told == [threading.get_ident()]         # the call was told, on this thread
    # The abandoned call is still running: the next call gets another worker and answers.
    assert _thread_of_call() != stuck[0].ident
    release.set()
    # Once its call has ended its thread ends: nothing waits for it, nothing reuses it.
    stuck[0].join(10)
    assert not stuck[0].is_alive()
    assert stuck[0] not in [w for w in _Worker._idle]
    assert _thread_of_call() != stuck[0].ident


def test_time_used_up_before_a_call_blames_the_turns_own_work() -> None:
    with pytest.raises(ChatError, match="during the turn's own work") as caught:
        call_with_deadline(lambda _: None, None, time.monotonic() - 1, timeout=20)
    assert "not while waiting for the server" in str(caught.value)


def test_a_checker_raises_only_past_its_deadline() -> None:
    now = [0.0]
    check = checker(10.0, 10.0, "the tool read_file", clock=lambda: now[0])
    check()
    now[0] = 10.0
    with pytest.raises(ChatError, match="during the tool read_file") as caught:
        check()
    assert "turn_timeout (10 seconds)" in str(caught.value)
    checker(None, 10.0, "anything")()               # no deadline: never raises


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
