"""Every marker the package writes into a history or a summary request: formatted and parsed here.

- **Cut markers** between a head and a tail: a tool-result budget preview (SPEC §5), an old
  result's preview (microcompact, SPEC §6), a long message cut by the ladder, a message cut
  in the summarizer's input. :func:`join_cut` puts one between a head and a tail.
- **One-liners** standing for a whole result: an old result cleared (SPEC §6) and a
  duplicate result's pointer (the compactor's trim).
- **The summarizer's framing** (SPEC §7): its opening instruction, each message's label and
  end mark (a message split over several requests: each part's, ``Message 3 of 12, part 2
  of 4, from the user:``), the summary so far carried into the next request of a chunked
  summary, the note on omitted messages, a manual compact's extra instructions.

- **The join of a merged run**: a summary, a notice and the request sent as one string
  (the OpenAI adapter's merged user message): :data:`MERGED_TEXT_JOIN`.

The summary's header and the notices are prompts (``core/prompts.py``).

Every one of them passes ModSecurity with the OWASP Core Rule Set at paranoia level 1 (the
firewall most companies put in front of web services), and none of them completes a rule
match that the text around it did not already make, wherever it lands in a request. The
rules that read text across lines (``tests/test_markers.py`` lists them) dictate:

- **no brackets or parentheses after the conversation's text.** A word ending in ``self``,
  ``this``, ``top`` (``stop``, ``laptop``), ``window`` or ``document`` followed by ``[`` or
  ``)`` and, anywhere later in the same string, by ``]`` reads as JavaScript (941370) —
  and ``def close(self):`` is in every Python class. ``user``, ``database`` or ``schema``
  followed by ``(`` reads as SQL (942190). So a cut marker, a label or an end mark that
  follows the conversation's text is delimited by ``…`` and ``—``, never by brackets;
  one-liners the package writes as a whole message (``[Old tool result cleared — …]``, a
  notice) keep their brackets in the history, where nothing precedes them, and lose them
  where the summarizer's input puts them after other text (:func:`unbracket`).
- **no new line starts or line ends.** A line starting with a command name (``Start``,
  ``Set``, ``Find``, ``Sort``, ``Timeout``, ``Type``… after a newline) reads as command
  injection (932100–932115), and a line ending one word after an HTTP method name
  (``lock acco``, ``put it``) as request smuggling (921110). A label opens its message on
  the message's first line and an end mark closes it on its last; a cut marker sits on a
  line of its own only between whole lines (``cuts.Cut.line``), and beside a cut inside
  a line it is joined with a space.
- no word in them is a command, SQL function or HTTP method where those rules look for
  one, and none of them starts a line with anything but a letter or ``…``.

The user's own text is never changed: only what surrounds it and where it is cut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUDGET_RE",
    "CUT_RE",
    "END_RE",
    "INSTRUCTIONS_PREFIX",
    "LABEL_RE",
    "LONG_MESSAGE_RE",
    "MERGED_TEXT_JOIN",
    "OLD_PREVIEW_RE",
    "OMITTED_NOTE_RE",
    "ONE_LINE_RE",
    "POINTER_PREFIX",
    "PREAMBLE_RE",
    "ROLLING_END",
    "ROLLING_RE",
    "SummaryLabel",
    "budget_markers",
    "cut_marker",
    "duplicate_pointer",
    "end_mark",
    "instructions",
    "is_one_liner",
    "join_cut",
    "label",
    "long_message_marker",
    "old_preview_marker",
    "old_result_cleared",
    "omitted_note",
    "preamble",
    "rolling_label",
    "tool_call",
    "unbracket",
    "unframe_line",
]


# -- joining a head and a tail ---------------------------------------------------------------

def join_cut(head: str, marker: str, tail: str, *, head_line: bool, tail_line: bool) -> str:
    """``head`` + ``marker`` + ``tail``: the marker on a line of its own next to a cut at a
    line boundary, on the same line (a space) next to a cut inside a line."""
    left = ("\n" if head_line else " ") if head else ""
    right = ("\n" if tail_line else " ") if tail else ""
    return f"{head}{left}{marker}{right}{tail}"


_JOIN = r"[\n ]"                                          # what join_cut puts on either side


# -- cut markers -----------------------------------------------------------------------------

def budget_markers(omitted: int, path: Path | None,
                   lines: tuple[int, int, int] | None = None) -> list[str]:
    """A budget preview's marker, most to least informative; the first that fits wins.

    ``lines`` is (first omitted line, last omitted line, total lines), counted from 0 as
    ``read_file``'s offset is, so the model can ask for exactly the part it did not see.
    """
    n = f"{omitted}"
    out = []
    if path is not None:
        if lines is not None:
            first, last, total = lines
            out.append(f"… {n} chars omitted: lines {first}–{last} of {total} — full output "
                       f"saved to {path}; read them with read_file(path, offset={first}, "
                       f"limit={last - first + 1}) …")
        out.append(f"… {n} chars omitted — full output saved to {path}; "
                   "read ranges with read_file(path, offset, limit) …")
        out.append(f"… {n} chars omitted — full output saved to {path} …")
    out.append(cut_marker(omitted))
    return out


BUDGET_RE = re.compile(
    rf"{_JOIN}?(?P<open>\[)?… (?P<n>\d+) chars omitted(?:: lines \d+–\d+ of \d+)?"
    r"(?: — full output saved to (?P<path>.+?)"
    r"(?:; read (?:ranges|them) with read_file\(path, offset(?:=\d+)?, limit(?:=\d+)?\))?)?"
    rf"(?(open)\]| …){_JOIN}?")
"""Also reads the bracketed form earlier versions wrote (``[… N chars omitted]``)."""


def old_preview_marker(omitted: int, path: Path | None) -> str:
    """``… N chars omitted from old tool result — full output saved to PATH …``."""
    saved = f" — full output saved to {path}" if path is not None else ""
    return f"… {omitted} chars omitted from old tool result{saved} …"


OLD_PREVIEW_RE = re.compile(
    rf"{_JOIN}?(?P<open>\[\.\.\. )?(?(open)|… )(?P<n>\d+) chars omitted from old tool result"
    rf"(?: — full output saved to (?P<path>.+?))?(?(open) \.\.\.\]| …){_JOIN}?")
"""Also reads the bracketed form earlier versions wrote (``[... N chars omitted from old
tool result ...]``)."""


def long_message_marker(omitted: int, what: str) -> str:
    """``… 1,234 chars omitted from a long assistant message …``."""
    return f"… {omitted:,} chars omitted from {what} …"


LONG_MESSAGE_RE = re.compile(rf"{_JOIN}?… [\d,]+ chars omitted from (?!old tool result)"
                             rf"[^…\n]*? …{_JOIN}?")


def cut_marker(omitted: int) -> str:
    """The plainest cut marker (a message cut in the summarizer's input, a budget preview
    with no room for more): ``… N chars omitted …``."""
    return f"… {omitted} chars omitted …"


CUT_RE = re.compile(rf"{_JOIN}?… \d+ chars omitted …{_JOIN}?")


# -- one-liners ------------------------------------------------------------------------------

def old_result_cleared(lines: int, chars: int, kind: str, path: Path | None) -> str:
    """``[Old tool result cleared — L lines, C chars, KIND — full content at PATH]``."""
    noun = "line" if lines == 1 else "lines"
    where = f" — full content at {path}" if path is not None else ""
    return f"[Old tool result cleared — {lines} {noun}, {chars} chars, {kind}{where}]"


ONE_LINE_RE = re.compile(
    r"\[Old tool result cleared — (?P<lines>\d+) lines?, (?P<chars>\d+) chars, (?P<kind>[^\]—]+?)"
    r"(?: — full content at (?P<path>.+))?\]")

POINTER_PREFIX = "[Duplicate tool result omitted ("


def duplicate_pointer(chars: int, tool: str | None, call_id: str) -> str:
    """A tool result identical to a later one: a pointer to that later copy."""
    name = f"{tool} " if tool else ""
    return f"{POINTER_PREFIX}{chars} chars): identical to the later {name}result of call {call_id}]"


def is_one_liner(text: str) -> bool:
    """Whether ``text`` is a one-liner this module writes for a whole tool result."""
    return text.startswith(POINTER_PREFIX) or ONE_LINE_RE.fullmatch(text) is not None


def unbracket(text: str) -> str:
    """A whole-message text the package wrote (a one-liner, a notice), without its outer
    brackets: how it is quoted after other text, where a ``]`` could close a match the
    text before it opened (module docstring). Only for the package's own texts."""
    if text.startswith("[") and text.endswith("]"):
        return text[1:-1]
    return text


