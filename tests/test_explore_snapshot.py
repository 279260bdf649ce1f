"""%chat explore's display: live widgets under one display id until the next cell runs or
the explorer is closed, then a plain-HTML snapshot with a text twin (what a saved notebook
and an nbconvert export show); the replay plot as an image, or one line without matplotlib.

In this process (a recording ``publish``) and in real kernels through nbclient."""

from __future__ import annotations

import base64
import html
import re
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from ipy_ctxrecovery.notebook.explore import FATE_CHARS, ExploreWidget, text_legend
from ipy_ctxrecovery.notebook.magics import get_magics
from ipy_ctxrecovery.session.replay import ReplayPlot

ROOT = Path(__file__).resolve().parent.parent
WIDGET = "application/vnd.jupyter.widget-view+json"
SNAPSHOT = '<div class="ctxr-explore-snapshot"'
PLOT = re.compile(r'<img class="ctxr-replay-plot"[^>]*src="data:image/png;base64,([^"]+)"')


def tiny_png() -> bytes:
    """A real 2×2 PNG (what ``ReplayPlot.png`` gives with matplotlib, which CI lacks)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    rows = b"\0" + b"\xff\0\0" * 2 + b"\0" + b"\0\0\xff" * 2
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


class Shown:
    """A recording ``publish``: every bundle shown, with its display id and update flag."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], str | None, bool]] = []

    def __call__(self, bundle: dict[str, Any], *, display_id: str | None,
                 update: bool) -> None:
        self.calls.append((dict(bundle), display_id, update))

    @property
    def last(self) -> dict[str, Any]:
        return self.calls[-1][0]


@pytest.fixture
def session(loaded_shell: Any, capsys: pytest.CaptureFixture[str]) -> Any:
    loaded_shell.run_line_magic("chat", "emulator --max-body 16KB --context-window 64000")
    for i in range(4):
        loaded_shell.run_cell_magic("chat", "--no-stream",
                                    f"Question {i} " + "lorem ipsum " * 200 + ";")
    capsys.readouterr()
    magics = get_magics(loaded_shell)
    assert magics is not None
    return magics.workspace.session()


def shown_explorer(session: Any, **kwargs: Any) -> tuple[ExploreWidget, Shown]:
    shown = Shown()
    widget = ExploreWidget(session, debounce=0, name="default", live=True, publish=shown,
                           **kwargs)
    widget._ipython_display_()
    return widget, shown


def hooked(shell: Any, widget: ExploreWidget) -> bool:
    return any(getattr(f, "__self__", None) is widget
               for f in shell.events.callbacks["pre_run_cell"])


def test_the_next_cell_replaces_the_live_display_with_a_snapshot(
        loaded_shell: Any, session: Any) -> None:
    widget, shown = shown_explorer(session)
    bundle, display_id, update = shown.calls[0]
    assert WIDGET in bundle and display_id is not None and not update
    assert display_id.startswith("ctxr-explore-") and hooked(loaded_shell, widget)
    widget.per_result.value = 5000                 # moved while live
    widget.cap.value = "8KB"
    assert len(shown.calls) == 1                   # the live widget shows it: nothing published

    loaded_shell.run_cell("x = 1")
    bundle, again, update = shown.calls[-1]
    assert (again, update) == (display_id, True) and WIDGET not in bundle
    assert set(bundle) == {"text/html", "text/plain"}
    page = bundle["text/html"]
    assert page.startswith(SNAPSHOT) and "snapshot of the explorer as of" in page
    # The settings as moved, each beside the session's own value.
    assert re.search(r"per-result budget</td><td[^>]*><b>5000</b></td><td[^>]*>session: 20000",
                     page)
    assert re.search(r"payload cap</td><td[^>]*><b>8KB</b></td><td[^>]*>session: none", page)
    plan = widget.plan
    assert plan is not None and plan.settings.max_payload == 8 * 1024
    for line in plan.summary_lines():              # the plan's lines, the strip, its legend
        assert html.escape(line) in page
    assert "folded into the summary" in page and page.count("background:") >= len(plan.messages)
    text = bundle["text/plain"]
    assert text.startswith("snapshot of the explorer as of") and "cap=8KB" in text
    assert "per_result_max_chars=5000" in text and f"legend: {text_legend()}" in text
    # Unhooked: a further cell publishes nothing.
    assert not hooked(loaded_shell, widget)
    count = len(shown.calls)
    loaded_shell.run_cell("y = 2")
    assert len(shown.calls) == count


