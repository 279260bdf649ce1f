"""What a session learned, saved with its files and restored on ``resume`` where it still applies.

A :class:`~ipy_ctxrecovery.session.ChatSession` learns limits the hard way (one rejected
request each): payload caps, the real context window, the output limit, the token
calibration; plus two one-shot flags. This module writes that state to the session's
``learned.json`` (0600, atomic, via :class:`~ipy_ctxrecovery.transcript.Transcript`) after
each turn where it really changed (the token calibration and the largest body that
passed drift with every answer: see ``save``), and restores it in ``ChatSession.resume``
under the same rules ``ChatSession.update`` uses for a live session:

- payload caps (largest ok, smallest rejected, assumed) belong to the **network path**
  (the client's base URL and the emulator behind it): restored only on the same path;
- the learned window and output limit: same path **and** same model string (and the
  window only when the configured ``context_window`` is the one it was learned under);
- the token calibration belongs to the model's tokenizer: restored on the same model
  string, whatever the path;
- the one-shot no-cap warning and the payload-notice flag belong to the session and its
  history snapshot, which ``resume`` always restores: restored always.

Configured values (``max_payload``, ``context_window``, ``chars_per_token``...) always come
from the current settings, never from disk. An emulator is identified by a random token
held for the object in this process only, so a restarted emulator (or any emulator after
a kernel restart) is a new path. URLs are stored without user info, query or fragment, so
no secret reaches the file. A corrupt or unknown-version file is ignored with one warning.
"""

from __future__ import annotations

import json
import uuid
import warnings
import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from .config import format_size

if TYPE_CHECKING:
    from .providers.base import Provider
    from .session import ChatSession

__all__ = ["CALIBRATION_DRIFT", "VERSION", "path_key", "restore", "save", "snapshot"]

VERSION = 1
"""Format version of ``learned.json``; another version is ignored (with a warning)."""

_emulator_tokens: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _emulator_token(emulator: Any) -> str:
    """A random id for this emulator object, stable while it lives in this process."""
    token = _emulator_tokens.get(emulator)
    if token is None:
        token = _emulator_tokens[emulator] = uuid.uuid4().hex
    return token


def _public_url(url: str) -> str:
    """``url`` without user info, query or fragment (where a secret could hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def path_key(provider: Provider) -> str | None:
    """The network path ``provider`` uses, as a string (None: it shows no base URL).

    The same notion as ``session._path_change``: base URL plus the emulator object.
    """
    url = getattr(getattr(provider, "client", None), "base_url", None)
    if url is None:
        return None
    key = _public_url(str(url))
    emulator = getattr(provider, "emulator", None)
    if emulator is not None:
        try:
            key += f" emulator {_emulator_token(emulator)}"
        except TypeError:                  # not weak-referenceable: never the same path
            return None
    return key


def snapshot(session: ChatSession) -> dict[str, Any]:
    """The session's learned state as a JSON-able dict (no configured values, no secrets)."""
    caps, estimator = session.caps, session.estimator
    return {
        "version": VERSION,
        "model": session.model,
        "path": path_key(session.provider),
        "context_window": session.settings.context_window,
        "caps": {"largest_ok": caps.largest_ok, "smallest_rejected": caps.smallest_rejected,
                 "assumed": caps.assumed},
        "learned_window": session._learned_window,
        "output_limit": session._output_limit,
        "calibration": {"bytes_per_token": estimator.bytes_per_token,
                        "samples": estimator.samples},
        "warned": session._warned,
        "payload_notice_sent": session._payload_notice_sent,
    }


CALIBRATION_DRIFT = 0.02
"""The token calibration is rewritten only when it moved more than this (relative) from
what was saved: it changes a little with every answer's usage, and an estimate 2 % off
changes no decision that matters (pre-flight keeps a 10 % exact-fit margin)."""


LARGEST_OK_GROWTH = 0.5
"""With no rejection known, the largest body that passed grows with every turn; it is
rewritten only when it grew past this (relative). A value saved a little low only makes
a cap learned after ``resume`` a little lower: the safe side."""


