"""SessionCompactor: the core compactor run with the session's model as summarizer, its
request bounded so it fits the model and the payload cap.

The summarizer's request must fit too: its input at most half the window and under what
the cap leaves after the system prompt, its answer at most a quarter of the window (a
small window is where compaction matters most). :meth:`SessionCompactor.run` returns the
new history and the core's report; it keeps no state, so a caller that decides not to
use a result has nothing to undo. The summary request belongs to the caller's
:class:`~.turn_log.TurnLog`: its deadline bounds it and its usage is counted there, like
any other request the session pays for.

A long history is summarized in chunks (``core/chunking.py``), each its own request
through :meth:`SessionCompactor._ask_model` (the recovery flow), at most
``settings.summary_max_requests`` of them. A reply cut at its own max_tokens
(:class:`~..core.compactor.SummaryReply` ``truncated``) is asked once more with max_tokens
doubled, within the model's output cap and what the window leaves beside the request
(:meth:`SessionCompactor.retry_tokens`); the core refuses it if it is cut again.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

from ..core import compactor, prompts, wording
from ..core.compactor import CompactionReport, SummaryReply
from ..core.events import CompactionPhase, Event, NoticeInjected
from ..core.history import History, Message
from ..core.recovery import flow
from ..errors import ChatError
from ..failures import Failure, FailureKind, Signature
from ..providers.base import Cancel, Request, StopReason
from ..settings import Settings, format_size
from .deadline import call_with_deadline
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, TurnLog

__all__ = ["SessionCompactor", "Summarizer"]

Summarizer = Callable[[str, int, TurnLog | None], "SummaryReply | str"]
"""``summarize(text, max_tokens, log)`` → the summary (the model's answer, whether it was
cut at max_tokens and its usage; a plain string is an answer not cut), sent within
``log``'s deadline, its usage added to ``log``."""