def test_the_snapshot_follows_the_explorer_and_a_new_display_is_live(
        loaded_shell: Any, session: Any) -> None:
    widget, shown = shown_explorer(session)
    first = shown.calls[0][1]
    loaded_shell.run_cell("x = 1")
    widget.emergency_keep.value = 3                # set from code, in a later cell
    assert shown.calls[-1][1] == first and shown.calls[-1][2]
    assert re.search(r"emergency keep</td><td[^>]*><b>3</b>", shown.last["text/html"])
    widget.per_result.value = -4                   # a wrong value: said in the snapshot
    assert "✗ " in shown.last["text/plain"] and "must not be negative" in shown.last["text/html"]
    widget.per_result.value = 20_000

    widget._ipython_display_()                     # shown again: a new live display
    bundle, second, update = shown.calls[-1]
    assert WIDGET in bundle and second != first and not update
    count = len(shown.calls)
    widget.emergency_keep.value = 4                # the live one shows it; the old keeps 3
    assert len(shown.calls) == count
    loaded_shell.run_cell("x = 2")
    assert shown.calls[-1][1] == second and "<b>4</b>" in shown.last["text/html"]
    assert all(d != first for _, d, _ in shown.calls[count:])


def test_closing_the_explorer_snapshots_it(loaded_shell: Any, session: Any) -> None:
    widget, shown = shown_explorer(session)
    display_id = shown.calls[0][1]
    widget.cap.value = "12KB"
    widget.close()
    bundle, again, update = shown.calls[-1]
    assert (again, update) == (display_id, True) and WIDGET not in bundle
    assert bundle["text/html"].startswith(SNAPSHOT)
    assert "· it was closed" in bundle["text/plain"] and "cap=12KB" in bundle["text/plain"]
    assert widget.widget.comm is None and not hooked(loaded_shell, widget)
    assert widget._repr_mimebundle_().keys() == {"text/html", "text/plain"}
    count = len(shown.calls)
    loaded_shell.run_cell("x = 1")
    widget.emergency_keep.value = 2                 # closed: nothing follows
    assert len(shown.calls) == count


def test_a_terminal_shows_the_text_once_and_hooks_nothing(loaded_shell: Any,
                                                          session: Any) -> None:
    shown = Shown()
    widget = ExploreWidget(session, debounce=0, live=False, publish=shown)
    widget._ipython_display_()
    assert [(d, u) for _, d, u in shown.calls] == [(None, False)]
    assert not hooked(loaded_shell, widget)
    loaded_shell.run_cell("x = 1")
    widget.close()
    assert len(shown.calls) == 1


