"""The live panel: driven by recorded event streams, every label asserted at each step.

At every step of a replay the view is checked for contradictions (a "last turn" line while
a turn runs, a count of no compactions while one runs, Cancel without a running summary,
a glyph common fonts lack); chosen steps are checked label by label. The panel's output
is the widget while a turn runs and a plain-HTML snapshot in between.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from contrast import installed_themes, theme_problems, vetted
from IPython.core.displaypub import DisplayPublisher
from IPython.testing import globalipapp
from turn_streams import KB, LOREM, Stream, recovery_413, routine

from ipy_ctxrecovery.core import compactor, theme
from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.core.wording import CARD_GLYPHS
from ipy_ctxrecovery.notebook import get_magics
from ipy_ctxrecovery.notebook.panel import STAGES, ContextPanel, PanelWidget
from ipy_ctxrecovery.session import ChatSession
from ipy_ctxrecovery.settings import Settings

WIDGET = "application/vnd.jupyter.widget-view+json"


WALL = 1_790_000_000.0
"""The wall clock of panels whose last-turn line is checked (it says when the turn ended)."""
ENDED = f" · ended {time.strftime('%H:%M:%S', time.localtime(WALL))}"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def statuses(panel: ContextPanel) -> dict[str, str]:
    return {stage: status for stage, status, _, _ in panel.view()["steps"]}


def details(panel: ContextPanel) -> dict[str, str]:
    return {stage: detail for stage, _, _, detail in panel.view()["steps"]}


def check_consistent(panel: ContextPanel, *, streaming: bool = False) -> None:
    """What must hold at every moment (the issue's "no line that contradicts another");
    ``streaming``: text deltas re-render at most every 0.25 s, so the HTML may lag."""
    view = panel.view()
    text = panel.text()
    odd = {c for c in text if ord(c) > 127} - CARD_GLYPHS
    assert not odd, odd
    steps = statuses(panel)
    if view["steps"]:
        assert [s for s, _, _, _ in view["steps"]] == list(STAGES)
    assert (view["last"] is None) == panel.running            # a last turn only between turns
    assert ("turn running" in view["state"]) == panel.running
    compaction_running = steps.get("summarize") == "running" or steps.get("trim") == "running"
    assert ("a compaction running" in view["counts"]) == compaction_running
    assert (steps.get("summarize") == "running") == panel.widget.cancellable
    assert bool(panel.widget.label) == panel.running
    running = [s for s, status in steps.items() if status == "running"]
    assert len(running) <= 2 and (len(running) < 2 or set(running) <= {"summarize", "trim",
                                                                         "recovery"}), running
    if panel.running and view["steps"]:
        # A step not reached yet is pending, never claimed done after a later one runs.
        assert steps["send"] != "pending" or steps["recovery"] in ("pending", "skipped")
    fraction = view["size_fraction"]
    assert (fraction is None) == ("no payload cap known" in view["size"])
    if fraction is not None:
        assert (fraction > 1) == view["size"].endswith(", over it")
    if not streaming:
        assert panel.widget.html.endswith(_html_tail(panel))


def _html_tail(panel: ContextPanel) -> str:
    from ipy_ctxrecovery.notebook.panel import _html

    return _html(panel.view(), live=True)


def replay(panel: ContextPanel, stream: Stream, check: Any = None) -> None:
    for i, item in enumerate(stream):
        if isinstance(item, str):
            panel.text_arrived(item)
        else:
            panel.handle(item)
        check_consistent(panel, streaming=isinstance(item, str))
        if check is not None:
            check(i, item, panel)


# -- the 413 recovered by a summary, event by event ---------------------------------------------

def test_a_413_recovery_step_by_step(emulator: Any) -> None:
    session, stream = recovery_413(emulator)
    panel = ContextPanel(title="default", clock=Clock(), wall=lambda: WALL)
    panel.update_status(_status_before(session, stream))
    panel.begin_turn()
    check_consistent(panel)
    assert set(statuses(panel).values()) == {"pending"}
    seen: dict[str, Any] = {}

    def check(i: int, item: Any, p: ContextPanel) -> None:
        s, d, view = statuses(p), details(p), p.view()
        if isinstance(item, ev.Preflight):
            assert s == {"preflight": "done", "microcompact": "skipped", "budget": "skipped",
                         "trim": "pending", "summarize": "pending", "apply": "pending",
                         "send": "pending", "recovery": "pending", "continuation": "pending"}
            assert d["preflight"] == "within the window"
            assert view["size"].endswith(" · no payload cap known")
            assert p.widget.label == "preparing the request"
        elif isinstance(item, ev.Sending) and item.attempt == 1:
            assert s["send"] == "running" and s["trim"] == "skipped"
            assert p.widget.label == "waiting for the answer"
        elif isinstance(item, ev.LadderStep):
            assert s["send"] == "failed" and d["send"].endswith("payload too large (413)")
            assert s["recovery"] == "running"
            assert "request was rejected → summarizing older messages to" in d["recovery"]
            assert view["levels"][1] == ("summarize to fit", "lit current")
            assert [state for _, state in view["levels"]].count("") == 4
            assert p.widget.label == "recovering from a rejected request"
        elif isinstance(item, ev.CapChanged):
            seen["over"] = view["size"]
            assert view["size_fraction"] > 1 and view["size"].endswith("cap (learned), over it")
            assert 'ctxr-fill over' in p.widget.html           # the bar turned red
        elif isinstance(item, ev.CompactionPhase) and item.phase == "summarize":
            assert s["trim"] == "done" and s["summarize"] == "running" \
                and s["apply"] == "pending"
            assert d["summarize"].startswith("the model is summarizing older messages (")
            assert p.widget.label == "the model is summarizing older messages"
            assert p.widget.cancellable
            assert view["counts"] == ("so far: 0 recoveries, 0 compactions · this turn: "
                                      "a compaction running, 1 recovery step")
            seen["summarizing"] = True
        elif isinstance(item, ev.CompactionPhase) and item.phase == "applied":
            assert s["summarize"] == "done" and s["apply"] == "done"
            assert d["apply"].startswith("summary by the model: 8 → 3 messages, ")
            assert view["size_fraction"] < 1 and "over" not in view["size"]  # came back
            assert not p.widget.cancellable
            assert view["counts"] == ("so far: 0 recoveries, 0 compactions · this turn: "
                                      "1 compaction, 1 recovery step")
        elif isinstance(item, ev.Sending) and item.attempt == 2:
            assert s["send"] == "running" and d["send"].endswith("(try 2) · waiting for the answer…")
            assert s["recovery"] == "done"
        elif isinstance(item, str):
            assert s["send"] == "running"
            assert p.widget.label.startswith("answer arriving: ≈")
        elif isinstance(item, ev.TurnFinished):
            assert not p.running
            assert view["last"] == "last turn: ✓ answered after 1 recovery step" + ENDED
            assert view["counts"] == "so far: 1 recovery, 1 compaction"
            assert s["send"] == "done" and s["continuation"] == "skipped"
            assert view["state"].startswith("idle · as of ")

    replay(panel, stream, check)
    assert seen.get("summarizing") and seen.get("over")
    finished = next(e for e in stream if isinstance(e, ev.TurnFinished))
    assert panel.history_bytes == finished.history_bytes     # not following: the event's
    assert panel.cap == session.status().cap
    session.close()


def _status_before(session: ChatSession, stream: Stream) -> Any:
    """The session's status as it was before the recorded turn (first pre-flight's sizes)."""
    from dataclasses import replace

    first = next(e for e in stream if isinstance(e, ev.Preflight))
    return replace(session.status(), history_bytes=first.body_bytes,
                   est_tokens=first.est_tokens, cap=None, cap_source=None, recoveries=0,
                   compactions=0)


def test_a_routine_turn(emulator: Any) -> None:
    session, stream = routine(emulator)
    panel = ContextPanel(title="default", clock=Clock(), wall=lambda: WALL)
    panel.attach(session)
    panel.begin_turn()
    replay(panel, stream)
    assert statuses(panel) == {"preflight": "done", "microcompact": "skipped",
                               "budget": "skipped", "trim": "skipped", "summarize": "skipped",
                               "apply": "skipped", "send": "done", "recovery": "skipped",
                               "continuation": "skipped"}
    assert panel.view()["last"] == "last turn: ✓ answered" + ENDED
    assert panel.view()["levels"] == []
    session.close()


# -- no cap, snapshot vs live, cancel, streaming --------------------------------------------------

def test_no_cap_is_said_on_the_bar_not_drawn_near_empty() -> None:
    panel = ContextPanel(title="s")
    panel.handle(ev.Preflight(body_bytes=30 * KB, est_tokens=7000, cap=None, window=8192,
                              action="ok"))
    view = panel.view()
    assert view["size"] == "30 KB · no payload cap known" and view["size_fraction"] is None
    assert "ctxr-track none" in panel.widget.html and "ctxr-fill" not in \
        panel.widget.html.split("ctxr-size")[1].split("ctxr-tokens")[0]
    assert view["tokens"] == "≈7,000 of 8,192 tokens"
    panel.handle(ev.CapChanged(cap=24 * KB, source="learned", rejected_bytes=32 * KB))
    assert panel.view()["size"] == "30 KB of 24 KB cap (learned), over it"


def test_the_colours_come_from_the_theme_in_the_widget_and_the_snapshot(emulator: Any) -> None:
    """Issue 25: white on light orange for the lit chip and a glaring track in the dark
    theme, from hard-coded colours. Every colour is a vetted theme variable
    (tests/test_theme.py measures them in each theme), in the live widget's stylesheet and
    in the snapshot a saved notebook keeps."""
    themes = installed_themes()
    session, stream = recovery_413(emulator)
    panel = ContextPanel(title="default", clock=Clock())
    panel.update_status(_status_before(session, stream))
    panel.begin_turn()
    replay(panel, stream)
    snapshot = panel._repr_mimebundle_()["text/html"]
    assert "ctxr-level lit" in snapshot
    # Its summary and server-compaction rows can hold two amounts of money: not LaTeX.
    assert "<div class='ctxr-panel mathjax_ignore tex2jax_ignore' " in snapshot
    for text in (panel.widget._css, snapshot):
        assert theme_problems(text, themes) == []
        assert vetted(text) == []
    css = panel.widget._css

    def rules(selector: str) -> str:                  # every rule for it, in order
        return " ".join(part.split("}")[0] for part in css.split(selector + " {")[1:])

    lit, unlit, track = rules(".ctxr-level.lit"), rules(".ctxr-level"), rules(".ctxr-track")
    assert lit.endswith(f"color: {theme.TEXT_STRONG}; border-color: {theme.BORDER_WARN};\n"
                        f"  background: {theme.SURFACE}; ")
    assert "opacity" not in unlit and unlit.endswith(f"color: {theme.TEXT_DIM}; ")
    assert track.endswith(f"background: {theme.TRACK}; ")


def test_between_turns_a_snapshot_during_a_turn_the_widget() -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []
    wall = Clock()
    panel = ContextPanel(title="work", publish=lambda obj, **kw: calls.append(
        (obj._repr_mimebundle_(), kw)), wall=wall)
    panel.show()
    assert calls[0][1] == {"display_id": panel.display_id}
    idle = calls[0][0]
    assert WIDGET not in idle and set(idle) == {"text/plain", "text/html"}
    assert idle["text/plain"].splitlines()[0] == "live panel · session work · idle"
    panel.begin_turn()
    live = calls[1][0]
    assert calls[1][1] == {"display_id": panel.display_id, "update": True}
    assert WIDGET in live and live[WIDGET]["model_id"] == panel.widget.model_id
    assert live["text/plain"].splitlines()[0] == "live panel · session work · turn running"
    panel.handle(ev.TurnFinished(history_bytes=2 * KB, est_tokens=500, window=8192, cap=None))
    after = calls[2][0]
    assert WIDGET not in after and "data-live='no'" in after["text/html"]
    assert after["text/plain"].splitlines()[0].startswith("live panel · session work · idle · as of ")
    assert len(calls) == 3                                 # one publish per change


def test_shown_again_only_the_latest_display_follows_the_earlier_keeps_its_time() -> None:
    # A saved notebook showed the session's final cap and counts under every display of
    # the panel, even above the cell before the 413 (QA).
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    panel = ContextPanel(title="work", wall=Clock(), publish=lambda obj, **kw: calls.append(
        (kw["display_id"], obj._repr_mimebundle_(), kw)))
    panel.show()
    first = panel.display_id
    panel.begin_turn()
    panel.handle(ev.TurnFinished(history_bytes=2 * KB, est_tokens=500, window=8192, cap=None))
    before = calls[-1][1]["text/plain"]
    panel.show()
    assert panel.display_id != first and calls[-1][0] == panel.display_id
    assert "update" not in calls[-1][2]                    # a new display, not an update
    published = len(calls)
    panel.handle(ev.CapChanged(cap=24 * KB, source="learned", rejected_bytes=32 * KB))
    panel.begin_turn()
    panel.handle(ev.TurnFinished(history_bytes=20 * KB, est_tokens=5000, window=8192,
                                 cap=24 * KB))
    assert len(calls) > published
    assert {display for display, _, _ in calls[published:]} == {panel.display_id}
    last_of_first = [bundle for display, bundle, _ in calls if display == first][-1]
    assert last_of_first["text/plain"] == before and "learned" not in before


def test_cancel_during_a_summary_ends_the_turn_as_cancelled() -> None:
    history = tuple(Message.user(f"q{i} " + LOREM * 20) if i % 2 == 0
                    else Message.assistant(f"a{i} " + LOREM * 20) for i in range(9))
    panel = ContextPanel(title="s", clock=Clock(), wall=lambda: WALL)
    panel.begin_turn()
    states: list[tuple[bool, str]] = []

    def summarize(_text: str) -> str:
        # What the front end shows while the request is out: a Cancel button.
        states.append((panel.widget.cancellable, panel.widget.label))
        raise KeyboardInterrupt        # what the Cancel button's interrupt raises

    def size(h: Any) -> int:
        return sum(len(m.text) for m in h)

    def on_event(e: ev.Event) -> None:
        panel.handle(e)
        check_consistent(panel)

    with pytest.raises(KeyboardInterrupt):
        compactor.compact(history, target_bytes=size(history) // 3, measure=size,
                          summarize=summarize, settings=Settings(), on_event=on_event)
    assert states == [(True, "the model is summarizing older messages")]
    panel.end_turn(interrupted=True)
    check_consistent(panel)
    assert statuses(panel)["summarize"] == "cancelled"
    assert details(panel)["summarize"].startswith("cancelled · history exactly as before "
                                                  "(it was compacting 9 messages, ")
    assert statuses(panel)["apply"] == "skipped"
    assert panel.view()["last"] == "last turn: ✗ cancelled · history exactly as before" + ENDED
    assert not panel.widget.cancellable and panel.widget.label == ""


def test_streamed_tokens_are_counted_and_renders_are_coalesced() -> None:
    clock = Clock()
    panel = ContextPanel(title="s", clock=clock)
    panel.begin_turn()
    panel.handle(ev.Sending(body_bytes=KB))
    renders = []
    original = panel._render

    def counting() -> None:
        renders.append(1)
        original()

    panel._render = counting  # type: ignore[method-assign]
    for _ in range(10):
        panel.text_arrived("abcd" * 10)     # 40 bytes ≈ 10 tokens each
    assert len(renders) == 1                # the clock did not move: one render
    clock.now += 1
    panel.text_arrived("abcd")
    assert details(panel)["send"] == "1 KB · answer arriving: ≈101 tokens"
    assert panel.widget.label == "answer arriving: ≈101 tokens"


def test_events_from_another_thread_wait_for_the_owning_thread() -> None:
    panel = ContextPanel(title="s")
    event = ev.Preflight(body_bytes=48 * KB, est_tokens=100, cap=None, window=8192, action="ok")
    worker = threading.Thread(target=panel.handle, args=(event,))
    worker.start()
    worker.join()
    assert panel.record is None                       # not applied off the kernel thread
    panel.handle(ev.Sending(body_bytes=48 * KB))
    assert statuses(panel)["preflight"] == "done" and statuses(panel)["send"] == "running"


def test_the_widget_is_one_anywidget_built_once(emulator: Any) -> None:
    session, stream = routine(emulator)
    panel = ContextPanel(title="s")
    widget = panel.widget
    assert isinstance(widget, PanelWidget)
    panel.attach(session)
    session.send("more [[words 5]]")
    assert panel.widget is widget and panel.widget.kernel_id == ""   # no server here
    assert "api/kernels/" in widget._esm and "/interrupt" in widget._esm
    assert set(widget.texts) == {"cancel", "cancelling", "cancel_title", "cancel_failed"}
    session.close()


def test_attach_follows_a_real_session(emulator: Any) -> None:
    emu = emulator(context_window=4096)
    session = ChatSession("emulator", emulator=emu, settings=Settings(max_payload=64 * KB),
                          system="be brief")
    panel = ContextPanel(settings=session.settings, wall=lambda: WALL)
    panel.attach(session)
    status = session.status()
    assert panel.history_bytes == status.history_bytes > 0
    assert panel.view()["size"] == f"{status.history_bytes / 1024:.1f} KB of 64.0 KB cap " \
                                   "(configured)" or panel.view()["size"].endswith("(configured)")
    session.send("hello " * 200)
    grown = session.status()
    assert panel.history_bytes == grown.history_bytes > status.history_bytes
    # 4,096 is the emulator's own limit, set when it was made: not the catalogue's 8,192.
    assert panel.view()["tokens"] == (f"≈{grown.est_tokens:,} of 4,096 tokens "
                                      "(set on the emulator)")
    assert panel.view()["counts"] == "so far: 0 recoveries, 0 compactions"
    assert panel.view()["last"] == "last turn: ✓ answered" + ENDED
    panel.attach(session)                              # the same conversation: kept
    assert panel.view()["last"] == "last turn: ✓ answered" + ENDED
    followed = panel.history_bytes
    panel.detach()
    session.send("again")
    assert panel.history_bytes == followed
    other = ChatSession("emulator", emulator=emu, name="another")
    panel.attach(other)                                # another one (%%chat --new): no last turn
    assert panel.view()["last"] is None and panel.view()["steps"] == []
    other.close()
    session.close()


# -- through the magics: what a network path taught, shared and said ------------------------------

class Quiet(DisplayPublisher):
    def publish(self, *args: Any, **kwargs: Any) -> None:
        return None


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.config.pop("ChatMagics", None)
    shell.run_line_magic("load_ext", "ipy_ctxrecovery")
    saved, shell.display_pub = shell.display_pub, Quiet(shell=shell)
    yield shell
    shell.display_pub = saved
    shell.run_line_magic("unload_ext", "ipy_ctxrecovery")


def test_a_second_session_on_the_same_path_does_not_relearn_the_cap(
        ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    magics = get_magics(ip)
    assert magics is not None
    ip.run_line_magic("chat", "emulator --max-body 32KB --context-window 200000")
    for i in range(3):
        ip.run_cell_magic("chat", "", f"part {i}: " + LOREM * 95)
    ip.run_cell_magic("chat", "", "Compare them: " + LOREM * 40)
    emu = magics.workspace.emulator
    assert emu is not None
    rejected = [r for r in emu.requests if r.status == 413]
    assert len(rejected) == 1
    first = magics.workspace.session("default").status()
    assert first.cap_source == "learned"
    for i in range(4):   # another conversation, on the same emulator
        ip.run_cell_magic("chat", "-S other", f"other {i}: " + LOREM * 95)
    other = magics.workspace.sessions["other"].status()
    assert other.cap == first.cap and other.cap_source == "learned"
    assert [r for r in emu.requests if r.status == 413] == rejected   # not learned again
    capsys.readouterr()
    ip.run_line_magic("chat", "status -S other")
    out = capsys.readouterr().out
    assert f"payload cap: {first.cap / 1024:.1f} KB (learned)" in out
    panel = magics.workspace.panel("other")
    assert panel.view()["size"].endswith(f"of {first.cap / 1024:.1f} KB cap (learned)")


def test_panel_sidebar_says_how_to_pin_it(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert ip.run_line_magic("chat", "panel --sidebar") is None
    out = capsys.readouterr().out
    assert "Create New View for Cell Output" in out and "right side area" in out
    magics = get_magics(ip)
    assert magics is not None and magics.workspace.panels["default"].shown is False  # terminal


# -- which turn the panel describes, and the same panel whenever it is shown ----------------------

class Recording(DisplayPublisher):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[dict[str, Any]] = []

    def publish(self, data: dict[str, Any], metadata: Any = None, source: Any = None, *,
                transient: Any = None, update: bool = False, **kwargs: Any) -> None:
        self.calls.append({"data": data, "id": (transient or {}).get("display_id"),
                           "update": update})


def _run(ip: Any, source: str) -> int:
    """Run ``source`` as a notebook cell; its execution count."""
    result = ip.run_cell(source, store_history=True)
    assert result.error_in_exec is None and result.error_before_exec is None, result
    count: int = result.execution_count
    return count


def test_the_panel_under_the_first_cell_says_which_turn_it_describes(ip: Any) -> None:
    magics = get_magics(ip)
    assert magics is not None
    magics.live_display, magics.show_panel = "always", True
    recording = Recording(shell=ip)
    saved, ip.display_pub = ip.display_pub, recording
    try:
        cells = [_run(ip, f"%%chat\nquestion {i}: " + LOREM) for i in range(3)]
    finally:
        ip.display_pub = saved
    panel = magics.workspace.panels["default"]
    shown = [c for c in recording.calls if c["id"] == panel.display_id]
    assert not shown[0]["update"] and shown[-1]["update"]     # one display, kept up to date
    last = shown[-1]["data"]["text/plain"].splitlines()[-1]
    assert re.fullmatch(rf"last turn: ✓ answered · cell \[{cells[-1]}\], "
                        r"ended \d\d:\d\d:\d\d", last), last
    assert f"cell [{cells[0]}]" not in last
    assert f"cell [{cells[-1]}]" in shown[-1]["data"]["text/html"]


def _tracker_text(panel: ContextPanel) -> list[str]:
    """The panel's text with what differs between two panels of the same turn made apart:
    the session's name, the cell and the times."""
    text = panel.text().replace(f"session {panel.name}", "session S")
    text = re.sub(r"\d\d:\d\d:\d\d", "T", re.sub(r"cell \[\d+\]", "cell [N]", text))
    return text.splitlines()


