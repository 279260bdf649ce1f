"""Disk faults for tests: a directory that fills up (short writes, then ENOSPC) or is read-only.

Both patch the ``os`` functions our file code calls, for paths under one directory only,
and behave as the kernel does: a write that meets the end of the space writes what fits
and returns that count; the next write raises ``OSError(ENOSPC)``; on a read-only tree
every open for writing, mkdir, rename and truncate raises ``OSError(EROFS)``.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _path_of(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


class FullDisk:
    """``left`` more bytes fit under ``root``; then writes are short, then ENOSPC."""

    def __init__(self, root: Path, left: int = 0) -> None:
        self.root = str(Path(root).resolve())
        self.left = left
        self.refused = 0

    def _ours(self, path: str) -> bool:
        return path.startswith(self.root)

    def write(self, real: Any, fd: int, data: Any) -> int:
        if not self._ours(_path_of(fd)):
            return int(real(fd, data))
        if self.left <= 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        chunk = bytes(data)[: self.left]
        written = int(real(fd, chunk))
        self.left -= written
        return written


@contextlib.contextmanager
def full_disk(monkeypatch: pytest.MonkeyPatch, root: Path, left: int = 0) -> Iterator[FullDisk]:
    disk = FullDisk(root, left)
    real = os.write
    with monkeypatch.context() as m:
        m.setattr(os, "write", lambda fd, data: disk.write(real, fd, data))
        yield disk


@contextlib.contextmanager
def read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> Iterator[None]:
    """Everything under ``root`` (existing or not) is on a read-only file system."""
    base = str(Path(root).resolve())

    def ours(path: Any) -> bool:
        try:
            return os.path.abspath(os.fsdecode(path)).startswith(base)
        except TypeError:
            return False

    def refuse() -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS))

    real_open, real_mkdir = os.open, os.mkdir
    real_replace, real_truncate, real_chmod = os.replace, os.truncate, os.chmod

    def fake_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if flags & _WRITE_FLAGS and ours(path):
            raise refuse()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def guard(real: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if ours(path):
                raise refuse()
            return real(path, *args, **kwargs)
        return call

    with monkeypatch.context() as m:
        m.setattr(os, "open", fake_open)
        m.setattr(os, "mkdir", guard(real_mkdir))
        m.setattr(os, "replace", guard(real_replace))
        m.setattr(os, "truncate", guard(real_truncate))
        m.setattr(os, "chmod", guard(real_chmod))
        yield


# -- files that are not files -----------------------------------------------------------------

def finishes(fn: Any, seconds: float = 20.0, *, fifo: Path | None = None) -> Any:
    """``fn()`` run in a thread: its value, or the test fails (never hangs) when it has not
    returned within ``seconds``; an exception it raised is raised here. ``fifo``: a FIFO the
    call may be stuck opening or reading — opened for writing and closed after a timeout, so
    the stuck thread ends too."""
    import threading

    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = fn()
        except BaseException as e:          # handed to the test's thread
            done["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"still running after {seconds:g} s (hung on a file that is not a file?)")
    if "error" in done:
        raise done["error"]
    return done.get("value")


def not_a_file(path: Path, kind: str) -> None:
    """Put a ``kind`` in place of ``path``: "fifo", "dir", "zero" (a symlink to /dev/zero),
    "dangling" (a symlink to nowhere)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "dir":
        path.mkdir()
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    else:
        raise ValueError(kind)


KIND_WORDS = {"fifo": "a FIFO", "dir": "a directory", "zero": "a symbolic link",
              "dangling": "a symbolic link"}


def resume_in_child(name: str, *, seconds: float = 60, memory: int = 2 << 30) -> dict[str, Any]:
    """``ChatSession.resume(name, provider=FakeProvider())`` in a child process with a bounded
    address space (``memory``), killed after ``seconds``: for files whose reading may grow
    without bound (a symlink to /dev/zero), so a regression fails the test and not the
    machine. Returns ``{"history": [texts] or None, "warnings": [...], "error": str or None}``."""
    import json
    import subprocess
    import sys
    import textwrap

    import ipy_ctxrecovery

    package_root = str(Path(ipy_ctxrecovery.__file__).resolve().parent.parent)
    script = textwrap.dedent(f"""
        import json, resource, sys, warnings
        resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
        sys.path[:0] = [{package_root!r}, {str(Path(__file__).resolve().parent)!r}]
        from fakes import FakeProvider
        from ipy_ctxrecovery import ChatSession
        out = {{"history": None, "warnings": [], "error": None}}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                s = ChatSession.resume({name!r}, provider=FakeProvider(window=10_000_000))
                out["history"] = [m.text for m in s.history]
            except BaseException as e:
                out["error"] = type(e).__name__ + ": " + str(e)[:300]
        out["warnings"] = [str(w.message)[:1000] for w in seen]
        print(json.dumps(out))
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"resume still running after {seconds:g} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        pytest.fail(f"resume's process ended with {done.returncode}: {done.stderr[-500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
