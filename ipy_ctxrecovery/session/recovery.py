"""RecoveryLoop: send one prepared request and drive its recovery (SPEC §1, §3) with real
effects.

What to do after a refusal is decided in one place, the pure generator
``core.recovery.flow.recover`` (evidence per network path, then ``policy.respond``); this
loop does what it asks: it sends (every body fitted first under the limits the path
showed, and never again at or over the smallest size a limit refused), re-reads the
credentials, sleeps, and climbs the ladder. A ladder step is ``ladder.decide`` (pure) and
its application; an exact fit first tries an LLM summary of the oldest messages to its
target (the conversation keeps its substance) and drops them only when that fails. A
what-if drives this same loop with a provider that rejects (``what_if``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core import ladder
from ..core.budget import ResultStore
from ..core.compactor import NO_LIMIT, CompactionReport
from ..core.events import (
    Event,
    LadderStep,
    NoticeInjected,
    Recovered,
    Retrying,
    Sending,
    ThinkingFitted,
)
from ..core.history import (
    TAG_PAYLOAD_NOTICE,
    Compaction,
    History,
    Message,
    latest_user_index,
    leading_compaction,
)
from ..core.prompts import PAYLOAD_NOTICE
from ..core.recovery import flow, policy
from ..core.thinking import ThinkingFit
from ..errors import ChatError, redact
from ..failures import Failure, FailureKind
from ..providers.base import Cancel, Request, Response, TextCallback
from ..settings import Settings, format_size
from .compaction import SessionCompactor
from .deadline import call_with_deadline
from .endpoint import Endpoint
from .learned import LearnedLimits
from .pipeline import Preparer
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, Shrink, TurnLog

__all__ = ["RecoveryLoop", "Sent", "sentence"]

def sentence(failure: Failure) -> str:
    """One clear sentence for a failure recovery could not save (secrets redacted)."""
    return redact(policy.sentence(failure))


@dataclass(frozen=True, slots=True)
class Sent:
    """A request that succeeded: the history it carried, the answer, and its spec."""

    history: History
    response: Response
    spec: RequestSpec


class RecoveryLoop:
    """Sends a request until it succeeds or recovery gives up (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, sizer: RequestSizer, preparer: Preparer,
                 compactor: SessionCompactor, store: ResultStore, bus: EventBus,
                 settings: Settings, sleep: Callable[[float], None],
                 while_waiting: Callable[[], None] | None = None) -> None:
        self.endpoint = endpoint
        self.sizer = sizer
        self.preparer = preparer
        self.compactor = compactor
        self.store = store
        self.bus = bus
        self.settings = settings
        self.sleep = sleep
        self.while_waiting = while_waiting    # run while a request is in flight
        self.recoveries = 0

    @property
    def limits(self) -> LearnedLimits:
        return self.sizer.limits

    def send(self, history: History, spec: RequestSpec, log: TurnLog,
             on_text: TextCallback | None) -> Sent:
        """Prepare, send and recover one request; raise ChatError when it fails for good."""
        self.sizer.ask_server_window()
        prepared = self.preparer.prepare(history, spec, log)
        history, spec = prepared.history, prepared.spec
        state = ladder.LadderState(payload_notice_sent=self.limits.payload_notice_given)
        steps = 0
        told = False

        def recovered() -> None:
            # Said once, when the resent request is answered: at its first streamed text
            # (so the line comes before the answer on screen), else when it returns.
            nonlocal told
            if steps and not told:
                told = True
                self.recoveries += 1
                self.bus.emit(Recovered(attempts=steps), log)

        def relay(delta: str) -> None:
            recovered()
            assert on_text is not None
            on_text(delta)

        caps = self.limits.caps
        recovery = flow.recover(caps, self.settings)
        error: ChatError | None = None
        response: Response | None = None
        unstreamed = False          # an empty stream: this request goes on unstreamed
        thinking_told: ThinkingFit | None = None     # said once, unless it changes
        body = 0
        try:
            effect: flow.Effect = next(recovery)
            while True:
                result: object = None
                if isinstance(effect, flow.Send):
                    sending = dataclasses.replace(spec, stream=False) if unstreamed else spec
                    history, request, body = self._encoded_within_limits(history, sending,
                                                                         log)
                    fitted = self.sizer.thinking_fit(sending)
                    if fitted is not None and fitted != thinking_told:
                        thinking_told = fitted
                        self.bus.emit(ThinkingFitted(requested=fitted.asked, sent=fitted.sent,
                                                     max_tokens=fitted.max_tokens), log)
                    cancel = Cancel()
                    request = dataclasses.replace(request,
                                                  retries=flow.sdk_may_retry(caps, body),
                                                  max_reply=self.settings.max_reply,
                                                  cancel=cancel)
                    self.bus.emit(Sending(body_bytes=body, attempt=effect.attempt,
                                          max_tokens=request.max_tokens), log)
                    try:
                        response = call_with_deadline(
                            functools.partial(self.endpoint.provider.send, request),
                            relay if sending.stream and on_text else None, log.deadline,
                            timeout=self.settings.turn_timeout or 0,
                            meanwhile=self.while_waiting, on_abandon=cancel.set)
                        result = flow.Answered(body)
                    except ChatError as e:
                        error, failure = e, e.failure
                        if failure.request_bytes is None:
                            failure = dataclasses.replace(failure, request_bytes=body)
                        result = flow.Refused(failure, body, log.left(), time.time())
                elif isinstance(effect, flow.Climb):
                    assert error is not None
                    history, state, spec = self._recover(history, state, effect.failure,
                                                         effect.body, spec, log, error,
                                                         list(effect.learned))
                    steps += 1
                elif isinstance(effect, flow.Tell):
                    self._emit_all(list(effect.events), log)
                elif isinstance(effect, flow.Refresh):
                    self.endpoint.refresh()
                    self.sizer.forget_encoding()
                    self.bus.emit(Retrying(attempt=1, wait=0.0,
                                           failure_kind=effect.failure.kind,
                                           failure=effect.failure), log)
                elif isinstance(effect, flow.Unstream):
                    # The server's own error (or its answer) comes back unstreamed.
                    unstreamed = True
                    self.bus.emit(Retrying(attempt=1, wait=0.0,
                                           failure_kind=effect.failure.kind,
                                           failure=effect.failure, resend="unstreamed"), log)
                elif isinstance(effect, flow.Resend):
                    self.bus.emit(Retrying(
                        attempt=1, wait=0.0, failure_kind=effect.failure.kind,
                        failure=effect.failure,
                        resend="suspect" if effect.suspect else "carried"), log)
                else:
                    self.bus.emit(Retrying(attempt=effect.attempt, wait=effect.seconds,
                                           failure_kind=effect.failure.kind,
                                           failure=effect.failure,
                                           of=self.settings.transient_retries), log)
                    self.sleep(effect.seconds)
                effect = recovery.send(result)
        except StopIteration as stop:
            outcome = stop.value
        finally:
            recovery.close()    # a limit only adopted for this request is taken back
            self.sizer.forget_encoding()    # the body is not kept after the send
        if isinstance(outcome, flow.GaveUp):
            self._emit_all(list(outcome.events), log)
            raise ChatError(outcome.failure, redact(outcome.reason)) from error
        assert response is not None
        self._emit_all(list(outcome.events), log)
        usage = response.usage
        sample = _body_tokens(response, history)
        self.limits.on_success(body, usage.prompt_tokens if sample is None else sample,
                               usage.completion_tokens, calibrate=sample is not None)
        # A server compaction is billed besides the answer: its input, its summary.
        billed = usage.billed()
        log.add_usage(billed.prompt_tokens, billed.completion_tokens,
                      cached=billed.cached_tokens, cache_write=billed.cache_write_tokens,
                      cache_write_1h=billed.cache_write_1h_tokens)
        recovered()
        if unstreamed and spec.stream and on_text is not None and response.message.text:
            on_text(response.message.text)      # shown as a streamed answer would be
        return Sent(history, response, spec)

    def _encoded_within_limits(self, history: History, spec: RequestSpec,
                               log: TurnLog) -> tuple[History, Request, int]:
        """The request to send; a body already known to be rejected is fitted first."""
        sizer = self.sizer
        prepared = sizer.prepare(sizer.request(history, spec))
        rejected = self.limits.caps.smallest_rejected
        if rejected is None or prepared.size < rejected:
            return history, prepared.request, prepared.size
        body = prepared.size
        # Sending it again only repeats the rejection: fit it (or fail with a sentence).
        target = NO_LIMIT if sizer.server.compacts() else sizer.compaction_target()
        history = self.preparer.fit_known_limits(history, body, sizer.reserved_tokens(spec),
                                                 spec, target, log, after_compaction=False)
        prepared = sizer.prepare(sizer.request(history, spec))
        request, body = prepared.request, prepared.size
        if body >= rejected:
            reason = (f"The request is {format_size(body)} even after fitting, at least the "
                      f"{format_size(rejected)} the proxy/gateway already rejected; send a "
                      "shorter message or raise the proxy/gateway limit (CHATCLI_MAX_PAYLOAD).")
            raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason, request_bytes=body),
                            reason)
        return history, request, body

    def _recover(self, history: History, state: ladder.LadderState, failure: Failure,
                 body: int, spec: RequestSpec, log: TurnLog, error: ChatError,
                 learned: list[Event]) -> tuple[History, ladder.LadderState, RequestSpec]:
        """One ladder step for a recoverable failure; raise ChatError when it gives up.

        ``learned``: the events for what the failure showed on the path (a cap learned),
        said after the ⚠ line and before the cut they explain."""
        limits, sizer = self.limits, self.sizer
        caps = limits.caps
        cap_before = caps.effective()
        reserved = sizer.reserved_tokens(spec)
        window_events = limits.learn_window(
            failure, sizer.window, limits.tokens.estimate(body) + (reserved or 0))
        if window_events:
            sizer.forget_encoding()
        learned = [*learned, *window_events]
        if failure.kind is FailureKind.CONTEXT_OVERFLOW:
            spec = self._leave_room_for_the_request(history, spec)
        sent_max_tokens = sizer.reserved_tokens(spec)
        # An exact fit aims no higher than the compaction target, so the fitted history
        # ends below the compaction trigger and the next turn does not summarize again.
        # While the server compacts there is no summary of ours to avoid: the fit drops
        # (never summarizes), so it aims just under the limit, as pre-flight's does, and
        # what it keeps the server reads into its own compaction.
        ceiling = None if sizer.server.compacts() else sizer.compaction_target()
        decision = ladder.decide(self.settings, state, failure, history_bytes=body,
                                 max_tokens=sent_max_tokens, cap=cap_before,
                                 cap_configured=limits.caps.configured is not None,
                                 target_ceiling=ceiling)
        if decision.level is ladder.Level.GIVE_UP:
            self._emit_all(learned, log)
            raise ChatError(failure, decision.reason or sentence(failure)) from error
        if decision.assume_cap is not None:
            # The SPEC auto-cap is recorded; a cap learned from the rejected size wins and
            # is what the user is told about, as it is the one in effect.
            assumed = limits.assume_cap(decision.assume_cap)
            if assumed is not None:
                learned.insert(0, assumed)
        if decision.level is ladder.Level.LOWER_MAX_TOKENS:
            if failure.kind is FailureKind.OUTPUT_LIMIT and decision.max_tokens is not None:
                limits.output_limit = decision.max_tokens
            spec = spec.with_max_tokens(decision.max_tokens)
        before = len(history)
        plan = self._summary_plan(history, decision, spec)
        # Told in the order it happens: the failure (⚠), what it taught, then the cut.
        self.bus.emit(LadderStep(decision=decision, failure=failure, before_messages=before,
                                 after_messages=before, summarizing=plan is not None), log)
        self._emit_all(learned, log)
        not_used = None
        if plan is not None:
            summarized, not_used = self._summarize_to_fit(history, plan, decision, spec, log)
            if summarized is not None:
                return summarized, decision.state, spec
        result = ladder.apply(decision, history, settings=self.settings, store=self.store,
                              measure=sizer.measurer(spec), part=sizer.part_size)
        if result.level is ladder.Level.GIVE_UP:
            raise ChatError(failure, result.give_up_reason or sentence(failure)) from error
        if result.changed:
            log.shrinks.append(Shrink("ladder", history, len(result.history)))
        history = result.history
        if decision.inject_payload_notice:
            limits.payload_notice_given = True
        if result.changed or result.notes or not_used is not None:
            self.bus.emit(LadderStep(decision=decision, failure=failure, before_messages=before,
                                     after_messages=len(history), notes=tuple(result.notes),
                                     summary_not_used=not_used,
                                     server_compacts=sizer.server.compacts()), log)
        if result.payload_notice_added:
            self.bus.emit(NoticeInjected(notice="payload"), log)
        if result.compaction_notice_added:
            self.bus.emit(NoticeInjected(notice="compaction"), log)
        return history, decision.state, spec

    def _leave_room_for_the_request(self, history: History, spec: RequestSpec) -> RequestSpec:
        """A reservation that left no room for the request itself (a window just learned
        below it, say) is lowered before anything else, so the ladder never cuts messages
        — or calls one too big — to make room for an answer that cannot fit anyway."""
        reserved = self.sizer.reserved_tokens(spec)
        room = self.sizer.answer_room(history, spec)
        if reserved is None or room is None or reserved <= room:
            return spec
        return spec.with_max_tokens(room)

    def _emit_all(self, events: list[Event], log: TurnLog) -> None:
        for event in events:
            self.bus.emit(event, log)
        events.clear()

    def _summary_plan(self, history: History, decision: ladder.Decision,
                      spec: RequestSpec) -> tuple[History, bool] | None:
        """For an exact fit (a payload rejection or a context overflow with numbers): the
        history to summarize from (the payload notice placed first, so the summary's room
        accounts for it) and whether that notice was added — or None when the target
        leaves no room for a summary beside what must stay (the oldest are dropped)."""
        target = decision.target_bytes
        if decision.level is not ladder.Level.EXACT_FIT or target is None:
            return None
        if self.sizer.server.compacts():
            return None     # no client summary while the server compacts: the oldest go
        start = history
        notice_added = False
        if decision.inject_payload_notice \
                and not any(m.tag == TAG_PAYLOAD_NOTICE for m in history):
            # The compactor never summarizes the notice away.
            at = latest_user_index(history)
            at = len(history) if at is None else at
            notice = Message.user(PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE)
            start = (*history[:at], notice, *history[at:])
            notice_added = True
        floor = self.sizer.measurer(spec)(ladder.drop_oldest(start, len(start))[0])
        if target - floor < ladder.MIN_PREVIEW_CHARS:
            return None
        return start, notice_added

    def _summarize_to_fit(self, history: History, plan: tuple[History, bool],
                          decision: ladder.Decision, spec: RequestSpec,
                          log: TurnLog) -> tuple[History | None, str | None]:
        """An exact fit by summary: the oldest messages summarized instead of dropped.

        Returns the new history, or (None, why) when the summary failed or did not bring
        the history to the target (the caller then drops the oldest messages). The summary
        costs one request, but a history that keeps its substance is worth it.
        """
        target = decision.target_bytes
        assert target is not None
        start, notice_added = plan
        measure = self.sizer.measurer(spec)

        def within_target(new: History, report: CompactionReport) -> str | None:
            if not report.summarized_messages:
                return "no message could be summarized"
            size = measure(new)
            return None if size <= target else (f"the summary left {format_size(size)}, "
                                                f"over the {format_size(target)} needed")

        new, report = self.compactor.run(start, target, spec, log, accept=within_target)
        if not report.applied:
            return None, report.rejected_reason or "the summary did not fit"
        log.shrinks.append(Shrink("compaction", history, len(new)))
        if decision.inject_payload_notice:
            self.limits.payload_notice_given = True
        if notice_added:
            self.bus.emit(NoticeInjected(notice="payload"), log)
        return new, None


def _body_tokens(response: Response, sent: History) -> int | None:
    """The prompt tokens of the body as sent, as a sample for the bytes/token calibration
    (None: the reply gives none, and calibrates nothing).

    A reply the server compacted first reports the compacted input's tokens: its
    compaction's own count is the body's (None where the provider gives none). None when
    the server edited the request's context (the tokens are those the model read after
    that, fewer than were sent), when the request was chained to a stored response (they
    count the stored items too), or when ``sent`` carries an encrypted compaction (OpenAI's:
    its bytes are ciphertext, and what the server counts for it is the hidden summary's
    tokens — a sample would raise bytes/token by a tenth after every compaction)."""
    carried = leading_compaction(sent)
    if response.chained or response.edits or (carried is not None and carried.summary is None):
        return None
    if any(isinstance(block, Compaction) for block in response.message.blocks):
        return response.usage.compaction_input_tokens
    return response.usage.prompt_tokens