def test_chat_panel_shows_the_last_turns_tracker_whether_or_not_a_panel_was_open(
        ip: Any) -> None:
    magics = get_magics(ip)
    assert magics is not None
    magics.live_display = "always"
    # A panel open during the turn (session "default"), then shown again.
    _run(ip, "%chat panel")
    open_during = _run(ip, "%%chat\nthe same question: " + LOREM)
    _run(ip, "%chat panel")
    # The turn first, no panel anywhere (session "b"), then the panel.
    after = _run(ip, "%%chat -S b\nthe same question: " + LOREM)
    _run(ip, "%chat panel -S b")
    first, second = magics.workspace.panels["default"], magics.workspace.panels["b"]
    assert [s for s, _, _, _ in second.view()["steps"]] == list(STAGES)
    assert statuses(second) == statuses(first)
    assert statuses(second)["send"] == "done" and statuses(second)["preflight"] == "done"
    assert _tracker_text(second) == _tracker_text(first)
    assert f"cell [{open_during}]" in first.view()["last"]
    assert f"cell [{after}]" in second.view()["last"]
    # Another conversation under the name has no last turn to show.
    _run(ip, "%%chat -S c --new\nhello")
    magics.workspace.open_session("c", "emulator", new=True)     # as %%chat -S c --new does
    _run(ip, "%chat panel -S c")
    assert magics.workspace.panels["c"].view()["last"] is None


def test_a_chunked_summary_shows_its_reading_and_its_drops() -> None:
    from test_turn_card import chunked_summary

    panel = ContextPanel(title="s", clock=Clock(), wall=lambda: WALL)
    panel.begin_turn()
    for event in chunked_summary()[:3]:
        panel.handle(event)
    assert details(panel)["summarize"].endswith("(60 KB → target 20 KB, in 3 requests)…")
    panel.handle(chunked_summary()[3])
    d = details(panel)
    assert d["summarize"] == ("summary: 14 messages read in 3 chunks, 3 requests, 9,120 tokens"
                              " · 2 messages dropped unread (summary-request bound 8)")
    assert d["apply"] == "summary by the model: 30 → 15 messages, 60 KB → 18 KB"
