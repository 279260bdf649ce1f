"""The recovery ladder (SPEC §3): :mod:`.decide` chooses a step for a failed request (pure,
no I/O), :mod:`.apply` carries it out on a history; one surface for both."""

from __future__ import annotations

from .apply import MIN_PREVIEW_CHARS, LadderResult, apply, drop_oldest, preflight_fit, truncate_text
from .decide import Decision, LadderState, Level, decide

__all__ = [
    "MIN_PREVIEW_CHARS",
    "Decision",
    "LadderResult",
    "LadderState",
    "Level",
    "apply",
    "decide",
    "drop_oldest",
    "preflight_fit",
    "truncate_text",
]
