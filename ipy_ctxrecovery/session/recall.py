"""The built-in recall tool: the model searches the session's own transcript after a compaction.

Offered only once the session has compacted (a summary, a drop, a ladder fit: the history
sent carries a summary or a compaction notice, or the session compacted before), so a
session that never compacts sends the same tools as ever and keeps its prompt cache
(``turns.ToolBox``). Its query, bounds and result format are ``core/recall.py``'s.

What it reads is the session's transcript on disk, redacted as stored, and nothing else: no
argument names a file, and extra arguments are refused by the schema. A session with no
transcript on disk (never saved, or its directory not writable) answers from the in-memory
record of what was said, masked the same way; with neither, one sentence says so. Each call
has a time bound (:data:`RECALL_SECONDS`) besides the turn's deadline, and its result is at
most ``recall_max_chars`` (and ``per_result_max_chars``) characters; it is a tool result
like any other, so the turn's tool-result budget and microcompact apply to it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ..core import recall
from ..core.history import History
from ..errors import ToolError
from .tools import Tool, build_tool

__all__ = ["RECALL_SECONDS", "make_recall"]

RECALL_SECONDS = 2.0
"""How long one search may run before it stops and says so."""


def make_recall(source: Callable[[], History | None], max_chars: Callable[[], int], *,
                clock: Callable[[], float] = time.monotonic,
                seconds: float = RECALL_SECONDS) -> Tool:
    """The ``recall_transcript`` tool over ``source()`` (the transcript's messages, or None
    when there is none), its results bounded by ``max_chars()``."""

    def recall_transcript(words: str = "", pattern: str = "", from_turn: int | None = None,
                          to_turn: int | None = None) -> str:
        """Search the full transcript of this conversation, compacted turns included:
        words (all must match) or a regular expression, optionally in a turn range.

        Args:
            words: words that must all appear (any case).
            pattern: a regular expression, instead of words.
            from_turn: the first turn (1 is the first user message).
            to_turn: the last turn.
        """
        return checked(_go_on, words, pattern, from_turn, to_turn)

    def checked(check: Callable[[], None], words: str = "", pattern: str = "",
                from_turn: int | None = None, to_turn: int | None = None) -> str:
        if (from_turn is not None and from_turn < 1) or (to_turn is not None and to_turn < 1):
            raise ToolError("Turns are counted from 1; give from_turn and to_turn of 1 or more.")
        try:
            query = recall.compile_query(words, pattern)
        except recall.RecallError as e:
            raise ToolError(_sentence(e)) from None
        messages = source()
        if not messages:
            raise ToolError("This session has no transcript to search yet.")
        until = clock() + seconds

        def keep_going() -> bool:
            check()                     # the turn's deadline ends the turn
            return clock() < until

        try:
            return recall.search(recall.entries(messages), query, from_turn=from_turn,
                                 to_turn=to_turn, max_chars=max(max_chars(), 200),
                                 keep_going=keep_going)
        except recall.RecallError as e:
            raise ToolError(_sentence(e)) from None

    return dataclasses.replace(build_tool(recall_transcript), checked=checked)


def _sentence(error: recall.RecallError) -> str:
    text = str(error)
    return text[:1].upper() + text[1:]


def _go_on() -> None:
    return None
