"""%chat explore: the widget read through its trait values (no browser), in a real shell."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import ipywidgets as widgets
import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.notebook.explore import ExploreWidget, text_strip
from ipy_ctxrecovery.notebook.magics import ChatMagics, get_magics
from ipy_ctxrecovery.session.what_if import Fate
from ipy_ctxrecovery.settings import format_size


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CHATCLI_MAX_PAYLOAD",
                "CHATCLI_CONTEXT_WINDOW"):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.config.pop("ChatMagics", None)
    yield shell
    if "ipy_ctxrecovery" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "ipy_ctxrecovery")
    shell.config.pop("ChatMagics", None)


@pytest.fixture
def chat(ip: Any, capsys: pytest.CaptureFixture[str]) -> ChatMagics:
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    ip.run_line_magic("chat", "emulator --max-body 16KB --context-window 64000")
    for i in range(4):
        ip.run_cell_magic("chat", "--no-stream", f"Question {i} " + "lorem ipsum " * 200 + ";")
    capsys.readouterr()
    magics = get_magics(ip)
    assert magics is not None
    return magics


def explore(ip: Any) -> ExploreWidget:
    widget = ip.run_line_magic("chat", "explore")
    assert isinstance(widget, ExploreWidget)
    return widget


def test_the_widget_starts_from_the_sessions_settings_and_the_emulators_limits(
        ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    session = chat.workspace.session()
    assert widget.session is session
    assert widget.limits == {"context_window": 64_000, "max_body": 16 * 1024}
    assert (widget.cap.value, widget.window.value) == ("", "")
    assert widget.emergency_keep.value == session.settings.emergency_keep_messages
    assert widget.per_result.value == Settings().per_result_max_chars
    assert widget.plan is not None and widget.plan.changes == {}
    # Every message, and the next one the plan is for (never an answered one as latest).
    assert widget.strip.value.count("title='#") == len(session.history) + 1
    assert "pre-flight: ok" in widget.numbers.value and widget.message.value == ""


def test_a_change_recomputes_the_plan_through_traits_only(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    tree = widget.widget.children
    before = widget.computed
    widget.cap.value = "8KB"
    assert widget.computed == before + 1
    plan = widget.plan
    assert plan is not None and plan.settings.max_payload == 8 * 1024
    assert plan.fates.get(Fate.SUMMARIZED) and "of configured cap (8 KB)" in widget.numbers.value
    assert "folded into the summary" in widget.strip.value
    widget.emergency_keep.value = 3
    assert widget.plan is not None and widget.plan.settings.emergency_keep_messages == 3
    assert widget.widget.children is tree                  # built once


@pytest.mark.parametrize(("field", "value", "words"), [
    ("per_result", -4, "must not be negative"),
    ("cap", "lots", "is not a valid size"),
    ("window", "wide", "is not a whole number"),
    ("per_turn", 5, "exceeds turn_budget_chars=5"),
])
def test_out_of_range_input_is_one_sentence_in_the_widget(
        ip: Any, chat: ChatMagics, field: str, value: Any, words: str) -> None:
    widget = explore(ip)
    good = widget.plan
    getattr(widget, field).value = value
    assert widget.error is not None and words in widget.error
    assert "\n" not in widget.error and "Traceback" not in widget.message.value
    assert words in widget.message.value
    assert widget.plan is good                              # the last good plan stays
    assert f"✗ {widget.error}" in widget.text()
    widget.apply()
    assert "nothing applied" in widget.message.value
    assert chat.workspace.session().settings == Settings.from_env()


def test_apply_goes_through_chat_config(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.cap.value = "12KB"
    widget.truncate_turns.value = 1
    widget.summarize_turns.value = 3
    assert widget.assignments() == {"CHATCLI_MAX_PAYLOAD": "12 KB",
                                    "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "1",
                                    "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "3"}
    widget.apply_button.click()
    settings = chat.workspace.session().settings
    assert (settings.max_payload, settings.microcompact_truncate_turns,
            settings.microcompact_summarize_turns) == (12 * 1024, 1, 3)
    assert chat.max_payload == "12 KB"
    assert chat.settings_overrides == {"microcompact_truncate_turns": "1",
                                       "microcompact_summarize_turns": "3"}
    # Said the way the user wrote it, not in bytes.
    assert "set CHATCLI_MAX_PAYLOAD=12 KB, CHATCLI_MICROCOMPACT" in widget.message.value
    assert widget.plan is not None and widget.plan.changes == {}   # now the session's own
    widget.apply()
    assert "nothing to apply" in widget.message.value


@pytest.mark.parametrize(("typed", "said"), [
    ("24KB", "24 KB"), ("1.5MB", "1.5 MB"), ("5000B", "5000 B"), ("3", "3 MB"),
    ("12345B", "12345 B"), ("0", "0")])
def test_apply_says_a_cap_as_a_person_writes_it(ip: Any, chat: ChatMagics, typed: str,
                                                said: str) -> None:
    widget = explore(ip)
    widget.cap.value = typed
    if typed == "0":                 # 0 is no cap: what the session has, nothing to apply
        assert widget.assignments() == {}
        return
    assert widget.assignments() == {"CHATCLI_MAX_PAYLOAD": said}
    widget.apply()
    assert f"set CHATCLI_MAX_PAYLOAD={said}" in widget.message.value
    assert widget.error is None


def test_the_chat_budget_shares_are_controls(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    session = chat.workspace.session()
    assert (widget.chat_budget.value, widget.cap_budget.value) == (0.75, 0.7)
    plan = widget.plan
    assert plan is not None and plan.trigger is not None
    assert (f"chat budget {format_size(plan.trigger)} (75% of the 64,000-token window: "
            "chat_budget_ratio) — not reached") in widget.numbers.value
    assert "pre-flight: ok" in widget.numbers.value
    # The 4 questions are ≈11 KB: under 75% of a 6,000-token window, over 30% of it.
    widget.window.value = "6000"
    assert widget.plan is not None and widget.plan.preflight_action == "ok"
    widget.chat_budget.value = 0.3
    plan = widget.plan
    assert plan is not None and plan.settings.chat_budget_ratio == 0.3
    assert plan.preflight_action == "compact" and plan.summary
    assert "over the chat budget" in widget.numbers.value
    assert "(30% of the 6,000-token window: chat_budget_ratio) — compacting to" \
        in widget.numbers.value
    # A 17 KB cap: 70% of it is under the history with the next message, the 85% jump
    # rule is not.
    widget.window.value = ""
    widget.chat_budget.value = 0.75
    widget.cap.value = "17KB"
    plan = widget.plan
    assert plan is not None and plan.before_bytes < 0.85 * 17 * 1024 < plan.before_bytes / 0.7
    assert plan.preflight_action == "compact"
    assert "of the configured cap 17 KB: cap_budget_fraction" in widget.numbers.value
    widget.preflight_fraction.value = 0.95       # the jump rule: no part in a growing chat
    assert widget.plan is not None and widget.plan.preflight_action == "compact"
    widget.cap_budget.value = 0.95               # the cap share was what compacted
    assert widget.plan is not None and widget.plan.preflight_action == "ok"
    assert widget.assignments() == {"CHATCLI_MAX_PAYLOAD": "17 KB",
                                    "cap_budget_fraction": "0.95",
                                    "preflight_cap_fraction": "0.95"}
    widget.apply_button.click()
    assert "set CHATCLI_MAX_PAYLOAD=17 KB, preflight_cap_fraction=0.95, " \
        "cap_budget_fraction=0.95" in widget.message.value
    assert (session.settings.cap_budget_fraction, session.settings.preflight_cap_fraction,
            session.settings.max_payload) == (0.95, 0.95, 17 * 1024)
    assert chat.settings_overrides == {"cap_budget_fraction": "0.95",
                                       "preflight_cap_fraction": "0.95"}
    widget.cap_budget.value = 0.5
    widget.chat_budget.value = 0.2
    widget.reset_button.click()                  # back to the applied settings
    assert (widget.cap_budget.value, widget.chat_budget.value) == (0.95, 0.75)
    assert widget.plan is not None and widget.plan.changes == {}


def test_each_control_says_what_it_sets_and_the_help_says_which_fires_when(
        ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    for name, control in widget.fields.items():
        assert control.tooltip and (name in control.tooltip or name in ("cap", "window"))
    assert "max_payload" in widget.cap.tooltip and "context_window" in widget.window.tooltip
    assert "jumps past" in widget.preflight_fraction.tooltip
    text = widget.help.value
    assert "growing chat" in text and "jumps" in text and "85% vs 70%" in text
    assert all(name in text for name in ("chat_budget_ratio", "cap_budget_fraction",
                                         "preflight_cap_fraction", "preflight_budget_ratio"))


def test_the_rows_wrap_in_a_narrow_column(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    rows = [c for c in widget.widget.children if isinstance(c, widgets.HBox)]
    assert len(rows) == 2 and all(r.layout.flex_flow == "row wrap" for r in rows)
    for column in rows[0].children:
        assert column.layout.min_width == "0" and column.layout.max_width
        assert column.layout.flex.endswith("320px")          # shrinks, then wraps
    for control in widget.fields.values():
        assert control.layout.width == "auto" and control.layout.min_width == "0"
    assert all(b.layout.width == "auto" for b in rows[1].children)


def test_a_browsers_float_noise_is_no_change(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.preflight_fraction.value = 0.8500000000000001    # what a front end sends back
    widget.target_ratio.value = 0.39999999999999997
    widget.chat_budget.value = 0.7500000000000001
    widget.cap_budget.value = 0.7000000000000001
    assert widget.plan is not None and widget.plan.changes == {}
    assert widget.assignments() == {}


def test_reset_brings_back_the_sessions_settings(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.cap.value = "8KB"
    widget.preflight_fraction.value = 0.5
    widget.per_result.value = -1
    widget.reset_button.click()
    assert (widget.cap.value, widget.preflight_fraction.value) == ("", 0.85)
    assert widget.per_result.value == 20_000 and widget.error is None
    assert widget.plan is not None and widget.plan.changes == {}


def test_replay_without_an_event_loop_runs_at_once(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.cap.value = "1MB"                      # above the 16 KB proxy: one 413
    widget.replay_button.click()
    report = widget.report
    assert report is not None and len(report.runs) == 1
    run = report.runs[0]
    assert run.cap == 1 << 20 and run.limits["max_body"] == 16 * 1024
    assert run.answered == 4 and widget.progress.max == 4 == widget.progress.value
    assert "replayed 4/4 turns" in widget.message.value
    assert not widget.replay_button.disabled and widget.cancel_button.disabled
    assert "text/html" in widget.output.outputs[0]["data"]            # the table
    # The plot is an Image widget (or one line without matplotlib), never PNG bytes in the
    # Output's display data (a browser shows those as "[object Object]").
    assert all("image/png" not in o["data"] for o in widget.output.outputs)
    assert "replay of session" in widget.text()


def test_replay_in_a_worker_thread_hands_values_to_the_loop_and_cancels(
        ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)

    async def scenario() -> tuple[bool, bool]:
        widget.start_replay()
        busy = widget.replay_button.disabled and not widget.cancel_button.disabled
        widget.cancel_button.click()
        assert widget._worker is not None
        while widget.replay_button.disabled:
            await asyncio.sleep(0.02)
        return busy, widget._worker.is_alive()

    busy, alive = asyncio.run(scenario())
    assert busy and not alive
    report = widget.report
    assert report is not None and report.cancelled and report.runs[0].total_turns == 4
    assert len(report.runs[0].turns) < 4 and "(cancelled)" in widget.message.value


def test_changes_are_debounced_on_the_event_loop(ip: Any, chat: ChatMagics) -> None:
    session = chat.workspace.session()
    widget = ExploreWidget(session, debounce=0.05)

    async def scenario() -> tuple[int, int]:
        start = widget.computed
        for cap in ("64KB", "32KB", "8KB"):
            widget.cap.value = cap
        pending = widget.computed - start
        await asyncio.sleep(0.2)
        return pending, widget.computed - start

    assert asyncio.run(scenario()) == (0, 1)
    assert widget.plan is not None and widget.plan.settings.max_payload == 8 * 1024

    async def read_at_once() -> int:
        start = widget.computed
        widget.cap.value = "12KB"
        waiting = widget.computed - start
        assert widget.assignments()["CHATCLI_MAX_PAYLOAD"] == "12 KB"   # flushed first
        await asyncio.sleep(0.1)
        return waiting + 10 * (widget.computed - start)

    assert asyncio.run(read_at_once()) == 10      # computed once, when read, not again


def test_the_plain_text_fallback_and_the_widget_view(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.cap.value = "8KB"
    bundle = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    text = bundle["text/plain"]
    assert text.startswith("explore session default: cap=8KB")   # as %%chat calls it
    # The next message (P) is the one pinned; every answered one is folded into the summary.
    assert "fates: SSSSSSSSP" in text and "pre-flight: compact" in text
    assert "next message: assumed" in text
    assert widget.plan is not None and text_strip(widget.plan) == "SSSSSSSSP"


def test_a_session_without_history_says_so_in_the_widget(ip: Any,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    widget = explore(ip)
    assert widget.plan is None and widget.error is not None
    assert "has no history yet" in widget.message.value
    widget.replay_button.click()
    assert "cannot replay" in widget.message.value


def test_explore_is_a_chat_subcommand_with_help(ip: Any, chat: ChatMagics,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "help")
    assert "%chat explore [-S NAME]" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no session named 'other'"):
        ip.run_line_magic("chat", "explore -S other")


def test_a_widget_on_a_plain_session() -> None:
    from fakes import FakeProvider

    session = ChatSession(provider=FakeProvider(window=32_000), name="plain")
    session.send("hello " * 500)
    widget = ExploreWidget(session, debounce=0)
    assert widget.apply_button.disabled                  # no %chat config to apply through
    widget.window.value = "600"
    assert widget.plan is not None and widget.plan.settings.context_window == 600
    assert widget.plan.refused is not None                # the message alone is too big


def test_the_next_message_is_a_control_and_a_bad_size_marks_the_plan(
        ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    assert widget.plan is not None and widget.plan.next_message.startswith("assumed ")
    widget.next_size.value = "12KB"
    plan = widget.plan
    assert plan is not None and plan.next_message == "12 KB, as given"
    assert plan.messages[-1].bytes == 12 * 1024 and plan.messages[-1].fate is Fate.PINNED_REQUEST
    widget.next_size.value = "twelve"
    assert widget.error is not None and "next message" in widget.error
    assert widget.plan is plan                 # the last good plan, marked by the error
    widget.reset()
    assert widget.next_size.value == "" and widget.error is None
