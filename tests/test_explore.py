"""%chat explore: the widget read through its trait values (no browser), in a real shell."""

from __future__ import annotations

import asyncio
import html
from collections.abc import Iterator
from typing import Any

import ipywidgets as widgets
import pytest
from contrast import installed_themes, theme_problems, vetted
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core import theme
from ipy_ctxrecovery.notebook.explore import ExploreWidget, text_strip
from ipy_ctxrecovery.notebook.magics import ChatMagics, get_magics
from ipy_ctxrecovery.session.what_if import FATE_COLOURS, Fate
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
    # The values in force, each with where it comes from.
    assert (widget.cap.value, widget.window.value) == ("", "64000")
    assert widget.notes["cap"].value.endswith(">none configured or learned</div>")
    assert "64000: the model&#x27;s own, set on the emulator" in widget.notes["window"].value
    assert "default" in widget.notes["emergency_keep_messages"].value
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
    ("per_result", -4, "per-result budget: -4 is no budget; write a number of characters"),
    ("cap", "abc", "payload cap: 'abc' is not a size; write it like 256KB, or leave it empty "
                   "for none."),
    ("cap", "1KB", "payload cap: 1 KB is outside what a proxy's body limit can be; write 4 KB"),
    ("window", "wide", "context window: 'wide' is not a whole number of tokens; write it like "
                       "128000, or leave it empty for the model's own."),
    ("window", "100", "context window: 100 tokens is outside what any model has"),
    ("per_turn", 5, "per-result budget: 20,000 is above the per-turn budget (5)"),
    ("summarize_turns", 1, "one-line results after: 1 is below truncate results after (2)"),
    ("next_size", "twelve", "next message: 'twelve' is not a size; write it like 8KB"),
])
def test_a_refused_value_is_said_in_the_controls_words_and_marks_the_plan_stale(
        ip: Any, chat: ChatMagics, field: str, value: Any, words: str) -> None:
    widget = explore(ip)
    good = widget.plan
    fresh = (widget.strip.value, widget.numbers.value)
    assert not widget.stale and "stale" not in widget.strip.value + widget.text()
    getattr(widget, field).value = value
    assert widget.error is not None and widget.error.startswith(words)
    assert "CHATCLI_" not in widget.error and "_" not in widget.error.split(":")[0]
    assert "\n" not in widget.error and "Traceback" not in widget.message.value
    assert html.escape(words) in widget.message.value
    assert widget.plan is good                              # the last good plan stays...
    assert widget.stale                                     # ...marked, in view and text
    assert "stale: the plan below is for the last valid values" in widget.strip.value
    assert "opacity:0.45" in widget.strip.value and "opacity:0.45" in widget.numbers.value
    assert "ctxr-stale" in widget.strip._dom_classes
    assert fresh[0] in widget.strip.value                   # the old plan, dimmed
    text = widget.text()
    assert f"✗ {widget.error}\nstale: the plan below is for the last valid values" in text
    widget.apply()
    assert "nothing applied" in widget.message.value
    assert chat.workspace.session().settings == Settings.from_env()
    widget.reset()                                          # a valid value: fresh again
    assert not widget.stale and (widget.strip.value, widget.numbers.value) == fresh
    assert "ctxr-stale" not in widget.strip._dom_classes and "stale" not in widget.text()


def test_a_settings_sentence_names_the_controls_not_their_variables(
        ip: Any, chat: ChatMagics) -> None:
    """What the widget's own checks do not catch is said by the settings; the names in that
    sentence become the controls' labels."""
    widget = explore(ip)
    said = widget._in_words_of_controls(
        "CHATCLI_MAX_PAYLOAD=2 KB is outside what a proxy's body limit can be; "
        "per_result_max_chars=5 exceeds turn_budget_chars=4.")
    assert said == ("payload cap=2 KB is outside what a proxy's body limit can be; "
                    "per-result budget=5 exceeds per-turn budget=4.")


def test_messages_and_legend_take_their_colours_from_the_theme(
        ip: Any, chat: ChatMagics) -> None:
    themes = installed_themes()
    widget = explore(ip)
    widget.cap.value = "lots"
    refused = widget.message.value
    assert f"color:{theme.TEXT_ERROR}" in refused
    widget.cap.value = "256KB"
    widget.flush()
    widget.apply()
    taken = widget.message.value
    assert f"color:{theme.TEXT_OK}" in taken
    for page in (refused, taken, widget.legend.value, widget.strip.value):
        assert theme_problems(page, themes, allowed=FATE_COLOURS.values()) == []
        assert vetted(page) == []
    assert all(c in widget.legend.value for c in set(FATE_COLOURS.values()) - {
        FATE_COLOURS[Fate.PINNED_REQUEST]})             # one swatch for all of "pinned"


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