class SessionCompactor:
    """Compacts a history with the session's model as the summarizer."""

    def __init__(self, sizer: RequestSizer, bus: EventBus, settings: Settings,
                 summarize: Summarizer | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 calibrate: Callable[[int, int | None, int | None], None] | None = None,
                 ) -> None:
        self.sizer = sizer
        self.bus = bus
        self.settings = settings
        self.sleep = sleep
        self._summarize = summarize if summarize is not None else self._ask_model
        self._calibrate = calibrate
        """Where an answered summary request's usage goes (None: the token calibration at
        once; a worker keeps it for the next turn, so the figures shown do not move)."""

    def _ask_model(self, text: str, max_tokens: int, log: TurnLog | None) -> SummaryReply:
        request = Request(messages=(Message.system(prompts.SUMMARIZE_SYSTEM_PROMPT),
                                    Message.user(text)), max_tokens=max_tokens, stream=False,
                          caching=None)   # sent once: a cache write would cost, not save
        provider, limits = self.sizer.endpoint.provider, self.sizer.limits
        caps = limits.caps
        size = self.sizer.prepare(request).size
        rejected = caps.smallest_rejected
        if rejected is not None and size >= rejected:
            # Not even the summary request fits under what a proxy already rejected.
            reason = (f"the summary request ({format_size(size)}) is not below the "
                      f"{format_size(rejected)} the proxy/gateway already rejected")
            raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                    request_bytes=size), reason)
        # A summary is worth less than a wait for an overloaded server: the SDK's own
        # retries only, then the turn is fitted without it.
        recovery = flow.recover(caps, self.settings.replace(transient_retries=0))
        try:
            effect: flow.Effect = next(recovery)
            while True:
                result: object = None
                if isinstance(effect, flow.Send):
                    # Like any request: the SDK does not resend a body larger than any that
                    # passed; the flow decides every resend.
                    cancel = Cancel()
                    sent = dataclasses.replace(request, retries=flow.sdk_may_retry(caps, size),
                                               max_reply=self.settings.max_reply,
                                               cancel=cancel)
                    try:
                        response = call_with_deadline(
                            functools.partial(provider.send, sent), None,
                            log.deadline if log is not None else None,
                            timeout=self.settings.turn_timeout or 0, on_abandon=cancel.set)
                        result = flow.Answered(size)
                    except ChatError as e:
                        error = e
                        result = flow.Refused(e.failure, size,
                                              log.left() if log is not None else None,
                                              time.time())
                elif isinstance(effect, flow.Tell):
                    self._tell(effect.events, log)
                elif isinstance(effect, flow.Climb):
                    # A summary request is not fitted by the ladder: a limit it showed holds
                    # for the turn's request too, which is then fitted without a summary.
                    self._tell(effect.learned, log)
                    # A window it overflowed holds for the turn's request too: learned here
                    # (a summary prepared in the background is the first to meet it).
                    self._tell(tuple(limits.learn_window(error.failure, self.sizer.window)),
                               log)
                    raise error
                elif isinstance(effect, flow.Refresh):
                    self.sizer.endpoint.refresh()
                elif isinstance(effect, flow.Wait):
                    self.sleep(effect.seconds)
                effect = recovery.send(result)
        except StopIteration as stop:
            outcome = stop.value
        finally:
            recovery.close()
        self._tell(outcome.events, log)
        if isinstance(outcome, flow.GaveUp):
            failure = outcome.failure
            if outcome.not_size and failure.signature is Signature.BLOCK:
                # A WAF's content rule, not the proxy's size limit (the ModSecurity case).
                reason = wording.summary_not_size(format_size(size), failure.label)
                raise ChatError(dataclasses.replace(failure, reason=reason), reason) from error
            raise ChatError(failure, outcome.reason) from error
        # An unstreamed reply's usage calibrates the token estimate like a turn's (a server
        # that leaves usage out of streams calibrates from these alone).
        (self._calibrate or limits.on_success)(size, response.usage.prompt_tokens,
                                               response.usage.completion_tokens)
        if log is not None:
            # Paid for whether or not the compaction is then applied.
            log.add_usage(response.usage.prompt_tokens, response.usage.completion_tokens,
                          cached=response.usage.cached_tokens,
                          cache_write=response.usage.cache_write_tokens,
                          cache_write_1h=response.usage.cache_write_1h_tokens)
        usage = response.usage
        return SummaryReply(response.message.text, truncated=response.stop is StopReason.LENGTH,
                            input_tokens=usage.prompt_tokens,
                            output_tokens=usage.completion_tokens)

    def _tell(self, events: tuple[Event, ...], log: TurnLog | None) -> None:
        for event in events:
            self.bus.emit(event, log)

    def bounded_settings(self) -> tuple[Settings, int]:
        """Settings with the summarizer's input and output bounds for this model and cap,
        and the summary's max_tokens."""
        sizer, settings = self.sizer, self.settings
        bytes_per_token = sizer.limits.tokens.bytes_per_token
        window_chars = int(sizer.window * bytes_per_token)
        input_bound = max(1, min(settings.summarizer_input_max_chars, window_chars // 2))
        cap = sizer.limits.caps.effective()
        if cap is not None:
            # A summarizer request over a (learned) cap would only be rejected by the same
            # proxy. Half of what the cap leaves after the system prompt, as JSON escaping
            # can grow the text.
            room = cap - len(prompts.SUMMARIZE_SYSTEM_PROMPT.encode("utf-8"))
            input_bound = max(1, min(input_bound, room // 2))
        summary_bound = max(1, min(settings.summary_max_chars, window_chars // 4))
        if (input_bound, summary_bound) != (settings.summarizer_input_max_chars,
                                            settings.summary_max_chars):
            settings = settings.replace(summarizer_input_max_chars=input_bound,
                                        summary_max_chars=summary_bound)
        summary_tokens = max(1, min(sizer.output_cap, int(summary_bound / bytes_per_token)))
        return settings, summary_tokens

    def retry_tokens(self, settings: Settings, summary_tokens: int) -> int | None:
        """The max_tokens a summary cut at ``summary_tokens`` is asked again with: double,
        within the model's output cap and the window left beside a request of the full
        input bound (``settings`` are :meth:`bounded_settings`'); None when that is no more."""
        sizer = self.sizer
        prompt = len(prompts.SUMMARIZE_SYSTEM_PROMPT.encode("utf-8"))
        room = sizer.window - sizer.estimate(settings.summarizer_input_max_chars + prompt)
        bigger = min(2 * summary_tokens, sizer.output_cap, room)
        return bigger if bigger > summary_tokens else None

    def run(self, history: History, target: int, spec: RequestSpec, log: TurnLog | None, *,
            instructions: str | None = None, force: bool = False,
            accept: Callable[[History, CompactionReport], str | None] | None = None,
            should_cancel: Callable[[], bool] | None = None,
            ) -> tuple[History, CompactionReport]:
        """Compact ``history`` to ``target`` bytes (trim → summarize → apply), telling each
        phase; an interrupt during the summary leaves nothing changed (it re-raises).

        ``accept(new, report)``, when given, may still refuse a compaction the core applied
        (it returns why): the history is then returned unchanged and the compaction is told
        as rejected — never "applied" first and taken back after.
        """
        settings, summary_tokens = self.bounded_settings()
        bigger = self.retry_tokens(settings, summary_tokens)
        held: list[CompactionPhase] = []

        def tell(event: Event) -> None:
            if accept is not None and isinstance(event, CompactionPhase) \
                    and event.phase == "applied":
                held.append(event)      # told once the caller accepted it
                return
            self.bus.emit(event, log)

        new, report = compactor.compact(
            history, target_bytes=target, measure=self.sizer.measurer(spec),
            summarize=lambda text: self._summarize(text, summary_tokens, log),
            settings=settings, on_event=tell, instructions=instructions, force_summary=force,
            retry=None if bigger is None else (lambda text: self._summarize(text, bigger, log)),
            should_cancel=should_cancel)
        why = accept(new, report) if accept is not None and report.applied else None
        if why is not None:
            for event in held:
                self.bus.emit(dataclasses.replace(
                    event, phase="rejected", outcome=None, reason=why,
                    after_messages=event.before_messages, after_bytes=event.before_bytes), log)
            return history, dataclasses.replace(
                report, applied=False, after_messages=report.before_messages,
                after_bytes=report.before_bytes, rejected_reason=why)
        for event in held:
            self.bus.emit(event, log)
        if report.applied and report.dropped_unread:
            # The summary's notice tells the model what it left unread.
            self.bus.emit(NoticeInjected(notice="compaction"), log)
        return new, report
