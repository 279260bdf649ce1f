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

5. **What a model writes around the text.** Before rules 2–4, the continuation loses a
   *meta opener* at its very start — a first line or sentence about the continuing itself
   ("Here's the continuation:", "Continuing from where I left off:", "Sure, here is the
   rest of the answer:", "(continued)", and the same in Portuguese, Spanish, French and
   German; :func:`strip_meta_opener`) — and every *echo of the continuation prompt*,
   whole or any of its sentences, wherever it is (:func:`strip_echo`): neither is answer
   text, and neither may land in the history. Only those exact forms are dropped: an
   answer that starts "Here is why…" is text.
6. **Restarts.** Failing rules 2–3, a continuation that repeats the end of what was sent
   once case, whitespace and markdown emphasis (``*``, ``_``, ``~``) are set aside — at
   least :data:`MIN_OVERLAP_CHARS` of it, typically the answer restarted from its
   beginning with its opening in bold — is a *consistent restart*: what goes past what was
   sent is appended. A continuation whose opening repeats the answer's opening
   (:data:`MIN_RESTART_CHARS`, compared the same way) but then says something else is an
   *inconsistent restart*: when it is longer than the partial answer, it replaces it (the
   longer text is kept); otherwise the partial answer stays and the continuation is not
   joined. (A restart that is a word-for-word prefix of what was sent only repeats it.)
7. **The held-back word comes back.** When the continuation does not write the word held
   back by rule 1 again, but starts a new sentence or block (a line break, an upper-case
   letter, a heading, list item, quote, table row or fence), that word is put back before
   it, so no word is lost: "…food cold." + "It also…" is "…food cold. It also…", not
   "…food It also…". A continuation that goes on in lower case wrote another word in its
   place, and is joined as it is.

A continuation with nothing visible in it leaves the answer as it was, and so does one
that only repeats what was sent (rule 2's repeats), cut off again before it got past them:
the next request sends the same partial answer. :func:`join_report` says what a join did
(:class:`Joined`): a continuation with text of which nothing was kept (all of it a meta
opener, an echo, or a restart not joined) is a failed continuation for the session.
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
    "INCOMPLETE",
    "MAX_RETRACT_CHARS",
    "MIN_ANCHORED_OVERLAP_CHARS",
    "MIN_OVERLAP_CHARS",
    "MIN_RESTART_CHARS",
    "Joined",
    "Resume",
    "StreamedJoin",
    "continuation_message",
    "join",
    "join_report",
    "next_max_tokens",
    "overlap",
    "resume_for",
    "resume_point",
    "stitch",
    "strip_echo",
    "strip_meta_opener",
]

CONTINUATION_PROMPT = (
    "Your response was cut off at the token limit.\n"
    "Resume DIRECTLY from where you stopped — do not repeat any content.\n"
    "Continue the implementation or explanation from the exact point of interruption."
)

INCOMPLETE = "incomplete"
"""The ``Message.meta`` key of an answer kept cut at ``max_tokens`` (escalations ran out,
or it could not be continued): its value says why, in words. Not sent to the model."""

MIN_OVERLAP_CHARS = 20
"""A continuation that starts with the previous part's last ≥ 20 chars repeated them
(counted in UTF-8 bytes, so 7 CJK characters count as much as 21 ASCII letters)."""

MIN_ANCHORED_OVERLAP_CHARS = 1
"""Shorter repeats count only when they restart the previous part's unfinished last line
(models usually resume by rewriting the interrupted line from its start, with or without
its indentation) and hold a visible character (repeated indentation alone is a separator)."""

MAX_RETRACT_CHARS = 80
"""The longest run without whitespace that is still taken for a word and sent back whole."""

MIN_RESTART_CHARS = 24
"""A continuation whose first 24 characters (case, whitespace and emphasis set aside) are
the answer's first 24 restarted the answer (rule 6)."""

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


# -- what a model writes around the text (rule 5) ------------------------------------------

_ACK = (r"(?:sure|certainly|of\s+course|okay|ok|alright|all\s+right|absolutely|no\s+problem|"
        r"got\s+it|claro|certo|com\s+certeza|tudo\s+bem|por\s+supuesto|vale|de\s+acuerdo|"
        r"bien\s+s[uû]r|d'accord|très\s+bien|entendu|gerne|natürlich|klar|sicher|"
        r"in\s+ordnung|selbstverständlich)")