# -- the values in force and where they come from ----------------------------------------------

@pytest.fixture
def learned(ip: Any, chat: ChatMagics, capsys: pytest.CaptureFixture[str]) -> ChatMagics:
    """The chat of ``chat`` grown past the emulator's 16 KB: a cap learned from its 413."""
    for i in range(4, 8):
        ip.run_cell_magic("chat", "--no-stream", f"Question {i} " + "lorem ipsum " * 200 + ";")
    capsys.readouterr()
    assert chat.workspace.session().caps.source == "learned"
    return chat


def test_a_learned_cap_is_shown_as_in_force_and_is_no_change_on_apply(
        ip: Any, learned: ChatMagics) -> None:
    session = learned.workspace.session()
    cap = session.caps.effective()
    assert cap is not None and session.settings.max_payload is None
    widget = explore(ip)
    assert widget.cap.value == format_size(cap) == "15.8 KB"    # not "none"
    assert "learned from a refusal on this network path" in widget.notes["cap"].value
    plan = widget.plan
    assert plan is not None and plan.changes == {} and widget.assignments() == {}
    assert (plan.cap, plan.cap_source) == (cap, "learned")
    text = widget.text()
    assert text.startswith("explore session default: cap=15.8 KB, window=64000")
    assert "sources: cap 15.8 KB: learned from a refusal on this network path" in text
    # Apply with the learned cap untouched: nothing (it is not made a configured cap).
    widget.apply_button.click()
    assert "nothing to apply" in widget.message.value
    assert learned.max_payload is None and session.settings.max_payload is None
    assert widget.undo_button.disabled
    # Moved, it plans with the moved value, compared with the one in force.
    widget.cap.value = "12KB"
    plan = widget.plan
    assert plan is not None and (plan.cap, plan.cap_source) == (12 * 1024, "configured")
    assert plan.changes == {"max_payload": (None, 12 * 1024)}
    assert (f"moved from 15.8 KB — learned from a refusal on this network path, {cap:,} "
            "bytes") in widget.notes["cap"].value
    # The value in force written otherwise is no move.
    widget.cap.value = f"{cap}B"
    assert widget.plan is not None and widget.plan.changes == {} and not widget.moved("cap")
    # A configured cap above the learned one: the learned one still applies, and says so.
    widget.cap.value = "64KB"
    plan = widget.plan
    assert plan is not None and (plan.cap, plan.cap_source) == (cap, "learned")
    assert "the learned 15.8 KB still applies below it" in widget.notes["cap"].value
    assert widget.assignments() == {"CHATCLI_MAX_PAYLOAD": "64 KB"}


@pytest.mark.parametrize("how", ["%chat config", "environment", "ipython_config"])
def test_each_note_says_where_a_configured_value_comes_from(
        ip: Any, chat: ChatMagics, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "%chat config":
        ip.run_line_magic("chat", "config CHATCLI_MAX_PAYLOAD=48KB CHATCLI_EMERGENCY_KEEP_MESSAGES=7")
        said = "configured (%chat config)"
    elif how == "environment":
        monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "48KB")
        monkeypatch.setenv("CHATCLI_EMERGENCY_KEEP_MESSAGES", "7")
        ip.run_cell_magic("chat", "-S envs --no-stream", "hi")   # read by a new session
        said = "configured (CHATCLI_MAX_PAYLOAD)"
    else:
        ip.run_line_magic("config", "ChatMagics.max_payload = '48KB'")
        ip.run_line_magic("config", "ChatMagics.settings_overrides = "
                                    "{'emergency_keep_messages': '7'}")
        said = "configured (ipython_config / %config)"
    widget = ip.run_line_magic("chat", "explore" + (" -S envs" if how == "environment" else ""))
    assert widget.cap.value == "48 KB" and widget.emergency_keep.value == 7
    assert f"48 KB: {said}" in widget.notes["cap"].value
    assert said.replace("CHATCLI_MAX_PAYLOAD", "CHATCLI_EMERGENCY_KEEP_MESSAGES") \
        in widget.notes["emergency_keep_messages"].value
    assert widget.notes["per_result_max_chars"].value.endswith(">default</div>")
    assert widget.plan is not None and widget.plan.changes == {}
    assert widget.plan.cap_source == "configured"


