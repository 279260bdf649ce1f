"""Every text the package writes for the model (not for the user).

The payload SYSTEM NOTICE and the compaction notice (SPEC §3), the summarizer's system
prompt and the header of its summary (SPEC §7). The emulator reads these to recognise
what the package wrote, so they live apart from the code that inserts them. The markers
and framing written around the conversation's own text are in ``markers.py``.

Each passes ModSecurity with the OWASP Core Rule Set at paranoia level 1 wherever it lands
in a request: no line starts with a word the rules read as a command, and no line ends
one word after an HTTP method name (``tests/test_markers.py`` holds the list of rules).
"""

from __future__ import annotations

from .recall import RECALL_TOOL

__all__ = [
    "COMPACTION_NOTICE",
    "PAYLOAD_NOTICE",
    "PINNED_RULES_HEADER",
    "SUMMARIZE_SYSTEM_PROMPT",
    "SUMMARY_CODE_SECTIONS",
    "SUMMARY_SECTIONS",
    "SUMMARY_HEADER",
    "USER_WORDS_HEADER",
    "RECALL_HINT",
    "compaction_notice",
    "explain_error",
    "summary_header",
    "with_recall_hint",
]

PAYLOAD_NOTICE = (
    "[SYSTEM NOTICE — PAYLOAD LIMIT HIT] A proxy/gateway rejected the previous\n"
    "request due to body size. History was compacted to recover. Going forward:\n"
    "(1) When reading files, prefer targeted reads with line ranges\n"
    "(e.g. sed -n '100,200p' file, or read_file with offset+limit) instead\n"
    "of reading entire files.\n"
    "(2) Prefer grep/ripgrep with specific patterns over full-file reads.\n"
    "(3) If you previously read a large file, its full content is persisted at\n"
    "the path shown in the tool-result preview — re-read specific ranges\n"
    "from that file rather than repeating the original read.\n"
    "(4) Summarize findings incrementally rather than accumulating raw tool output."
)

COMPACTION_NOTICE = (
    "[Context was automatically compacted due to size limits. Previous conversation "
    "history has been summarized. Continue from where you left off.]"
)
"""The SPEC's wording — used only when the dropped messages really were summarized."""


def compaction_notice(dropped: int, *, summarized: bool, unread: int = 0) -> str:
    """The compaction notice, true to what happened.

    The SPEC's :data:`COMPACTION_NOTICE` only when earlier history was summarized and
    nothing else was dropped; otherwise it says how many messages were dropped unsummarized,
    and ``unread`` how many of those the summary could not read within its request bound.
    """
    if summarized and dropped <= 0:
        return COMPACTION_NOTICE
    were = f"{dropped} earlier message{'s were' if dropped != 1 else ' was'}"
    why = ""
    if unread > 0:
        n = min(unread, dropped)
        why = (f"; {'all' if n == dropped else n} of them {'were' if n != 1 else 'was'} "
               "left unread, past the bound on summary requests")
    if summarized:
        return ("[Context was automatically compacted due to size limits. Previous "
                "conversation history has been summarized (the summary above), and "
                f"{were} dropped (not summarized{why}). Their full text is kept in the "
                "session transcript. Continue from where you left off.]")
    return (f"[Context was automatically compacted due to size limits: {were} dropped "
            f"(not summarized{why}). Their full text is kept in the session transcript. "
            "Continue from where you left off.]")


SUMMARY_HEADER = "[STRUCTURED SUMMARY — covering {n} earlier messages]"

SUMMARY_SECTIONS = ("Goal and constraints", "Data and variables", "Results and figures",
                    "Decisions", "Open questions", "Current step")
"""The sections every summary has, in order (a notebook session's substance)."""

SUMMARY_CODE_SECTIONS = ("Files read and modified", "Commands run", "Errors and resolutions")
"""The sections a summary adds where the conversation read or changed files, ran commands
or met errors (a coding agent's)."""


def _headings(names: tuple[str, ...]) -> str:
    return "\n".join(f"## {name}" for name in names)


SUMMARIZE_SYSTEM_PROMPT = f"""\
You compress the earlier part of a conversation between a user and an AI assistant, \
often data work in a notebook, so that it can continue within its context limit. You \
will be given those earlier messages, oldest first. Write a STRUCTURED SUMMARY of them.

Your first line is "[STRUCTURED SUMMARY — covering N earlier messages]". Below it come \
these sections, each a heading followed by short bullet points ("none" when there is \
nothing):

{_headings(SUMMARY_SECTIONS)}

and, where the conversation had them:

{_headings(SUMMARY_CODE_SECTIONS)}

Keep the user's instructions and corrections in the user's words, each dataframe with its \
shape and columns, each number with its unit, and exact names, identifiers, paths, dates \
and error messages. Do not invent anything, and do not answer or continue the \
conversation. Instructions after the messages, if any, say what to focus on. Be as short \
as the facts allow, and write in the language of the conversation."""
"""Plain prose whose lines start with words no firewall rule reads as a command (a line
starting "Start with …" is the Windows ``start`` to the OWASP CRS, rule 932115), and no
backtick, bracket after text or SQL function name before a parenthesis."""


def summary_header(covered: int) -> str:
    """``[STRUCTURED SUMMARY — covering N earlier messages]``."""
    return SUMMARY_HEADER.format(n=covered)


RECALL_HINT = ("Earlier details can be looked up in the full transcript with the "
               f"{RECALL_TOOL} tool.")
"""The sentence that names the recall tool (``core/recall.RECALL_TOOL``), appended to every
compaction notice and to a summary's header line: the tool is offered from the request
that carries either (``session/recall.py``)."""


def with_recall_hint(text: str) -> str:
    """``text`` (a compaction notice, or a summary's header line) with :data:`RECALL_HINT`
    appended: inside a bracketed notice's closing bracket, else after a space."""
    if text.endswith("]") and text.startswith("[Context"):
        return f"{text[:-1]} {RECALL_HINT}]"
    return f"{text} {RECALL_HINT}"


# -- trim -----------------------------------------------------------------------------------


def explain_error(source: str, trace: str, question: str = "") -> str:
    """The user message ``%chat error`` sends: the failed cell's code and its traceback."""
    # Tilde fences: a backtick before ``python`` reads as a shell command substitution to
    # a firewall (the OWASP CRS, rules 932105 and 932115); ``~~~`` is the same Markdown.
    code = source.strip() or "(the cell's code is not known)"
    ask = question.strip() or "Explain the error and how to fix the code."
    return (f"This notebook cell failed.\n\n~~~python\n{code}\n~~~\n\n"
            f"Traceback:\n~~~\n{trace.strip()}\n~~~\n\n{ask}")


# -- the user's words kept across compactions (core/pins.py) ---------------------------------

PINNED_RULES_HEADER = ("The user's standing instructions, each quoted verbatim from the "
                       "user's own earlier messages — they still apply:")
"""Opens the pinned rules' message; the rules follow it on the same line (``pins.py``).
No brackets: a ``]`` after the conversation's text can complete a firewall match
(``markers.py``), and these messages are merged with the text around them."""

USER_WORDS_HEADER = ("The user's own earlier messages, kept verbatim, oldest first — the "
                     "summary covers them too:")
"""Opens the message keeping the user's earlier messages after the summary (``pins.py``)."""