_WHERE = (r"(?:(?:from\s+|right\s+)?where\s+(?:i|we|it)\s+(?:left\s+off|stopped|was\s+"
          r"(?:cut\s+off|interrupted)|ended)|from\s+the\s+(?:exact\s+)?point\s+of\s+"
          r"interruption|from\s+(?:above|before|the\s+previous\s+(?:message|response|part)))")
_WHAT = r"(?:answer|response|explanation|implementation|text|code|reply|message|list)"
_META_PHRASES = (
    # English
    rf"here(?:'s|’s|\s+is|\s+are)\s+(?:the\s+)?(?:continuation|rest|remainder|remaining\s+"
    rf"(?:part|text|content)|next\s+part|continued\s+{_WHAT})(?:\s+of\s+(?:the|my)\s+"
    rf"{_WHAT})?(?:,?\s+{_WHERE})?",
    rf"(?:i'll|i’ll|i\s+will|let\s+me|let's|let’s)\s+(?:now\s+)?(?:continue|resume|pick\s+up|"
    rf"keep\s+going|go\s+on)(?:\s+(?:the|my)\s+{_WHAT})?(?:,?\s+{_WHERE})?",
    rf"(?:continuing|resuming|picking\s+up)(?:\s+(?:the|my)\s+{_WHAT})?(?:,?\s+{_WHERE})?",
    rf"(?:continuation|continued)(?:\s+of\s+(?:the|my)\s+{_WHAT})?(?:\s+{_WHERE})?",
    # a rewrite announced (SmolLM2-135M on llama-cpp-python: "Here's a revised version:")
    rf"here(?:'s|’s|\s+is)\s+an?\s+(?:revised|rewritten|updated|new|improved)\s+version"
    rf"(?:\s+of\s+(?:the|my)\s+{_WHAT})?",
    # Portuguese
    r"aqui\s+est[aá]\s+(?:a\s+continua[cç][aã]o|o\s+resto|o\s+restante)(?:\s+da\s+resposta)?",
    r"(?:continuando|vou\s+continuar)(?:\s+de\s+onde\s+parei)?",
    r"continua[cç][aã]o",
    # Spanish
    r"aqu[ií]\s+(?:est[aá]|tienes)\s+(?:la\s+continuaci[oó]n|el\s+resto)"
    r"(?:\s+de\s+la\s+respuesta)?",
    r"(?:continuando|contin[uú]o)(?:\s+(?:desde\s+)?donde\s+lo\s+dej[eé])?",
    r"continuaci[oó]n",
    # French
    r"voici\s+la\s+suite(?:\s+de\s+(?:la|ma)\s+r[eé]ponse)?",
    r"(?:je\s+continue|je\s+reprends|en\s+reprenant|suite)(?:\s+l[aà]\s+o[uù]\s+je\s+"
    r"m['’][eé]tais\s+arr[eê]t[eé]e?)?",
    # German
    r"hier\s+ist\s+(?:die\s+fortsetzung|der\s+rest)(?:\s+der\s+antwort)?",
    r"(?:ich\s+fahre\s+fort|ich\s+mache\s+weiter|fortsetzung|weiter\s+geht's)"
    r"(?:,?\s+wo\s+ich\s+aufgeh[oö]rt\s+habe)?",
)
_EMPH = r"[*_]{0,3}"
_PHRASE = "(?:" + "|".join(_META_PHRASES) + ")"
_META_OPENER = re.compile(
    rf"\A\s*{_EMPH}(?:[¡¿]?{_ACK}\s*[!.,]*\s+{_EMPH})?[¡¿]?"
    rf"(?:[(\[]\s*{_PHRASE}\s*[)\]]|{_PHRASE}\s*(?:[:.!…]+|(?=\n)))"
    rf"{_EMPH}(?:\s+|\Z)", re.IGNORECASE)


def strip_meta_opener(continuation: str) -> str:
    """``continuation`` without the meta openers at its very start (rule 5), and without
    the whitespace after them; the same string when it has none."""
    text = continuation
    for _ in range(3):                  # "Sure! Here is the rest:\n\n(continued)\n"
        found = _META_OPENER.match(text)
        if found is None or not found.group().strip():
            break
        text = text[found.end():]
    return continuation if text is continuation else text.lstrip()


