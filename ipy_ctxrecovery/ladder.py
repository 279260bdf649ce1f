"""The recovery ladder (SPEC §3): decide the next step from policy, state and failure; apply it.

``decide`` is pure and does no I/O; ``apply`` is a pure history -> history step. The
session does the sending. STUB — contract for the implementer; keep these signatures
(or update every caller).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .budget import ResultStore
from .config import Settings
from .errors import Failure
from .history import History

__all__ = [
    "COMPACTION_NOTICE",
    "PAYLOAD_NOTICE",
    "Decision",
    "LadderResult",
    "LadderState",
    "Level",
    "apply",
    "decide",
]

PAYLOAD_NOTICE = (
    "[SYSTEM NOTICE — PAYLOAD LIMIT HIT] A proxy/gateway rejected the previous\n"
    "request due to body size. History was compacted to recover. Going forward:\n"
    "(1) When reading files, prefer targeted reads with line ranges\n"
    "(e.g. sed -n '100,200p' file, or read_file with offset+limit) instead\n"
    "of reading entire files.\n"
    "(2) Prefer grep/ripgrep with specific patterns over full-file reads.\n"
    "(3) If you previously read a large file, its full content is persisted at\n"
    "the path shown in the tool-result preview — re-read specific ranges\n"
    "from that file rather than repeating the original read.\n"
    "(4) Summarize findings incrementally rather than accumulating raw tool output."
)

COMPACTION_NOTICE = (
    "[Context was automatically compacted due to size limits. Previous conversation "
    "history has been summarized. Continue from where you left off.]"
)
"""The SPEC's wording — used only when the dropped messages really were summarized."""


class Level(StrEnum):
    LOWER_MAX_TOKENS = "lower_max_tokens"   # input fits; input + max_tokens does not
    EXACT_FIT = "exact_fit"                 # provider gave numbers: cut just enough
    AGGRESSIVE = "aggressive_budget"        # level 1
    EMERGENCY = "emergency_truncate"        # level 2
    NUCLEAR = "nuclear_truncate"            # level 3
    GIVE_UP = "give_up"


@dataclass(frozen=True, slots=True)
class LadderState:
    """Where a turn is on the ladder. Belongs to one send; starts fresh every turn."""

    attempt: int = 0
    exact_fit_tried: bool = False
    payload_notice_sent: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    level: Level
    attempt: int
    state: LadderState                    # the state after this decision
    inject_payload_notice: bool = False
    assume_cap: int | None = None         # set when no cap is configured: SPEC auto-cap
    max_tokens: int | None = None         # new max_tokens for LOWER_MAX_TOKENS
    target_bytes: int | None = None       # for EXACT_FIT
    message: str = ""                     # the user-facing line(s) of SPEC §3


@dataclass(frozen=True, slots=True)
class LadderResult:
    history: History
    level: Level
    removed_messages: int
    notes: tuple[str, ...] = ()


def decide(settings: Settings, state: LadderState, failure: Failure, *, history_bytes: int,
           max_tokens: int | None, cap: int | None, cap_configured: bool) -> Decision:
    """Choose the next step for a recoverable failure (exact fit first, then levels 1-3)."""
    raise NotImplementedError


def apply(decision: Decision, history: History, *, settings: Settings, store: ResultStore,
          measure: Callable[[History], int]) -> LadderResult:
    """Carry out ``decision`` on ``history`` (pure; persisted results go to ``store``)."""
    raise NotImplementedError
