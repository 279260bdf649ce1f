"""Fitting a history under a byte target in one pass: drop the oldest units, preview tool results.

Both steps work from per-message sizes computed once (:class:`Sizes`: the provider's
``message_size`` when it has one, so that the body is ``base + sum of parts``), never by
re-measuring the whole history per candidate:

- :func:`drop_fit` walks back from the end adding the sizes of the units it keeps, so it
  sizes only what it keeps (plus one unit), cuts there, repairs tool pairing in the
  kept part only, and checks the result with one exact ``measure`` — moving the cut one
  unit either way until the result is the largest that fits (what a binary search over
  every cut would find, the same cut as ``ladder.drop_oldest``). What it must know of
  the part it drops (system and tagged messages, whether pairing is whole there) comes
  from :func:`outline`, one loop over the history that builds no message;
- :func:`shrink_results` turns the biggest tool results into previews, biggest first,
  keeping the body size up to date from the size of each preview; the full results go
  to a :class:`~ipy_ctxrecovery.core.budget.DeferredStore`, so only previews that stay in the
  final history are written (none per preview that is then dropped, and no fsync).

The guarantees are ``ladder.apply``'s: pairing valid, every pinned message kept, the
first non-system message ``user``, the latest real user request kept.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import is_, is_not

from ..settings import Settings
from . import budget, pairing
from .history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_PINNED_RULES,
    TAG_SERVER_COMPACTION,
    TAG_SUMMARY,
    History,
    Message,
    Role,
    Text,
    ToolCall,
    ToolResult,
    latest_user_index,
)
from .prompts import PAYLOAD_NOTICE, compaction_notice, with_recall_hint

__all__ = ["DropFit", "Outline", "Sizes", "drop_fit", "first_defect", "outline", "shrink_results",
           "valid_pairs"]

MIN_PREVIEW_CHARS = 500
"""Never shrink a tool result below this: the preview must still name its file."""

PINNED_TAGS = frozenset({TAG_SUMMARY, TAG_PAYLOAD_NOTICE, TAG_PINNED_RULES,
                         TAG_SERVER_COMPACTION})  # the server's compaction: as a summary
DROPPED_META = "dropped_messages"

_SYSTEM, _USER, _ASSISTANT, _TOOL = Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL


class Sizes:
    """A history's body size: ``measure`` for exact totals, ``part`` for one message.

    ``part(m)`` is what ``m`` adds to the body: the provider's ``message_size`` (memoized
    there) or, without one, ``measure((m, m)) - measure((m,))``, cached for the life of
    this object only (one fit), keyed by identity with the message held, so the cache
    cannot outlive it.
    """

    def __init__(self, measure: Callable[[History], int],
                 part: Callable[[Message], int] | None = None) -> None:
        self.measure = measure
        self.part: Callable[[Message], int] = self._measured if part is None else part
        self._cache: dict[int, tuple[Message, int]] = {}

    def _measured(self, m: Message) -> int:
        hit = self._cache.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1]
        # Twice less once: the separator between two messages included.
        size = self.measure((m, m)) - self.measure((m,))
        self._cache[id(m)] = (m, size)
        return size


def first_defect(h: Sequence[Message]) -> int | None:
    """Where tool pairing first breaks in ``h`` (as ``history.problems`` sees it): a tool
    message standing anywhere but right after the assistant message it answers, or an
    assistant message whose calls the tool messages right after it do not answer exactly
    (its index); None when pairing is valid. Checked without building any message."""
    return outline(h).defect


@dataclass(frozen=True, slots=True)
class Outline:
    """What a fit needs to know of a whole history, found in one pass over it."""

    defect: int | None           # first_defect (None: pairing valid, or not looked for)
    systems: tuple[int, ...]     # indices of the system messages
    tagged: tuple[int, ...]      # indices of the messages with a tag


def outline(h: Sequence[Message], *, pairs: bool = True) -> Outline:
    """``h``'s :class:`Outline`; ``pairs=False``: pairing is known to be valid (not checked).

    One tight loop, as the history can be long and most of it is dropped: per message a
    role and a tag are read and compared, and blocks are read only for assistant and tool
    messages; once the defect is found (or without ``pairs``) the rest is two list scans.
    """
    tool, assistant, system, call, result = _TOOL, _ASSISTANT, _SYSTEM, ToolCall, ToolResult
    systems: list[int] = []
    tagged: list[int] = []
    at = 0
    defect = None
    if pairs:
        wanted: list[str] | None = None         # the call ids of the open assistant message
        got: list[str | None] = []              # the results answering them so far
        owner = 0
        for at, m in enumerate(h):  # noqa: B007 - ``at`` is where the rest scan resumes
            if m.tag is not None:
                tagged.append(at)
            role = m.role
            if role is tool:
                if wanted is None:
                    defect = at
                    break
                blocks = m.blocks
                b = blocks[0] if blocks else None
                got.append(b.call_id if type(b) is result else None)
                continue
            if wanted is not None:
                if got != wanted and sorted(got, key=str) != sorted(wanted):
                    defect = owner
                    break
                wanted = None
            if role is assistant:
                blocks = m.blocks
                if len(blocks) == 1:
                    if type(blocks[0]) is call:
                        wanted, got, owner = [blocks[0].id], [], at
                elif blocks:
                    ids = [b.id for b in blocks if type(b) is call]
                    if ids:
                        wanted, got, owner = ids, [], at
            elif role is system:
                systems.append(at)
        else:
            at = len(h)
            if wanted is not None and got != wanted and sorted(got, key=str) != sorted(wanted):
                defect = owner
        if defect is not None and tagged and tagged[-1] == at:
            # The loop stopped on the defect: what it had not recorded of message ``at``
            # is in the scans below (its tag was recorded, its role was not).
            tagged.pop()
    rest = h[at:] if at else h
    if rest:
        # What the pairing loop did not reach: two list comprehensions, then C loops.
        roles = [m.role for m in rest]
        systems.extend(compress(count(at), map(is_, roles, repeat(system))))
        tags = [m.tag for m in rest]
        if tags.count(None) != len(tags):
            tagged.extend(compress(count(at), map(is_not, tags, repeat(None))))
    return Outline(defect, tuple(systems), tuple(tagged))


def valid_pairs(h: Sequence[Message]) -> bool:
    """``history.problems(h)`` finds no pairing problem (see :func:`first_defect`)."""
    return first_defect(h) is None


def _first_user(h: Sequence[Message], latest: int | None) -> int:
    k = next((i for i, m in enumerate(h) if m.role is _USER and m.tag not in PINNED_TAGS),
             len(h))
    return k if latest is None else min(k, latest)


@dataclass(frozen=True, slots=True)
class DropFit:
    history: History
    dropped: int                 # messages dropped
    notice_added: bool           # a compaction notice was written
    payload_added: bool          # the payload notice was inserted
    size: int                    # measure(history)
    repair: pairing.PairingReport


class _Cutter:
    """Cuts of one history at unit starts, each built in O(kept + pinned)."""

    def __init__(self, h: History, payload_notice: bool, shape: Outline) -> None:
        self.h = h
        self.payload_notice = payload_notice
        special = sorted({*shape.systems, *shape.tagged})
        self.pinned = [i for i in special if h[i].role is _SYSTEM or h[i].tag in PINNED_TAGS]
        self.notices = [i for i in special if h[i].tag == TAG_COMPACTION_NOTICE]
        earlier = 0
        for i in self.notices:
            count = h[i].meta.get(DROPPED_META) if h[i].meta else None
            earlier += count if isinstance(count, int) else 0
        self.earlier = earlier
        # Pinned messages are never dropped, so a cut holds a payload notice iff ``h`` does.
        self.has_payload = any(h[i].tag == TAG_PAYLOAD_NOTICE for i in shape.tagged)
        self.latest = latest_user_index(h)
        self.first = _first_user(h, self.latest)
        self.last = len(h) if self.latest is None else self.latest

    def is_start(self, i: int) -> bool:
        m = self.h[i]
        return m.role is not _TOOL and m.role is not _SYSTEM and m.tag not in PINNED_TAGS

    def kept(self, i: int) -> bool:
        """Message ``i`` counts in the size of a cut that keeps it (a notice is rewritten)."""
        m = self.h[i]
        return m.role is not _SYSTEM and m.tag not in PINNED_TAGS \
            and m.tag != TAG_COMPACTION_NOTICE

    def dropped(self, k: int) -> int:
        return k - bisect_left(self.pinned, k) - bisect_left(self.notices, k)

    def build(self, k: int) -> tuple[History, int, bool, bool]:
        """(history, dropped, notice added, payload notice added) for a cut at ``k``."""
        h = self.h
        dropped = self.dropped(k)
        if dropped == 0:
            out: History = h
            noticed = False
        else:
            before = [h[i] for i in self.pinned[:bisect_left(self.pinned, k)]]
            tail = h[k:]
            if self.notices and self.notices[-1] >= k:
                tail = tuple(m for m in tail if m.tag != TAG_COMPACTION_NOTICE)
            summarized = any(m.tag == TAG_SUMMARY for m in before)
            total = dropped + self.earlier
            said = with_recall_hint(compaction_notice(total, summarized=summarized))
            notice = Message(Role.USER, (Text(said),),
                             TAG_COMPACTION_NOTICE, {DROPPED_META: total})
            out = (*before, notice, *tail)
            noticed = True
        added = False
        if self.payload_notice and not self.has_payload:
            at = latest_user_index(out)
            at = len(out) if at is None else at
            out = (*out[:at], Message.user(PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE), *out[at:])
            added = True
        return out, dropped, noticed, added


_SEAM_SLACK = 256
"""How far the sum of parts may overstate a cut's exact size (a message merged at the
seam, the notice's digits): a cut estimated further over the target is not measured."""


