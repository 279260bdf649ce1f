"""The live panel of one session (``%chat panel``): sizes against cap and window, a step
tracker of the running turn, an activity line with elapsed time and a Cancel button.

What it shows is one view model, :meth:`ContextPanel.view` — every label from
:mod:`..wording`, the running turn read by the same :class:`~.turn_card.TurnRecord` the turn
card uses — rendered as HTML (and as ``text/plain``, the same facts one per line).

**Live while a turn runs, a snapshot in between.** The kernel can push updates to the
front end while a cell runs (display updates and widget state go out on IOPub), but it
reads nothing the front end sends until the cell ends: a widget button's ``on_click``
would fire after the summary it was meant to cancel. So the panel's output (one display
id per panel) holds the widgets only while a turn runs — the tracker, and the
:class:`PanelWidget` whose Cancel button asks the Jupyter server to interrupt the
kernel (``POST /api/kernels/<id>/interrupt``, what the notebook's own ■ button does):
the ``KeyboardInterrupt`` lands in the summary request and the compaction leaves the
history exactly as it was. When the turn ends the output is replaced by plain HTML of the
same view, stamped with its time, so a saved notebook shows that snapshot (never "Error
displaying widget: model not found") whatever the kernel does later. Only the panel's
latest display follows the session; an earlier one keeps the snapshot it had when the
panel was shown again.

Widget state has no lock: events are applied on the thread that built the panel (the
kernel's); an event from another thread waits for the next one from the owning thread.
"""

from __future__ import annotations

import html
import os
import re
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from ..core import events as ev
from ..core import theme
from ..core import wording as w
from ..core.ladder.decide import Level
from ..settings import Settings
from .cell_cancel import INTERRUPT_JS
from .turn_card import NO_MATH, Step, TurnRecord

__all__ = ["STAGES", "ContextPanel", "PanelWidget", "kernel_id"]

STAGES = ("preflight", "microcompact", "budget", "trim", "summarize", "apply", "send",
          "recovery", "continuation")
"""The step tracker's rows, in the order a turn runs them."""

#: The recovery levels shown as chips under the tracker, mildest first.
_LEVELS = (Level.LOWER_MAX_TOKENS, Level.EXACT_FIT, Level.AGGRESSIVE, Level.EMERGENCY,
           Level.NUCLEAR)
_TEXT_INTERVAL = 0.25
"""Seconds between re-renders while an answer streams in."""

_ESM = INTERRUPT_JS + r"""
export default {
  render({ model, el }) {
    const body = document.createElement("div");
    const row = document.createElement("div"); row.className = "ctxr-activity";
    const spin = document.createElement("span"); spin.className = "ctxr-spin";
    const label = document.createElement("span"); label.className = "ctxr-activity-label";
    const time = document.createElement("span"); time.className = "ctxr-elapsed";
    const button = document.createElement("button"); button.className = "ctxr-cancel";
    const hint = document.createElement("span"); hint.className = "ctxr-hint";
    row.append(spin, label, time, button, hint);
    el.append(body, row);
    let shown = null;
    let pressed = false;
    function tick() {
      const started = model.get("started");
      time.textContent = started ? clock(Date.now() - started) : "";
    }
    function update() {
      const html = model.get("html");
      if (html !== shown) { body.innerHTML = html; shown = html; }
      const texts = model.get("texts");
      const running = !!model.get("label");
      row.style.display = running ? "" : "none";
      label.textContent = model.get("label");
      const cancellable = model.get("cancellable");
      button.style.display = cancellable ? "" : "none";
      if (!cancellable) pressed = false;
      button.disabled = pressed;
      button.textContent = pressed ? texts.cancelling : texts.cancel;
      button.title = texts.cancel_title;
      if (!cancellable) hint.textContent = "";
      tick();
    }
    onCancel(button, hint, model, (down) => { pressed = down; update(); });
    model.on("change", update);
    update();
    const timer = setInterval(tick, 250);
    return () => clearInterval(timer);
  }
};
"""

