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

Summarizer input (``chunking.py``): every message it replaces reaches the summarizer
whole. Each is rendered with a label opening its first line and an end mark closing its
last (``Message 3 of 12, from the user: … — end of message 3``, ``markers.py``), so no
line starts or ends in it where the message's own lines did not, and a firewall reads no
more into it than into the message itself. When they do not fit one request's bound
(``settings.summarizer_input_max_chars``), they are summarized in chunks with a rolling
summary: request k carries the summary so far and chunk k, each through ``summarize``; a
message too big for one chunk is sent in labelled parts, cut at line or word boundaries,
never cut down. At most ``settings.summary_max_requests`` requests: past that the oldest
messages are **dropped unread** — removed without being summarized, left out of the
summary's header, and told (the report's ``dropped_unread``, the ``applied`` phase, and
a compaction notice after the summary, ``prompts.compaction_notice``).

The summarizer's reply (:class:`SummaryReply`, or a plain string) says whether it was cut
at its own max_tokens. A cut reply is sent again once through ``retry`` (the session's
request with a bigger max_tokens) when given and while the request bound has room; still
cut, it is refused ("the summary was cut at its own max_tokens"). Truncation is decided
before the summary's text is checked (``_normalize_summary``).

The summary is checked against the messages it replaces: refused when it was cut at its
own ``max_tokens``, answers instead of summarizing, is mostly the prompt's or the input's
framing, or keeps none of their facts (``summary_check.py``, the reason in one clause);
once accepted, the facts it lacks (identifiers, numbers with units, paths, names, quoted
strings: ``facts.py``) are appended verbatim within ``summary_max_chars``, most recent
first, and the report and the ``applied`` phase say how many it kept and got back.

Split rule: the summarized part is the fewest oldest messages that reach the target, in
units never split apart (a tool call with its results; system messages and the payload
notice stay pinned; the latest request and everything after it are never summarized),
extended forward to an exchange boundary so the kept part starts at a real user request
and an answer is never separated from its question. Only if that boundary split did not
reach the target would the finer unit split be used.

The summary's ``N`` counts original conversation messages: a summary that absorbs an
earlier summary adds the N that one covered, so the header stays true over repeated
compactions (there is only ever one summary message; earlier ones are summarized again).

The user's words (``pins.py``): the rules the user stated in the replaced messages are
pinned verbatim in one message right after the system messages, and the user's own
replaced messages are kept verbatim right after the summary, within a share of the target.
Both are rebuilt (merged with what they held) at every compaction and never summarized;
the split reserves their room as it reserves the summary's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import redact
from ..settings import Settings
from . import chunking, markers, pins
from . import facts as fact_check
from .events import CompactionPhase, EventCallback
from .history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_PINNED_RULES,
    TAG_SUMMARY,
    TAG_USER_WORDS,
    History,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
    latest_user_index,
)
from .prompts import compaction_notice, summary_header, with_recall_hint
from .summary_check import refusal, without_preface

__all__ = [
    "ChatBudget",
    "CompactionReport",
    "Measure",
    "Summarizer",
    "SummaryReply",
    "chat_budget",
    "compact",
    "compaction_budget",
    "compaction_target",
    "trim",
]

@dataclass(frozen=True, slots=True)
class SummaryReply:
    """A summarizer's answer: its text, whether it was cut at its own max_tokens, and the
    tokens the request used (None: not reported)."""

    text: str
    truncated: bool = False
    input_tokens: int | None = None
    output_tokens: int | None = None


Summarizer = Callable[[str], "SummaryReply | str"]
"""Given the text of one summary request (``chunking.request_text``), return the summary:
a :class:`SummaryReply`, or a plain string (never cut)."""

Measure = Callable[[History], int]
"""Size of a history in request-body bytes (the provider's exact encoding)."""

_Phase = Literal["start", "trim", "summarize", "applied", "rejected", "cancelled"]
_Outcome = Literal["summary", "trim", "nothing"]

_DROPPED_META = "dropped_messages"     # the compaction notice's count (as the ladder's)
_UNREAD_META = "dropped_unread"
TRUNCATED = "the summary was cut at its own max_tokens"