def drop_fit(h: History, target: int, sizes: Sizes, *, payload_notice: bool = False,
             valid: bool = False, shape: Outline | None = None) -> DropFit:
    """Drop the fewest oldest units so that ``h`` measures at most ``target`` (see the
    module docstring); the latest user request and what follows are always kept, so the
    result can still be over ``target`` — its ``size`` says so.

    ``valid``: ``h``'s pairing is known to be valid. Otherwise pairing is repaired in the
    kept part only — the same result as repairing all of ``h`` first whenever the dropped
    part is valid on its own, which is checked; when it is not, all of ``h`` is repaired
    first (so an orphan result is reported as removed, never as a dropped message).
    ``shape``: ``outline(h)`` when the caller has it already.
    """
    if shape is None:
        shape = outline(h, pairs=not valid)
    cut = _Cutter(h, payload_notice, shape)
    first, last = cut.first, cut.last
    part = sizes.part
    kept = cut.kept
    # The outline's pass found where pairing first breaks: before it every unit is whole,
    # so a cut before it needs no repair of the dropped part, and the kept part is
    # repaired from the broken unit on only.
    defect = None if valid else shape.defect

    def result(k: int) -> DropFit:
        out, dropped, noticed, added = cut.build(k)
        report = pairing.PairingReport()
        broken = first_defect(out) if defect is not None else None
        if broken is not None:
            # Everything before ``broken`` is whole: repairing from there on is repairing
            # all of it (a result there answering an answered call is an orphan either way).
            repaired, report = pairing.repair_pairing(out[broken:])
            out = (*out[:broken], *repaired)
        return DropFit(out, dropped, noticed, added, sizes.measure(out), report)

    def step(i: int, direction: int) -> int | None:
        """The next cut point from ``i`` in ``direction`` (within first..last), or None."""
        i += direction
        while first <= i < last:
            if cut.is_start(i):
                return i
            i += direction
        return last if i == last else None

    # Every cut keeps the pinned messages, a notice and everything from ``last`` on: the
    # size of the cut at ``last`` less that tail is what every cut starts from.
    acc = sum(part(h[i]) for i in range(last, len(h)) if kept(i))
    limit = target - (sizes.measure(cut.build(last)[0]) - acc)
    k = last
    if acc <= limit:
        # The walk back: ``kept`` and ``is_start`` inline, as it runs once per kept message.
        for i in range(last - 1, first - 1, -1):
            m = h[i]
            role = m.role
            if role is _SYSTEM:
                continue                          # pinned: neither sized nor a cut point
            tag = m.tag
            if tag is not None:
                if tag in PINNED_TAGS:
                    continue
                if tag == TAG_COMPACTION_NOTICE:  # a cut point that is never kept
                    if role is not _TOOL:
                        k = i
                    continue
            acc += part(m)
            if acc > limit:
                break
            if role is not _TOOL:
                k = i
    best = result(k)
    # The walk's sizes are exact but for the seam (a merged message, the notice's digits,
    # a repair): settle on the exact measure, one unit at a time.
    while best.size > target and k != last:
        nxt = step(k, 1)
        if nxt is None:
            break
        k, best = nxt, result(nxt)
    while best.size <= target:
        prev = step(k, -1)
        if prev is None:
            break
        estimate = best.size + sum(part(h[i]) for i in range(prev, k) if kept(i))
        if estimate > target + _SEAM_SLACK:
            break
        more = result(prev)
        if more.size > target:
            break
        k, best = prev, more
    if k != first and cut.dropped(first) == 0:
        # Every cut that drops carries a compaction notice that the whole history does not:
        # when the history fits without one, nothing goes — which the walk and the steps
        # above, counting the notice, cannot see. Its size is estimated from ``best`` (the
        # notice off, the units back on; pinned messages sit elsewhere, hence the slack per
        # pinned message) and measured only when that says it may fit.
        at = bisect_left(cut.pinned, k)
        notice = best.history[at] if best.notice_added and at < len(best.history) else None
        estimate = best.size
        if notice is not None and notice.tag == TAG_COMPACTION_NOTICE:
            estimate -= part(notice)
        bound = target + _SEAM_SLACK * (1 + at)
        i = k
        while estimate <= bound and i > first:
            i -= 1
            if kept(i):
                estimate += part(h[i])
        if estimate <= bound:
            whole = result(first)
            if whole.size <= target:
                k, best = first, whole
    if defect is not None and defect < k:
        repaired, report = pairing.repair_pairing(h)
        fit = drop_fit(tuple(repaired), target, sizes, payload_notice=payload_notice,
                       valid=True)
        return DropFit(fit.history, fit.dropped, fit.notice_added, fit.payload_added,
                       fit.size, report)
    return best