_ACTIVITY_CSS = """
.ctxr-activity { display: flex; flex-wrap: wrap; align-items: center; gap: 6px;
  font-size: 12px; margin: 2px 0 0 0; min-height: 24px; }
.ctxr-spin { width: 10px; height: 10px; border: 2px solid;
  border-top-color: transparent; border-radius: 50%;
  animation: ctxr-rot 0.9s linear infinite; flex: none; }
@keyframes ctxr-rot { to { transform: rotate(360deg); } }
.ctxr-activity-label { overflow-wrap: anywhere; }
.ctxr-elapsed { font-variant-numeric: tabular-nums; opacity: 0.75; }
.ctxr-cancel { font-size: 12px; padding: 1px 10px; cursor: pointer; }
.ctxr-hint { flex-basis: 100%; }
"""

_PANEL_RULES = """
.ctxr-panel { font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px;
  line-height: 1.45; max-width: 46em; min-width: 0; }
.ctxr-head { display: flex; gap: 8px; align-items: baseline; min-width: 0; }
.ctxr-title { font-weight: bold; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; min-width: 0; }
.ctxr-state { opacity: 0.75; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.ctxr-meter { display: grid; grid-template-columns: 4.5em minmax(3em, 10em) minmax(0, 1fr);
  gap: 0 8px; align-items: center; }
.ctxr-track { height: 8px; border-radius: 4px; overflow: hidden; }
.ctxr-fill { height: 100%; }
.ctxr-label { overflow-wrap: anywhere; min-width: 0; }
.ctxr-steps { display: grid; grid-template-columns: 1.2em 9.5em minmax(0, 1fr); gap: 0 4px;
  margin: 4px 0 0 0; }
.ctxr-step { display: contents; }
.ctxr-step.running > span { font-weight: bold; }
.ctxr-step > span:last-child { overflow-wrap: anywhere; min-width: 0; }
.ctxr-levels { margin: 2px 0 0 1.6em; display: flex; flex-wrap: wrap; gap: 4px; }
.ctxr-level { border: 1px solid; border-radius: 8px; padding: 0 6px; }
.ctxr-level.current { font-weight: bold; }
.ctxr-counts, .ctxr-last, .ctxr-background { margin: 4px 0 0 0; overflow-wrap: anywhere; }
"""
_COLOUR_RULES = f"""
.ctxr-spin {{ border-color: {theme.TEXT_DIM}; border-top-color: transparent; }}
.ctxr-hint {{ color: {theme.TEXT_ERROR}; }}
.ctxr-track {{ background: {theme.TRACK}; }}
.ctxr-track.none {{ background: repeating-linear-gradient(45deg,
  {theme.SURFACE} 0 4px, {theme.TRACK_STRIPE} 4px 8px); }}
.ctxr-fill.ok {{ background: {theme.FILL_OK}; }}
.ctxr-fill.warn {{ background: {theme.FILL_WARN}; }}
.ctxr-fill.over {{ background: {theme.FILL_ERROR}; }}
.ctxr-step.pending > *, .ctxr-step.skipped > * {{ color: {theme.TEXT_DIM}; }}
.ctxr-step.running > span {{ color: {theme.TEXT_RUNNING}; }}
.ctxr-step.failed > span, .ctxr-step.cancelled > span {{ color: {theme.TEXT_ERROR}; }}
.ctxr-level {{ border-color: {theme.BORDER}; color: {theme.TEXT_DIM}; }}
.ctxr-level.lit {{ color: {theme.TEXT_STRONG}; border-color: {theme.BORDER_WARN};
  background: {theme.SURFACE}; }}
"""
"""Every colour, from the JupyterLab theme (``core/theme.py``), after the rules above."""
_PANEL_CSS = f"<style>{_PANEL_RULES}{_COLOUR_RULES}</style>"
"""The rules inline, for the snapshot (plain HTML, no widget to carry them)."""


