"""Exact pre-flight: when to ask the provider to count a request's input tokens, and what
to conclude from its answer (pure; the session does the asking).

Pre-flight decides with an estimate (body bytes over a calibrated bytes/token). Far from
the window the estimate is good enough either way; near it, an estimate a few per cent off
sends a request the window rejects, or compacts (or lowers ``max_tokens`` for) one that
would have fitted. Where the provider can count (``providers.base.CountsTokens``:
Anthropic's ``count_tokens``, an OpenAI-compatible server's tokenize endpoint), the session
asks once for a request whose estimate is within ``exact_count_margin`` of the window
budget — the window less the answer's reservation — and decides on the count. Nothing
else is ever sent twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["CountPlan", "conclude", "plan_count"]

Why = Literal["near_window", "far_under", "far_over", "no_window", "compacts_anyway",
              "no_counter", "already_counted"]


@dataclass(frozen=True, slots=True)
class CountPlan:
    """Whether to ask for an exact count (``ask``) and why (``why``): ``near_window``
    (asked), ``far_under``/``far_over`` (the estimate decides alone), ``no_window`` (no
    window is enforced), ``compacts_anyway`` (the payload cap compacts it whatever the
    count), ``no_counter`` (the provider cannot count), ``already_counted`` (one count per
    send)."""

    ask: bool
    why: Why
    budget: int | None = None
    """The window budget the estimate was compared with (window − reservation)."""


def plan_count(est_tokens: int, *, window: int | None, reserve: int | None, margin: float,
               can_count: bool = True, compacts_anyway: bool = False,
               chat_budget: int | None = None, counted_already: bool = False) -> CountPlan:
    """Ask for an exact count when ``est_tokens`` is within ``margin`` × ``window`` of the
    window budget (``window`` − ``reserve``), on either side: just under (it may not fit
    after all) or just over (it may fit after all). ``margin`` 0 never asks.

    Not when the count could change nothing: ``compacts_anyway`` (the payload cap compacts
    the request whatever its tokens), or ``est_tokens`` clearly over ``chat_budget`` (the
    chat budget of the window, in tokens: the history is compacted there in any case).

    >>> plan_count(7_900, window=8_192, reserve=None, margin=0.10).ask
    True
    >>> plan_count(2_000, window=8_192, reserve=None, margin=0.10).why
    'far_under'
    """
    if counted_already:
        return CountPlan(False, "already_counted")
    if not can_count:
        return CountPlan(False, "no_counter")
    if window is None or window <= 0:
        return CountPlan(False, "no_window")
    budget = window - (reserve or 0)
    if compacts_anyway:
        return CountPlan(False, "compacts_anyway", budget)
    slack = math.ceil(margin * window) if margin > 0 else -1
    if chat_budget is not None and est_tokens > chat_budget + slack:
        return CountPlan(False, "compacts_anyway", budget)
    if est_tokens < budget - slack:
        return CountPlan(False, "far_under", budget)
    if est_tokens > budget + slack:
        return CountPlan(False, "far_over", budget)
    return CountPlan(True, "near_window", budget)


def conclude(counted: object) -> int | None:
    """The input tokens to decide on from a provider's count: a positive whole number is
    taken as it is; anything else (None — no counter, an error — zero, a bool, a
    float) is ignored, and the estimate decides."""
    if isinstance(counted, bool) or not isinstance(counted, int) or counted <= 0:
        return None
    return counted
