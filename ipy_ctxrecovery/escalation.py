"""Max-tokens escalation (SPEC §4): double up to the model's cap; continue; stitch.

STUB — contract for the implementer; keep these signatures (or update every caller).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CONTINUATION_PROMPT", "next_max_tokens", "stitch"]

CONTINUATION_PROMPT = (
    "Your response was cut off at the token limit.\n"
    "Resume DIRECTLY from where you stopped — do not repeat any content.\n"
    "Continue the implementation or explanation from the exact point of interruption."
)


def next_max_tokens(current: int, escalations_done: int, *, model_cap: int,
                    max_escalations: int) -> int | None:
    """Doubled ``max_tokens`` (≤ model_cap), or None when escalation must stop."""
    raise NotImplementedError


def stitch(parts: Sequence[str]) -> str:
    """Join partial answers into one, dropping any overlap a continuation repeated."""
    raise NotImplementedError
