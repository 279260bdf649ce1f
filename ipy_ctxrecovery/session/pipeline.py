"""Preparer: everything a request goes through before it is sent, one step per method.

    microcompact → tool-result budget → a summary prepared in the background swapped in
    (when one is ready and the history needs room) → pre-flight (exact body bytes;
    max_tokens fitted to the window) → compaction when over budget → fit to the known limits

The first two rewrite old messages, which breaks the provider's prompt cache from the first
one rewritten; they are batched (:meth:`Preparer.rewrites`, ``microcompact.rewrite_now``,
``docs/caching.md``): a rewrite of a message the previous request carried waits until it
clears enough tokens to pay for the cache it breaks, the cache has expired, or the request
would not fit without it. What was never sent (a new tool result) is shrunk at once.

:meth:`Preparer.prepare` maps a history to the history it would send and returns every
step it took as events (:class:`Prepared`); it sends nothing itself — the compactor it is
given may ask the model for a summary, and a dry run gives it a summarizer that does not.
A body that pre-flight already knows is too big is fitted here, never sent blind.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core import budget, caching, compactor, exact_count, ladder, microcompact, preflight
from ..core.budget import ResultStore
from ..core.events import (
    BudgetApplied,
    Event,
    FitBeforeSend,
    MaxTokensLowered,
    MicrocompactApplied,
    NoticeInjected,
)
from ..core.history import History, Message
from ..errors import ChatError
from ..failures import Failure, FailureKind
from ..providers.base import Request
from ..settings import Settings, format_size
from .compaction import SessionCompactor
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, Shrink, TurnLog

__all__ = ["Count", "Prepared", "Preparer", "Swap"]

PAUSES_KEPT = 20
"""The recent pauses between requests ``cache_retention`` "auto" judges by."""

Swap = Callable[[History, RequestSpec, TurnLog, Callable[[Event], None]], History]
Count = Callable[[Request], int | None]


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
        self.clock: Callable[[], float] = time.monotonic
        self._sent: History = ()
        """The history of the previous request prepared (what the provider has cached)."""
        self._sent_at: float | None = None
        self.last_rewrite: microcompact.RewriteDecision | None = None
        """The latest decision on pending rewrites (None: there were none)."""
        self.swap: Swap | None = None
        """Swaps in a summary prepared in the background when the history needs room
        (``background.py``); None: no background compaction (a dry run)."""
        self.count: Count | None = None
        """Asks the provider for a request's exact input tokens (exact pre-flight,
        ``core/exact_count.py``); None: never asked (a dry run, a provider that cannot)."""
        self.last_count: int | None = None
        """The input tokens the provider counted for the latest request prepared, as it
        was sent (None: estimated, or compacted after the count)."""
        self._counted: tuple[Request, int | None] | None = None
        self._previous: History = ()
        """``_sent`` as this request's preparation began: the request before it."""
        self._kept: tuple[History, History, int | None] | None = None
        self._gaps: deque[float] = deque(maxlen=PAUSES_KEPT)
        """Seconds between the recent requests prepared (for ``cache_retention`` "auto")."""
        self._sizes: deque[int] = deque(maxlen=PAUSES_KEPT + 1)
        """Estimated input tokens of the recent requests prepared."""
        self._retention = self._sent_retention = "auto"
        """The retention the request being prepared asks for, and the previous one's
        (``Caching.retention``)."""
        sizer.keep = self.keep
        sizer.retention = self.retention

    def follow(self, other: Preparer) -> None:
        """Continue after ``other``'s previous request (its history, when it was prepared,
        its clock): a dry run or a plan then batches rewrites as the session's next
        request will, not as a first request would (``docs/caching.md``)."""
        self._sent, self._sent_at, self.clock = other._sent, other._sent_at, other.clock
        self._gaps, self._sizes = deque(other._gaps, PAUSES_KEPT), deque(other._sizes,
                                                                          PAUSES_KEPT + 1)
        self._retention = self._sent_retention = other._retention

    def _emit(self, event: Event, log: TurnLog) -> None:
        self.bus.emit(event, log)

    def prepare(self, history: History, spec: RequestSpec, log: TurnLog) -> Prepared:
        start = len(log.events)
        self._previous = self._sent
        # Decided on the pauses before this one: after a pause the cache is cold, and the
        # switch to long entries is cheaper on the next, warm request (it writes only what
        # is new at the long price, not the whole prefix).
        self._sent_retention, self._retention = self._retention, self._decide_retention()
        if self._sent_at is not None:
            self._gaps.append(self.clock() - self._sent_at)
        for note in self.sizer.server.notes():
            self._emit(note, log)
        history = self.rewrites(history, spec, log)
        if self.swap is not None:
            history = self.swap(history, spec, log, lambda event: self._emit(event, log))
        history, spec, body = self.preflight(history, spec, log)
        self._sent, self._sent_at = history, self.clock()
        self._sizes.append(self.sizer.estimate(body))
        return Prepared(history, spec, body, tuple(log.events[start:]))

    def retention(self) -> str:
        """The cache retention the request being prepared asks for (``Caching.retention``),
        as decided when its preparation began."""
        return self._retention

    def _decide_retention(self) -> str:
        """The ``cache_retention`` setting for the next request: "long" or "short" as set;
        "auto" on Anthropic's own service (and the emulator) is "long" once the recent
        pauses make one-hour entries the cheaper (``caching.long_ttl_pays``), else "short";
        elsewhere "auto" (the provider's default)."""
        choice = self.settings.cache_retention
        endpoint = self.sizer.endpoint
        if choice != "auto" or getattr(endpoint.provider, "wire", None) != "anthropic" \
                or not endpoint.on_own_service:
            return choice
        if not self._sizes:
            return "short"
        sizes = list(self._sizes)
        growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False) if b > a]
        written = sum(growth) / len(growth) if growth else sizes[-1]
        return "long" if caching.long_ttl_pays(tuple(self._gaps), sizes[-1], written) \
            else "short"

    def cache_life(self) -> float:
        """Seconds the previous request's cache lives unused: the short retention's
        ``cache_ttl_seconds``, or the long one's (an hour on Anthropic, a day on OpenAI
        where the model takes it). OpenAI's default ("auto": nothing sent) is a day for
        an organization without zero data retention and minutes with it; not knowing
        which, the session takes the cache for warm and does not rewrite on a guess."""
        provider = self.sizer.endpoint.provider
        wire = getattr(provider, "wire", None)
        if self._sent_retention == "long" or (wire == "openai"
                                              and self._sent_retention == "auto"):
            life = caching.long_life(wire, provider.model)
            if life is not None:
                return life
        return self.settings.cache_ttl_seconds

    def keep(self, history: History) -> int | None:
        """The leading messages of ``history`` that later requests are expected to carry
        unchanged, for the cache breakpoint after them (``Caching.keep``, Anthropic's wire):
        up to the first message a batched rewrite may still change
        (``microcompact.settled``), and no further than what the previous request carried
        as it is — so the request that rewrites reads the prefix before the rewrite, and
        the requests between two batches keep reading the part no batch touches.
        None where nothing may change but by appending."""
        if getattr(self.sizer.endpoint.provider, "wire", None) != "anthropic":
            return None
        kept = self._kept
        if kept is not None and kept[0] is history and kept[1] is self._previous:
            return kept[2]
        value = microcompact.settled(history, settings=self.settings)
        previous = self._previous
        if previous:
            shared = _first_change(previous, history)
            if shared < len(previous):
                value = shared if value is None else min(value, shared)
        self._kept = (history, previous, value)
        return value

    # -- batched rewrites ------------------------------------------------------------------
    def rewrites(self, history: History, spec: RequestSpec, log: TurnLog) -> History:
        """Microcompact and the tool-result budget, applied now or left pending.

        Rewrites that only touch messages the previous request did not carry are free and
        applied; the others wait unless ``microcompact.rewrite_now`` says their time has
        come (see the module docstring). Meanwhile a result never sent still gets the
        budget's limits.
        """
        s = self.settings
        candidate, _ = microcompact.microcompact(history, settings=s, store=self.store)
        candidate, _ = budget.enforce_budget(
            candidate, store=self.store, turn_budget_chars=s.turn_budget_chars,
            per_result_max_chars=s.per_result_max_chars, head_chars=s.budget_head_chars,
            tail_chars=s.budget_tail_chars)
        self.last_rewrite = None
        if candidate is history:
            return history
        first = _first_change(history, candidate)
        sent = self._sent_prefix(history)
        decision = microcompact.rewrite_now(
            freed_tokens=self.sizer.estimate(max(0, self._size(history[first:])
                                                 - self._size(candidate[first:]))),
            broken_tokens=self.sizer.estimate(self._size(history[first:sent])),
            idle_seconds=None if self._sent_at is None else self.clock() - self._sent_at,
            shrink_due=False, settings=s, cache_life=self.cache_life())
        if not decision.rewrite and self.shrink_due(history, spec):
            decision = microcompact.RewriteDecision(True, "fit")
        self.last_rewrite = decision
        if decision.rewrite:
            return self.budget(self.microcompact(history, log), log)
        return self.unsent_budget(history, sent, log)

    def shrink_due(self, history: History, spec: RequestSpec) -> bool:
        """Whether ``history`` as it is would be compacted or fitted by pre-flight (over the
        compaction trigger, the window or a payload limit): then pending rewrites go first."""
        sizer, limits = self.sizer, self.sizer.limits
        body = sizer.measure(history, spec)
        if sizer.server.compacts():
            # The server keeps the window: only a known hard limit makes the body shrink.
            return self._over_hard_limit(body, sizer.reserved_tokens(spec))
        pf = preflight.check(body, settings=self.settings, caps=limits.caps,
                             estimator=limits.tokens, window_tokens=sizer.window,
                             max_tokens=sizer.reserved_tokens(spec), warned=True,
                             window_known=sizer.window_known, chat_budget=sizer.chat_budget())
        return pf.action == "compact" or body > sizer.compaction_trigger(pf.budget_ratio)

    def _over_hard_limit(self, body: int, reserved: int | None) -> bool:
        """Whether ``body`` is over the payload cap in force or, with its answer, over a
        known window (what :meth:`fit_known_limits` fits to)."""
        sizer = self.sizer
        cap = sizer.limits.caps.effective()
        return (cap is not None and body > cap) or (
            sizer.window_known and sizer.estimate(body) + (reserved or 0) > sizer.window)

    def unsent_budget(self, history: History, sent: int, log: TurnLog) -> History:
        """The tool-result budget on the messages after the first ``sent`` only."""
        budgeted, report = self._enforce_budget(history)
        if not report.replaced:
            return history
        merged = history[:sent] + budgeted[sent:]
        changed = [m for old, m in zip(history, merged, strict=True) if m is not old]
        if not changed:
            return history
        paths = []
        for m in changed:
            info = budget.compaction_info(m)
            if info is not None and info.path is not None and str(info.path) not in paths:
                paths.append(str(info.path))
        self._emit(BudgetApplied(replaced=len(changed), persisted=tuple(paths)), log)
        return merged

    def _sent_prefix(self, history: History) -> int:
        """How many leading messages of ``history`` the previous request carried as they are."""
        n = 0
        for old, new in zip(self._sent, history, strict=False):
            if old is not new and old != new:
                break
            n += 1
        return n

    def _size(self, messages: Sequence[Message]) -> int:
        part = self.sizer.part_size
        if part is not None:
            return sum(part(m) for m in messages)
        return sum(len(m.text.encode("utf-8", errors="surrogatepass")) for m in messages)

    # -- the steps ---------------------------------------------------------------------------
    def microcompact(self, history: History, log: TurnLog) -> History:
        compacted, report = microcompact.microcompact(history, settings=self.settings,
                                                      store=self.store)
        if not (report.truncated or report.summarized):
            return history
        self._emit(MicrocompactApplied(truncated=report.truncated, summarized=report.summarized,
                                       bytes_freed=report.bytes_freed), log)
        return compacted

    def _enforce_budget(self, history: History) -> tuple[History, budget.BudgetReport]:
        s = self.settings
        return budget.enforce_budget(
            history, store=self.store, turn_budget_chars=s.turn_budget_chars,
            per_result_max_chars=s.per_result_max_chars, head_chars=s.budget_head_chars,
            tail_chars=s.budget_tail_chars)

    def budget(self, history: History, log: TurnLog) -> History:
        budgeted, report = self._enforce_budget(history)
        if not report.replaced:
            return history
        self._emit(BudgetApplied(replaced=report.replaced,
                                 persisted=tuple(str(p) for p in report.persisted)), log)
        return budgeted

    def preflight(self, history: History, spec: RequestSpec,
                  log: TurnLog) -> tuple[History, RequestSpec, int]:
        """Check the request can fit at all, reserve room for the answer, measure the exact
        body, check it (SPEC §2), compact when over."""
        sizer, limits = self.sizer, self.sizer.limits
        self.check_request_fits(history, spec)
        asked = spec.max_tokens is not None
        requested = self.reserve_answer(history, spec, log, asked=asked)
        request = sizer.request(history, requested)
        body = sizer.prepare(request).size   # exact, not encoded
        counted = self.exact_count(request, body, sizer.reserved_tokens(requested))
        # A counted body is judged against the chat budget in its own tokens.
        exact = body / counted if counted else None
        spec = self.fit_max_tokens(body, requested, log, asked=asked, counted=counted)
        reserve = sizer.reserved_tokens(spec)
        pf = preflight.check(body, settings=self.settings, caps=limits.caps,
                             estimator=limits.tokens, window_tokens=sizer.window,
                             max_tokens=reserve, warned=limits.warned_no_cap,
                             window_known=sizer.window_known,
                             chat_budget=sizer.chat_budget(bytes_per_token=exact),
                             counted=counted)
        if pf.warned:
            limits.warned_no_cap = True
        compacts = sizer.server.compacts()
        event = pf.event()
        self._emit(dataclasses.replace(event, server_compacts=True) if compacts else event, log)
        if compacts:
            return self.fit_for_server(history, body, reserve, requested, spec, log,
                                       asked=asked)
        trigger = sizer.compaction_trigger(pf.budget_ratio, bytes_per_token=exact)
        if pf.action != "compact" and body <= trigger:
            return history, spec, body
        target = self.sizer.compaction_target(pf.budget_ratio)
        compacted, report = self.compactor.run(history, target, spec, log)
        if report.applied:
            log.shrinks.append(Shrink("compaction", history, len(compacted)))
            body = sizer.measure(compacted, spec)
        fitted = self.fit_known_limits(compacted, body, reserve, spec, target, log,
                                       after_compaction=report.applied)
        if fitted is not history:
            return self.refit_answer(fitted, requested, log, asked=asked)
        return fitted, spec, body

    def refit_answer(self, history: History, requested: RequestSpec, log: TurnLog, *,
                     asked: bool) -> tuple[History, RequestSpec, int]:
        """The answer's reservation again for ``history``, which compaction or a fit made
        from the one first measured: counted exactly where the new body is near the window
        (:meth:`exact_count`: the estimate is a few percent off, and a body just over the
        window with its answer is a rejection), the max_tokens lowered for the first body
        larger again where there is room now (never above what was reserved)."""
        sizer = self.sizer
        body = sizer.measure(history, requested)
        counted = self.exact_count(sizer.request(history, requested), body,
                                   sizer.reserved_tokens(requested))
        spec = self.fit_max_tokens(body, requested, log, asked=asked, counted=counted)
        return history, spec, body

    def exact_count(self, request: Request, body: int, reserve: int | None) -> int | None:
        """The provider's exact count of ``request``'s input tokens when its estimate is
        near the window budget (``core/exact_count.plan_count``) and the provider can count;
        else None (the estimate decides). At most one count request per send: the count of
        an equal request is reused. A count calibrates bytes/token as a reply's usage does."""
        sizer, limits, s = self.sizer, self.sizer.limits, self.settings
        self.last_count = None
        cap, window = limits.caps.effective(), sizer.enforced_window
        # What compacts the request whatever its tokens: the cap's shares (bytes alone).
        over_cap = cap is not None \
            and body > min(s.preflight_cap_fraction, s.cap_budget_fraction) * cap
        plan = exact_count.plan_count(
            sizer.estimate(body), window=window, reserve=reserve,
            margin=s.exact_count_margin, can_count=self.count is not None,
            compacts_anyway=over_cap,
            chat_budget=math.floor(window * s.chat_budget_ratio) if window else None)
        if not plan.ask or self.count is None:
            return None
        memo = self._counted
        if memo is not None and memo[0] == request:
            counted = memo[1]
        else:
            counted = exact_count.conclude(self.count(request))
            self._counted = (request, counted)
            if counted is not None:
                limits.tokens.calibrate(body, counted)
        self.last_count = counted
        return counted
    def fit_for_server(self, history: History, body: int, reserve: int | None,
                       requested: RequestSpec, spec: RequestSpec, log: TurnLog, *,
                       asked: bool) -> tuple[History, RequestSpec, int]:
        """Pre-flight while the server compacts (``docs/server-compaction.md``): no LLM
        summary and no trim — over the chat budget the server compacts (the request
        carries its trigger). Only a body over a known hard limit — the payload cap in
        force, or the window with the answer's reservation — is fitted, by
        :meth:`fit_known_limits` aimed just under that limit (not at the compaction
        target): tool results become previews of their saved files first, then the
        oldest units go (the system prompt, the pinned rules and the server's compaction
        message stay). A proxy's cap is not the server's business."""
        if not self._over_hard_limit(body, reserve):
            return history, spec, body
        fitted = self.fit_known_limits(history, body, reserve, spec, compactor.NO_LIMIT, log,
                                       after_compaction=False)
        if fitted is history:
            return history, spec, body
        return self.refit_answer(fitted, requested, log, asked=asked)

    def check_request_fits(self, history: History, spec: RequestSpec) -> None:
        """Refuse, before anything is compacted, a request that cannot fit even with every
        earlier message removed: its system prompt and latest message, with the smallest
        answer, over the window (said in tokens) or over a payload limit the proxy proved
        or the user configured (said in bytes)."""
        sizer, caps = self.sizer, self.sizer.limits.caps
        size, tokens = sizer.request_alone(history, spec)
        window, floor = sizer.enforced_window, self.settings.min_answer_tokens
        if window is not None and tokens + floor > window:
            reason = (f"Your message is ≈{tokens:,} tokens with the system prompt; the "
                      f"model's context window is {window:,} tokens and at least {floor:,} "
                      "must stay for the answer — send a shorter message (a tool can read "
                      "large content in ranges) or use a model with a larger window.")
            raise ChatError(Failure(FailureKind.CONTEXT_OVERFLOW, reason, prompt_tokens=tokens,
                                    limit_tokens=window, request_bytes=size), reason)
        proven = caps.smallest_rejected - 1 if caps.smallest_rejected is not None else None
        limits = [(proven, "the proxy/gateway rejected larger ones"),
                  (caps.configured, "the configured payload cap")]
        for limit, why in limits:
            if limit is not None and size > limit:
                fix = ("%chat forget-limits if the proxy/gateway limit was raised since"
                       if limit == proven else
                       "raise the limit with %chat config CHATCLI_MAX_PAYLOAD=SIZE if the "
                       "proxy/gateway allows more")
                reason = (f"Your message makes the request {format_size(size)} with the system "
                          f"prompt, more than {format_size(limit)} ({why}) — send a shorter "
                          f"message (a tool can read large content in ranges), or {fix}.")
                raise ChatError(Failure(FailureKind.PAYLOAD_TOO_LARGE, reason,
                                        request_bytes=size), reason)

    def reserve_answer(self, history: History, spec: RequestSpec, log: TurnLog, *,
                       asked: bool) -> RequestSpec:
        """The answer's reservation, bounded so the request itself always has room.

        A provider's default reservation (Anthropic always sends one) is at most half the
        enforced window; any reservation at most what the window leaves beside the system
        prompt and the latest message (never below ``min_answer_tokens``). So a small or
        learned window lowers ``max_tokens`` first, and a message is only ever called too
        big when it is (:meth:`check_request_fits`).
        """
        sizer = self.sizer
        reserved = sizer.reserved_tokens(spec)
        window = sizer.enforced_window
        if reserved is None or window is None:
            return spec
        bound = reserved
        if not asked:
            bound = min(bound, max(self.settings.min_answer_tokens, window // 2))
        room = sizer.answer_room(history, spec)
        if room is not None:
            bound = min(bound, room)
        if bound >= reserved:
            return spec
        if asked:
            _, tokens = sizer.request_alone(history, spec)
            self._emit(MaxTokensLowered(requested=reserved, sent=bound, reason="window",
                                        est_tokens=tokens, window=window), log)
        return spec.with_max_tokens(bound)

    def fit_max_tokens(self, body: int, spec: RequestSpec, log: TurnLog, *,
                       asked: bool, counted: int | None = None) -> RequestSpec:
        """Lower max_tokens before sending when prompt + answer cannot fit the window.

        The reservation the body carries (asked for, or the provider's default) is lowered
        to what the window leaves beside this body — unless that is below
        ``min_answer_tokens``: then the history is what must shrink (compaction), not the
        answer. A reservation above a learned output limit is lowered to it.
        """
        sizer = self.sizer
        requested = sizer.reserved_tokens(spec)
        if requested is None:
            return spec
        est = counted if counted is not None else sizer.estimate(body)
        window = sizer.window
        limit = sizer.limits.output_limit
        if limit is not None and requested > limit:
            # The provider rejected a larger max_tokens earlier in this session.
            self._emit(MaxTokensLowered(requested=requested, sent=limit, reason="output_limit",
                                        est_tokens=est, window=window), log)
            requested = limit
            spec = spec.with_max_tokens(limit)
        room = window - est
        if not sizer.window_known or est + requested <= window:
            return spec
        fitted = room - math.ceil(max(room, 0) * self.settings.exact_fit_margin)
        if fitted < self.settings.min_answer_tokens or fitted >= requested:
            return spec
        if asked:
            self._emit(MaxTokensLowered(requested=requested, sent=fitted, reason="window",
                                        est_tokens=est, window=window), log)
        # (the provider's own default adjusted: no news for the user)
        return spec.with_max_tokens(fitted)

    def fit_known_limits(self, history: History, body: int, reserve: int | None,
                         spec: RequestSpec, target: int, log: TurnLog, *,
                         after_compaction: bool) -> History:
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
        # The hard limit: a payload size proven to fail or the configured cap (the user
        # said the proxy takes no more), else the window's (an estimate, given the
        # exact-fit margin by the ladder).
        configured = caps.configured
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
            settings=self.settings, store=self.store, measure=sizer.measurer(spec),
            part=sizer.part_size)
        if result.level is ladder.Level.GIVE_UP:
            if rejected is not None and body >= rejected:
                reason = result.give_up_reason or (
                    f"The request is {format_size(body)}, at least the {format_size(rejected)} the "
                    "proxy/gateway already rejected.")
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
        self._emit(FitBeforeSend(body_bytes=body, goal_bytes=goal,
                                 over="cap" if over_cap else "window", cap=cap,
                                 cap_source=caps.source, est_tokens=est,
                                 reserved_tokens=reserved, window=window,
                                 notes=tuple(result.notes),
                                 after_compaction=after_compaction), log)
        if result.compaction_notice_added:
            self._emit(NoticeInjected(notice="compaction"), log)
        log.shrinks.append(Shrink("fit", history, len(result.history)))
        return result.history


def _first_change(before: History, after: History) -> int:
    """The index of the first message ``after`` differs in (its length when none)."""
    for i, (old, new) in enumerate(zip(before, after, strict=False)):
        if old is not new and old != new:
            return i
    return min(len(before), len(after))