def _echo_patterns() -> tuple[re.Pattern[str], ...]:
    """One pattern per clause of :data:`CONTINUATION_PROMPT` (split at its full stops,
    dashes and line ends), matched whatever its case, spacing and emphasis."""
    clauses = [c.strip() for c in re.split(r"[.\n—]", CONTINUATION_PROMPT)]
    patterns = []
    for clause in clauses:
        words = clause.split()
        if len(words) < 4:
            continue
        gap = r"[\s*_\"“”'`]+"
        head = words[0].lower()
        first = r"(?:your|my|the)" if head == "your" else re.escape(head)
        body = gap.join([first, *map(re.escape, words[1:])])
        patterns.append(re.compile(
            rf"[*_\"“”'`]*{body}[*_\"“”'`]*[ \t]*[.!:;,—–-]*[*_\"“”'`]*[ \t]*",
            re.IGNORECASE))
    return tuple(patterns)


_ECHO = _echo_patterns()


def _normalised_clause(text: str) -> str:
    return " ".join(re.sub(r"[*_\"“”'`.!:;,—–-]", " ", text).lower().split())


_MAX_CLAUSE_CHARS = 2 * max(map(len, CONTINUATION_PROMPT.split("\n")))
_ECHO_CLAUSES = tuple(_normalised_clause(c) for c in re.split(r"[.\n—]", CONTINUATION_PROMPT)
                      if len(c.split()) >= 4)


def _echo_fragment(line: str) -> bool:
    """Whether ``line`` is the start of a clause of the prompt, of two words or more (an
    echo cut off at the end of a continuation)."""
    if len(line) > _MAX_CLAUSE_CHARS:
        return False
    text = _normalised_clause(line)
    return len(text.split()) >= 2 and len(text) >= 10 and \
        any(clause.startswith(text) for clause in _ECHO_CLAUSES)



def strip_echo(continuation: str) -> str:
    """``continuation`` without any echo of the continuation prompt (rule 5): each of its
    clauses is removed wherever it stands, and a line left blank by that goes too. The same
    string when there is none."""
    if not any(p.search(continuation) for p in _ECHO):
        last = continuation.rpartition("\n")[2]
        if _echo_fragment(last):
            return continuation[:len(continuation) - len(last)].rstrip()
        return continuation
    lines = []
    for line in continuation.split("\n"):
        cleaned = line
        for pattern in _ECHO:
            cleaned = pattern.sub("", cleaned)
        if cleaned != line:
            if not cleaned.strip():
                continue
            cleaned = cleaned.rstrip()
        lines.append(cleaned)
    # An echo cut off by max_tokens leaves the start of a clause as the last line.
    if lines and _echo_fragment(lines[-1]):
        lines.pop()
    text = "\n".join(lines)
    # An echo at the start leaves the text after it to start at its first visible character.
    lead = len(continuation) - len(continuation.lstrip())
    at_start = any((m := p.match(continuation, lead)) is not None and m.end() > lead
                   for p in _ECHO)
    return text.lstrip() if at_start else text


# -- restarts (rule 6) ---------------------------------------------------------------------

_EMPHASIS_MARKS = frozenset("*_~")


_EMPHASIS_RUN = re.compile(r"[*_~]+")
_SPACE_RUN = re.compile(r"\s+")


def _flat(text: str) -> str:
    """``text`` lower-cased, each whitespace run one space, emphasis marks left out."""
    return _SPACE_RUN.sub(" ", _EMPHASIS_RUN.sub("", text)).lower()


def _index_after(text: str, count: int) -> int:
    """The index in ``text`` just after the first ``count`` characters of ``_flat(text)``."""
    seen = 0
    space = False
    for i, ch in enumerate(text):
        if seen >= count:
            return i
        if ch in _EMPHASIS_MARKS:
            continue
        if ch.isspace():
            if not space:
                seen += 1
            space = True
            continue
        space = False
        seen += len(ch.lower())
    return len(text)


