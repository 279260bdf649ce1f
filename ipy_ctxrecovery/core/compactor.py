"""History compactor (SPEC §7): trim → summarize → apply, with status phases and cancellation.

Three public steps, all pure (the only calls out are ``measure``, ``summarize`` and
``on_event``):

- :func:`chat_budget` is the *trigger* (ANCHORS: ``min(window × ratio × bytes/token,
  0.7 × cap)``, with the term that sets it; :func:`compaction_budget` its bytes) and
  :func:`compaction_target` the level compaction aims at, a fraction of the trigger, so one compaction buys several turns before the next (ANCHORS weakness 6).
- :func:`trim` removes reasoning blocks and duplicate content without an LLM.
- :func:`compact` trims, and if that is not enough replaces the oldest non-system messages
  with one ``[STRUCTURED SUMMARY — covering N earlier messages]`` user message written by
  the ``summarize`` callable. The summarizer's input is bounded and its output checked
  (ANCHORS weakness 7); an unusable summary leaves the history exactly as it was.

The summary is checked against the messages it replaces: refused when it was cut at its
own ``max_tokens``, answers instead of summarizing, is mostly the prompt's or the input's
framing, or keeps none of their facts (``summary_check.py``, the reason in one clause);
once accepted, the facts it lacks (identifiers, numbers with units, paths, names, quoted
strings: ``facts.py``) are appended verbatim within ``summary_max_chars``, most recent
first, and the report and the ``applied`` phase say how many it kept and got back.

Summarizer input bound (``settings.summarizer_input_max_chars``): every message is
rendered with a label opening its first line and an end mark closing its last
(``[message 3 of 12, from the user] … [end of message 3]``, ``markers.py``), so no line
starts or ends in it where the message's own lines did not, and a firewall reads no more
into it than into the message itself. A message longer than a quarter of the bound keeps
its head (¾) and tail (¼), cut at line boundaries when near (``cuts.py``), around a
``[… N chars omitted …]`` marker. If the sections still exceed the bound, an earlier
summary (if any) is always kept, then the most recent sections that fit, and a note says
how many older messages were omitted. The user's ``instructions`` (a manual compact) are
appended after the bounded part.

Split rule: the summarized part is the fewest oldest messages that reach the target, in
units never split apart (a tool call with its results; system messages and the payload
notice stay pinned; the latest request and everything after it are never summarized),
extended forward to an exchange boundary so the kept part starts at a real user request
and an answer is never separated from its question. Only if that boundary split did not
reach the target would the finer unit split be used.

The summary's ``N`` counts original conversation messages: a summary that absorbs an
earlier summary adds the N that one covered, so the header stays true over repeated
compactions (there is only ever one summary message; earlier ones are summarized again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import redact
from ..settings import Settings
from . import facts as fact_check
from . import markers
from .cuts import head_cut, tail_cut
from .events import CompactionPhase, EventCallback
from .history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    TAG_SYNTHETIC_RESULT,
    History,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
    latest_user_index,
)
from .prompts import summary_header
from .summary_check import refusal, without_preface

__all__ = [
    "ChatBudget",
    "CompactionReport",
    "Measure",
    "Summarizer",
    "chat_budget",
    "compact",
    "compaction_budget",
    "compaction_target",
    "trim",
]

Summarizer = Callable[[str], str]
"""Given the bounded text of the messages to summarize (with instructions), return a summary."""

Measure = Callable[[History], int]
"""Size of a history in request-body bytes (the provider's exact encoding)."""

_Phase = Literal["start", "trim", "summarize", "applied", "rejected", "cancelled"]
_Outcome = Literal["summary", "trim", "nothing"]

# Limits of the summarizer input (its framing: ``markers.py``); the policy: module docstring.
_MESSAGE_SHARE = 4          # one message may use at most 1/4 of the input bound
_HEAD_SHARE = 0.75          # of a cut message, ¾ head and ¼ tail
_NOTE_ROOM = 120            # chars kept free for the omitted note


_HEADER_RE = re.compile(
    r"\[\s*STRUCTURED SUMMARY\s*[—–-]+\s*covering\s+(\d+)\s+earlier\s+messages?\s*\]",
    re.IGNORECASE,
)
# A header line the summarizer may have written itself (possibly as a markdown heading).
_LEADING_HEADER_RE = re.compile(r"\A[\s#*_>`]*\[?\s*STRUCTURED SUMMARY\b[^\n]*(\n|\Z)",
                                re.IGNORECASE)
_REFUSALS = (
    "i can't", "i cannot", "i can not", "i'm sorry", "i am sorry", "sorry,", "sorry ",
    "i apologize", "i'm unable", "i am unable", "i won't", "i will not", "i'm not able",
    "i am not able", "as an ai",
)


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What :func:`compact` did. ``applied`` is False exactly when the history is unchanged."""

    applied: bool
    before_messages: int
    after_messages: int
    before_bytes: int
    after_bytes: int
    summarized_messages: int = 0
    trimmed_blocks: int = 0
    rejected_reason: str | None = None
    facts_kept: int = 0
    facts_added: int = 0
    facts_total: int = 0
    """The facts of the replaced messages (``core/facts.py``): how many the summary kept,
    how many were added back verbatim, out of how many."""


# -- budget ---------------------------------------------------------------------------------

NO_LIMIT = 2 ** 62
"""The trigger when neither a window nor a cap is known: compaction never fires by itself."""


@dataclass(frozen=True, slots=True)
class ChatBudget:
    """A compaction trigger in bytes and the term that sets it: ``share`` of the window
    (its bytes at the calibrated bytes/token) or of the cap; ``of`` None when neither is
    known (``NO_LIMIT``)."""

    bytes: int
    of: Literal["window", "cap"] | None = None
    share: float | None = None


def chat_budget(settings: Settings, *, window_tokens: int | None, bytes_per_token: float,
                cap: int | None, ratio: float) -> ChatBudget:
    """The trigger: ``min(window × ratio × bytes/token, cap_budget_fraction × cap)``.

    ``ratio`` is ``settings.chat_budget_ratio`` in chat, ``manual_compact_ratio`` for a
    manual compact, ``preflight_budget_ratio`` after a pre-flight hit. ``cap`` None means
    no payload cap, ``window_tokens`` None no known window (a guess is not a reason to
    summarize); a missing term does not apply.
    """
    budget = ChatBudget(NO_LIMIT)
    if window_tokens is not None:
        budget = ChatBudget(max(0, int(window_tokens * ratio * bytes_per_token)), "window", ratio)
    if cap is not None:
        of_cap = max(0, int(settings.cap_budget_fraction * cap))
        if of_cap < budget.bytes:
            budget = ChatBudget(of_cap, "cap", settings.cap_budget_fraction)
    return budget


def compaction_budget(settings: Settings, *, window_tokens: int | None, bytes_per_token: float,
                      cap: int | None, ratio: float) -> int:
    """:func:`chat_budget`'s bytes."""
    return chat_budget(settings, window_tokens=window_tokens, bytes_per_token=bytes_per_token,
                       cap=cap, ratio=ratio).bytes


def compaction_target(trigger: int, settings: Settings) -> int:
    """Where compaction aims: ``compaction_target_fraction × trigger`` (hysteresis)."""
    return max(0, int(trigger * settings.compaction_target_fraction))


def trim(history: History) -> tuple[History, int]:
    """Remove reasoning blocks and duplicate content without an LLM; returns blocks removed.

    - Reasoning blocks go from assistant messages *before* the latest user request; those
      of the turn in progress stay (Anthropic requires the thinking block of an unfinished
      tool loop to be sent back). An assistant message left with no block is dropped; one
      with tool calls always keeps them.
    - A tool result identical to a later one becomes a one-line pointer to the later copy
      (only when the pointer is shorter); the tool message itself stays, so pairing holds.
    - Of two adjacent identical user messages (a re-sent request) the earlier is dropped.

    System messages, tagged messages' content and the latest user request are never
    touched; the input is not modified.
    """
    latest = latest_user_index(history)
    removed = 0

    stripped: list[Message] = []
    for i, m in enumerate(history):
        if m.role is Role.ASSISTANT and (latest is None or i < latest) \
                and any(isinstance(b, Reasoning) for b in m.blocks):
            kept = tuple(b for b in m.blocks if not isinstance(b, Reasoning))
            removed += len(m.blocks) - len(kept)
            if not kept:
                continue        # reasoning was all it held: nothing left to send
            m = m.with_blocks(kept)
        stripped.append(m)

    # Tool results: newest first, so the latest copy of a content is the one kept.
    latest_copy: dict[str, ToolResult] = {}
    for i in range(len(stripped) - 1, -1, -1):
        m = stripped[i]
        result = m.tool_result
        if m.role is not Role.TOOL or m.tag is not None or result is None \
                or not result.content or result.content.startswith(markers.POINTER_PREFIX):
            continue            # pointers of 3+ copies are alike; they are not content
        later = latest_copy.get(result.content)
        if later is None:
            latest_copy[result.content] = result
            continue
        pointer = markers.duplicate_pointer(len(result.content), later.name, later.call_id)
        if len(pointer) < len(result.content) and \
                len(pointer.encode("utf-8")) < len(result.content.encode("utf-8")):
            stripped[i] = m.with_blocks(
                ToolResult(result.call_id, pointer, result.is_error, result.name)
                if isinstance(b, ToolResult) else b
                for b in m.blocks
            )
            removed += 1

    out: list[Message] = []
    for i, m in enumerate(stripped):
        nxt = stripped[i + 1] if i + 1 < len(stripped) else None
        if m.role is Role.USER and nxt is not None and nxt == m:
            removed += len(m.blocks)
            continue            # the later identical copy stays (it may be the latest request)
        out.append(m)

    return (history if not removed else tuple(out)), removed


# -- compact --------------------------------------------------------------------------------

def compact(history: History, *, target_bytes: int, measure: Measure, summarize: Summarizer,
            settings: Settings, on_event: EventCallback | None = None,
            instructions: str | None = None, force_summary: bool = False,
            should_cancel: Callable[[], bool] | None = None,
            ) -> tuple[History, CompactionReport]:
    """Compact ``history`` to at most ``target_bytes``; on KeyboardInterrupt re-raise, untouched.

    Phases (each an :class:`~.events.CompactionPhase` through ``on_event``): ``start``,
    ``trim``; then, when trim alone does not reach the target, ``summarize`` (the fewest
    oldest messages that bring the history to the target; with ``force_summary``, for a
    manual compact already under its target, everything before the latest request) and
    ``applied``. Otherwise ``rejected``: the history is returned unchanged with
    ``applied=False`` — all or nothing, even the trim is dropped. Or ``cancelled``: a
    ``KeyboardInterrupt`` from ``summarize``, or ``should_cancel()`` true just before or
    after it, is re-raised and nothing is returned. A summary that does not bring the
    history down to the target is still applied when it shrinks it; ``after_bytes``
    tells the caller. Any other exception from ``summarize`` rejects the summary.
    """
    emit = _ignore if on_event is None else on_event
    n0 = len(history)
    b0 = measure(history)

    def phase(kind: _Phase, *, n1: int | None = None, b1: int | None = None,
              outcome: _Outcome | None = None, reason: str | None = None) -> None:
        emit(CompactionPhase(phase=kind, before_messages=n0, after_messages=n1,
                             before_bytes=b0, after_bytes=b1, target_bytes=target_bytes,
                             outcome=outcome, reason=reason))

    def unchanged(reason: str) -> tuple[History, CompactionReport]:
        # All or nothing: a rejected compaction keeps even the trim out of the history.
        phase("rejected", n1=n0, b1=b0, reason=reason)
        return history, CompactionReport(False, n0, n0, b0, b0, 0, 0, reason)

    phase("start")
    phase("trim")
    base, trimmed_blocks = trim(history)
    base_bytes = measure(base) if trimmed_blocks else b0
    if base_bytes > b0:         # an encoding quirk made the trim larger: do without it
        base, trimmed_blocks, base_bytes = history, 0, b0

    if base_bytes <= target_bytes and not force_summary:
        if not trimmed_blocks:
            phase("applied", n1=n0, b1=b0, outcome="nothing")
            return history, CompactionReport(False, n0, n0, b0, b0)
        phase("applied", n1=len(base), b1=base_bytes, outcome="trim")
        return base, CompactionReport(True, n0, len(base), b0, base_bytes, 0, trimmed_blocks)

    units = _summarizable_units(base)
    if not units:
        return unchanged("nothing older than the latest request to summarize")
    # A forced (manual) compact summarizes everything before the latest request.
    k = len(units) if force_summary and base_bytes <= target_bytes else \
        _choose_split(base, units, target_bytes, measure, settings)
    chosen = [i for unit in units[:k] for i in unit]
    old = [base[i] for i in chosen]
    replaced_chars = sum(m.char_size() for m in old)
    covered = sum(_covered(m) for m in old)

    phase("summarize")
    try:  # from the announced phase on, an interrupt is told as "cancelled"
        request = _summarizer_input(old, settings, instructions)
        _check_cancel(should_cancel)
        raw = summarize(request)
        _check_cancel(should_cancel)
    except KeyboardInterrupt:
        phase("cancelled", n1=n0, b1=b0)
        raise
    except Exception as e:  # a provider failure rejects the summary; the turn goes on
        return unchanged(f"the summarizer failed ({type(e).__name__}: {redact(str(e))})")

    text, reason, facts = _normalize_summary(raw, covered, settings, replaced_chars,
                                             texts=[_fact_text(m) for m in old])
    if text is None:
        return unchanged(reason or "unusable summary")
    summary = Message(Role.USER, (Text(text),), tag=TAG_SUMMARY,
                      meta={"covered_messages": covered})
    result = _replace(base, set(chosen), summary)
    b1 = measure(result)
    if b1 >= base_bytes:
        return unchanged("the summary does not make the history smaller")
    emit(CompactionPhase(phase="applied", before_messages=n0, after_messages=len(result),
                         before_bytes=b0, after_bytes=b1, target_bytes=target_bytes,
                         outcome="summary", facts_kept=facts.kept, facts_added=facts.added,
                         facts_total=facts.total))
    return result, CompactionReport(True, n0, len(result), b0, b1, len(chosen), trimmed_blocks,
                                    facts_kept=facts.kept, facts_added=facts.added,
                                    facts_total=facts.total)


def _ignore(_event: object) -> None:
    return None


def _check_cancel(should_cancel: Callable[[], bool] | None) -> None:
    if should_cancel is not None and should_cancel():
        raise KeyboardInterrupt("compaction cancelled")


def _summarizable_units(history: History) -> list[list[int]]:
    """Non-system messages before the latest user request, in units never split apart.

    The payload-limit SYSTEM NOTICE is guidance for every later turn, so like a system
    message it is never summarized away.

    A unit is one message, or an assistant message with tool calls plus the tool messages
    right after it: a call and its results are summarized together or kept together.
    """
    latest = latest_user_index(history)
    end = len(history) if latest is None else latest
    units: list[list[int]] = []
    i = 0
    while i < end:
        m = history[i]
        if m.role is Role.SYSTEM or m.tag == TAG_PAYLOAD_NOTICE:
            i += 1
            continue
        unit = [i]
        i += 1
        if m.role is Role.ASSISTANT and m.tool_calls:
            while i < end and history[i].role is Role.TOOL:
                unit.append(i)
                i += 1
        units.append(unit)
    return units


def _replace(history: History, chosen: set[int], summary: Message) -> History:
    """``history`` with the ``chosen`` messages replaced by ``summary`` at the first one's place.

    System messages are never chosen, so they all stay, in order.
    """
    first = min(chosen)
    out: list[Message] = []
    for i, m in enumerate(history):
        if i == first:
            out.append(summary)
        elif i not in chosen:
            out.append(m)
    return tuple(out)


def _choose_split(history: History, units: list[list[int]], target: int, measure: Measure,
                  settings: Settings) -> int:
    """Fewest oldest exchanges whose replacement by a summary brings the history to ``target``.

    The split is first the fewest oldest *units*, then moved forward to the next exchange
    boundary (a unit that is a real user request, or the latest request itself), so the
    kept part never opens with an answer whose question went into the summary. Should the
    boundary split not fit (it cannot while size grows with content), the finer unit split
    is used.

    The summary's size is not known before the LLM writes it, so it is reserved at its
    maximum (``summary_max_chars``, or the replaced text if that is smaller). Size falls as
    more units are replaced, so a binary search needs few ``measure`` calls. When nothing
    fits, everything summarizable is summarized.
    """
    prefix_chars: list[int] = []
    total = 0
    for unit in units:
        total += sum(history[i].char_size() for i in unit)
        prefix_chars.append(total)

    def fits(k: int) -> bool:
        chosen = {i for unit in units[:k] for i in unit}
        reserve = min(settings.summary_max_chars, prefix_chars[k - 1])
        placeholder = Message(Role.USER, (Text(summary_header(0) + "x" * reserve),),
                              tag=TAG_SUMMARY)
        return measure(_replace(history, chosen, placeholder)) <= target

    lo, hi = 1, len(units)
    if not fits(hi):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    # Exchange boundary: the kept part starts at a real user request, so no answer is kept
    # without its question. Summarizing more only shrinks the history, so the snapped split
    # fits too; the check is the documented fallback to the finer split should it not.
    snapped = next((j for j in range(lo, len(units)) if _starts_exchange(history, units[j])),
                   len(units))
    if snapped != lo and fits(snapped):
        return snapped
    return lo


def _starts_exchange(history: History, unit: list[int]) -> bool:
    """Whether ``unit`` opens an exchange: it is a real user request (no tag)."""
    m = history[unit[0]]
    return m.role is Role.USER and m.tag is None


def _covered(message: Message) -> int:
    """How many original messages ``message`` stands for (an earlier summary: its N)."""
    if message.tag == TAG_SUMMARY:
        meta_n = message.meta.get("covered_messages") if message.meta else None
        if isinstance(meta_n, int) and meta_n > 0:
            return meta_n
        found = _HEADER_RE.search(message.text)
        if found:
            return max(1, int(found.group(1)))
    return 1


# -- the summarizer's input and output ------------------------------------------------------

def _label(message: Message) -> markers.SummaryLabel:
    if message.tag == TAG_SUMMARY:
        return markers.SummaryLabel(message.role.value, summary=True)
    r = message.tool_result
    if message.role is Role.TOOL:
        return markers.SummaryLabel("tool", tool=(r.name or r.call_id) if r else None,
                                    error=r is not None and r.is_error, tag=message.tag)
    return markers.SummaryLabel(message.role.value, tag=message.tag)


def _package_wrote(message: Message) -> bool:
    """Whether ``message``'s whole text is one the package wrote: a notice, a synthetic
    result, a one-liner standing for a tool result."""
    if message.tag in (TAG_COMPACTION_NOTICE, TAG_PAYLOAD_NOTICE, TAG_SYNTHETIC_RESULT):
        return True
    r = message.tool_result
    return message.role is Role.TOOL and r is not None and markers.is_one_liner(r.content)


def _render(message: Message, index: int, total: int, limit: int) -> str:
    """One message of the summarizer's input: its label, its text (cut to fit ``limit``
    with the framing) and its end mark, the text on the same lines as both."""
    text = message.text
    if _package_wrote(message):
        text = markers.unbracket(text)      # it follows other text here (markers.py)
    parts = [text]
    for b in message.blocks:
        if isinstance(b, ToolCall):
            parts.append(markers.tool_call(b.name, b.arguments))
    body = "\n".join(p for p in parts if p)
    opening = markers.label(index, total, _label(message))
    closing = markers.end_mark(index)
    body = _cut_middle(body, max(1, limit - len(opening) - len(closing) - 2))
    return f"{opening} {body} {closing}" if body else f"{opening} {closing}"


def _cut_middle(text: str, limit: int) -> str:
    """Head and tail of ``text`` within about ``limit`` chars, cut at line (else word)
    boundaries, the marker between them joined as ``markers.join_cut`` does."""
    if len(text) <= limit:
        return text
    keep_head = int(limit * _HEAD_SHARE)
    hc = head_cut(text, keep_head)
    tc = tail_cut(text, limit - keep_head, floor=hc.at)
    return markers.join_cut(text[:hc.at], markers.cut_marker(tc.at - hc.at), text[tc.at:],
                            head_line=hc.line, tail_line=tc.line)


def _summarizer_input(messages: Sequence[Message], settings: Settings,
                      instructions: str | None) -> str:
    """The bounded text sent to the summarizer (policy in the module docstring)."""
    bound = settings.summarizer_input_max_chars
    preamble = markers.preamble(len(messages)) + "\n\n"
    per_message = max(1, bound // _MESSAGE_SHARE)
    total = len(messages)
    pieces = [_render(m, i, total, per_message) for i, m in enumerate(messages, start=1)]
    sep = "\n\n"
    room = bound - len(preamble)

    pinned: list[str] = []
    rest = pieces
    if messages and messages[0].tag == TAG_SUMMARY:
        pinned, rest = pieces[:1], pieces[1:]
    body = sep.join(pinned + rest)
    if len(body) > room:
        used = sum(len(p) + len(sep) for p in pinned) + _NOTE_ROOM
        kept: list[str] = []
        for piece in reversed(rest):
            if used + len(piece) + len(sep) > room:
                break
            kept.append(piece)
            used += len(piece) + len(sep)
        kept.reverse()
        omitted = rest[:len(rest) - len(kept)]
        note = markers.omitted_note(len(omitted), sum(len(p) for p in omitted))
        body = sep.join([*pinned, note, *kept])
        if len(body) > room:    # only with a tiny bound: keep the most recent text
            body = body[tail_cut(body, room).at:] if room > 0 else ""
    text = preamble + body
    if len(text) > bound:
        text = text[:head_cut(text, bound).at]
    if instructions and instructions.strip():
        text += "\n\n" + markers.instructions(instructions.strip())
    return text


def _fact_text(message: Message) -> str:
    """The text of ``message`` whose facts a summary must keep: what the conversation wrote
    (an earlier summary without its header, the arguments of its tool calls), nothing for
    a text the package wrote."""
    if _package_wrote(message):
        return ""
    text = message.text
    if message.tag == TAG_SUMMARY:
        text = _LEADING_HEADER_RE.sub("", text.strip(), count=1)
    calls = [b.arguments for b in message.blocks if isinstance(b, ToolCall)]
    return "\n".join([text, *calls]) if calls else text


def _normalize_summary(raw: str, covered: int, settings: Settings, replaced_chars: int, *,
                       texts: Sequence[str] = (), truncated: bool = False,
                       ) -> tuple[str | None, str | None, fact_check.FactCheck]:
    """The summary with the correct header and the facts of ``texts`` (the replaced
    messages' texts, oldest first) it lacks appended verbatim within its bound, and how
    many it kept and got back; or (None, why it is unusable, no check).

    Refused: an empty summary, a refusal, one :func:`~.summary_check.refusal` refuses
    (``truncated``: cut at its own ``max_tokens``), one over ``summary_max_chars`` or not
    smaller than what it replaces. The facts go in after that, within both bounds.
    """
    no_check = fact_check.FactCheck()
    if not isinstance(raw, str) or not raw.strip():
        return None, "the summary is empty", no_check
    body = _LEADING_HEADER_RE.sub("", without_preface(raw.strip()), count=1).strip()
    if not body:
        return None, "the summary is empty", no_check
    opening = body.lstrip("#*_>`\"' \t\n").replace("’", "'").lower()
    if opening.startswith(_REFUSALS):
        return None, "the summarizer refused", no_check
    facts = fact_check.extract(texts)
    why = refusal(body, facts=facts, truncated=truncated)
    if why is not None:
        return None, why, no_check
    text = f"{summary_header(covered)}\n{body}"
    if len(text) > settings.summary_max_chars:
        return None, (f"the summary is too long ({len(text)} chars > "
                      f"{settings.summary_max_chars})"), no_check
    if len(text) >= replaced_chars:
        return None, "the summary is not smaller than the messages it replaces", no_check
    bound = min(settings.summary_max_chars, replaced_chars - 1)
    text, check = fact_check.append_missing(text, facts, bound)
    return text, None, check
