"""Pre-flight (SPEC §2): measure the request before it leaves; caps and the token estimate.

``Caps`` and ``TokenEstimator`` are small mutable objects owned by one session.
STUB — contract for the implementer; keep these signatures (or update every caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import Settings

__all__ = ["Caps", "PreflightResult", "TokenEstimator", "check"]


@dataclass
class Caps:
    """The payload cap of one session: configured, learned between ok/rejected, or assumed."""

    configured: int | None = None
    assumed: int | None = None
    largest_ok: int = 0
    smallest_rejected: int | None = None

    def effective(self) -> int | None:
        raise NotImplementedError

    @property
    def source(self) -> Literal["configured", "learned", "assumed"] | None:
        raise NotImplementedError

    def record_success(self, body_bytes: int) -> None:
        raise NotImplementedError

    def record_rejection(self, body_bytes: int | None) -> int | None:
        """Remember a rejected size; return the newly learned cap (or None)."""
        raise NotImplementedError


@dataclass
class TokenEstimator:
    """Body bytes -> tokens; starts from a heuristic, calibrated by reported ``usage``."""

    bytes_per_token: float = 4.0
    samples: int = 0

    def estimate(self, body_bytes: int) -> int:
        raise NotImplementedError

    def bytes_for(self, tokens: int) -> int:
        raise NotImplementedError

    def calibrate(self, body_bytes: int, prompt_tokens: int) -> None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class PreflightResult:
    body_bytes: int
    est_tokens: int
    cap: int | None
    window: int
    action: Literal["ok", "compact", "warn"]
    budget_ratio: float | None = None     # 0.40 after a cap hit
    message: str | None = None            # the SPEC's ℹ line, when there is one


def check(body_bytes: int, *, settings: Settings, caps: Caps, estimator: TokenEstimator,
          window_tokens: int, max_tokens: int | None, warned: bool) -> PreflightResult:
    """The 85%/0.40 rule against the cap, the one-shot 2.5 MB warning, the window check."""
    raise NotImplementedError