def _loose_overlap(sent: str, continuation: str) -> int:
    """Where ``continuation`` goes past a repeat of the end of ``sent`` that is at least
    :data:`MIN_OVERLAP_CHARS` long once case, whitespace and emphasis are set aside (rule
    6's consistent restart), or is the whole of ``sent``; 0 when there is none."""
    window = min(len(sent), _OVERLAP_SEARCH_CHARS)
    tail = _flat(sent[-window:])
    head = _flat(continuation[:2 * window + 64])
    whole = window == len(sent)
    probe = head[:min(MIN_OVERLAP_CHARS, len(tail))]
    if not probe.strip():
        return 0
    # The longest suffix of the tail that the head starts with: the first place it does.
    at = tail.find(probe)
    while at != -1:
        k = len(tail) - at
        if head.startswith(tail[at:]) and (k >= MIN_OVERLAP_CHARS or (whole and at == 0)):
            break
        at = tail.find(probe, at + 1)
    else:
        return 0
    end = _index_after(continuation, k)
    # The repeat ends where the text it repeats does: its emphasis marks and the whitespace
    # after it go with it.
    while end < len(continuation) and (continuation[end] in _EMPHASIS_MARKS
                                       or (tail[-1] == " " and continuation[end].isspace())):
        end += 1
    return end


def _may_repeat(sent: str, continuation: str) -> bool:
    """A quick test that ``continuation`` may repeat text of ``sent``'s tail, case,
    whitespace and emphasis set aside (its first three words are in it), or opens as
    ``sent`` does: only then are rule 6's slower comparisons made."""
    words = _flat(continuation[:256]).split()[:3]
    if not words:
        return False
    pattern = r"[\s*_~]+".join(map(re.escape, words))
    tail = sent[-_OVERLAP_SEARCH_CHARS:]
    return re.search(pattern, tail, re.IGNORECASE) is not None \
        or re.match(r"[\s*_~]*" + pattern, sent, re.IGNORECASE) is not None


def _loose_repeat_only(sent: str, continuation: str) -> bool:
    """Whether ``continuation`` (≥ :data:`MIN_OVERLAP_CHARS`) only repeats text of ``sent``,
    case, whitespace and emphasis set aside."""
    text = _flat(continuation.strip())
    if len(text) < MIN_OVERLAP_CHARS:
        return False
    return text in _flat(sent[-_OVERLAP_SEARCH_CHARS:])


_OPENING = re.compile(r"[^\n]*?[.!?。！？](?=\s|$)|[^\n]+")
_MAX_OPENING_CHARS = 200


_MIN_RESTART_REPEAT = 8


def _starts(previous: str, continuation: str, *, whole: bool) -> bool:
    """Whether ``previous`` starts with all of ``continuation`` (at least 8 characters
    unless ``whole``: nothing was sent), case, whitespace and emphasis set aside."""
    theirs = _flat(continuation.strip())
    return (whole or len(theirs) >= _MIN_RESTART_REPEAT) \
        and _flat(previous.strip()[:2 * len(continuation) + 64]).startswith(theirs)


def _restarts(previous: str, continuation: str) -> bool:
    """Whether ``continuation`` opens as ``previous`` does (rule 6): the same first
    sentence or line (the first :data:`MIN_RESTART_CHARS` at least, 200 at most)."""
    found = _OPENING.match(previous.lstrip()[:2 * _MAX_OPENING_CHARS])
    if found is None:
        return False
    ours = _flat(found.group()[:_MAX_OPENING_CHARS])
    if len(ours) < MIN_RESTART_CHARS:
        ours = _flat(previous.lstrip()[:4 * MIN_RESTART_CHARS])[:MIN_RESTART_CHARS]
    theirs = _flat(continuation.lstrip()[:len(ours) * 2 + 16])
    return len(ours) >= MIN_RESTART_CHARS and theirs.startswith(ours)


# -- the held-back word (rule 7) -----------------------------------------------------------

_SENTENCE_END = frozenset(".!?:;。！？")
_NEW_BLOCK = re.compile(r"(?:#{1,6}\s|[-*+>|]\s|\d{1,3}[.)]\s|```|~~~)")


