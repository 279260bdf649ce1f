"""How long a transient retry waits, and the sentence when the wait asked for is too long.

Pure functions (no clock read, no sleep), like anthropic's ``_calculate_retry_timeout``:
the session's send loop asks :func:`retry_wait` and does the sleeping itself.

- A server's ``Retry-After`` is honoured when it is a finite number of seconds no longer
  than ``max_wait`` (the ``max_retry_wait`` setting) and than what is left of the turn's
  deadline; NaN or a negative value is ignored (exponential backoff instead).
- A server asking for longer — a day, or ``inf`` — is not waited for: the decision is to
  give up, and :func:`too_long_sentence` says when to try again.
- Without ``Retry-After``: exponential backoff from ``base`` doubling per attempt, at most
  ``ceiling`` and ``max_wait`` (and never past the deadline: then give up too).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from humanfriendly import format_timespan

__all__ = ["RetryWait", "retry_wait", "too_long_sentence"]

BACKOFF_BASE_SECONDS = 1.0
"""First transient-retry wait without Retry-After; doubled each retry."""
BACKOFF_CEILING_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class RetryWait:
    """Wait ``seconds`` and retry, or (``seconds`` None) give up: the wait needed is
    ``needed`` seconds (``inf`` for "indefinitely"), over ``limit`` (``max_retry_wait`` or
    the turn's remaining time, named by ``bound``)."""

    seconds: float | None
    needed: float = 0.0
    limit: float = 0.0
    bound: str = "max_retry_wait"

    @property
    def give_up(self) -> bool:
        return self.seconds is None


def retry_wait(attempt: int, retry_after: float | None, *, max_wait: float,
               remaining: float | None = None, base: float = BACKOFF_BASE_SECONDS,
               ceiling: float = BACKOFF_CEILING_SECONDS) -> RetryWait:
    """The wait before transient retry ``attempt`` (1 for the first retry).

    ``retry_after``: what the server asked for, in seconds (None: it did not say).
    ``remaining``: seconds left before the turn's deadline (None: no deadline).
    """
    asked = retry_after is not None and not math.isnan(retry_after) and retry_after >= 0
    if asked:
        assert retry_after is not None
        wait = retry_after
        if wait > max_wait:
            return RetryWait(None, wait, max_wait, "max_retry_wait")
    else:
        wait = min(ceiling, max_wait, base * 2 ** max(0, min(attempt - 1, 60)))
    if remaining is not None and wait > remaining:
        return RetryWait(None, wait, max(0.0, remaining), "turn_timeout")
    return RetryWait(wait)


def too_long_sentence(decision: RetryWait, what: str, *, now: float) -> str:
    """One sentence for a wait not taken: what was asked, the bound, when to retry.

    ``what`` names the failure (``rate limited (HTTP 429)``); ``now`` is the clock
    (seconds since the epoch) the retry time is counted from.
    """
    needed = decision.needed
    if math.isinf(needed):
        asked = "to wait indefinitely"
        when = "try again later"
    else:
        asked = f"to wait {format_timespan(needed, max_units=2)}"
        at = time.localtime(now + needed)
        day = "" if time.localtime(now)[:3] == at[:3] else time.strftime(" on %Y-%m-%d", at)
        when = f"try again after {time.strftime('%H:%M', at)}{day}"
    limit = format_timespan(decision.limit, max_units=2)
    if decision.bound == "turn_timeout":
        bound = f"more than the {limit} left of this turn (turn_timeout)"
    else:
        bound = f"longer than max_retry_wait ({limit})"
    return (f"The server answered {what} and asked {asked} before retrying, {bound}; "
            f"{when}, or raise {decision.bound} with %chat config.")