# Messages the package keeps across compactions without summarizing them (pins.py).
_REBUILT = frozenset({TAG_PINNED_RULES, TAG_USER_WORDS})
_NEVER_SUMMARIZED = frozenset({TAG_PAYLOAD_NOTICE, *_REBUILT})

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
    chunks: int = 0
    """Chunks the summarized messages were read in (0: no summary was asked for)."""
    summary_requests: int = 0
    """Summary requests sent (the chunks, and a retry of a cut reply)."""
    summary_input_tokens: int | None = None
    summary_output_tokens: int | None = None
    """Tokens the summary requests used, when the provider said (None: not known)."""
    dropped_unread: int = 0
    """Messages removed without being summarized: past ``summary_max_requests``."""
    pinned_rules: int = 0           # rules the pinned message holds after it (core/pins.py)
    new_rules: int = 0              # of them, pinned by this compaction
    unpinned_rules: int = 0         # rules past the pin's bound, left to the summary
    kept_user_messages: int = 0     # the user's messages kept verbatim after the summary
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
            retry: Summarizer | None = None,
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

    ``summarize`` is called once a chunk (the module docstring); ``retry``, when given,
    asks the same request again with a bigger max_tokens after a reply cut at its own.
    """
    emit = _ignore if on_event is None else on_event
    n0 = len(history)
    b0 = measure(history)

    cost = _Cost()

    def phase(kind: _Phase, *, n1: int | None = None, b1: int | None = None,
              outcome: _Outcome | None = None, reason: str | None = None,
              rules: dict[str, int] | None = None) -> None:
        emit(CompactionPhase(phase=kind, before_messages=n0, after_messages=n1,
                             before_bytes=b0, after_bytes=b1, target_bytes=target_bytes,
                             outcome=outcome, reason=reason, chunks=cost.chunks,
                             summary_requests=cost.requests,
                             summary_input_tokens=cost.input_tokens,
                             summary_output_tokens=cost.output_tokens,
                             dropped_unread=cost.dropped_unread,
                             summary_request_bound=cost.bound,
                             read_messages=cost.read, **(rules or {})))

    def unchanged(reason: str) -> tuple[History, CompactionReport]:
        # All or nothing: a rejected compaction keeps even the trim out of the history.
        phase("rejected", n1=n0, b1=b0, reason=reason)
        return history, CompactionReport(
            False, n0, n0, b0, b0, 0, 0, reason, chunks=cost.chunks,
            summary_requests=cost.requests, summary_input_tokens=cost.input_tokens,
            summary_output_tokens=cost.output_tokens)

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
    kept = pins.keep(pins.carried(base), old, target_bytes=target_bytes, settings=settings)
    instructions = pins.summary_instructions(instructions, kept)

    try:  # from the announced phase on, an interrupt is told as "cancelled"
        try:
            chunk_plan = _summarizer_plan(old, settings, instructions)
        except KeyboardInterrupt:
            phase("summarize")
            raise
        cost.chunks, cost.dropped_unread = chunk_plan.requests, len(chunk_plan.dropped)
        cost.bound, cost.read = settings.summary_max_requests, len(chunk_plan.read)
        phase("summarize")
        if not chunk_plan.chunks:
            return unchanged("no message could be read within the summary-request bound")
        text, reason, facts = _summarize_chunks(chunk_plan, summarize, retry, settings,
                                                instructions, should_cancel, cost)
    except KeyboardInterrupt:
        phase("cancelled", n1=n0, b1=b0)
        raise
    except Exception as e:  # a provider failure rejects the summary; the turn goes on
        return unchanged(f"the summarizer failed ({type(e).__name__}: {redact(str(e))})")
    if text is None:
        return unchanged(reason or "unusable summary")

    covered = sum(_covered(m) for m in chunk_plan.read)
    summary = Message(Role.USER, (Text(text),), tag=TAG_SUMMARY,
                      meta={"covered_messages": covered})
    replacement = [summary]
    unread = len(chunk_plan.dropped)
    if unread:
        replacement.append(_unread_notice(base, unread))
    result = _replace(base, set(chosen), tuple(replacement), kept)
    b1 = measure(result)
    while b1 > target_bytes and kept.kept_messages:
        # The user's kept messages never push the history over the target (pins.py).
        kept = kept.fewer()
        result = _replace(base, set(chosen), tuple(replacement), kept)
        b1 = measure(result)
    if b1 >= base_bytes:
        return unchanged("the summary does not make the history smaller")
    rules: dict[str, int] = {
        "pinned_rules": len(kept.rules), "new_rules": kept.new_rules,
        "unpinned_rules": len(kept.unpinned), "kept_user_messages": kept.kept_messages}
    rules.update(facts_kept=facts.kept, facts_added=facts.added, facts_total=facts.total)
    phase("applied", n1=len(result), b1=b1, outcome="summary", rules=rules)
    return result, CompactionReport(
        True, n0, len(result), b0, b1, len(chunk_plan.read), trimmed_blocks,
        chunks=chunk_plan.requests, summary_requests=cost.requests,
        summary_input_tokens=cost.input_tokens, summary_output_tokens=cost.output_tokens,
        dropped_unread=unread, pinned_rules=len(kept.rules), new_rules=kept.new_rules,
        unpinned_rules=len(kept.unpinned), kept_user_messages=kept.kept_messages,
        facts_kept=facts.kept, facts_added=facts.added, facts_total=facts.total)


@dataclass(slots=True)
class _Cost:
    """What one compaction's summary costs, counted as its requests are sent."""

    chunks: int = 0
    requests: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    dropped_unread: int = 0
    bound: int | None = None
    read: int = 0

    def add(self, reply: SummaryReply) -> None:
        self.requests += 1
        self.input_tokens = _add(self.input_tokens, reply.input_tokens)
        self.output_tokens = _add(self.output_tokens, reply.output_tokens)


