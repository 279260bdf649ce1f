"""Tool-call pairing repair: positional per assistant message; a pure function.

Some providers reuse tool-call ids across turns (``call_0`` in every turn), so a result is
matched to the **nearest preceding assistant message that issued its id**, never to the
first message anywhere with that id. Then:

- a result with no such call, or a second result for an already answered call, is an
  orphan and is removed;
- a result that drifted away from its call (a user or system message got in between) is
  moved back into the block of results right after its assistant message;
- every call still unanswered gets a synthetic error result (:data:`MISSING_RESULT`,
  ``is_error=True``, tag ``TAG_SYNTHETIC_RESULT``).

Only ``tool`` messages are removed, added or moved: every other message keeps its relative
order, so system messages stay where they were. Whether the first non-system message is
``user`` is the ladder's business, not this module's. A history with nothing to repair is
returned as the very same tuple.
"""

from __future__ import annotations

from dataclasses import dataclass

from .history import TAG_SYNTHETIC_RESULT, History, Message, Role

__all__ = ["MISSING_RESULT", "PairingReport", "repair_pairing"]

MISSING_RESULT = (
    "[Tool result missing — the tool execution was interrupted or failed silently. "
    "Do NOT retry this tool call. Analyze what went wrong and try a different approach.]"
)


@dataclass(frozen=True, slots=True)
class PairingReport:
    orphans_removed: int = 0
    synthetic_added: int = 0
    moved: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.orphans_removed or self.synthetic_added or self.moved)

    @property
    def message(self) -> str:
        """One line for the user, e.g. ``🔧 tool pairing: 1 orphan removed, 2 results added``."""
        if not self.changed:
            return "🔧 tool pairing: nothing to repair"
        parts = []
        if self.orphans_removed:
            parts.append(_count(self.orphans_removed, "orphan result") + " removed")
        if self.synthetic_added:
            parts.append(_count(self.synthetic_added, "missing result") + " filled in")
        if self.moved:
            parts.append(_count(self.moved, "drifted result") + " moved back")
        return "🔧 tool pairing: " + ", ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def repair_pairing(history: History) -> tuple[History, PairingReport]:
    """Return a history where ``history.problems()`` reports no pairing problem."""
    n = len(history)
    # For each assistant message with calls: which tool message (index) answers each slot.
    answers: dict[int, list[int | None]] = {
        i: [None] * len(m.tool_calls)
        for i, m in enumerate(history)
        if m.role is Role.ASSISTANT and m.tool_calls
    }
    # Latest assistant index (so far) that issued each id; updated while scanning forward.
    issuer: dict[str, int] = {}
    orphans = 0
    for i, m in enumerate(history):
        if m.role is Role.ASSISTANT:
            for call in m.tool_calls:
                issuer[call.id] = i
            continue
        if m.role is not Role.TOOL:
            continue
        result = m.tool_result
        owner = issuer.get(result.call_id) if result is not None else None
        if result is None or owner is None:
            orphans += 1
            continue
        calls = history[owner].tool_calls
        slots = answers[owner]
        slot = next((k for k, c in enumerate(calls)
                     if c.id == result.call_id and slots[k] is None), None)
        if slot is None:                      # a duplicate answer to an answered call
            orphans += 1
            continue
        slots[slot] = i

    moved = 0
    synthetic = 0
    for owner, slots in answers.items():
        block_end = owner + 1
        while block_end < n and history[block_end].role is Role.TOOL:
            block_end += 1
        moved += sum(1 for j in slots if j is not None and j >= block_end)
        synthetic += sum(1 for j in slots if j is None)

    if not (orphans or moved or synthetic):
        return history, PairingReport()

    out: list[Message] = []
    for i, m in enumerate(history):
        if m.role is Role.TOOL:
            continue                          # re-emitted after their assistant message
        out.append(m)
        if i not in answers:
            continue
        slots = answers[i]
        # Keep the results' original order (a valid parallel answer may be out of call
        # order), then fill the unanswered calls in call order.
        out.extend(history[j] for j in sorted(j for j in slots if j is not None))
        for k, call in enumerate(m.tool_calls):
            if slots[k] is None:
                out.append(Message.tool(call.id, MISSING_RESULT, is_error=True,
                                        name=call.name, tag=TAG_SYNTHETIC_RESULT))
    return tuple(out), PairingReport(orphans_removed=orphans, synthetic_added=synthetic,
                                     moved=moved)
