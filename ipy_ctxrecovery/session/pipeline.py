"""Preparer: everything a request goes through before it is sent, one step per method.

    microcompact → tool-result budget → pre-flight (exact body bytes; max_tokens fitted to
    the window) → compaction when over budget → fit to the known limits

:meth:`Preparer.prepare` maps a history to the history it would send and returns every
step it took as events (:class:`Prepared`); it sends nothing itself — the compactor it is
given may ask the model for a summary, and a dry run gives it a summarizer that does not.
A body that pre-flight already knows is too big is fitted here, never sent blind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import budget, ladder, microcompact, preflight
from ..budget import ResultStore
from ..config import Settings, format_size
from ..errors import ChatError
from ..events import (
    BudgetApplied,
    Event,
    FitBeforeSend,
    MaxTokensLowered,
    MicrocompactApplied,
    NoticeInjected,
)
from ..failures import Failure, FailureKind
from ..history import History
from .compaction import SessionCompactor
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, Shrink, TurnLog

__all__ = ["Prepared", "Preparer"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :meth:`Preparer.prepare` would send, and the steps that made it."""

    history: History
    spec: RequestSpec
    body_bytes: int
    steps: tuple[Event, ...]


class Preparer:
    """Runs the preparation steps on a history (see the module docstring)."""

    def __init__(self, sizer: RequestSizer, compactor: SessionCompactor, store: ResultStore,
                 bus: EventBus, settings: Settings) -> None:
        self.sizer = sizer
        self.compactor = compactor
        self.store = store
        self.bus = bus
        self.settings = settings

    def _emit(self, event: Event, log: TurnLog) -> None:
        self.bus.emit(event, log)

    def prepare(self, history: History, spec: RequestSpec, log: TurnLog) -> Prepared:
        start = len(log.events)
        history = self.microcompact(history, log)
        history = self.budget(history, log)
        history, spec, body = self.preflight(history, spec, log)
        return Prepared(history, spec, body, tuple(log.events[start:]))

    # -- the steps ---------------------------------------------------------------------------
    def microcompact(self, history: History, log: TurnLog) -> History:
        compacted, report = microcompact.microcompact(history, settings=self.settings,
                                                      store=self.store)
        if not (report.truncated or report.summarized):
            return history
        self._emit(MicrocompactApplied(truncated=report.truncated, summarized=report.summarized,
                                       bytes_freed=report.bytes_freed), log)
        return compacted

    def budget(self, history: History, log: TurnLog) -> History:
        s = self.settings
        budgeted, report = budget.enforce_budget(
            history, store=self.store, turn_budget_chars=s.turn_budget_chars,
            per_result_max_chars=s.per_result_max_chars, head_chars=s.budget_head_chars,
            tail_chars=s.budget_tail_chars)
        if not report.replaced:
            return history
        self._emit(BudgetApplied(replaced=report.replaced,
                                 persisted=tuple(str(p) for p in report.persisted)), log)
        return budgeted

    def preflight(self, history: History, spec: RequestSpec,
                  log: TurnLog) -> tuple[History, RequestSpec, int]:
        """Measure the exact body, fit max_tokens, check it (SPEC §2), compact when over."""
        sizer, limits = self.sizer, self.sizer.limits
        requested = spec
        _, encoded = sizer.encode(sizer.request(history, spec))  # the one exact encoding
        body = len(encoded)
        default = sizer.default_max_tokens(spec) if spec.max_tokens is None else None
        spec = self.fit_max_tokens(body, default, spec, log)
        reserve = spec.max_tokens if spec.max_tokens is not None else default
        pf = preflight.check(body, settings=self.settings, caps=limits.caps,
                             estimator=limits.tokens, window_tokens=sizer.window,
                             max_tokens=reserve, warned=limits.warned_no_cap,
                             window_known=sizer.window_known)
        if pf.warned:
            limits.warned_no_cap = True
        self._emit(pf.event(), log)
        trigger = sizer.compaction_trigger(pf.budget_ratio)
        if pf.action != "compact" and body <= trigger:
            return history, spec, body
        target = self.sizer.compaction_target(pf.budget_ratio)
        compacted, report = self.compactor.run(history, target, spec, log)
        if report.applied:
            log.shrinks.append(Shrink("compaction", history, len(compacted)))
            body = sizer.measure(compacted, spec)
        fitted = self.fit_known_limits(compacted, body, reserve, spec, target, log)
        if fitted is not compacted:
            # Room was made for the answer: the max_tokens lowered for the body before the
            # cut may be larger again (never above what was asked for).
            body = sizer.measure(fitted, requested)
            spec = self.fit_max_tokens(body, default, requested, log)
        return fitted, spec, body

    def fit_max_tokens(self, body: int, default: int | None, spec: RequestSpec,
                       log: TurnLog) -> RequestSpec:
        """Lower max_tokens before sending when prompt + answer cannot fit the window.

        Without an explicit max_tokens the provider may still send one (``default``), so a
        default that cannot fit is caught here instead of costing a rejection every turn.
        """
        sizer = self.sizer
        asked = spec.max_tokens
        requested = asked if asked is not None else default
        if requested is None:
            return spec
        est, window = sizer.estimate(body), sizer.window
        limit = sizer.limits.output_limit
        if limit is not None and requested > limit:
            # The provider rejected a larger max_tokens earlier in this session.
            self._emit(MaxTokensLowered(requested=requested, sent=limit, reason="output_limit",
                                        est_tokens=est, window=window), log)
            requested = limit
            spec = spec.with_max_tokens(limit)
            asked = limit
        room = window - est
        if not sizer.window_known or est + requested <= window or room < 1:
            return spec
        fitted = room - math.ceil(room * self.settings.exact_fit_margin)
        if fitted < 1 or fitted >= requested:
            return spec
        if asked is not None:
            self._emit(MaxTokensLowered(requested=requested, sent=fitted, reason="window",
                                        est_tokens=est, window=window), log)
        # (the provider's own default adjusted: no news for the user)
        return spec.with_max_tokens(fitted)

    def fit_known_limits(self, history: History, body: int, reserve: int | None,
                         spec: RequestSpec, target: int, log: TurnLog) -> History:
        """Never send blind what pre-flight already knows is too big (ANCHORS: no blind retry).

        After compaction the body can still be over a known limit — the current turn's own
        tool results are in the kept tail, or the summary could not shrink enough. Such a
        body would only be rejected, so the ladder's fit runs now, aimed at the compaction
        target: tool results become previews of their persisted files first, then the
        oldest units go. A body at or over the smallest size ever rejected is never sent.
        """
        sizer, caps = self.sizer, self.sizer.limits.caps
        reserved = reserve or 0
        window = sizer.window
        cap = caps.effective()
        rejected = caps.smallest_rejected
        est = sizer.estimate(body)
        over_cap = cap is not None and body > cap
        over_window = sizer.window_known and est + reserved > window
        if not (over_cap or over_window):
            return history
        margin = self.settings.exact_fit_margin
        tokens = sizer.limits.tokens
        window_limit = tokens.bytes_for(window - reserved) \
            if sizer.window_known and window > reserved else None
        goals = [target]
        if cap is not None:
            goals.append(math.floor(cap * (1 - margin)))
        if window_limit:
            goals.append(math.floor(window_limit * (1 - margin)))
        goal = max(1, min(goals))
        # The hard limit: a payload size proven to fail, else the window's (an estimate,
        # given the exact-fit margin by the ladder).
        payload_limit = rejected - 1 if rejected is not None else None
        limit: int | None
        if payload_limit is not None and (window_limit is None or payload_limit <= window_limit):
            limit, payload = payload_limit, True
        else:
            limit, payload = window_limit, False
        result = ladder.preflight_fit(
            history, target_bytes=goal, limit_bytes=limit, payload_related=payload,
            settings=self.settings, store=self.store, measure=sizer.measurer(spec))
        if result.level is ladder.Level.GIVE_UP:
            if rejected is not None and body >= rejected:
                reason = result.give_up_reason or (
                    f"The request is {format_size(body)}, at least the {format_size(rejected)} the "
                    "proxy/gateway already rejected.")
                raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                        request_bytes=body), reason)
            return history      # not proven too big: the provider's answer will tell
        if not result.changed:
            return history
        self._emit(FitBeforeSend(body_bytes=body, goal_bytes=goal,
                                 over="cap" if over_cap else "window", cap=cap,
                                 cap_source=caps.source, est_tokens=est,
                                 reserved_tokens=reserved, window=window,
                                 notes=tuple(result.notes)), log)
        if result.compaction_notice_added:
            self._emit(NoticeInjected(notice="compaction"), log)
        log.shrinks.append(Shrink("fit", history, len(result.history)))
        return result.history
