"""Whether a summary the model wrote may replace the messages it stands for, and if not, why.

A small model asked to summarize often writes something else, and the compactor used to
accept anything shorter than its input. Measured against SmolLM2-135M (issue 27), it
accepted "The previous message was cut off at token limit." for 12 messages, "I'm ready to
help. What's your next question?", a copy of the omission note, and summaries cut off at
their own ``max_tokens``. :func:`refusal` says why such a summary must be refused, in one
short clause (it is shown as "summary not used (…)"), or None. In order:

1. **cut at its own ``max_tokens``** (``truncated``: the provider's finish reason; the
   session retries with a bigger ``max_tokens`` first, where the window allows);
2. **answers instead of summarizing**: it opens as a reply (a greeting, "I'm ready to
   help", "Sure", "Here is…"), or ends on a question to the user that is not an item of a
   list ("What's your next question?"). A first line that only announces the summary
   ("Sure, here is the summary:") is not counted, and the compactor drops it
   (:func:`without_preface`);
3. **mostly scaffolding**: once the summarizer's own framing is taken out (the preamble,
   message labels and end marks, the omission note, the instructions prefix, any sentence
   copied from the system prompt or the continuation prompt), less than a third of its
   text is left — its header, headings and "none" lines aside (all it has are those: it
   has no text of its own);
4. **keeps none of the input's facts** (``core/facts.py``), when the input had at least
   :data:`MIN_FACTS` (one or two may be paraphrased away by a fair summary).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from . import markers
from .continuation import CONTINUATION_PROMPT
from .facts import FACTS_HEADING, Fact, missing
from .prompts import SUMMARIZE_SYSTEM_PROMPT

__all__ = ["MIN_FACTS", "SCAFFOLDING_SHARE", "refusal", "without_preface"]

MIN_FACTS = 3
"""A summary keeping none of the input's facts is refused when there were at least this many."""

SCAFFOLDING_SHARE = 1 / 3
"""A summary whose own text (framing taken out) is less than this share of it is refused."""

_REPLY_OPENINGS = re.compile(
    r"(?:hello|hi|hey|greetings|good (?:morning|afternoon|evening)|dear)\b"
    r"|i'?m (?:ready|happy|glad|here) to help|i am (?:ready|happy|glad|here) to help"
    r"|how (?:can|may) i (?:help|assist)|sure\b|certainly\b|of course\b|absolutely\b"
    r"|great question|thanks? (?:you )?for|what(?:'s| is) your (?:next )?question"
    r"|here(?:'s| is| are)\b(?![^\n]{0,40}\bsummary\b)"
    r"|let me know\b|please (?:provide|share|tell)",
    re.IGNORECASE)

# The framing of the summarizer's input, as a model may copy it: the package's forms
# (markers.py) and the bracketed ones earlier versions wrote.
_FRAMING = (
    re.compile(r"\[?\s*message \d+ of \d+\b[^:\]\n]*[:\]]", re.I),        # a label
    re.compile(r"\[?\s*[—–-]*\s*end of message \d+\s*\]?", re.I),       # an end mark
    re.compile(r"…?\s*\d+ older messages? \(\d+ chars\) omitted[^…\n]*…?", re.I),
    re.compile(r"summarize these \d+ earlier messages[^\n]*?(?:end mark\.|$)", re.I | re.M),
    re.compile(r"each opens with a label[^\n]*?end mark\.", re.I),
    re.compile(re.escape(markers.INSTRUCTIONS_PREFIX), re.I),
)
# A summary's own structure: neither the conversation nor framing (a summary of headings
# and "none" only has no text of its own at all).
_STRUCTURE = (
    re.compile(r"\[?\s*structured summary\s*[—–-]*\s*(?:covering \d+ earlier messages?)?\s*\]?",
               re.I),
    re.compile(r"^\s*#+[^\n]*$", re.M),                                # a section heading
    re.compile(rf"^{re.escape(FACTS_HEADING)}", re.M),
    re.compile(r"^\s*[-*]?\s*(?:none|n/a|nothing)\.?\s*$", re.I | re.M),
)
_PROMPT_LINE_MIN = 24           # a copied line of the prompts is at least this long


def refusal(summary: str, *, facts: Sequence[Fact] = (), truncated: bool = False) -> str | None:
    """Why ``summary`` (its body, without the package's header) must not replace the
    messages whose ``facts`` are given, or None (the checks: module docstring)."""
    if truncated:
        return "the summary was cut off at its own max_tokens"
    body = without_preface(summary.strip())
    if _answers(body):
        return "the summarizer answered the conversation instead of summarizing it"
    if _own_share(body) < SCAFFOLDING_SHARE:
        return "the summary is mostly the summarizer's own framing, not the conversation"
    if len(facts) >= MIN_FACTS and len(missing(facts, body)) == len(facts):
        return f"the summary keeps none of the {len(facts)} facts of the messages it replaces"
    return None


_PREFACE_RE = re.compile(r"\A[^\n]{0,80}\bsummary\b[^\n]{0,40}:[ \t]*\n", re.IGNORECASE)


def without_preface(body: str) -> str:
    """``body`` without an opening line that only announces it ("Sure, here is the
    summary:"), which a model often writes before the summary itself."""
    return _PREFACE_RE.sub("", body.lstrip(), count=1).lstrip("\n")


def _answers(body: str) -> bool:
    opening = body.lstrip("#*_>`\"' \t\n").replace("’", "'")
    if _REPLY_OPENINGS.match(opening):
        return True
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    # An open question listed as an item is a summary's; a free question ends a reply.
    return last.endswith("?") and not re.match(r"(?:[-*+•]|\d+[.)])\s", last)


def _own_share(body: str) -> float:
    """The share of ``body``'s text (non-blank chars, its headings and "none" lines aside)
    left once the framing and the prompts' lines are taken out."""
    def solid(text: str) -> int:
        return len(re.sub(r"\s+", "", text))

    for pattern in _STRUCTURE:
        body = pattern.sub(" ", body)
    total = solid(body)
    if not total:
        return 0.0
    rest = body
    for pattern in _FRAMING:
        rest = pattern.sub(" ", rest)
    rest = _without_prompt_lines(rest)
    return solid(rest) / total


def _without_prompt_lines(text: str) -> str:
    """``text`` without the stretches copied from the system or continuation prompt."""
    prompts = " ".join(f"{SUMMARIZE_SYSTEM_PROMPT} {CONTINUATION_PROMPT}".split()).lower()
    out = []
    for raw in text.splitlines():
        kept = []
        for piece in re.split(r"(?<=[.!?])\s+", raw):
            folded = " ".join(piece.split()).lower().strip(" -*")
            if len(folded) >= _PROMPT_LINE_MIN and folded in prompts:
                continue
            kept.append(piece)
        out.append(" ".join(kept))
    return "\n".join(out)
