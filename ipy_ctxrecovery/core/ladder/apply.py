"""The recovery ladder (SPEC §3): apply a decided step to the history; fit before a send.

``apply`` is a pure history -> history step (plus the notices it writes); ``decide``
(pure, no I/O) chose the step, and the session does the sending. ``preflight_fit`` is
the same fitting used *before* a send, when pre-flight already knows the body is over a
limit (no rejection needed to act).

The decision (:class:`Level`, :class:`LadderState`, :class:`Decision`, :func:`decide`,
and the order in which it climbs) is :mod:`.decide`'s; the package (``core.ladder``)
exports both as one surface.

Exact fit and :func:`preflight_fit` fit in one pass (:mod:`..exactfit`): each message is
sized once, the cut is found walking back from the end, and only previews that stay in
the result have their full tool result written.

Guarantees of :func:`apply` at every level (tested over generated histories): tool
pairing valid, every system message kept, the first non-system message is ``user``, the
latest real user request kept, strings are whole characters, and the size only grows by
the notices. Messages the package wrote itself are *pinned* like system messages: a
summary (``TAG_SUMMARY``), the payload notice and the user's pinned rules
(``TAG_PINNED_RULES``, ``core/pins.py``) are kept when older messages go; the
compaction notice is replaced, never stacked, and says truthfully what happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from humanfriendly.text import pluralize

from ...settings import Settings, format_size
from .. import budget, markers, pairing
from ..budget import DeferredStore, ResultStore
from ..cuts import head_cut, tail_cut
from ..exactfit import (
    MIN_PREVIEW_CHARS,
    Outline,
    Sizes,
    drop_fit,
    outline,
    shrink_results,
    valid_pairs,
)
from ..history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_PINNED_RULES,
    TAG_SERVER_COMPACTION,
    TAG_SUMMARY,
    Block,
    History,
    Message,
    Role,
    Text,
    latest_user_index,
)
from ..prompts import PAYLOAD_NOTICE, compaction_notice, with_recall_hint
from .decide import Decision, LadderState, Level

__all__ = ["MIN_PREVIEW_CHARS", "LadderResult", "apply", "drop_oldest", "preflight_fit",
           "truncate_text"]


_PINNED_TAGS = frozenset({TAG_SUMMARY, TAG_PAYLOAD_NOTICE, TAG_PINNED_RULES,
                          TAG_SERVER_COMPACTION})  # the server's compaction: as a summary
_DROPPED_META = "dropped_messages"
_UNREAD_META = "dropped_unread"        # of those, left unread by a summary (compactor.py)


@dataclass(frozen=True, slots=True)
class LadderResult:
    history: History
    level: Level
    removed_messages: int
    notes: tuple[str, ...] = ()
    give_up_reason: str | None = None     # set (level GIVE_UP) when no cut can ever fit
    payload_notice_added: bool = False
    compaction_notice_added: bool = False
    changed: bool = False                 # the history differs from the one given


def _pinned(m: Message) -> bool:
    return m.role is Role.SYSTEM or m.tag in _PINNED_TAGS


def _unit_starts(h: Sequence[Message]) -> list[int]:
    """Where a droppable unit begins: a message, or an assistant message with its results."""
    return [i for i, m in enumerate(h) if not _pinned(m) and m.role is not Role.TOOL]


def _cut(h: Sequence[Message], k: int) -> tuple[History, int, bool]:
    """Drop every unpinned message before index ``k`` (a unit start, or ``len(h)``).

    Pinned messages from the dropped part move in front of one new compaction notice
    (which replaces earlier ones and carries their count forward). Returns (history,
    messages dropped, notice added).
    """
    dropped = sum(1 for m in h[:k] if not _pinned(m) and m.tag != TAG_COMPACTION_NOTICE)
    if dropped == 0:
        return tuple(h), 0, False
    earlier = unread = 0
    for m in h:
        if m.tag == TAG_COMPACTION_NOTICE:
            count = m.meta.get(_DROPPED_META) if m.meta else None
            earlier += count if isinstance(count, int) else 0
            was_unread = m.meta.get(_UNREAD_META) if m.meta else None
            unread += was_unread if isinstance(was_unread, int) else 0
    before = [m for m in h[:k] if _pinned(m)]
    after = [m for m in h[k:] if m.tag != TAG_COMPACTION_NOTICE]
    summarized = any(m.tag == TAG_SUMMARY for m in before)
    total = dropped + earlier
    notice = Message(Role.USER, (Text(with_recall_hint(compaction_notice(
                         total, summarized=summarized, unread=unread))),),
                     TAG_COMPACTION_NOTICE, {_DROPPED_META: total, **(
                         {_UNREAD_META: unread} if unread else {})})
    return (*before, notice, *after), dropped, True


def _with_payload_notice(h: History) -> tuple[History, bool]:
    """Insert the payload notice once, just before the latest user request."""
    if any(m.tag == TAG_PAYLOAD_NOTICE for m in h):
        return h, False
    notice = Message.user(PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE)
    at = latest_user_index(h)
    at = len(h) if at is None else at
    return (*h[:at], notice, *h[at:]), True


def _dedupe_payload_notices(h: History) -> History:
    """Several payload notices (never ours, but possible in a loaded transcript): keep the last."""
    idx = [i for i, m in enumerate(h) if m.tag is not None and m.tag == TAG_PAYLOAD_NOTICE]
    if len(idx) <= 1:
        return h
    drop = set(idx[:-1])
    return tuple(m for i, m in enumerate(h) if i not in drop)


def _first_user_cut(h: Sequence[Message], start: int) -> int:
    """The first user message at/after ``start``, never past the latest user request."""
    k = next((i for i in range(start, len(h))
              if h[i].role is Role.USER and not _pinned(h[i])), len(h))
    latest = latest_user_index(h)
    return k if latest is None else min(k, latest)


def _keep_last_cut(h: Sequence[Message], keep: int) -> int:
    """Cut for "system + last ``keep`` messages": starts at a user message, keeps the task."""
    conversation = [i for i, m in enumerate(h)
                    if not _pinned(m) and m.tag != TAG_COMPACTION_NOTICE]
    if not conversation:
        return len(h)
    start = conversation[-keep] if len(conversation) >= keep else conversation[0]
    return _first_user_cut(h, start)


def drop_oldest(history: History, units: int) -> tuple[History, int]:
    """Drop the ``units`` oldest droppable units (whole tool groups), never the latest user
    request or anything after it; returns (history, messages dropped).

    Exactly what EXACT_FIT does before any tool result is shrunk (same pairing repair,
    same notice), so tests and callers can see what one unit more or less would give."""
    h = _dedupe_payload_notices(tuple(pairing.repair_pairing(tuple(history))[0]))
    candidates = _fit_candidates(h)
    k = candidates[min(max(units, 0), len(candidates) - 1)]
    out, dropped, _ = _cut(h, k)
    return out, dropped


def _fit_candidates(h: Sequence[Message]) -> list[int]:
    first = _first_user_cut(h, 0)
    latest = latest_user_index(h)
    last = len(h) if latest is None else latest
    return sorted({first, last} | {i for i in _unit_starts(h) if first <= i <= last})


# -- text and result shrinking ------------------------------------------------------------

def truncate_text(text: str, max_chars: int, *, what: str = "text") -> str:
    """Head+tail of ``text`` in at most ``max_chars`` chars, with a marker; whole characters.

    The head ends and the tail starts at a line boundary when one is near, else at a word
    boundary, never inside a character cluster (``cuts.py``; ANCHORS 10), so no fragment of
    a word starts or ends a line.
    """
    if len(text) <= max_chars:
        return text
    room = max_chars - len(markers.long_message_marker(len(text), what)) - 2   # + joiners
    if room <= 0:
        return text[:head_cut(text, max_chars).at]
    keep_head = room * 4 // 5
    hc = head_cut(text, keep_head)
    tc = tail_cut(text, room - keep_head, floor=hc.at)
    marker = markers.long_message_marker(tc.at - hc.at, what)
    return markers.join_cut(text[:hc.at], marker, text[tc.at:], head_line=hc.line,
                            tail_line=tc.line)


def _truncate_assistants(h: History, max_chars: int) -> tuple[History, int]:
    out: list[Message] = []
    changed = 0
    for m in h:
        if m.role is Role.ASSISTANT and len(m.text) > max_chars:
            short = truncate_text(m.text, max_chars, what="a long assistant message")
            blocks: list[Block] = []
            placed = False
            for b in m.blocks:
                if isinstance(b, Text):
                    if not placed:
                        blocks.append(Text(short))
                        placed = True
                else:
                    blocks.append(b)
            out.append(m.with_blocks(blocks))
            changed += 1
        else:
            out.append(m)
    return tuple(out), changed


def _shrunk_result(m: Message, limit: int, *, settings: Settings,
                   store: ResultStore) -> Message | None:
    """A preview of tool message ``m`` in ≤ ``limit`` chars naming its persisted original."""
    return budget.shrink_tool_message(m, limit, store=store, head=settings.budget_head_chars,
                                      tail=settings.budget_tail_chars)


def _cap_results(h: History, limit: int, *, settings: Settings,
                 store: ResultStore) -> tuple[History, int]:
    """Every tool result over ``limit`` chars becomes a preview naming its persisted file."""
    out = list(h)
    changed = 0
    for i, m in enumerate(out):
        if m.role is Role.TOOL:
            new = _shrunk_result(m, limit, settings=settings, store=store)
            if new is not None:
                out[i] = new
                changed += 1
    return tuple(out), changed


# -- apply --------------------------------------------------------------------------------

def _repaired(history: History) -> tuple[History, list[str]]:
    """Pairing repaired and payload notices deduplicated: where every level starts."""
    if valid_pairs(history):
        return _dedupe_payload_notices(tuple(history)), []
    h, report = pairing.repair_pairing(history)
    return _dedupe_payload_notices(tuple(h)), _repair_notes(report)


def _repair_notes(report: pairing.PairingReport) -> list[str]:
    if not report.changed:
        return []
    return [f"pairing repaired: {report.orphans_removed} orphan results removed, "
            f"{report.synthetic_added} missing results added, {report.moved} moved"]


def apply(decision: Decision, history: History, *, settings: Settings, store: ResultStore,
          measure: Callable[[History], int],
          part: Callable[[Message], int] | None = None) -> LadderResult:
    """Carry out ``decision`` on ``history`` (pure; persisted results go to ``store``).

    ``measure`` gives a history's size in request-body bytes (the provider's encoding);
    ``part``, when given, what one message adds to it (the provider's ``message_size``),
    so an exact fit sizes each message once instead of measuring every candidate.
    LOWER_MAX_TOKENS and GIVE_UP leave the history as it is. When the system messages
    alone (or with just the latest user request) cannot fit ``decision.limit_bytes``, the
    result is GIVE_UP with ``give_up_reason`` — one sentence for the user.
    """
    original = tuple(history)
    level = decision.level
    if level in (Level.LOWER_MAX_TOKENS, Level.GIVE_UP):
        return LadderResult(original, level, 0)
    if level is Level.EXACT_FIT:
        # Pairing is repaired in the part that is kept (drop_fit), not in all of it. One
        # pass over the history (its outline) serves every step below.
        h, shape = original, outline(original)
        if sum(original[i].tag == TAG_PAYLOAD_NOTICE for i in shape.tagged) > 1:
            h = _dedupe_payload_notices(original)
            shape = outline(h)
        reason = _hopeless(h, decision, measure, settings,
                           systems=tuple([h[i] for i in shape.systems]))
        if reason is not None:
            return LadderResult(original, Level.GIVE_UP, 0, give_up_reason=reason)
        fitted = _exact_fit(decision, h, [], settings=settings, store=store,
                            sizes=Sizes(measure, part), shape=shape)
        if fitted.level is Level.GIVE_UP:
            return replace(fitted, history=original)
        return replace(fitted, changed=fitted.history != original)
    h, notes = _repaired(original)

    reason = _hopeless(h, decision, measure, settings)
    if reason is not None:
        return LadderResult(original, Level.GIVE_UP, 0, tuple(notes), give_up_reason=reason)

    if level is Level.AGGRESSIVE:
        factor = settings.aggressive_factor
        per_result = max(1, int(settings.per_result_max_chars * factor))
        h, budget_report = budget.enforce_budget(
            h, store=store, turn_budget_chars=max(1, int(settings.turn_budget_chars * factor)),
            per_result_max_chars=per_result, head_chars=settings.budget_head_chars,
            tail_chars=settings.budget_tail_chars)
        # The turn budget covers the current turn; older turns get the halved per-result
        # limit too (microcompact may not have reached them yet).
        h, capped = _cap_results(tuple(h), per_result, settings=settings, store=store)
        h, truncated = _truncate_assistants(h, settings.aggressive_assistant_max_chars)
        notes.append(f"budget at {factor:g}×: "
                     f"{pluralize(budget_report.replaced + capped, 'tool result')} previewed, "
                     f"{pluralize(truncated, 'assistant message')} truncated")
        k = _first_user_cut(h, 0)
    elif level is Level.EMERGENCY:
        k = _keep_last_cut(h, settings.emergency_keep_messages)
    else:
        k = _keep_last_cut(h, settings.nuclear_keep_messages)

    h, dropped, noticed = _cut(h, k)
    payload_added = False
    if decision.inject_payload_notice:
        h, payload_added = _with_payload_notice(h)
    if dropped:
        notes.append(f"{pluralize(dropped, 'message')} dropped")
    # ``changed`` False: resending would repeat the failed request byte for byte, so the
    # caller may go straight to the next decision.
    return LadderResult(h, level, dropped, tuple(notes), payload_notice_added=payload_added,
                        compaction_notice_added=noticed, changed=h != original)


def _hard_limit(decision: Decision, settings: Settings) -> int | None:
    """The size above which no resend can work. A rejected body size is exact; a limit
    derived from tokens is an estimate (content varies in bytes per token), so it gets
    the exact-fit margin as tolerance before the ladder gives up on it."""
    if decision.limit_bytes is None:
        return None
    if decision.payload_related:
        return decision.limit_bytes
    return math.floor(decision.limit_bytes * (1 + settings.exact_fit_margin))


def _sized(size: int, limit: int) -> tuple[str, str]:
    """``size`` and the ``limit`` it is over, in bytes where they would round alike
    ("8.5 KB, more than the 8.5 KB")."""
    shown, most = format_size(size), format_size(limit)
    return (shown, most) if shown != most else (f"{size:,} bytes", f"{limit:,} bytes")


def _size_over(decision: Decision, size: int, limit: int) -> str:
    """``size``, then what it is more than (:func:`_over`)."""
    return f"{_sized(size, limit)[0]}, {_over(decision, limit, size)}"


def _over(decision: Decision, limit: int, size: int | None = None) -> str:
    """What a request over ``limit`` is more than: for a payload limit, the size the
    proxy/gateway already rejected and where its limit looks to be (the learned cap the
    status line gave) — never the rejected size called what the path "can carry"."""
    rejected, estimate = decision.rejected_bytes, decision.cap_bytes
    if not decision.payload_related or rejected is None:
        most = format_size(limit) if size is None else _sized(size, limit)[1]
        return f"more than the {most} this request can carry"
    looks = (f" (its limit looks to be about {format_size(estimate)})"
             if estimate is not None and estimate < rejected else "")
    return (f"no smaller than the {format_size(rejected)} request the proxy/gateway "
            f"already rejected{looks}")


def _hopeless(h: History, decision: Decision, measure: Callable[[History], int],
              settings: Settings, *, systems: History | None = None) -> str | None:
    """A sentence when no cut can fit: the system prompt (or it plus the request) is too big.

    ``systems``: ``h``'s system messages, when the caller has them already."""
    limit = _hard_limit(decision, settings)
    if limit is None:
        return None
    if systems is None:
        system = Role.SYSTEM
        systems = tuple([m for m in h if m.role is system])
    hint = "raise the proxy/gateway limit (CHATCLI_MAX_PAYLOAD)" if decision.payload_related \
        else "use a model with a larger context window"
    latest = latest_user_index(h)
    with_latest = None if latest is None else measure((*systems, h[latest]))
    # A body only grows with a message more: when the request fits, the system prompt
    # alone does too (one measure where there would be two).
    if systems and (with_latest is None or with_latest > limit):
        size = measure(systems)
        if size > limit:
            return (f"The system prompt alone is {_size_over(decision, size, limit)}; "
                    f"shorten the system prompt or {hint}.")
    if with_latest is not None:
        size = with_latest
        if size > limit:
            shown, over = _sized(size, limit)[0], _over(decision, limit, size)
            return (f"Your latest message makes the request {shown} even with "
                    f"all earlier history removed, {over}; send a shorter message (large "
                    "content can be read by a tool in ranges).")
    return None


def _exact_fit(decision: Decision, h: History, notes: list[str], *, settings: Settings,
               store: ResultStore, sizes: Sizes, shape: Outline | None = None) -> LadderResult:
    """Drop the fewest oldest units so that the history fits the target (``drop_fit``),
    then preview kept tool results if dropping is not enough (``shrink_results``).

    Results are persisted only for previews in the history returned (``DeferredStore``;
    a caller that passes one commits it itself)."""
    target = decision.target_bytes
    if target is None:
        raise ValueError("an EXACT_FIT decision needs target_bytes")
    # Made when a result is previewed: a fit that only drops writes nothing.
    deferred = store if isinstance(store, DeferredStore) else None
    fit = drop_fit(h, target, sizes, payload_notice=decision.inject_payload_notice,
                   shape=shape)
    notes.extend(_repair_notes(fit.repair))
    if fit.dropped:
        notes.append(f"{pluralize(fit.dropped, 'message')} dropped to fit {format_size(target)}")
    out, size = fit.history, fit.size
    if size > target:
        if deferred is None:
            deferred = DeferredStore(store)
        out, shrunk, size = shrink_results(out, target, sizes, settings=settings,
                                           store=deferred, size=size)
        if shrunk:
            notes.append(f"{pluralize(shrunk, 'tool result')} previewed to fit")
        if size > target:
            notes.append(f"still {format_size(size)} after the cut (target "
                         f"{format_size(target)})")
        limit = _hard_limit(decision, settings)
        if decision.payload_related and limit is not None and size > limit:
            # Nothing older is left to drop and the results are previews: the blind
            # levels cannot do better, so fail now with a sentence, not after 3 resends.
            return LadderResult(
                h, Level.GIVE_UP, 0, tuple(notes),
                give_up_reason=(f"Even with all earlier history removed and tool results "
                                f"shortened, the request is {_size_over(decision, size, limit)}"
                                "; send a shorter message or raise "
                                "the proxy/gateway limit (CHATCLI_MAX_PAYLOAD)."))
    if deferred is not None and deferred is not store:
        deferred.commit(out)
    return LadderResult(out, Level.EXACT_FIT, fit.dropped, tuple(notes),
                        payload_notice_added=fit.payload_added,
                        compaction_notice_added=fit.notice_added)


def preflight_fit(history: History, *, target_bytes: int, limit_bytes: int | None,
                  payload_related: bool, settings: Settings, store: ResultStore,
                  measure: Callable[[History], int],
                  part: Callable[[Message], int] | None = None) -> LadderResult:
    """Fit a history that pre-flight measured over a known limit, *before* it is sent.

    Sending it would only buy a rejection (ANCHORS: no blind retries). Tool results are
    shrunk first, biggest first — each becomes a budget preview naming its persisted file,
    so nothing is lost (the model can read ranges back) — and only when previews are not
    enough are the oldest units dropped, exactly as :data:`Level.EXACT_FIT` drops them.
    ``limit_bytes``: the size no request can exceed (a payload limit is exact: above it
    after every cut the result is GIVE_UP with a sentence). Same guarantees as :func:`apply`.

    One pass: each message is sized once (``part``, see :func:`apply`), the body size is
    kept up to date as results become previews, and only the previews still in the
    returned history have their full result written (no fsync, see ``ResultStore``).
    """
    original = tuple(history)
    h, notes = _repaired(original)
    decision = Decision(Level.EXACT_FIT, 0, LadderState(), target_bytes=target_bytes,
                        limit_bytes=limit_bytes, payload_related=payload_related)
    reason = _hopeless(h, decision, measure, settings)
    if reason is not None:
        return LadderResult(original, Level.GIVE_UP, 0, tuple(notes), give_up_reason=reason)
    sizes = Sizes(measure, part)
    deferred = DeferredStore(store)
    h, shrunk, size = shrink_results(h, target_bytes, sizes, settings=settings, store=deferred)
    if shrunk:
        notes.append(f"{pluralize(shrunk, 'tool result')} previewed to fit "
                     f"{format_size(target_bytes)}")
    if size <= target_bytes:
        deferred.commit(h)
        return LadderResult(h, Level.EXACT_FIT, 0, tuple(notes), changed=h != original)
    fitted = _exact_fit(decision, h, notes, settings=settings, store=deferred, sizes=sizes)
    if fitted.level is Level.GIVE_UP:
        return replace(fitted, history=original)
    deferred.commit(fitted.history)
    return replace(fitted, changed=fitted.history != original)
