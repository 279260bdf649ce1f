"""A Cancel button in the running cell's own output, while a summary runs.

The panel's Cancel (:mod:`.panel`) is where the panel was shown — often far above the
cell that runs now. So a ``%%chat`` cell (and ``%chat compact``) also shows, in its own
output and only while the model summarizes older messages, a small widget with the same
button: it asks the Jupyter server to interrupt the kernel
(``POST /api/kernels/<id>/interrupt``, what the notebook's ■ button does), the
``KeyboardInterrupt`` lands in the summary request, and the compaction leaves the history
exactly as it was.

When the summary ends (used, refused, cancelled, or the turn ends some other way) the
output is replaced by one plain line, so a saved notebook never holds a widget that is
gone ("Error displaying widget: model not found"), and the widget is closed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

from ..core import events as ev
from ..core import theme
from ..core import wording as w

__all__ = ["INTERRUPT_JS", "CancelWidget", "CellCancel"]

INTERRUPT_JS = r"""
function config() {
  const el = document.getElementById("jupyter-config-data");
  try { return el ? JSON.parse(el.textContent) : null; } catch (e) { return null; }
}
function cookie(name) {
  const m = document.cookie.match("(^|;)\\s*" + name + "=([^;]*)");
  return m ? decodeURIComponent(m[2]) : null;
}
function onCancel(button, hint, model, press) {
  // A click interrupts the kernel; if the server refuses, the button comes back with a hint.
  button.addEventListener("click", async () => {
    press(true);
    let ok = false;
    try { ok = await interrupt(model.get("kernel_id")); } catch (e) { ok = false; }
    if (!ok) { press(false); hint.textContent = model.get("texts").cancel_failed; }
  });
}
async function interrupt(kernelId) {
  const cfg = config();
  if (!cfg || !kernelId) return false;
  const base = (cfg.baseUrl || "/").replace(/\/?$/, "/");
  const headers = {};
  if (cfg.token) headers["Authorization"] = "token " + cfg.token;
  const xsrf = cookie("_xsrf");
  if (xsrf) headers["X-XSRFToken"] = xsrf;
  const url = base + "api/kernels/" + encodeURIComponent(kernelId) + "/interrupt";
  const r = await fetch(url, {method: "POST", headers, credentials: "same-origin"});
  return r.ok;
}
function clock(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  return Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0");
}
"""
"""The front end's interrupt (through the server's REST API) and elapsed clock, shared by
the panel's widget and this one."""

_ESM = INTERRUPT_JS + r"""
export default {
  render({ model, el }) {
    const row = document.createElement("div"); row.className = "ctxr-cell-cancel";
    const spin = document.createElement("span"); spin.className = "ctxr-spin";
    const label = document.createElement("span"); label.className = "ctxr-activity-label";
    const time = document.createElement("span"); time.className = "ctxr-elapsed";
    const button = document.createElement("button"); button.className = "ctxr-cancel";
    const hint = document.createElement("span"); hint.className = "ctxr-hint";
    row.append(spin, label, time, button, hint);
    el.append(row);
    let pressed = false;
    function tick() { time.textContent = clock(Date.now() - model.get("started")); }
    function update() {
      const texts = model.get("texts");
      label.textContent = model.get("label");
      button.disabled = pressed;
      button.textContent = pressed ? texts.cancelling : texts.cancel;
      button.title = texts.cancel_title;
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

_CSS = f"""
.ctxr-cell-cancel {{ display: flex; flex-wrap: wrap; align-items: center; gap: 6px;
  font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; min-height: 24px; }}
.ctxr-cell-cancel .ctxr-spin {{ width: 10px; height: 10px;
  border: 2px solid {theme.BORDER}; border-top-color: transparent;
  border-radius: 50%; animation: ctxr-cell-rot 0.9s linear infinite; flex: none; }}
@keyframes ctxr-cell-rot {{ to {{ transform: rotate(360deg); }} }}
.ctxr-cell-cancel .ctxr-elapsed {{ font-variant-numeric: tabular-nums; color: {theme.TEXT_DIM}; }}
.ctxr-cell-cancel .ctxr-cancel {{ font-size: 12px; padding: 1px 10px; cursor: pointer; }}
.ctxr-cell-cancel .ctxr-hint {{ color: {theme.TEXT_ERROR}; flex-basis: 100%; }}
"""


class CancelWidget(anywidget.AnyWidget):
    """The cell's Cancel: a spinner, what runs, the elapsed time (counted by the front end,
    the kernel being busy) and the button that interrupts the kernel."""

    _esm = _ESM
    _css = _CSS
    label = traitlets.Unicode("").tag(sync=True)
    started = traitlets.Float(0.0).tag(sync=True)
    """When the summary started (ms since the epoch)."""
    kernel_id = traitlets.Unicode("").tag(sync=True)
    texts = traitlets.Dict().tag(sync=True)


class CellCancel:
    """Session event callback for one cell: shows a :class:`CancelWidget` in the cell's
    output when a summary starts and replaces it with a plain line when it ends.

    ``publish(obj, display_id=..., update=False, raw=False)`` is IPython's ``display``
    (injected in tests); ``kernel_id`` the server's id of this kernel ('' outside one:
    the button then says to use the notebook's ■).
    """

    def __init__(self, *, kernel_id: str = "",
                 publish: Callable[..., Any] | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.kernel_id = kernel_id
        self._publish = publish
        self._wall = wall
        self.widget: CancelWidget | None = None
        self.display_id: str | None = None
        self._since = 0.0
        self.lines: list[str] = []
        """The plain lines each shown widget was replaced by, in order."""

    @property
    def showing(self) -> bool:
        return self.widget is not None

    def __call__(self, event: ev.Event) -> None:
        if not isinstance(event, ev.CompactionPhase):
            return
        if event.phase == "summarize":
            self._show()
        elif event.phase in ("applied", "rejected", "cancelled"):
            self._end(event.phase, event.outcome)

    def close(self, *, interrupted: bool = False) -> None:
        """The turn ended: a widget still shown is replaced by its plain line."""
        self._end("cancelled" if interrupted else "ended", None)

    # -- display ------------------------------------------------------------------------
    def _show(self) -> None:
        if self.widget is not None:
            return
        self._since = self._wall()
        self.widget = CancelWidget(kernel_id=self.kernel_id, texts=w.cancel_texts(),
                                   label=w.activity_words("summarize"),
                                   started=self._since * 1000)
        self.display_id = f"ctxr-cell-cancel-{uuid.uuid4().hex}"
        self._display(self.widget, display_id=self.display_id)

    def _end(self, phase: str, outcome: str | None) -> None:
        widget, self.widget = self.widget, None
        if widget is None:
            return
        line = w.cell_summary_ended(phase, outcome, self._wall() - self._since)
        self.lines.append(line)
        self._display({"text/plain": line}, raw=True, display_id=self.display_id,
                      update=True)
        widget.close()

    def _display(self, obj: Any, **kwargs: Any) -> Any:
        if self._publish is not None:
            return self._publish(obj, **kwargs)
        from IPython.display import display

        return display(obj, **kwargs)
