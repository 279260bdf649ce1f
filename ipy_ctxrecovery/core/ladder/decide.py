"""The recovery ladder's decision (SPEC §3): :class:`Level`, :class:`LadderState`,
:class:`Decision` and :func:`decide`.

:func:`decide` chooses the next step for a failed send from policy (Settings), the turn's
:class:`LadderState` and the classified :class:`Failure`; it does no I/O, touches no
history and writes no prose (``wording.decision_lines`` renders a decision).
:mod:`.ladder` applies the chosen step.

Order of :func:`decide` for one turn (a fresh :class:`LadderState` per turn):

1. ``output_limit`` (max_tokens above the model's output cap): LOWER_MAX_TOKENS to the
   reported limit (once per turn).
2. Context overflow "A + B > C" where the input A fits: LOWER_MAX_TOKENS to C − A − a
   margin; history is not touched (once per turn; consumes no attempt).
3. EXACT_FIT, once per turn, when the failure carries numbers (``prompt_tokens`` and
   ``limit_tokens``) or, for payload failures, the rejected body size: cut just enough
   (ANCHORS 1). Exact fit takes the place of level 1, so it *is* attempt 1 — it counts
   against ``max_recovery_attempts`` only in the sense that, when its resend fails too,
   the next attempts are 2 (EMERGENCY) and 3 (NUCLEAR); when it succeeds the turn ends
   after one resend, as with any level.
4. Attempts 1..max_recovery_attempts: AGGRESSIVE, EMERGENCY, NUCLEAR (NUCLEAR repeats
   when more attempts are configured); beyond: GIVE_UP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from ...failures import Failure, FailureKind
from ...settings import Settings

__all__ = ["Decision", "LadderState", "Level", "decide"]


class Level(StrEnum):
    LOWER_MAX_TOKENS = "lower_max_tokens"   # input fits; input + max_tokens does not
    EXACT_FIT = "exact_fit"                 # provider gave numbers: cut just enough
    AGGRESSIVE = "aggressive_budget"        # level 1
    EMERGENCY = "emergency_truncate"        # level 2
    NUCLEAR = "nuclear_truncate"            # level 3
    GIVE_UP = "give_up"


_BLIND_LEVELS = (Level.AGGRESSIVE, Level.EMERGENCY, Level.NUCLEAR)


@dataclass(frozen=True, slots=True)
class LadderState:
    """Where a turn is on the ladder. Belongs to one send; starts fresh every turn."""

    attempt: int = 0
    exact_fit_tried: bool = False
    payload_notice_sent: bool = False
    max_tokens_lowered: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one failed request: a level and the numbers it needs (no prose;
    :func:`~.wording.decision_lines` renders it)."""

    level: Level
    attempt: int
    state: LadderState                    # the state after this decision
    failure: Failure | None = None        # the failure decided on
    inject_payload_notice: bool = False
    assume_cap: int | None = None         # set when no cap is configured: SPEC auto-cap
    max_tokens: int | None = None         # new max_tokens for LOWER_MAX_TOKENS
    requested_max_tokens: int | None = None  # the max_tokens the failed request carried
    target_bytes: int | None = None       # for EXACT_FIT
    limit_bytes: int | None = None        # largest size that can still work, when known
    rejected_bytes: int | None = None     # a payload failure's rejected body size
    cap_bytes: int | None = None          # a payload failure: where the path's limit looks to be
    payload_related: bool = False         # the failure was a payload one (413/WAF/EOF)
    reason: str = ""                      # GIVE_UP: one sentence for the user


# -- decide -----------------------------------------------------------------------------

