"""Microcompact (SPEC §6): old tool results become previews, older ones one-line summaries.

Pure, no LLM, no network (it only writes full results to the session's
:class:`~ipy_ctxrecovery.core.budget.ResultStore`, once each, so nothing is lost).

Age is counted in model round trips (``history.ages``), so a long tool loop inside one
user request ages its own early results. With the settings' defaults:

- age ≥ ``microcompact_truncate_turns`` (2) and an original of ≥ ``microcompact_min_chars``
  (3,000): head 2,000 + tail 500 chars (cut at line boundaries when near: ``cuts.py``)
  around ``[... N chars omitted from old tool result — full output saved to PATH ...]``;
- age ≥ ``microcompact_summarize_turns`` (4): one line,
  ``[Old tool result cleared — L lines, C chars, JSON — full content at PATH]``.

The size threshold is judged on the **original** result (ANCHORS 9: ChatCLI judged the
truncated preview, which is under the minimum, so its summary never fired). The original's
size comes from ``Message.meta`` or the markers (``budget.compaction_info``). A result is
only ever moved to a later stage, never back, and never made longer: running twice on
the same history changes nothing the second time.

**Batched rewrites** (:func:`rewrite_now`; the rule is in ``docs/caching.md``). Both
providers cache the longest prefix a request shares with the previous one, so a rewrite of
a message already sent costs the cache of everything after it. The session therefore keeps
the rewrites of sent messages (these previews and one-liners, the tool-result budget)
pending, and the history only grows at its end, until one of: a compaction or a fit is due
anyway (recovery beats cache), the session was idle longer than the cache lives, or the
rewrite clears at least ``microcompact_clear_at_least`` tokens at once *and* what it saves
over the next turns outweighs the cache it breaks.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..settings import Settings
from . import markers
from .budget import (
    LEVEL_OLD_PREVIEW,
    LEVEL_SUMMARY,
    CompactionInfo,
    ResultStore,
    compacted_message,
    compaction_info,
    count_lines,
    detect_kind,
)
from .cuts import head_cut, tail_cut
from .history import History, Message, Role, ages, latest_user_index

__all__ = ["CACHE_READ_SHARE", "CACHE_WRITE_SHARE", "REWRITE_HORIZON_TURNS",
           "MicrocompactReport", "RewriteDecision", "detect_kind", "microcompact",
           "rewrite_now", "settled"]

_role = operator.attrgetter("role")


@dataclass(frozen=True, slots=True)
class MicrocompactReport:
    truncated: int
    summarized: int
    bytes_freed: int

    @property
    def message(self) -> str:
        """``✂ microcompact: 3 truncated, 2 summarized, 1.7 MB freed`` (``wording``)."""
        from .events import MicrocompactApplied
        from .wording import describe

        return describe(MicrocompactApplied(truncated=self.truncated,
                                            summarized=self.summarized,
                                            bytes_freed=self.bytes_freed))


def microcompact(history: History, *, settings: Settings,
                 store: ResultStore) -> tuple[History, MicrocompactReport]:
    """Shrink old tool results by age; returns the new history and what was done.

    The input is not modified; when nothing changes the same tuple is returned.
    """
    if Role.TOOL not in map(_role, history):   # at C speed: most turns have no result
        return history, MicrocompactReport(0, 0, 0)
    message_ages = ages(history)
    out = list(history)
    truncated = summarized = freed = 0
    for i, m in enumerate(history):
        if m.role is not Role.TOOL:        # checked first: most messages are not results
            continue
        result = m.tool_result
        age = message_ages[i]
        if result is None or age < settings.microcompact_truncate_turns:
            continue
        info = compaction_info(m)
        original_chars = info.original_chars if info is not None else len(result.content)
        if original_chars < settings.microcompact_min_chars:
            continue
        target = LEVEL_SUMMARY if age >= settings.microcompact_summarize_turns \
            else LEVEL_OLD_PREVIEW
        if info is not None and info.level >= target:
            continue
        original = _original(m, info, store)
        new = _summarize(m, info, original, store) if target == LEVEL_SUMMARY \
            else _truncate(m, info, original, settings, store)
        if new is None or len(new.text) >= len(result.content):
            continue                       # never make a result longer
        if original is not None:
            store.persist(original)        # written once; the new text names this path
        out[i] = new
        freed += _utf8_len(result.content) - _utf8_len(new.text)
        if target == LEVEL_SUMMARY:
            summarized += 1
        else:
            truncated += 1
    if not (truncated or summarized):
        return history, MicrocompactReport(0, 0, 0)
    return tuple(out), MicrocompactReport(truncated, summarized, freed)


def settled(history: History, *, settings: Settings) -> int | None:
    """How many leading messages of ``history`` microcompact and the tool-result budget
    will not rewrite again (short of a compaction): the messages before the first tool
    result that may still become a preview or a one-liner, or be budgeted in its own turn.
    None when no result may (nothing after the prefix will change but by appending).

    The prompt cache keeps this prefix across a batched rewrite, which changes messages
    after it only (``docs/caching.md``)."""
    if Role.TOOL not in map(_role, history):
        return None
    latest = latest_user_index(history)
    for i, m in enumerate(history):
        if m.role is not Role.TOOL or m.tool_result is None:
            continue
        if latest is not None and i > latest:
            return i                       # this turn's results: the budget may cut them
        info = compaction_info(m)
        if info is not None and info.level >= LEVEL_SUMMARY:
            continue
        original = info.original_chars if info is not None else len(m.tool_result.content)
        if original >= settings.microcompact_min_chars:
            return i
    return None


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def _original(m: Message, info: CompactionInfo | None, store: ResultStore) -> str | None:
    """The full original content: the message itself, or its persisted file; else None."""
    if info is None:
        return m.text
    if info.path is None:
        return None
    loaded = store.load(info.path)
    if loaded is None or store.path_for(loaded) != Path(info.path):
        return None
    return loaded


def _truncate(m: Message, info: CompactionInfo | None, original: str | None,
              settings: Settings, store: ResultStore) -> Message | None:
    head_chars, tail_chars = settings.microcompact_head_chars, settings.microcompact_tail_chars
    if original is not None:
        path: Path | None = store.path_for(original)
        hc = head_cut(original, head_chars)
        tc = tail_cut(original, tail_chars, floor=hc.at)
        head, tail = original[:hc.at], original[tc.at:]
        head_line, tail_line = hc.line, tc.line
        total = len(original)
    else:
        # The original is gone from the store: what the earlier preview kept is all we have.
        # Kept whole, a piece keeps the earlier cut (and how its marker was joined).
        assert info is not None
        path = info.path
        hc, tc = head_cut(info.head, head_chars), tail_cut(info.tail, tail_chars)
        head, tail = info.head[:hc.at], info.tail[tc.at:]
        head_line = info.head_line if hc.at == len(info.head) else hc.line
        tail_line = info.tail_line if tc.at == 0 else tc.line
        total = info.original_chars
    omitted = total - len(head) - len(tail)
    if omitted <= 0:
        return None
    content = markers.join_cut(head, markers.old_preview_marker(omitted, path), tail,
                               head_line=head_line, tail_line=tail_line)
    return compacted_message(m, content, level=LEVEL_OLD_PREVIEW, original=original,
                             info=info, path=path, head_chars=len(head), tail_chars=len(tail))


def _summarize(m: Message, info: CompactionInfo | None, original: str | None,
               store: ResultStore) -> Message:
    if original is not None:
        path: Path | None = store.path_for(original)
        chars, lines, kind = len(original), count_lines(original), detect_kind(original)
    else:
        assert info is not None
        path = info.path
        chars = info.original_chars
        # Without meta or file, the lines still shown are the best (lower-bound) count.
        lines = info.original_lines if info.original_lines is not None \
            else count_lines(info.head) + count_lines(info.tail)
        kind = info.kind or detect_kind(info.head, truncated=True)
    content = markers.old_result_cleared(lines, chars, kind, path)
    return compacted_message(m, content, level=LEVEL_SUMMARY, original=original, info=info,
                             path=path, head_chars=0, tail_chars=0)


CACHE_READ_SHARE = 0.1
"""What a cached input token costs, as a share of an uncached one (both providers' 0.1×)."""
CACHE_WRITE_SHARE = 1.25
"""What a token written to the cache costs (Anthropic's 5-minute write, 1.25×; OpenAI bills
1×, so the rule errs towards keeping the cache there)."""
REWRITE_HORIZON_TURNS = 10
"""The turns over which a rewrite's saving is counted: about the turns a pending rewrite
would otherwise wait for the next compaction or batch."""

RewriteReason = Literal["unsent", "fit", "off", "idle", "saves", "below_bound", "not_worth"]


@dataclass(frozen=True, slots=True)
class RewriteDecision:
    """Whether the pending rewrites of old messages are applied now, and why."""

    rewrite: bool
    reason: RewriteReason


def rewrite_now(*, freed_tokens: int, broken_tokens: int, idle_seconds: float | None,
                shrink_due: bool, settings: Settings, cache_life: float | None = None,
                horizon: int = REWRITE_HORIZON_TURNS, read_share: float = CACHE_READ_SHARE,
                write_share: float = CACHE_WRITE_SHARE) -> RewriteDecision:
    """The cost rule for rewriting messages the provider has cached (``docs/caching.md``).

    ``freed_tokens``: what the rewrite removes from every later request. ``broken_tokens``:
    the cached prefix it invalidates — from the first rewritten message to the end of the
    previous request. ``idle_seconds``: since the previous request (None: no previous
    request). ``shrink_due``: the request without the rewrite is over the compaction
    trigger, the window or a payload limit.

    In order: nothing cached is broken → rewrite; a compaction or fit is due → rewrite
    (recovery beats cache); batching off (``microcompact_clear_at_least`` 0) → rewrite;
    idle past ``cache_life`` (the previous request's cache lifetime; None:
    ``cache_ttl_seconds``) → rewrite (the cache is gone anyway); fewer than
    ``microcompact_clear_at_least`` tokens freed → wait; otherwise rewrite when the
    saving over ``horizon`` turns, ``F·r·(H−1) + B·r`` (the first turn no longer reads the
    broken prefix, each later one reads F fewer tokens), is at least what rewriting the
    rest of the prefix costs once, ``(B−F)·w``.
    """
    if broken_tokens <= 0:
        return RewriteDecision(True, "unsent")
    if shrink_due:
        return RewriteDecision(True, "fit")
    if settings.microcompact_clear_at_least <= 0:
        return RewriteDecision(True, "off")
    life = settings.cache_ttl_seconds if cache_life is None else cache_life
    if idle_seconds is not None and idle_seconds >= life:
        return RewriteDecision(True, "idle")
    if freed_tokens < settings.microcompact_clear_at_least:
        return RewriteDecision(False, "below_bound")
    saved = freed_tokens * read_share * max(0, horizon - 1) + broken_tokens * read_share
    cost = max(0, broken_tokens - freed_tokens) * write_share
    return RewriteDecision(True, "saves") if saved >= cost \
        else RewriteDecision(False, "not_worth")
