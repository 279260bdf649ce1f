"""Tool-result budget (SPEC §5): per-turn and per-result limits; full content persisted once.

Also the primitives the other shrinking steps share (microcompact, the ladder):

- :class:`ResultStore`: a private, content-addressed directory of full tool results. A
  result is written once, atomically, at a path derived from its sha256, so a second run
  (or a second turn) writes nothing and names the same path (ANCHORS 8).
- :func:`preview`: head + marker + tail whose length honours the limit asked for,
  scaling head and tail down when the limit is small, cut at a line boundary when one is
  near and never inside a character cluster (``cuts.py``; ANCHORS 10). Its marker is
  written here and parsed back here, both from ``markers.py``.
- :func:`compaction_info`: whether a tool message was already shrunk by this package and
  what the original was (size, lines, type, persisted path). It reads ``Message.meta``
  (checked against the current content, so a stale entry is ignored) and falls back to
  parsing the markers, so a history reloaded without meta is still recognised.
- :func:`shrink_tool_message`: preview one tool message to a limit, from its original
  content when it was already shrunk (the persisted file), keeping the original path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import SaveHealth, ensure_private_dir, write_private_atomic
from . import markers
from .cuts import Cut, head_cut, tail_cut
from .history import History, Message, Role, ToolResult, char_size, latest_user_index

__all__ = [
    "LEVEL_OLD_PREVIEW",
    "LEVEL_PREVIEW",
    "LEVEL_SUMMARY",
    "META_KEY",
    "MIN_PREVIEW_BODY_CHARS",
    "BudgetReport",
    "CompactionInfo",
    "DeferredStore",
    "ResultStore",
    "compacted_message",
    "compaction_info",
    "count_lines",
    "detect_kind",
    "enforce_budget",
    "preview",
    "shrink_tool_message",
]

META_KEY = "compacted"
"""``Message.meta`` key describing a shrunk tool result (see :class:`CompactionInfo`)."""

MIN_PREVIEW_BODY_CHARS = 200
"""When the turn budget forces previews smaller than the standard head+tail, each one
still keeps at least this many characters of the result besides its marker."""

HASH_PREFIX_CHARS = 32
"""Hex digits of sha256 in a persisted file's name (128 bits: collisions are not a concern)."""

# -- persisted results -----------------------------------------------------------------------

class ResultStore:
    """A per-session directory (mode 0700) of full tool results, content-addressed, files 0600.

    ``persist(content)`` writes a result once at a stable path (sha256 of the content)
    and returns that path; persisting the same content again writes nothing.

    Durability: a file is written to a temporary name and renamed, so a killed process
    never leaves half a result under a real name; it is *not* fsynced (a fit can persist
    hundreds of previews, and an fsync each made it take seconds). What an OS crash or a
    power cut can cost is the last few seconds of files: the transcript holds every full
    result anyway, and a file found missing or cut short (its size is checked) is written
    again the next time its content is persisted.
    """

    def __init__(self, directory: Path, health: SaveHealth | None = None) -> None:
        # Absolute, so the path named in a preview can be read back from any working dir.
        self.directory = Path(directory).expanduser().absolute()
        # A result that cannot be written (disk full, read-only) is kept here instead, and
        # ``health`` (the session's) warns once that nothing is being saved.
        self._health = health if health is not None else SaveHealth(self.directory)
        self._unsaved: dict[Path, str] = {}

    def path_for(self, content: str) -> Path:
        digest = hashlib.sha256(_encode(content)).hexdigest()[:HASH_PREFIX_CHARS]
        return self.directory / f"{digest}.txt"

    def persist(self, content: str) -> Path:
        data = _encode(content)
        path = self.directory / f"{hashlib.sha256(data).hexdigest()[:HASH_PREFIX_CHARS]}.txt"
        if path in self._unsaved:
            return path
        try:
            if path.stat().st_size == len(data):
                return path
        except OSError:
            pass
        try:
            ensure_private_dir(self.directory)
            # Written to a temporary file and renamed: a reader never sees half a result.
            write_private_atomic(path, data, sync=False)
        except OSError as e:
            self._unsaved[path] = content
            self._health.failed(f"a tool result ({path.name})", e)
        return path

    def load(self, path: Path | str) -> str | None:
        """The content persisted at ``path``, or None when it is not a file of this store."""
        candidate = Path(path)
        if candidate.parent != self.directory or not candidate.name.endswith(".txt"):
            return None
        if candidate in self._unsaved:
            return self._unsaved[candidate]
        try:
            return candidate.read_bytes().decode("utf-8", errors="surrogatepass")
        except OSError:
            return None


