"""BackgroundCompactor: the summary prepared ahead of need, swapped in when a turn needs room.

Anthropic documents *background compaction*: ask for the summary while the conversation
goes on with its full history, then swap the summary in for exactly the messages it
covered. Here (issue 29):

* **Prepare early.** After a turn, when the working history passes
  ``prepare_summary_ratio`` × the compaction trigger (``background_compaction`` on), a
  worker thread compacts a *snapshot* of it. It aims where a compaction at the trigger
  would land: the same oldest messages go, so the snapshot's target is its size less the
  ``trigger − target`` a compaction at the trigger would remove. The worker runs the
  session's own compactor (the summary requests go through the recovery flow and every
  limit) with a private event bus: nothing is printed from the worker — in terminal
  IPython its line would land in the user's typing — and its events wait for the next turn.
  One job at a time per session.
* **Never alongside a turn.** A turn (or any command that changes the history) first waits
  for a job still in flight: at most the summary request already sent, since the user
  usually thinks longer than a summary takes (``bench/latency.py``). An interrupt during
  that wait cancels the job; the history is as it was.
* **Swap at the turn that needs room.** When the history about to be sent is over the
  trigger and starts with the snapshot (each message the same, except tool results that
  microcompact or the result budget rewrote since: same call, shorter text), the
  snapshot's compacted form replaces it and everything appended since stays after it.
  A history that no longer starts with the snapshot (reset, undo, an edit, a recovery that
  cut it) discards the summary. A history that still fits goes on in full; the summary
  waits.
* **Never worse than today.** No summary ready, or one that was discarded: the turn
  compacts as before. A failed or refused background summary is one line at the next
  turn, never a failed cell, and is not tried again until the history has grown by half
  the way from the threshold to the trigger (a model that cannot summarize is not asked on
  every turn).

The core decides nothing here that it does not decide for a turn: the compaction is
``SessionCompactor.run``; this module owns the thread, the snapshot check and the events.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..core.compactor import CompactionReport
from ..core.events import BackgroundSummary, CompactionPhase, Event
from ..core.history import History, Message, Role, latest_user_index
from ..settings import Settings
from .compaction import SessionCompactor
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, Shrink, TurnLog

__all__ = ["BackgroundCompactor", "Prepared", "same_message", "starts_with"]

State = Literal["idle", "preparing", "ready", "failed"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A finished background compaction of ``base`` into ``compacted``."""

    base: History
    compacted: History
    report: CompactionReport
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _billed(log: TurnLog, **fields: Any) -> BackgroundSummary:
    """A ``BackgroundSummary`` with what the worker's summary requests were billed."""
    return BackgroundSummary(prompt_tokens=log.prompt_tokens,
                             completion_tokens=log.completion_tokens,
                             cached_tokens=log.cached_tokens,
                             cache_write_tokens=log.cache_write_tokens,
                             cache_write_1h_tokens=log.cache_write_1h_tokens, **fields)


def same_message(a: Message, b: Message) -> bool:
    """Whether ``b`` is ``a`` as the session may have rewritten it since: equal, or the same
    tool result made shorter (microcompact's preview or one-liner, the result budget)."""
    if a == b:
        return True
    if a.role is Role.TOOL and b.role is Role.TOOL and a.tag == b.tag:
        ra, rb = a.tool_result, b.tool_result
        return ra is not None and rb is not None and ra.call_id == rb.call_id \
            and len(rb.content) <= len(ra.content)
    return False


def starts_with(history: History, base: History) -> bool:
    """Whether ``history`` begins with every message of ``base`` (see :func:`same_message`)."""
    return len(history) >= len(base) and all(
        same_message(a, b) for a, b in zip(base, history, strict=False))


def _has_an_exchange_to_summarize(history: History) -> bool:
    """Whether a real user message (not a notice or a summary) comes before the latest
    request: a summary of the package's own notices alone is not worth a request."""
    latest = latest_user_index(history)
    return latest is not None and any(
        m.role is Role.USER and m.tag is None for m in history[:latest])