def _same(state: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    """Whether ``state`` is what was saved, up to the drifts allowed above."""
    if saved is None:
        return False
    drifting = ("calibration", "caps")
    if {k: v for k, v in state.items() if k not in drifting} \
            != {k: v for k, v in saved.items() if k not in drifting}:
        return False
    caps, saved_caps = state["caps"], saved["caps"]
    if {k: v for k, v in caps.items() if k != "largest_ok"} \
            != {k: v for k, v in saved_caps.items() if k != "largest_ok"}:
        return False
    largest, saved_largest = caps["largest_ok"], saved_caps["largest_ok"]
    drifted = caps["smallest_rejected"] is None \
        and saved_largest <= largest <= saved_largest * (1 + LARGEST_OK_GROWTH)
    if largest != saved_largest and not drifted:
        return False
    new, old = state["calibration"], saved["calibration"]
    if (new["samples"] > 0) != (old["samples"] > 0):
        return False
    before = old["bytes_per_token"]
    return abs(new["bytes_per_token"] - before) <= CALIBRATION_DRIFT * before


def save(session: ChatSession, *, exact: bool = False) -> None:
    """Write the learned state when it really changed since this session last wrote it:
    any cap, window, limit or flag; the calibration only past ``CALIBRATION_DRIFT``, the
    largest body that passed (no rejection known) only past ``LARGEST_OK_GROWTH``.
    ``exact`` (on close): any difference at all is written."""
    state = snapshot(session)
    if state != session._learned_saved if exact else not _same(state, session._learned_saved):
        session._files.save_learned(json.dumps(state, ensure_ascii=False))
        session._learned_saved = state


def _int(value: Any, *, optional: bool = True) -> bool:
    if value is None:
        return optional
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _valid(data: Any) -> bool:
    """The shape ``snapshot`` writes (a hand-edited or torn file fails here, not later)."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        return False
    caps, cal = data.get("caps"), data.get("calibration")
    if not isinstance(caps, dict) or not isinstance(cal, dict):
        return False
    bpt = cal.get("bytes_per_token")
    return (_int(caps.get("largest_ok"), optional=False) and _int(caps.get("smallest_rejected"))
            and _int(caps.get("assumed")) and _int(data.get("learned_window"))
            and _int(data.get("output_limit")) and _int(data.get("context_window"))
            and _int(cal.get("samples"), optional=False)
            and isinstance(bpt, int | float) and not isinstance(bpt, bool) and bpt > 0
            and isinstance(data.get("path"), str | None)
            and isinstance(data.get("warned"), bool)
            and isinstance(data.get("payload_notice_sent"), bool))


def restore(session: ChatSession) -> str | None:
    """Apply the saved learned state that still applies to ``session`` (see the module doc).

    Returns a note for :meth:`ChatSession.status` when a learned or assumed payload cap
    was saved but not restored (another path), else None.
    """
    raw = session._files.load_learned()
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or data.get("version") != VERSION or not _valid(data):
        version = data.get("version") if isinstance(data, dict) else None
        why = (f"it has unknown format version {version!r}"
               if isinstance(data, dict) and version != VERSION else "it is not valid")
        warnings.warn(f"ignoring {session._files.learned_path}: {why}; this session will "
                      "learn its limits again.", RuntimeWarning, stacklevel=3)
        return None
    same_model = data["model"] == session.model
    path = path_key(session.provider)
    same_path = path is not None and data["path"] == path
    caps, cal = data["caps"], data["calibration"]
    note = None
    if same_path:
        session.caps.largest_ok = caps["largest_ok"]
        session.caps.smallest_rejected = caps["smallest_rejected"]
        session.caps.assumed = caps["assumed"]
    elif caps["smallest_rejected"] is not None or caps["assumed"] is not None:
        kind = "learned" if caps["smallest_rejected"] is not None else "assumed"
        size = caps["smallest_rejected"] if kind == "learned" else caps["assumed"]
        note = (f"{kind} payload cap (below {format_size(size)}) not restored: this "
                "endpoint or emulator is not the one it was learned on")
    if same_path and same_model:
        session._output_limit = data["output_limit"]
        if data["context_window"] == session.settings.context_window:
            session._learned_window = data["learned_window"]
    if same_model and cal["samples"] > 0:
        session.estimator.bytes_per_token = float(cal["bytes_per_token"])
        session.estimator.samples = cal["samples"]
    session._warned = session._warned or data["warned"]
    session._payload_notice_sent = data["payload_notice_sent"]
    session._learned_saved = snapshot(session) if same_path and same_model else None
    return note
