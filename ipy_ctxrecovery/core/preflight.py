"""Pre-flight (SPEC §2): measure the request before it leaves; caps and the token estimate.

``Caps`` and ``TokenEstimator`` are small mutable objects owned by one session; what a
network path showed (:class:`~.recovery.evidence.PathEvidence`) is shared only by the sessions on that path —
never module globals, never the environment (ANCHORS 4). :func:`check` is pure: it reads them
and says what to do with a request of ``body_bytes`` serialized bytes (ANCHORS 5: the
wire body, not a character count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..settings import Settings
from .compactor import ChatBudget
from .events import CapSource, Preflight
from .recovery.evidence import Caps
from .wording import describe

__all__ = [
    "CALIBRATION_RECENT_WEIGHT",
    "MAX_BYTES_PER_TOKEN",
    "MIN_BYTES_PER_TOKEN",
    "MIN_WINDOW_BUDGET_RATIO",
    "PreflightResult",
    "TokenEstimator",
    "check",
]

MIN_BYTES_PER_TOKEN = 1.0
MAX_BYTES_PER_TOKEN = 10.0
"""Sane range for a calibrated bytes/token ratio; a sample outside it is clamped."""

CALIBRATION_RECENT_WEIGHT = 0.3
"""Weight of the newest sample once several are known (an exponential moving average),
so the estimate follows a conversation whose content changes (code, prose, CJK)."""

MIN_WINDOW_BUDGET_RATIO = 0.1
"""A window hit never asks for a compaction budget below this share of the window (a
``max_tokens`` close to the window is the thing to lower then, not the history)."""


@dataclass
class TokenEstimator:
    """Body bytes -> tokens; starts from a heuristic, calibrated by reported ``usage``."""

    bytes_per_token: float = 4.0
    samples: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenEstimator:
        return cls(bytes_per_token=settings.chars_per_token)

    def estimate(self, body_bytes: int) -> int:
        """Tokens for ``body_bytes``, rounded up (an overflow is caught, not missed)."""
        if body_bytes <= 0:
            return 0
        return math.ceil(body_bytes / self.bytes_per_token)

    def bytes_for(self, tokens: int) -> int:
        """Bytes that ``tokens`` tokens are expected to take, rounded down."""
        return max(0, math.floor(tokens * self.bytes_per_token))

    def calibrate(self, body_bytes: int, prompt_tokens: int) -> None:
        """Fold in one (request body bytes, reported prompt tokens) sample."""
        if body_bytes <= 0 or prompt_tokens <= 0:
            return
        sample = min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, body_bytes / prompt_tokens))
        # The first sample replaces the heuristic outright; later ones are averaged with
        # more weight on recent requests (1/n until that drops below the recent weight).
        weight = max(1.0 / (self.samples + 1), CALIBRATION_RECENT_WEIGHT)
        self.bytes_per_token += weight * (sample - self.bytes_per_token)
        self.samples += 1


@dataclass(frozen=True, slots=True)
class PreflightResult:
    body_bytes: int
    est_tokens: int
    cap: int | None
    window: int
    action: Literal["ok", "compact", "warn"]
    budget_ratio: float | None = None     # 0.40 after a cap hit
    reasons: tuple[Literal["cap", "window", "budget", "no_cap"], ...] = ()
    cap_source: CapSource | None = None
    max_tokens: int | None = None
    warned: bool = False                  # the one-shot no-cap warning is given now
    budget: ChatBudget | None = None      # the chat budget the body is over ("budget")
    counted: bool = False                 # est_tokens is the provider's exact count

    def event(self) -> Preflight:
        budget = self.budget
        return Preflight(body_bytes=self.body_bytes, est_tokens=self.est_tokens, cap=self.cap,
                         cap_source=self.cap_source, window=self.window,
                         max_tokens=self.max_tokens, action=self.action, reasons=self.reasons,
                         budget_bytes=budget.bytes if budget is not None else None,
                         budget_of=budget.of if budget is not None else None,
                         budget_share=budget.share if budget is not None else None,
                         counted_tokens=self.est_tokens if self.counted else None)

    @property
    def message(self) -> str | None:
        """The SPEC's ℹ line(s), when there is something to say."""
        return describe(self.event()) or None


def check(body_bytes: int, *, settings: Settings, caps: Caps, estimator: TokenEstimator,
          window_tokens: int, max_tokens: int | None, warned: bool,
          window_known: bool = True, chat_budget: ChatBudget | None = None,
          counted: int | None = None) -> PreflightResult:
    """The 85%/0.40 rule against the cap, the one-shot 2.5 MB warning, the window check,
    and the chat budget (``chat_budget``: the compaction trigger; a body within the cap
    and the window but over it is compacted too, with its own reason).

    ``warned``: the session already showed the no-cap warning (it is shown once per
    session; the result's ``warned`` tells the session to remember it).
    Window hit: the estimated prompt plus ``max_tokens`` would not fit; the suggested
    ``budget_ratio`` leaves room for ``max_tokens``. ``window_known`` False: the window is
    only a guess (a model missing from the catalogue), so it is reported, not enforced.
    ``counted``: the provider's exact count of the input tokens (``core/exact_count.py``),
    decided on instead of the estimate.
    """
    cap = caps.effective()
    est = counted if counted is not None else estimator.estimate(body_bytes)
    reserve = max_tokens or 0
    reasons: list[Literal["cap", "window", "budget", "no_cap"]] = []
    ratio: float | None = None
    action: Literal["ok", "compact", "warn"] = "ok"

    if cap is not None and body_bytes > settings.preflight_cap_fraction * cap:
        reasons.append("cap")
        action, ratio = "compact", settings.preflight_budget_ratio

    if window_known and est + reserve > window_tokens:
        room = (window_tokens - reserve) / window_tokens if window_tokens > 0 else 0.0
        # Compaction must leave room for the answer.
        window_ratio = min(settings.chat_budget_ratio, max(room, MIN_WINDOW_BUDGET_RATIO))
        reasons.append("window")
        action = "compact"
        ratio = window_ratio if ratio is None else min(ratio, window_ratio)

    over_budget = (action == "ok" and chat_budget is not None and chat_budget.of is not None
                   and body_bytes > chat_budget.bytes)
    if over_budget:
        reasons.append("budget")
        action = "compact"

    give_warning = cap is None and body_bytes > settings.no_cap_warn_bytes and not warned
    if give_warning:
        reasons.append("no_cap")
        if action == "ok":
            action = "warn"

    return PreflightResult(body_bytes=body_bytes, est_tokens=est, cap=cap, window=window_tokens,
                           action=action, budget_ratio=ratio, reasons=tuple(reasons),
                           cap_source=caps.source, max_tokens=max_tokens, warned=give_warning,
                           budget=chat_budget if over_budget else None,
                           counted=counted is not None)
