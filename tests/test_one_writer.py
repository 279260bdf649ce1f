"""The one-writer lock survives the holder looking at its own sessions (``%chat sessions``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ipy_ctxrecovery import ChatSession
from ipy_ctxrecovery.session.store import held_elsewhere, saved_sessions

PROBE = ("from ipy_ctxrecovery.session.store import held_elsewhere\n"
         "print(held_elsewhere('mine'))\n")


def _seen_from_another_process() -> str:
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=60, check=True).stdout.strip()


def test_listing_sessions_in_the_holding_process_keeps_its_lock(
        emulator: Callable[..., Any]) -> None:
    with ChatSession("emulator", name="mine", emulator=emulator()) as session:
        session.send("hello")
        assert _seen_from_another_process().startswith(f"pid {os.getpid()} on ")
        # What %chat sessions does: probe every saved session. A probe that opened and
        # closed the lock file here would release this process's POSIX lock.
        [listed] = saved_sessions()
        assert listed.name == "mine" and listed.open_elsewhere is None   # held here
        assert held_elsewhere("mine") is None
        assert _seen_from_another_process().startswith(f"pid {os.getpid()} on ")
    assert _seen_from_another_process() == "None"           # closing released it
