"""One request, sent with pre-flight and recovery: the half of ChatSession that talks to the provider.

:class:`RequestLoop` is mixed into :class:`~ipy_ctxrecovery.session.ChatSession`; it owns
nothing of its own — the learned state it reads and updates (caps, token calibration,
the one-shot warning, the payload notice) lives on the session object.

For one request: microcompact → tool-result budget → measure the exact body once →
lower ``max_tokens`` if prompt + answer cannot fit the window → pre-flight (SPEC §2) →
compaction when over budget → when the body is still over a known limit (cap, window),
``ladder.preflight_fit`` (previews, then the oldest units) instead of a blind send → send.
Candidate sizes (compaction's search, fitting, reports) use the provider's fast
``measure`` when it has one; the body sent is encoded once. On failure: auth → refresh once; transient → retry
with backoff through the injected ``sleep`` (``retry_after`` honoured); everything
recoverable (and ``output_limit``) → ``ladder.decide`` / ``ladder.apply`` → resend;
``GIVE_UP`` → :class:`ChatError` with one sentence. An exact fit first tries an LLM summary
of the oldest messages to its target (the conversation keeps its substance) and drops
them only when that fails. A context overflow that reports a window below ours teaches
the session that window (``_learned_window``), as a rejection teaches a payload cap.

Sizes, the max_tokens fit, compaction and the pre-send fit live in its base class,
:class:`~ipy_ctxrecovery._fitting.RequestSizing` (``_fitting.py``); this module keeps the
send loop and the ladder climbing.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
import warnings
from collections.abc import Mapping
from typing import Any

from . import budget, compactor, ladder, microcompact, preflight
from ._fitting import RequestSizing, Turn
from .config import format_size
from .deadline import call_with_deadline
from .errors import ChatError, Failure, FailureKind, redact
from .events import (
    BudgetApplied,
    CapChanged,
    Event,
    LadderStep,
    MicrocompactApplied,
    NoticeInjected,
    Preflight,
    Recovered,
    Retrying,
    WindowLearned,
)
from .history import TAG_PAYLOAD_NOTICE, History, Message, latest_user_index
from .providers.base import Provider, Response, TextCallback
from .retry import retry_wait, too_long_sentence

__all__ = ["RequestLoop", "Turn"]

_MAX_TOKENS_RE = re.compile(rb'"max_(?:completion_)?tokens"\s*:\s*(\d+)')
"""The max_tokens a provider put in the body (Anthropic always sends one)."""


class RequestLoop(RequestSizing):
    """Pre-flight, send and recover one request; mixed into ChatSession."""

    def _make_provider(self, model: str) -> Provider:
        raise NotImplementedError

    # -- one request, with recovery ---------------------------------------------------------
    def _prepare(self, history: History, max_tokens: int | None, turn: Turn,
                 options: Mapping[str, Any] | None,
                 stream: bool) -> tuple[History, int | None]:
        """Pre-flight: microcompact, budget, measure, fit max_tokens, compact when over budget."""
        settings = self.settings
        compacted, mc = microcompact.microcompact(history, settings=settings, store=self._store)
        if mc.truncated or mc.summarized:
            history = compacted
            self._emit(MicrocompactApplied(message=mc.message, truncated=mc.truncated,
                                           summarized=mc.summarized,
                                           bytes_freed=mc.bytes_freed), turn)
        budgeted, br = budget.enforce_budget(
            history, store=self._store, turn_budget_chars=settings.turn_budget_chars,
            per_result_max_chars=settings.per_result_max_chars,
            head_chars=settings.budget_head_chars, tail_chars=settings.budget_tail_chars)
        if br.replaced:
            history = budgeted
            paths = tuple(str(p) for p in br.persisted)
            self._emit(BudgetApplied(
                message=f"✂ tool-result budget: {br.replaced} result(s) replaced by previews; "
                        f"full content saved ({', '.join(paths) or 'already saved'})",
                replaced=br.replaced, persisted=paths), turn)

        request = self._request(history, max_tokens, stream=stream, options=options)
        _, encoded = self._encode(request)     # the one exact encoding pre-flight reads
        body = len(encoded)
        requested = max_tokens
        # What the provider puts in the body when no max_tokens is asked for (Anthropic
        # always sends one); it does not depend on the history, so it is read once.
        default = _body_max_tokens(encoded, None) if requested is None else None
        max_tokens = self._fit_max_tokens(body, default, max_tokens, turn)
        pf = preflight.check(body, settings=settings, caps=self.caps, estimator=self.estimator,
                             window_tokens=self.window,
                             max_tokens=max_tokens if max_tokens is not None else default,
                             warned=self._warned)
        if pf.warned:
            self._warned = True
        if pf.message:
            self._emit(Preflight(message=pf.message, body_bytes=pf.body_bytes,
                                 est_tokens=pf.est_tokens, cap=pf.cap, window=pf.window,
                                 action=pf.action), turn)
        trigger = compactor.compaction_budget(
            settings, window_tokens=self.window,
            bytes_per_token=self.estimator.bytes_per_token, cap=self.caps.effective(),
            ratio=pf.budget_ratio or settings.chat_budget_ratio)
        target = compactor.compaction_target(trigger, settings)
        if pf.action == "compact" or body > trigger:
            compacted = self._compact(history, target, max_tokens, turn, options=options,
                                      stream=stream)
            if compacted is not history:
                history = compacted
                body = self._measure(history, max_tokens, options, stream=stream)
            reserve = max_tokens if max_tokens is not None else default
            history = self._fit_known_limits(history, body, reserve, max_tokens, target, turn,
                                             options=options, stream=stream)
            if history is not compacted:
                # Room was made for the answer: the max_tokens lowered for the body before
                # the cut may be larger again (never above what was asked for).
                body = self._measure(history, requested, options, stream=stream)
                max_tokens = self._fit_max_tokens(body, default, requested, turn)
        return history, max_tokens

    def _send_recovering(self, history: History, max_tokens: int | None, turn: Turn, *,
                         stream: bool, on_text: TextCallback | None,
                         options: Mapping[str, Any] | None,
                         ) -> tuple[History, Response, int | None]:
        """Send one request; recover from failures (SPEC §1 and §3) until it succeeds."""
        settings = self.settings
        history, max_tokens = self._prepare(history, max_tokens, turn, options, stream)
        state = ladder.LadderState(payload_notice_sent=self._payload_notice_sent)
        auth_retried = False
        transient = 0
        steps = 0
        while True:
            request, encoded = self._encode(
                self._request(history, max_tokens, stream=stream, options=options))
            body = len(encoded)
            rejected = self.caps.smallest_rejected
            if rejected is not None and body >= rejected:
                # A body this size was already rejected: sending it again only repeats
                # the rejection. Fit it (or fail with a sentence), never resend it blind.
                history = self._fit_known_limits(history, body,
                                                 _body_max_tokens(encoded, max_tokens),
                                                 max_tokens,
                                                 self._compaction_target(), turn,
                                                 options=options, stream=stream)
                request, encoded = self._encode(
                    self._request(history, max_tokens, stream=stream, options=options))
                body = len(encoded)
                if body >= rejected:
                    reason = (f"The request is {format_size(body)} even after fitting, at "
                              f"least the {format_size(rejected)} the proxy/gateway already "
                              "rejected; send a shorter message or raise the proxy/gateway "
                              "limit (CHATCLI_MAX_PAYLOAD).")
                    raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                            request_bytes=body), reason)
            try:
                response = call_with_deadline(
                    functools.partial(self._provider.send, request),
                    on_text if stream else None, turn.deadline,
                    timeout=settings.turn_timeout or 0)
            except ChatError as e:
                failure = e.failure
                if failure.request_bytes is None:
                    failure = dataclasses.replace(failure, request_bytes=body)
                kind = failure.kind
                if kind is FailureKind.AUTH and not auth_retried:
                    auth_retried = True
                    self._refresh_provider()
                    self._emit(Retrying(message="↻ authentication failed — re-reading the "
                                                "credentials and retrying once",
                                        attempt=1, wait=0.0, failure_kind=kind.value), turn)
                    continue
                if kind is FailureKind.TRANSIENT and transient < settings.transient_retries:
                    transient += 1
                    plan = retry_wait(transient, failure.retry_after,
                                      max_wait=settings.max_retry_wait, remaining=turn.left())
                    if plan.seconds is None:
                        what = f"HTTP {failure.status}" if failure.status else failure.label
                        raise ChatError(failure, too_long_sentence(
                            plan, what, now=time.time())) from e
                    wait = plan.seconds
                    self._emit(Retrying(
                        message=f"↻ {failure.label} — retrying in {wait:.1f}s "
                                f"({transient}/{settings.transient_retries})",
                        attempt=transient, wait=wait, failure_kind=kind.value), turn)
                    self._sleep(wait)
                    continue
                if not failure.recoverable and kind is not FailureKind.OUTPUT_LIMIT:
                    raise ChatError(failure, _sentence(failure)) from e
                history, state, max_tokens = self._climb(
                    history, state, failure, body, max_tokens, turn, e, stream=stream,
                    options=options, sent_max_tokens=_body_max_tokens(encoded, max_tokens))
                steps += 1
                continue
            # Success: learn from it.
            self.caps.record_success(body)
            if response.usage.prompt_tokens:
                self.estimator.calibrate(body, response.usage.prompt_tokens)
            turn.prompt_tokens += response.usage.prompt_tokens or 0
            turn.completion_tokens += response.usage.completion_tokens or 0
            self._prompt_tokens += response.usage.prompt_tokens or 0
            self._completion_tokens += response.usage.completion_tokens or 0
            if steps:
                self._recoveries += 1
                self._emit(Recovered(message=f"✓ Recovered after {steps} recovery "
                                             f"step{'s' if steps > 1 else ''}",
                                     attempts=steps), turn)
            return history, response, max_tokens

    def _climb(self, history: History, state: ladder.LadderState, failure: Failure, body: int,
               max_tokens: int | None, turn: Turn, error: ChatError, *, stream: bool,
               options: Mapping[str, Any] | None, sent_max_tokens: int | None = None,
               ) -> tuple[History, ladder.LadderState, int | None]:
        """One ladder step for a recoverable failure; raise ChatError when it gives up.

        ``sent_max_tokens``: the max_tokens the rejected body carried — the provider's own
        default when none was asked for (Anthropic always sends one) — so exact fit leaves
        room for the answer the resend will reserve too.
        """
        settings = self.settings
        cap_before = self.caps.effective()
        # What this failure teaches (a payload cap, a window) is learned before deciding,
        # so the decision uses it; the lines saying so come after the ⚠ line.
        learned_events: list[Event] = []
        if failure.payload_related:
            size = failure.request_bytes or body
            learned = self.caps.record_rejection(size)
            if learned is not None and learned != cap_before:
                verb = "dropped" if failure.kind is FailureKind.LIKELY_PAYLOAD else "rejected"
                learned_events.append(CapChanged(
                    message=f"ℹ Learned a payload limit of about {format_size(learned)} (a "
                            f"{format_size(size)} request was {verb})",
                    cap=learned, source="learned"))
        window_event = self._learn_window(failure)
        if window_event is not None:
            learned_events.append(window_event)
        # The ladder wants the cap the request was sent under. Its SPEC auto-cap (4 MB) is
        # recorded too, but a cap learned from the rejected size wins and is what the user
        # is told about, as it is the one in effect.
        # An exact fit aims no higher than the compaction target, so the fitted history
        # ends below the compaction trigger and the next turn does not summarize again.
        decision = ladder.decide(settings, state, failure, history_bytes=body,
                                 max_tokens=sent_max_tokens if max_tokens is None
                                 else max_tokens,
                                 cap=cap_before,
                                 cap_configured=self.caps.configured is not None,
                                 target_ceiling=self._compaction_target())
        if decision.level is ladder.Level.GIVE_UP:
            for event in learned_events:
                self._emit(event, turn)
            raise ChatError(failure, decision.message or _sentence(failure)) from error
        lines = decision.message.splitlines()
        assume_lines = [line for line in lines if line.startswith("ℹ Assuming")]
        if decision.assume_cap is not None and self.caps.assumed is None:
            self.caps.assumed = decision.assume_cap
            if self.caps.source == "assumed":
                learned_events.insert(0, CapChanged(
                    message="\n".join(assume_lines) or
                    f"ℹ Assuming a {format_size(decision.assume_cap)}/payload limit",
                    cap=decision.assume_cap, source="assumed"))
        if decision.level is ladder.Level.LOWER_MAX_TOKENS:
            if failure.kind is FailureKind.OUTPUT_LIMIT and decision.max_tokens is not None:
                self._output_limit = decision.max_tokens
            max_tokens = decision.max_tokens
        message = "\n".join(line for line in lines if line not in assume_lines)
        if failure.kind is FailureKind.LIKELY_PAYLOAD:
            # The connection was dropped: nothing answered, so nothing "rejected" it.
            message = message.replace("request was rejected", "request was dropped")
        before = len(history)

        def measure(h: History) -> int:
            return self._measure(h, max_tokens, options, stream=stream)

        summarized, not_used = self._summarize_to_fit(
            history, decision, failure, message, learned_events, max_tokens, turn,
            options=options, stream=stream)
        if summarized is not None:
            return summarized, decision.state, max_tokens
        if not_used is not None:
            # The ⚠ line is out already; say why the summary was not used, then the drop.
            message = f"  ↳ summary not used ({not_used}) — dropping the oldest messages"
        result = ladder.apply(decision, history, settings=settings, store=self._store,
                              measure=measure)
        if result.level is ladder.Level.GIVE_UP:
            for event in learned_events:
                self._emit(event, turn)
            raise ChatError(failure, result.give_up_reason or _sentence(failure)) from error
        history = result.history
        if decision.inject_payload_notice:
            self._payload_notice_sent = True
        if result.notes:
            message += f"\n  ↳ {result.level.value}: " + "; ".join(result.notes)
        self._emit(LadderStep(message=message or f"⚠ recovery: {decision.level.value}",
                              level=result.level.value, attempt=decision.attempt,
                              failure_kind=failure.kind.value, before_messages=before,
                              after_messages=len(history)), turn)
        for event in learned_events:
            self._emit(event, turn)
        if result.payload_notice_added:
            self._emit(NoticeInjected(message="ℹ SYSTEM NOTICE (payload limit hit) given to "
                                              "the model", notice="payload"), turn)
        if result.compaction_notice_added:
            self._emit(NoticeInjected(message="ℹ the model was told that earlier context was "
                                              "compacted", notice="compaction"), turn)
        return history, decision.state, max_tokens

    def _learn_window(self, failure: Failure) -> WindowLearned | None:
        """Adopt the window a context overflow reported when it is below ours.

        A wrong CHATCLI_CONTEXT_WINDOW (or catalogue entry) would otherwise let the history
        grow past the real window again every few turns; the reported limit is the truth
        for this session (``update(settings=…)`` with a new context_window replaces it).
        """
        limit = failure.limit_tokens
        if failure.kind is not FailureKind.CONTEXT_OVERFLOW or limit is None:
            return None
        previous = self.window
        if not 0 < limit < previous:
            return None
        self._learned_window = limit
        self._encoded = None
        return WindowLearned(
            message=f"ℹ Learned a context window of {limit:,} tokens from the provider "
                    f"(this session assumed {previous:,}) — using it from now on; set "
                    f"CHATCLI_CONTEXT_WINDOW={limit} to start with it",
            window=limit, previous=previous)

    def _summarize_to_fit(self, history: History, decision: ladder.Decision, failure: Failure,
                          message: str, learned_events: list[Event], max_tokens: int | None,
                          turn: Turn, *, options: Mapping[str, Any] | None,
                          stream: bool) -> tuple[History | None, str | None]:
        """An exact fit by summary: the oldest messages summarized instead of dropped.

        Tried first for an exact fit (a payload rejection or a context overflow with
        numbers) when the target leaves room for a summary beside what must stay. Returns
        (None, None) — the caller then drops messages as before — when a summary is not
        worth trying; (None, why) when it was tried (its ⚠ line is out) but failed or did
        not bring the history to the target. The summary costs one request, but a history
        that keeps its substance is worth it.
        """
        target = decision.target_bytes
        if decision.level is not ladder.Level.EXACT_FIT or target is None:
            return None, None

        def measure(h: History) -> int:
            return self._measure(h, max_tokens, options, stream=stream)

        start = history
        notice_added = False
        if decision.inject_payload_notice \
                and not any(m.tag == TAG_PAYLOAD_NOTICE for m in history):
            # Placed before compacting, so the summary's room accounts for it (the
            # compactor never summarizes the notice away).
            at = latest_user_index(history)
            at = len(history) if at is None else at
            notice = Message.user(ladder.PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE)
            start = (*history[:at], notice, *history[at:])
            notice_added = True
        floor = measure(ladder.drop_oldest(start, len(start))[0])
        if target - floor < ladder.MIN_PREVIEW_CHARS:
            return None, None   # no room for a summary beside what must stay: drop instead
        before = len(history)
        self._emit(LadderStep(message=message.replace("cutting history to",
                                                      "summarizing history to"),
                              level=decision.level.value, attempt=decision.attempt,
                              failure_kind=failure.kind.value, before_messages=before,
                              after_messages=before), turn)
        for event in learned_events:
            self._emit(event, turn)
        learned_events.clear()
        compacted_from, compactions = turn.compacted_from, self._compactions
        new = self._compact(start, target, max_tokens, turn, options=options, stream=stream)
        report = self._last_compaction
        size = measure(new) if report is not None and report.applied else None
        if size is None or size > target or report is None or not report.summarized_messages:
            # Undo the bookkeeping of a compaction that is not used.
            turn.compacted_from, self._compactions = compacted_from, compactions
            why = (report.rejected_reason if report is not None and report.rejected_reason
                   else f"the summary left {format_size(size or 0)}, over the target")
            return None, why
        if decision.inject_payload_notice:
            self._payload_notice_sent = True
        if notice_added:
            self._emit(NoticeInjected(message="ℹ SYSTEM NOTICE (payload limit hit) given to "
                                              "the model", notice="payload"), turn)
        return new, None

    def _refresh_provider(self) -> None:
        """Re-create the provider (and so its client) so a changed key is re-read."""
        refresh = getattr(self._provider, "refresh", None)
        if callable(refresh):
            refresh()
            return
        # A user's client or provider is theirs to fix; the emulator has no key to re-read.
        if not self._owns_provider or self._client is not None \
                or self.model.startswith("emulator"):
            return
        try:
            fresh = self._make_provider(self.model)
        except Exception as e:  # keep the old provider; the retry will report the failure
            warnings.warn(f"could not re-create the provider: {redact(str(e))}",
                          RuntimeWarning, stacklevel=2)
            return
        old, self._provider = self._provider, fresh
        closer = getattr(old, "close", None)
        if callable(closer):
            closer()


def _body_max_tokens(encoded: bytes, max_tokens: int | None) -> int | None:
    """The max_tokens the body carries: the one asked for, else the provider's own default."""
    if max_tokens is not None:
        return max_tokens
    found = _MAX_TOKENS_RE.search(encoded)
    return int(found.group(1)) if found else None


def _sentence(failure: Failure) -> str:
    """One clear sentence for a failure recovery could not save (secrets redacted)."""
    reason = failure.reason.strip().rstrip(".")
    return redact(f"{reason}.") if reason else redact(f"The request failed: {failure.label}.")
