"""%chat explore: the widget read through its trait values (no browser), in a real shell."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.notebook.explore import ExploreWidget, text_strip
from ipy_ctxrecovery.notebook.magics import ChatMagics, get_magics
from ipy_ctxrecovery.session.what_if import Fate


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
    assert widget.strip.value.count("title='#") == len(session.history)
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
    assert widget.assignments() == {"CHATCLI_MAX_PAYLOAD": "12288B",
                                    "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "1",
                                    "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "3"}
    widget.apply_button.click()
    settings = chat.workspace.session().settings
    assert (settings.max_payload, settings.microcompact_truncate_turns,
            settings.microcompact_summarize_turns) == (12 * 1024, 1, 3)
    assert chat.max_payload == "12288B"
    assert chat.settings_overrides == {"microcompact_truncate_turns": "1",
                                       "microcompact_summarize_turns": "3"}
    assert "set CHATCLI_MAX_PAYLOAD=12288B" in widget.message.value
    assert widget.plan is not None and widget.plan.changes == {}   # now the session's own
    widget.apply()
    assert "nothing to apply" in widget.message.value


def test_a_browsers_float_noise_is_no_change(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.preflight_fraction.value = 0.8500000000000001    # what a front end sends back
    widget.target_ratio.value = 0.39999999999999997
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
    kinds = [o["data"].keys() for o in widget.output.outputs]
    assert "text/html" in kinds[0] and "text/plain" in kinds[1]
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
        assert widget.assignments()["CHATCLI_MAX_PAYLOAD"] == "12288B"   # flushed first
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
    assert "fates: SSSSSSP·" in text and "pre-flight: compact" in text
    assert widget.plan is not None and text_strip(widget.plan) == "SSSSSSP·"


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