class DeferredStore(ResultStore):
    """A :class:`ResultStore` that names paths now and writes files later.

    ``persist`` only remembers the content; :meth:`commit` writes the results that the
    final history's previews name. A fit that previews hundreds of results and then drops
    most of them writes only the ones it kept.
    """

    def __init__(self, store: ResultStore) -> None:
        super().__init__(store.directory)
        self._store = store
        self._pending: dict[Path, str] = {}

    def persist(self, content: str) -> Path:
        path = self.path_for(content)
        self._pending[path] = content
        return path

    def load(self, path: Path | str) -> str | None:
        pending = self._pending.get(Path(path))
        return pending if pending is not None else self._store.load(path)

    def commit(self, history: History) -> tuple[Path, ...]:
        """Write the pending results that ``history``'s previews name; forget the rest."""
        if not self._pending:
            return ()                          # nothing previewed: no need to look
        written: list[Path] = []
        for m in history:
            if m.role is not Role.TOOL or not m.meta:
                continue
            entry = m.meta.get(META_KEY)
            path = entry.get("path") if isinstance(entry, Mapping) else None
            content = self._pending.pop(Path(path), None) if path else None
            if content is not None:
                written.append(self._store.persist(content))
        self._pending.clear()
        return tuple(written)


def _encode(content: str) -> bytes:
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError:
        # JSON from a provider can decode to lone surrogates; never fail on them.
        return content.encode("utf-8", errors="surrogatepass")


def _widest_lines(content: str) -> tuple[int, int, int]:
    """Line counts at least as wide as any the marker of ``content`` can show."""
    line_total = content.count("\n") + 1
    return (line_total, 2 * line_total, line_total)


_JOINERS = 2
"""What :func:`markers.join_cut` adds around a marker (a newline or a space each side)."""


def _marker_room(content: str, store: ResultStore) -> int:
    """Chars the most informative marker of a preview of ``content`` can take."""
    widest = markers.budget_markers(len(content), store.path_for(content), _widest_lines(content))
    return len(widest[0]) + _JOINERS


def preview(content: str, *, limit: int, head: int, tail: int, path: Path | None) -> str:
    """Head+tail preview of ``content`` no longer than ``limit`` chars, naming ``path``.

    Content that already fits is returned as it is. Head and tail are scaled down
    proportionally when they and the marker do not fit the limit. The head ends and the
    tail starts at a line boundary when one is near, else at a word boundary, never inside
    a character cluster (``cuts.py``); the marker sits on its own line only between whole
    lines. If even the shortest marker does not fit, the head alone is kept.
    """
    return _preview_parts(content, limit=limit, head=head, tail=tail, path=path)[0]


def _preview_parts(content: str, *, limit: int, head: int, tail: int,
                   path: Path | None) -> tuple[str, int, int]:
    """:func:`preview`, plus how many chars of the original's head and tail it kept."""
    total = len(content)
    if total <= limit:
        return content, total, 0
    limit = max(0, limit)
    head, tail = max(0, head), max(0, tail)
    line_total = content.count("\n") + 1
    widest = _widest_lines(content)
    # Sized with the widest possible counts, so the real (smaller or equal) ones fit too.
    for index, marker_at_width in enumerate(markers.budget_markers(total, path, widest)):
        avail = limit - len(marker_at_width) - _JOINERS
        if avail < 0:
            continue
        h, t = head, tail
        if h + t > avail:
            h = avail * head // (head + tail) if head + tail else 0
            t = avail - h
        hc = head_cut(content, h)
        tc = tail_cut(content, t, floor=hc.at) if t else Cut(total, False)
        # Lines counted from 0, as read_file's offset is; a line the head or the tail shows
        # whole is not an omitted one.
        first = content.count("\n", 0, hc.at) + (1 if hc.line else 0)
        last = line_total - 1 - content.count("\n", tc.at) - (1 if tc.line else 0)
        marker = markers.budget_markers(tc.at - hc.at, path,
                                        (first, max(first, last), line_total))[index]
        short = markers.join_cut(content[:hc.at], marker, content[tc.at:],
                                 head_line=hc.line, tail_line=tc.line)
        return short, hc.at, total - tc.at
    end = head_cut(content, limit).at
    return content[:end], end, 0


# -- what a shrunk result was ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CompactionInfo:
    """What this package did to a tool result, and what the original was.

    ``level``: 1 = budget preview, 2 = old-result preview (microcompact), 3 = one-line
    summary. ``original_lines`` and ``kind`` are None when only a marker was found.
    ``head``/``tail``: the original's text still shown (empty for a summary);
    ``head_line``/``tail_line``: whether the marker stood on a line of its own on that side
    (the cut there fell on a line boundary).
    """

    level: int
    original_chars: int
    original_lines: int | None
    kind: str | None
    path: Path | None
    head: str = ""
    tail: str = ""
    head_line: bool = True
    tail_line: bool = True


