"""The live context panel: an ipywidgets view of one session's size, ladder and summarizer.

The widget tree is built once; events from the session (it subscribes to them) only set
trait values. ``text()`` is the plain-text fallback used wherever widgets cannot render
(terminal IPython, some VS Code setups, a notebook saved without widget state): the panel's
``_repr_mimebundle_`` always carries it as ``text/plain``.

Widget state has no lock, so values are only written from the thread that built the panel
(the kernel's); an event arriving on another thread is queued and applied on the next
update from the owning thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from . import events as ev
from .config import Settings, format_size

__all__ = ["LADDER_LEVELS", "ContextPanel"]

#: ladder.Level value -> the rung shown on the panel's 0-3 bar (0: no recovery this turn).
LADDER_LEVELS: dict[str, int] = {
    "lower_max_tokens": 0,
    "exact_fit": 0,
    "aggressive_budget": 1,
    "emergency_truncate": 2,
    "nuclear_truncate": 3,
    "give_up": 3,
}
_LEVEL_NAMES = {0: "no recovery needed", 1: "level 1 — aggressive budget",
                2: "level 2 — emergency truncate", 3: "level 3 — nuclear truncate"}
_MAX_LEVEL = 3


def _bar_style(fraction: float, warn_at: float) -> str:
    if fraction >= 1:
        return "danger"
    if fraction >= warn_at:
        return "warning"
    return "success"


class ContextPanel:
    """History size against the cap, tokens against the window, ladder rung, summarizer state."""

    def __init__(self, *, title: str = "chat", settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._owner = threading.get_ident()
        self._pending: deque[ev.Event] = deque()
        self._unsubscribe: Callable[[], None] | None = None
        self.history_bytes = 0
        self.est_tokens = 0
        self.window: int | None = None
        self.cap: int | None = self.settings.max_payload
        self.cap_source = "configured" if self.cap else "none"
        self.ladder_level = 0
        self.ladder_text = _LEVEL_NAMES[0]
        self.summary_text = "summarizer idle"
        self.last_action = "no turn yet"

        layout = widgets.Layout(width="320px")
        self.title = widgets.HTML(value=f"<b>{title}</b>")
        self.size_bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, layout=layout,
                                              description="history", bar_style="success")
        self.size_label = widgets.Label(value="")
        self.token_bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0,
                                               layout=widgets.Layout(width="320px"),
                                               description="tokens", bar_style="success")
        self.token_label = widgets.Label(value="")
        self.ladder_bar = widgets.IntProgress(value=0, min=0, max=_MAX_LEVEL,
                                              layout=widgets.Layout(width="320px"),
                                              description="ladder", bar_style="success")
        self.ladder_label = widgets.Label(value=self.ladder_text)
        self.summary_label = widgets.Label(value=self.summary_text)
        self.action_label = widgets.Label(value=self.last_action)
        self.widget = widgets.VBox([
            self.title,
            widgets.HBox([self.size_bar, self.size_label]),
            widgets.HBox([self.token_bar, self.token_label]),
            widgets.HBox([self.ladder_bar, self.ladder_label]),
            self.summary_label,
            self.action_label,
        ])
        self._render()

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, session: Any) -> None:
        """Follow ``session``'s events (replacing any session followed before)."""
        self.detach()
        self._unsubscribe = session.subscribe(self.handle)
        status = getattr(session, "status", None)
        if callable(status):
            self.update_status(status())

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def update_status(self, status: Any) -> None:
        """Take sizes from a ``session.status()`` value (attribute names as in the session)."""
        self.history_bytes = int(getattr(status, "history_bytes", self.history_bytes) or 0)
        self.est_tokens = int(getattr(status, "est_tokens", self.est_tokens) or 0)
        self.window = getattr(status, "window", self.window)
        self.cap = getattr(status, "cap", self.cap)
        source = getattr(status, "cap_source", None)
        self.cap_source = str(source) if source else ("configured" if self.cap else "none")
        self._render()

    # -- events ---------------------------------------------------------------------------
    def handle(self, event: ev.Event) -> None:
        """Session event callback; applies the event on the owning thread, else queues it."""
        self._pending.append(event)
        if threading.get_ident() != self._owner:
            return
        while self._pending:
            self._apply(self._pending.popleft())
        self._render()

    def _apply(self, event: ev.Event) -> None:
        message = (event.message or "").strip()
        if isinstance(event, ev.Preflight):
            self.history_bytes, self.est_tokens = event.body_bytes, event.est_tokens
            self.window = event.window
            self._set_cap(event.cap)
            # A new turn starts on the bottom rung.
            self.ladder_level, self.ladder_text = 0, _LEVEL_NAMES[0]
            if event.action == "ok":
                return
        elif isinstance(event, ev.TurnFinished):
            self.history_bytes, self.est_tokens = event.history_bytes, event.est_tokens
            self.window = event.window
            self._set_cap(event.cap)
            return
        elif isinstance(event, ev.LadderStep):
            rung = LADDER_LEVELS.get(event.level, min(event.attempt, _MAX_LEVEL))
            self.ladder_level = max(self.ladder_level, rung)
            self.ladder_text = (f"attempt {event.attempt}: {event.level.replace('_', ' ')} "
                                f"({event.before_messages} → {event.after_messages} msgs)")
        elif isinstance(event, ev.CompactionPhase):
            self.summary_text = message or f"compaction: {event.phase}"
        elif isinstance(event, ev.CapChanged):
            self.cap, self.cap_source = event.cap, event.source
        elif isinstance(event, ev.Recovered):
            self.ladder_text = f"recovered after {event.attempts} attempt(s)"
        elif isinstance(event, ev.Failed):
            self.ladder_text = f"failed: {event.failure_kind}"
        if message:
            self.last_action = message

    def _set_cap(self, cap: int | None) -> None:
        """A cap from a size event; its source is known from settings or a CapChanged event."""
        if cap != self.cap:
            self.cap = cap
            if cap is None:
                self.cap_source = "none"
            elif cap == self.settings.max_payload:
                self.cap_source = "configured"
            else:
                self.cap_source = "learned"

    # -- rendering ------------------------------------------------------------------------
    def _render(self) -> None:
        warn_at = self.settings.preflight_cap_fraction
        reference = self.cap or self.settings.no_cap_warn_bytes
        fraction = self.history_bytes / reference if reference else 0.0
        self.size_bar.value = min(fraction, 1.0)
        self.size_bar.bar_style = _bar_style(fraction, warn_at)
        cap_text = (f"cap {format_size(self.cap)} ({self.cap_source})" if self.cap
                    else "no cap configured")
        self.size_label.value = f"{format_size(self.history_bytes)} of {cap_text}"
        window = self.window or 0
        tfraction = self.est_tokens / window if window else 0.0
        self.token_bar.value = min(tfraction, 1.0)
        self.token_bar.bar_style = _bar_style(tfraction, warn_at)
        self.token_label.value = (f"≈{self.est_tokens:,} of {window:,} tokens" if window
                                  else f"≈{self.est_tokens:,} tokens")
        self.ladder_bar.value = self.ladder_level
        self.ladder_bar.bar_style = ("success", "warning", "warning", "danger")[self.ladder_level]
        self.ladder_label.value = self.ladder_text
        self.summary_label.value = self.summary_text
        self.action_label.value = f"last: {self.last_action}"

    def text(self) -> str:
        """The plain-text fallback: the same facts as the widgets, one per line."""
        return "\n".join([
            f"history  {self.size_label.value}",
            f"tokens   {self.token_label.value}",
            f"ladder   {self.ladder_level}/{_MAX_LEVEL} — {self.ladder_label.value}",
            f"summary  {self.summary_label.value}",
            self.action_label.value,
        ])

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = self.text()
        return data

    def close(self) -> None:
        self.detach()
        self.widget.close()
