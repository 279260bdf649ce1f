"""``%chat explore``: an ipywidgets view to try compaction settings on a live session.

:class:`ExploreWidget` shows, for the settings in its sliders and fields, what the next
request would do to every message (``session.what_if``: a strip of one cell per message
coloured by fate, before/after sizes, the pre-flight line), recomputed when a value
changes (debounced on the kernel's event loop). The controls come in two groups: limits and
tool results, and when compaction runs (the chat budget's shares of the window and the cap,
the pre-flight rule for a jump past a share of the cap), with a tooltip on each and a
note saying which fires when. Each control starts at the value the next request would use
— the cap in force (configured, learned from a refusal on the network path, assumed), the
window in force (configured, the model's own set on the emulator or from the catalogue,
learned) — with a note under it saying where that value comes from (``Sources``: ``%chat
config``, a ``CHATCLI_*`` variable, ``ipython_config``; or the default); a cap or window
left alone asks for nothing, so showing a learned cap is no change. Buttons: **Replay with
these settings** (``replay`` on the session's transcript, in a worker thread, with a
progress bar and a cancel), **Apply to session** (the same validation and path as ``%chat
config``), **Undo apply** (``ctxr-undo``: the values from before the last Apply, through
``%chat config`` again; a stack, one Apply undone per click), **Reset** (back to the
session's settings in force). A value that is wrong shows one sentence in the widget,
naming the control by its label, never a traceback; the plan on screen is then dimmed
under a line saying it is stale (``STALE``) until the value is fixed. The session is named
as the user calls it (``name``: ``default``), in the title, the text, Apply's line and the
replay.

The widget tree is built once; values change through traits. Its rows wrap (flex-wrap,
columns with a minimum and a maximum width), so it reads in a narrow notebook column
as in a wide one. Widget state has no lock,
so the worker thread hands its values to the kernel's event loop. ``text()`` is the
plain-text fallback (terminals), always in ``_repr_mimebundle_``; the replay's plot is an
Image widget (``ctxr-replay-plot``), or one line when it cannot be drawn (no matplotlib).

**Live until the next cell, a snapshot after.** Under a kernel the explorer is shown under
a display id of its own. When a later cell starts (IPython's ``pre_run_cell``, unhooked
then) or the explorer is closed, that output is replaced by :meth:`ExploreWidget.snapshot`:
plain HTML (``<div class="ctxr-explore-snapshot">``, the plot embedded as a data URI) with
a text twin, stamped with its time — so a saved notebook reopened with no kernel and no
widget state shows the explorer's last state, never "Error displaying widget". The latest
display's snapshot follows the explorer (values set from code, a replay that finishes);
displaying the explorer again gives a new live display.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import html
import io
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
from IPython.core.error import UsageError

from ..core import theme, wording
from ..core.wording import plural
from ..errors import ConfigError, CtxRecoveryError
from ..session.replay import LIMITS, ReplayReport, replay
from ..session.what_if import FATE_COLOURS, FATE_WORDS, Fate, Plan, fate_strip_html
from ..settings import (
    ENV_VARS,
    MAX_CAP,
    MAX_WINDOW,
    MIN_CAP,
    MIN_WINDOW,
    Settings,
    format_size,
    parse_size,
)
from .subcommands import _session, _sources, _subcommand

if TYPE_CHECKING:
    from ..session import ChatSession
    from .magics import ChatMagics

__all__ = ["FATE_CHARS", "ExploreWidget", "text_legend"]

#: One character per fate for the plain-text strip.
FATE_CHARS: Mapping[Fate, str] = {
    Fate.KEPT: "·", Fate.PINNED_SYSTEM: "P", Fate.PINNED_NOTICE: "P", Fate.PINNED_REQUEST: "P",
    Fate.PREVIEWED: "p", Fate.ONE_LINED: "1", Fate.BUDGET_PREVIEW: "b", Fate.TRIMMED: "t",
    Fate.SUMMARIZED: "S", Fate.DROPPED: "x",
}
_TEXT_STRIP = 120
DEBOUNCE_SECONDS = 0.25

Apply = Callable[[Mapping[str, str]], str]
"""``apply({"CHATCLI_MAX_PAYLOAD": "256KB", ...})`` → the line to show (raises a
UsageError or ConfigError with one sentence)."""

Sources = Callable[[], Mapping[str, str]]
"""``sources()`` → Settings field → where its configured value comes from, in a few words
(``%chat config``, ``CHATCLI_MAX_PAYLOAD``, ``ipython_config / %config``); a field it does
not name is at its default."""

#: The line over a plan that no longer matches the controls (a value was refused).
STALE = "stale: the plan below is for the last valid values"
_STALE_LINE = (f"<div class='ctxr-stale-line' style='color:{theme.TEXT_ERROR};"
               f"font-size:90%;margin:2px 0'>⚠ {STALE}</div>")
_NOTE_STYLE = ("font-size:80%;line-height:1.2;margin:-2px 0 3px 154px;"
               f"color:{theme.TEXT_DIM}")

Checkpoint = Callable[[], Callable[[], frozenset[str]]]
"""``checkpoint()`` before an Apply → ``restore()``, which puts the configuration back as it
was (a setting that was unset is unset again) and returns the fields configured then."""

Publish = Callable[..., Any]
"""``publish(bundle, display_id=…, update=…)``: show a raw mime bundle (default: IPython's
``display(bundle, raw=True, …)``)."""


def _code(name: str) -> str:
    return f"<code style='font-size:inherit'>{name}</code>"


#: Which setting compacts when, under the "When compaction runs" controls.
COMPACTION_HELP = (
    "<details style='font-size:85%;line-height:1.4;margin:2px 0 0 4px'>"
    "<summary style='cursor:pointer'>Which of these compacts when?</summary>"
    "<div style='margin:2px 0 0 0'>A <b>growing chat</b> is compacted when its history "
    f"passes the <b>chat budget</b>: the smaller of its share of the window "
    f"({_code('chat_budget_ratio')}) and of the payload cap ({_code('cap_budget_fraction')}); "
    "the plan's <i>chat budget</i> line shows the number and which share set it.</div>"
    "<div style='margin:2px 0 0 0'>A request that <b>jumps</b> past the pre-flight share of "
    f"the cap in one step ({_code('preflight_cap_fraction')}: a large paste or tool result) "
    "is compacted at once, to a budget of the <i>jump budget</i> share of the window "
    f"({_code('preflight_budget_ratio')}).</div>"
    "<div style='margin:2px 0 0 0'>With a cap, the jump share only matters above the "
    "chat budget's cap share (85% vs 70% by default): a chat that grows step by step is "
    "compacted at 70% first.</div></details>")

_TIPS: Mapping[str, str] = {
    "cap": "max_payload (CHATCLI_MAX_PAYLOAD): the largest request body your proxy takes, "
           "e.g. 256KB; empty: none configured.",
    "window": "context_window (CHATCLI_CONTEXT_WINDOW) in tokens; empty or auto: the model's.",
    "per_result_max_chars": "per_result_max_chars: a tool result longer than this is sent "
                            "as a preview (its head and tail).",
    "turn_budget_chars": "turn_budget_chars: the tool results of one round trip together; "
                         "over it, the largest are previewed.",
    "microcompact_truncate_turns": "microcompact_truncate_turns: old tool results are "
                                   "previewed after this many round trips.",
    "microcompact_summarize_turns": "microcompact_summarize_turns: old tool results become "
                                    "one line after this many round trips.",
    "emergency_keep_messages": "emergency_keep_messages: the recent messages an emergency "
                               "truncation keeps (recovery ladder).",
    "chat_budget_ratio": "chat_budget_ratio: a growing chat is compacted when its history "
                         "passes this share of the context window (or the cap share below, "
                         "if smaller).",
    "cap_budget_fraction": "cap_budget_fraction: a growing chat is compacted when its "
                           "history passes this share of the payload cap (or the window "
                           "share above, if smaller).",
    "preflight_cap_fraction": "preflight_cap_fraction: a request that jumps past this share "
                              "of the cap in one step is compacted at once. A growing chat "
                              "meets the chat budget (cap) first when that is lower.",
    "preflight_budget_ratio": "preflight_budget_ratio: after such a jump, the chat budget is "
                              "this share of the window instead of chat_budget_ratio.",
}


def _style() -> dict[str, str]:
    return {"description_width": "150px"}


def _layout() -> widgets.Layout:
    # Stretches to its column (which sets the width), never wider than a field needs;
    # "auto", not 100%: a widget's margin would be added to 100% and overflow.
    return widgets.Layout(width="auto", max_width="400px", min_width="0")


def _column(children: list[widgets.Widget]) -> widgets.VBox:
    """A group of controls: beside the other while both fit, under it when not."""
    return widgets.VBox(children, layout=widgets.Layout(
        flex="1 1 320px", min_width="0", max_width="420px", margin="0 16px 4px 0",
        overflow="hidden"))


def _heading(text: str) -> widgets.HTML:
    return widgets.HTML(f"<div style='font-weight:bold;margin:2px 0 0 4px'>{text}</div>")


def _button(description: str, icon: str, **kwargs: Any) -> widgets.Button:
    return widgets.Button(description=description, icon=icon, **kwargs,
                          layout=widgets.Layout(width="auto", margin="2px 6px 2px 0"))


class ExploreWidget:
    """Compaction settings to try on ``session``, and what they would do (module docstring)."""

    def __init__(self, session: ChatSession, *, apply: Apply | None = None,
                 limits: Mapping[str, Any] | None = None,
                 debounce: float = DEBOUNCE_SECONDS, name: str | None = None,
                 sources: Sources | None = None,
                 live: bool | None = None, publish: Publish | None = None,
                 checkpoint: Checkpoint | None = None) -> None:
        self.session = session
        # What the user calls it (the kernel's default session is stored under a generated name).
        self.name = name or session.name
        self._apply = apply
        self._checkpoint = checkpoint
        self._sources = sources
        self._shown: dict[str, Any] = {}       # control -> the value in force put in it
        self._in_force: dict[str, str] = {}    # control -> where that value comes from
        # Per Apply: KEY -> the value before it, and what puts the configuration back exactly
        # (a setting that was unset is unset again, not set to its default's value).
        self._undo: list[dict[str, str]] = []
        self._restores: list[Callable[[], frozenset[str]] | None] = []
        self._fresh: tuple[str, str] = ("", "")   # the strip and numbers of the plan shown
        self._force_values: dict[str, int | None] = {}   # the cap and window in force
        self.limits = {k: v for k, v in (limits or {}).items() if k in LIMITS}
        self.debounce = debounce
        self._plan: Plan | None = None
        self.report: ReplayReport | None = None
        self._error: str | None = None
        self.computed = 0                      # plans computed (tests read it)
        self._pending: asyncio.TimerHandle | None = None
        self._quiet = False
        self._cancel = threading.Event()
        self._worker: threading.Thread | None = None
        # -- display: live widgets under one display id, then a snapshot (see _ipython_display_)
        self._live = live
        self._publish = publish or _display
        self.display_id: str | None = None
        self.snapshot_at: float | None = None   # when the display became a snapshot
        self.closed = False
        self._shell: Any = None                  # where the pre_run_cell hook is registered
        self._hook = self._next_cell             # the same bound method to unregister
        self._said = ""
        self.plot_png: bytes | None = None       # the last replay's plot
        self.plot_note: str | None = None        # why it has none (no matplotlib)

        # -- controls: (widget, what_if name) ----------------------------------------------
        def share(description: str) -> widgets.FloatSlider:
            return widgets.FloatSlider(min=0.05, max=1.0, step=0.05, description=description,
                                       style=_style(), layout=_layout())

        self.cap = widgets.Text(description="payload cap", placeholder="none, e.g. 256KB",
                                style=_style(), layout=_layout())
        self.window = widgets.Text(description="context window", placeholder="auto (tokens)",
                                   style=_style(), layout=_layout())
        self.emergency_keep = widgets.IntSlider(min=1, max=60, description="emergency keep",
                                                style=_style(), layout=_layout())
        self.truncate_turns = widgets.IntSlider(min=1, max=20, style=_style(),
                                                description="truncate results after",
                                                layout=_layout())
        self.summarize_turns = widgets.IntSlider(min=1, max=30, style=_style(),
                                                 description="one-line results after",
                                                 layout=_layout())
        self.per_result = widgets.IntText(description="per-result budget", style=_style(),
                                          layout=_layout())
        self.per_turn = widgets.IntText(description="per-turn budget", style=_style(),
                                        layout=_layout())
        self.chat_budget = share("chat budget (window)")
        self.cap_budget = share("chat budget (cap)")
        self.preflight_fraction = share("jump past (of cap)")
        self.target_ratio = share("jump budget (window)")
        # Not a setting: what the plan is for (a plan is always for a request still to send).
        self.next_size = widgets.Text(
            description="next message", placeholder="like the last one, e.g. 8KB",
            tooltip="The size of the next message to plan for (e.g. 8KB, 2.5MB); empty: one "
                    "the size of the last message you sent.", style=_style(), layout=_layout())
        self.fields: dict[str, widgets.Widget] = {
            "cap": self.cap, "window": self.window,
            "per_result_max_chars": self.per_result, "turn_budget_chars": self.per_turn,
            "microcompact_truncate_turns": self.truncate_turns,
            "microcompact_summarize_turns": self.summarize_turns,
            "emergency_keep_messages": self.emergency_keep,
            "chat_budget_ratio": self.chat_budget, "cap_budget_fraction": self.cap_budget,
            "preflight_cap_fraction": self.preflight_fraction,
            "preflight_budget_ratio": self.target_ratio,
        }
        for name, control in self.fields.items():
            control.tooltip = _TIPS[name]
        #: The words a control is named with (its label), for the sentences about it.
        self.labels: dict[str, str] = {name: w.description for name, w in self.fields.items()}
        self.labels["next_message"] = self.next_size.description
        #: Under each control: the value in force and where it comes from (or that it moved).
        self.notes: dict[str, widgets.HTML] = {name: widgets.HTML() for name in self.fields}
        self._note_texts: dict[str, str] = {}   # control -> its note, as text (not its HTML)
        for note in self.notes.values():
            note.add_class("ctxr-source")
        for control in (self.cap, self.window):
            # A Text view shows its tooltip only without a description: on its label, then.
            control.description_allow_html = True
            control.description = (f"<span title='{html.escape(control.tooltip, quote=True)}'>"
                                   f"{control.description}</span>")
        # -- views and buttons -----------------------------------------------------------------
        self.title = widgets.HTML()
        self.strip = widgets.HTML()
        self.numbers = widgets.HTML()
        self.message = widgets.HTML()
        self.legend = widgets.HTML(value=_legend())
        self.help = widgets.HTML(value=COMPACTION_HELP)
        self.replay_button = _button("Replay with these settings", "play")
        self.cancel_button = _button("Cancel", "stop", disabled=True)
        self.apply_button = _button("Apply to session", "check", button_style="primary",
                                    disabled=apply is None)
        self.reset_button = _button("Reset", "undo",
                                    tooltip="Back to the session's settings in force.")
        self.undo_button = _button("Undo apply", "history", disabled=True,
                                   tooltip="Nothing applied yet.")
        self.undo_button.add_class("ctxr-undo")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="replay",
                                            layout=widgets.Layout(width="auto",
                                                                  max_width="400px",
                                                                  visibility="hidden"))
        self.output = widgets.Output(layout=widgets.Layout(max_width="100%", overflow="auto"))
        # The replay plot: an Image widget (PNG bytes sent as a binary buffer), hidden until
        # a replay made one; not display data in the Output, which reaches the browser
        # as "[object Object]".
        self.plot = widgets.Image(format="png", layout=widgets.Layout(
            display="none", max_width="100%", height="auto", align_self="flex-start"))
        self.plot.add_class("ctxr-replay-plot")
        self.save_hint = widgets.HTML(
            f"<div style='font-size:85%;color:{theme.TEXT_DIM};margin:2px 0 0 "
            f"4px'>{html.escape(wording.EXPLORE_SAVE_HINT)}</div>")


        def noted(*names: str) -> list[widgets.Widget]:
            return [w for name in names for w in (self.fields[name], self.notes[name])]

        limits_column = _column([
            _heading("Limits and tool results"), self.next_size,
            *noted("cap", "window", "per_result_max_chars", "turn_budget_chars",
                   "microcompact_truncate_turns", "microcompact_summarize_turns",
                   "emergency_keep_messages")])
        compaction_column = _column([
            _heading("When compaction runs"),
            *noted("chat_budget_ratio", "cap_budget_fraction", "preflight_cap_fraction",
                   "preflight_budget_ratio"), self.help])
        wrap = widgets.Layout(flex_flow="row wrap", min_width="0")
        self.widget = widgets.VBox([
            self.title,
            widgets.HBox([limits_column, compaction_column], layout=wrap),
            self.strip, self.legend, self.numbers, self.message,
            widgets.HBox([self.replay_button, self.cancel_button, self.apply_button,
                          self.undo_button, self.reset_button], layout=wrap),
            self.progress, self.output, self.plot, self.save_hint,
        ], layout=widgets.Layout(max_width="900px", min_width="0"))
        for control in (*self.fields.values(), self.next_size):
            control.observe(self._changed, names="value")
        self.replay_button.on_click(lambda _b: self.start_replay())
        self.cancel_button.on_click(lambda _b: self._cancel.set())
        self.apply_button.on_click(lambda _b: self.apply())
        self.reset_button.on_click(lambda _b: self.reset())
        self.undo_button.on_click(lambda _b: self.undo())
        self.reset()

    # -- values ---------------------------------------------------------------------------------
    @property
    def plan(self) -> Plan | None:
        """The plan for the controls' values (the last good one while a value is wrong:
        then :attr:`stale`)."""
        self.flush()
        return self._plan

    @property
    def error(self) -> str | None:
        """The sentence saying what is wrong with the controls' values (None: nothing)."""
        self.flush()
        return self._error

    @property
    def stale(self) -> bool:
        """A value was refused: the plan shown is for the last valid values (marked so)."""
        return self.error is not None and self._plan is not None

    def moved(self, name: str) -> bool:
        """Whether control ``name`` holds another value than the one in force it was given
        (the cap or the window written otherwise, ``16KB`` for ``16 KB``, is not moved)."""
        value = self.fields[name].value
        if isinstance(value, str):
            text = value.strip()
            if text == str(self._shown.get(name, "")).strip():
                return False
            return _typed_value(name, text) != self._force_values.get(name, _UNREAD)
        if isinstance(value, float):
            return round(value, 6) != self._shown.get(name)
        return bool(value != self._shown.get(name))

    def overrides(self) -> dict[str, Any]:
        """The settings the controls ask for, as ``what_if`` takes them. The cap and the
        window show the value in force (learned, the model's...): untouched, they ask for
        nothing (the configured value stays); moved, they are the configured value."""
        values: dict[str, Any] = {
            # A browser sends a slider's 0.85 back as 0.8500000000000001.
            name: round(w.value, 6) if isinstance(w, widgets.FloatSlider) else w.value
            for name, w in self.fields.items()}
        for name in ("cap", "window"):
            if not self.moved(name):
                del values[name]
        if "cap" in values:
            values["cap"] = values["cap"].strip() or None
        if "window" in values:
            window = values["window"].strip()
            values["window"] = None if window.lower() in ("", "auto", "none") else window
        return values

    def shown_values(self) -> dict[str, Any]:
        """What each control shows (the cap and the window as in force when untouched)."""
        values = {name: w.value for name, w in self.fields.items()}
        values["cap"] = values["cap"].strip() or None
        values["window"] = values["window"].strip() or None
        return values

    def reset(self) -> None:
        """Controls back to the session's settings in force; the plan recomputed once."""
        self._load(next_message=True)
        self.refresh()

    def _load(self, *, next_message: bool = False) -> None:
        """Each control set to the value the next request would use, its note to where
        that value comes from (no plan is computed)."""
        s = self.session.settings
        status = self.session.status()
        where = self._where(s)
        # A configured cap as the user writes it; a learned or assumed one rounded (its
        # note gives the bytes).
        cap = _size_text(status.cap) if status.cap_source == "configured" \
            else format_size(status.cap) if status.cap else ""
        shown: dict[str, Any] = {
            "cap": cap, "window": str(status.window),
            "per_result_max_chars": s.per_result_max_chars,
            "turn_budget_chars": s.turn_budget_chars,
            "microcompact_truncate_turns": s.microcompact_truncate_turns,
            "microcompact_summarize_turns": s.microcompact_summarize_turns,
            "emergency_keep_messages": s.emergency_keep_messages,
            "chat_budget_ratio": s.chat_budget_ratio, "cap_budget_fraction": s.cap_budget_fraction,
            "preflight_cap_fraction": s.preflight_cap_fraction,
            "preflight_budget_ratio": s.preflight_budget_ratio,
        }
        in_force = {name: _configured(where[field]) if field in where else "default"
                    for name, field in ((n, _FIELD.get(n, n)) for n in shown)}
        in_force["cap"] = _cap_source(status.cap_source, status.cap, s.max_payload,
                                      where.get("max_payload"))
        in_force["window"] = _window_source(status.window_source, where.get("context_window"))
        self._shown, self._in_force = shown, in_force
        self._force_values = {"cap": status.cap, "window": status.window}
        self._quiet = True
        try:
            with contextlib.ExitStack() as stack:
                for w in self.fields.values():
                    stack.enter_context(w.hold_trait_notifications())
                stack.enter_context(self.next_size.hold_trait_notifications())
                if next_message:
                    self.next_size.value = ""
                for name, value in shown.items():
                    control = self.fields[name]
                    if isinstance(control, widgets.IntSlider | widgets.FloatSlider):
                        _fit_slider(control, value)
                    control.value = value
        finally:
            self._quiet = False
        self._show_notes()

    def _where(self, settings: Settings) -> dict[str, str]:
        """Settings field → where its configured value comes from (``Sources``); without
        one (a session outside ``%chat``), "configured" for a value off its default."""
        if self._sources is not None:
            return dict(self._sources())
        default = Settings()
        return {f.name: "configured" for f in dataclasses.fields(Settings)
                if getattr(settings, f.name) != getattr(default, f.name)}

    def _show_notes(self) -> None:
        """Each control's note: where its value comes from, or, moved, what it was."""
        plan = self._plan
        for name, note in self.notes.items():
            shown = _note_value(name, self._shown.get(name))
            if not self.moved(name):
                text = f"{shown}: {self._in_force.get(name, 'default')}" \
                    if name in ("cap", "window") and self._shown.get(name) \
                    else self._in_force.get(name, "default")
            else:
                was = self._in_force.get(name, "default")
                text = f"moved from {shown} — {'the default' if was == 'default' else was}"
                if name == "cap" and plan is not None and plan.cap_source == "learned" \
                        and self._error is None and plan.cap is not None:
                    text += f"; the learned {format_size(plan.cap)} still applies below it"
            self._note_texts[name] = text
            note.value = f"<div style='{_NOTE_STYLE}'>{html.escape(text)}</div>"

    def _changed(self, change: Any) -> None:
        if self._quiet:
            return
        if self.debounce <= 0:
            self.refresh()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:      # no event loop (a terminal, a test): compute now
            self.refresh()
            return
        if self._pending is not None:
            self._pending.cancel()
        self._pending = loop.call_later(self.debounce, self._refresh_shown)

    def _refresh_shown(self) -> None:
        # Called by the event loop, which would only log an error: show it instead.
        try:
            self.refresh()
        except Exception as e:
            self._refused(f"what-if failed: {type(e).__name__}: {e}")

    def flush(self) -> None:
        """Recompute now if a change is waiting for its debounce (before anything reads
        the plan: Apply, Replay, the text fallback)."""
        if self._pending is not None:
            self._pending.cancel()
            self.refresh()

    def refresh(self) -> None:
        """Recompute the plan for the controls' values and show it (or the one sentence
        that says what is wrong, the plan shown marked stale)."""
        self._pending = None
        name = self.name
        self.title.value = (f"<b>Explore compaction settings</b> — session "
                            f"<code>{html.escape(name)}</code> ({len(self.session.history)} "
                            "messages)")
        try:
            size = self._check()
            plan = self.session.what_if(size=size, **self.overrides())
        except CtxRecoveryError as e:
            self._refused(self._in_words_of_controls(str(e)))
            return
        self.computed += 1
        self._plan = plan
        self._error = None
        self.strip.value = fate_strip_html(plan)
        facts = plan.summary_lines()
        self.numbers.value = ("<div style='line-height:1.4'>"
                              + "".join(f"<div>{html.escape(line)}</div>" for line in facts)
                              + "</div>")
        self._fresh = (self.strip.value, self.numbers.value)
        self._mark_stale(False)
        self._show_notes()
        self._say("")

    def _refused(self, sentence: str) -> None:
        """A value the plan cannot take: the sentence, and the plan shown marked stale."""
        self._error = sentence
        self._mark_stale(self._plan is not None)
        self._show_notes()
        self._say(sentence, error=True)

    def _mark_stale(self, stale: bool) -> None:
        strip, numbers = self._fresh
        for view in (self.strip, self.numbers):
            (view.add_class if stale else view.remove_class)("ctxr-stale")
        if not stale:
            self.strip.value, self.numbers.value = strip, numbers
            return
        dim = "<div style='opacity:0.45' title='" + html.escape(STALE, quote=True) + "'>"
        self.strip.value = f"{_STALE_LINE}{dim}{strip}</div>"
        self.numbers.value = f"{dim}{numbers}</div>"

    def _check(self) -> int | None:
        """The controls' values checked one by one, a refusal said in the control's words
        (its label); returns the next message's size (None: like the last one)."""
        labels = self.labels

        def refuse(name: str, sentence: str) -> ConfigError:
            return ConfigError(f"{labels[name]}: {sentence}")

        typed = self.next_size.value.strip()
        size = None
        if typed:
            try:
                size = parse_size(typed)
            except ConfigError:
                raise refuse("next_message", f"{typed!r} is not a size; write it like 8KB, "
                             "or leave it empty for one like the last you sent.") from None
            if size == 0:
                raise refuse("next_message", "0 is no message; give its size, e.g. 8KB, or "
                             "leave it empty for one like the last you sent.")
        if self.moved("cap") and self.cap.value.strip():
            text = self.cap.value.strip()
            try:
                cap = parse_size(text)
            except ConfigError:
                raise refuse("cap", f"{text!r} is not a size; write it like 256KB, or leave "
                             "it empty for none.") from None
            if cap and not MIN_CAP <= cap <= MAX_CAP:
                raise refuse("cap", f"{format_size(cap)} is outside what a proxy's body "
                             f"limit can be; write {format_size(MIN_CAP)} to "
                             f"{format_size(MAX_CAP)}, or leave it empty for none.")
        text = self.window.value.strip()
        if self.moved("window") and text.lower() not in ("", "auto", "none", "0"):
            try:
                window = int(text.replace(",", "").replace("_", ""))
            except ValueError:
                raise refuse("window", f"{text!r} is not a whole number of tokens; write "
                             "it like 128000, or leave it empty for the model's own.") from None
            if not MIN_WINDOW <= window <= MAX_WINDOW:
                raise refuse("window", f"{window:,} tokens is outside what any model has; "
                             f"write {MIN_WINDOW:,} to {MAX_WINDOW:,}, or leave it empty for "
                             "the model's own.")
        for name in ("per_result_max_chars", "turn_budget_chars"):
            value = self.fields[name].value
            if value < 1:
                raise refuse(name, f"{value:,} is no budget; write a number of characters "
                             "of at least 1, e.g. 20000.")
        per_result, per_turn = self.per_result.value, self.per_turn.value
        if per_result > per_turn:
            raise refuse("per_result_max_chars",
                         f"{per_result:,} is above the {labels['turn_budget_chars']} "
                         f"({per_turn:,}); lower it to {per_turn:,} or less, or raise the "
                         f"{labels['turn_budget_chars']}.")
        truncate, summarize = self.truncate_turns.value, self.summarize_turns.value
        if summarize < truncate:
            raise refuse("microcompact_summarize_turns",
                         f"{summarize} is below {labels['microcompact_truncate_turns']} "
                         f"({truncate}); a result is truncated before it becomes one line, "
                         f"so set it to {truncate} or more.")
        return size

    def _in_words_of_controls(self, sentence: str) -> str:
        """A sentence from the settings (``CHATCLI_MAX_PAYLOAD=…``, ``per_result_max_chars``)
        with each setting named by its control's label instead."""
        names: list[tuple[str, str]] = []
        for name, label in self.labels.items():
            field = _FIELD.get(name, name)
            env = next((e for e, f in ENV_VARS.items() if f == field), None)
            names += [(n, label) for n in (env, field) if n]
        for word, label in sorted(names, key=lambda p: -len(p[0])):
            sentence = sentence.replace(word, label)
        return sentence

    def _say(self, text: str, *, error: bool = False) -> None:
        self._said = text
        colour = theme.TEXT_ERROR if error else theme.TEXT_OK
        self.message.value = (f"<span style='color:{colour}'>{html.escape(text)}</span>"
                              if text else "")
        self._follow()

    # -- apply and undo ----------------------------------------------------------------------
    def assignments(self) -> dict[str, str]:
        """The changed settings as ``%chat config`` KEY=VALUE pairs (against the settings in
        force: a learned cap or the model's window shown and left alone is no change)."""
        self.flush()
        if self.plan is None:
            return {}
        return {_key(field): _config_text(field, new)
                for field, (_old, new) in self.plan.changes.items()}

    def apply(self) -> None:
        """Apply the changed settings through ``%chat config`` (its validation and path);
        what they were before is kept for :meth:`undo` (a stack: each Apply undoes in turn)."""
        if self._apply is None:
            return
        self.flush()
        if self.error is not None:
            self._say(f"nothing applied: {self.error}", error=True)
            return
        values = self.assignments()
        if not values:
            self._say("nothing to apply: these are the session's settings in force")
            return
        settings = self.session.settings
        before = {key: _config_text(field_, getattr(settings, field_))
                  for key, field_ in ((k, _field_of(k)) for k in values)}
        restore = self._checkpoint() if self._checkpoint is not None else None
        self.apply_button.disabled = True
        try:
            line = self._apply(values)
        except (UsageError, CtxRecoveryError) as e:
            self._say(str(e), error=True)
            return
        finally:
            self.apply_button.disabled = False
        self._undo.append(before)
        self._restores.append(restore)
        self._show_undo()
        self._load()
        self.refresh()
        self._say(f"applied to session {self.name}: {line or 'done'}")

    def undo(self) -> None:
        """Put back the settings from before the last Apply, through ``%chat config``; the
        controls and the plan follow (an earlier Apply can be undone next)."""
        if self._apply is None or not self._undo:
            return
        before, restore = self._undo[-1], self._restores[-1]
        try:
            if restore is None:
                line = self._apply(before)
            else:
                configured = restore()
                line = "set " + ", ".join(
                    f"{k}={v}" if _field_of(k) in configured else f"{k} back to its default ({v})"
                    for k, v in before.items())
        except (UsageError, CtxRecoveryError) as e:
            self._say(f"cannot undo: {e}", error=True)
            return
        self._undo.pop()
        self._restores.pop()
        self._show_undo()
        self._load()
        self.refresh()
        self._say(f"undid Apply on session {self.name}: {line or 'done'}")

    def _show_undo(self) -> None:
        self.undo_button.disabled = not self._undo
        self.undo_button.tooltip = (
            "Put back " + ", ".join(f"{k}={v}" for k, v in self._undo[-1].items())
            + f" (as before the last Apply; {plural(len(self._undo), 'Apply', 'Applies')} "
            "to undo)" if self._undo else "Nothing applied yet.")

    # -- replay ----------------------------------------------------------------------------
    def start_replay(self) -> None:
        """Replay the session's transcript with these settings: in a worker thread under a
        kernel (progress bar, Cancel), at once where there is no event loop."""
        self.flush()
        if self.error is not None:
            self._say(f"cannot replay: {self.error}", error=True)
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._cancel.clear()
        self.replay_button.disabled = True
        self.cancel_button.disabled = False
        self.progress.value, self.progress.layout.visibility = 0, "visible"
        settings = self.overrides()
        if loop is None:
            self._replay(settings, lambda fn: fn())
            return

        def hand_over(fn: Callable[[], None]) -> None:
            loop.call_soon_threadsafe(fn)

        self._worker = threading.Thread(target=self._replay, args=(settings, hand_over),
                                        name="ipy_ctxrecovery-replay", daemon=True)
        self._worker.start()

    def _replay(self, settings: dict[str, Any],
                hand_over: Callable[[Callable[[], None]], None]) -> None:
        def progress(done: int, total: int) -> None:
            def show() -> None:
                self.progress.max = total
                self.progress.value = done
            hand_over(show)

        report: ReplayReport | None = None
        problem: str | None = None
        png: bytes | None = None
        note: str | None = None
        try:
            report = replay(self.session, settings=settings, limits=self.limits,
                            on_progress=progress, cancel=self._cancel)
            # Named as the user calls the session, not by its stored name.
            report = dataclasses.replace(report, source=self.name)
            png, note = _plot_png(report)     # here: drawing takes a while
        except CtxRecoveryError as e:
            problem = str(e)
        except Exception as e:  # a bug: shown in the widget, never lost in a thread
            problem = f"replay failed: {type(e).__name__}: {e}"

        def finish() -> None:
            try:
                if problem is not None:
                    self._say(problem, error=True)
                    return
                assert report is not None
                self.report, self.plot_png, self.plot_note = report, png, note
                # The outputs trait, not clear_output(): that one captures the kernel's
                # current message (nbclient then fails with a KeyError in its emulation).
                self.output.outputs = ()
                self.output.append_display_data(report)
                if png is not None:
                    self.plot.value = png
                    self.plot.layout.display = ""
                else:
                    self.plot.layout.display = "none"
                    self.output.append_display_data(_Line(note or "no plot"))
                run = report.runs[0] if report.runs else None
                if run is not None:
                    self._say(f"replayed {run.answered}/{run.total_turns} turns: "
                              f"{run.requests} requests, {sum(run.rejections.values())} "
                              f"rejected, {run.summaries} LLM summaries"
                              + (" (cancelled)" if report.cancelled else ""))
            finally:
                self.replay_button.disabled = False
                self.cancel_button.disabled = True
                self.progress.layout.visibility = "hidden"
                self._follow()
        hand_over(finish)

    # -- display ---------------------------------------------------------------------------
    def text(self) -> str:
        """The plain-text fallback: the settings, the plan's facts and a strip of fates."""
        self.flush()
        values = self.shown_values()
        lines = [f"explore session {self.name}: "
                 + ", ".join(f"{k}={_shown(k, v)}" for k, v in values.items())]
        said = [f"{name} {note}" for name, note in self._source_notes().items()]
        if said:
            lines.append("sources: " + "; ".join(said))
        if self.error:
            lines.append(f"✗ {self.error}")
            if self.plan is not None:
                lines.append(STALE)
        if self.plan is not None:
            lines += self.plan.summary_lines()
            lines.append("fates: " + text_strip(self.plan))
            lines.append("legend: " + text_legend())
        if self.report is not None:
            lines += ["", self.report.text()]
        return "\n".join(lines)

    def _source_notes(self) -> dict[str, str]:
        """Control → its note for the text form: the cap's and the window's always, the
        others' when not the default."""
        return {name: text for name, text in self._note_texts.items()
                if name in ("cap", "window") or text != "default"}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self.closed:
            return self.snapshot()
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = self.text()
        return data

    def _ipython_display_(self) -> None:
        """Shown under a display id of its own: the live widgets until the next cell runs
        (IPython's ``pre_run_cell``) or the explorer is closed, then a snapshot of its last
        state — plain HTML and text, no widget, so a saved notebook reopened without a
        kernel or widget state shows it. The latest display's snapshot follows the
        explorer (a value set from code, a replay that finishes); displaying it again
        makes a new live display, and earlier ones keep the snapshot they had."""
        if self.closed or not self._is_live():
            self._publish(self._repr_mimebundle_(), display_id=None, update=False)
            return
        self.display_id = f"ctxr-explore-{uuid.uuid4().hex}"
        self.snapshot_at = None
        self._publish(self._repr_mimebundle_(), display_id=self.display_id, update=False)
        self._watch()

    def _is_live(self) -> bool:
        """Display updates reach a front end (a kernel), so a display can be replaced."""
        if self._live is not None:
            return self._live
        from IPython import get_ipython

        return getattr(get_ipython(), "kernel", None) is not None

    def _watch(self) -> None:
        from IPython import get_ipython

        shell = get_ipython()
        if self._shell is None and shell is not None:
            shell.events.register("pre_run_cell", self._hook)
            self._shell = shell

    def _unwatch(self) -> None:
        if self._shell is not None:
            with contextlib.suppress(ValueError):
                self._shell.events.unregister("pre_run_cell", self._hook)
            self._shell = None

    def _next_cell(self, info: Any = None) -> None:
        """``pre_run_cell``: a later cell starts; the live display becomes the snapshot."""
        try:
            self._freeze()
        except Exception as e:   # IPython would print a traceback over the user's cell
            self._unwatch()
            print(f"⚠ the explorer's snapshot failed: {type(e).__name__}: {e}",
                  file=sys.stderr)

    def _freeze(self) -> None:
        self._unwatch()
        if self.display_id is None:
            return
        self.flush()                                # a change waiting for its debounce
        self.snapshot_at = time.time()
        self._publish(self.snapshot(), display_id=self.display_id, update=True)

    def _follow(self) -> None:
        """The state changed while the latest display is a snapshot: show the new one."""
        if self.display_id is None or self.snapshot_at is None or self.closed:
            return
        self.snapshot_at = time.time()
        self._publish(self.snapshot(), display_id=self.display_id, update=True)

    def snapshot(self) -> dict[str, str]:
        """The explorer's state as plain HTML and text (what replaces the live widgets):
        the settings as the controls have them, the plan, the fates with their legend, the
        last replay's table and plot."""
        self.flush()
        note = wording.explore_snapshot_note(self.snapshot_at or time.time(), closed=self.closed)
        text = [note, self.text()]
        if self._said and not self._error:
            text.insert(2, self._said)
        if self.report is not None and self.plot_note:
            text.append(self.plot_note)
        return {"text/plain": "\n".join(text), "text/html": self._snapshot_html(note)}

    def _snapshot_html(self, note: str) -> str:
        e = html.escape
        parts = [
            '<div class="ctxr-explore-snapshot" style="font-family:var(--jp-ui-font-family, '
            'sans-serif);font-size:var(--jp-ui-font-size1, 13px);line-height:1.45;'
            f'max-width:900px;border-left:3px solid {theme.TRACK};'
            'padding-left:8px">',
            f"<div class='ctxr-explore-title'>{self.title.value}</div>",
            f"<div class='ctxr-snapshot-note' style='color:{theme.TEXT_DIM};"
            f"font-size:90%'>{e(note)}</div>",
            self._settings_html()]
        if self._error:
            parts.append(f"<div class='ctxr-explore-error' style='color:{theme.TEXT_ERROR}'>"
                         f"✗ {e(self._error)}</div>")
        if self._plan is not None:
            parts += [f"<div class='ctxr-explore-strip'>{self.strip.value}</div>",
                      self.legend.value,
                      f"<div class='ctxr-explore-plan'>{self.numbers.value}</div>"]
        if self._said and not self._error:
            parts.append(f"<div class='ctxr-explore-message'>{e(self._said)}</div>")
        if self.report is not None:
            parts.append("<div class='ctxr-explore-replay' style='margin:6px 0 0 0'>"
                         f"{self.report.html()}")
            if self.plot_png is not None:
                data = base64.b64encode(self.plot_png).decode("ascii")
                parts.append('<img class="ctxr-replay-plot" alt="replay: history per turn" '
                             'style="max-width:100%;height:auto" '
                             f'src="data:image/png;base64,{data}">')
            elif self.plot_note:
                parts.append(f"<div class='ctxr-replay-noplot'>{e(self.plot_note)}</div>")
            parts.append("</div>")
        parts.append("</div>")
        return "".join(parts)

    def _settings_html(self) -> str:
        """The controls as they were moved, one row each; a value other than the session's
        says the session's."""
        e = html.escape
        changes = self._plan.changes if self._plan is not None else {}
        values = self.shown_values()
        typed = self.next_size.value.strip()
        rows: list[tuple[str, str, str | None]] = [
            (self.labels["next_message"], typed or "like the last one", None)]
        for key in self.fields:
            field = _FIELDS.get(key, key)
            was = (_setting_text(field, changes[field][0]) if field in changes else None)
            rows.append((self.labels[key], _shown(key, values[key]), was))
        # Left-aligned, unpadded: JupyterLab's output tables right-align their cells.
        cell = "<td style='text-align:left;padding:0 12px 0 0"
        cells = "".join(
            f"<tr>{cell}'>{e(label)}</td>"
            f"{cell}'>{'<b>' + e(value) + '</b>' if was else e(value)}</td>"
            f"{cell};color:{theme.TEXT_DIM}'>"
            f"{'session: ' + e(was) if was else ''}</td></tr>"
            for label, value, was in rows)
        return ("<table class='ctxr-explore-settings' style='margin:4px 0;font-size:inherit;"
                f"border-collapse:collapse'>{cells}</table>")

    def close(self) -> None:
        """Stop a replay, show the snapshot in place of the live display, close the widgets."""
        self._cancel.set()
        self.closed = True
        self._freeze()          # unhooks; a change waiting for its debounce is computed first
        self.widget.close()


