"""The one-writer lock: kept while its holder lists sessions, and told when it blocks ``-c``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from test_magics import cell, chat, ip  # noqa: F401  (fixtures)

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


def test_continue_when_every_saved_session_is_held_elsewhere_says_so(
        chat: Any, ip: Any, emulator: Callable[..., Any]) -> None:  # noqa: F811
    code = ("import sys\n"
            "from ipy_ctxrecovery import ChatSession\n"
            "s = ChatSession('emulator', name='elsewhere')\n"
            "s.send('hello')\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        result = cell(ip, "-c", "and now?")
        error = str(result.error_in_exec)
        assert isinstance(result.error_in_exec, UsageError)
        assert error.startswith("every saved session is open in another process (elsewhere)")
        assert "no saved session" not in error
    finally:
        holder.communicate("\n", timeout=30)