def kernel_id() -> str:
    """The Jupyter server's id of this kernel (from its connection file's name,
    ``kernel-<id>.json``), or '' outside a server-started kernel."""
    # Only a running kernel's own app: importing ipykernel elsewhere would swap the
    # process's comm manager, and instantiating its app would make a kernel.
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    app = getattr(kernelapp, "IPKernelApp", None)
    if app is None or not app.initialized():
        return ""
    name = os.path.basename(app.instance().connection_file or "")
    match = re.fullmatch(r"kernel-([0-9A-Za-z-]+)\.json", name)
    return match.group(1) if match else ""


class PanelWidget(anywidget.AnyWidget):
    """The panel in the front end: its HTML, and what the running turn does now — a
    spinner, the elapsed time (counted by the front end, since the kernel is busy) and,
    during a summary, a Cancel button that interrupts the kernel through the Jupyter
    server's REST API. One widget, so one message carries each change whole."""

    _esm = _ESM
    _css = _ACTIVITY_CSS + _PANEL_RULES + _COLOUR_RULES
    html = traitlets.Unicode("").tag(sync=True)
    label = traitlets.Unicode("").tag(sync=True)
    started = traitlets.Float(0.0).tag(sync=True)
    """When the current activity started (ms since the epoch); 0 when idle."""
    cancellable = traitlets.Bool(False).tag(sync=True)
    kernel_id = traitlets.Unicode("").tag(sync=True)
    texts = traitlets.Dict().tag(sync=True)


