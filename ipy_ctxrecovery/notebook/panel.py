"""The live context panel: an ipywidgets view of one session's size, recovery and summarizer.

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

from ..core import events as ev
from ..core.ladder.decide import Level
from ..core.wording import describe
from ..settings import Settings, format_size

__all__ = ["LADDER_LEVELS", "STEP_WORDS", "ContextPanel"]

#: ladder Level -> the step shown on the panel's 0-3 bar (0: no recovery this turn).
LADDER_LEVELS: dict[Level, int] = {
    Level.LOWER_MAX_TOKENS: 0,
    Level.EXACT_FIT: 0,
    Level.AGGRESSIVE: 1,
    Level.EMERGENCY: 2,
    Level.NUCLEAR: 3,
    Level.GIVE_UP: 3,
}
#: ladder Level -> what that recovery step did, in plain words.
STEP_WORDS: dict[Level, str] = {
    Level.LOWER_MAX_TOKENS: "asked for a shorter answer (smaller max_tokens)",
    Level.EXACT_FIT: "trimmed the history just enough to fit",
    Level.AGGRESSIVE: "shortened big tool results",
    Level.EMERGENCY: "dropped older messages",
    Level.NUCLEAR: "kept only the latest messages",
    Level.GIVE_UP: "gave up",
}
_NONE_NEEDED = "none needed"
_MAX_LEVEL = 3


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _bar_style(fraction: float, warn_at: float) -> str:
    if fraction >= 1:
        return "danger"
    if fraction >= warn_at:
        return "warning"
    return "success"


class ContextPanel:
    """History size against the cap, tokens against the window, the last turn's recovery
    (with the session's counts), summarizer state."""

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
        self.ladder_text = _NONE_NEEDED
        self.counts_text = ""            # recoveries/compactions so far, from session.status()
        self._session: Any = None
        self._in_turn = False            # the next turn event starts a new turn
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
                                              description="recovery", bar_style="success")
        self.ladder_label = widgets.Label(value="")
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
        self._session = session
        self.refresh()

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._session = None

    def refresh(self) -> None:
        """Take sizes and counts from the followed session's ``status()`` (what
        ``%chat status`` prints), so the two always agree."""
        status = getattr(self._session, "status", None)
        if callable(status):
            self.update_status(status())

    def update_status(self, status: Any) -> None:
        """Take sizes from a ``session.status()`` value (attribute names as in the session)."""
        self.history_bytes = int(getattr(status, "history_bytes", self.history_bytes) or 0)
        self.est_tokens = int(getattr(status, "est_tokens", self.est_tokens) or 0)
        self.window = getattr(status, "window", self.window)
        self.cap = getattr(status, "cap", self.cap)
        source = getattr(status, "cap_source", None)
        self.cap_source = str(source) if source else ("configured" if self.cap else "none")
        recoveries = getattr(status, "recoveries", None)
        compactions = getattr(status, "compactions", None)
        if recoveries is not None and compactions is not None:
            self.counts_text = (f"{_plural(int(recoveries), 'recovery', 'recoveries')}, "
                                f"{_plural(int(compactions), 'compaction')} so far")
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
        message = describe(event).strip()
        if not isinstance(event, ev.CapChanged) and not self._in_turn:
            # The first event of a turn: the panel shows the recovery of the LAST turn
            # only; earlier ones live on in the counts.
            self._in_turn = True
            self.ladder_level, self.ladder_text = 0, _NONE_NEEDED
        if isinstance(event, ev.Preflight):
            self.history_bytes, self.est_tokens = event.body_bytes, event.est_tokens
            self.window = event.window
            self._set_cap(event.cap)
            if event.action == "ok":
                return
        elif isinstance(event, ev.TurnFinished):
            self._in_turn = False
            self.history_bytes, self.est_tokens = event.history_bytes, event.est_tokens
            self.window = event.window
            self._set_cap(event.cap)
            self.refresh()  # the same numbers as %chat status
            return
        elif isinstance(event, ev.LadderStep):
            rung = LADDER_LEVELS.get(event.level, min(event.attempt, _MAX_LEVEL))
            self.ladder_level = max(self.ladder_level, rung)
            words = STEP_WORDS[event.level]
            self.ladder_text = (f"step {event.attempt}: {words} "
                                f"({event.before_messages} → {event.after_messages} msgs)")
        elif isinstance(event, ev.CompactionPhase):
            self.summary_text = message or f"compaction: {event.phase}"
        elif isinstance(event, ev.CapChanged):
            self.cap, self.cap_source = event.cap, event.source
        elif isinstance(event, ev.Recovered):
            self.ladder_text = f"recovered in {_plural(event.attempts, 'step')}"
        elif isinstance(event, ev.Failed):
            self._in_turn = False
            self.ladder_text = f"failed ({event.failure_kind.value.replace('_', ' ')})"
            self.refresh()
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
        size = format_size(self.history_bytes)
        self.size_label.value = (f"{size} of {format_size(self.cap)} cap ({self.cap_source})"
                                 if self.cap else f"{size} (no payload cap)")
        window = self.window or 0
        tfraction = self.est_tokens / window if window else 0.0
        self.token_bar.value = min(tfraction, 1.0)
        self.token_bar.bar_style = _bar_style(tfraction, warn_at)
        self.token_label.value = (f"≈{self.est_tokens:,} of {window:,} tokens" if window
                                  else f"≈{self.est_tokens:,} tokens")
        self.ladder_bar.value = self.ladder_level
        self.ladder_bar.bar_style = ("success", "warning", "warning", "danger")[self.ladder_level]
        when = "this turn" if self._in_turn else "last turn"
        self.ladder_label.value = f"{when}: {self.ladder_text}" + (
            f" · {self.counts_text}" if self.counts_text else "")
        self.summary_label.value = self.summary_text
        self.action_label.value = f"last: {self.last_action}"

    def text(self) -> str:
        """The plain-text fallback: the same facts as the widgets, one per line."""
        return "\n".join([
            f"history  {self.size_label.value}",
            f"tokens   {self.token_label.value}",
            f"recovery {self.ladder_label.value}",
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
