"""The running cell's own Cancel: a widget in the cell's output while a summary runs,
replaced by one plain line when the summary ends (never a widget left in a saved notebook).

In-process here (displays captured, a real session against the emulator); the real-kernel
test further down reads the display messages a front end receives and interrupts the
kernel while the button is shown, as the button's REST call does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kernels
import pytest
from turn_streams import LOREM, primed_for_413, record

from ipy_ctxrecovery.core import compactor
from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.notebook.cell_cancel import CancelWidget, CellCancel
from ipy_ctxrecovery.notebook.panel import PanelWidget
from ipy_ctxrecovery.settings import Settings

WIDGET = "application/vnd.jupyter.widget-view+json"


class Displays:
    """What ``display`` was called with: (display_id, obj, update)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, bool]] = []

    def __call__(self, obj: Any, *, display_id: str, update: bool = False,
                 raw: bool = False) -> None:
        self.calls.append((display_id, obj, update))


def test_a_summary_shows_cancel_in_the_cell_and_a_plain_line_after(emulator: Any) -> None:
    session = primed_for_413(emulator)
    shown = Displays()
    seen: list[tuple[bool, int]] = []
    cancel = CellCancel(kernel_id="k-1", publish=shown)
    session.subscribe(cancel)
    session.subscribe(lambda e: seen.append((cancel.showing, len(shown.calls)))
                      if isinstance(e, ev.CompactionPhase) else None)
    stream = record(session, "Compare them with this one: " + LOREM * 40)
    phases = [e.phase for e in stream if isinstance(e, ev.CompactionPhase)]
    assert "summarize" in phases and phases[-1] == "applied"
    # Shown when the summary started, gone once the compaction was applied.
    assert seen[phases.index("summarize")] == (True, 1)
    assert seen[-1] == (False, 2)
    (first_id, widget, first_update), (second_id, bundle, second_update) = shown.calls
    assert isinstance(widget, CancelWidget) and not first_update
    assert widget.kernel_id == "k-1" and widget.texts["cancel"] == "Cancel"
    assert widget.label == "the model is summarizing older messages" and widget.started > 0
    assert second_id == first_id and second_update                # the same output, replaced
    assert set(bundle) == {"text/plain"}
    assert bundle["text/plain"].startswith("summary of older messages: done in ")
    assert widget.comm is None                                     # closed, not left behind
    cancel.close()
    assert len(shown.calls) == 2                                   # nothing more to replace


def test_an_interrupted_summary_leaves_a_cancelled_line_and_the_history() -> None:
    history = tuple(Message.user(f"q{i} " + LOREM * 20) if i % 2 == 0
                    else Message.assistant(f"a{i} " + LOREM * 20) for i in range(9))
    shown = Displays()
    cancel = CellCancel(publish=shown)
    during: list[bool] = []

    def summarize(_text: str) -> str:
        during.append(cancel.showing)
        raise KeyboardInterrupt          # what the button's interrupt raises here

    def size(h: Any) -> int:
        return sum(len(m.text) for m in h)

    with pytest.raises(KeyboardInterrupt):
        compactor.compact(history, target_bytes=size(history) // 3, measure=size,
                          summarize=summarize, settings=Settings(), on_event=cancel)
    assert during == [True]
    assert not cancel.showing
    assert cancel.lines[-1].startswith("summary of older messages: cancelled after ")
    assert cancel.lines[-1].endswith("· history exactly as before")


def test_a_turn_ending_mid_summary_still_replaces_the_widget() -> None:
    shown = Displays()
    cancel = CellCancel(publish=shown)
    cancel(ev.CompactionPhase(phase="summarize", before_messages=9))
    cancel(ev.CompactionPhase(phase="summarize", before_messages=9))     # shown once
    assert len(shown.calls) == 1
    cancel.close()
    assert not cancel.showing and len(shown.calls) == 2
    assert cancel.lines == [shown.calls[1][1]["text/plain"]]
    assert cancel.lines[0].startswith("summary of older messages: stopped after ")


def test_the_cell_button_and_the_panels_share_the_interrupt() -> None:
    for esm in (CancelWidget._esm, PanelWidget._esm):
        assert "api/kernels/" in esm and "/interrupt" in esm and "ctxr-cancel" in esm
    assert "ctxr-cell-cancel" in str(CancelWidget._esm)