_FIELDS = {"cap": "max_payload", "window": "context_window"}
"""A control's key → the setting ``Plan.changes`` names."""


class _Line:
    """One line of display data (a plot the replay could not draw)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text,
                "text/html": f"<div class='ctxr-replay-noplot'>{html.escape(self.text)}</div>"}


def _display(bundle: Mapping[str, Any], *, display_id: str | None, update: bool) -> None:
    from IPython.display import display

    kwargs: dict[str, Any] = {"display_id": display_id} if display_id else {}
    if update:
        kwargs["update"] = True
    display(dict(bundle), raw=True, **kwargs)


def _plot_png(report: ReplayReport) -> tuple[bytes | None, str | None]:
    """The replay's plot as PNG, or (None, the one line that says why there is none)."""
    try:
        return report.plot().png(), None
    except CtxRecoveryError as e:
        return None, f"no plot: {e}"
    except Exception as e:   # a drawing bug: one line, never a traceback in the widget
        return None, f"no plot: {type(e).__name__}: {e}"


def _setting_text(field: str, value: Any) -> str:
    if field == "max_payload":
        return _size_text(value) or "none"
    if field == "context_window":
        return f"{value}" if value else "auto"
    return str(value)


def text_legend() -> str:
    """What each character of :func:`text_strip` means, on one line (from ``FATE_CHARS``)."""
    seen: dict[str, str] = {}
    for fate, char in FATE_CHARS.items():
        seen.setdefault(char, "pinned" if fate.value.startswith("pinned") else FATE_WORDS[fate])
    return ", ".join(f"{char} {word}" for char, word in seen.items())