class ContextPanel:
    """The live panel of one session (see the module docstring)."""

    def __init__(self, *, title: str = "default", settings: Settings | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 publish: Callable[..., Any] | None = None) -> None:
        self.name = title
        self.settings = settings or Settings()
        self.display_id = f"ctxr-panel-{uuid.uuid4().hex}"
        self._clock, self._wall = clock, wall
        self._publish = publish
        self.shown = False
        self._owner = threading.get_ident()
        self._pending: deque[ev.Event] = deque()
        self._unsubscribe: Callable[[], None] | None = None
        self._session: Any = None
        self._followed: Any = None
        # Where the session stands (its status(), then the events).
        self.history_bytes = 0
        self.est_tokens = 0
        self.window: int | None = None
        self.window_source: str | None = None
        self.cap: int | None = self.settings.max_payload
        self.cap_source: str | None = "configured" if self.cap else None
        self.recoveries = 0
        self.compactions = 0
        self.background = "idle"
        self._unlisten: Callable[[], None] | None = None
        # The running turn, or the last one.
        self.record: TurnRecord | None = None
        self.running = False
        self.as_of: float | None = None
        self._activity_kind = ""
        self._last_text_render = 0.0

        self.widget = PanelWidget(kernel_id=kernel_id(), texts=w.cancel_texts(),
                                  layout=widgets.Layout(width="100%", max_width="48em"))
        self._render()

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, session: Any) -> None:
        """Follow ``session``'s events (replacing any session followed before; the last
        turn shown was another conversation's, so it goes)."""
        if session is not self._followed:
            self.record, self._followed = None, session
        self.detach()
        self._unsubscribe = session.subscribe(self.handle)
        on_background = getattr(session, "on_background", None)
        if on_background is not None:
            self._unlisten = on_background(self._background_changed)
        self._session = session
        self.refresh()

    def _background_changed(self, state: str) -> None:
        """The worker's summary is ready or failed (between cells): shown at once."""
        self.background = state
        if not self.running:
            self._changed()

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self._session = None

    def refresh(self, *, publish: bool = True) -> None:
        """Take sizes and counts from the followed session's ``status()`` (what
        ``%chat status`` prints), so the two always agree."""
        if self._session is not None:
            self.update_status(self._session.status(), self._session.settings,
                               publish=publish)

    def update_status(self, status: Any, settings: Settings | None = None, *,
                      publish: bool = True) -> None:
        """Take sizes, sources and counts from a :class:`~..session.SessionStatus`;
        ``publish``: show the change now (between turns)."""
        if settings is not None:
            self.settings = settings
        self.history_bytes, self.est_tokens = status.history_bytes, status.est_tokens
        self.window = status.window
        self.window_source = status.window_source
        self.cap, self.cap_source = status.cap, status.cap_source
        self.recoveries, self.compactions = status.recoveries, status.compactions
        self.background = getattr(status, "background", "idle")
        if publish:
            self._changed()

    # -- the turn ---------------------------------------------------------------------------
    def begin_turn(self, *, cell: int | None = None) -> None:
        """A turn starts: the output becomes the live widgets and the tracker starts afresh.
        ``cell``: the notebook cell running it (its execution count)."""
        if self.running:
            return
        self.running = True
        self.record = TurnRecord(session=self.name, cap=self.cap, cap_source=self.cap_source,
                                 window=self.window, estimate=self._estimate, cell=cell)
        self._turn_started = self._wall()
        self._render()
        self._republish()

    def end_turn(self, *, interrupted: bool = False) -> None:
        """The turn ended (answered, failed or interrupted): sizes and counts from the
        session, and the output becomes a snapshot of the view."""
        if not self.running:
            return
        record = self.record
        if interrupted and record is not None and not record.finished:
            record.interrupted()
        self.running = False
        if record is not None:
            if record.ended_at is None:
                record.ended_at = self._wall()
            # What the turn kept counts (the session's status, when followed, says the same).
            if record.after is not None:
                this_turn = _this_turn(record)
                self.compactions += this_turn[0] if this_turn else 0
                self.recoveries += 1 if record.recovered else 0
                self.history_bytes, self.est_tokens = (record.after.history_bytes,
                                                       record.after.est_tokens)
                self.window = record.after.window
            self.cap, self.cap_source = record.cap, record.cap_source
        self.refresh(publish=False)
        self.as_of = self._wall()
        self._render()
        self._republish()

    def recall(self, record: TurnRecord) -> None:
        """Show ``record``, a turn that ended before this panel was made (its tracker, as a
        panel open during the turn shows it)."""
        if not self.running and record.finished:
            self.record = record
            self._changed()

    def text_arrived(self, delta: str) -> None:
        """``on_text`` callback: count the answer's tokens as they stream."""
        if self.record is None or not self.running:
            return
        self.record.text_arrived(delta)
        now = self._clock()
        if now - self._last_text_render >= _TEXT_INTERVAL \
                and threading.get_ident() == self._owner:
            self._last_text_render = now
            self._render()

    def _estimate(self, size: int) -> int:
        estimator = getattr(self._session, "estimator", None)
        return estimator.estimate(size) if estimator is not None else (size + 3) // 4

    # -- events ---------------------------------------------------------------------------
    def handle(self, event: ev.Event) -> None:
        """Session event callback; applied on the owning thread, else queued."""
        self._pending.append(event)
        if threading.get_ident() != self._owner:
            return
        while self._pending:
            self._apply(self._pending.popleft())
        self._render()

    def _apply(self, event: ev.Event) -> None:
        if not self.running:
            self.begin_turn()   # driven from Python code: the first event starts the turn
        assert self.record is not None
        self.record.feed(event)
        if isinstance(event, ev.CapChanged):
            self.cap, self.cap_source = event.cap, event.source
        elif isinstance(event, ev.WindowLearned):
            self.window, self.window_source = event.window, (
                "below a rejected request" if event.bound else "learned from the provider")
        if isinstance(event, (ev.TurnFinished, ev.Failed)):
            self.end_turn()

    # -- the view -------------------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """Every label the panel shows, by place (the HTML and the text render this)."""
        record = self.record
        # Between turns: the history, by the session's one measure (its status). While a
        # turn runs: the request in flight, named so (it carries the new message).
        body, tokens, window = self.history_bytes, self.est_tokens, self.window
        measured = "history"
        if self.running and record is not None and record.body_bytes is not None:
            measured = "request"
            body = record.body_bytes
            tokens = record.est_tokens if record.est_tokens is not None \
                else self._estimate(body)
            window = record.window or window
        cap, source = self.cap, self.cap_source
        steps = _tracker(record, running=self.running) if record is not None else []
        levels = _levels(record) if record is not None else []
        return {
            "title": w.panel_title(self.name),
            "state": w.panel_state(running=self.running, as_of=self.as_of),
            "measured": measured,
            "size": w.size_against_cap(body, cap, source),
            "size_fraction": body / cap if cap else None,
            "tokens": w.tokens_against_window(tokens, window, self.window_source),
            "tokens_fraction": tokens / window if window else None,
            "steps": steps,
            "levels": levels,
            "counts": w.panel_counts(self.recoveries, self.compactions,
                                     _this_turn(record) if self.running else None),
            "background": (None if self.background == "idle" else
                           f"background summary: {w.BACKGROUND_WORDS[self.background]}"),
            "last": (w.panel_last_turn(record.outcome, cell=record.cell,
                                       ended_at=record.ended_at)
                     if record is not None and not self.running else None),
        }

    def _activity(self, record: TurnRecord | None) -> tuple[str, str, bool]:
        """What the running turn does now: (kind, words, whether Cancel applies)."""
        if not self.running or record is None:
            return "", "", False
        for step in reversed(record.steps):
            if step.status != "running":
                continue
            if step.stage == "compaction":
                last = step.events[-1]
                if isinstance(last, ev.CompactionPhase) and last.phase == "summarize":
                    return "summarize", w.activity_words("summarize"), True
                return "compaction", w.activity_words("compaction"), False
            if step.stage == "send":
                return "send", w.activity_words("send", streamed=step.streamed_tokens), False
            if step.stage == "recovery":
                return "recovery", w.activity_words("recovery"), False
        return "prepare", w.activity_words("prepare"), False

    def _render(self) -> None:
        kind, label, cancellable = self._activity(self.record)
        with self.widget.hold_sync():   # one message: the tracker and the activity agree
            self.widget.html = _html(self.view(), live=True)
            if kind != self._activity_kind:
                # A new activity restarts the elapsed clock; the same one streaming does not.
                self._activity_kind = kind
                self.widget.started = self._wall() * 1000 if kind else 0.0
            self.widget.label = label
            self.widget.cancellable = cancellable

    def _changed(self) -> None:
        """Something changed between turns (status, settings): re-render and republish."""
        self._render()
        if not self.running:
            self.as_of = self._wall()
            self._republish()

    # -- display --------------------------------------------------------------------------
    def show(self, *, live: bool = True) -> None:
        """Display the panel here (``%chat panel``): from now on this display follows the
        session, and the ones made before keep what they last showed — the state as of
        their stamp — so a saved notebook never shows a later turn's cap or counts under
        an earlier cell.

        ``live=False`` (a terminal): shown once, as text; changes are not re-printed."""
        if self.shown:
            self.display_id = f"ctxr-panel-{uuid.uuid4().hex}"
        self._display(self, display_id=self.display_id)
        self.shown = self.shown or live

    def _display(self, obj: Any, **kwargs: Any) -> Any:
        if self._publish is not None:
            return self._publish(obj, **kwargs)
        from IPython.display import display

        return display(obj, **kwargs)

    def _republish(self) -> None:
        if self.shown:
            self._display(self, display_id=self.display_id, update=True)

    def text(self) -> str:
        """The plain-text fallback: the same facts as the HTML, one per line."""
        return _text(self.view())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        view = self.view()
        if self.running:
            bundle: Any = self.widget._repr_mimebundle_(include=include, exclude=exclude)
            data = dict((bundle[0] if isinstance(bundle, tuple) else bundle) or {})
            data["text/plain"] = _text(view)
            return data
        return {"text/plain": _text(view), "text/html": _PANEL_CSS + _html(view, live=False)}

    def close(self) -> None:
        self.detach()
        self.widget.close()


