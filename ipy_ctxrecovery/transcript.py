"""Where a session's data lives on disk: the append-only JSONL transcript and the history snapshot.

Layout (CONVENTIONS.md): the root is ``$IPY_CTXRECOVERY_DIR``, else
``$XDG_STATE_HOME/ipy_ctxrecovery``, else ``~/.local/state/ipy_ctxrecovery``. A session
named S owns ``<root>/sessions/S/`` (0700) holding:

- ``transcript.jsonl`` (0600): one JSON record per line, appended as the conversation
  goes and never rewritten. ``{"type": "message", "ts": ..., "message": Message.to_dict()}``
  for every message said (the user's, the assistant's final answers, tool calls and their
  full results); ``{"type": "reset", "ts": ...}`` when the working history was reset.
  What the package itself writes for the model (SYSTEM NOTICE, summaries, continuation
  prompts) is not "said" and lives only in the snapshot.
- ``history.json`` (0600): the working history (what the model sees), rewritten
  atomically after each turn, so ``resume`` restores exactly what the model saw.
- ``session.json`` (0600): the model string and the system prompt (never a key).

What is written passes through the session's ``Redactor`` (``redaction.py``): its own
credentials and well-known secret formats are masked on disk, never in what is sent.
- ``learned.json`` (0600): what the session learned (caps, window, calibration...), written
  atomically when it changed; its format and restore rules live in ``learned.py``.
- ``results/`` (0700): the budget's persisted tool results (``budget.ResultStore``).

Nothing here is global: each :class:`Transcript` belongs to one session object.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ._files import DIR_MODE, FILE_MODE, ensure_private_dir, open_private, write_private_atomic
from .errors import ConfigError
from .history import History, Message
from .pairing import repair_pairing
from .redaction import Redactor

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "Transcript",
    "data_root",
    "list_sessions",
    "session_dir",
    "validate_name",
]

ENV_DIR = "IPY_CTXRECOVERY_DIR"

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


def session_dir(name: str) -> Path:
    return data_root() / "sessions" / validate_name(name)


def list_sessions() -> list[str]:
    """Names of the sessions that have a transcript on disk, sorted."""
    root = data_root() / "sessions"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if _NAME_RE.match(p.name) and (p / "transcript.jsonl").is_file())


class Transcript:
    """One session's files. Creating it creates the directory; it never deletes anything."""

    def __init__(self, name: str, *, redactor: Redactor | None = None) -> None:
        self.name = validate_name(name)
        #: Masks secrets in every message and text written here (README "Files and privacy").
        self.redactor = redactor
        # Every level we own is private, not just the leaf (mkdir's parents get the umask).
        ensure_private_dir(data_root())
        ensure_private_dir(data_root() / "sessions")
        self.directory = ensure_private_dir(session_dir(name))
        self.results_dir = ensure_private_dir(self.directory / "results")
        self.path = self.directory / "transcript.jsonl"
        self.history_path = self.directory / "history.json"
        self.meta_path = self.directory / "session.json"
        self.learned_path = self.directory / "learned.json"
        if not self.path.exists():
            os.close(open_private(self.path, os.O_WRONLY))

    @staticmethod
    def exists(name: str) -> bool:
        return (session_dir(name) / "transcript.jsonl").is_file()

    # -- the append-only log ------------------------------------------------------------
    def _append_record(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False) + "\n"
        fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            # One write per record keeps lines whole even if two processes append.
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    def append(self, message: Message) -> None:
        self._append_record({"type": "message", "ts": time.time(),
                             "message": self._stored(message).to_dict()})

    def _stored(self, message: Message) -> Message:
        return self.redactor.message(message) if self.redactor is not None else message

    def mark(self, kind: str, **fields: Any) -> None:
        """Record a non-message event (``reset``) in the log."""
        self._append_record({"type": kind, "ts": time.time(), **fields})

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record in order; a torn last line (a crash mid-write) is skipped."""
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue

    def messages(self) -> History:
        return tuple(Message.from_dict(r["message"]) for r in self.records()
                     if r.get("type") == "message")

    # -- the working-history snapshot ------------------------------------------------------
    def save_history(self, history: History) -> None:
        data = json.dumps({"version": 1,
                           "messages": [self._stored(m).to_dict() for m in history]},
                          ensure_ascii=False)
        write_private_atomic(self.history_path, data)

    def load_history(self) -> History | None:
        """The working-history snapshot; None when there is none.

        A snapshot that cannot be read (a crash mid-write on another tool's part, a hand
        edit) is not fatal: the transcript holds every message, so the working history is
        rebuilt from it (tool pairing repaired) with one warning, and nothing is lost.
        """
        try:
            data = json.loads(self.history_path.read_text(encoding="utf-8"))
            return tuple(Message.from_dict(m) for m in data.get("messages", ()))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            warnings.warn(f"{self.history_path} could not be read; the working history was "
                          "rebuilt from the session's transcript.", RuntimeWarning,
                          stacklevel=2)
            rebuilt, _ = repair_pairing(self.messages())
            return rebuilt

    # -- session metadata ------------------------------------------------------------------
    def save_meta(self, meta: Mapping[str, Any]) -> None:
        if self.redactor is not None:
            meta = self.redactor.value(dict(meta))  # the system prompt
        write_private_atomic(self.meta_path, json.dumps(dict(meta), ensure_ascii=False))

    def load_meta(self) -> dict[str, Any]:
        try:
            data = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- learned state (format: learned.py) ------------------------------------------------
    def save_learned(self, text: str) -> None:
        write_private_atomic(self.learned_path, text)

    def load_learned(self) -> str | None:
        """The saved learned state as text (None: never saved); unreadable bytes are kept
        as replacement characters so the caller reports the file as invalid."""
        try:
            return self.learned_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
