"""History compactor (SPEC §7): trim → summarize → apply, with status phases and cancellation.

STUB — contract for the implementer; keep these signatures (or update every caller).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import Settings
from .events import EventCallback
from .history import History

__all__ = ["CompactionReport", "Summarizer", "compact", "compaction_budget", "trim"]

Summarizer = Callable[[str], str]
"""Given the bounded text of the messages to summarize (with instructions), return a summary."""

Measure = Callable[[History], int]
"""Size of a history in request-body bytes (the provider's exact encoding)."""


@dataclass(frozen=True, slots=True)
class CompactionReport:
    applied: bool
    before_messages: int
    after_messages: int
    before_bytes: int
    after_bytes: int
    summarized_messages: int = 0
    trimmed_blocks: int = 0
    rejected_reason: str | None = None


def compaction_budget(settings: Settings, *, window_tokens: int, bytes_per_token: float,
                      cap: int | None, ratio: float) -> int:
    """Trigger in bytes: ``min(window × ratio × bytes/token, cap_budget_fraction × cap)``."""
    raise NotImplementedError


def trim(history: History) -> tuple[History, int]:
    """Remove reasoning blocks and duplicate content without an LLM; returns blocks removed."""
    raise NotImplementedError


def compact(history: History, *, target_bytes: int, measure: Measure, summarize: Summarizer,
            settings: Settings, on_event: EventCallback | None = None,
            instructions: str | None = None) -> tuple[History, CompactionReport]:
    """Compact ``history`` to at most ``target_bytes``; on KeyboardInterrupt re-raise, untouched."""
    raise NotImplementedError