# -- the view's parts -----------------------------------------------------------------------

def _this_turn(record: TurnRecord | None) -> tuple[int, int, bool] | None:
    """(compactions applied, recovery steps, a compaction running) in the running turn."""
    if record is None:
        return None
    applied = running = 0
    for step in record.steps:
        if step.stage != "compaction":
            continue
        last = step.events[-1]
        if step.status == "running":
            running += 1
        elif isinstance(last, ev.CompactionPhase) and last.phase == "applied" \
                and last.outcome != "nothing":
            applied += 1
    used = sum(1 for s in record.steps if s.stage == "recovery" and s.not_used is not None)
    steps = sum(1 for s in record.steps if s.stage == "recovery")
    return max(0, applied - used), steps, running > 0


def _tracker(record: TurnRecord, *, running: bool) -> list[tuple[str, str, str, str]]:
    """The tracker's rows: (stage, status, name, detail) for each of :data:`STAGES`."""
    rows: list[tuple[str, str, str, str]] = []
    pf = record.latest("preflight")
    send = record.latest("send")
    compaction = record.latest("compaction")
    later = "pending" if running else "skipped"

    def row(stage: str, status: str, detail: str = "") -> None:
        rows.append((stage, status, w.STAGE_NAMES[stage], detail))

    row("preflight", *((pf.status, pf.detail) if pf else (later, "")))
    for stage in ("microcompact", "budget"):
        step = record.latest(stage)
        # Both run before pre-flight: once it has run, one without a step was not needed.
        row(stage, *((step.status, step.detail) if step
                     else ("skipped" if pf else later, "")))
    for stage, status, detail in _compaction_rows(compaction, sent=send is not None,
                                                  later=later):
        row(stage, status, detail)
    row("send", *((send.status, send.detail) if send else (later, "")))
    server = record.latest("server_compaction")
    if server is not None:      # the provider's own compaction (or its note): only when told
        row("server_compaction", server.status, server.detail)
    recovery = record.latest("recovery")
    if recovery is not None:   # the level is lit on the chips below
        row("recovery", recovery.status, recovery.detail)
    else:
        settled = send is not None and send.status == "done"
        row("recovery", "skipped" if settled or not running else "pending")
    cont = record.latest("continuation")
    row("continuation", *((cont.status, cont.detail) if cont
                          else ("skipped" if record.finished or not running else "pending",
                                "")))
    return rows