# -- the summarizer's framing ----------------------------------------------------------------

def preamble(count: int, *, chunk: int = 1, chunks: int = 1, rolling: bool = False) -> str:
    """The summarizer input's opening instruction (plain prose, one paragraph).

    A summary sent in ``chunks`` requests names which one this is and, with ``rolling``,
    that the summary so far comes first and is to be extended (never restarted)."""
    text = (f"Summarize these {count} earlier messages of the conversation (oldest first). "
            "Each opens with a label naming who wrote it and closes with an end mark.")
    if chunks > 1:
        text += (f" They come in {chunks} requests, oldest first, and here is request "
                 f"{chunk} of {chunks}.")
    if rolling:
        text += (" The summary so far, written from the messages of the earlier requests, "
                 "comes first: write one summary of it and of the messages after it, keeping "
                 "every fact it holds.")
    return text


PREAMBLE_RE = re.compile(r"^Summarize these (\d+) earlier messages\b", re.I)


@dataclass(frozen=True, slots=True)
class SummaryLabel:
    """Who wrote a message, as its label in the summarizer's input says it."""

    role: str                      # "user" | "assistant" | "system" | "tool"
    tool: str | None = None        # a tool result: the tool's name (or the call id)
    error: bool = False            # a tool result that is an error
    summary: bool = False          # an earlier summary
    tag: str | None = None         # a message the package wrote (compaction notice, …)