def test_the_replay_plot_is_an_image_in_the_widget_and_in_the_snapshot(
        loaded_shell: Any, session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    png = tiny_png()
    monkeypatch.setattr(ReplayPlot, "png", lambda self: png)
    widget, shown = shown_explorer(session)
    widget.replay_button.click()                    # no event loop here: at once
    assert widget.report is not None
    assert widget.plot.value == png and widget.plot.format == "png"
    assert widget.plot.layout.display == "" and "ctxr-replay-plot" in widget.plot._dom_classes
    assert widget.plot in widget.widget.children
    # The Output holds the table only: no PNG bytes in a mime bundle ("[object Object]").
    assert [list(o["data"]) for o in widget.output.outputs] == [["text/plain", "text/html"]]
    loaded_shell.run_cell("x = 1")
    page = shown.last["text/html"]
    found = PLOT.search(page)
    assert found is not None and base64.b64decode(found.group(1)) == png
    assert "replay of session" in page and "turns answered" in page


def test_without_matplotlib_the_plot_is_one_line(loaded_shell: Any, session: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    widget, shown = shown_explorer(session)
    widget.replay_button.click()
    assert widget.report is not None and widget.plot.layout.display == "none"
    line = widget.output.outputs[-1]["data"]["text/plain"]
    assert line.startswith("no plot: plotting needs matplotlib") and "\n" not in line
    assert "Traceback" not in line and "replayed 4/4 turns" in widget.message.value
    loaded_shell.run_cell("x = 1")
    assert PLOT.search(shown.last["text/html"]) is None
    assert "ctxr-replay-noplot" in shown.last["text/html"]
    assert shown.last["text/plain"].endswith(line)


def test_the_text_strip_has_a_legend_line(session: Any) -> None:
    widget = ExploreWidget(session, debounce=0)
    widget.cap.value = "8KB"
    lines = widget.text().splitlines()
    strip = next(x for x in lines if x.startswith("fates: ") and "," not in x)
    legend = lines[lines.index(strip) + 1]
    assert legend == "legend: " + text_legend()
    assert set(strip.removeprefix("fates: ")) <= {c for c in FATE_CHARS.values()}
    for char in set(strip.removeprefix("fates: ")):
        assert f"{char} " in legend
    assert "· kept" in legend and "P pinned" in legend and "S folded into the summary" in legend
    assert legend.count("P ") == 1                  # the three pinned fates: one entry


# -- real kernels (nbclient) --------------------------------------------------------------

SETUP = """\
%load_ext ipy_ctxrecovery
%config ChatMagics.default_model = "emulator"
%chat emulator --max-body 16KB --context-window 64000
ip = get_ipython()
for i in range(4):
    ip.run_cell_magic("chat", "--no-stream", f"Question {i} " + "lorem ipsum " * 200 + ";")
"""

STAND_IN = f"""\
import importlib.util
from ipy_ctxrecovery.session.replay import ReplayPlot
if importlib.util.find_spec("matplotlib") is None:   # CI has none: a real PNG all the same
    ReplayPlot.png = lambda self: {tiny_png()!r}
"""

EXPLORE = """\
import asyncio
explorer = get_ipython().run_line_magic("chat", "explore")
display(explorer)
explorer.per_result.value = 5000
explorer.cap.value = "8KB"
explorer.refresh()
explorer.start_replay()
assert explorer._worker is not None          # a kernel has an event loop: a worker thread
while explorer.replay_button.disabled:
    await asyncio.sleep(0.05)
print(explorer.message.value)
"""

NEXT = "print('the next cell')"
LATER = "explorer.emergency_keep.value = 3\nexplorer.refresh()"
CLOSED = """\
other = get_ipython().run_line_magic("chat", "explore")
display(other)
other.window.value = "32000"
other.close()
"""


def run_notebook(path: Path, tmp_path: Path, seen: dict[int, Any] | None = None) -> Any:
    import copy

    from ipy_ctxrecovery.notebook.quickstart import clean_environment, execute

    def keep(cell: Any, index: int) -> None:
        if seen is not None:
            seen[index] = copy.deepcopy(cell.get("outputs", []))

    state = tmp_path / "state"
    state.mkdir()
    nb, failed = execute(path, cwd=ROOT, env=clean_environment(state), on_cell=keep,
                         kernel_log=tmp_path / "kernel.log", timeout=180)
    assert failed is None, failed
    return nb


def explore_outputs(cell: Any) -> list[Any]:
    return [o for o in cell.outputs if o.get("output_type") == "display_data"
            and SNAPSHOT in o.get("data", {}).get("text/html", "")]


def test_a_real_kernel_saves_the_snapshot_with_the_moved_values_and_the_plot(
        tmp_path: Path) -> None:
    pytest.importorskip("nbclient")
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)
                for code in (SETUP, STAND_IN, EXPLORE, NEXT, LATER, CLOSED)]
    path = tmp_path / "explore.ipynb"
    nbformat.write(nb, path)
    seen: dict[int, Any] = {}
    done = run_notebook(path, tmp_path, seen)

    # Live while its cell ran: the widget view, under a display id.
    assert any(WIDGET in o.get("data", {}) for o in seen[2])
    assert "replayed 4/4 turns" in "".join(o.get("text", "") for o in seen[2])
    # Saved: the snapshot in its place, no widget, a text twin.
    explorer = done.cells[2]
    assert not any(WIDGET in o.get("data", {}) for o in explorer.outputs)
    (out,) = explore_outputs(explorer)
    page, text = out.data["text/html"], out.data["text/plain"]
    assert re.search(r"per-result budget</td><td[^>]*><b>5000</b>", page)
    assert re.search(r"payload cap</td><td[^>]*><b>8KB</b>", page)
    assert re.search(r"emergency keep</td><td[^>]*><b>3</b>", page)   # set in a later cell
    assert "pre-flight: compact" in page and "chat budget" in page
    assert "replay of session" in page and "turns answered" in page
    found = PLOT.search(page)
    assert found is not None
    assert base64.b64decode(found.group(1)).startswith(b"\x89PNG\r\n\x1a\n")
    assert text.startswith("snapshot of the explorer as of")
    assert "per_result_max_chars=5000" in text and "legend: · kept" in text
    assert "replay of session" in text
    # Closed in its own cell: the snapshot at once, saying so.
    closed = done.cells[5]
    assert not any(WIDGET in o.get("data", {}) for o in closed.outputs)
    (out,) = explore_outputs(closed)
    assert "· it was closed" in out.data["text/plain"]
    assert re.search(r"context window</td><td[^>]*><b>32000</b>", out.data["text/html"])