def decide(settings: Settings, state: LadderState, failure: Failure, *, history_bytes: int,
           max_tokens: int | None, cap: int | None, cap_configured: bool,
           target_ceiling: int | None = None) -> Decision:
    """Choose the next step for a recoverable failure (exact fit first, then levels 1-3).

    ``history_bytes``: the size of the request that failed, as the ``measure`` given to
    :func:`apply` counts it. ``max_tokens``: the failed request's ``max_tokens``.
    ``cap``: the best payload cap known (configured, learned — e.g. just learned from this
    rejection — or assumed; None: none); a payload exact fit aims at it when it is below
    the rejected size, else at ``learned_cap_fraction`` × the rejected size.
    ``cap_configured``: the user configured one (CHATCLI_MAX_PAYLOAD); when not, the
    turn's first payload decision carries ``assume_cap`` and the SPEC's "Assuming" line.
    ``target_ceiling``: an exact fit never aims above it (the session passes its
    compaction target, so a history fitted after a failure does not sit above the
    compaction trigger and get summarized again on the very next turn).
    """
    requested = max_tokens if max_tokens is not None else failure.output_tokens
    if failure.kind is FailureKind.OUTPUT_LIMIT:
        return _lower_output_limit(state, failure, requested)
    if not failure.recoverable:
        return _give_up(state, failure, f"The request failed ({failure.label}), which "
                                        "compacting the history cannot fix.")

    lowered = _lower_for_room(settings, state, failure, requested)
    if lowered is not None:
        return lowered

    first_payload = failure.payload_related and not state.payload_notice_sent
    # SPEC auto-cap: offered on the turn's first payload failure whenever no cap is
    # configured; the session keeps it only while nothing better (a learned cap) is known.
    assume = settings.assumed_cap_bytes if first_payload and not cap_configured else None
    limit, target, rejected = _fit_numbers(settings, failure, history_bytes=history_bytes,
                                           max_tokens=requested, cap=cap)
    estimate = target if rejected is not None else None     # before any ceiling below
    if target is not None and target_ceiling is not None and 0 < target_ceiling < target:
        target = target_ceiling
    attempt = state.attempt + 1
    if attempt > settings.max_recovery_attempts:
        done = state.attempt
        return _give_up(state, failure,
                        f"The request still failed after {done} recovery "
                        f"attempt{'s' if done != 1 else ''} ({failure.label}); "
                        "shorten the conversation or the latest message and try again.")
    new_state = replace(state, attempt=attempt,
                        payload_notice_sent=state.payload_notice_sent or first_payload)
    exact = target is not None and not state.exact_fit_tried
    return Decision(
        Level.EXACT_FIT if exact else _BLIND_LEVELS[min(attempt, len(_BLIND_LEVELS)) - 1],
        attempt, replace(new_state, exact_fit_tried=True) if exact else new_state,
        failure=failure, inject_payload_notice=first_payload, assume_cap=assume,
        requested_max_tokens=requested, target_bytes=target if exact else None,
        limit_bytes=limit, rejected_bytes=rejected, cap_bytes=estimate,
        payload_related=failure.payload_related)


def _give_up(state: LadderState, failure: Failure, reason: str) -> Decision:
    return Decision(Level.GIVE_UP, state.attempt, state, failure=failure, reason=reason)


def _lower_output_limit(state: LadderState, failure: Failure,
                        requested: int | None) -> Decision:
    """max_tokens above the model's output cap: retry once with the reported cap."""
    new = failure.limit_tokens
    if new is None and requested is not None and requested > 1:
        new = requested // 2      # no number reported: halve once
    if state.max_tokens_lowered or new is None or new < 1 or (
            requested is not None and new >= requested):
        return _give_up(state, failure, f"The request failed ({failure.label}); lower "
                                        "max_tokens (--max-tokens) to the model's output "
                                        "limit and try again.")
    return Decision(Level.LOWER_MAX_TOKENS, state.attempt,
                    replace(state, max_tokens_lowered=True), failure=failure, max_tokens=new,
                    requested_max_tokens=requested)


def _lower_for_room(settings: Settings, state: LadderState, failure: Failure,
                    requested: int | None) -> Decision | None:
    """"A + B > C" with A < C: the input fits, the requested output does not."""
    prompt, limit = failure.prompt_tokens, failure.limit_tokens
    if (failure.kind is not FailureKind.CONTEXT_OVERFLOW or state.max_tokens_lowered
            or prompt is None or limit is None or requested is None or prompt >= limit
            or prompt + requested <= limit):
        return None
    room = limit - prompt
    new = room - math.ceil(room * settings.exact_fit_margin)
    if new < 1:
        return None
    return Decision(Level.LOWER_MAX_TOKENS, state.attempt,
                    replace(state, max_tokens_lowered=True), failure=failure, max_tokens=new,
                    requested_max_tokens=requested)


def _fit_numbers(settings: Settings, failure: Failure, *, history_bytes: int,
                 max_tokens: int | None, cap: int | None
                 ) -> tuple[int | None, int | None, int | None]:
    """(limit_bytes, exact-fit target_bytes, rejected_bytes) from what the failure reported."""
    if failure.payload_related:
        rejected = failure.request_bytes or history_bytes
        if rejected <= 0:
            return None, None, None
        if cap is not None and cap < rejected:
            target = cap
        else:
            target = math.floor(rejected * settings.learned_cap_fraction)
        return rejected - 1, target, rejected
    prompt, limit = failure.prompt_tokens, failure.limit_tokens
    if prompt is None or limit is None or prompt <= 0 or history_bytes <= 0:
        return None, None, None
    available = limit - (max_tokens or 0)
    if available <= 0:
        return None, None, None
    limit_bytes = math.floor(history_bytes * available / prompt)
    target = math.floor(limit_bytes * (1 - settings.exact_fit_margin))
    return limit_bytes, target, None