def _put_back(previous: str, sent: str, rest: str) -> str:
    """The word held back from ``previous`` (the text after ``sent``) with its separator,
    when ``rest`` does not write it again but starts a new sentence or block; else ''."""
    held = previous[len(sent):]
    word = held.rstrip()
    visible = rest.lstrip()
    if not word or not visible:
        return ""
    if visible.startswith(word) or _flat(visible[:2 * len(word) + 8]).startswith(_flat(word)):
        return ""
    starts_line = rest[:1] == "\n" or (not rest[:1].isspace() and _NEW_BLOCK.match(visible))
    if not (starts_line or visible[0].isupper()):
        return ""
    # A sentence's first word alone, replaced by the model's new sentence, is a fragment.
    opens = not sent.strip() or sent.rstrip()[-1] in _SENTENCE_END or sent.endswith("\n")
    if opens and word[-1] not in _SENTENCE_END:
        return ""
    if held != word or (sent and not sent[-1].isspace()):
        return held                     # its own whitespace, or none in text without spaces
    if rest[:1] == "\n":
        return word
    return word + ("\n" if starts_line else " ")


# -- the join ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Joined:
    """One continuation joined to the answer so far, and what the join did with it.

    ``dropped``: what was left out of the continuation, in words ("a meta opener", "an echo
    of the continuation prompt", "a restart of the answer"); ``restart``: ``""``,
    ``"extended"`` (a consistent restart: what goes past was appended), ``"replaced"``
    (the restart replaced the partial answer) or ``"not joined"``; ``restored``: the
    held-back word put back (rule 7); ``added``: the continuation had visible text and
    the joined answer is not the previous one.
    """

    text: str
    added: bool
    dropped: tuple[str, ...] = ()
    restart: str = ""
    restored: str = ""

    @property
    def failed(self) -> bool:
        """The continuation had text, and all of it was dropped as a meta opener, an echo
        or a restart: nothing of it is in the answer."""
        return not self.added and bool(self.dropped)


def join_report(previous: str, continuation: str) -> Joined:
    """``previous`` continued by ``continuation``, a new message answering the continuation
    prompt that was sent ``previous[:resume_point(previous)]`` (rules 1–7), with what the
    join did."""
    if not continuation.strip():
        return Joined(previous, False)
    dropped: list[str] = []
    cleaned = strip_meta_opener(continuation)
    if cleaned != continuation:
        dropped.append("a meta opener")
    echoless = strip_echo(cleaned)
    if echoless != cleaned:
        dropped.append("an echo of the continuation prompt")
        cleaned = strip_meta_opener(echoless)
    if not cleaned.strip():
        return Joined(previous, False, tuple(dropped))
    sent = previous[:resume_point(previous)]
    if _only_repeats(sent, cleaned) or _starts(previous, cleaned, whole=not sent.strip()):
        # (The model began the same answer again, and was cut before it got past it.)
        return Joined(previous, False, tuple(dropped))
    skip = overlap(sent, cleaned)
    if not skip:
        fence = _reopened_fence(sent, cleaned)
        skip = fence + overlap(sent, cleaned[fence:]) if fence else 0
    restart = ""
    if not skip and sent.strip() and _may_repeat(sent, cleaned):
        if _loose_repeat_only(sent, cleaned):
            return Joined(previous, False, tuple(dropped))
        skip = _loose_overlap(sent, cleaned)
        if skip:
            restart = "extended"
        elif _restarts(previous, cleaned):
            dropped.append("a restart of the answer")
            if len(cleaned.strip()) > len(previous.strip()):
                return Joined(cleaned.strip(), True, tuple(dropped), "replaced")
            return Joined(previous, False, tuple(dropped), "not joined")
    rest = cleaned[skip:]
    if restart and rest[:1].isspace() and sent[-1:].isspace():
        rest = rest.lstrip()
    restored = _put_back(previous, sent, rest)
    base = sent + restored
    if restored and rest[:1] == "\n" and base.endswith("\n"):
        rest = rest.lstrip("\n")
    if base and base[-1] in _HORIZONTAL:
        rest = rest.lstrip(_HORIZONTAL)
    if not rest:
        return Joined(previous, False, tuple(dropped), restart)
    return Joined(base + rest, True, tuple(dropped), restart, restored)