def _summarizer_plan(messages: Sequence[Message], settings: Settings,
                     instructions: str | None) -> chunking.ChunkPlan:
    """The requests that will summarize ``messages`` (``chunking.plan``)."""
    return chunking.plan(messages, bound=settings.summarizer_input_max_chars,
                         summary_max_chars=settings.summary_max_chars,
                         max_requests=settings.summary_max_requests, instructions=instructions)


def _as_reply(raw: SummaryReply | str) -> SummaryReply:
    return raw if isinstance(raw, SummaryReply) else SummaryReply(raw)


def _add(total: int | None, more: int | None) -> int | None:
    return more if total is None else total if more is None else total + more


def _summarize_chunks(chunk_plan: chunking.ChunkPlan, summarize: Summarizer,
                      retry: Summarizer | None, settings: Settings, instructions: str | None,
                      should_cancel: Callable[[], bool] | None,
                      cost: _Cost) -> tuple[str | None, str | None, fact_check.FactCheck]:
    """The summary (with its header) of ``chunk_plan``'s messages, one request a chunk with
    the summary so far carried forward, and its fact check against every message read; or
    (None, why it is unusable, no check). ``cost`` gets the requests sent and their tokens.
    The facts are checked, and those missing appended, on the last request's summary: an
    intermediate one is carried forward, not kept."""
    no_check = fact_check.FactCheck()
    chunks = chunk_plan.chunks
    so_far: str | None = None
    covered = sum(_covered(m) for m in chunk_plan.read)
    replaced_chars = sum(m.char_size() for m in chunk_plan.read)
    for k in range(len(chunks)):
        request = chunking.request_text(chunk_plan, k, so_far, instructions)
        _check_cancel(should_cancel)
        reply = _ask(summarize, request, cost)
        left = len(chunks) - k - 1
        if reply.truncated and retry is not None \
                and cost.requests + 1 + left <= settings.summary_max_requests:
            reply = _ask(retry, request, cost)
        _check_cancel(should_cancel)
        where = f" (request {k + 1} of {len(chunks)})" if len(chunks) > 1 else ""
        if reply.truncated:
            return None, TRUNCATED + where, no_check
        last = k == len(chunks) - 1
        # The checks of the summary's text (h/facts extends them) are _normalize_summary's;
        # truncation is decided above, before it is called. The summary so far is bounded
        # by the room the next request keeps for it (a chunk may be smaller than that).
        text, reason, check = _normalize_summary(
            reply.text, covered, settings if last else settings.replace(
                summary_max_chars=chunk_plan.summary_room),
            replaced_chars if last else chunk_plan.summary_room + 1,
            texts=[_fact_text(m) for m in chunk_plan.read] if last else ())
        if text is None:
            return None, (reason or "unusable summary") + where, no_check
        if last:
            return text, None, check
        so_far = text.partition("\n")[2].strip() or text
    return None, "no message could be read within the summary-request bound", no_check


def _ask(summarize: Summarizer, request: str, cost: _Cost) -> SummaryReply:
    reply = _as_reply(summarize(request))
    cost.add(reply)
    return reply


def _unread_notice(history: History, unread: int) -> Message:
    """The compaction notice after a summary that left ``unread`` messages unread: it
    replaces earlier notices and carries their counts (as the ladder's does)."""
    earlier = earlier_unread = 0
    for m in history:
        if m.tag == TAG_COMPACTION_NOTICE and m.meta:
            count, was_unread = m.meta.get(_DROPPED_META), m.meta.get(_UNREAD_META)
            earlier += count if isinstance(count, int) else 0
            earlier_unread += was_unread if isinstance(was_unread, int) else 0
    total, total_unread = earlier + unread, earlier_unread + unread
    return Message(Role.USER, (Text(with_recall_hint(compaction_notice(
                       total, summarized=True, unread=total_unread))),),
                   TAG_COMPACTION_NOTICE, {_DROPPED_META: total, _UNREAD_META: total_unread})


