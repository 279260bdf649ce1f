"""The facts of the messages a summary replaces, which of them a summary lost, and their list.

A notebook conversation lives on exact details: a column name, a threshold, a figure with
its unit, a path, a date. A summary written by a model may drop or garble any of them, so
after it is written the compactor takes them from the messages it replaces
(:func:`extract`), finds those the summary does not carry (:func:`missing`) and appends
them verbatim (:func:`append_missing`).

What counts as a fact (each taken verbatim, as the message wrote it):

- **identifiers**: ``snake_case``, ``camelCase`` / ``DataFrame``, dotted names
  (``df.groupby``, ``np.mean``), and whatever a message put in backticks when it is short
  and plain (a column name such as ``price usd``);
- **numbers with their units**: ``3.2 GB``, ``0.05``, ``12%``, ``1,234 rows``, ``$1,200``,
  versions (``3.11.2``) and dates (``2026-11-30``); a bare integer of one or two digits is
  one only as a value (``seed=42``, ``k <= 10``), not as a count or an ordinal (``step 2``);
- **paths and URLs** (``data/raw/sales.csv``, ``~/x.ipynb``, ``https://…``; credentials were
  masked upstream, and a URL stops at a bracket, so ``[REDACTED]`` is not part of it);
- **capitalised names** (``Acme Corp``, ``ROC``); a capitalised word opening a sentence is a
  name only when it is not a common word and the text never writes it in lower case;
- **quoted strings** (``"gross margin"``), when short and on one line.

Comparison (:func:`missing`): identifiers, paths and URLs exactly (case included), as whole
tokens; numbers by value and unit (``1,234 rows`` = ``1234 rows``, ``3.2GB`` = ``3.2 GB``;
a fact with no unit is kept by the same value with any unit); names and quoted strings
ignoring case and runs of blanks.

The list (:func:`append_missing`) goes under the heading :data:`FACTS_HEADING`, one fact a
line as ``- `` + the fact, most recent first, while the next line fits the bound. A line
starting with ``-`` starts no command to a firewall (``markers.py``); a fact that would end
its line one word after an HTTP method name (``put it``: rule 921110) or carries a bracket
or a backtick is left out of the list rather than sent (counted in ``left_out``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

from ..redaction import MASK

__all__ = [
    "FACTS_HEADING",
    "Fact",
    "FactCheck",
    "FactKind",
    "append_missing",
    "extract",
    "missing",
]

FactKind = Literal["identifier", "number", "date", "path", "url", "name", "quoted"]

FACTS_HEADING = "Facts kept verbatim:"
"""The heading of the list :func:`append_missing` writes (its first word starts no command)."""


@dataclass(frozen=True, slots=True)
class Fact:
    """One fact: its text as the message wrote it, its kind, the index of the (last)
    message it came from, and the key it is compared by."""

    text: str
    kind: FactKind
    message: int
    key: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FactCheck:
    """A summary against the facts of what it replaces: ``kept`` were in the summary,
    ``added`` appended verbatim, ``left_out`` neither (no room, or unsafe to send)."""

    total: int = 0
    kept: int = 0
    added: int = 0
    left_out: int = 0


# -- what a fact looks like ------------------------------------------------------------------

_URL_RE = re.compile(r"\bhttps?://[^\s\[\]()<>\"'`]+")
_EXTENSIONS = ("py|ipynb|csv|tsv|parquet|feather|json|jsonl|xlsx|xls|txt|md|log|yaml|yml|toml|"
               "cfg|ini|sql|db|sqlite|pkl|pickle|npy|npz|h5|hdf5|png|jpg|jpeg|svg|pdf|html|zip|"
               "gz|tar|sh|r|js|ts")
_PATH_RE = re.compile(
    r"(?<![\w/.~-])(?:"
    r"(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]+)+/?"                   # /a/b, ./a/b, ~/a/b
    r"|(?:~|\.{1,2})/[\w.-]+"                                  # ./a, ~/a
    r"|[A-Za-z]:\\[\w.\\ -]*[\w.]"                             # C:\data\x.csv
    r"|[\w.-]+(?:/[\w.-]+)+"                                   # data/raw/sales.csv
    rf"|[\w-]+(?:\.[\w-]+)*\.(?:{_EXTENSIONS})"                # sales.csv
    r")(?![\w/])", re.IGNORECASE)
_DATE_RE = re.compile(r"(?<![\w.-])\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?(?![\w-])")
_VERSION_RE = re.compile(r"(?<![\w.])v?\d+(?:\.\d+){2,}(?![\w.]\w)")
_BACKTICK_RE = re.compile(r"`([^`\n]{1,60})`")
_QUOTED_RE = re.compile(r"\"([^\"\n]{3,80})\"|“([^”\n]{3,80})”|(?<!\w)'([^'\n]{3,80})'(?!\w)")
_IDENTIFIER_RE = re.compile(
    r"(?<![\w.])(?:"
    r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"                         # df.groupby, np.mean
    r"|_*[A-Za-z][A-Za-z0-9]*(?:_+[A-Za-z0-9]+)+_*"            # snake_case
    r"|[a-z]+[0-9]*[A-Z]\w*"                                   # camelCase
    r"|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+"                      # DataFrame, GroupBy
    r"|[A-Z]{2,}[a-z]\w*"                                      # XGBoost
    r")(?![\w])")
_NUMBER_RE = re.compile(
    r"(?<![\w.,/])(?P<cur>[$€£])?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+|\.\d+)"
    r"(?![\w.,]?\d)(?:[ \u00a0]?(?P<unit>%|°[CF]|[A-Za-z]+\b))?")
_WORD = r"(?:[A-ZÀ-ÖØ-Þ][a-zß-öø-ÿ]+(?:['’-][A-Za-z]+)?|[A-Z]{2,}\d*)"
_NAME_RE = re.compile(rf"(?<![\w'’-]){_WORD}(?:[ ]{_WORD})*(?![\w'’-])")
_SETTING_RE = re.compile(r"[=<>≤≥]\s*\Z")
_BULLET_RE = re.compile(r"[\s#>*+\-\d.)]*")

_UNITS = {
    "%": "%", "percent": "%", "pct": "%",
    "b": "b", "byte": "b", "bytes": "b", "kb": "kb", "kib": "kib", "mb": "mb", "mib": "mib",
    "gb": "gb", "gib": "gib", "tb": "tb", "tib": "tib",
    "ms": "ms", "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "min", "mins": "min", "minute": "min", "minutes": "min",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "day": "day", "days": "day", "week": "week", "weeks": "week",
    "month": "month", "months": "month", "year": "year", "years": "year",
    "x": "x", "px": "px", "k": "k", "m": "m", "bn": "bn", "million": "million",
    "billion": "billion", "thousand": "k",
    "row": "row", "rows": "row", "column": "column", "columns": "column", "cols": "column",
    "col": "column", "record": "record", "records": "record", "sample": "sample",
    "samples": "sample", "item": "item", "items": "item", "user": "user", "users": "user",
    "file": "file", "files": "file", "line": "line", "lines": "line", "token": "token",
    "tokens": "token", "char": "char", "chars": "char", "characters": "char",
    "epoch": "epoch", "epochs": "epoch", "step": "step", "steps": "step",
    "feature": "feature", "features": "feature", "customer": "customer",
    "customers": "customer", "order": "order", "orders": "order",
    "kg": "kg", "g": "g", "km": "km", "cm": "cm", "mm": "mm", "usd": "usd", "eur": "eur",
    "gbp": "gbp", "°c": "°c", "°f": "°f", "ghz": "ghz", "mhz": "mhz", "hz": "hz",
}
_CURRENCIES = {"$": "usd", "€": "eur", "£": "gbp"}

# Capitalised words that open sentences without naming anything.
_COMMON = frozenset(["a", "an", "the", "this", "that", "these", "those", "then", "now", "here", "there", "we", "i", "i'm", "it", "its", "you", "your", "our", "my", "me", "us", "they", "he", "she", "his", "her", "them", "please", "can", "could", "would", "should", "will", "shall", "may", "might", "must", "let", "what", "why", "how", "when", "where", "which", "who", "whom", "whose", "yes", "no", "not", "ok", "okay", "also", "so", "but", "and", "or", "if", "in", "on", "at", "for", "with", "without", "after", "before", "by", "from", "to", "of", "as", "is", "are", "was", "were", "be", "been", "being", "do", "does", "did", "done", "have", "has", "had", "all", "some", "any", "each", "every", "most", "more", "less", "many", "much", "few", "one", "two", "three", "use", "using", "run", "try", "check", "show", "make", "add", "note", "next", "first", "second", "third", "last", "finally", "great", "thanks", "thank", "sure", "good", "fine", "right", "well", "see", "look", "keep", "drop", "read", "write", "take", "give", "get", "put", "set", "start", "stop", "find", "sort", "type", "print", "format", "replace", "compare", "load", "save", "plot", "fit", "train", "test", "split", "merge", "join", "group", "filter", "count", "sum", "mean", "compute", "calculate", "summarize", "explain", "tell", "ask", "answer", "hello", "hi", "hey", "dear", "because", "since", "though", "although", "however", "still", "just", "only", "even", "very", "really", "maybe", "perhaps", "instead", "otherwise", "meanwhile", "today", "tomorrow", "yesterday", "none"])



# -- extract ---------------------------------------------------------------------------------

def extract(texts: str | Sequence[str]) -> tuple[Fact, ...]:
    """The facts of ``texts`` (one message's text, or the messages' texts oldest first),
    deduplicated by key, ordered by their last occurrence (the most recent last), each
    with the index of the message it last came from."""
    if isinstance(texts, str):
        texts = (texts,)
    texts = [text.replace(MASK, " " * len(MASK)) for text in texts]
    mid_caps = _mid_sentence_caps(texts)
    last: dict[tuple[str, ...], tuple[int, int, Fact]] = {}
    for index, text in enumerate(texts):
        for pos, fact in _scan_with_list(text, index, mid_caps):
            last.pop(fact.key, None)            # re-inserted: dict order is recency
            last[fact.key] = (index, pos, fact)
    ordered = sorted(last.values(), key=lambda t: (t[0], t[1]))
    return tuple(f for _, _, f in ordered)


def _scan_with_list(text: str, index: int, mid_caps: frozenset[str]) -> list[tuple[int, Fact]]:
    """:func:`_scan`, reading an earlier summary's fact list one fact a line (a name opening
    its line there is still a name)."""
    body, heading, listed = text.partition(FACTS_HEADING)
    found = _scan(body, index, mid_caps)
    offset = len(body) + len(heading)
    for raw in listed.split("\n"):
        item = raw[2:] if raw.startswith("- ") else raw
        caps = mid_caps | frozenset(re.findall(r"\w+", item))
        found += [(offset + pos, fact) for pos, fact in _scan(item, index, caps)]
        offset += len(raw) + 1
    return found


def _scan(text: str, index: int, mid_caps: frozenset[str]) -> list[tuple[int, Fact]]:
    """The facts of one text with their positions, in reading order."""
    found: list[tuple[int, Fact]] = []
    masked = list(text)

    def take(start: int, end: int, kind: FactKind, value: str, *, mask: bool = True) -> None:
        key = _key(kind, value)
        if key is not None:
            found.append((start, Fact(value, kind, index, key)))
        if mask:
            masked[start:end] = " " * (end - start)

    for m in _URL_RE.finditer(text):
        url = m.group().rstrip(".,;:!?")
        take(m.start(), m.start() + len(url), "url", url)
    for m in _PATH_RE.finditer(_joined(masked)):
        path = m.group().rstrip(".,;:!?")
        if path.count(".") == len(path.replace("/", "")) or _is_number_like(path):
            continue                            # "1/2", "3.11/4": not a path
        take(m.start(), m.start() + len(path), "path", path)
    for m in _DATE_RE.finditer(_joined(masked)):
        take(m.start(), m.end(), "date", m.group())
    for m in _VERSION_RE.finditer(_joined(masked)):
        take(m.start(), m.end(), "number", m.group())
    for m in _BACKTICK_RE.finditer(_joined(masked)):
        inner = m.group(1).strip()
        if inner and _plain(inner):
            kind: FactKind = "identifier" if re.fullmatch(r"[\w.]+", inner) else "quoted"
            take(m.start(1), m.end(1), kind, inner, mask=False)
    for m in _QUOTED_RE.finditer(_joined(masked)):
        group = next(g for g in (1, 2, 3) if m.group(g) is not None)
        inner = m.group(group).strip()
        if inner and _plain(inner) and not re.fullmatch(r"[\w.]+", inner):
            take(m.start(group), m.end(group), "quoted", inner, mask=False)
    current = _joined(masked)
    for m in _IDENTIFIER_RE.finditer(current):
        ident = m.group()
        if ident.lower() not in ("e.g", "i.e", "etc.al") and not _is_number_like(ident):
            take(m.start(), m.end(), "identifier", ident)
    current = _joined(masked)
    for m in _NUMBER_RE.finditer(current):
        unit = m.group("unit")
        if unit is not None and unit.lower() not in _UNITS:
            unit = None
        end = m.end() if unit is not None else m.end("num")
        value = current[m.start():end]
        if unit is None and m.group("cur") is None and re.fullmatch(r"\d{1,2}", m.group("num")) \
                and not _SETTING_RE.search(current, max(0, m.start() - 3), m.start()):
            continue                            # "step 2", "request 12": not a fact
        take(m.start(), end, "number", value)
    current = _joined(masked)
    for m in _NAME_RE.finditer(current):
        name = _name(current, m, mid_caps)
        if name:
            take(m.start() + m.group().index(name), m.end(), "name", name, mask=False)
    return sorted(found, key=lambda t: t[0])


def _joined(chars: list[str]) -> str:
    return "".join(chars)


def _plain(text: str) -> bool:
    """Short, one line, and nothing a firewall could pair with the text around it."""
    return not re.search(r"[\[\](){}<>`;|&\\]", text) and len(text) <= 80


def _is_number_like(text: str) -> bool:
    return re.fullmatch(r"[\d.,/:-]+", text) is not None


def _name(text: str, m: re.Match[str], mid_caps: frozenset[str]) -> str | None:
    """A capitalised run as a name, without leading common words. A single word opening
    a sentence is a name only when the texts also capitalise it inside a sentence."""
    words = m.group().split(" ")
    at_start = _opens_sentence(text, m.start())
    while words and words[0].lower() in _COMMON:
        words, at_start = words[1:], False
    if not words or (at_start and len(words) == 1 and words[0] not in mid_caps):
        return None
    return " ".join(words)


def _opens_sentence(text: str, start: int) -> bool:
    """Whether ``start`` opens a sentence: the text's or a line's start (after a bullet or
    a heading mark), or after ``.``, ``!``, ``?``, ``:`` or ``;`` and a blank."""
    i = start
    while i > 0 and text[i - 1] in " \t":
        i -= 1
    if i == 0 or text[i - 1] == "\n" or (text[i - 1] in ".!?:;" and i < start):
        return True
    line_start = text.rfind("\n", max(0, start - 12), start) + 1
    if line_start == 0 and start > 12:
        return False
    return _BULLET_RE.fullmatch(text, line_start, start) is not None


def _mid_sentence_caps(texts: Sequence[str]) -> frozenset[str]:
    """Capitalised words written inside a sentence somewhere in ``texts``."""
    out = set()
    for text in texts:
        for m in re.finditer(r"(?<![\w'’-])[A-ZÀ-ÖØ-Þ][\w'’-]*", text):
            if not _opens_sentence(text, m.start()):
                out.add(m.group())
    return frozenset(out)


def _key(kind: FactKind, value: str) -> tuple[str, ...] | None:
    if kind == "number":
        return _number_key(value)
    if kind in ("name", "quoted"):
        return (kind, " ".join(value.split()).casefold())
    if kind == "date":
        return ("date", value.replace("T", " "))
    return (kind, value)


def _number_key(value: str) -> tuple[str, ...] | None:
    if _VERSION_RE.fullmatch(value):
        return ("number", value.lstrip("v"), "version")
    m = re.fullmatch(r"(?P<cur>[$€£])?(?P<num>[\d,.]+)[ \u00a0]?(?P<unit>.*)", value)
    if m is None:
        return None
    try:
        number = Decimal(m.group("num").replace(",", ""))
    except InvalidOperation:
        return None
    unit = _UNITS.get(m.group("unit").lower(), "") if m.group("unit") else ""
    if m.group("cur"):
        unit = _CURRENCIES[m.group("cur")]
    return ("number", _canonical(number), unit)


def _canonical(number: Decimal) -> str:
    text = format(number.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# -- missing ---------------------------------------------------------------------------------

def missing(facts: Iterable[Fact], summary: str) -> tuple[Fact, ...]:
    """The facts ``summary`` does not carry (comparison: module docstring), in the order
    given."""
    found = {f.key for f in extract(summary)} | _numbers(summary)
    values = {k[1] for k in found if k[0] == "number"}
    folded = " ".join(summary.split()).casefold()
    out = []
    for fact in facts:
        if fact.key in found:
            continue
        if fact.kind == "number" and len(fact.key) == 3 and fact.key[2] == "" \
                and fact.key[1] in values:
            continue                            # a bare number, kept with a unit
        if fact.kind in ("identifier", "path", "url", "date"):
            if fact.text in summary and \
                    re.search(rf"(?<![\w/.-]){re.escape(fact.text)}(?![\w/]|[.-]\w)", summary):
                continue
        elif fact.kind in ("name", "quoted") and fact.key[1] in folded and \
                re.search(rf"(?<!\w){re.escape(fact.key[1])}(?!\w)", folded):
            continue
        out.append(fact)
    return tuple(out)


def _numbers(text: str) -> set[tuple[str, ...]]:
    """The keys of every number in ``text``, small ones too (a summary may keep ``seed=42``
    as "the seed was 42")."""
    out = set()
    for m in _NUMBER_RE.finditer(text):
        unit = m.group("unit")
        value = text[m.start():m.end() if unit and unit.lower() in _UNITS else m.end("num")]
        key = _number_key(value)
        if key is not None:
            out.add(key)
    return out


# -- append_missing --------------------------------------------------------------------------

_SMUGGLING_RE = re.compile(r"(?:get|post|head|options|connect|put|delete|trace|track|patch|"
                           r"propfind|propatch|mkcol|copy|move|lock|unlock)\s+(?:/|\w)\S*\Z",
                           re.IGNORECASE)


def line(fact: Fact) -> str | None:
    """``- `` + the fact, or None when the line is not safe to send (module docstring)."""
    text = " ".join(fact.text.split())
    if not text or re.search(r"[\[\]`]", text) or _SMUGGLING_RE.search(text):
        return None
    return f"- {text}"


def append_missing(summary: str, facts: Sequence[Fact],
                   bound_chars: int) -> tuple[str, FactCheck]:
    """``summary`` with the facts it lacks appended under :data:`FACTS_HEADING`, most
    recent first, while the next one fits within ``bound_chars`` (the whole text)."""
    lost = missing(facts, summary)
    total = len(facts)
    kept = total - len(lost)
    head = f"{summary.rstrip()}\n\n{FACTS_HEADING}"
    lines: list[str] = []
    size = len(head)
    for fact in reversed(lost):
        rendered = line(fact)
        if rendered is None:
            continue
        if size + 1 + len(rendered) > bound_chars:
            break
        lines.append(rendered)
        size += 1 + len(rendered)
    if not lines:
        return summary, FactCheck(total, kept, 0, len(lost))
    return "\n".join([head, *lines]), FactCheck(total, kept, len(lines), len(lost) - len(lines))