class BackgroundCompactor:
    """One session's background summary: start it, wait for it, swap it in."""

    def __init__(self, sizer: RequestSizer, settings: Settings,
                 make_compactor: Callable[[EventBus], SessionCompactor]) -> None:
        self.sizer = sizer
        self.settings = settings
        self._make_compactor = make_compactor
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._ready: Prepared | None = None
        self._failed: str | None = None
        self._pending: list[Event] = []     # told at the next turn, from its thread
        self._calibrations: list[tuple[int, int | None, int | None]] = []
        """The usage of answered summary requests, taken into the token calibration at the
        next turn (from its thread), so what a card and the status say does not move."""
        self.jobs = 0                       # background summaries started (for tests/bench)
        self._listeners: list[Callable[[str], None]] = []
        self._size_now = 0                  # the history size of the job in flight
        self._failed_at: int | None = None  # the history size a summary last failed at
        self._last_size = 0                 # the history after the previous turn (bytes)

    def listen(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(state)`` from the worker when its job ends."""
        self._listeners.append(callback)

        def stop() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return stop

    def _ended(self) -> None:
        state = self.state
        for callback in list(self._listeners):
            try:
                callback(state)
            except Exception as e:  # a display's trouble is not the job's, nor unnoticed
                warnings.warn(f"background-summary listener {callback!r} raised "
                              f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)

    # -- what the panel and the plan read ---------------------------------------------------
    @property
    def state(self) -> State:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return "preparing"
            if self._ready is not None:
                return "ready"
            return "failed" if self._failed is not None else "idle"

    def threshold(self) -> int | None:
        """The history size (request bytes) past which a summary is prepared; None: off."""
        if not self.settings.background_compaction or self.sizer.server.compacts():
            return None     # off, or the server compacts: no summary of the package's own
        trigger = self.sizer.compaction_trigger()
        if trigger >= 2 ** 61:      # neither a window nor a cap is known: never compacts
            return None
        return int(trigger * self.settings.prepare_summary_ratio)

    # -- after a turn ---------------------------------------------------------------------
    def after_turn(self, history: History, spec: RequestSpec) -> bool:
        """Start preparing a summary of ``history`` if it passed the threshold and no job
        covers it yet; returns whether one was started."""
        threshold = self.threshold()
        if threshold is None:
            return False
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            if self._ready is not None and starts_with(history, self._ready.base):
                return False    # still good for this history: keep it
        if not _has_an_exchange_to_summarize(history):
            return False        # only notices before the latest request: nothing to gain
        size = self.sizer.measure(history, spec)
        previous, self._last_size = self._last_size, size
        trigger = self.sizer.compaction_trigger()
        if size < threshold or size > trigger:
            return False        # not yet worth it, or the next turn compacts anyway
        if self._failed_at is not None and \
                self._failed_at <= size < self._failed_at + (trigger - threshold) // 2:
            return False        # it failed on nearly this history: not again every turn
        # The same oldest messages a compaction at the trigger would replace, and one turn's
        # growth more: the swap comes at the first turn past the trigger, not at it.
        growth = max(0, size - previous) if previous else 0
        target = max(1, size - (trigger - self.sizer.compaction_target()) - growth)
        self._cancel.clear()
        with self._lock:
            self._ready, self._failed = None, None
            self._size_now = size
            self._pending.append(BackgroundSummary(state="preparing",
                                                   before_messages=len(history),
                                                   before_bytes=size))
            self.jobs += 1
            self._thread = threading.Thread(
                target=self._work, args=(history, target, spec),
                name="ipy_ctxrecovery-background-summary", daemon=True)
            self._thread.start()
        return True

    def _work(self, history: History, target: int, spec: RequestSpec) -> None:
        try:
            self._job(history, target, spec)
        finally:
            if threading.current_thread() is self._thread:
                self._thread = None     # ended: the state is what the job left
            self._ended()

    def _job(self, history: History, target: int, spec: RequestSpec) -> None:
        log = TurnLog()
        compactor = self._make_compactor(EventBus())
        try:
            new, report = compactor.run(history, target, spec, log,
                                        should_cancel=self._cancel.is_set)
        except KeyboardInterrupt:
            with self._lock:
                self._failed = "cancelled"
            return
        except Exception as e:  # a background summary never fails a cell: one line later
            why = f"{type(e).__name__}: {e}"
            with self._lock:
                self._failed, self._failed_at = why, self._size_now
                self._pending.append(BackgroundSummary(state="failed", reason=why,
                                                       before_messages=len(history)))
            return
        with self._lock:
            if self._cancel.is_set():
                self._failed = "cancelled"
                return
            # What the summary requests showed (a cap learned, a retry) is told too.
            self._pending.extend(e for e in log.events if not isinstance(e, CompactionPhase))
            if not report.applied or not report.summarized_messages:
                self._failed = report.rejected_reason or "nothing to summarize"
                self._failed_at = self._size_now
                self._pending.append(_billed(
                    log, state="failed", reason=self._failed, before_messages=len(history)))
                return
            self._ready = Prepared(history, new, report, log.prompt_tokens,
                                   log.completion_tokens)
            self._failed_at = None
            self._pending.append(_billed(
                log, state="ready", covered_messages=report.summarized_messages,
                before_messages=report.before_messages, after_messages=report.after_messages,
                before_bytes=report.before_bytes, after_bytes=report.after_bytes))

    # -- before a turn or a command ---------------------------------------------------------
    def wait(self, timeout: float | None = None) -> None:
        """Wait for a job in flight (never alongside a turn); an interrupt cancels it."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        try:
            thread.join(timeout)
        except KeyboardInterrupt:
            self.discard()
            raise

    def discard(self) -> None:
        """Cancel a job in flight (after its current request) and forget a ready summary:
        the history changed by other means (reset, undo, compact, new settings)."""
        self._cancel.set()
        self._failed_at = None
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()
        with self._lock:
            if self._ready is not None:
                self._pending.append(BackgroundSummary(
                    state="discarded", covered_messages=self._ready.report.summarized_messages,
                    reason="the history changed"))
            self._ready = None
            self._thread = None

    def take_events(self) -> list[Event]:
        """What the worker has to say, for the turn that is starting to tell; the usage its
        requests reported goes into the token calibration now."""
        with self._lock:
            out, self._pending = self._pending, []
            calibrations, self._calibrations = self._calibrations, []
        for body, prompt, completion in calibrations:
            self.sizer.limits.on_success(body, prompt, completion)
        return out

    def calibration(self, body: int, prompt: int | None, completion: int | None) -> None:
        """A summary request of the worker's was answered (kept for :meth:`take_events`)."""
        with self._lock:
            self._calibrations.append((body, prompt, completion))

    def swap(self, history: History, spec: RequestSpec, log: TurnLog,
             tell: Callable[[Event], None]) -> History:
        """``history`` with the prepared summary swapped in, when it needs room and starts
        with the summary's snapshot; else ``history`` (a stale summary is discarded)."""
        with self._lock:
            ready = self._ready
        if ready is None or self.sizer.server.compacts():
            return history      # (the server compacts: a summary prepared before waits)
        if not starts_with(history, ready.base):
            with self._lock:
                self._ready = None
            tell(BackgroundSummary(state="discarded",
                                   covered_messages=ready.report.summarized_messages,
                                   reason="the messages it covered changed"))
            return history
        size = self.sizer.measure(history, spec)
        if size <= self.sizer.compaction_trigger():
            return history      # still fits: the turn goes on in full, the summary waits
        swapped = ready.compacted + history[len(ready.base):]
        after = self.sizer.measure(swapped, spec)
        with self._lock:
            self._ready = None
        target = self.sizer.compaction_target()
        if after > target + (self.sizer.compaction_trigger() - target) // 2:
            # The history grew past what the summary was prepared for (a big paste): it
            # would leave the history near the trigger, and the next turn would compact
            # again. This turn compacts as before instead, so there are no more summaries.
            tell(BackgroundSummary(state="discarded",
                                   covered_messages=ready.report.summarized_messages,
                                   reason="it covers too little of what the history grew to"))
            return history
        log.shrinks.append(Shrink("compaction", history, len(swapped)))
        tell(BackgroundSummary(state="swapped",
                               covered_messages=ready.report.summarized_messages,
                               before_messages=len(history), after_messages=len(swapped),
                               before_bytes=size, after_bytes=after))
        return swapped