def _ignore(_event: object) -> None:
    return None


def _check_cancel(should_cancel: Callable[[], bool] | None) -> None:
    if should_cancel is not None and should_cancel():
        raise KeyboardInterrupt("compaction cancelled")


def _summarizable_units(history: History) -> list[list[int]]:
    """Non-system messages before the latest user request, in units never split apart.

    The payload-limit SYSTEM NOTICE is guidance for every later turn, so like a system
    message it is never summarized away. The pinned rules and the user's kept messages
    (``pins.py``) are not either: they are rebuilt at each compaction, never compressed.

    A unit is one message, or an assistant message with tool calls plus the tool messages
    right after it: a call and its results are summarized together or kept together.
    """
    latest = latest_user_index(history)
    end = len(history) if latest is None else latest
    units: list[list[int]] = []
    i = 0
    while i < end:
        m = history[i]
        if m.role is Role.SYSTEM or m.tag in _NEVER_SUMMARIZED:
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


def _replace(history: History, chosen: set[int], summary: Message | tuple[Message, ...],
             kept: pins.Kept | None = None) -> History:
    """``history`` with the ``chosen`` messages replaced by ``summary`` (one message, or a
    summary and its notice) at the first one's place.

    System messages are never chosen, so they all stay, in order. A compaction notice
    given in ``summary`` replaces every other one (never stacked). With ``kept``, the
    history's pinned and kept messages give way to ``kept``'s: its pinned rules right
    after the system messages (before the first other message), its kept user messages
    right after the summary. All are user messages, which both wires merge into one with
    the summary, so roles still alternate.
    """
    new = summary if isinstance(summary, tuple) else (summary,)
    noticed = any(m.tag == TAG_COMPACTION_NOTICE for m in new)
    first = min(chosen)
    gone = set(chosen)
    pinned_at = len(history)
    if kept is not None:
        gone.update(i for i, m in enumerate(history) if m.tag in _REBUILT)
        pinned_at = next((i for i, m in enumerate(history) if m.role is not Role.SYSTEM),
                         len(history))
    out: list[Message] = []
    for i, m in enumerate(history):
        if i == pinned_at and kept is not None and kept.pinned is not None:
            out.append(kept.pinned)
        if i == first:
            out.extend(new)
            if kept is not None and kept.words is not None:
                out.append(kept.words)
        elif i not in gone and not (noticed and m.tag == TAG_COMPACTION_NOTICE):
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
    maximum (``summary_max_chars``, or the replaced text if that is smaller); the pinned
    rules and the user's kept messages that split would write are measured as written. Size falls as
    more units are replaced, so a binary search needs few ``measure`` calls. When nothing
    fits, everything summarizable is summarized.
    """
    prefix_chars: list[int] = []
    total = 0
    for unit in units:
        total += sum(history[i].char_size() for i in unit)
        prefix_chars.append(total)

    previous = pins.carried(history)

    def fits(k: int) -> bool:
        chosen = {i for unit in units[:k] for i in unit}
        reserve = min(settings.summary_max_chars, prefix_chars[k - 1])
        placeholder = Message(Role.USER, (Text(summary_header(0) + "x" * reserve),),
                              tag=TAG_SUMMARY)
        kept = pins.keep(previous, [history[i] for i in sorted(chosen)], target_bytes=target,
                         settings=settings)
        return measure(_replace(history, chosen, placeholder, kept)) <= target

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


# -- the summarizer's output ----------------------------------------------------------------

def _fact_text(message: Message) -> str:
    """The text of ``message`` whose facts a summary must keep: what the conversation wrote
    (an earlier summary without its header, the arguments of its tool calls), nothing for
    a text the package wrote."""
    if chunking.package_wrote(message):
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
    text = f"{with_recall_hint(summary_header(covered))}\n{body}"
    if len(text) > settings.summary_max_chars:
        return None, (f"the summary is too long ({len(text)} chars > "
                      f"{settings.summary_max_chars})"), no_check
    if len(text) >= replaced_chars:
        return None, "the summary is not smaller than the messages it replaces", no_check
    bound = min(settings.summary_max_chars, replaced_chars - 1)
    text, check = fact_check.append_missing(text, facts, bound)
    return text, None, check
