"""Where a session's data lives on disk: the append-only transcript, the history snapshot and its journal.

Layout: the root is ``$IPY_CTXRECOVERY_DIR``, else
``$XDG_STATE_HOME/ipy_ctxrecovery``, else ``~/.local/state/ipy_ctxrecovery``. A session
named S owns ``<root>/sessions/S/`` (0700) holding:

- ``transcript.jsonl`` (0600): one JSON record per line, appended as the conversation
  goes and never rewritten. ``{"type": "message", "ts": ..., "message": Message.to_dict()}``
  for every message said (the user's, the assistant's final answers, tool calls and their
  full results); ``{"type": "reset", "ts": ...}`` when the working history was reset.
  What the package itself writes for the model (SYSTEM NOTICE, summaries, continuation
  prompts) is not "said" and lives only in the snapshot.
- ``history.json`` (0600) and ``history.journal`` (0600): the working history (what the
  model sees), so ``resume`` restores exactly what the model saw. The snapshot
  ``{"version": 2, "generation": g, "messages": [...]}`` is rewritten (atomically) only
  when the history stops being an extension of what is on disk — compaction, undo,
  reset, a recovery that cut messages — and on close. Every other turn appends one line
  to the journal, ``{"gen": g, "base": n, "set": [[i, message], ...], "add": [...]}``:
  the messages the turn added after the first ``n``, and the few earlier ones it
  replaced (microcompact previews). So a turn writes O(its new messages), not O(history).
- the session's counters (tokens used, in all and by model, turns answered, compactions,
  recoveries) ride on the same writes: ``"counters": {...}`` (totals, not increments) in the snapshot and in
  every journal line of a turn that changed them — a turn that added no message (failed,
  or not recorded) writes a line with nothing in ``add`` but its counters. Counters are a
  few dozen bytes and cost no extra file, write or fsync per turn; on load the last
  applied line's counters win (else the snapshot's), so a kill loses at most the turn in
  flight's counts, as it loses its messages. A journal that cannot be replayed keeps the
  snapshot's counters; no snapshot: they start from zero. The history from before a
  compaction is not kept on disk (the transcript has what was said, not the summaries
  and notices the model saw), so a compaction cannot be undone after a resume.
- ``session.json`` (0600): the model string and the system prompt (never a key).
- ``learned.json`` (0600): what the session learned (caps, window, calibration...), written
  atomically when it changed; its format and restore rules live in ``learned.py``.
- ``results/`` (0700): the budget's persisted tool results (``budget.ResultStore``).

What is written passes through the session's ``Redactor`` (``redactor.py``): its own
credentials and well-known secret formats are masked on disk, never in what is sent.

Crash safety (a process killed at any point loses at most the turn in flight): a journal
line is one ``write``; the user's message is queued (``append(later=True)``) and written
while its request is in flight, at the latest when the turn ends, failed or not; a torn
last line (the turn in flight) is skipped on load; journal
lines of another generation (a kill between a snapshot's rename and the journal's reset)
are ignored; a journal line whose ``base`` does not follow from the lines before it is
damage, and the history is then rebuilt from the transcript. Power loss is not covered
beyond what the snapshot's fsync gives: appends are not fsynced (an fsync per turn would
cost more than the rest of the turn's bookkeeping).

Writes that fail (disk full, read-only directory) never raise: the session goes on in
memory, one warning says nothing is being saved (``_files.SaveHealth``), transcript
records that could not be written are kept and written with the next record that can be,
and the next successful history write is a whole snapshot. Reads never raise for a bad
file either: each unreadable line or file gives one sentence naming the file and line,
and the rest of the session opens.

Only regular files are read, each up to a bound (:data:`TRANSCRIPT_MAX`,
:data:`HISTORY_MAX`, :data:`SMALL_MAX`; ``_files.read_regular``): a FIFO, a directory, a
symlink or a device in a file's place is named ("it is a FIFO, not a file") and never
waited on or followed. A transcript that is not a file is a damaged session, not a missing
one (:meth:`Transcript.damage`). Each history save also records ``"said"``, the number of
message records the transcript holds (in the snapshot, and in a journal line when it
changed): a load that finds more turns said after it than the one in flight (a deleted
snapshot, an emptied or cut journal, a generation edited by hand) rebuilds the working
history from the transcript, with one warning. A directory deleted while its session is
open is made again at the next write (:meth:`Transcript._still_there`), with one warning.

Nothing here is global: each :class:`Transcript` belongs to one session object.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import operator
import os
import re
import socket
import stat
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._files import (
    DIR_MODE,
    FILE_MODE,
    SaveHealth,
    append_record,
    ensure_private_dir,
    not_a_file,
    open_private,
    read_regular,
    write_private_atomic,
)
from ..core.history import (
    Block,
    Compaction,
    History,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
)
from ..core.pairing import repair_pairing
from ..errors import ConfigError, SessionInUse
from .redactor import Redactor

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "LOCK_FILE",
    "SavedSession",
    "Transcript",
    "archive",
    "data_root",
    "held_elsewhere",
    "is_generated_name",
    "list_sessions",
    "message_from_dict",
    "saved_sessions",
    "session_dir",
    "validate_name",
]

ENV_DIR = "IPY_CTXRECOVERY_DIR"
SNAPSHOT_VERSION = 2
"""``history.json`` format; version 1 (no generation, no journal) is still read."""
JOURNAL_MAX_REPLACED = 16
"""A turn that replaced more earlier messages than this is written as a whole snapshot."""
TRANSCRIPT_MAX = 1 << 30
"""The most bytes of ``transcript.jsonl`` read (1 GiB); a larger one is named, not read."""
HISTORY_MAX = 256 << 20
"""The most bytes of ``history.json`` or ``history.journal`` read (256 MiB: a working
history is bounded by a context window); a larger one is rebuilt from the transcript."""
SMALL_MAX = 16 << 20
"""The most bytes of ``session.json`` or ``learned.json`` read (16 MiB)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def data_root() -> Path:
    """The per-user data directory root (not created here)."""
    explicit = os.environ.get(ENV_DIR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "ipy_ctxrecovery"


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe session name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"session name {name!r} is not valid; use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    return name


_GENERATED_RE = re.compile(r"^session-\d{8}-\d{6}-\d+-\d+$")


def is_generated_name(name: str) -> bool:
    """True for the name a session given none gets (``session-<date>-<time>-<pid>-<n>``,
    ``ChatSession``): on disk, that is how a kernel's unnamed default session is kept."""
    return bool(_GENERATED_RE.match(name))


def session_dir(name: str) -> Path:
    return data_root() / "sessions" / validate_name(name)


def list_sessions() -> list[str]:
    """Names of the sessions that have a transcript on disk, sorted (with the ones whose
    transcript is not a file: :meth:`Transcript.damage` names what it is)."""
    root = data_root() / "sessions"
    try:
        return sorted(p.name for p in root.iterdir()
                      if _NAME_RE.match(p.name) and os.path.lexists(p / "transcript.jsonl"))
    except OSError:
        return []


LOCK_FILE = ".lock"
"""The file a session's writer holds a lock on (its content names the holder)."""


def _holder(fd: int) -> str:
    """Who holds the lock on ``fd``'s file, in words ("pid 42 on host, since 14:02")."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%H:%M", time.localtime(float(data["since"])))
        return f"pid {int(data['pid'])} on {data['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


_HELD_HERE: dict[Path, weakref.ref[Transcript]] = {}
"""Lock files this process holds, and the Transcript holding each. A POSIX lock belongs to
the process, so it cannot tell two writers in one process apart, and it is released when
*any* descriptor of its file is closed: a file held here is never opened again, neither to
be probed nor by a second writer (which would free the first one's lock when it closed)."""


def _holder_here(path: Path) -> Transcript | None:
    ref = _HELD_HERE.get(path)
    holder = ref() if ref is not None else None
    if holder is None:
        _HELD_HERE.pop(path, None)
    return holder


def in_use_sentence(name: str, where: str) -> str:
    """The one sentence a second writer of session ``name`` gets, wherever the first is."""
    return (f"session {name!r} is open {where}; close it there, or start a conversation of "
            f"your own under another name (%%chat -S {_other_name(name)}).")


def held_elsewhere(name: str) -> str | None:
    """Who holds session ``name`` open for writing in another process, or None."""
    path = session_dir(name) / LOCK_FILE
    if _holder_here(path) is not None:
        return None
    try:
        # Never blocking on, or following, what is not a file there (a FIFO, a symlink).
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return _holder(fd)
    else:
        # Not held: this probe held it for a moment; closing releases it.
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class SavedSession:
    """One session on disk, as ``%chat sessions`` lists it."""

    name: str
    messages: int
    size: int
    last_used: float
    first_words: str
    open_elsewhere: str | None
    damage: str | None = None
    """Why it cannot be opened ("transcript.jsonl is a FIFO, not a file"), if it cannot."""


def saved_sessions() -> list[SavedSession]:
    """Every session on disk, most recently used first."""
    found = []
    for name in list_sessions():
        files = Transcript(name)
        try:
            info = files.path.lstat()
        except OSError:
            continue
        kind = not_a_file(files.path)
        if kind is not None:
            found.append(SavedSession(name, 0, 0, info.st_mtime, "", None,
                                      f"{files.path.name} is {kind}, not a file"))
            continue
        messages = 0
        first = ""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a damaged line is named when it is opened
            for record in files.records():
                if record.get("type") != "message":
                    continue
                messages += 1
                data = record.get("message")
                if not first and isinstance(data, dict) and data.get("role") == "user":
                    with contextlib.suppress(ValueError):
                        first = " ".join(message_from_dict(data).text.split())[:60]
        found.append(SavedSession(name, messages, info.st_size, info.st_mtime, first,
                                  held_elsewhere(name)))
    return sorted(found, key=lambda s: s.last_used, reverse=True)


def _other_name(name: str) -> str:
    """A free session name like ``name`` (``NAME-2``, ``NAME-3``…), to suggest.

    ``--new`` is no way out while another process holds ``name``: setting its files aside
    needs them free (:func:`archive`)."""
    n = 2
    while os.path.lexists(session_dir(f"{name[:90]}-{n}") / "transcript.jsonl"):
        n += 1
    return f"{name[:90]}-{n}"


def archive(name: str) -> str | None:
    """Keep session ``name``'s conversation under a name of its own (``NAME.YYYYmmdd-HHMMSS``)
    so a new one can start under ``name``; None when there is nothing to keep. Raises
    SessionInUse when another process has it open."""
    if not Transcript.exists(name):
        return None
    holder = held_elsewhere(name)
    if holder is not None:
        raise SessionInUse(f"session {name!r} is open in another process ({holder}); it "
                           "cannot be set aside while it is in use — close it there or use "
                           "another name.")
    source = session_dir(name)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(source.joinpath(
        "transcript.jsonl").lstat().st_mtime))
    kept = f"{name[:80]}.{stamp}"
    n = 1
    while session_dir(kept).exists():
        n += 1
        kept = f"{name[:80]}.{stamp}-{n}"
    os.rename(source, session_dir(kept))
    return kept


# -- reading our JSON forms strictly --------------------------------------------------------

def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    return value


def _opt_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _block(data: Any) -> Block:
    if not isinstance(data, Mapping):
        raise ValueError("a content block is not an object")
    kind = data.get("type")
    if kind == "text":
        return Text(_str(data.get("text"), "a text block's text"))
    if kind == "reasoning":
        return Reasoning(_str(data.get("text"), "a reasoning block's text"),
                         _opt_str(data.get("signature"), "a reasoning signature"),
                         _opt_str(data.get("id"), "a reasoning item's id"))
    if kind == "compaction":
        return Compaction(_str(data.get("wire"), "a compaction's wire"),
                          _str(data.get("data"), "a compaction's data"),
                          _opt_str(data.get("summary"), "a compaction's summary"))
    if kind == "tool_call":
        return ToolCall(_str(data.get("id"), "a tool call's id"),
                        _str(data.get("name"), "a tool call's name"),
                        _str(data.get("arguments", "{}"), "a tool call's arguments"))
    if kind == "tool_result":
        return ToolResult(_str(data.get("call_id"), "a tool result's call_id"),
                          _str(data.get("content"), "a tool result's content"),
                          bool(data.get("is_error")),
                          _opt_str(data.get("name"), "a tool result's name"))
    raise ValueError(f"a content block has unknown type {kind!r}")


def message_from_dict(data: Any) -> Message:
    """A :class:`Message` from its ``to_dict`` form, checked field by field.

    Raises ``ValueError`` with a short reason (``the role 'robot' is not known``) for
    anything ``to_dict`` could not have written, so a hand edit or damage is reported,
    not carried into a request.
    """
    if not isinstance(data, Mapping):
        raise ValueError("the message is not a JSON object")
    role = data.get("role")
    if role is None:
        raise ValueError("the message has no role")
    try:
        parsed = Role(role)
    except (ValueError, TypeError):
        raise ValueError(f"the role {role!r} is not known (system, user, assistant or tool)") \
            from None
    blocks = data.get("blocks", ())
    if not isinstance(blocks, list | tuple):
        raise ValueError("the message's blocks are not a list")
    meta = data.get("meta", {})
    if not isinstance(meta, Mapping):
        raise ValueError("the message's meta is not an object")
    message = Message(parsed, tuple(_block(b) for b in blocks),
                      _opt_str(data.get("tag"), "the message's tag"), dict(meta))
    if parsed is Role.TOOL and message.tool_result is None:
        raise ValueError("a tool message has no tool result")
    return message


_WRITTEN_MAX = 256     # messages kept encoded between the transcript and the journal
_RECORD_TYPES = ("message", "reset")
_MESSAGE_HEAD = b'{"type": "message", '


def _dumps(value: Any) -> bytes:
    """One JSON line as UTF-8; text with lone surrogates (possible in provider JSON) is
    written with JSON escapes, which read back to the same string."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value).encode("ascii")


def _counters(value: Any) -> dict[str, int]:
    """A session's counters as stored: whole numbers ≥ 0 by name; anything else (damage,
    a hand edit) is left out, so that counter starts from zero."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items()
            if isinstance(k, str) and type(v) is int and v >= 0}


