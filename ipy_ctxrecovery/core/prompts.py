"""Every text the package writes for the model (not for the user).

The payload SYSTEM NOTICE and the compaction notice (SPEC §3), the summarizer's system
prompt and the header of its summary (SPEC §7). The emulator reads these to recognise
what the package wrote, so they live apart from the code that inserts them.
"""

from __future__ import annotations

__all__ = [
    "COMPACTION_NOTICE",
    "PAYLOAD_NOTICE",
    "SUMMARIZE_SYSTEM_PROMPT",
    "SUMMARY_HEADER",
    "compaction_notice",
    "explain_error",
    "summary_header",
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


def compaction_notice(dropped: int, *, summarized: bool) -> str:
    """The compaction notice, true to what happened.

    The SPEC's :data:`COMPACTION_NOTICE` only when earlier history was summarized and
    nothing else was dropped; otherwise it says how many messages were dropped unsummarized.
    """
    if summarized and dropped <= 0:
        return COMPACTION_NOTICE
    were = f"{dropped} earlier message{'s were' if dropped != 1 else ' was'}"
    if summarized:
        return ("[Context was automatically compacted due to size limits. Previous "
                "conversation history has been summarized (the summary above), and "
                f"{were} dropped (not summarized). Their full text is kept in the session "
                "transcript. Continue from where you left off.]")
    return (f"[Context was automatically compacted due to size limits: {were} dropped "
            "(not summarized). Their full text is kept in the session transcript. "
            "Continue from where you left off.]")


SUMMARY_HEADER = "[STRUCTURED SUMMARY — covering {n} earlier messages]"

SUMMARIZE_SYSTEM_PROMPT = """\
You compress the earlier part of a conversation between a user and an AI assistant that \
uses tools, so that the conversation can continue within its context limit. You will be \
given those earlier messages, oldest first. Write a STRUCTURED SUMMARY of them.

Start with the line "[STRUCTURED SUMMARY — covering N earlier messages]", then write these \
sections, each a heading followed by short bullet points ("none" when there is nothing):

## Files read
## Files modified
## Commands run
## Key decisions
## Errors and resolutions
## Current task state

Rules: keep exact file paths, names, identifiers, numbers and error messages; record what \
was done and what is still pending, not how the conversation went; do not invent anything \
that is not in the messages; do not answer or continue the conversation; be as short as \
the facts allow. Write in the language of the conversation."""


def summary_header(covered: int) -> str:
    """``[STRUCTURED SUMMARY — covering N earlier messages]``."""
    return SUMMARY_HEADER.format(n=covered)


# -- trim -----------------------------------------------------------------------------------


def explain_error(source: str, trace: str, question: str = "") -> str:
    """The user message ``%chat error`` sends: the failed cell's code and its traceback."""
    code = source.strip() or "(the cell's code is not known)"
    ask = question.strip() or "Explain the error and how to fix the code."
    return (f"This notebook cell failed.\n\n```python\n{code}\n```\n\n"
            f"Traceback:\n```\n{trace.strip()}\n```\n\n{ask}")