LEVEL_PREVIEW = 1
LEVEL_OLD_PREVIEW = 2
LEVEL_SUMMARY = 3


def compaction_info(message: Message) -> CompactionInfo | None:
    """How ``message`` (a tool message) was shrunk by this package; None if it was not."""
    result = message.tool_result
    if message.role is not Role.TOOL or result is None:
        return None
    content = result.content
    meta = message.meta.get(META_KEY) if isinstance(message.meta, Mapping) else None
    if isinstance(meta, Mapping) and meta.get("chars") == len(content):
        try:
            h, t = int(meta.get("head_chars", 0)), int(meta.get("tail_chars", 0))
            path = meta.get("path")
            return CompactionInfo(
                level=int(meta["level"]), original_chars=int(meta["original_chars"]),
                original_lines=_opt_int(meta.get("original_lines")), kind=meta.get("kind"),
                path=Path(path) if path else None, head=content[:h],
                tail=content[len(content) - t:] if t else "",
                head_line=content[h:h + 1] != " ",
                tail_line=not t or content[len(content) - t - 1:len(content) - t] != " ")
        except (KeyError, TypeError, ValueError):
            pass                                     # a damaged entry: fall back to markers
    # Every marker says "chars omitted" or starts "[Old tool result cleared": a plain
    # substring search rules most results out before the regexes scan them.
    if "chars omitted" not in content and not content.startswith("[Old tool result cleared"):
        return None
    m = markers.ONE_LINE_RE.fullmatch(content)
    if m:
        return CompactionInfo(LEVEL_SUMMARY, int(m["chars"]), int(m["lines"]),
                              m["kind"].strip(), Path(m["path"]) if m["path"] else None)
    for level, pattern in ((LEVEL_OLD_PREVIEW, markers.OLD_PREVIEW_RE),
                           (LEVEL_PREVIEW, markers.BUDGET_RE)):
        found = list(pattern.finditer(content))
        if found:
            last = found[-1]
            kept = len(content) - (last.end() - last.start())
            return CompactionInfo(level, kept + int(last["n"]), None, None,
                                  Path(last["path"]) if last["path"] else None,
                                  content[:last.start()], content[last.end():],
                                  head_line=not last.group().startswith(" "),
                                  tail_line=not last.group().endswith(" "))
    return None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def compacted_message(message: Message, content: str, *, level: int, original: str | None,
                      info: CompactionInfo | None, path: Path | None, head_chars: int,
                      tail_chars: int) -> Message:
    """``message`` with ``content`` and its meta describing the original (input untouched).

    ``original`` is the full original text when known; otherwise ``info`` (what an earlier
    step recorded) supplies the original's numbers.
    """
    r = message.tool_result
    assert r is not None
    if original is not None:
        numbers: dict[str, Any] = {"original_chars": len(original),
                                   "original_lines": count_lines(original),
                                   "kind": detect_kind(original)}
    else:
        assert info is not None
        numbers = {"original_chars": info.original_chars, "original_lines": info.original_lines,
                   "kind": info.kind}
    entry = {"level": level, **numbers, "path": str(path) if path else None,
             "head_chars": head_chars, "tail_chars": tail_chars, "chars": len(content)}
    meta = {**message.meta, META_KEY: entry}
    return Message(message.role, (ToolResult(r.call_id, content, r.is_error, r.name),),
                   message.tag, meta)


def count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


_CSV_MIN_LINES = 2


def detect_kind(text: str, *, truncated: bool = False) -> str:
    """A short label for a tool result's type: JSON, Python traceback, diff, CSV, HTML, …"""
    stripped = text.strip()
    if not stripped:
        return "empty"
    if "Traceback (most recent call last):" in text:
        return "Python traceback"
    if stripped[0] in "[{":
        if truncated:
            return "JSON"
        try:
            json.loads(stripped)
            return "JSON"
        except ValueError:
            pass
    first = stripped[:200].lower()
    if stripped.startswith(("diff --git", "--- ", "Index: ")) or \
            ("\n+++ " in text[:2000] and "\n@@ " in text[:4000]):
        return "diff"
    if first.startswith(("<!doctype html", "<html")) or "<body" in first:
        return "HTML"
    if first.startswith("<?xml"):
        return "XML"
    lines = stripped[:4000].splitlines()[:6]
    if truncated:
        lines = lines[:-1] or lines
    if len(lines) >= _CSV_MIN_LINES:
        commas = {line.count(",") for line in lines}
        if len(commas) == 1 and commas.pop() > 0:
            return "CSV"
    return "text"


# -- shrinking one tool message --------------------------------------------------------------