def test_a_configured_window_and_a_value_off_a_sliders_range_are_shown_whole(
        ip: Any, chat: ChatMagics) -> None:
    ip.run_line_magic("chat", "config CHATCLI_CONTEXT_WINDOW=32000 "
                              "CHATCLI_EMERGENCY_KEEP_MESSAGES=100")
    widget = explore(ip)
    assert widget.window.value == "32000"
    widget.window.value = "32,000"                         # the same window, written otherwise
    assert widget.plan is not None and widget.plan.changes == {} and not widget.moved("window")
    assert "32000: configured (%chat config)" in widget.notes["window"].value
    assert widget.emergency_keep.value == 100 <= widget.emergency_keep.max
    ip.run_line_magic("chat", "config cap_budget_fraction=0.33 preflight_budget_ratio=0.02")
    widget.reset()
    assert (widget.cap_budget.value, widget.cap_budget.step) == (0.33, 0.01)
    assert widget.target_ratio.value == 0.02 >= widget.target_ratio.min
    assert widget.plan is not None and widget.plan.changes == {} and widget.assignments() == {}
    assert widget.plan is not None and widget.plan.changes == {}
    assert widget.assignments() == {}


# -- undo ------------------------------------------------------------------------------------

def test_apply_can_be_undone_one_apply_at_a_time(ip: Any, chat: ChatMagics) -> None:
    session = chat.workspace.session()
    widget = explore(ip)
    undo = widget.undo_button
    assert undo.description == "Undo apply" and "ctxr-undo" in undo._dom_classes
    assert undo.disabled                                   # nothing applied yet
    widget.cap.value = "12KB"
    widget.truncate_turns.value = 1
    widget.apply_button.click()
    assert session.settings.max_payload == 12 * 1024
    assert "applied to session default: set CHATCLI_MAX_PAYLOAD=12 KB" in widget.message.value
    assert not undo.disabled and "CHATCLI_MAX_PAYLOAD=0" in undo.tooltip
    # The controls show the applied values, as configured.
    assert widget.cap.value == "12 KB" and "configured (%chat config)" in widget.notes["cap"].value
    widget.chat_budget.value = 0.5
    widget.apply_button.click()                            # a second Apply
    assert session.settings.chat_budget_ratio == 0.5
    widget.summarize_turns.value = 9                       # moved, not applied
    undo.click()                                           # undoes the second Apply only
    assert session.settings.chat_budget_ratio == 0.75
    assert (session.settings.max_payload, session.settings.microcompact_truncate_turns) \
        == (12 * 1024, 1)
    assert (widget.chat_budget.value, widget.cap.value, widget.summarize_turns.value) \
        == (0.75, "12 KB", 4)                              # the controls follow
    # Unset before that Apply: unset again (the default in force), not set to the default.
    assert ("undid Apply on session default: set chat_budget_ratio back to its default (0.75)"
            in widget.message.value)
    assert "chat_budget_ratio" not in chat.settings_overrides
    assert not undo.disabled
    undo.click()                                           # then the first
    assert session.settings == Settings.from_env()
    assert chat.settings_overrides == {} and chat.max_payload is None
    assert (widget.cap.value, widget.truncate_turns.value) == ("", 2)
    assert widget.plan is not None and widget.plan.changes == {}
    assert undo.disabled
    undo.click()                                           # nothing left: nothing happens
    assert session.settings == Settings.from_env()


def test_reset_after_apply_goes_back_to_the_settings_in_force(ip: Any, chat: ChatMagics) -> None:
    widget = explore(ip)
    widget.cap.value = "24KB"
    widget.apply()
    widget.cap.value = "8KB"
    widget.emergency_keep.value = 3
    widget.reset_button.click()
    assert (widget.cap.value, widget.emergency_keep.value) == ("24 KB", 10)
    assert widget.plan is not None and widget.plan.changes == {}
    assert not widget.undo_button.disabled                 # Reset is not Undo


# -- names and fates -------------------------------------------------------------------------

