"""Measuring and fitting one request before it is sent: the sizing half of RequestLoop.

:class:`RequestSizing` is the base of :class:`~ipy_ctxrecovery.recovery.RequestLoop` (and
so of :class:`~ipy_ctxrecovery.session.ChatSession`); it owns nothing of its own. It holds
what every step of a request needs to know about sizes: the window and output cap in
force, building / encoding / measuring a request body, lowering ``max_tokens`` to fit the
window, compaction (with the summarizer request bounded to fit the model and the cap) and
the pre-send fit that never sends blind a body pre-flight already knows is too big.
:class:`Turn` is the per-send bookkeeping both halves update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import budget, compactor, ladder, preflight
from .config import Settings, format_size
from .deadline import call_with_deadline
from .errors import ChatError, Failure, FailureKind
from .events import Event, NoticeInjected, Preflight
from .history import History, Message
from .providers.base import Provider, Request
from .tools import Tool

__all__ = ["RequestSizing", "Turn"]


@dataclass
class Turn:
    """Mutable bookkeeping of one send (never shared between turns)."""

    actions: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    compacted_from: tuple[History, int] | None = None
    """The history before this turn's last compaction, and the compacted length."""
    deadline: float | None = None
    """``time.monotonic()`` by which the turn must end (``turn_timeout``); None: no bound."""

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