def label(index: int, total: int, who: SummaryLabel, *, part: int = 1, parts: int = 1) -> str:
    """``Message 3 of 12, from the user:``, ``Message 5 of 12, a tool result of read_log:``…
    (a message split in parts: ``Message 3 of 12, part 2 of 4, from the user:``).

    It starts its line, and the message's first line follows it on the same line.
    """
    if who.summary:
        what = "the summary of earlier messages"
    elif who.role == "tool":
        what = f"a tool result of {who.tool or 'a tool'}" + (", an error" if who.error else "")
    else:
        what = f"from the {who.role}"
    if who.tag and not who.summary:
        what += f", a {who.tag.replace('_', ' ')}"
    split = f" part {part} of {parts}," if parts > 1 else ""
    return f"Message {index} of {total},{split} {what}:"


def end_mark(index: int, *, part: int = 1, parts: int = 1) -> str:
    """``— end of message 3`` (``— end of message 3, part 2 of 4``): closes a message (or
    a part of one) on its last line."""
    split = f", part {part} of {parts}" if parts > 1 else ""
    return f"— end of message {index}{split}"


def rolling_label() -> str:
    """Opens the summary so far carried into the next request of a chunked summary (its
    first line follows on the same line, as after a message's label)."""
    return "The summary so far:"


ROLLING_END = "— end of the summary so far"
"""Closes the summary so far on its last line."""

ROLLING_RE = re.compile(r"^The summary so far: ?")


def tool_call(name: str, arguments: str) -> str:
    """A tool call an assistant message made, on a line of its own."""
    return f"Tool call: {name} {arguments}"


LABEL_RE = re.compile(r"^Message (\d+) of (\d+), [^:\n]*: ?")
END_RE = re.compile(r" ?— end of (?:message \d+(?:, part \d+ of \d+)?|the summary so far)$")


def omitted_note(count: int, chars: int) -> str:
    """Older messages left out of the summarizer's input to bound its size."""
    return f"… {count} older messages ({chars} chars) omitted from this input to bound its size …"


OMITTED_NOTE_RE = re.compile(r"^… \d+ older messages? \(\d+ chars\) omitted\b")

INSTRUCTIONS_PREFIX = "Additional instructions for this summary:"

MERGED_TEXT_JOIN = "\n\n— "
"""Between the texts of a merged run sent as one string (a summary, a notice, the request):
a blank line, so they read as separate paragraphs, and a dash, so the next text does not
start a line (a request that begins "Sort…", "Format…" or "Replace…" on a line of its own
reads as a command to the firewall's rules 932110/932115). The user's text is unchanged."""


def instructions(text: str) -> str:
    """A manual compact's focus, appended after the messages (the user's words, on the
    same line as the prefix)."""
    return f"{INSTRUCTIONS_PREFIX} {text}"


def unframe_line(line: str) -> tuple[list[str], bool]:
    """The conversation's text in a line of a summarizer input, with the framing taken off
    (a label, an end mark; a cut marker splits it in two pieces), and whether the line
    opened a message."""
    opened = LABEL_RE.match(line) or ROLLING_RE.match(line)
    if opened:
        line = line[opened.end():]
    pieces = [p.strip() for p in CUT_RE.split(END_RE.sub("", line))]
    return [p for p in pieces if p], opened is not None
