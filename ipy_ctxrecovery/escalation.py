"""Max-tokens escalation (SPEC §4): double up to the model's cap; continue; stitch.

When the model stops because it hit ``max_tokens``, the session asks
:func:`next_max_tokens` for a bigger limit (doubling, capped at the model's own output
limit from the catalogue — never a hard-coded 128k, ANCHORS 11), sends
:func:`continuation_message`, and joins the partial answers with :func:`stitch` into one
assistant message. Pure functions; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from .history import TAG_CONTINUATION, Message

__all__ = [
    "CONTINUATION_PROMPT",
    "MIN_ANCHORED_OVERLAP_CHARS",
    "MIN_OVERLAP_CHARS",
    "continuation_message",
    "next_max_tokens",
    "overlap",
    "stitch",
]

CONTINUATION_PROMPT = (
    "Your response was cut off at the token limit.\n"
    "Resume DIRECTLY from where you stopped — do not repeat any content.\n"
    "Continue the implementation or explanation from the exact point of interruption."
)

MIN_OVERLAP_CHARS = 20
"""A continuation that starts with the previous part's last ≥ 20 chars repeated them
(counted in UTF-8 bytes, so 7 CJK characters count as much as 21 ASCII letters)."""

MIN_ANCHORED_OVERLAP_CHARS = 8
"""Shorter repeats count only when they restart the previous part's last line (models
usually resume by rewriting the interrupted line from its start)."""

_OVERLAP_SEARCH_CHARS = 20_000
"""How far back a repeat is looked for; bounds the work on huge answers."""


def next_max_tokens(current: int, escalations_done: int, *, model_cap: int,
                    max_escalations: int) -> int | None:
    """Doubled ``max_tokens`` (≤ model_cap), or None when escalation must stop.

    Stops when ``escalations_done`` reached ``max_escalations`` or ``current`` is already
    at (or above) the model's own output cap.
    """
    if escalations_done >= max_escalations or current >= model_cap:
        return None
    return min(max(current, 1) * 2, model_cap)


def continuation_message() -> Message:
    """The user message that asks the model to resume (tagged, so it is not a real request)."""
    return Message.user(CONTINUATION_PROMPT, tag=TAG_CONTINUATION)


def _borders(pattern: Sequence[str | None]) -> list[int]:
    """KMP prefix function of ``pattern``."""
    pi = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = pi[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        pi[i] = k
    return pi


def overlap(previous: str, continuation: str) -> int:
    """Length of the prefix of ``continuation`` that merely repeats the end of ``previous``.

    The longest suffix/prefix overlap that is either at least :data:`MIN_OVERLAP_CHARS`
    long (chars or UTF-8 bytes), or at least :data:`MIN_ANCHORED_OVERLAP_CHARS` long and starting at the
    beginning of a line of ``previous``; 0 when there is none. Linear time (KMP).
    """
    window = min(len(previous), len(continuation), _OVERLAP_SEARCH_CHARS)
    if window < MIN_ANCHORED_OVERLAP_CHARS:
        return 0
    head = continuation[:window]
    tail = previous[-window:]
    # None equals no character, so no border can cross the separator.
    pi = _borders([*head, None, *tail])
    k = pi[-1]
    while k >= MIN_ANCHORED_OVERLAP_CHARS:
        if k >= MIN_OVERLAP_CHARS or len(head[:k].encode("utf-8")) >= MIN_OVERLAP_CHARS:
            return k
        start = len(previous) - k
        if start == 0 or previous[start - 1] == "\n":
            return k
        k = pi[k - 1]
    return 0


def stitch(parts: Sequence[str]) -> str:
    """Join partial answers into one, dropping any overlap a continuation repeated.

    Parts are concatenated directly — a continuation resumes mid-word or mid-line, so
    nothing is inserted between them.
    """
    result = ""
    for part in parts:
        if not result:
            result = part
            continue
        result += part[overlap(result, part):]
    return result
