"""Where a text may be cut: never inside a character cluster, and by preference at a line.

Two layers, used by every head/tail cut the package makes (budget previews, microcompact
previews, a long message cut by the ladder, a message cut in the summarizer's input):

- **Cluster-safe** (:func:`is_boundary`, :func:`cut_head`, :func:`cut_tail`): a cut never
  splits a character cluster (combining marks, ZWJ emoji sequences, flags, surrogate
  pairs; ANCHORS 10).
- **Clean** (:func:`head_cut`, :func:`tail_cut`): a head ends at the end of a line and a
  tail starts at the start of one when one is near (within a quarter of what is kept);
  otherwise at a word boundary; only failing both at a cluster boundary. Each
  :class:`Cut` says whether it fell on a line boundary, so the marker between head and
  tail goes on a line of its own only between whole lines, and is written on the same
  line (with a space) otherwise (:func:`ipy_ctxrecovery.core.markers.join_cut`).

Why clean cuts: a web application firewall in front of the model (ModSecurity with the
OWASP Core Rule Set, paranoia level 1, as Debian ships it) reads every JSON string of the
request. It takes a line that *starts* with a command name (``ls``, ``set``, ``start``,
``find``, ``timeout``… after a newline) for command injection (rules 932100–932115), and a
line that *ends* one word after an HTTP method name (``lock acco``, ``put it``) for request
smuggling (921110). A head cut mid-word followed by a newline, or a newline followed by a
tail cut mid-word (``details`` → ``ls``), makes such lines out of text that had none.
Cutting at line boundaries keeps every line start and line end of the original as it
was, and a mid-line cut joined with a space adds none, so a preview never trips a rule
its original did not.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

__all__ = ["Cut", "cut_head", "cut_tail", "head_cut", "is_boundary", "tail_cut"]

# How far a cut may move to avoid splitting a character cluster.
_MAX_CLUSTER_SHIFT = 32
# A clean cut may give up at most 1/_SLACK_SHARE of what it keeps to reach a line or word.
_SLACK_SHARE = 4


# -- cluster-safe cuts -----------------------------------------------------------------------

_ZWJ = "\u200d"


def _is_regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _extends(ch: str) -> bool:
    """True when ``ch`` continues the cluster before it (never starts one)."""
    if ch in (_ZWJ, "\ufe0e", "\ufe0f"):
        return True
    if "\U0001f3fb" <= ch <= "\U0001f3ff" or "\U000e0020" <= ch <= "\U000e007f":
        return True                                  # skin tones, emoji tag sequences
    if "\udc00" <= ch <= "\udfff":
        return True                                  # low surrogate of a pair
    return unicodedata.category(ch) in ("Mn", "Mc", "Me")


def is_boundary(text: str, i: int) -> bool:
    """Whether cutting ``text`` between ``text[i-1]`` and ``text[i]`` keeps clusters whole."""
    if i <= 0 or i >= len(text):
        return True
    before, ch = text[i - 1], text[i]
    if _extends(ch) or before == _ZWJ or (before == "\r" and ch == "\n"):
        return False
    if unicodedata.category(before) == "Mn" and unicodedata.combining(before) == 9 \
            and unicodedata.category(ch) == "Lo":
        return False                                 # virama + consonant (e.g. क्ष)
    if _is_regional(before) and _is_regional(ch):
        run = 0
        j = i - 1
        while j >= 0 and _is_regional(text[j]):
            run += 1
            j -= 1
        return run % 2 == 0                          # flags are pairs of indicators
    return True


def safe_head(text: str, end: int) -> int:
    """``end``, moved back to the nearest cluster boundary (at most ``_MAX_CLUSTER_SHIFT``)."""
    k = end
    while k > 0 and end - k < _MAX_CLUSTER_SHIFT and not is_boundary(text, k):
        k -= 1
    return k if is_boundary(text, k) else end


def safe_tail(text: str, start: int) -> int:
    """``start``, moved on to the nearest cluster boundary (at most ``_MAX_CLUSTER_SHIFT``)."""
    k = start
    while k < len(text) and k - start < _MAX_CLUSTER_SHIFT and not is_boundary(text, k):
        k += 1
    return k if is_boundary(text, k) else start


def cut_head(text: str, n: int) -> str:
    """The first ``n`` chars of ``text`` or fewer, ending on a cluster boundary."""
    return text[:safe_head(text, max(0, min(n, len(text))))]


def cut_tail(text: str, n: int) -> str:
    """The last ``n`` chars of ``text`` or fewer, starting on a cluster boundary."""
    return text[safe_tail(text, max(0, len(text) - max(0, n))):]


# -- clean cuts ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Cut:
    """A cut position ``at`` in a text, and whether it falls on a line boundary: for a
    head, ``text[at]`` is a newline (or ``at`` is the end); for a tail, ``text[at - 1]`` is
    one (or ``at`` is 0)."""

    at: int
    line: bool


def _slack(n: int) -> int:
    return max(1, n // _SLACK_SHARE)


def head_cut(text: str, n: int) -> Cut:
    """Where a head of at most ``n`` chars of ``text`` ends: the latest line end within the
    last quarter of ``n``, else the latest word end there, else a cluster boundary.

    ``text[:cut.at]`` is the head. A head never ends right after a fragment of a word
    unless the text has no whitespace near ``n``.
    """
    n = max(0, n)
    if n >= len(text):
        return Cut(len(text), True)
    low = max(1, n - _slack(n))
    newline = text.rfind("\n", low, n + 1)
    if newline > 0:
        return Cut(newline, True)
    for k in range(n, low - 1, -1):
        if text[k].isspace() and not text[k - 1].isspace() and is_boundary(text, k):
            return Cut(k, False)
    return Cut(safe_head(text, n), False)


def tail_cut(text: str, n: int, *, floor: int = 0) -> Cut:
    """Where a tail of at most ``n`` chars of ``text`` starts (never before ``floor``): the
    earliest line start within the first quarter of ``n``, else the earliest word start
    there, else a cluster boundary.

    ``text[cut.at:]`` is the tail. A tail never starts with a fragment of a word unless the
    text has no whitespace near its start.
    """
    n = max(0, n)
    start = max(floor, len(text) - n)
    if start <= 0:
        return Cut(0, True)
    if start >= len(text):
        return Cut(len(text), False)
    high = min(len(text) - 1, start + _slack(n))
    newline = text.find("\n", start - 1, high)
    if newline >= 0:
        return Cut(newline + 1, True)
    for k in range(start, high + 1):
        if text[k - 1].isspace() and not text[k].isspace() and is_boundary(text, k):
            return Cut(k, False)
    return Cut(max(start, safe_tail(text, start)), False)