# -- through a real kernel ---------------------------------------------------------------------

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

TIMEOUT = 90


@pytest.fixture
def kernel(data_dir: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CHATCLI_MAX_PAYLOAD"):
        monkeypatch.delenv(var, raising=False)
    with kernels.started_kernel(TIMEOUT) as (manager, client):
        yield manager, client


def run(client: Any, code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; return the execute_reply content and the iopub messages."""
    return kernels.run(client, code, TIMEOUT)


def until_idle(client: Any, msg_id: str, *, interrupt: Any = None) -> list[dict[str, Any]]:
    """The iopub messages of ``msg_id`` until the kernel is idle; ``interrupt`` is called
    once, as soon as a display carrying our widget arrives."""
    messages = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert time.monotonic() < deadline, "the cell never ended"
        message = client.get_iopub_msg(timeout=TIMEOUT)
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(message)
        if interrupt is not None and message["msg_type"] == "display_data" \
                and WIDGET in message["content"]["data"]:
            interrupt()
            interrupt = None
        if message["msg_type"] == "status" and \
                message["content"]["execution_state"] == "idle":
            return messages


def cancel_outputs(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(display id, its later updates) of the one output that showed our widget."""
    widgets = [m["content"] for m in messages
               if m["msg_type"] == "display_data" and WIDGET in m["content"]["data"]]
    assert len(widgets) == 1, widgets
    display_id = widgets[0]["transient"]["display_id"]
    assert display_id.startswith("ctxr-cell-cancel-")
    updates = [m["content"] for m in messages if m["msg_type"] == "update_display_data"
               and m["content"]["transient"]["display_id"] == display_id]
    return display_id, updates


PRIME = ("from ipy_ctxrecovery.notebook import get_magics\n"
         "for i in range({n}):\n"
         "    get_ipython().run_cell_magic('chat', '', f'part {{i}}: ' + {lorem!r} * 95)\n"
         "session = get_magics().workspace.session()\n"
         "before = [m.text for m in session.history]\n")


def test_cancel_in_the_running_cell_through_a_real_kernel(kernel: tuple[Any, Any]) -> None:
    manager, client = kernel
    reply, _ = run(client, "%load_ext ipy_ctxrecovery\n"
                           "%config ChatMagics.stream_interval = 0\n"
                           # The summary this cell cancels runs in the turn, not ahead.
                           "%chat config background_compaction=off\n"
                           "%chat emulator --max-body 32KB --context-window 200000")
    assert reply["status"] == "ok"
    reply, _ = run(client, PRIME.format(n=3, lorem=LOREM))
    assert reply["status"] == "ok"

    # A summary that is used: the widget while it runs, then one plain line in its place.
    msg_id = client.execute("%%chat\nCompare the three parts with this one: " + LOREM * 40)
    messages = until_idle(client, msg_id)
    display_id, updates = cancel_outputs(messages)
    assert len(updates) == 1 and WIDGET not in updates[0]["data"]
    assert list(updates[0]["data"]) == ["text/plain"]
    assert updates[0]["data"]["text/plain"].startswith("summary of older messages: done in ")
    # The widget model is closed too (its comm), so nothing outlives the cell.
    comms = [m["content"]["comm_id"] for m in messages if m["msg_type"] == "comm_close"]
    assert comms

    # Interrupted while the button shows (what its REST call does): history unchanged.
    reply, _ = run(client, PRIME.format(n=1, lorem=LOREM) +
                   "get_magics().workspace.emulator.latency = 30\n")
    assert reply["status"] == "ok"
    msg_id = client.execute("%%chat\nAnd the fourth part: " + LOREM * 60)
    messages = until_idle(client, msg_id, interrupt=manager.interrupt_kernel)
    display_id, updates = cancel_outputs(messages)
    assert len(updates) == 1 and WIDGET not in updates[0]["data"]
    line = updates[0]["data"]["text/plain"]
    assert line.startswith("summary of older messages: cancelled after ")
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "ChatInterrupted"
    reply, messages = run(client, "get_magics().workspace.emulator.latency = 0\n"
                                  "print([m.text for m in session.history] == before)")
    out = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert out == "True\n"
