"""The turn card: a static record of one ``%%chat`` turn, written once when the turn ends.

:class:`TurnRecord` reads a turn's typed events (and its streamed text) into an ordered
list of :class:`Step` s — pre-flight, microcompact, budget, compaction, fit, each send,
each recovery step, what was learned, continuations — with their status. It is the one
reading of a turn's events: :class:`TurnCard` renders it as ``text/html`` + ``text/plain``
(no widget, so a saved notebook, GitHub and nbconvert show it as it was), and the live
panel (``panel.py``) projects the same record onto its step tracker. Every phrase comes
from :mod:`..wording`; nothing here imports IPython.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core import events as ev
from ..core import prices, theme
from ..core import wording as w
from ..failures import Failure
from ..providers.base import Usage

__all__ = ["CARD_MODES", "NO_MATH", "Step", "TurnCard", "TurnRecord", "card_wanted"]

CARD_MODES = ("auto", "always", "never")
"""``ChatMagics.turn_card``: ``auto`` writes a card when something happened beyond a
routine send (a compaction, a recovery, a failure...), ``always`` for every turn."""

Status = Literal["running", "done", "failed", "cancelled", "skipped", "info"]

#: Steps that run on every turn: a turn with only these had nothing to tell (``auto``).
_ROUTINE = ("preflight", "send")


@dataclass
class Step:
    """One step of a turn: its stage (a key of :data:`~..wording.STAGE_NAMES`), status and
    the events it was read from (the first one names it)."""

    stage: str
    status: Status
    events: list[ev.Event]
    failure: Failure | None = None
    """Why a send failed (the failure the next event reported)."""
    not_used: ev.LadderStep | None = None
    """For a recovery step that tried a summary: the step saying it was not used."""
    streamed_tokens: int = 0
    note: str = ""
    """Said after the detail (a compaction's cost against what it saves)."""

    @property
    def name(self) -> str:
        first = self.events[0]
        if isinstance(first, ev.LadderStep):
            return w.ladder_name(first)
        if isinstance(first, ev.ToolRun):
            return f"tool {first.name}" if not first.limit_reached else "tools"
        return w.STAGE_NAMES[self.stage]

    @property
    def detail(self) -> str:
        first = self.events[0]
        if isinstance(first, ev.Sending):
            return w.send_detail(first, status=self.status, failure=self.failure,
                                 streamed_tokens=self.streamed_tokens)
        if isinstance(first, ev.CompactionPhase):
            # The note says the summary's tokens, split in and out: not twice.
            detail = w.compaction_detail([e for e in self.events
                                          if isinstance(e, ev.CompactionPhase)],
                                         tokens=not self.note)
            return f"{detail} · {self.note}" if self.note else detail
        if isinstance(first, ev.LadderStep):
            # The step's announcement, or what it did once that is known (its outcome).
            latest = [e for e in self.events if isinstance(e, ev.LadderStep)][-1]
            detail = w.ladder_detail(latest, not_used=self.not_used,
                                     done=self.status == "done")
            if self.status == "cancelled":
                detail += " · cancelled"
            return detail
        if isinstance(first, ev.Preflight):   # the sizes are on their own lines
            return w.preflight_verdict(first)
        if isinstance(first, ev.Failed):
            return first.sentence
        detail = _DETAILS[type(first)](first)
        return f"{detail} · {self.note}" if self.note else detail

    @property
    def glyph(self) -> str:
        return w.STATUS_GLYPHS[self.status]


_DETAILS: dict[type, Callable[[Any], str]] = {
    ev.MaxTokensLowered: w.answer_size_detail,
    ev.ThinkingFitted: w.answer_size_detail,
    ev.MicrocompactApplied: w.microcompact_detail,
    ev.BudgetApplied: w.budget_detail,
    ev.FitBeforeSend: w.fit_detail,
    ev.CapChanged: w.cap_detail,
    ev.WindowLearned: w.window_detail,
    ev.NoticeInjected: w.notice_detail,
    ev.Retrying: w.retry_detail,
    ev.ToolRun: w.tool_detail,
    ev.Escalation: w.continuation_detail,
    ev.Truncated: w.continuation_detail,
    ev.BackgroundSummary: w.background_detail,
    ev.ServerCompacted: w.server_compacted_detail,
    ev.ServerCompactionNote: w.server_note_detail,
}

_STAGES: dict[type, str] = {
    ev.MaxTokensLowered: "answer_size", ev.ThinkingFitted: "answer_size",
    ev.MicrocompactApplied: "microcompact",
    ev.BudgetApplied: "budget", ev.FitBeforeSend: "fit", ev.CapChanged: "cap",
    ev.WindowLearned: "window", ev.NoticeInjected: "notice", ev.Retrying: "retry",
    ev.ToolRun: "tool", ev.Escalation: "continuation", ev.Truncated: "continuation",
    ev.BackgroundSummary: "background",
    ev.ServerCompacted: "server_compaction", ev.ServerCompactionNote: "server_compaction",
}


def _estimate(size: int) -> int:
    return (size + 3) // 4


@dataclass
class TurnRecord:
    """What one turn did, read from its events as they arrive (see the module docstring).

    ``estimate``: bytes → tokens for the streamed answer (the session's calibrated
    estimator). ``cap``/``cap_source``/``window`` start from the session's status and
    follow the events.
    """

    session: str = "default"
    estimate: Callable[[int], int] = _estimate
    cap: int | None = None
    cap_source: str | None = None
    window: int | None = None
    steps: list[Step] = field(default_factory=list)
    before: ev.Preflight | None = None
    after: ev.TurnFinished | None = None
    failed: ev.Failed | None = None
    recovered: int = 0
    cancelled: bool = False
    body_bytes: int | None = None
    """The size of the latest request (measured, sent or fitted), for the live bar."""
    est_tokens: int | None = None
    """Its tokens when an event counted them (None: estimate from ``body_bytes``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed: float | None = None
    kept_messages: int | None = None
    """A failed or cancelled turn: the messages of the working history it left as it was."""
    cell: int | None = None
    """The notebook cell that ran the turn (its execution count), when one did."""
    ended_at: float | None = None
    """When the turn ended (seconds since the epoch): with ``cell``, which turn it was."""
    model: str = ""
    """The session's model, for the price of what the turn used (``core/prices.py``)."""
    prices: str | None = None
    """The session's ``prices`` setting (the user's overrides)."""
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    _streamed: int = 0

    # -- reading events ---------------------------------------------------------------------
    def feed(self, event: ev.Event) -> None:
        """Session event callback: take ``event`` into the record."""
        if isinstance(event, ev.Preflight):
            self.before = self.before or event
            self.body_bytes, self.window = event.body_bytes, event.window
            self.est_tokens = event.est_tokens
            self.cap, self.cap_source = event.cap, event.cap_source or self.cap_source
            self._add("preflight", "done", event)
        elif isinstance(event, ev.Sending):
            self._close_running_ladder("done")
            self.body_bytes, self.est_tokens, self._streamed = event.body_bytes, None, 0
            self._add("send", "running", event)
        elif isinstance(event, ev.CompactionPhase):
            self._compaction(event)
        elif isinstance(event, ev.LadderStep):
            self._close_send("failed", event.failure)
            # A step is announced, then (when it changed the history) its outcome follows,
            # for the same decision: one recovery step, updated.
            same = next((st for st in self.steps if st.stage == "recovery"
                         and isinstance(st.events[0], ev.LadderStep)
                         and st.events[0].decision is event.decision), None)
            if same is not None:
                if event.summary_not_used is not None:
                    same.not_used = event
                else:
                    same.events.append(event)
                same.status = "done"
                return
            self._add("recovery", "running", event)
        elif isinstance(event, ev.Retrying):
            self._close_send("failed", event.failure)
            self._add("retry", "info", event)
        elif isinstance(event, ev.CapChanged):
            self.cap, self.cap_source = event.cap, event.source
            self._add("cap", "info", event)
        elif isinstance(event, ev.WindowLearned):
            self.window = event.window
            self._add("window", "info", event)
        elif isinstance(event, ev.Recovered):
            # Said as the resent request's answer starts to arrive: that send runs on.
            self.recovered = event.attempts
        elif isinstance(event, ev.Failed):
            self._close_send("failed", Failure(event.failure_kind, event.sentence))
            self._close_running_ladder("failed")
            self._mark_running("failed")
            self.failed = event
        elif isinstance(event, ev.TurnFinished):
            self._close_send("done")
            self.after = event
            self.body_bytes, self.window, self.cap = (event.history_bytes, event.window,
                                                      event.cap)
            self.est_tokens = event.est_tokens
        elif type(event) in _STAGES:
            if isinstance(event, (ev.Escalation, ev.Truncated, ev.ToolRun)):
                self._close_send("done")
            if isinstance(event, ev.FitBeforeSend):
                self.body_bytes, self.est_tokens = event.goal_bytes, None
            failed = (isinstance(event, ev.Truncated)
                      or (isinstance(event, ev.ToolRun) and not event.ok))
            status: Status = "failed" if failed else \
                "info" if isinstance(event, (ev.NoticeInjected, ev.ServerCompactionNote)) or (
                    isinstance(event, ev.BackgroundSummary) and event.state != "swapped") \
                else "done"
            step = self._add(_STAGES[type(event)], status, event)
            step.note = self._billed_note(event)

    def text_arrived(self, delta: str) -> None:
        """``on_text`` callback: the answer streaming in (the running send counts it)."""
        send = self._running("send")
        if send is None or not delta:
            return
        self._streamed += len(delta.encode("utf-8"))
        send.streamed_tokens = self.estimate(self._streamed)

    def interrupted(self) -> None:
        """The turn was interrupted (KeyboardInterrupt, the panel's Cancel): every step
        still running was cancelled; the session keeps its history as it was."""
        self.cancelled = True
        self._mark_running("cancelled")

    def finish(self, *, elapsed: float, prompt_tokens: int = 0,
               completion_tokens: int = 0, cached_tokens: int = 0,
               cache_write_tokens: int = 0, cache_write_1h_tokens: int = 0) -> None:
        """The turn ended after ``elapsed`` seconds, with the tokens its reply reported (a
        failed or interrupted turn has no reply: none are shown)."""
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens
        self.cached_tokens, self.cache_write_tokens = cached_tokens, cache_write_tokens
        self.cache_write_1h_tokens = cache_write_1h_tokens
        self.elapsed = elapsed

    def cost(self) -> float | None:
        """The estimated USD of the tokens the turn reported (None: price unknown)."""
        cost = prices.estimate(self.model, Usage(self.prompt_tokens, self.completion_tokens,
                                                 self.cached_tokens, self.cache_write_tokens,
                                                 cache_write_1h_tokens=self.cache_write_1h_tokens),
                               self.prices)
        return None if cost is None else cost.total

    def cache_text(self) -> tuple[str, str] | None:
        """The card's ``cache`` and ``cost`` lines: the input as reported, and the estimated
        cost of the turn (input and answer)."""
        if not (self.prompt_tokens or self.completion_tokens):
            return None
        if not (self.model or self.cached_tokens or self.cache_write_tokens):
            return None     # a record that was not told the model (the panel's)
        usd = self.cost()
        if not w.cache_said(self.cached_tokens, self.cache_write_tokens, usd):
            return None
        return (w.cache_split(self.prompt_tokens, self.cached_tokens, self.cache_write_tokens,
                              self.cache_write_1h_tokens),
                w.cost_words(usd))

    def _compaction_cost(self, event: ev.CompactionPhase) -> str:
        """What an applied summary cost against the input it removes from later requests."""
        if event.summary_input_tokens is None or event.after_bytes is None:
            return ""
        removed = self.estimate(max(0, event.before_bytes - event.after_bytes))
        paid, saved = prices.summary_usd(self.model, event.summary_input_tokens,
                                         event.summary_output_tokens or 0, removed,
                                         self.prices)
        return w.compaction_cost(event.summary_input_tokens,
                                 event.summary_output_tokens or 0, removed, paid, saved)

    def _billed_note(self, event: ev.Event) -> str:
        """What a summary made outside the turn's own requests was billed — one prepared in
        the background (told when ready or failed), the provider's server compaction —
        against what it removes from later requests ('' when no usage was reported)."""
        if isinstance(event, ev.BackgroundSummary) and event.state in ("ready", "failed") \
                and (event.prompt_tokens or event.completion_tokens):
            tokens = (event.prompt_tokens, event.completion_tokens, event.cached_tokens,
                      event.cache_write_tokens, event.cache_write_1h_tokens)
            label = "background summary request"
            after = event.after_bytes if event.state == "ready" else None
        elif isinstance(event, ev.ServerCompacted) and event.prompt_tokens is not None:
            tokens = (event.prompt_tokens, event.completion_tokens or 0, event.cached_tokens,
                      event.cache_write_tokens, event.cache_write_1h_tokens)
            label = "the server's compaction"
            after = event.after_bytes
        else:
            return ""
        # A failed summary removes nothing: only what it was billed is said.
        removed = None if after is None else self.estimate(max(0, event.before_bytes - after))
        price = prices.price_for(self.model, self.prices) if self.model else None
        paid = saved = None
        if price is not None and not price.free:
            prompt, completion, cached, written, written_1h = tokens
            cost = prices.estimate(self.model, Usage(prompt, completion, cached, written,
                                                     cache_write_1h_tokens=written_1h),
                                   self.prices)
            paid = None if cost is None else cost.total
            saved = None if removed is None else removed * price.input / 1_000_000
        return w.compaction_cost(tokens[0], tokens[1], removed, paid, saved, label=label)

    # -- views ----------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.after is not None or self.failed is not None or self.cancelled

    @property
    def something_happened(self) -> bool:
        """More than a routine check and send (what ``turn_card = "auto"`` writes a card for)."""
        if self.failed is not None or self.cancelled or self.recovered:
            return True
        for step in self.steps:
            if step.stage not in _ROUTINE or step.status in ("failed", "cancelled"):
                return True
            first = step.events[0]
            if isinstance(first, ev.Preflight) and (first.action != "ok"
                                                     or first.counted_tokens is not None):
                return True     # a compaction asked for, or a count sent (exact pre-flight)
        return False

    @property
    def outcome(self) -> str:
        return w.turn_outcome(failed=self.failed, recovered=self.recovered,
                              cancelled=self.cancelled, finished=self.finished)

    def latest(self, stage: str) -> Step | None:
        for step in reversed(self.steps):
            if step.stage == stage:
                return step
        return None

    # -- bookkeeping ------------------------------------------------------------------------------
    def _add(self, stage: str, status: Status, event: ev.Event) -> Step:
        step = Step(stage, status, [event])
        self.steps.append(step)
        return step

    def _running(self, stage: str) -> Step | None:
        step = self.latest(stage)
        return step if step is not None and step.status == "running" else None

    def _close_send(self, status: Status, failure: Failure | None = None) -> None:
        send = self._running("send")
        if send is not None:
            send.status, send.failure = status, failure

    def _close_running_ladder(self, status: Status) -> None:
        tried = self._running("recovery")
        if tried is not None:
            tried.status = status

    def _mark_running(self, status: Status) -> None:
        for step in self.steps:
            if step.status == "running":
                step.status = status

    def _compaction(self, event: ev.CompactionPhase) -> None:
        step = self._running("compaction")
        if event.phase == "start" or step is None:
            step = self._add("compaction", "running", event)
        else:
            step.events.append(event)
        if event.phase == "applied":
            step.status = "done"
            step.note = self._compaction_cost(event)
            if event.after_bytes is not None and event.outcome != "nothing":
                self.body_bytes, self.est_tokens = event.after_bytes, None
        elif event.phase == "rejected":
            step.status = "failed"
        elif event.phase == "cancelled":
            step.status = "cancelled"


def card_wanted(mode: str, record: TurnRecord) -> bool:
    """Whether ``ChatMagics.turn_card = mode`` writes a card for ``record``."""
    if mode == "never":
        return False
    return mode == "always" or record.something_happened


_CSS = ("font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;line-height:1.45;"
        "max-width:46em;border-left:3px solid {color};padding:2px 0 2px 8px;margin:2px 0")


NO_MATH = "mathjax_ignore tex2jax_ignore"
"""Classes on the root of our HTML outputs: JupyterLab typesets the ``$…$`` of an HTML
output as LaTeX (MathJax 3's ignore class, and MathJax 2's), and two amounts of money in
one card ("≈ $0.0181); each later request … (≈ $0.0130") became a formula."""

_COST = re.compile(r"≈ \$[\d,.]+")


def _cost_unbroken(escaped: str) -> str:
    """``≈ $0.0209`` kept on one line (a narrow card wrapped it after the ≈)."""
    return _COST.sub(lambda m: m.group(0).replace(" ", "&nbsp;"), escaped)


class TurnCard:
    """The static record of one finished turn (``text/html`` + ``text/plain``).

    Built from a :class:`TurnRecord` once the turn ended; it holds strings only, so what
    was displayed never changes afterwards.
    """

    def __init__(self, record: TurnRecord) -> None:
        self.session = record.session
        self.header = " · ".join(part for part in (
            f"session {record.session}", record.outcome,
            w.elapsed(record.elapsed) if record.elapsed is not None else "",
            w.tokens_used(record.prompt_tokens, record.completion_tokens)
            if (record.prompt_tokens or record.completion_tokens) else "") if part)
        self.before = w.sizes_before(record.before) if record.before is not None else None
        self.after: str | None
        if record.after is not None:
            self.after = w.sizes_after(record.after, record.cap_source)
        elif record.failed is not None or record.cancelled:
            self.after = w.history_as_before(record.kept_messages)
        else:
            self.after = None
        said = record.cache_text()
        self.cache: str | None = said[0] if said else None
        self.cost: str | None = said[1] if said else None
        self.rows: tuple[tuple[str, str, str], ...] = tuple(
            (step.glyph, step.name, step.detail) for step in record.steps)
        self.ok = record.failed is None and not record.cancelled

    def text(self) -> str:
        lines = [f"turn · {self.header}"]
        if self.before:
            lines.append(f"  before  {self.before}")
        if self.after:
            lines.append(f"  after   {self.after}")
        if self.cache:
            lines.append(f"  cache   {self.cache}")
        if self.cost:
            lines.append(f"  cost    {self.cost}")
        width = max((len(name) for _, name, _ in self.rows), default=0)
        lines += [f"  {glyph} {name.ljust(width)}  {detail}" for glyph, name, detail in self.rows]
        return "\n".join(lines)

    def html(self) -> str:
        e = html.escape
        color = theme.BORDER_OK if self.ok else theme.BORDER_ERROR
        sizes = "".join(
            f"<div><span style='opacity:.7'>{label}</span> {_cost_unbroken(e(text))}</div>"
            for label, text in (("before", self.before), ("after", self.after),
                                ("cache", self.cache), ("cost", self.cost)) if text)
        # Inline styles: notebook front ends right-align and stripe output tables.
        cell = "text-align:left;vertical-align:top;border:none;background:none;padding:0 "
        rows = "".join(
            f"<tr style='background:none'><td style='{cell}6px 0 0'>{e(glyph)}</td>"
            f"<td style='{cell}10px 0 0;white-space:nowrap'>{e(name)}</td>"
            f"<td style='{cell}0 0 0;overflow-wrap:anywhere'>{e(detail)}</td></tr>"
            for glyph, name, detail in self.rows)
        table = (f"<table style='border-collapse:collapse;border:none;margin:2px 0 0 0;"
                 f"table-layout:auto'>{rows}</table>" if rows else "")
        return (f"<div class='ctxr-card {NO_MATH}' data-session='{e(self.session)}' "
                f"style='{_CSS.format(color=color)}'>"
                f"<div><b>turn</b> · {e(self.header)}</div>{sizes}{table}</div>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __repr__(self) -> str:
        return self.text()
