"""Max-tokens escalation (SPEC §4): double up to the model's cap; continue; join the parts.

When the model stops because it hit ``max_tokens``, the session asks
:func:`next_max_tokens` for a bigger limit (doubling, capped at the model's own output
limit from the catalogue — never a hard-coded 128k, ANCHORS 11), appends what
:meth:`Resume.messages` gives to the request, and joins the partial answers with
:meth:`Resume.join` into one assistant message. Pure functions; nothing here does I/O.

Two ways to continue (:class:`Resume`, chosen per provider by :func:`resume_for`)
----------------------------------------------------------------------------------
* **Prefill** — where the provider can (the Anthropic wire, a model whose catalogue entry
  has ``assistant_prefill``, no extended thinking): the partial answer is the final
  assistant turn and the model continues that very text, so the join is a plain
  concatenation. The API rejects a final assistant turn that ends in whitespace, so the
  prefill is the partial answer without its trailing whitespace, and the join starts there.
* **Continuation prompt** — everywhere else: the partial answer goes back as an assistant
  message followed by :data:`CONTINUATION_PROMPT`, and the model answers in a *new*
  message. Such a message never starts with the whitespace that separated it from the
  previous text, it may resume mid-word or at the next word, and it may repeat a little.
  The join rule below makes each of those cases come out right.

Join rule for the continuation prompt (:func:`join`, :func:`resume_point`)
--------------------------------------------------------------------------
1. **Resume at a word start.** The partial answer is sent back without its last
   whitespace-delimited run (the last word with any punctuation attached, and whatever
   whitespace followed it), so the model resumes right after whitespace and writes that
   word again, whole. A cut at a word boundary, mid-word or mid-line is then one case:
   nothing is guessed about a lost space or newline, and a missing leading space at the
   junction is harmless. (An answer that is one word, or blank, is not sent at all: the
   model starts over.) A run longer than :data:`MAX_RETRACT_CHARS` is not a word (CJK
   text, which has no spaces; a URL; base64): only its last character is held back, so
   the continuation still starts with a visible character, and the join is a plain
   concatenation — what those texts want.
2. **Repeats.** The continuation's prefix that repeats the end of what was sent is
   dropped (:func:`overlap`): at least :data:`MIN_OVERLAP_CHARS` anywhere, or any length
   with a visible character when it restarts the unfinished last line, with or without
   its indentation (models resume by rewriting the interrupted line), or the whole answer.
3. **Re-opened code fence.** Failing that, inside an unclosed ```` ``` ```` block, a
   continuation that starts by opening a fence with the same info string
   (```` ```python ````) opened that block again: its fence line is dropped, and then any
   restart of the interrupted line as in rule 2. (An opening fence without an info string
   cannot be told from a closing one, so it is kept.)
4. **Separator.** When what was sent ends in spaces or tabs (after a word, or the
   indentation of a line) the continuation's leading spaces and tabs are dropped: the
   separator is already there. A leading newline is kept.

A continuation with nothing visible in it leaves the answer as it was, and so does one
that only repeats what was sent (rule 2's repeats), cut off again before it got past them:
the next request sends the same partial answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cuts import is_boundary
from .history import TAG_CONTINUATION, Message

__all__ = [
    "CONTINUATION_PROMPT",
    "MAX_RETRACT_CHARS",
    "MIN_ANCHORED_OVERLAP_CHARS",
    "MIN_OVERLAP_CHARS",
    "Resume",
    "StreamedJoin",
    "continuation_message",
    "join",
    "next_max_tokens",
    "overlap",
    "resume_for",
    "resume_point",
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

MIN_ANCHORED_OVERLAP_CHARS = 1
"""Shorter repeats count only when they restart the previous part's unfinished last line
(models usually resume by rewriting the interrupted line from its start, with or without
its indentation) and hold a visible character (repeated indentation alone is a separator)."""

MAX_RETRACT_CHARS = 80
"""The longest run without whitespace that is still taken for a word and sent back whole."""

_OVERLAP_SEARCH_CHARS = 20_000
"""How far back a repeat is looked for; bounds the work on huge answers."""

_FENCE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})[ \t]*([^\n`]*?)[ \t]*$")
_HORIZONTAL = " \t"


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


# -- the join rule -------------------------------------------------------------------------

def resume_point(text: str) -> int:
    """Where the model is asked to resume ``text``: the partial answer sent back is
    ``text[:resume_point(text)]`` (rule 1 of the module docstring)."""
    end = len(text.rstrip())
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    if end - start <= MAX_RETRACT_CHARS:
        return start
    # Not a word: keep all of it but its last character (a whole grapheme cluster).
    cut = end - 1
    while cut > start and not is_boundary(text, cut):
        cut -= 1
    return cut


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
    long (chars or UTF-8 bytes), or holds a visible character and is the unfinished last
    line of ``previous`` (from its beginning or its first visible character: a restarted
    line may lose its indentation) or the whole of ``previous``; 0 when there is none. A
    short repeat of whole lines is real text (two closing braces, two fences). Linear time
    (KMP).
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
        indent = previous[previous.rfind("\n", 0, start) + 1:start]
        repeat = head[:k]
        if not indent.strip(_HORIZONTAL) and (start == 0 or "\n" not in repeat) \
                and not repeat.isspace():
            return k
        k = pi[k - 1]
    return 0


def _open_fence(text: str) -> tuple[str, str] | None:
    """(fence, info string) of the code block still open at the end of ``text``, if any."""
    opened: tuple[str, str] | None = None
    for line in text.split("\n"):
        found = _FENCE.match(line)
        if found is None:
            continue
        fence, info = found.group(1), found.group(2)
        if opened is None:
            opened = (fence, info)
        elif fence[0] == opened[0][0] and len(fence) >= len(opened[0]) and not info:
            opened = None
    return opened


def _reopened_fence(sent: str, continuation: str) -> int:
    """Length of a fence line at the start of ``continuation`` that opens again the code
    block still open in ``sent`` (rule 3); 0 when there is none."""
    opened = _open_fence(sent)
    if opened is None or not opened[1]:
        return 0
    line, newline, _ = continuation.lstrip("\n").partition("\n")
    found = _FENCE.match(line)
    if not newline or found is None or found.group(1)[0] != opened[0][0] \
            or found.group(2) != opened[1]:
        return 0
    return len(continuation) - len(continuation.lstrip("\n")) + len(line) + 1


def _only_repeats(sent: str, continuation: str) -> bool:
    """Whether ``continuation`` is nothing but a repeat of what was ``sent``, cut off before
    it got past it: at least :data:`MIN_OVERLAP_CHARS` found in ``sent``, or the start of
    its unfinished last line."""
    if len(continuation) >= MIN_OVERLAP_CHARS \
            or len(continuation.encode("utf-8")) >= MIN_OVERLAP_CHARS:
        return continuation in sent[-_OVERLAP_SEARCH_CHARS:]
    line = sent[sent.rfind("\n") + 1:]
    return "\n" not in continuation and (line.startswith(continuation)
                                         or line.lstrip(_HORIZONTAL).startswith(continuation))


def join(previous: str, continuation: str) -> str:
    """``previous`` continued by ``continuation``, a new message answering the continuation
    prompt that was sent ``previous[:resume_point(previous)]`` (rules 1–4)."""
    if not continuation.strip():
        return previous
    sent = previous[:resume_point(previous)]
    if _only_repeats(sent, continuation):
        return previous
    skip = overlap(sent, continuation)
    if not skip:
        fence = _reopened_fence(sent, continuation)
        skip = fence + overlap(sent, continuation[fence:]) if fence else 0
    rest = continuation[skip:]
    if sent and sent[-1] in _HORIZONTAL:
        rest = rest.lstrip(_HORIZONTAL)
    return sent + rest


def _prefilled(previous: str, continuation: str) -> str:
    """``previous`` continued by the model from the prefill ``previous.rstrip()``."""
    return previous.rstrip() + continuation if continuation else previous


def stitch(parts: Sequence[str], *, prefilled: bool = False) -> str:
    """Join the partial answers of one reply into one, left to right: :func:`join` for
    answers to the continuation prompt, plain concatenation after the (whitespace-trimmed)
    prefill when ``prefilled``."""
    step: Callable[[str, str], str] = _prefilled if prefilled else join
    result = ""
    for part in parts:
        result = step(result, part) if result else part
    return result


# -- how to continue -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Resume:
    """How one reply cut at ``max_tokens`` is continued: by prefill or by the prompt."""

    prefill: bool = False

    def messages(self, parts: Sequence[str]) -> tuple[Message, ...]:
        """What follows the history in the next request, given the partial answers so far:
        nothing before the first cut; then the partial answer — tagged
        :data:`~ipy_ctxrecovery.core.history.TAG_CONTINUATION` like the prompt, so neither is
        kept in the history — and, without prefill, the continuation prompt."""
        if not parts:
            return ()
        so_far = self.join(parts)
        if self.prefill:
            return (Message.assistant(so_far.rstrip(), tag=TAG_CONTINUATION),)
        partial = Message.assistant(so_far[:resume_point(so_far)], tag=TAG_CONTINUATION)
        return partial, continuation_message()

    def join(self, parts: Sequence[str]) -> str:
        """The partial answers joined into one (see :func:`stitch`)."""
        return stitch(parts, prefilled=self.prefill)


def resume_for(provider: object, options: Mapping[str, Any] | None = None) -> Resume:
    """How ``provider`` continues a cut answer: by prefill when it has a
    ``continues_by_prefill(options)`` method that says so (the Anthropic adapter), else by
    the continuation prompt."""
    ask = getattr(provider, "continues_by_prefill", None)
    return Resume(prefill=bool(ask(options or {})) if callable(ask) else False)


class StreamedJoin:
    """What to show of a continuation streamed after the text already shown, so the screen
    reads as the joined answer: the repeat the join drops (the retracted last word sent
    again, a repeated line) is not shown twice.

    The continuation's first :attr:`HOLD` characters are held back until the join of the
    answer so far with them can be told — longer while what is held is still text the
    answer already ends with somewhere in its last ``_OVERLAP_SEARCH_CHARS`` (a model
    sending a whole paragraph again) — then what the join adds to what is shown goes
    out, and the rest of the stream passes through. When the join does not extend what
    is shown (the model wrote the cut word differently), the held text goes out as sent.
    Pure: fed deltas, it returns text to show.
    """

    HOLD = MIN_OVERLAP_CHARS + 2 * MAX_RETRACT_CHARS

    def __init__(self, resume: Resume, parts: Sequence[str], shown: str) -> None:
        self._resume = resume
        self._parts = tuple(parts)
        self._shown = [shown]           # everything shown of the answer so far, in pieces
        self._held: list[str] = []
        self._held_chars = 0
        self._passing = False

    @property
    def shown(self) -> str:
        """Everything shown of the answer so far."""
        return "".join(self._shown)

    def feed(self, delta: str) -> str:
        """The text to show for ``delta`` ("" while it is held back)."""
        if self._passing:
            self._shown.append(delta)
            return delta
        self._held.append(delta)
        self._held_chars += len(delta)
        if self._held_chars < self.HOLD or self._repeating():
            return ""
        return self.flush()

    def _repeating(self) -> bool:
        """What is held so far is text the answer shown has in its tail (a repeat may be
        under way: the join can only drop it once it is whole)."""
        if self._held_chars >= _OVERLAP_SEARCH_CHARS:
            return False
        held = "".join(self._held)
        self._held[:] = [held]
        return held in self.shown[-_OVERLAP_SEARCH_CHARS:]

    def flush(self) -> str:
        """Whatever is still held back, joined (at the continuation's end)."""
        if self._passing:
            return ""
        self._passing = True
        held = "".join(self._held)
        self._held.clear()
        joined = self._resume.join([*self._parts, held])
        shown = self.shown
        out = joined[len(shown):] if joined.startswith(shown) else held
        self._shown.append(out)
        return out
