"""Private files and directories: directories 0700, files 0600, whole-file writes atomic.

Shared by ``budget.ResultStore`` (persisted tool results) and ``transcript`` (the session's
log, history and metadata), so both keep the same promise (SPEC: files written are 0600,
directories 0700) in one place.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["DIR_MODE", "FILE_MODE", "ensure_private_dir", "open_private", "write_private_atomic"]

DIR_MODE = 0o700
FILE_MODE = 0o600


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents as 0700 directories; the leaf ends up 0700."""
    missing: list[Path] = []
    d = path
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
        os.chmod(d, DIR_MODE)           # mkdir's mode is filtered by the umask
    # An existing directory keeps its mode: the leaf is ours, so make it private.
    if path.stat().st_mode & 0o777 != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open`` creating ``path`` if needed, the file made 0600 either way."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    # O_CREAT's mode is filtered by the umask and ignored for an existing file.
    os.fchmod(fd, FILE_MODE)
    return fd


def write_private_atomic(path: Path, data: str | bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) atomically: a 0600 temp file in the same
    directory, flushed to disk (``durable=False``: left to the kernel's writeback), then
    renamed, so a reader never sees half a file."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