def test_the_explore_tutorials_html_export_shows_the_snapshot(tmp_path: Path) -> None:
    pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")

    nb = run_notebook(ROOT / "notebooks" / "07_explore_settings.ipynb", tmp_path)
    index = next(i for i, c in enumerate(nb.cells)
                 if c.cell_type == "code" and '"explore"' in c.source)
    assert nb.cells[index + 1:], "a cell runs after the explorer"
    cell = nb.cells[index]
    assert not any(WIDGET in o.get("data", {}) for o in cell.outputs)
    (out,) = explore_outputs(cell)

    body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    start = body.index(SNAPSHOT)
    snapshot = body[start:body.index("</div></div>", body.index("ctxr-explore-plan", start))]
    # The values the tutorial applied (64 KB, one-lined after 3), the plan, the fates.
    assert re.search(r"payload cap</td><td[^>]*><b>64 KB</b>|payload cap</td><td[^>]*>64 KB",
                     snapshot)
    assert re.search(r"one-line results after</td><td[^>]*>(<b>)?3", snapshot)
    assert "pre-flight: compact" in snapshot and "chat budget" in snapshot
    assert "folded into the summary" in snapshot
    assert "snapshot of the explorer as of" in snapshot
    assert "legend: · kept" in out.data["text/plain"]


def test_a_snapshot_that_fails_is_one_line_not_a_traceback(
        loaded_shell: Any, session: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    widget, shown = shown_explorer(session)

    def broken() -> dict[str, str]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(widget, "snapshot", broken)
    loaded_shell.run_cell("x = 1")
    out = capsys.readouterr()
    said = (out.out + out.err).strip().splitlines()
    assert said == ["⚠ the explorer's snapshot failed: RuntimeError: disk on fire"]
    assert not hooked(loaded_shell, widget) and len(shown.calls) == 1