def _compaction_rows(step: Step | None, *, sent: bool,
                     later: str) -> list[tuple[str, str, str]]:
    """trim / summarize / apply of the turn's latest compaction."""
    if step is None:
        # Compaction comes before the first send: once a request left, none was needed.
        status = "skipped" if sent else later
        return [("trim", status, ""), ("summarize", status, ""), ("apply", status, "")]
    phases = [e for e in step.events if isinstance(e, ev.CompactionPhase)]
    seen = {p.phase for p in phases}
    last = phases[-1]
    detail = w.compaction_detail(phases, cost=False)
    if step.status == "running":
        trim = "running" if last.phase in ("start", "trim") else "done"
        summarize = "running" if last.phase == "summarize" else "pending"
        return [("trim", trim, detail if trim == "running" else ""),
                ("summarize", summarize, detail if summarize == "running" else ""),
                ("apply", "pending", "")]
    summarized = "summarize" in seen
    if step.status == "cancelled":
        return [("trim", "done", ""), ("summarize", "cancelled", detail),
                ("apply", "skipped", "")]
    if step.status == "failed":   # rejected: nothing applied
        return [("trim", "done", ""),
                ("summarize", "failed" if summarized else "skipped", ""),
                ("apply", "failed", detail)]
    applied = last.outcome != "nothing"
    cost = " · ".join(w.summary_lines(last)) if summarized else ""
    return [("trim", "done", ""), ("summarize", "done" if summarized else "skipped", cost),
            ("apply", "done" if applied else "skipped", detail)]