def text_strip(plan: Plan, width: int = _TEXT_STRIP) -> str:
    """One character per message (``FATE_CHARS``), grouped when longer than ``width``."""
    fates = [m.fate for m in plan.messages]
    size = max(1, -(-len(fates) // width))
    order = list(Fate)
    return "".join(FATE_CHARS[max(fates[i:i + size], key=order.index)]
                   for i in range(0, len(fates), size))


def _legend() -> str:
    seen: dict[str, str] = {}
    for fate, colour in FATE_COLOURS.items():
        word = "pinned" if fate.value.startswith("pinned") else FATE_WORDS[fate]
        seen.setdefault(word, colour)
    return "<div style='font-size:85%;line-height:1.4'>" + " ".join(
        f"<span style='white-space:nowrap;margin-right:10px'><span style='display:inline-block;"
        f"width:10px;height:10px;background:{c};margin-right:3px'></span>{html.escape(w)}</span>"
        for w, c in seen.items()) + "</div>"


def _size_text(value: int | None) -> str:
    """A cap as a person writes it (the field, what Apply sets): ``256 KB`` when that is
    exact, else bytes (``12345 B``)."""
    if not value:
        return ""
    short = format_size(value)
    return short if parse_size(short) == value else f"{value} B"


def _shown(name: str, value: Any) -> str:
    if value is None:
        return "none" if name == "cap" else "auto"
    return str(value)


def _fit_slider(slider: widgets.IntSlider | widgets.FloatSlider, value: float) -> None:
    """Widen ``slider`` to hold ``value`` as it is (a slider clamps to its ends, and a
    browser snaps to its step): a value in force past an end or between steps is shown
    whole, not turned into a change."""
    slider.max = max(slider.max, value)
    slider.min = min(slider.min, value)
    if isinstance(slider, widgets.FloatSlider):
        steps = (value - slider.min) / slider.step
        if abs(steps - round(steps)) > 1e-6:
            slider.step = 0.01 if abs(value * 100 - round(value * 100)) < 1e-6 else 0.001


_UNREAD = object()
"""What a cap or a window that cannot be read compares as (unequal to any value)."""


def _typed_value(name: str, text: str) -> Any:
    """The cap (bytes, None for none) or the window (tokens) ``text`` says; ``_UNREAD``
    when it says neither."""
    try:
        if name == "cap":
            return parse_size(text) or None if text else None
        if text.lower() in ("", "auto", "none", "0"):
            return _UNREAD          # the model's own: compared by what the plan finds
        return int(text.replace(",", "").replace("_", ""))
    except (ConfigError, ValueError):
        return _UNREAD


#: Control → the Settings field it sets (the others are named by theirs).
_FIELD: Mapping[str, str] = {"cap": "max_payload", "window": "context_window"}


def _field_of(key: str) -> str:
    return ENV_VARS.get(key, key)


def _key(field: str) -> str:
    """The ``%chat config`` key of a Settings field: its variable if it has one."""
    return next((env for env, f in ENV_VARS.items() if f == field), field)


def _config_text(field: str, value: Any) -> str:
    """A Settings value as ``%chat config`` takes it (what Apply and Undo set)."""
    if field == "max_payload":
        return _size_text(value) if value else "0"
    if field == "context_window":
        return str(value) if value else "auto"
    return str(value)


def _note_value(name: str, value: Any) -> str:
    if name == "cap":
        return str(value) if value else "none"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if name != "window" else str(value)
    return str(value)


def _configured(where: str | None) -> str:
    return "configured" if where in (None, "configured") else f"configured ({where})"


def _cap_source(source: str | None, cap: int | None, configured: int | None,
                where: str | None) -> str:
    """Where the cap in force comes from, in a few words."""
    exact = f"{cap:,} bytes" if cap else ""
    if source == "learned":
        below = f", below the configured {format_size(configured)}" if configured else ""
        return f"learned from a refusal on this network path, {exact}{below}"
    if source == "configured":
        return _configured(where)
    if source == "assumed":
        return f"assumed for this session, {exact}: none configured or learned"
    return "none configured or learned"


def _window_source(source: str | None, where: str | None) -> str:
    """Where the window in force comes from, in a few words (``RequestSizer.window_source``)."""
    if source == "configured":
        return _configured(where)
    if source == "set on the emulator":
        return "the model's own, set on the emulator"
    if source == "model catalogue":
        return "the model's own, from the model catalogue"
    if source == "reported by the server":
        return "the model's own, reported by the server"
    if source == "learned from the provider":
        return "learned from an overflow the provider reported"
    if source == "guessed":
        return "guessed: the model catalogue does not know this model"
    return source or "the model's own"


def config_sources(magics: ChatMagics) -> dict[str, str]:
    """Settings field → where ``%chat config``'s settings say its value comes from, for
    the explorer's notes: ``%chat config``, ``ipython_config / %config`` (the value is the
    shell's configuration's), or the ``CHATCLI_*`` variable; default fields are left out."""
    shell_config = getattr(getattr(magics, "shell", None), "config", None)
    section = shell_config.get("ChatMagics", {}) if shell_config is not None else {}
    file_overrides = section.get("settings_overrides", {}) if section else {}
    out = {}
    for field, source in _sources(magics).items():
        if source == "environment":
            out[field] = _key(field)
        elif source == "%chat config":
            if field in ("max_payload", "context_window"):
                from_file = field in section and section[field] == getattr(magics, field)
            else:
                from_file = field in file_overrides \
                    and file_overrides[field] == magics.settings_overrides.get(field)
            out[field] = "ipython_config / %config" if from_file else "%chat config"
    return out


# -- %chat explore --------------------------------------------------------------------------

@_subcommand("explore", "Try compaction settings on a session: what the next request would "
             "keep, preview, summarize or drop; replay the session with them; apply them.")
def _explore(magics: ChatMagics, args: Any) -> ExploreWidget:
    from .subcommands import run_subcommand

    session = _session(magics, args)
    ws = magics.workspace
    if session.model.startswith("emulator") and ws.emulator is not None \
            and session.endpoint.emulator is ws.emulator:
        limits: dict[str, Any] = {"context_window": ws.emulator.context_window,
                                  **ws.emulator_limits}
    else:
        limits = {"context_window": session.window}

    def apply(values: Mapping[str, str]) -> str:
        line = "config " + " ".join(f"{k}={v}" for k, v in values.items())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            run_subcommand(magics, line)
        return out.getvalue().strip()

    def checkpoint() -> Callable[[], frozenset[str]]:
        kept = (dict(magics.settings_overrides), magics.max_payload, magics.context_window)

        def restore() -> frozenset[str]:
            overrides, max_payload, window = kept
            with magics.hold_trait_notifications():
                magics.settings_overrides = overrides
                magics.max_payload = max_payload
                magics.context_window = window
            traits = {"max_payload": max_payload, "context_window": window}
            return frozenset(overrides) | {k for k, v in traits.items() if v is not None}
        return restore

    return ExploreWidget(session, apply=apply, limits=limits, name=args.session,
                         sources=lambda: config_sources(magics), live=magics.is_live(),
                         checkpoint=checkpoint)