def join(previous: str, continuation: str) -> str:
    """``previous`` continued by ``continuation``, a new message answering the continuation
    prompt that was sent ``previous[:resume_point(previous)]`` (rules 1–7)."""
    return join_report(previous, continuation).text


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

    def join_report(self, parts: Sequence[str], continuation: str) -> Joined:
        """The partial answers so far continued by ``continuation``, with what the join did
        (:func:`join_report`; after a prefill, a plain concatenation)."""
        so_far = self.join(parts)
        if not parts:
            return Joined(continuation, bool(continuation.strip()))
        if self.prefill:
            return Joined(_prefilled(so_far, continuation), bool(continuation))
        return join_report(so_far, continuation)


def resume_for(provider: object, options: Mapping[str, Any] | None = None) -> Resume:
    """How ``provider`` continues a cut answer: by prefill when it has a
    ``continues_by_prefill(options)`` method that says so (the Anthropic adapter), else by
    the continuation prompt."""
    ask = getattr(provider, "continues_by_prefill", None)
    return Resume(prefill=bool(ask(options or {})) if callable(ask) else False)


class StreamedJoin:
    """What to show of a continuation streamed after the text already shown, so the screen
    reads as the joined answer: the repeat the join drops (the retracted last word sent
    again, a repeated line, a restart of the answer) is not shown twice, and neither are a
    meta opener or an echo of the continuation prompt at its start.

    The continuation's first :attr:`HOLD` characters are held back until the join of the
    answer so far with them can be told — longer while what is held may still be a repeat
    (text the answer already has in its last ``_OVERLAP_SEARCH_CHARS``, case, whitespace
    and emphasis set aside: a model sending a whole paragraph again), the continuation
    prompt echoed, or a restart of the answer no longer than it — then what the join adds
    to what is shown goes out, and the rest of the stream passes through. A restart that
    replaces the answer goes out whole after a blank line (the front end then shows the
    joined answer in place of the stream). When the join does not extend what is shown
    (the model wrote the cut word differently), the held text goes out as sent, without
    its opener and echo. An echo later in the stream is shown as it comes, and only left
    out of the answer kept. Pure: fed deltas, it returns text to show.
    """

    HOLD = MIN_OVERLAP_CHARS + 2 * MAX_RETRACT_CHARS

    def __init__(self, resume: Resume, parts: Sequence[str], shown: str) -> None:
        self._resume = resume
        self._parts = tuple(parts)
        self._shown = [shown]           # everything shown of the answer so far, in pieces
        self._held: list[str] = []
        self._held_chars = 0
        self._passing = False
        self._tail = shown[-_OVERLAP_SEARCH_CHARS:]
        self._loose_tail = ""           # the tail normalised, once it is needed

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
        if self._held_chars < self.HOLD or self._undecided():
            return ""
        return self.flush()

    def _undecided(self) -> bool:
        """What is held so far may still be a repeat, an echo or a restart: the join can
        only tell once it is whole."""
        if self._held_chars >= _OVERLAP_SEARCH_CHARS:
            return False
        held = "".join(self._held)
        self._held[:] = [held]
        if held in self._tail:
            return True
        cleaned = strip_echo(strip_meta_opener(held)).strip()
        if len(cleaned) < self.HOLD and cleaned != held.strip():
            return True                 # what is left once an opener or echo goes is short
        loose = _flat(cleaned)
        if _PROMPT_LOOSE.startswith(loose) or (loose and loose in self._loose()):
            return True
        return _restarts(self._tail, cleaned) and len(cleaned) <= len(self._tail.strip())

    def _loose(self) -> str:
        if not self._loose_tail:
            self._loose_tail = _flat(self._tail)
        return self._loose_tail

    def flush(self) -> str:
        """Whatever is still held back, joined (at the continuation's end)."""
        if self._passing:
            return ""
        self._passing = True
        held = "".join(self._held)
        self._held.clear()
        joined = self._resume.join_report(self._parts, held)
        shown = self.shown
        if joined.restart == "replaced":
            out = "\n\n" + joined.text
        elif joined.text.startswith(shown):
            out = joined.text[len(shown):]
        else:
            out = strip_echo(strip_meta_opener(held))
        self._shown.append(out)
        return out


_PROMPT_LOOSE = _flat(CONTINUATION_PROMPT)
