"""Searching what was said: the recall tool's query, its bounds, its result's format and parse.

Pure: the session (``session/recall.py``) reads the transcript and hands its messages here.

- **Turns.** Turn N is the N-th user message of the transcript and everything said after it
  until the next one (answers, tool calls, tool results); what comes before the first user
  message (the system prompt) is turn 0. Turns count across resets and resumes: the
  transcript is the whole session.
- **A query** is words (every one must appear in a message, case-insensitive) or a regular
  expression, never both, optionally within a turn range. A pattern is refused, in one
  sentence, before it runs when it could take long: more than :data:`PATTERN_MAX_CHARS`
  characters, a back-reference, a repeat inside a repeat or over an alternation, or more
  than :data:`MAX_REPEATS` repeats in all. What is left runs on windows of at most
  :data:`WINDOW_CHARS` characters (a long line is searched in pieces), so one match costs
  at most a few milliseconds; ``keep_going`` (the session's time bound and the turn's
  deadline) is asked between messages.
- **The result** lists the matching passages, oldest first: a label line per passage
  (``— turn 3, assistant —``) and the matching lines (for words, the lines holding the most
  of them) with :data:`CONTEXT_LINES` lines of context each, within ``max_chars`` (what does not fit is counted, never cut mid-line). A
  long line is shown as the part around its match, cut at word ends. Like every text the
  package writes for the model, nothing in it starts a line with a command word or puts a
  bracket after the conversation's text (``core/markers.py``): labels are delimited by
  ``—``, and elisions are ``…``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from re import _constants, _parser  # type: ignore[attr-defined]
from typing import Any

from .history import TAG_COMPACTION_NOTICE, TAG_SERVER_COMPACTION, TAG_SUMMARY, Message, Role

__all__ = [
    "RECALL_TOOL",
    "Passage",
    "Query",
    "RecallError",
    "compile_query",
    "entries",
    "parse_passages",
    "search",
    "shows_compaction",
]

RECALL_TOOL = "recall_transcript"
"""The tool's name, as offered to the model and named in the compaction notices."""
PATTERN_MAX_CHARS = 200
MAX_REPEATS = 2
"""Repeats (``*``, ``+``, ``{m,n}``) a pattern may hold: three over a few hundred
characters already take seconds (``a*a*a*x`` against 300 ``a``: 0.4 s)."""
WINDOW_CHARS = 500
CONTEXT_LINES = 2
LINE_SHOW_CHARS = 300
"""A line longer than this is shown as the part around its match."""
WORDS_MAX = 12


class RecallError(ValueError):
    """A query that cannot run; its message is one sentence for the model."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the transcript, as recall searches it."""

    turn: int
    role: str
    text: str


@dataclass(frozen=True, slots=True)
class Query:
    words: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    @property
    def said(self) -> str:
        """The query as the result's first line names it."""
        if self.pattern is not None:
            return f"the pattern {self.pattern.pattern}"
        return "the words " + ", ".join(self.words)


@dataclass(frozen=True, slots=True)
class Passage:
    """A passage read back from a result: its turn, role and lines."""

    turn: int
    role: str
    lines: tuple[str, ...]


def shows_compaction(history: Iterable[Message]) -> bool:
    """Whether ``history`` carries a summary, a compaction notice or the provider's server
    compaction (it was compacted)."""
    return any(m.tag in (TAG_SUMMARY, TAG_COMPACTION_NOTICE, TAG_SERVER_COMPACTION)
               for m in history)


def _role(m: Message) -> str:
    if m.role is Role.TOOL:
        result = m.tool_result
        return f"tool result of {result.name}" if result is not None and result.name \
            else "tool result"
    return m.role.value


def _searchable(m: Message) -> str:
    calls = [f"calls {c.name} with {c.arguments}" for c in m.tool_calls]
    return "\n".join([m.text, *calls]) if calls else m.text


def entries(messages: Iterable[Message]) -> list[Entry]:
    """The transcript's messages with their turn numbers (see the module docstring)."""
    out: list[Entry] = []
    turn = 0
    for m in messages:
        if m.role is Role.USER:
            turn += 1
        out.append(Entry(turn, _role(m), _searchable(m)))
    return out