def _levels(record: TurnRecord) -> list[tuple[str, str]]:
    """The recovery levels as chips: (name, "" | "lit" | "lit current")."""
    used = [s for s in record.steps if s.stage == "recovery"]
    if not used:
        return []
    lit = {s.events[0].level for s in used if isinstance(s.events[0], ev.LadderStep)}
    last = used[-1].events[0]
    current = last.level if isinstance(last, ev.LadderStep) else None
    summary = any(isinstance(s.events[0], ev.LadderStep) and s.events[0].summarizing
                  for s in used)
    chips = []
    for level in _LEVELS:
        name = w.LEVEL_NAMES[level]
        if level is Level.EXACT_FIT and summary:
            name = "summarize to fit"
        state = "lit current" if level is current else "lit" if level in lit else ""
        chips.append((name, state))
    return chips


def _bar(fraction: float | None, none_label: str) -> str:
    if fraction is None:
        return (f"<div class='ctxr-track none' title='{html.escape(none_label)}'></div>")
    style = "over" if fraction >= 1 else "warn" if fraction >= 0.85 else "ok"
    width = max(0.0, min(fraction, 1.0)) * 100
    return (f"<div class='ctxr-track'><div class='ctxr-fill {style}' "
            f"style='width:{width:.1f}%'></div></div>")


def _html(view: dict[str, Any], *, live: bool) -> str:
    e = html.escape
    parts = [f"<div class='ctxr-panel {NO_MATH}' data-live='{'yes' if live else 'no'}'>",
             f"<div class='ctxr-head'><span class='ctxr-title'>{e(view['title'])}</span>"
             f"<span class='ctxr-state'>{e(view['state'])}</span></div>"]
    for key, name in (("size", view["measured"]), ("tokens", "tokens")):
        fraction = view[f"{key}_fraction"]
        parts.append(f"<div class='ctxr-meter ctxr-{key}' data-fraction="
                     f"'{'' if fraction is None else f'{fraction:.4f}'}'>"
                     f"<span>{name}</span>{_bar(fraction, view[key])}"
                     f"<span class='ctxr-label'>{e(view[key])}</span></div>")
    if view["steps"]:
        rows = "".join(
            f"<div class='ctxr-step {status}' data-stage='{stage}'>"
            f"<span>{e(w.STATUS_GLYPHS[status])}</span><span>{e(name)}</span>"
            f"<span>{e(detail)}</span></div>"
            for stage, status, name, detail in view["steps"])
        parts.append(f"<div class='ctxr-steps'>{rows}</div>")
    if view["levels"]:
        chips = "".join(f"<span class='ctxr-level {state}'>{e(name)}</span>"
                        for name, state in view["levels"])
        parts.append(f"<div class='ctxr-levels'>{chips}</div>")
    parts.append(f"<div class='ctxr-counts'>{e(view['counts'])}</div>")
    if view.get("background"):
        parts.append(f"<div class='ctxr-background'>{e(view['background'])}</div>")
    if view["last"]:
        parts.append(f"<div class='ctxr-last'>{e(view['last'])}</div>")
    parts.append("</div>")
    return "".join(parts)


def _text(view: dict[str, Any]) -> str:
    lines = [f"{view['title']} · {view['state']}",
             f"{view['measured']:<8} {view['size']}",
             f"tokens   {view['tokens']}"]
    if view["steps"]:
        width = max(len(name) for _, _, name, _ in view["steps"])
        lines += [f"  {w.STATUS_GLYPHS[status]} {name.ljust(width)}  {detail}".rstrip()
                  for _, status, name, detail in view["steps"]]
    if view["levels"]:
        lines.append("  recovery levels: " + " · ".join(
            f"▸{name}" if state else name for name, state in view["levels"]))
    lines.append(view["counts"])
    if view.get("background"):
        lines.append(view["background"])
    if view["last"]:
        lines.append(view["last"])
    return "\n".join(lines)