class RequestSizing:
    """Window, output cap, body size, max_tokens fit and compaction for one request."""

    # Provided by ChatSession (read and updated by RequestLoop too).
    settings: Settings
    caps: preflight.Caps
    estimator: preflight.TokenEstimator
    model: str
    _provider: Provider
    _owns_provider: bool
    _client: Any
    _tools: dict[str, Tool]
    _store: budget.ResultStore
    _sleep: Callable[[float], None]
    _warned: bool
    _payload_notice_sent: bool
    _prompt_tokens: int
    _completion_tokens: int
    _compactions: int
    _recoveries: int
    _encoded: tuple[Request, bytes] | None
    _last_compaction: compactor.CompactionReport | None
    _output_limit: int | None
    """A max_tokens ceiling learned from an output-limit rejection (this session only)."""
    _learned_window: int | None
    """A context window a context-overflow error reported below ours (this session only)."""

    @property
    def window(self) -> int:
        """The window in tokens: configured or the model's, or a smaller one learned."""
        base = self.settings.context_window or self._provider.info.context_window
        learned = self._learned_window
        return min(base, learned) if learned else base

    @property
    def output_cap(self) -> int:
        """The most max_tokens may be: the model's output limit, or a lower learned one."""
        cap = self._provider.info.max_output_tokens
        return min(cap, self._output_limit) if self._output_limit else cap

    def _emit(self, event: Event, turn: Turn | None = None) -> None:
        raise NotImplementedError

    # -- measuring ------------------------------------------------------------------------
    def _request(self, history: History, max_tokens: int | None, *, stream: bool = False,
                 options: Mapping[str, Any] | None = None) -> Request:
        return Request(messages=history, max_tokens=max_tokens,
                       tools=tuple(t.spec for t in self._tools.values()),
                       options=dict(options or {}), stream=stream)

    def _encode(self, request: Request) -> tuple[Request, bytes]:
        """The request and its body, encoded once.

        An equal request built again returns the first object: the provider keeps the
        encoding of the object it last encoded, so sending that object does not encode
        the body a second time.
        """
        if self._encoded is not None and self._encoded[0] == request:
            return self._encoded
        body = self._provider.encode(request)
        self._encoded = (request, body)
        return self._encoded

    def _measure(self, history: History, max_tokens: int | None,
                 options: Mapping[str, Any] | None = None, *, stream: bool = False) -> int:
        """A history's body size for searches and reports, not for the body sent.

        The provider's fast ``measure`` when it has one (exact for the built-in adapters,
        without the SDK's request pipeline that makes ``encode`` ~100× a json.dumps);
        else ``len(encode())``. The body actually sent is encoded once, by ``_encode``.
        """
        request = self._request(history, max_tokens, stream=stream, options=options)
        fast = getattr(self._provider, "measure", None)
        if callable(fast):
            return int(fast(request))
        return len(self._provider.encode(request))

    # -- the summarizer the compactor uses (CONVENTIONS.md "Summarizer") --------------------
    def _summarize(self, text: str, *, max_tokens: int, deadline: float | None = None) -> str:
        request = Request(messages=(Message.system(compactor.SUMMARIZE_SYSTEM_PROMPT),
                                    Message.user(text)), max_tokens=max_tokens, stream=False)
        rejected = self.caps.smallest_rejected
        if rejected is not None:
            fast = getattr(self._provider, "measure", None)
            size = int(fast(request)) if callable(fast) else len(self._provider.encode(request))
            if size >= rejected:
                # Not even the summary request fits under what a proxy already rejected.
                reason = (f"the summary request ({format_size(size)}) is not below the "
                          f"{format_size(rejected)} the proxy/gateway already rejected")
                raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                        request_bytes=size), reason)
        try:
            return call_with_deadline(lambda _: self._provider.send(request), None, deadline,
                                      timeout=self.settings.turn_timeout or 0).message.text
        except ChatError as e:
            if e.failure.payload_related:
                # A proxy's size limit holds for every request: what rejected the
                # summarizer's body is learned, so the main request is fitted under it.
                self.caps.record_rejection(e.failure.request_bytes)
            raise

    # -- fitting before the send -----------------------------------------------------------
    def _fit_known_limits(self, history: History, body: int, sent_max_tokens: int | None,
                          max_tokens: int | None, target: int, turn: Turn, *,
                          options: Mapping[str, Any] | None, stream: bool) -> History:
        """Never send blind what pre-flight already knows is too big (ANCHORS: no blind retry).

        After compaction the body can still be over a known limit — the current turn's own
        tool results are in the kept tail, or the summary could not shrink enough. Such a
        body would only be rejected (and, over a learned cap, again for a limit already
        learned), so the ladder's fit step runs now, aimed at the compaction target: tool
        results become previews of their persisted files first, then the oldest units go.
        A body at or over the smallest size ever rejected is never sent: that is an error.
        """
        reserve = sent_max_tokens or 0
        cap = self.caps.effective()
        rejected = self.caps.smallest_rejected
        over_cap = cap is not None and body > cap
        over_window = self.estimator.estimate(body) + reserve > self.window
        if not (over_cap or over_window):
            return history
        margin = self.settings.exact_fit_margin
        window_limit = self.estimator.bytes_for(self.window - reserve) \
            if self.window > reserve else None
        goals = [target]
        if cap is not None:
            goals.append(math.floor(cap * (1 - margin)))
        if window_limit:
            goals.append(math.floor(window_limit * (1 - margin)))
        goal = max(1, min(goals))
        # The hard limit: a payload size proven to fail or the configured cap (the user
        # said the proxy takes no more), else the window's (an estimate, given the
        # exact-fit margin by the ladder).
        configured = self.caps.configured
        hard = [x for x in (rejected - 1 if rejected is not None else None, configured)
                if x is not None]
        payload_limit = min(hard) if hard else None
        limit: int | None
        if payload_limit is not None and (window_limit is None or payload_limit <= window_limit):
            limit, payload = payload_limit, True
        else:
            limit, payload = window_limit, False
        result = ladder.preflight_fit(
            history, target_bytes=goal, limit_bytes=limit, payload_related=payload,
            settings=self.settings, store=self._store,
            measure=lambda h: self._measure(h, max_tokens, options, stream=stream))
        what = (f"over the {format_size(cap)} {self.caps.source} cap"
                if over_cap and cap is not None else
                f"≈{self.estimator.estimate(body):,} tokens"
                + (f" + max_tokens {reserve:,}" if reserve else "")
                + f" over the {self.window:,}-token window")
        if result.level is ladder.Level.GIVE_UP:
            if rejected is not None and body >= rejected:
                reason = result.give_up_reason or (
                    f"The request is {format_size(body)}, at least the "
                    f"{format_size(rejected)} the proxy/gateway already rejected.")
                raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                        request_bytes=body), reason)
            if configured is not None and body > configured:
                reason = (f"The request is {format_size(body)} even after fitting, over the "
                          f"configured {format_size(configured)} payload cap; send a shorter "
                          "message or raise CHATCLI_MAX_PAYLOAD if the proxy takes more.")
                raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                        request_bytes=body), reason)
            return history      # not proven too big: the provider's answer will tell
        if not result.changed:
            return history
        self._emit(Preflight(
            message=f"ℹ pre-flight: still {format_size(body)} after compaction, {what} — "
                    f"fitting to {format_size(goal)} before sending"
                    + (f"\n  ↳ {'; '.join(result.notes)}" if result.notes else ""),
            body_bytes=body, est_tokens=self.estimator.estimate(body), cap=cap,
            window=self.window, action="compact"), turn)
        if result.compaction_notice_added:
            self._emit(NoticeInjected(message="ℹ the model was told that earlier context was "
                                              "compacted", notice="compaction"), turn)
        return result.history

    def _compaction_target(self) -> int:
        """Where compaction aims in chat, with the cap known now (hysteresis below the trigger)."""
        trigger = compactor.compaction_budget(
            self.settings, window_tokens=self.window,
            bytes_per_token=self.estimator.bytes_per_token, cap=self.caps.effective(),
            ratio=self.settings.chat_budget_ratio)
        return compactor.compaction_target(trigger, self.settings)

    def _fit_max_tokens(self, body: int, default: int | None, max_tokens: int | None,
                        turn: Turn) -> int | None:
        """Lower max_tokens before sending when prompt + answer cannot fit the window.

        Without an explicit max_tokens the provider may still send one (Anthropic always
        does); ``default`` is that one, read from the body, so a default that cannot fit
        is caught here instead of costing a rejected request every turn.
        """
        requested = max_tokens if max_tokens is not None else default
        if requested is None:
            return max_tokens
        limit = self._output_limit
        if limit is not None and requested > limit:
            # The provider rejected a larger max_tokens earlier in this session.
            self._emit(Preflight(
                message=f"ℹ pre-flight: max_tokens {requested:,} is above the model's output "
                        f"limit ({limit:,}, learned from an earlier rejection) — sending "
                        f"max_tokens {limit:,}", body_bytes=body,
                est_tokens=self.estimator.estimate(body), cap=self.caps.effective(),
                window=self.window, action="ok"), turn)
            requested = max_tokens = limit
        est = self.estimator.estimate(body)
        room = self.window - est
        if est + requested <= self.window or room < 1:
            return max_tokens
        fitted = room - math.ceil(room * self.settings.exact_fit_margin)
        if fitted < 1 or fitted >= requested:
            return max_tokens
        if max_tokens is None:
            return fitted       # the provider's own default: adjusting it is no news
        self._emit(Preflight(
            message=f"ℹ pre-flight: ≈{est:,} prompt tokens + max_tokens {requested:,} > "
                    f"context window {self.window:,} — sending max_tokens {fitted:,}",
            body_bytes=body, est_tokens=est, cap=self.caps.effective(), window=self.window,
            action="ok"), turn)
        return fitted

    def _compact(self, history: History, target: int, max_tokens: int | None, turn: Turn, *,
                 options: Mapping[str, Any] | None = None, instructions: str | None = None,
                 force: bool = False, stream: bool = False) -> History:
        # The summarizer's request must fit the model too: its input at most half the
        # window, its answer at most a quarter (a small window is where compaction matters).
        window_chars = int(self.window * self.estimator.bytes_per_token)
        settings = self.settings
        input_bound = max(1, min(settings.summarizer_input_max_chars, window_chars // 2))
        cap = self.caps.effective()
        if cap is not None:
            # ... and under the payload cap: a summarizer request over a (learned) cap
            # would only be rejected by the same proxy. Half of what the cap leaves after
            # the system prompt, as JSON escaping can grow the text.
            room = cap - len(compactor.SUMMARIZE_SYSTEM_PROMPT.encode("utf-8"))
            input_bound = max(1, min(input_bound, room // 2))
        summary_bound = max(1, min(settings.summary_max_chars, window_chars // 4))
        if (input_bound, summary_bound) != (settings.summarizer_input_max_chars,
                                            settings.summary_max_chars):
            settings = settings.replace(summarizer_input_max_chars=input_bound,
                                        summary_max_chars=summary_bound)
        summary_tokens = max(1, min(self.output_cap,
                                    int(summary_bound / self.estimator.bytes_per_token)))
        new, report = compactor.compact(
            history, target_bytes=target,
            measure=lambda h: self._measure(h, max_tokens, options, stream=stream),
            summarize=lambda text: self._summarize(text, max_tokens=summary_tokens,
                                                   deadline=turn.deadline),
            settings=settings, on_event=lambda e: self._emit(e, turn),
            instructions=instructions, force_summary=force)
        self._last_compaction = report
        if report.applied:
            self._compactions += 1
            turn.compacted_from = (history, len(new))
        return new
