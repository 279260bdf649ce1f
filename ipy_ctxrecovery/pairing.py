"""Tool-call pairing repair: positional per assistant message; a pure function.

STUB — contract for the implementer; keep these signatures (or update every caller).
"""

from __future__ import annotations

from dataclasses import dataclass

from .history import History

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


def repair_pairing(history: History) -> tuple[History, PairingReport]:
    """Return a history where ``history.problems()`` reports no pairing problem."""
    raise NotImplementedError