class _Problems:
    """Bad lines of one file, reported as one sentence when reading it ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[tuple[int, str]] = []

    def add(self, line: int, why: str) -> None:
        self.lines.append((line, why))

    def warn(self, consequence: str) -> None:
        if not self.lines:
            return
        first, why = self.lines[0]
        if first == 0:
            warnings.warn(f"{self.path} could not be read ({why}); {consequence}",
                          RuntimeWarning, stacklevel=4)
            return
        if len(self.lines) == 1:
            where = f"line {first} ({why})"
        else:
            more = ", ".join(str(n) for n, _ in self.lines[1:6])
            extra = "…" if len(self.lines) > 6 else ""
            where = f"lines {first} ({why}), {more}{extra}"
        warnings.warn(f"{self.path}: {where} could not be read and "
                      f"{'was' if len(self.lines) == 1 else 'were'} skipped; {consequence}",
                      RuntimeWarning, stacklevel=4)


def _json_lines(path: Path, problems: _Problems, limit: int,
                ) -> Iterator[tuple[int, dict[str, Any], bool]]:
    """``(line number, record, is last line)`` for each JSON-object line of ``path`` (a
    regular file of at most ``limit`` bytes, else ``NotAFile``).

    Lines that are not UTF-8, not JSON or not an object are added to ``problems``; a last
    line without its newline is a write cut short (a crash, a full disk).
    """
    raw_lines = read_regular(path, limit).split(b"\n")
    complete = raw_lines[-1] == b""
    if complete:
        raw_lines.pop()
    count = len(raw_lines)
    for index, raw in enumerate(raw_lines, start=1):
        last = index == count
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.add(index, f"byte {e.start + 1} is not UTF-8")
            continue
        try:
            record = json.loads(text)
        except ValueError:
            torn = last and not complete
            problems.add(index, "cut off mid-write" if torn else "not valid JSON")
            continue
        except RecursionError:
            problems.add(index, "nested too deeply")
            continue
        if not isinstance(record, dict):
            problems.add(index, f"a JSON {type(record).__name__}, not an object")
            continue
        yield index, record, last


class Transcript:
    """One session's files. Nothing is written until something is said (:meth:`create`);
    nothing is ever deleted.

    One writer per session: while a process has the session open for writing it holds an
    exclusive lock on ``.lock`` in its directory (released when it closes, or dies); another
    process that tries gets :class:`~ipy_ctxrecovery.errors.SessionInUse`, naming the holder.
    A directory that cannot be created (read-only, disk full) is not an error: the
    session runs in memory and :attr:`health` warns once that nothing is being saved.
    """

    def __init__(self, name: str, *, redactor: Redactor | None = None) -> None:
        self.name = validate_name(name)
        #: Masks secrets in every message and text written here (README "Files and privacy").
        self.redactor = redactor
        self.directory = session_dir(name)
        self.results_dir = self.directory / "results"
        self.path = self.directory / "transcript.jsonl"
        self.history_path = self.directory / "history.json"
        self.journal_path = self.directory / "history.journal"
        self.meta_path = self.directory / "session.json"
        self.learned_path = self.directory / "learned.json"
        self.health = SaveHealth(self.directory)
        self._pending: list[bytes] = []            # transcript records not written yet
        self._later: list[tuple[float, Message]] = []  # messages append(later=True) queued
        # This turn's messages as written to the transcript (masked, JSON), by id: the
        # journal line at the turn's end carries the same bytes (``_message_json``).
        self._written: dict[int, tuple[Message, bytes]] = {}
        self._persisted: History | None = None     # what snapshot + journal hold, if known
        #: The session's counters as the snapshot and journal hold them (after
        #: :meth:`load_history`, what a resume restores; see the module doc).
        self.counters: dict[str, int] = {}
        self._generation = 0
        self._journal_lines = 0
        # Message records in transcript.jsonl (known once it was read, kept by the appends):
        # saved as the counter "said" with the history, so a load sees what it lacks.
        self._said_count: int | None = None
        self._said_saved: int | None = None        # ... as the history on disk says
        self._meta: bytes | None = None             # session.json and learned.json as last
        self._learned: str | None = None            # written, for a directory made again
        self._lock_fd: int | None = None
        self._lock_path = self.directory / LOCK_FILE
        self._claimed = time.time()
        self.created = self.path.is_file()

    @staticmethod
    def exists(name: str) -> bool:
        """Whether session ``name`` is saved: its transcript is on disk — or something that
        is not a file is in its place (a damaged session, not a missing one:
        :meth:`damage` says what it is, and ``resume`` refuses with that sentence)."""
        return os.path.lexists(session_dir(name) / "transcript.jsonl")

    @staticmethod
    def damage(name: str) -> str | None:
        """Why saved session ``name`` cannot be opened, as one sentence (its transcript is
        a FIFO, a directory, a symlink...), or None."""
        path = session_dir(name) / "transcript.jsonl"
        kind = not_a_file(path)
        if kind is None:
            return None
        return (f"session {name!r} cannot be opened: {path} is {kind}, not a file; put the "
                "session's transcript back there, or start a conversation under another "
                "name.")

    # -- lifecycle: created on the first word, one writer, closed -------------------------
    def create(self) -> None:
        """Make the session's files exist (its first record is about to be written) and
        hold the writer's lock."""
        if self.created:
            self._still_there()
            self.claim()
            return
        try:
            # Every level we create is private, not just the leaf (mkdir's parents get
            # the umask); levels that exist keep their owner's mode.
            ensure_private_dir(data_root())
            ensure_private_dir(data_root() / "sessions")
            ensure_private_dir(self.directory)
            ensure_private_dir(self.results_dir)
            self.claim()
            if not self.path.exists():
                os.close(open_private(self.path, os.O_WRONLY))
            self.created = True
        except OSError as e:
            self.health.failed("its directory", e)

    def _still_there(self) -> None:
        """Before a write: a directory deleted while the session is in use (by hand, a
        clean-up job) is made again — private, with its lock, its metadata and learned
        state, and a whole history snapshot at the next save — with one warning, so what is
        said from now on is saved. The transcript starts again from the next record."""
        if not self.created or self.directory.is_dir():
            return
        try:
            for level in (data_root(), data_root() / "sessions", self.directory,
                          self.results_dir):
                ensure_private_dir(level)
        except OSError as e:
            self.health.failed("its directory", e)
            return
        if self._lock_fd is not None:      # its lock file went with the directory
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        with contextlib.suppress(SessionInUse):
            self.claim()
        self._persisted = None
        self._journal_lines = 0
        self._said_count, self._said_saved = 0, None
        warnings.warn(f"{self.directory} was deleted while session {self.name!r} was in use; "
                      "it was made again, and what is said from now on is saved there (the "
                      "working history in full, the transcript from here on).",
                      RuntimeWarning, stacklevel=4)
        for path, data in ((self.meta_path, self._meta), (self.learned_path, self._learned)):
            if data is not None:
                with contextlib.suppress(OSError):
                    write_private_atomic(path, data)

    def claim(self) -> None:
        """Hold the writer's lock on this session (no-op when held already, or when the
        directory does not exist). Raises SessionInUse when another process holds it."""
        if self._lock_fd is not None:
            return
        holder = _holder_here(self._lock_path)
        if holder is not None and holder is not self:
            raise SessionInUse(in_use_sentence(
                self.name, f"in this process already (another ChatSession, {holder.since})"))
        # Held for this process's other writers even before its directory exists: two new
        # sessions of one name would otherwise write one transcript.
        _HELD_HERE[self._lock_path] = weakref.ref(self)
        if not self.directory.is_dir():
            return
        try:
            fd = open_private(self.directory / LOCK_FILE, os.O_RDWR)
        except OSError:
            return                          # a read-only directory: nobody can write here
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            other = _holder(fd)
            os.close(fd)
            del _HELD_HERE[self._lock_path]
            raise SessionInUse(in_use_sentence(self.name, f"in another process ({other})")) \
                from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": self._claimed}).encode(), 0)
        self._lock_fd = fd

    @property
    def since(self) -> str:
        """When this writer took the session, in words ("since 14:02")."""
        return "since " + time.strftime("%H:%M", time.localtime(self._claimed))

    def release(self) -> None:
        """Let another writer, here or in another process, write this session (on close).
        Only the holder releases: closing a second handle never frees the first's lock."""
        if _holder_here(self._lock_path) is self:
            del _HELD_HERE[self._lock_path]
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)   # closing releases the lock
            self._lock_fd = None

    # -- the append-only log ------------------------------------------------------------
    def _append_record(self, record: Mapping[str, Any] | None) -> None:
        self._append_line(_dumps(record) + b"\n" if record is not None else None)

    def _append_line(self, line: bytes | None) -> None:
        self.create()
        # Queued messages go first, so the log keeps the order things were said in (all
        # encoded before any is taken: masking may stop at the turn's deadline).
        self._pending.extend([self._message_line(ts, message) for ts, message in self._later])
        self._later.clear()
        if line is not None:
            self._pending.append(line)
        if self._said_count is None:
            self._count_said()
        try:
            # Records that could not be written before go first, in order, in one write.
            append_record(self.path, b"".join(self._pending))
        except OSError as e:
            self.health.failed(self.path.name, e)
            return
        if self._said_count is not None:
            self._said_count += sum(p.startswith(_MESSAGE_HEAD) for p in self._pending)
        self._pending.clear()
        self.health.ok()

    def _count_said(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # a damaged line is named when it is read
            self._said()

    def append(self, message: Message, *, later: bool = False) -> None:
        """Write ``message`` to the log. ``later``: only queue it (its time is now) for
        :meth:`flush` or the next record, whichever comes first — the session queues the
        user's message and writes it, masked, while the request is in flight."""
        if later:
            self._later.append((time.time(), message))
            return
        self._append_line(self._message_line(time.time(), message))

    def flush(self) -> None:
        """Write the messages :meth:`append` queued (nothing when none is)."""
        if self._later:
            self._append_record(None)

    def _message_line(self, ts: float, message: Message) -> bytes:
        # ``{"type": "message", "ts": ts, "message": {...}}`` as ``_dumps`` writes it.
        return (_dumps({"type": "message", "ts": ts})[:-1] + b', "message": '
                + self._message_json(message) + b"}\n")

    def _message_json(self, message: Message) -> bytes:
        """``message`` as stored (masked), as JSON: masked and encoded once a turn — its
        transcript line and the turn's journal line carry the same bytes."""
        known = self._written.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        data = _dumps(self._stored(message).to_dict())
        if len(self._written) >= _WRITTEN_MAX:      # turns that save no history
            self._written.clear()
        self._written[id(message)] = (message, data)
        return data

    def _encoded(self, message: Message) -> bytes:
        """``_message_json(message)`` without remembering it (a snapshot's many messages)."""
        known = self._written.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        return _dumps(self._stored(message).to_dict())

    def _stored(self, message: Message) -> Message:
        return self.redactor.message(message) if self.redactor is not None else message

    def mark(self, kind: str, **fields: Any) -> None:
        """Record a non-message event (``reset``) in the log."""
        self._append_record({"type": kind, "ts": time.time(), **fields})

    def _records(self, problems: _Problems) -> Iterator[tuple[int, dict[str, Any]]]:
        try:
            for index, record, _ in _json_lines(self.path, problems, TRANSCRIPT_MAX):
                yield index, record
        except (FileNotFoundError, NotADirectoryError):  # nothing saved there
            return
        except OSError as e:
            problems.add(0, e.strerror or type(e).__name__)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every readable record in order; unreadable lines are skipped with one warning."""
        problems = _Problems(self.path)
        for _, record in self._records(problems):
            yield record
        problems.warn("the rest of the transcript is kept.")

    def _said(self) -> tuple[list[tuple[int, dict[str, Any]]], _Problems]:
        """The records that read as what we write (messages checked field by field), and
        the lines that do not; counts the messages (the counter "said")."""
        problems = _Problems(self.path)
        entries: list[tuple[int, dict[str, Any]]] = []
        for index, record in self._records(problems):
            kind = record.get("type")
            if kind not in _RECORD_TYPES:
                problems.add(index, f"its type {kind!r} is not known" if isinstance(kind, str)
                             else "it has no type" if kind is None
                             else "its type is not a string")
                continue
            if kind == "message":
                try:
                    message_from_dict(record.get("message"))
                except ValueError as e:
                    problems.add(index, str(e))
                    continue
            entries.append((index, record))
        self._said_count = sum(r["type"] == "message" for _, r in entries)
        return entries, problems

    def messages(self) -> History:
        """Every message said, in order; unreadable lines are skipped with one warning."""
        entries, problems = self._said()
        problems.warn("the rest of the transcript is kept.")
        return tuple(message_from_dict(r["message"]) for _, r in entries
                     if r.get("type") == "message")

    def working_messages(self) -> History:
        """The working history rebuilt from the transcript: what was said since the last
        reset (the system prompt kept), tool pairing repaired. Messages the user reset
        away never come back."""
        entries, problems = self._said()
        problems.warn("the rest of the transcript is kept.")
        current: list[Message] = []
        for _, record in entries:
            if record.get("type") == "reset":
                system = [m for m in current if m.role is Role.SYSTEM][-1:]
                current = system
            elif record.get("type") == "message":
                current.append(message_from_dict(record["message"]))
        rebuilt, _ = repair_pairing(tuple(current))
        return rebuilt

    # -- the working-history snapshot and its journal ----------------------------------------
    def has_history(self) -> bool:
        return self.history_path.is_file()

    def save_history(self, history: History,
                     counters: Mapping[str, int] | None = None) -> None:
        """Persist the working history and the session's ``counters`` (None: unchanged)
        after a turn: a journal line when ``history`` extends what is on disk, else a
        whole snapshot (see the module doc)."""
        if not self.created:
            return                  # nothing said yet: nothing saved
        self._still_there()
        new_counters = dict(counters) if counters is not None else self.counters
        line = self._journal_line(history, new_counters)
        if line is None:
            self.checkpoint(history, new_counters)     # the turn's messages encoded once
            self._written.clear()
            return
        self._written.clear()
        if not line:
            return
        try:
            append_record(self.journal_path, line)
        except OSError as e:
            self.health.failed(self.journal_path.name, e)
            self._persisted = None          # the next write is a whole snapshot
            return
        self._persisted = history
        self.counters = new_counters
        self._said_saved = self._said_count
        self._journal_lines += 1
        self.health.ok()

    def _journal_line(self, history: History, counters: dict[str, int]) -> bytes | None:
        """The journal line taking what is on disk to ``history`` and ``counters`` (b""
        when nothing changed), None when only a snapshot can (not an extension)."""
        old = self._persisted
        if old is None or len(history) < len(old):
            return None
        replaced: list[list[Any]] = []
        # Nearly every turn only appends: the kept prefix is the same objects, checked at C
        # speed before the per-message comparison a replaced message needs.
        unchanged = all(map(operator.is_, old, history))
        for i, (before, now) in enumerate(() if unchanged else zip(old, history, strict=False)):
            if now is before or (now == before and now.meta == before.meta):
                continue
            if len(replaced) >= JOURNAL_MAX_REPLACED:
                return None
            replaced.append([i, self._stored(now).to_dict()])
        added = history[len(old):]
        changed = counters != self.counters
        said = self._said_count if self._said_count != self._said_saved else None
        if not replaced and not added and not changed and said is None:
            return b""
        # ``{"gen": g, "base": n, "set": [...], ["counters": {...},] ["said": n,] "add":
        # [...]}`` as ``_dumps`` writes it.
        head = _dumps({"gen": self._generation, "base": len(old), "set": replaced,
                       **({"counters": counters} if changed else {}),
                       **({"said": said} if said is not None else {})})
        return (head[:-1] + b', "add": [' + b", ".join(map(self._message_json, added))
                + b"]}\n")

    def checkpoint(self, history: History, counters: Mapping[str, int] | None = None) -> None:
        """Write ``history`` and ``counters`` (None: unchanged) as a whole snapshot and
        empty the journal (close, compaction)."""
        if not self.created:
            return                  # nothing said yet: nothing saved
        self._still_there()
        new_counters = dict(counters) if counters is not None else self.counters
        if (history is self._persisted and self._journal_lines == 0 and self.has_history()
                and new_counters == self.counters and self._said_count == self._said_saved):
            return
        generation = self._generation + 1
        head = _dumps({"version": SNAPSHOT_VERSION, "generation": generation,
                       "counters": new_counters,
                       **({"said": self._said_count} if self._said_count is not None else {})})
        # ``{..., "messages": [...]}`` as ``_dumps`` writes it; a message the turn already
        # masked and encoded for the transcript is not masked again.
        data = (head[:-1] + b', "messages": [' + b", ".join(map(self._encoded, history))
                + b"]}")
        try:
            write_private_atomic(self.history_path, data)
        except OSError as e:
            self.health.failed(self.history_path.name, e)
            self._persisted = None
            return
        self._generation = generation
        self._persisted = history
        self.counters = new_counters
        self._said_saved = self._said_count
        self._journal_lines = 0
        try:
            # Lines left in the journal are of the old generation and ignored on load;
            # emptying it only saves replaying them.
            if self.journal_path.exists():
                os.truncate(self.journal_path, 0)
        except OSError:
            pass
        self.health.ok()

    def load_history(self) -> History | None:
        """The working history: the snapshot with its journal replayed; None when there is
        none. Later :meth:`save_history` calls journal against what this returned.

        A snapshot or journal that cannot be read (damage, a hand edit) is not fatal: the
        transcript holds every message said, so the working history is rebuilt from it
        (since the last reset, tool pairing repaired) with one warning.
        """
        try:
            raw = read_regular(self.history_path, HISTORY_MAX)
        except (FileNotFoundError, NotADirectoryError):  # nothing saved there
            if self._unsaved_turns(0) >= 2:     # more than a first turn in flight: lost
                return self._rebuilt(self.history_path, "it is missing")
            return None
        except OSError as e:
            return self._rebuilt(self.history_path, e.strerror or type(e).__name__)
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
                raise ValueError("it is not a history snapshot")
            version = data.get("version")
            if version not in (1, SNAPSHOT_VERSION):
                raise ValueError(f"its format version {version!r} is not known")
            generation = data.get("generation", 0)
            if not isinstance(generation, int) or isinstance(generation, bool) \
                    or generation < 0:
                raise ValueError("its generation is not a number ≥ 0")
            current = [message_from_dict(m) for m in data["messages"]]
            self.counters = _counters(data.get("counters"))
            said = data.get("said")
        except UnicodeDecodeError:
            return self._rebuilt(self.history_path, "it is not UTF-8")
        except RecursionError:
            return self._rebuilt(self.history_path, "it is nested too deeply")
        except ValueError as e:
            why = str(e) if not isinstance(e, json.JSONDecodeError) else "it is not valid JSON"
            return self._rebuilt(self.history_path, why)
        history, applied, damage, counters, said = self._replay(current, generation, said)
        if history is None:
            return self._rebuilt(self.journal_path, damage)
        self.counters = counters
        lost = self._unsaved_turns(said) if type(said) is int and said >= 0 else 0
        if lost >= 2:
            # More turns said than the one in flight are missing: an emptied or cut
            # journal, a generation changed by hand. The transcript has them.
            warnings.warn(
                f"the working history saved in {self.directory} (history.json and "
                f"history.journal) is behind its transcript ({lost} turns said are not in "
                "it); it was rebuilt from the transcript (since its last reset).",
                RuntimeWarning, stacklevel=2)
            return self._rebuild()
        self._said_saved = said if type(said) is int else None
        self._generation = generation
        # A torn or stale journal is rewritten as a snapshot by the next save.
        self._persisted = history if applied is not None else None
        self._journal_lines = applied or 0
        return history

    def _replay(self, current: list[Message], generation: int, said: Any,
                ) -> tuple[History | None, int | None, str, dict[str, int], Any]:
        """Apply the journal's lines of ``generation``.

        Returns (history, lines applied — None when the journal must be rewritten,
        damage, counters, said): history is None when the journal is damaged, ``damage``
        then says how; counters and said are the last applied line's (else the
        snapshot's ``said``).
        """
        problems = _Problems(self.journal_path)
        clean = True
        counters = self.counters
        try:
            lines = list(_json_lines(self.journal_path, problems, HISTORY_MAX))
        except (FileNotFoundError, NotADirectoryError):  # nothing saved there
            return tuple(current), 0, "", counters, said
        except OSError as e:
            return None, None, e.strerror or type(e).__name__, counters, said
        bad = {n for n, _ in problems.lines}
        last_line = max([n for n, _, _ in lines] + list(bad), default=0)
        if bad - {last_line}:
            line = min(bad)
            return None, None, f"line {line}: {dict(problems.lines)[line]}", counters, said
        if bad:
            # The last line was being written when the process stopped: the turn in flight.
            problems.warn("it was the turn in flight when the session stopped; the "
                          "transcript still has what was said in it.")
            clean = False
        applied = 0
        for index, record, _ in lines:
            if record.get("gen") != generation:
                clean = False
                continue
            try:
                base, replaced, added = record["base"], record["set"], record["add"]
                if base != len(current):
                    raise ValueError("it does not follow from the lines before it")
                new = list(current)
                for i, m in replaced:
                    if not 0 <= i < base:
                        raise ValueError("it replaces a message that is not there")
                    new[i] = message_from_dict(m)
                new.extend(message_from_dict(m) for m in added)
            except (KeyError, TypeError, ValueError) as e:
                return None, None, (f"line {index}: {e}" if isinstance(e, ValueError)
                                    else f"line {index} is not a journal entry"), counters, said
            current = new
            if "counters" in record:
                counters = _counters(record["counters"])
            said = record.get("said", said)
            applied += 1
        return tuple(current), applied if clean else None, "", counters, said

    def _unsaved_turns(self, said: int) -> int:
        """How many user messages the transcript has after its first ``said`` messages:
        the turns the saved history does not hold (the turn in flight is at most one)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # a damaged line is named when it is read
            entries, _ = self._said()
        messages = [r["message"] for _, r in entries if r["type"] == "message"]
        return sum(m.get("role") == "user" for m in messages[said:])

    def _rebuilt(self, path: Path, why: str) -> History:
        warnings.warn(f"{path} could not be read ({why}); the working history was rebuilt "
                      "from the session's transcript (since its last reset).", RuntimeWarning,
                      stacklevel=3)
        return self._rebuild()

    def _rebuild(self) -> History:
        self._persisted = None              # the next save is a whole snapshot
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # its bad lines are named when it is read
            return self.working_messages()

    # -- session metadata ------------------------------------------------------------------
    def save_meta(self, meta: Mapping[str, Any]) -> None:
        if not self.created:
            return                  # nothing said yet: nothing saved
        if self.redactor is not None:
            meta = self.redactor.value(dict(meta))  # the system prompt
        self._still_there()
        self._meta = _dumps(dict(meta))
        try:
            write_private_atomic(self.meta_path, self._meta)
        except OSError as e:
            self.health.failed(self.meta_path.name, e)
            return
        self.health.ok()

    def load_meta(self) -> dict[str, Any]:
        """``session.json`` as a dict: ``{}`` when missing; unreadable → ``{}`` and one warning."""
        try:
            raw = read_regular(self.meta_path, SMALL_MAX)
        except (FileNotFoundError, NotADirectoryError):  # nothing saved there
            return {}
        except OSError as e:
            why = e.strerror or type(e).__name__
        else:
            try:
                data = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                why = f"byte {e.start + 1} is not UTF-8"
            except (ValueError, RecursionError):
                why = "it is not valid JSON"
            else:
                if isinstance(data, dict):
                    return {k: v for k, v in data.items()
                            if k not in ("model", "system") or isinstance(v, str | None)}
                why = f"it is a JSON {type(data).__name__}, not an object"
        warnings.warn(f"{self.meta_path} could not be read ({why}); the session's model and "
                      "system prompt come from the arguments given (or the defaults).",
                      RuntimeWarning, stacklevel=2)
        return {}

    # -- learned state (format: learned.py) ------------------------------------------------
    def save_learned(self, text: str) -> None:
        if not self.created:
            return                  # nothing said yet: nothing saved
        self._still_there()
        self._learned = text
        try:
            write_private_atomic(self.learned_path, text)
        except OSError as e:
            self.health.failed(self.learned_path.name, e)
            return
        self.health.ok()

    def learned_model(self) -> str | None:
        """The model string ``learned.json`` was saved for, if it says (quietly: what is
        wrong with the file is said when it is restored), for a resume whose
        ``session.json`` is missing or damaged."""
        with contextlib.suppress(OSError, ValueError, RecursionError):
            data = json.loads(read_regular(self.learned_path, SMALL_MAX))
            model = data.get("model") if isinstance(data, dict) else None
            return model if isinstance(model, str) and model.strip() else None
        return None

    def load_learned(self) -> str | None:
        """The saved learned state as text (None: never saved, or not readable — then one
        warning names the file and why); unreadable bytes are kept as replacement
        characters so the caller reports the file as invalid."""
        try:
            raw = read_regular(self.learned_path, SMALL_MAX)
        except (FileNotFoundError, NotADirectoryError):  # nothing saved there
            return None
        except OSError as e:
            warnings.warn(f"ignoring {self.learned_path}: it could not be read "
                          f"({e.strerror or type(e).__name__}); this session will learn its "
                          "limits again.", RuntimeWarning, stacklevel=3)
            return None
        return raw.decode("utf-8", errors="replace")