def _result_len(m: Message) -> int:
    b = m.blocks[0] if m.role is _TOOL and m.blocks else None
    return len(b.content) if type(b) is ToolResult else 0


def shrink_results(h: History, target: int, sizes: Sizes, *, settings: Settings,
                   store: budget.ResultStore, size: int | None = None,
                   ) -> tuple[History, int, int]:
    """Preview the biggest tool results (each down to what the excess asks, never below
    :data:`MIN_PREVIEW_CHARS`) until the body fits ``target``; returns (history, results
    previewed, exact size). The size is kept from part sizes and checked with
    ``measure`` at the end (another round when a part was off)."""
    out = list(h)
    total = sizes.measure(h) if size is None else size
    shrunk: set[int] = set()
    stuck: set[int] = set()
    for _ in range(3):
        if total <= target:
            break
        heap = [(-_result_len(m), i) for i, m in enumerate(out)
                if i not in stuck and _result_len(m) > MIN_PREVIEW_CHARS]
        heapq.heapify(heap)
        while heap and total > target:
            neg, i = heapq.heappop(heap)
            length = _result_len(out[i])
            if -neg != length:
                continue                               # stale entry
            limit = max(MIN_PREVIEW_CHARS, length - (total - target))
            new = budget.shrink_tool_message(out[i], limit, store=store,
                                             head=settings.budget_head_chars,
                                             tail=settings.budget_tail_chars)
            if new is None:
                stuck.add(i)
                continue
            total += sizes.part(new) - sizes.part(out[i])
            out[i] = new
            shrunk.add(i)
            if _result_len(new) > MIN_PREVIEW_CHARS:
                heapq.heappush(heap, (-_result_len(new), i))
        total = sizes.measure(tuple(out))
    return tuple(out), len(shrunk), total
