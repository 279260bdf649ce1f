"""Private files and directories: directories 0700, files 0600, checked writes, atomic replaces.

Shared by ``budget.ResultStore`` (persisted tool results) and ``transcript`` (the session's
log, history and metadata), so both keep the same promise (SPEC: files written are 0600,
directories 0700) in one place.

Every write goes through :func:`write_all`, which loops until the kernel took every byte
(``os.write`` may take fewer on a full disk), so a short write is never mistaken for a
whole one. :func:`append_record` never lets a torn record swallow the next one: a record
whose write failed is cut back off the file, and a record is preceded by a newline when
the file does not end with one (a crash mid-write left a torn last line).

:class:`SaveHealth` is how a session reports that its files cannot be written (disk
full, read-only directory): one warning per session, so a notebook keeps chatting with
one line saying nothing is being saved.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import warnings
from pathlib import Path

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "NotAFile",
    "SaveHealth",
    "append_record",
    "ensure_private_dir",
    "open_private",
    "read_regular",
    "write_all",
    "write_private_atomic",
]

DIR_MODE = 0o700
FILE_MODE = 0o600


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents as 0700 directories.

    Only directories created here are made private: an existing directory (a state dir
    the user chose, their home) keeps the mode its owner gave it.
    """
    missing: list[Path] = []
    d = path
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue                    # another process made it: not ours to chmod
        os.chmod(d, DIR_MODE)           # mkdir's mode is filtered by the umask
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    return path


class NotAFile(OSError):
    """What is at a session file's path is not a regular file (a FIFO, a directory, a
    symlink, a device), or is larger than a session file may be; ``strerror`` says which
    in words ("it is a FIFO, not a file")."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(errno.EINVAL, why, str(path))


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISLNK, "a symbolic link"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a FIFO")."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def not_a_file(path: Path) -> str | None:
    """What is at ``path`` ("a FIFO") when it is not a regular file (a symlink is not
    followed), None when a regular file or nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Opened without following a symlink and without blocking (a FIFO never hangs the
    reader), then checked on the open descriptor (``fstat``, no race with the path):
    anything but a regular file, or a file larger than ``limit``, raises :class:`NotAFile`
    saying what it is; a missing file raises ``FileNotFoundError`` as ``open`` does.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError:
        kind = not_a_file(path)     # a symlink (ELOOP), a socket (ENXIO)...
        if kind is not None:
            raise NotAFile(path, f"it is {kind}, not a file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(path, f"it is {kind_of(info.st_mode)}, not a file")
        if info.st_size > limit:
            raise NotAFile(path, f"it is {_size(info.st_size)}, more than the "
                                 f"{_size(limit)} a file of this kind may be")
        chunks: list[bytes] = []
        left = limit + 1                # a file growing while it is read is cut here too
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise NotAFile(path, f"it is more than the {_size(limit)} a file of this kind "
                                 "may be")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` creating ``path`` if needed (never through a symlink, never blocking on
    a FIFO), made 0600 either way; raises :class:`NotAFile` when what is there is not a
    regular file (a write to a FIFO would block once its buffer is full)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     FILE_MODE)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError:
        kind = not_a_file(path)
        if kind is not None:
            raise NotAFile(path, f"it is {kind}, not a file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(path, f"it is {kind_of(mode)}, not a file")
        # O_CREAT's mode is filtered by the umask and ignored for an existing file.
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, or raise ``OSError``.

    ``os.write`` may write fewer bytes than asked (a disk filling up, a file-size limit);
    the rest is retried until it goes or the kernel refuses with an error.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write() took {written} bytes")
        view = view[written:]


def append_record(path: Path, line: bytes) -> None:
    """Append one newline-terminated record to ``path`` (created 0600), all or nothing.

    One ``write`` per record keeps records whole when two processes append. A failed
    write is cut back off (when no other process appended meanwhile), so a full disk
    leaves no torn record; if the file does not end with a newline (a crash mid-write),
    the record starts on a new line, so the torn one never swallows it.
    """
    fd = open_private(path, os.O_RDWR | os.O_APPEND)
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            line = b"\n" + line
        try:
            write_all(fd, line)
        except OSError:
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_size <= start + len(line):
                    os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def write_private_atomic(path: Path, data: str | bytes, *, sync: bool = True,
                         mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) atomically: a 0600 temp file in the same
    directory, written in full (flushed to disk unless ``sync=False``), then renamed, so a
    reader never sees half a file and a failed write leaves the old file as it was.
    ``mode``: the permissions to give instead of 0600 (a user's existing file keeps its)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, FILE_MODE if mode is None else mode)
            write_all(fd, raw)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class SaveHealth:
    """Whether a session's files are being saved; warns once when they are not.

    ``failed(what, error)`` after a write that raised ``OSError``: the first failure of the
    session warns, naming the directory, the reason and what it means (a disk filling up
    fails some writes and not others, so one line, not one per write); ``ok()`` after a
    write that succeeded. The conversation itself goes on in memory.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.saving = True
        self.failures = 0

    def failed(self, what: str, error: OSError) -> None:
        self.failures += 1
        self.saving = False
        if self.failures > 1:
            return
        reason = error.strerror or str(error) or type(error).__name__
        if isinstance(error, IsADirectoryError | NotAFile):
            warnings.warn(
                f"cannot save {what} in {self.directory} ({reason}); the conversation goes "
                "on in memory, but nothing is being saved while this lasts — move what is "
                f"at {what} aside (it is not this session's file).", RuntimeWarning,
                stacklevel=4)
            return
        warnings.warn(
            f"cannot save this session's files in {self.directory} ({reason}, while "
            f"writing {what}); the conversation goes on in memory, but nothing is being "
            "saved while this lasts — free some space or set IPY_CTXRECOVERY_DIR to a "
            "writable directory.", RuntimeWarning, stacklevel=4)

    def ok(self) -> None:
        self.saving = True
