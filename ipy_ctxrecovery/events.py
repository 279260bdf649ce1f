"""Typed events: what the session and the core report as a turn goes on.

Every event is a frozen dataclass with a ``message``: the one line the plain-text printer
shows (the SPEC's wording). The panel reads the other fields. The core emits events
through a callback it is given; it never calls a UI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BudgetApplied",
    "CapChanged",
    "CompactionPhase",
    "Escalation",
    "Event",
    "EventCallback",
    "Failed",
    "LadderStep",
    "MicrocompactApplied",
    "NoticeInjected",
    "Preflight",
    "Recovered",
    "Retrying",
    "ToolRun",
    "Truncated",
    "TurnFinished",
    "WindowLearned",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Preflight(Event):
    body_bytes: int
    est_tokens: int
    cap: int | None
    window: int
    action: Literal["ok", "compact", "warn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MicrocompactApplied(Event):
    truncated: int
    summarized: int
    bytes_freed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetApplied(Event):
    replaced: int
    persisted: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionPhase(Event):
    phase: Literal["start", "trim", "summarize", "applied", "rejected", "cancelled"]
    before_messages: int
    after_messages: int | None = None
    before_bytes: int = 0
    after_bytes: int | None = None
    target_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LadderStep(Event):
    level: str
    attempt: int
    failure_kind: str
    before_messages: int
    after_messages: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeInjected(Event):
    notice: Literal["payload", "compaction"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapChanged(Event):
    cap: int | None
    source: Literal["configured", "assumed", "learned"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Escalation(Event):
    attempt: int
    max_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncated(Event):
    """The answer was still cut by max_tokens when the escalations ran out (it is kept as is)."""

    max_tokens: int
    escalations: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowLearned(Event):
    """A context overflow reported a window below the session's: used from now on."""

    window: int
    previous: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrying(Event):
    attempt: int
    wait: float
    failure_kind: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRun(Event):
    name: str
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered(Event):
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed(Event):
    failure_kind: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished(Event):
    history_bytes: int
    est_tokens: int
    window: int
    cap: int | None


EventCallback = Callable[[Event], None]
