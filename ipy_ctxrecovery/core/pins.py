"""The user's own words kept across compactions: pinned rules and messages kept verbatim.

Two messages the compactor places in the history it writes, built and read back here:

- **Pinned rules** (``TAG_PINNED_RULES``, right after the system messages): the
  instructions and constraints the user gave ("always…", "never…", "from now on…",
  corrections such as "no, I meant…"), each the user's sentence word for word. They are
  never summarized and never dropped by the ladder, so they survive every compaction until
  the user resets (the history goes, and with it this message) or undoes the compaction
  that pinned them (the history from before it comes back).
- **The user's earlier messages** (``TAG_USER_WORDS``, right after the summary): the user's
  own messages among those a summary replaces, kept verbatim, newest first, up to
  ``user_words_share`` of the compaction target (as OpenAI's server-side compaction keeps
  user messages). They still go to the summarizer too, so the summary stays coherent.

**Where the rules come from.** From the user messages a compaction replaces, merged with
the rules already pinned. So nothing changes before the first compaction (the prefix cache
of the requests before it is not disturbed), a rule still in the working history is read
there by the model, and a pinned one is never taken from text the model wrote.

**Detection** (:func:`rules_in`) is a pure function and conservative: a sentence is a rule
when it opens with an imperative of constraint ("always", "never", "don't", "make sure",
"use X instead of Y", the same in Portuguese, Spanish, French and German), says it holds
from now on ("from now on", "going forward", "a partir de agora", "ab jetzt"…), or opens a
correction ("no, I meant…", "actually, use…"). A question is never a rule, nor a quoted
line or code.

**At every compaction** both messages are rebuilt from what they held and what the
compaction replaces: rules merged (a rule stated again moves to where it was stated last)
and deduplicated; kept messages chosen again newest first within the budget. Neither ever
enters the summarizer's input as text to compress. Past ``pinned_rules_max_chars`` the
oldest rules leave the pin: those from the replaced messages are in the summarizer's input
anyway, and those pinned earlier are handed to the summarizer with the request's
instructions (:func:`summary_instructions`) — summarized normally, and the report says how
many.

**Their text** passes a firewall wherever it lands (``markers.py``): a header without
brackets opens each message (it follows the summary in a merged run), the rules follow on
one line, numbered with
"— 1:", and close with an end mark, so no rule starts or ends a line it did not start or end
in the user's message; each kept message opens with a label on its first line and closes
with an end mark on its last, as in the summarizer's input.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from ..settings import Settings
from .history import TAG_PINNED_RULES, TAG_USER_WORDS, History, Message, Role, Text
from .prompts import PINNED_RULES_HEADER, USER_WORDS_HEADER

__all__ = [
    "Carried",
    "Kept",
    "carried",
    "keep",
    "kept_messages_of",
    "pinned_message",
    "rules_in",
    "rules_of",
    "summary_instructions",
    "words_message",
]

_RULE_MAX_CHARS = 600
"""A longer sentence is a paste, not a rule: it is summarized like the rest."""

_RULES_END = " — end of the standing instructions"
_WORDS_LABEL = "Earlier message {i} of {n}:"
_WORDS_END = " — end of earlier message {i}"

# -- detection ------------------------------------------------------------------------------

# Words a rule may open with before its imperative ("Please always…", "And never…").
_LEAD = (r"(?:(?:please|pls|and|also|but|so|ok|okay|then|important|note|remember|"
         r"por\s+favor|e|y|et|und|aber|bitte|mais|pero|mas|alors|entonces|então|"
         r"s'il\s+te\s+plaît|s'il\s+vous\s+plaît)\b[\s,:;!—–-]*)*")

# Sentence openings that state a constraint, by language.
_OPENERS = "|".join((
    # English
    r"always", r"never", r"don't", r"dont", r"do\s+not", r"make\s+sure", r"be\s+sure\s+to",
    r"ensure", r"remember\s+to", r"avoid", r"stop\s+\w+ing", r"from\s+now\s+on",
    r"going\s+forward", r"from\s+here\s+on", r"in\s+the\s+future", r"instead\s+of",
    r"you\s+(?:must|should|shall|need\s+to|have\s+to)(?:\s+(?:always|never|not))?",
    r"you\s+(?:mustn't|shouldn't|may\s+not|can't\s+use)",
    r"i\s+want\s+you\s+to\s+(?:always|never)", r"no\s+more",
    # Portuguese
    r"sempre", r"nunca", r"não\s+(?:use|usar|faça|fazer|coloque|mude|altere|apague|"
    r"inclua|escreva|mostre|responda)", r"certifique-se", r"garanta", r"lembre-se\s+de",
    r"a\s+partir\s+de\s+agora", r"daqui\s+(?:para|pra)\s+frente", r"em\s+vez\s+de",
    r"ao\s+invés\s+de", r"evite",
    # Spanish
    r"siempre", r"no\s+(?:uses|usar|hagas|pongas|cambies|borres|incluyas|escribas|"
    r"muestres|respondas)", r"asegúrate\s+de", r"recuerda", r"a\s+partir\s+de\s+ahora",
    r"de\s+ahora\s+en\s+adelante", r"en\s+lugar\s+de", r"evita",
    # French
    r"toujours", r"jamais", r"ne\s+\w+\s+(?:jamais|pas|plus)", r"n'\w+\s+(?:jamais|pas|plus)",
    r"assure-toi", r"assurez-vous", r"veille\s+à", r"veillez\s+à", r"n'oublie\s+pas",
    r"n'oubliez\s+pas", r"à\s+partir\s+de\s+maintenant", r"désormais", r"dorénavant",
    r"au\s+lieu\s+de", r"évite",
    # German
    r"immer", r"nie", r"niemals", r"ab\s+jetzt", r"von\s+nun\s+an", r"ab\s+sofort",
    r"künftig", r"in\s+zukunft", r"stelle?\s+sicher", r"achte\s+darauf", r"denk\s+daran",
    r"verwende\s+(?:nie|kein)", r"benutze\s+(?:nie|kein)", r"statt\s+", r"anstatt",
    # An imperative then "always"/"never": "Utilise toujours…", "Verwende immer…", "Usa
    # siempre…" (not after a subject: "Eu sempre uso…" tells a habit).
    r"(?!(?:eu|ele|ela|nós|yo|él|ella|je|il|elle|on|nous|ich|er|sie|es|wir|du|tu)\b)"
    r"\w+\s+(?:toujours|jamais|immer|niemals|siempre|sempre)",
))
_OPENER_RE = re.compile(rf"^{_LEAD}(?:{_OPENERS})(?:\b|(?<=\s)|$)", re.IGNORECASE)

# Anywhere in the sentence: it holds from now on.
_STANDING_RE = re.compile(
    r"\b(?:from\s+now\s+on|going\s+forward|from\s+here\s+on|for\s+the\s+rest\s+of\s+"
    r"(?:this|the)\s+(?:session|conversation|notebook)|every\s+time\s+you|"
    r"a\s+partir\s+de\s+agora|daqui\s+(?:para|pra)\s+frente|"
    r"a\s+partir\s+de\s+ahora|de\s+ahora\s+en\s+adelante|"
    r"à\s+partir\s+de\s+maintenant|désormais|dorénavant|"
    r"ab\s+jetzt|von\s+nun\s+an|ab\s+sofort)\b",
    re.IGNORECASE)

# An imperative verb followed, later in the sentence, by "instead of"/"rather than".
_INSTEAD_RE = re.compile(
    rf"^{_LEAD}(?:use|prefer|write|call|name|keep|put|answer|reply|respond|show|plot|"
    r"return|report|round|sort|format|label|save|print|usa|utilise|utilisez|"
    r"verwende|benutze|nutze|prefira|prefiere|préfère|escreva|escribe|écris|schreib)\b"
    r".*\b(?:instead\s+of|rather\s+than|em\s+vez\s+de|ao\s+invés\s+de|no\s+lugar\s+de|"
    r"en\s+lugar\s+de|en\s+vez\s+de|au\s+lieu\s+de|plutôt\s+que|statt|anstatt|"
    r"anstelle\s+von)\b",
    re.IGNORECASE)

# A correction: "no, I meant…", "actually, use…", "na verdade, …", "eigentlich, …".
_CORRECTION_RE = re.compile(
    r"^(?:no|não|nao|non|nein)\s*[,.;:!—–-]+\s*(?:i\s+(?:meant|said|want|asked)|"
    r"use|it\s+should|that\s+should|they\s+should|make|always|never|don't|do\s+not|"
    r"eu\s+quis\s+dizer|quis\s+dizer|use|quise\s+decir|me\s+refería|"
    r"je\s+voulais\s+dire|ich\s+meinte|ich\s+wollte)\b"
    r"|^(?:i\s+meant|what\s+i\s+meant\s+(?:is|was)|correction\s*:|eu\s+quis\s+dizer|"
    r"quise\s+decir|me\s+refería\s+a|je\s+voulais\s+dire|ich\s+meinte)\b"
    r"|^(?:actually|na\s+verdade|en\s+realidad|en\s+fait|eigentlich)\s*,\s*"
    r"(?:i\s+(?:meant|want|need|said)|use|please|it\s+should|they\s+should|that\s+should|"
    r"we\s+(?:need|should|must)|let's|make|always|never|don't|do\s+not|"
    r"\w+\s+(?:should|must)|eu\s+quis|quise|je\s+voulais|ich\s+meinte|use|usa|utilise|"
    r"verwende|sempre|nunca|siempre|toujours|jamais|immer|nie)\b",
    re.IGNORECASE)

# Openings that look like a rule and are not one.
_NOT_RULE_RE = re.compile(
    r"^(?:don't|do\s+not|never)\s+(?:worry|mind|bother)\b|^nevermind\b|^never\s+mind\b|"
    r"^no\s+more\s+(?:questions|for\s+now|thanks)\b",
    re.IGNORECASE)

# A question, whatever its punctuation ("Can you always…", "¿Siempre…").
_QUESTION_OPENING_RE = re.compile(
    r"^(?:can|could|would|will|should|shall|do|does|did|is|are|was|were|why|how|what|when|"
    r"where|which|who|whom|whose|may|might|have|has)\s+(?:you|i|we|it|they|this|that|the)\b"
    r"|^(?:why|how|what|when|where|which|who)\b|^¿",
    re.IGNORECASE)

_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’»)]*\s+")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "z.b.", "p.ex.", "ex.", "cf.", "approx.",
                  "no.", "nr.", "dr.", "mr.", "mrs.", "ms.", "sr.", "sra.", "u.a.", "d.h.")
_LIST_MARK = re.compile(r"^(?:[-*•+]|\d{1,3}[.)])\s+")
_FENCE = ("```", "~~~")


def rules_in(text: str) -> tuple[str, ...]:
    """The sentences of ``text`` (a user's message) that state a rule, verbatim.

    Conservative (module docstring): each is a whole sentence of one line of ``text``,
    without a list mark; questions, quoted lines (``>``), fenced code and sentences longer
    than a short paragraph are never rules. An empty tuple when there is none.
    """
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(_FENCE):
            fenced = not fenced
            continue
        if fenced or not stripped or stripped.startswith(">") or line.startswith(("    ", "\t")):
            continue
        for sentence in _sentences(_LIST_MARK.sub("", stripped)):
            if _is_rule(sentence) and sentence not in found:
                found.append(sentence)
    return tuple(found)


def _sentences(line: str) -> list[str]:
    """``line`` cut after each sentence's end mark (not after a known abbreviation)."""
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(line):
        head = line[start:m.start()]
        last_word = head.rsplit(None, 1)[-1].lower() if head.split() else ""
        if last_word.endswith(_ABBREVIATIONS) or re.fullmatch(r"\w\.", last_word):
            continue
        out.append(line[start:m.start()].strip())
        start = m.end()
    out.append(line[start:].strip())
    return [s for s in out if s]


def _is_rule(sentence: str) -> bool:
    if len(sentence) > _RULE_MAX_CHARS or len(sentence.split()) < 2:
        return False
    if sentence.rstrip("\"'”’»)").endswith("?") or _QUESTION_OPENING_RE.match(sentence):
        return False
    if _NOT_RULE_RE.match(sentence):
        return False
    return bool(_OPENER_RE.match(sentence) or _STANDING_RE.search(sentence)
                or _INSTEAD_RE.match(sentence) or _CORRECTION_RE.match(sentence))


def _key(rule: str) -> str:
    """Two rules are the same when they differ only in case, spacing and final mark."""
    return " ".join(unicodedata.normalize("NFC", rule).casefold().split()).rstrip(".!… ")


# -- the two messages -----------------------------------------------------------------------

def pinned_message(rules: Sequence[str]) -> Message | None:
    """The pinned message holding ``rules`` verbatim, oldest first (None without rules)."""
    if not rules:
        return None
    body = "".join(f" — {i}: {rule}" for i, rule in enumerate(rules, start=1))
    return Message(Role.USER, (Text(f"{PINNED_RULES_HEADER}{body}{_RULES_END}"),),
                   tag=TAG_PINNED_RULES, meta={"pinned_rules": len(rules)})


def rules_of(message: Message) -> tuple[str, ...]:
    """The rules a :func:`pinned_message` holds (read back from its text, which is what is
    saved and resumed)."""
    text = message.text
    if not text.startswith(PINNED_RULES_HEADER):
        return ()
    body = text[len(PINNED_RULES_HEADER):]
    if body.endswith(_RULES_END):
        body = body[:-len(_RULES_END)]
    rules: list[str] = []
    i = 1
    at = body.find(f" — {i}: ")
    while at >= 0:
        start = at + len(f" — {i}: ")
        nxt = body.find(f" — {i + 1}: ", start)
        rules.append(body[start:nxt if nxt >= 0 else len(body)])
        at, i = nxt, i + 1
    return tuple(r for r in rules if r.strip())


def words_message(texts: Sequence[str]) -> Message | None:
    """The message keeping ``texts`` (the user's messages, oldest first) verbatim."""
    if not texts:
        return None
    n = len(texts)
    body = "\n\n".join(f"{_WORDS_LABEL.format(i=i, n=n)} {t}{_WORDS_END.format(i=i)}"
                       for i, t in enumerate(texts, start=1))
    return Message(Role.USER, (Text(f"{USER_WORDS_HEADER}\n\n{body}"),), tag=TAG_USER_WORDS,
                   meta={"kept_messages": n})


def kept_messages_of(message: Message) -> tuple[str, ...]:
    """The user's messages a :func:`words_message` holds, oldest first."""
    text = message.text
    if not text.startswith(USER_WORDS_HEADER):
        return ()
    body = text[len(USER_WORDS_HEADER):].lstrip("\n")
    first = re.match(r"Earlier message 1 of (\d+): ", body)
    if first is None:
        return (body,) if body.strip() else ()
    n = int(first.group(1))
    out: list[str] = []
    at = first.end()
    for i in range(1, n + 1):
        end = _WORDS_END.format(i=i)
        if i < n:
            sep = f"{end}\n\n{_WORDS_LABEL.format(i=i + 1, n=n)} "
            stop = body.find(sep, at)
            if stop < 0:
                out.append(body[at:])
                break
            out.append(body[at:stop])
            at = stop + len(sep)
        else:
            out.append(body[at:-len(end)] if body.endswith(end) else body[at:])
    return tuple(out)


# -- what a compaction keeps ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Carried:
    """What the history already keeps: its pinned rules and kept messages (oldest first)."""

    rules: tuple[str, ...] = ()
    words: tuple[str, ...] = ()


def carried(history: History) -> Carried:
    """The rules and kept messages of ``history``'s own pinned and kept messages."""
    rules: list[str] = []
    words: list[str] = []
    for m in history:
        if m.tag == TAG_PINNED_RULES:
            rules.extend(rules_of(m))
        elif m.tag == TAG_USER_WORDS:
            words.extend(kept_messages_of(m))
    return Carried(tuple(rules), tuple(words))


@dataclass(frozen=True, slots=True)
class Kept:
    """The pinned and kept messages a compaction writes, and what went into them."""

    pinned: Message | None
    words: Message | None
    rules: tuple[str, ...]          # pinned, oldest first
    new_rules: int                  # of them, found in the messages this compaction replaces
    unpinned: tuple[str, ...]       # rules past the bound, left to the summary (oldest first)
    unpinned_earlier: tuple[str, ...]  # of them, pinned before: the summarizer is given them
    kept: tuple[str, ...] = ()      # the user's messages kept verbatim, oldest first

    @property
    def kept_messages(self) -> int:
        return len(self.kept)

    def fewer(self) -> Kept:
        """The same without the oldest kept message: the budget is a share of the target,
        and the kept messages never push the history over the target itself."""
        kept = self.kept[1:]
        return dataclasses.replace(self, words=words_message(kept), kept=kept)


def keep(previous: Carried, replaced: Sequence[Message], *, target_bytes: int,
         settings: Settings) -> Kept:
    """The pinned rules and kept messages after a compaction that replaces ``replaced``.

    Rules: ``previous``'s, then those of the user's messages in ``replaced``, merged (a
    rule stated again moves to its latest place) and bounded by
    ``settings.pinned_rules_max_chars`` (the oldest go first). Kept messages: ``previous``'s
    and the user's messages in ``replaced``, newest first while each whole one fits in
    ``settings.user_words_share × target_bytes`` bytes (one that does not is skipped, and
    older smaller ones may still fit), placed oldest first.
    """
    user_texts = [m.text for m in replaced if m.role is Role.USER and m.tag is None]
    order: dict[str, str] = {}
    earlier = {_key(r) for r in previous.rules}
    for rule in (*previous.rules, *(r for t in user_texts for r in rules_in(t))):
        key = _key(rule)
        order.pop(key, None)        # stated again: it moves to where it was stated last
        order[key] = rule
    merged = list(order.items())
    limit = settings.pinned_rules_max_chars
    size = len(PINNED_RULES_HEADER) + len(_RULES_END)
    kept_rules: list[tuple[str, str]] = []
    for key, rule in reversed(merged):
        cost = len(rule) + len(f" — {len(merged)}: ")
        if size + cost > limit:
            break               # this one and every older one leave the pin
        kept_rules.append((key, rule))
        size += cost
    kept_rules.reverse()
    unpinned = tuple(rule for key, rule in merged[:len(merged) - len(kept_rules)])
    rules = tuple(rule for _, rule in kept_rules)

    budget = int(settings.user_words_share * max(0, target_bytes))
    pool = [*previous.words, *user_texts]
    chosen: list[str] = []
    used = len(USER_WORDS_HEADER.encode("utf-8"))
    for text in reversed(pool):
        cost = len(text.encode("utf-8", "surrogatepass")) + 64   # its label and end mark
        if used + cost <= budget:
            chosen.append(text)
            used += cost
    chosen.reverse()

    return Kept(pinned_message(rules), words_message(chosen), rules,
                sum(1 for key, _ in kept_rules if key not in earlier), unpinned,
                tuple(r for r in unpinned if _key(r) in earlier), tuple(chosen))


def summary_instructions(instructions: str | None, kept: Kept) -> str | None:
    """The summary request's instructions, with the rules pinned before that no longer fit
    the pin (so the summary keeps their substance); on one line, as the user's words are."""
    if not kept.unpinned_earlier:
        return instructions
    rules = " — ".join(kept.unpinned_earlier)
    note = ("keep in the summary these earlier standing instructions of the user, "
            f"no longer quoted verbatim elsewhere: {rules}")
    return f"{instructions.strip()} — {note}" if instructions and instructions.strip() else note