def test_the_session_is_named_as_the_user_calls_it(ip: Any, chat: ChatMagics) -> None:
    session = chat.workspace.session()
    assert session.name.startswith("session-") and chat.workspace.current == "default"
    widget = explore(ip)
    assert widget.name == "default" and "<code>default</code>" in widget.title.value
    widget.replay_button.click()
    report = widget.report
    assert report is not None and report.source == "default"
    assert report.text().startswith("replay of session default")
    outputs = str(widget.output.outputs)
    assert "replay of session default" in outputs and session.name not in outputs
    text = widget.text()
    assert text.startswith("explore session default:") and session.name not in text
    widget.cap.value = "20KB"
    widget.apply()
    assert "applied to session default:" in widget.message.value
    assert session.name not in widget.message.value


@pytest.mark.parametrize("next_size", ["", "3KB"])
def test_only_the_planned_next_message_is_the_latest_request(
        ip: Any, chat: ChatMagics, next_size: str) -> None:
    session = chat.workspace.session()
    widget = explore(ip)
    widget.next_size.value = next_size
    plan = widget.plan
    assert plan is not None and len(plan.messages) == len(session.history) + 1
    pinned = [m.index for m in plan.messages if m.fate is Fate.PINNED_REQUEST]
    assert pinned == [len(session.history)]                # the next message, no answered one
    assert plan.messages[-1].role == "user" and session.history[-1].role.value == "assistant"


# -- in a real kernel ------------------------------------------------------------------------

KERNEL_TIMEOUT = 120


def test_in_a_kernel_the_display_tells_the_learned_cap_a_refusal_and_undo(
        data_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ipykernel: the display's text/plain twin (what a saved notebook keeps) shows
    the learned cap in force; a refused value, debounced on the kernel's own event loop,
    marks the plan stale with the control's words; Apply then Undo apply."""
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import start_new_kernel

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    manager, client = start_new_kernel(kernel_name="python3", startup_timeout=KERNEL_TIMEOUT)

    def run(code: str) -> tuple[str, list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = []
        reply = client.execute_interactive(code, timeout=KERNEL_TIMEOUT,
                                           output_hook=messages.append, allow_stdin=False)
        assert reply["content"]["status"] == "ok", messages
        out = "".join(m["content"].get("text", "") for m in messages
                      if m["msg_type"] == "stream")
        # The explorer shows itself under its own display id (display_data, not a result).
        return out, [m["content"] for m in messages
                     if m["msg_type"] in ("execute_result", "display_data")]

    try:
        run("%load_ext ipy_ctxrecovery\n%chat emulator --max-body 16KB --context-window 64000\n"
            "%config ChatMagics.stream = False\n"
            "for i in range(8):\n"
            "    get_ipython().run_cell_magic('chat', '', f'Question {i} ' "
            "+ 'lorem ipsum ' * 200 + ';')")
        _, results = run("w = get_ipython().run_line_magic('chat', 'explore')\nw")
        text = results[0]["data"]["text/plain"]
        assert "application/vnd.jupyter.widget-view+json" in results[0]["data"]
        assert text.startswith("explore session default: cap=15.8 KB, window=64000")
        assert "cap 15.8 KB: learned from a refusal on this network path" in text
        assert "cap=none" not in text
        # A typed value waits for its debounce on the kernel's loop: between cells, it runs.
        out, _ = run("w.cap.value = 'abc'; print(w._pending is not None, w._error)")
        assert out.split() == ["True", "None"]             # not computed yet
        run("import time; time.sleep(2 * w.debounce)")
        out, _ = run("print(w._error); print(w.stale); print('ctxr-stale' in w.strip._dom_classes)")
        assert out.splitlines() == [
            "payload cap: 'abc' is not a size; write it like 256KB, or leave it empty for none.",
            "True", "True"]
        run("w.cap.value = '12KB'; w.apply_button.click()")
        out, _ = run("print(w.message.value); print(w.undo_button.disabled)\n"
                     "%chat config CHATCLI_MAX_PAYLOAD")
        assert "applied to session default: set CHATCLI_MAX_PAYLOAD=12 KB" in out
        assert "False" in out.splitlines() and "12 KB" in out.splitlines()[-1]
        run("w.undo_button.click()")
        out, _ = run("print(w.cap.value); print(w.undo_button.disabled)\n"
                     "%chat config CHATCLI_MAX_PAYLOAD")
        lines = out.splitlines()
        assert lines[:2] == ["15.8 KB", "True"] and "no cap" in lines[-1]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