# -- the query --------------------------------------------------------------------------------

def _pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` could take long or cannot be read, or None."""
    if len(pattern) > PATTERN_MAX_CHARS:
        return (f"the pattern is {len(pattern)} characters long, more than the "
                f"{PATTERN_MAX_CHARS} allowed; search with words or a shorter pattern.")
    try:
        parsed = _parser.parse(pattern, re.IGNORECASE)
    except re.error as e:
        return f"the pattern is not a valid regular expression ({e.msg}); fix it or search with words."
    except (RecursionError, OverflowError):
        return "the pattern is nested too deeply; search with words or a simpler pattern."
    c = _constants
    repeats = {c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)}
    count = 0

    def walk(items: Iterable[tuple[Any, Any]], inside: bool) -> str | None:
        nonlocal count
        for op, av in items:
            if op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "the pattern has a back-reference, which can take very long; search " \
                       "with words or a pattern without one."
            if op in repeats:
                _low, high, sub = av
                if high > 1:
                    if inside:
                        return "the pattern repeats a repeat, which can take very long; " \
                               "search with words or a pattern without nested repeats."
                    count += 1
                problem = walk(sub, inside or high > 1)
            elif op is c.SUBPATTERN:
                problem = walk(av[-1], inside)
            elif op is c.BRANCH:
                if inside:
                    return "the pattern repeats an alternation, which can take very long; " \
                           "search with words or list the alternatives apart."
                problem = None
                for branch in av[1]:
                    problem = problem or walk(branch, inside)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                problem = walk(av[1], inside)
            else:
                problem = None
            if problem:
                return problem
        return None

    problem = walk(parsed, False)
    if problem is None and count > MAX_REPEATS:
        problem = (f"the pattern has {count} repeats, more than the {MAX_REPEATS} allowed; "
                   "search with words or a simpler pattern.")
    return problem


def compile_query(words: str = "", pattern: str = "") -> Query:
    """The query for ``words`` (split at blanks) or ``pattern``; :class:`RecallError` (one
    sentence) when neither, both, or a pattern that could take long is given."""
    split = tuple(dict.fromkeys(w.casefold() for w in words.split()))
    if split and pattern:
        raise RecallError("give either words or a pattern, not both.")
    if pattern:
        problem = _pattern_problem(pattern)
        if problem:
            raise RecallError(problem[0].upper() + problem[1:])
        return Query(pattern=re.compile(pattern, re.IGNORECASE))
    if not split:
        raise RecallError("give words to look for (all must match) or a pattern.")
    if len(split) > WORDS_MAX:
        raise RecallError(f"give at most {WORDS_MAX} words; every one must match, so a few "
                          "distinctive ones find more.")
    return Query(words=split)


# -- the search -------------------------------------------------------------------------------

def _windows(line: str) -> Iterable[tuple[int, str]]:
    if len(line) <= WINDOW_CHARS:
        yield 0, line
        return
    step = WINDOW_CHARS - 100        # overlapping: a match across a seam is still found
    for at in range(0, len(line), step):
        yield at, line[at:at + WINDOW_CHARS]


def _line_hit(line: str, query: Query) -> tuple[int, int] | None:
    """Where ``query`` matches ``line`` (start, end), or None."""
    if query.pattern is not None:
        for at, window in _windows(line):
            found = query.pattern.search(window)
            if found is not None:
                return at + found.start(), at + found.end()
        return None
    folded = line.casefold()
    for word in query.words:
        i = folded.find(word)
        if i >= 0:
            return i, i + len(word)
    return None


def _shown(line: str, hit: tuple[int, int] | None) -> str:
    """``line``, or the part of it around ``hit`` cut at word ends."""
    if len(line) <= LINE_SHOW_CHARS:
        return line
    start, end = hit if hit is not None else (0, 0)
    half = max((LINE_SHOW_CHARS - (end - start)) // 2, 20)
    lo, hi = max(start - half, 0), min(end + half, len(line))
    if lo > 0:
        space = line.find(" ", lo, start)
        lo = space + 1 if space >= 0 else lo
    if hi < len(line):
        space = line.rfind(" ", end, hi)
        hi = space if space >= 0 else hi
    return ("… " if lo > 0 else "") + line[lo:hi] + (" …" if hi < len(line) else "")


def _passage(entry: Entry, query: Query) -> list[str] | None:
    if query.words:
        folded = entry.text.casefold()
        if not all(w in folded for w in query.words):
            return None
    lines = entry.text.split("\n")
    hits = {i: h for i, h in ((i, _line_hit(line, query)) for i, line in enumerate(lines))
            if h is not None}
    if not hits:
        return None
    if len(query.words) > 1:
        # The lines holding the most of the words: in a 600-line log where every line
        # names the service, the one line that also holds the id.
        held = {i: sum(w in lines[i].casefold() for w in query.words) for i in hits}
        most = max(held.values())
        hits = {i: h for i, h in hits.items() if held[i] == most}
    keep = sorted({j for i in hits for j in range(max(i - CONTEXT_LINES, 0),
                                                  min(i + CONTEXT_LINES + 1, len(lines)))})
    out: list[str] = []
    last = -1
    for j in keep:
        if last >= 0 and j > last + 1:
            out.append("…")
        if lines[j].strip() or j in hits:
            out.append(_shown(lines[j], hits.get(j)))
        last = j
    return out


def label(turn: int, role: str) -> str:
    """A passage's label line: ``— turn 3, assistant —``."""
    return f"— turn {turn}, {role} —"


_LABEL_RE = re.compile(r"^— turn (\d+), ([a-z][\w .-]*) —$")
_NOTE_RE = re.compile(r"^… (?:\d+ more passages are not shown|The search stopped)")


def search(found: Sequence[Entry], query: Query, *, from_turn: int | None = None,
           to_turn: int | None = None, max_chars: int,
           keep_going: Callable[[], bool] = lambda: True) -> str:
    """The result text of ``query`` over ``found`` (see the module docstring)."""
    last = found[-1].turn if found else 0
    lo = 1 if from_turn is None else from_turn
    hi = last if to_turn is None else min(to_turn, last)
    if lo > hi:
        if lo > last:
            raise RecallError(f"the transcript has {last} turns, so there is nothing from "
                              f"turn {lo} on.")
        raise RecallError(f"from_turn {lo} is after to_turn {hi}; give a range that runs "
                          "forward.")
    span = f"turn {lo}" if lo == hi else f"turns {lo}-{hi}"
    passages: list[list[str]] = []
    stopped = False
    for entry in found:
        if not lo <= entry.turn <= hi:
            continue
        if not keep_going():
            stopped = True
            break
        lines = _passage(entry, query)
        if lines is not None:
            passages.append([label(entry.turn, entry.role), *lines])
    if not passages:
        more = " before the search stopped at its time bound" if stopped else ""
        return f"No passage of {span} matches {query.said}{more}."
    out = f"Transcript passages of {span} matching {query.said}:"
    shown = 0
    for passage in passages:
        block = "\n" + "\n".join(passage)
        if len(out) + len(block) > max_chars - 120:
            if shown == 0:      # the first passage at least partly: its label and lines
                for line in passage:
                    if len(out) + len(line) + 1 > max_chars - 120:
                        break
                    out += "\n" + line
                shown = 1
            break
        out += block
        shown += 1
    if shown < len(passages):
        out += (f"\n… {len(passages) - shown} more passages are not shown; narrow the "
                "search with from_turn and to_turn, or more words.")
    if stopped:
        out += ("\n… The search stopped at its time bound before the end of the range; "
                "narrow it with from_turn and to_turn.")
    return out


def parse_passages(text: str) -> list[Passage]:
    """The passages of a result :func:`search` wrote (empty for any other text)."""
    out: list[Passage] = []
    current: tuple[int, str] | None = None
    lines: list[str] = []
    for line in text.split("\n"):
        found = _LABEL_RE.match(line)
        if found:
            if current is not None:
                out.append(Passage(current[0], current[1], tuple(lines)))
            current, lines = (int(found.group(1)), found.group(2)), []
        elif current is not None and line != "…" and not _NOTE_RE.match(line):
            lines.append(line)
    if current is not None:
        out.append(Passage(current[0], current[1], tuple(lines)))
    return out