def shrink_tool_message(message: Message, limit: int, *, store: ResultStore, head: int,
                        tail: int) -> Message | None:
    """A preview of ``message`` at most ``limit`` chars, or None when it would not shrink.

    A message shrunk before is previewed from its original (read back from the store)
    and keeps naming the original's file; a one-line summary is never expanded.
    """
    result = message.tool_result
    if message.role is not Role.TOOL or result is None:
        return None
    content = result.content
    if len(content) <= limit:
        return None
    info = compaction_info(message)
    if info is not None and info.level == LEVEL_SUMMARY:
        return None
    original = content
    known = None        # what an earlier step recorded, when its original is unreadable
    if info is not None:
        loaded = store.load(info.path) if info.path is not None else None
        if loaded is not None and store.path_for(loaded) == info.path:
            original = loaded
        else:
            known = info
    path = store.path_for(original)
    short, h, t = _preview_parts(original, limit=limit, head=head, tail=tail, path=path)
    if len(short) >= len(content):
        return None
    store.persist(original)          # only once the preview is really used
    return compacted_message(message, short, level=LEVEL_PREVIEW,
                             original=None if known else original, info=known,
                             path=path, head_chars=h, tail_chars=t)


# -- the budget ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BudgetReport:
    replaced: int
    persisted: tuple[Path, ...]
    before: History = field(repr=False, compare=False)
    after: History = field(repr=False, compare=False)

    # Counted when read: a turn within budget (nearly all) never needs them, and counting
    # a long history's characters on every turn made pre-flight O(history).
    @property
    def chars_before(self) -> int:
        return char_size(self.before)

    @property
    def chars_after(self) -> int:
        return char_size(self.after)

    @property
    def message(self) -> str:
        """One line for the user, e.g. ``✂ tool-result budget: 2 results previewed …``."""
        if not self.replaced:
            return "✂ tool-result budget: within limits"
        noun = "result" if self.replaced == 1 else "results"
        return (f"✂ tool-result budget: {self.replaced} {noun} replaced by previews "
                f"({self.chars_before - self.chars_after:,} chars; full output saved "
                "in the session's results directory)")


def enforce_budget(history: History, *, store: ResultStore, turn_budget_chars: int,
                   per_result_max_chars: int, head_chars: int = 4_000,
                   tail_chars: int = 1_000) -> tuple[History, BudgetReport]:
    """Replace over-limit tool results of the current turn by previews naming their file.

    The current turn is every message after the latest real user request (the whole
    history when there is none). First every result over ``per_result_max_chars`` becomes
    a standard preview; then, while the turn's results total more than
    ``turn_budget_chars``, the largest remaining ones are previewed (standard size first;
    smaller, down to :data:`MIN_PREVIEW_BODY_CHARS`, only if that is not enough).
    Results already shrunk by this package are left alone, so a second run changes
    nothing and writes nothing. The input is not modified.
    """
    latest = latest_user_index(history)
    start = -1 if latest is None else latest
    out = list(history)
    turn = [i for i in range(start + 1, len(out))
            if out[i].role is Role.TOOL and out[i].tool_result is not None]
    replaced: set[int] = set()
    persisted: list[Path] = []

    def replace(i: int, limit: int, head: int, tail: int) -> bool:
        new = shrink_tool_message(out[i], limit, store=store, head=head, tail=tail)
        if new is None:
            return False
        out[i] = new
        replaced.add(i)
        info = compaction_info(new)
        if info is not None and info.path is not None and info.path not in persisted:
            persisted.append(info.path)
        return True

    for i in turn:
        if len(out[i].text) > per_result_max_chars:
            replace(i, per_result_max_chars, head_chars, tail_chars)

    def total() -> int:
        return sum(len(out[i].text) for i in turn)

    # Largest first; ties go to the oldest, so the outcome is deterministic.
    fresh = sorted((i for i in turn if compaction_info(out[i]) is None),
                   key=lambda i: (-len(out[i].text), i))
    for i in fresh:
        if total() <= turn_budget_chars:
            break
        size = len(out[i].text)
        standard = head_chars + tail_chars + _marker_room(out[i].text, store)
        if standard < size:
            replace(i, min(per_result_max_chars, standard), head_chars, tail_chars)
    for i in fresh:
        excess = total() - turn_budget_chars
        if excess <= 0:
            break
        if i in replaced:
            continue
        size = len(out[i].text)
        floor = MIN_PREVIEW_BODY_CHARS + _marker_room(out[i].text, store)
        replace(i, max(size - excess, floor), head_chars, tail_chars)

    if not replaced:
        return history, BudgetReport(0, (), history, history)
    result = tuple(out)
    return result, BudgetReport(len(replaced), tuple(persisted), history, result)
