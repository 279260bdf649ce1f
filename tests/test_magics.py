"""%%chat and %chat driven through a real IPython shell against the embedded emulator."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from ipy_ctxrecovery import ChatError, ChatSession
from ipy_ctxrecovery.notebook.display import Answer
from ipy_ctxrecovery.notebook.magics import ChatMagics, get_magics
from ipy_ctxrecovery.settings import format_size


class RecordingPublisher(DisplayPublisher):
    """Keeps every display/update the magics publish (what a front end would receive)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[dict[str, Any]] = []

    def publish(self, data: dict[str, Any], metadata: Any = None, source: Any = None, *,
                transient: Any = None, update: bool = False, **kwargs: Any) -> None:
        self.calls.append({"data": data, "metadata": metadata or {},
                           "transient": transient or {}, "update": update})


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CHATCLI_MAX_PAYLOAD",
                "CHATCLI_CONTEXT_WINDOW", "CHATCLI_MAX_RECOVERY_ATTEMPTS"):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()  # once per process; later calls return None
    shell = globalipapp.get_ipython()
    # %config writes into the shell's config (so a value survives %reload_ext); each test
    # starts without the previous test's values.
    shell.config.pop("ChatMagics", None)
    yield shell
    if "ipy_ctxrecovery" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "ipy_ctxrecovery")
    shell.config.pop("ChatMagics", None)


@pytest.fixture
def chat(ip: Any, capsys: pytest.CaptureFixture[str]) -> ChatMagics:
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    capsys.readouterr()
    magics = get_magics(ip)
    assert magics is not None
    return magics


def cell(ip: Any, line: str, body: str) -> Any:
    return ip.run_cell(f"%%chat {line}\n{body}\n", store_history=True)


# -- loading ------------------------------------------------------------------------------------

def test_load_ext_prints_one_line_naming_the_emulator_and_the_cap(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "emulator (no OPENAI_API_KEY/ANTHROPIC_API_KEY set)" in out
    assert "no payload cap configured" in out
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "5MB")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used-0000000000")
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    out = capsys.readouterr().out
    assert "openai:gpt-5.4-mini (OPENAI_API_KEY is set)" in out
    assert "payload cap 5 MB" in out
    assert "sk-test" not in out


def test_bad_env_value_warns_once_naming_the_variable_and_loading_succeeds(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "lots")
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 1
    assert "CHATCLI_MAX_PAYLOAD" in warnings[0] and "default (none)" in warnings[0]
    assert "no payload cap configured" in captured.out
    assert get_magics(ip) is not None


def test_config_survives_reload_and_a_bad_value_does_not_block_loading(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("config", "ChatMagics.default_format = 'text'")
    ip.config.ChatMagics.max_payload = "lots"  # as if from ipython_config.py
    ip.run_line_magic("reload_ext", "ipy_ctxrecovery")
    fresh = get_magics(ip)
    assert fresh is not None and fresh is not chat
    assert fresh.default_format == "text"
    assert fresh.max_payload is None
    err = capsys.readouterr().err
    assert err.startswith("⚠ ignoring ChatMagics.max_payload: max_payload='lots' is not a "
                          "valid size;")
    assert err.rstrip().endswith("Using the default.") and err.count("\n") == 1


def test_unload_and_reload(chat: ChatMagics, ip: Any) -> None:
    cell(ip, "", "hello")
    emulator = chat.workspace.emulator
    assert emulator is not None and emulator.running
    ip.run_line_magic("reload_ext", "ipy_ctxrecovery")
    assert not emulator.running
    assert get_magics(ip) is not chat
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    assert get_magics(ip) is None
    assert ip.find_cell_magic("chat") is None and ip.find_line_magic("chat") is None


# -- %%chat ---------------------------------------------------------------------------------------

def test_answer_lands_in_out_and_underscore_with_metadata(chat: ChatMagics, ip: Any) -> None:
    result = cell(ip, "", "What is a context window?")
    assert result.success
    answer = ip.user_ns["_"]
    assert isinstance(answer, Answer) and answer is result.result
    assert answer.startswith('Emulator reply: you said "What is a context window?"')
    data, metadata = answer._repr_mimebundle_()
    assert data["text/plain"] == data["text/markdown"] == str(answer)
    meta = metadata["ipy_ctxrecovery"]
    assert meta["model"] == "emulator"
    assert meta["usage"]["prompt_tokens"] > 0 and meta["usage"]["completion_tokens"] > 0
    assert meta["actions"] == [] and meta["finish_reason"] == "end"


def test_the_output_metadata_carries_the_prompt_cache_split(chat: ChatMagics, ip: Any) -> None:
    """Past 1,024 tokens the emulator's OpenAI cache serves the repeated prefix: the
    second answer's metadata says how much, and the uncached rest."""
    long = "Here is what the log says, keep it in mind. " * 150      # ~1,700 tokens
    cell(ip, "", long)
    cell(ip, "", "and what failed?")
    usage = ip.user_ns["_"]._repr_mimebundle_()[1]["ipy_ctxrecovery"]["usage"]
    assert usage["cached_tokens"] >= 1024 and usage["cached_tokens"] % 128 == 0, usage
    assert usage["cache_write_tokens"] == 0, usage
    assert usage["uncached_input"] == usage["prompt_tokens"] - usage["cached_tokens"], usage


def test_trailing_semicolon_silences_the_output(chat: ChatMagics, ip: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "first")
    before = ip.user_ns["_"]
    result = cell(ip, ";", "second")
    assert result.success and result.result is None
    assert ip.user_ns["_"] is before
    assert "Out[" not in capsys.readouterr().out.split("first")[-1]
    result = cell(ip, "", "third;")
    assert result.result is None
    # The body is sent as written, the ";" included.
    assert chat.workspace.session().history[-2].text == "third;"


def test_body_is_sent_as_written_without_variable_expansion(chat: ChatMagics, ip: Any) -> None:
    ip.user_ns["name"] = "EXPANDED"
    cell(ip, "", "keep {name} and $name as they are")
    assert chat.workspace.session().history[-2].text == "keep {name} and $name as they are"


def test_streaming_goes_through_one_display_handle(chat: ChatMagics, ip: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        capsys.readouterr()
        result = cell(ip, "", "count [[words 40]]")
    finally:
        ip.display_pub = saved
    calls = publisher.calls
    assert len(calls) >= 3  # first display, at least one update, the final answer
    ids = {c["transient"].get("display_id") for c in calls}
    assert len(ids) == 1 and None not in ids
    assert not calls[0]["update"] and all(c["update"] for c in calls[1:])
    shown = [c["data"]["text/plain"] for c in calls]
    assert all(b.startswith(a) for a, b in zip(shown, shown[1:], strict=False))
    words = " ".join(f"w{i}" for i in range(1, 41))
    # The live area ends as the finished answer, formats and metadata included: the
    # cell's one output, never an empty leftover, and the answer is not shown twice.
    assert calls[-1]["data"] == {"text/plain": words, "text/markdown": words}
    assert calls[-1]["metadata"]["ipy_ctxrecovery"]["model"] == "emulator"
    assert all(c["data"]["text/plain"] for c in calls)
    assert "Out[" not in capsys.readouterr().out
    # Out[n] and _ still hold the answer.
    assert isinstance(result.result, Answer) and str(result.result) == words
    assert ip.user_ns["_"] is result.result
    assert ip.user_ns["Out"][ip.execution_count - 1] is result.result
    assert ip.user_ns[f"_{ip.execution_count - 1}"] is result.result


def test_a_silenced_cell_streams_nothing(chat: ChatMagics, ip: Any) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        result = cell(ip, ";", "[[words 40]]")
    finally:
        ip.display_pub = saved
    assert result.success and result.result is None
    assert publisher.calls == []
    assert chat.workspace.session().history[-1].text.endswith("w40")


def test_an_answer_still_cut_says_so_in_one_line(chat: ChatMagics, ip: Any,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    result = cell(ip, "--max-tokens 20", "[[words 400]]")
    out = capsys.readouterr().out
    assert result.result.finish_reason == "length"
    said = [line for line in out.splitlines() if "still cut" in line]
    assert len(said) == 1  # from the session's event, or derived by the magic: once
    assert said[0].startswith("⚠ answer still cut at max_tokens=80 after 2 escalations — raise")
    assert "CHATCLI_MAX_TOKEN_ESCALATIONS" in said[0]
    chat.show_events = False  # the recovery lines off: this one is still said
    cell(ip, "--max-tokens 20", "[[words 400]]")
    assert capsys.readouterr().out.count("still cut") == 1
    cell(ip, "--max-tokens 20", "[[words 10]]")
    assert "still cut" not in capsys.readouterr().out  # a complete answer says nothing


def test_called_from_code_the_streamed_answer_stays_visible(chat: ChatMagics, ip: Any) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        result = ip.run_cell("for n in (2, 3):\n"
                             "    get_ipython().run_cell_magic('chat', '', f'[[words {n}]]')\n",
                             store_history=True)
    finally:
        ip.display_pub = saved
    assert result.success and result.result is None  # a loop shows no Out[n]
    last: dict[str, str] = {}
    for call in publisher.calls:
        last[call["transient"]["display_id"]] = call["data"]["text/plain"]
    assert sorted(last.values()) == ["w1 w2", "w1 w2 w3"]


def test_an_interrupt_leaves_the_partial_answer_visible(chat: ChatMagics, ip: Any) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    cell(ip, "", "before")
    length = len(chat.workspace.session().history)

    class InterruptingPublisher(RecordingPublisher):
        def publish(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            super().publish(data, *args, **kwargs)
            if len(self.calls) == 3:
                raise KeyboardInterrupt  # as if the user pressed "interrupt kernel"

    publisher = InterruptingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        result = cell(ip, "", "[[words 40]]")
    finally:
        ip.display_pub = saved
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    # Under the partial answer, the turn's card says it was interrupted, history as before.
    card = publisher.calls[-1]["data"]
    assert "ctxr-card" in card["text/html"]
    assert card["text/plain"].startswith("turn · session default · ✗ cancelled · "
                                         "history exactly as before")
    shown = publisher.calls[-2]["data"]["text/plain"]
    assert shown and " ".join(f"w{i}" for i in range(1, 41)).startswith(shown)
    assert len(chat.workspace.session().history) == length  # the interrupted turn left no trace


def test_streamed_updates_are_coalesced(chat: ChatMagics, ip: Any) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 3600.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        cell(ip, "", "count [[words 40]]")
    finally:
        ip.display_pub = saved
    # The first delta, then the final answer (which carries everything else at once).
    assert len(publisher.calls) == 2
    assert publisher.calls[-1]["data"]["text/plain"].endswith("w40")


def test_no_stream_and_terminal_show_no_live_display(chat: ChatMagics, ip: Any) -> None:
    chat.show_panel = False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        chat.live_display = "always"
        cell(ip, "--no-stream", "quiet please")
        chat.live_display = "auto"  # a terminal shell has no kernel: no handles
        result = cell(ip, "", "and again")
    finally:
        ip.display_pub = saved
    assert publisher.calls == []
    assert isinstance(result.result, Answer)
    assert not chat.workspace.emulator.requests[-2].stream and chat.workspace.emulator.requests[-1].stream


def test_panel_is_shown_once_per_session_and_follows_it(chat: ChatMagics, ip: Any) -> None:
    # show_panel: the live panel above each session's first cell; between turns its output
    # is a snapshot (html + text, no widget), during a turn the widgets, under one display id.
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, True
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        cell(ip, "", "one")
        cell(ip, "", "two")
        cell(ip, "-S other", "three")
    finally:
        ip.display_pub = saved
    panel = chat.workspace.panels["default"]
    mine = [c for c in publisher.calls if c["transient"].get("display_id") == panel.display_id]
    assert len([c for c in mine if not c["update"]]) == 1  # shown once
    assert len([c for c in publisher.calls if not c["update"]
                and c["transient"].get("display_id", "").startswith("ctxr-panel-")]) == 2
    widget = "application/vnd.jupyter.widget-view+json"
    assert [widget in c["data"] for c in mine] == [False, True, False, True, False]
    assert mine[-1]["data"]["text/plain"] == panel.text()
    assert "text/html" in mine[-1]["data"]
    status = chat.workspace.session().status()
    assert panel.history_bytes == status.history_bytes
    assert panel.view()["tokens"] == (f"≈{status.est_tokens:,} of {status.window:,} tokens "
                                      "(model catalogue)")
    chat.show_panel = False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        assert ip.run_line_magic("chat", "panel -S default") is None  # on demand, same panel
        # Without -S: the panel of the current session, the one the last cell used.
        ip.run_line_magic("chat", "panel")
    finally:
        ip.display_pub = saved
    assert publisher.calls[0]["transient"]["display_id"] == panel.display_id
    assert publisher.calls[-1]["transient"]["display_id"] == \
        chat.workspace.panels["other"].display_id


def test_formats(chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    text = cell(ip, "-f text", "plain").result
    assert set(text._repr_mimebundle_()[0]) == {"text/plain"}
    code = cell(ip, "-f code", "[[echo]]total = 1 + 2").result
    assert ip.rl_next_input == "total = 1 + 2" == str(code)     # bare code: a cell
    assert code._repr_mimebundle_()[0]["text/markdown"] == "```python\ntotal = 1 + 2\n```"
    ip.rl_next_input = None
    cell(ip, "-f code", "[[words 3]]")                             # prose: none
    assert ip.rl_next_input is None
    as_json = cell(ip, "--format json", "give me json").result
    assert "application/json" not in as_json._repr_mimebundle_()[0]
    assert "not valid JSON" in capsys.readouterr().err
    parsed = Answer('```json\n{"a": [1, 2]}\n```', answer_format="json")
    assert parsed._repr_mimebundle_()[0]["application/json"] == {"a": [1, 2]}


def test_model_positional_flag_and_conflict(chat: ChatMagics, ip: Any) -> None:
    cell(ip, "emulator:anthropic -S claude", "hi")
    assert chat.workspace.sessions["claude"].model == "emulator:anthropic"
    assert chat.workspace.emulator.requests[-1].path.endswith("/v1/messages")
    cell(ip, "-m emulator -S gpt", "hi")
    assert chat.workspace.emulator.requests[-1].path.endswith("/chat/completions")
    result = cell(ip, "emulator -m emulator:anthropic", "hi")
    assert isinstance(result.error_in_exec, UsageError)
    assert "two models given" in str(result.error_in_exec)


def test_bad_model_session_name_or_directory_is_one_sentence(
        chat: ChatMagics, ip: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = cell(ip, "openai:gpt-4o-mini", "hi")  # no OPENAI_API_KEY in this test
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec).startswith("No OpenAI key found")
    result = cell(ip, "azure:gpt-4o", "hi")
    assert "AzureOpenAI" in str(result.error_in_exec)
    result = cell(ip, '-S "bad name!"', "hi")
    assert "session name 'bad name!' is not valid" in str(result.error_in_exec)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(blocker))
    # A state dir that cannot be written: the notebook still chats, one warning says so.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = cell(ip, "-S elsewhere", "hi")
    assert result.error_in_exec is None
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "set IPY_CTXRECOVERY_DIR to a writable directory" in said[0]


def test_switching_model_keeps_the_conversation(chat: ChatMagics, ip: Any) -> None:
    cell(ip, "", "first message")
    cell(ip, "emulator:anthropic", "second message")
    session = chat.workspace.session()
    assert session.model == "emulator:anthropic"
    assert [m.text for m in session.history if m.role.value == "user"] == [
        "first message", "second message"]


def test_system_max_tokens_options_new_and_no_history(chat: ChatMagics, ip: Any) -> None:
    cell(ip, '--system "You are terse." -o temperature 0.25 -o user "a b"', "hello")
    session = chat.workspace.session()
    assert session.history[0].role.value == "system"
    assert session.history[0].text == "You are terse."
    body = chat.workspace.emulator.requests[-1].body
    assert body["temperature"] == 0.25 and body["user"] == "a b"

    seen = len(chat.workspace.emulator.requests)
    result = cell(ip, "--max-tokens 7", "[[words 60]]")
    # The flag sets the first request's limit; escalation doubles it twice, and the parts
    # are stitched into one answer whose metadata lists the escalations.
    assert [r.body["max_tokens"] for r in chat.workspace.emulator.requests[seen:]] == [7, 14, 28]
    answer = result.result
    assert answer.finish_reason == "length"
    assert " ".join(f"w{i}" for i in range(1, 60)).startswith(str(answer).rsplit(" ", 1)[0])
    escalated = [a.split(" — ")[0] for a in answer.actions if a.startswith("↗")]
    assert escalated == ["↗ answer cut at max_tokens=7", "↗ answer cut at max_tokens=14"]

    length = len(session.history)
    cell(ip, "--no-history", "off the record")
    assert len(chat.workspace.session().history) == length

    cell(ip, "--new", "fresh start")
    assert [m.text for m in chat.workspace.session().history] == [
        "fresh start", chat.workspace.session().history[-1].text]

    result = cell(ip, '--system "Another prompt"', "hi")
    assert isinstance(result.error_in_exec, UsageError)
    assert "add --new" in str(result.error_in_exec)


def test_tools_flag_offers_a_registered_tool(chat: ChatMagics, ip: Any) -> None:
    from ipy_ctxrecovery import chat_tool

    @chat_tool
    def letter_count(text: str) -> int:
        """Count the letters in a text.

        Args:
            text: the text.
        """
        return sum(c.isalpha() for c in text)

    result = cell(ip, "--tools letter_count", '[[tool letter_count {"text": "abc d"}]]')
    assert result.success
    assert "Tool letter_count returned 1 chars." in str(result.result)
    offered = chat.workspace.emulator.requests[-1].body["tools"]
    assert "letter_count" in json.dumps(offered)
    bad = cell(ip, "--tools nope", "hi")
    assert isinstance(bad.error_in_exec, UsageError)
    assert "no tool named 'nope'" in str(bad.error_in_exec)


def test_two_named_sessions_stay_independent(chat: ChatMagics, ip: Any) -> None:
    cell(ip, "-S alpha", "alpha one")
    cell(ip, "-S beta", "beta one")
    cell(ip, "-S alpha", "alpha two")
    alpha, beta = chat.workspace.sessions["alpha"], chat.workspace.sessions["beta"]
    assert [m.text for m in alpha.history if m.role.value == "user"] == ["alpha one",
                                                                         "alpha two"]
    assert [m.text for m in beta.history if m.role.value == "user"] == ["beta one"]
    assert alpha.directory != beta.directory


def test_bad_flag_is_a_one_sentence_usage_error_without_traceback(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    result = cell(ip, "--bogus", "hi")
    assert not result.success and isinstance(result.error_in_exec, UsageError)
    err = capsys.readouterr().err
    assert err.strip() == ("UsageError: %%chat: unrecognized arguments: --bogus; "
                           "see %%chat? for the options.")
    result = cell(ip, "-f html", "hi")
    assert "invalid choice: 'html'" in str(result.error_in_exec)
    result = cell(ip, '--system "unbalanced', "hi")
    assert "check the quotes" in str(result.error_in_exec)
    assert "Traceback" not in capsys.readouterr().err


def test_failure_fails_the_cell_with_one_sentence(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "warm up")
    length = len(chat.workspace.session().history)
    chat.workspace.emulator.fail_next(400, message="This request is not valid for this model.")
    capsys.readouterr()
    result = ip.run_cell("%%chat\nhello\nprint('never')\n", store_history=True)
    assert not result.success
    assert isinstance(result.error_in_exec, UsageError)
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("UsageError: ")
    assert "This request is not valid for this model." in lines[0]
    assert "not valid" not in captured.out  # said once, not also as a status line
    assert len(chat.workspace.session().history) == length  # untouched by the failed turn

    chat.raise_on_error = False
    chat.workspace.emulator.fail_next(400, message="This request is not valid for this model.")
    result = cell(ip, "", "hello again")
    assert result.success and result.result is None
    assert "not valid" in capsys.readouterr().err


def test_help(chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("%%chat?")
    out = capsys.readouterr().out
    assert "%%chat [-m MODEL] [-S NAME]" in out
    for flag in ("--session", "--format", "--system", "--max-tokens", "--new", "--no-history",
                 "--no-stream", "--option", "--tools", "MODEL", "-s TEXT", "-i, --interpolate",
                 "extra.KEY"):
        assert flag in out
    # Why interpolation is opt-in is said where the flag is.
    assert "Off by default because code pasted into a message is full of braces." in \
        " ".join(out.split())
    ip.run_cell("%chat?")
    out = capsys.readouterr().out
    assert "%chat emulator" in out and "%chat export" in out


# -- configuration --------------------------------------------------------------------------------

def test_config_round_trips_and_precedence(chat: ChatMagics, ip: Any,
                                           caplog: pytest.LogCaptureFixture,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "1MB")
    assert chat.settings().max_payload == 1024 * 1024  # env
    ip.run_line_magic("config", "ChatMagics.max_payload = '2MB'")
    assert ip.run_line_magic("config", "ChatMagics.max_payload") == "2MB"
    assert chat.settings().max_payload == 2 * 1024 * 1024  # %config beats env
    capsys.readouterr()
    ip.run_line_magic("config", "ChatMagics.max_payload = 'lots'")
    # One sentence, as IPython's own settings say it — not an ERROR:root log line — and
    # the value in force stays, in the magics and in the shell's configuration.
    assert capsys.readouterr().err == (
        "⚠ %config ChatMagics.max_payload: max_payload='lots' is not a valid size; expected "
        "a size such as 5MB, 512KB, 2.5MB, 1GB or 1024B (binary units; a bare number "
        "means MB; 0 means no cap). It stays '2MB'.\n")
    assert not [r for r in caplog.records if "lots" in r.getMessage()]
    assert chat.max_payload == "2MB" and ip.config.ChatMagics.max_payload == "2MB"

    ip.run_line_magic("config", "ChatMagics.default_model = 'emulator:anthropic'")
    cell(ip, "", "hi")
    assert chat.workspace.session().model == "emulator:anthropic"
    cell(ip, "-S flagged -m emulator", "hi")  # a flag beats %config
    assert chat.workspace.sessions["flagged"].model == "emulator"
    assert chat.workspace.session().settings.max_payload == 2 * 1024 * 1024

    ip.run_line_magic("config", "ChatMagics.raise_on_error = False")
    assert chat.raise_on_error is False
    ip.run_line_magic("config", "ChatMagics.max_payload = 65536")
    assert chat.workspace.session().settings.max_payload == 65536
    ip.run_line_magic("config", "ChatMagics.context_window = '32000'")
    assert chat.context_window == 32000 and chat.workspace.session().window == 32000


def test_chat_config_sets_validates_and_updates_sessions(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "remember me")
    ip.run_line_magic("chat", "config CHATCLI_MAX_PAYLOAD=64KB emergency_keep_messages=6")
    session = chat.workspace.session()
    assert session.settings.max_payload == 64 * 1024
    assert session.settings.emergency_keep_messages == 6
    assert session.history[0].text == "remember me"  # same conversation, new settings
    assert chat.max_payload == "64KB"
    ip.run_line_magic("chat", "config stream=False")
    assert chat.stream is False
    capsys.readouterr()
    ip.run_line_magic("chat", "config")
    out = capsys.readouterr().out
    assert "CHATCLI_MAX_PAYLOAD" in out and "64 KB" in out and "(%chat config)" in out
    for bad, fragment in (("CHATCLI_MAX_PAYLOAD=huge", "CHATCLI_MAX_PAYLOAD"),
                          ("NOPE=1", "not a known setting"),
                          ("justaword", "KEY=VALUE")):
        with pytest.raises(UsageError, match=fragment):
            ip.run_line_magic("chat", f"config {bad}")
    assert chat.workspace.session().settings.max_payload == 64 * 1024


def test_a_session_with_the_users_own_client_keeps_it_across_config_changes(
        chat: ChatMagics, ip: Any, emulator: Any) -> None:
    from ipy_ctxrecovery.session import ChatSession

    gateway = emulator()  # stands for a corporate gateway the user's client is set up for
    gateway_client = gateway.openai_client(max_retries=0)
    mine = ChatSession("openai:emulator", client=gateway_client, name="work")
    chat.workspace.replace_session("work", mine)
    assert cell(ip, "-S work", "through my client").success
    ip.run_line_magic("chat", "config CHATCLI_MAX_PAYLOAD=1MB")
    updated = chat.workspace.sessions["work"]
    assert updated is mine and updated.provider.client is gateway_client
    assert updated.settings.max_payload == 1024 * 1024
    assert cell(ip, "-S work", "still through my client").success
    assert [r.status for r in gateway.requests] == [200, 200]
    assert updated.history[0].text == "through my client"


# -- %chat subcommands ----------------------------------------------------------------------------

def test_panel_names_where_the_window_comes_from(chat: ChatMagics, ip: Any) -> None:
    cell(ip, "", "hello")
    panel = chat.workspace.panel("default")
    assert panel.view()["tokens"].endswith(" of 8,192 tokens (model catalogue)")
    ip.run_line_magic("chat", "emulator --context-window 8000")
    assert panel.view()["tokens"].endswith(" of 8,000 tokens (set on the emulator)")
    cell(ip, "", "again")
    assert panel.view()["tokens"].endswith(" of 8,000 tokens (set on the emulator)")
    ip.run_line_magic("chat", "config context_window=6000")
    assert panel.view()["tokens"].endswith(" of 6,000 tokens (configured)")


def test_status_history_usage_and_sessions(chat: ChatMagics, ip: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "one")
    cell(ip, "", "two")
    capsys.readouterr()
    ip.run_line_magic("chat", "status")
    out = capsys.readouterr().out
    assert "history: 4 messages" in out and "payload cap: no payload cap configured" in out
    ip.run_line_magic("chat", "history")
    out = capsys.readouterr().out
    assert "working history of session default: 4 messages" in out
    assert "  0 user      one" in out
    ip.run_line_magic("chat", "history --full")
    assert "transcript of session default: 4 messages" in capsys.readouterr().out
    ip.run_line_magic("chat", "usage")
    status = chat.workspace.session().status()
    out = capsys.readouterr().out
    assert f"{status.prompt_tokens:,} prompt" in out and "over 2 cells" in out
    cell(ip, "-S other", "x")
    capsys.readouterr()
    ip.run_line_magic("chat", "sessions")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "messages", "size", "last", "used", "first", "words"]
    # Most recent first; * marks the current session, + another one open in this kernel.
    assert lines[1].startswith("*") and lines[1].split()[1:3] == ["other", "2"]
    assert lines[1].rstrip().endswith("x")
    default = chat.workspace.session().name
    assert lines[2].startswith("+") and lines[2].split()[1:4] == ["default", f"({default})",
                                                                  "4"]
    assert lines[2].rstrip().endswith("one")


def test_compact_undo_and_reset(chat: ChatMagics, ip: Any,
                                capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(6):
        cell(ip, "", f"message number {i} " + "lorem ipsum dolor sit amet " * 40)
    before = chat.workspace.session().history
    capsys.readouterr()
    ip.run_line_magic("chat", "compact keep the message numbers")
    out = capsys.readouterr().out
    after = chat.workspace.session().history
    assert "compacted:" in out and len(after) < len(before)
    ip.run_line_magic("chat", "undo-compact")
    assert chat.workspace.session().history == before
    with pytest.raises(UsageError, match="no compaction to undo"):
        ip.run_line_magic("chat", "undo-compact")
    ip.run_line_magic("chat", "reset")
    assert chat.workspace.session().history == ()
    assert len(chat.workspace.session().transcript) == 12


def test_export_json_and_markdown_are_private(chat: ChatMagics, ip: Any, tmp_path: Path) -> None:
    cell(ip, "", "export me")
    ip.run_line_magic("chat", f"export {tmp_path / 'chat.json'}")
    ip.run_line_magic("chat", f"export {tmp_path / 'chat.md'}")
    data = json.loads((tmp_path / "chat.json").read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert "## user\n\nexport me" in (tmp_path / "chat.md").read_text()
    for name in ("chat.json", "chat.md"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600
    with pytest.raises(UsageError, match="must end in .json or .md"):
        ip.run_line_magic("chat", f"export {tmp_path / 'chat.txt'}")


def test_resume_after_a_restart(chat: ChatMagics, ip: Any,
                                capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "-S project", "the plan is X")
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    delattr(ip, "_ipy_ctxrecovery_reopen")                # as good as a kernel restart
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    fresh = get_magics(ip)
    assert fresh is not None and "project" not in fresh.workspace.sessions
    capsys.readouterr()
    ip.run_line_magic("chat", "sessions")
    assert "project" in capsys.readouterr().out
    ip.run_line_magic("chat", "resume project")
    assert fresh.workspace.sessions["project"].history[0].text == "the plan is X"
    cell(ip, "-S project", "and then?")
    assert len(fresh.workspace.sessions["project"].history) == 4
    with pytest.raises(UsageError, match="no saved session named 'ghost'"):
        ip.run_line_magic("chat", "resume ghost")


def test_models_tools_help_and_unknown(chat: ChatMagics, ip: Any,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "models")
    out = capsys.readouterr().out
    assert "default: emulator" in out
    assert "anthropic:claude-sonnet-5-5" in out and "openai:gpt-5.4-mini" in out
    from ipy_ctxrecovery import chat_tool

    @chat_tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    ip.run_line_magic("chat", "tools")
    out = capsys.readouterr().out.splitlines()
    # Every request offers the built-in read_file: it is listed, marked built-in, its
    # description whole (wrapped, never cut mid-sentence).
    assert out[0] == "offered to the model in session default:"
    assert out[1:3] == [
        "  read_file (built-in): Read lines of a text file: a persisted tool result (the path "
        "shown in a",
        "      tool-result preview) or a file under the working directory."]
    assert out[3] == "registered, not offered yet (add with %%chat --tools NAME):"
    assert "  shout: Upper-case a text." in out[4:]  # (other tests register tools too)
    cell(ip, "--tools shout", "hi")
    capsys.readouterr()
    ip.run_line_magic("chat", "tools")
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("  read_file (built-in): ")
    assert out[3] == "  shout: Upper-case a text."
    assert "  shout: Upper-case a text." not in out[4:]
    ip.run_line_magic("chat", "help")
    out = capsys.readouterr().out
    for name in ("status", "history", "compact", "undo-compact", "reset", "sessions", "resume",
                 "usage", "models", "tools", "config", "export", "emulator", "help"):
        assert f"%chat {name}" in out
    ip.run_line_magic("chat", "help emulator")
    assert "--max-body SIZE" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no session named 'nobody' in this kernel"):
        ip.run_line_magic("chat", "status -S nobody")
    assert "nobody" not in chat.workspace.sessions
    with pytest.raises(UsageError, match="unknown subcommand 'frobnicate'"):
        ip.run_line_magic("chat", "frobnicate")
    with pytest.raises(UsageError, match="%chat history: unrecognized arguments: --bogus"):
        ip.run_line_magic("chat", "history --bogus")


def test_emulator_restart_moves_sessions_and_recovers(chat: ChatMagics, ip: Any,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "before the proxy")
    old = chat.workspace.emulator
    capsys.readouterr()
    ip.run_line_magic("chat", "emulator --max-body 32KB --context-window 16000")
    # Plain words, not the flag names; no port number that changes with every run.
    assert capsys.readouterr().out == ("emulator restarted: context window 16,000 tokens; "
                                       "rejects requests over 32 KB (HTTP 413)\n")
    assert not old.running and chat.workspace.emulator is not old
    assert chat.workspace.emulator.max_body == 32 * 1024 and chat.workspace.emulator.context_window == 16000
    session = chat.workspace.session()
    assert session.history[0].text == "before the proxy"
    assert session.window == 16000
    for i in range(12):
        result = cell(ip, "", f"part {i}: " + "x" * 4000)
        assert result.success, result.error_in_exec
    bodies = [r for r in chat.workspace.emulator.requests if r.path.endswith("/chat/completions")]
    rejected = [r for r in bodies if r.status == 413]
    assert len(rejected) <= 1
    assert all(r.body_bytes <= 32 * 1024 for r in bodies if r.status == 200)
    with pytest.raises(UsageError, match="--max-body"):
        ip.run_line_magic("chat", "emulator --max-body lots")
    with pytest.raises(UsageError, match="body_limit_style"):
        ip.run_line_magic("chat", "emulator --body-limit-style teapot")
    capsys.readouterr()
    ip.run_line_magic("chat", "emulator")
    assert "rejects requests over 32 KB (HTTP 413)" in capsys.readouterr().out
    ip.run_line_magic("chat", "emulator --waf-over 24KB --drop-over 600KB --max-output-tokens 300 "
                              "--latency 0.5 --body-limit-style nginx")
    assert capsys.readouterr().out.splitlines()[0] == (
        "emulator restarted: answers at most 300 tokens; 0.5 s delay per answer; nginx-style "
        "413 page; firewall blocks requests over 24 KB (HTTP 403); drops the connection for "
        "requests over 600 KB")


def test_setting_a_cap_after_a_rejection_keeps_what_was_learned_and_the_usage(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "emulator --max-body 16KB")
    for i in range(5):  # the history outgrows 16 KB: one 413, a learned cap, recovered
        assert cell(ip, "", f"part {i}: " + "x" * 5000).success
    session = chat.workspace.session()
    assert session.status().cap_source == "learned"
    learned = session.status().cap
    capsys.readouterr()
    ip.run_line_magic("chat", "history")
    tagged = [line for line in capsys.readouterr().out.splitlines() if " [" in line[:25]]
    assert tagged and all("_" not in line.split("]")[0] for line in tagged), tagged  # plain
    ip.run_line_magic("chat", "usage")
    usage_before = capsys.readouterr().out
    assert "over 5 cells" in usage_before
    ip.run_line_magic("chat", "config CHATCLI_MAX_PAYLOAD=1MB")
    assert chat.workspace.session() is session
    status = session.status()
    assert session.settings.max_payload == 1024 * 1024
    assert status.cap == learned and status.cap_source == "learned"  # below the 1 MB
    assert status.recoveries >= 1
    capsys.readouterr()
    ip.run_line_magic("chat", "usage")
    assert capsys.readouterr().out == usage_before
    ip.run_line_magic("config", "ChatMagics.max_payload = '8KB'")
    assert session.status().cap == 8 * 1024 and session.status().cap_source == "configured"


def test_a_new_emulator_forgets_the_learned_cap_and_says_so(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    chat.live_display = "always"
    ip.run_line_magic("chat", "emulator --max-body 16KB")
    panel = chat.workspace.panel("default")  # a panel, which must follow the update
    for i in range(5):
        assert cell(ip, "", f"part {i}: " + "x" * 5000).success
    session = chat.workspace.session()
    assert session.status().cap_source == "learned"
    assert panel.cap == session.status().cap
    tokens = session.status().prompt_tokens
    capsys.readouterr()
    ip.run_line_magic("chat", "emulator --max-body 64KB")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "emulator restarted: rejects requests over 64 KB (HTTP 413)"
    assert out[1].startswith("ℹ session default: learned payload cap ")
    assert out[1].endswith("forgotten: the new emulator may have other limits")
    assert chat.workspace.session() is session and session.status().prompt_tokens == tokens
    assert panel.cap is None and panel.view()["size"].endswith(" · no payload cap known")
    ip.run_line_magic("chat", "status")
    out = capsys.readouterr().out
    assert "payload cap: no payload cap configured — learned payload cap" in out
    assert cell(ip, "", "on the new emulator").success
    assert chat.workspace.emulator.requests[-1].status == 200


def test_a_new_emulator_says_one_forgotten_cap_line_per_network_path(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "emulator --max-body 16KB")
    for i in range(5):
        assert cell(ip, "", f"part {i}: " + "x" * 5000).success
    assert cell(ip, "-S work", "hello [[words 3]]").success
    ws = chat.workspace
    # The two sessions share the emulator's network path, and so the cap learned on it.
    assert ws.sessions["work"].status().cap == ws.session().status().cap
    assert ws.sessions["work"].status().cap_source == "learned"
    capsys.readouterr()
    ip.run_line_magic("chat", "emulator --max-body 64KB")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "emulator restarted: rejects requests over 64 KB (HTTP 413)"
    assert len(out) == 2, out
    assert out[1].startswith("ℹ sessions default, work: learned payload cap ")
    assert out[1].endswith("forgotten: the new emulator may have other limits")
    assert ws.sessions["work"].status().cap is None and ws.session().status().cap is None


def test_switching_model_or_adding_tools_keeps_the_session_object(chat: ChatMagics,
                                                                  ip: Any) -> None:
    from ipy_ctxrecovery import chat_tool

    @chat_tool
    def echo_back(text: str) -> str:
        """Return the text."""
        return text

    cell(ip, "", "first")
    session = chat.workspace.session()
    cell(ip, "emulator:anthropic --tools echo_back", "second")
    assert chat.workspace.session() is session and session.model == "emulator:anthropic"
    assert "echo_back" in json.dumps(chat.workspace.emulator.requests[-1].body["tools"])
    assert session.status().prompt_tokens > 0 and session.status().turns == 2


def test_chat_config_rejects_bad_values_in_one_sentence_and_sets_nothing(
        chat: ChatMagics, ip: Any) -> None:
    for bad, sentence in (
            ("stream=maybe", "%chat config: stream='maybe' is not valid; use True or False."),
            ("default_format=xml", "%chat config: default_format='xml' is not valid; use one "
                                   "of markdown, text, code, json."),
            ("max_tokens=-3", "%chat config: max_tokens -3 is too small; give a positive "
                              "number, or None for the model's default."),
            ("max_tokens=lots", "%chat config: max_tokens='lots' is not valid; use a whole "
                                "number or None.")):
        with pytest.raises(UsageError) as raised:
            ip.run_line_magic("chat", f"config stream=False {bad}")
        assert str(raised.value) == sentence
        assert chat.stream is True  # the good item before the bad one was not applied
    assert chat.max_tokens is None and chat.default_format == "markdown"
    assert cell(ip, "", "still fine").success


# -- issue 14: every line true, quiet and in order ------------------------------------------------

REPORT = "Q3 revenue grew 12% while storage costs fell. " * 250      # ≈ 11.5 KB


def proxy_session(chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str],
                  parts: int) -> list[str]:
    """A 32 KB proxy and big pastes: the output lines of the cell that hits the 413."""
    ip.run_line_magic("chat", "emulator --context-window 128000 --max-body 32KB")
    ip.user_ns["report"] = REPORT
    out: list[str] = []
    for i in range(1, parts + 1):
        capsys.readouterr()
        assert cell(ip, "-i", f"Part {i} of the report: {{report}}").success
        out = capsys.readouterr().out.splitlines()
    return out


def test_a_recovered_turn_says_each_step_once_in_order_before_the_answer(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = proxy_session(chat, ip, capsys, 3)
    # The failure, what it taught, the cut it explains, the recovery — then the answer
    # (streamed as printed text in a terminal shell).
    # (The emulator counts the messages of the body it received: on the OpenAI wire the
    # notices and the request, all the user's, go out merged as one message.)
    assert [re.sub(r"[\d.]+ KB|\(\d+ messages?, \d+ prompt", "N", line) for line in out] == [
        "⚠ Recoverable failure (payload too large (413)) — compacting and retrying",
        "ℹ Learned a payload limit of about N (a N request was rejected)",
        "  ↳ oldest messages dropped to fit (5 → 3 messages)",
        "✓ Recovered after 1 recovery step",
        'Emulator reply: you said "Part 3 of the report: Q3 revenue grew 12% while storage '
        'cost" N tokens).',
    ]
    answer = ip.user_ns["_"]
    assert list(answer.actions) == out[:4]
    # The expert's details are in the output's metadata whatever the verbosity.
    steps = [e for e in answer.metadata["events"] if e["event"] == "LadderStep"]
    assert steps[0]["decision"]["level"] == "exact_fit" and "exact fit" in steps[0]["line"]
    for line in out:
        assert "exact" not in line and "after the cut" not in line and "target" not in line


def test_a_summary_is_said_once_without_noise(chat: ChatMagics, ip: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = proxy_session(chat, ip, capsys, 4)
    assert [re.sub(r"[\d.]+ KB|\d+%", "N", line) for line in out[:-1]] == [
        "ℹ pre-flight: history N ≈ N of learned cap (N) — compacting",
        "⇣ Summarizing older messages with the model (5 messages, N → target N)…",
        "✓ Summary applied (5 → 3 messages, N → N)",
    ]
    assert out[-1].startswith('Emulator reply: you said "Part 4')


def test_the_learned_limit_comes_before_the_cut_at_every_verbosity(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    chat.verbosity = "debug"
    out = proxy_session(chat, ip, capsys, 3)
    first = [line.split(" ", 2)[:2] for line in out]
    learned = first.index(["ℹ", "Learned"])
    assert out[learned - 2].startswith("⚠ Recoverable failure (payload too large (413))")
    assert out[learned - 1].startswith("ℹ exact fit: a ")        # the expert's numbers
    assert out[learned + 1] == "  ↳ oldest messages dropped to fit (5 → 3 messages)"
    assert out[learned + 2].startswith("  ↳ exact_fit: ")
    assert out[learned + 3:learned + 5] == [
        "ℹ SYSTEM NOTICE (payload limit hit) given to the model",
        "ℹ the model was told that earlier context was compacted"]
    assert out.index("✓ Recovered after 1 recovery step") == learned + 5
    assert out[-1].startswith("· history ")                      # routine, debug only


def test_quiet_says_only_what_was_lost(chat: ChatMagics, ip: Any,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    chat.show_events = False            # the deprecated alias of verbosity = "quiet"
    assert chat.verbosity == "quiet"
    out = proxy_session(chat, ip, capsys, 3)
    assert out[0] == "↳ oldest messages dropped to fit (5 → 3 messages)"
    assert out[1].startswith("Emulator reply:") and len(out) == 2
    chat.verbose = True
    assert chat.verbosity == "debug"


def test_in_a_notebook_recovered_is_said_before_the_answer_area(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ip.run_line_magic("chat", "emulator --context-window 128000 --max-body 32KB")
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    ip.user_ns["report"] = REPORT
    cell(ip, "-i", "Part 1: {report}")
    cell(ip, "-i", "Part 2: {report}")
    timeline: list[str] = []

    class Timeline(RecordingPublisher):
        def publish(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            super().publish(data, *args, **kwargs)
            timeline.append("display: " + data["text/plain"][:20])

    class Out:
        def write(self, text: str) -> int:
            timeline.extend(f"print: {line}" for line in text.splitlines() if line)
            return len(text)

        def flush(self) -> None:
            return None

    monkeypatch.setattr(sys, "stdout", Out())
    saved, ip.display_pub = ip.display_pub, Timeline(shell=ip)
    try:
        cell(ip, "-i", "Part 3: {report}")
    finally:
        ip.display_pub = saved
    recovered = timeline.index("print: ✓ Recovered after 1 recovery step")
    shown = next(i for i, t in enumerate(timeline) if t.startswith("display: "))
    assert recovered < shown and timeline[shown].startswith("display: Emulator reply")


def test_compact_says_its_result_once(chat: ChatMagics, ip: Any,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "compact")
    assert capsys.readouterr().out == "nothing to compact: session default has no messages yet\n"
    for i in range(6):
        cell(ip, "", f"message number {i} " + "lorem ipsum dolor sit amet " * 40)
    capsys.readouterr()
    ip.run_line_magic("chat", "compact")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4
    assert out[0].startswith("⇣ Summarizing older messages with the model (12 messages, ")
    assert re.fullmatch(r"✓ compacted: 12 → 3 messages, [\d.]+ KB → [\d.]+ KB "
                        r"\(%chat undo-compact restores\)", out[1]), out[1]
    assert out[2].startswith("  summary request ")      # what it was billed, once
    assert out[3].startswith("  each later request ≈ ")


def test_status_of_an_empty_session_and_plurals(chat: ChatMagics, ip: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "status")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "session default · model emulator"
    assert re.fullmatch(r"endpoint: the embedded emulator at http://127\.0\.0\.1:\d+/v1/", out[1])
    assert out[2] == "history: empty (the 8,192-token window)"   # no request overhead shown
    cell(ip, "", "one")
    capsys.readouterr()
    ip.run_line_magic("chat", "status")
    out = capsys.readouterr().out
    assert "history: 2 messages, " in out and "(2% of the 8,192-token window)" in out
    ip.run_line_magic("chat", "usage")
    assert capsys.readouterr().out.endswith(" completion tokens over 1 cell\n")
    assert "(1 message, " in str(ip.user_ns["_"])


# -- errors that name the cause and the way out -----------------------------------------------------

@pytest.mark.parametrize(("line", "sentence"), [
    ("nosuchprovider:model",
     "%%chat: unknown provider 'nosuchprovider' in 'nosuchprovider:model'; use openai:MODEL, "
     "anthropic:MODEL, emulator or emulator:anthropic (%chat models lists them; for another "
     "OpenAI-compatible server set OPENAI_BASE_URL)."),
    ("-S foo bar",
     "%%chat: 'bar' was taken as the model (the word after the flags on the %%chat line), and "
     "no model by that name is known; write the message in the cell body, or name the model "
     "as openai:bar or anthropic:bar (%chat models lists the known ones)."),
    ("-S x {x}",
     "%%chat: '{x}' was taken as the model (the word after the flags on the %%chat line); the "
     "message goes in the cell body, below the %%chat line — add -i there to fill in {name} "
     "from your variables."),
])
def test_a_mistaken_model_word_is_named(chat: ChatMagics, ip: Any, line: str,
                                        sentence: str) -> None:
    result = cell(ip, line, "hi")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == sentence
    assert chat.workspace.sessions == {}       # nothing was started


def test_a_connection_error_names_the_endpoint_and_the_proxy(
        chat: ChatMagics, ip: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    import openai

    from ipy_ctxrecovery.session import ChatSession
    from ipy_ctxrecovery.settings import Settings

    with socket.socket() as probe:            # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://alice:s3cret@127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = openai.OpenAI(api_key="sk-test-0000", base_url=f"http://gateway.invalid:{port}/v1",
                           max_retries=0)
    session = ChatSession("openai:gpt-4o", client=client, name="down",
                          settings=Settings(transient_retries=0))
    chat.workspace.replace_session("down", session)
    result = cell(ip, "-S down", "hello")
    assert isinstance(result.error_in_exec, UsageError)
    said = str(result.error_in_exec)
    assert said.endswith(f"(endpoint http://gateway.invalid:{port}/v1/chat/completions via "
                         f"proxy http://[REDACTED]@127.0.0.1:{port} (HTTP_PROXY)).")
    assert "s3cret" not in said and "alice" not in said
    capsys.readouterr()
    ip.run_line_magic("chat", "status -S down")
    assert (f"endpoint: http://gateway.invalid:{port}/v1/ via proxy "
            f"http://[REDACTED]@127.0.0.1:{port} (HTTP_PROXY)") in capsys.readouterr().out


def test_status_leaves_the_proxy_to_a_users_own_http_client(
        chat: ChatMagics, ip: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import openai

    from ipy_ctxrecovery.session import ChatSession

    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy.example:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://env-proxy.example:3128")
    own = openai.OpenAI(api_key="sk-test-0000", base_url="http://gateway.invalid/v1",
                        http_client=openai.DefaultHttpxClient(proxy="http://corp.example:8080"))
    sdk_default = openai.OpenAI(api_key="sk-test-0000", base_url="http://gateway.invalid/v1")
    chat.workspace.replace_session("own", ChatSession("openai:gpt-4o", client=own, name="own"))
    chat.workspace.replace_session("env", ChatSession("openai:gpt-4o", client=sdk_default,
                                                      name="env"))
    capsys.readouterr()
    ip.run_line_magic("chat", "status -S own")
    out = capsys.readouterr().out
    assert ("endpoint: http://gateway.invalid/v1/ (proxy and TLS as your own http_client sets "
            "them)\n") in out
    assert "env-proxy" not in out and "no proxy" not in out
    ip.run_line_magic("chat", "status -S env")
    assert ("endpoint: http://gateway.invalid/v1/ via proxy http://env-proxy.example:3128 "
            "(HTTP_PROXY)") in capsys.readouterr().out


def test_history_masks_the_sessions_key_pasted_into_a_message(
        chat: ChatMagics, ip: Any, emulator: Callable[..., Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery.session import ChatSession

    key = "gw-0a7da072e4e4d9e16a4c"            # no well-known format: only the client knows it
    emu = emulator(api_key=key, token=None)
    client = emu.openai_client(api_key=key, max_retries=0)
    chat.workspace.replace_session("k", ChatSession("openai:team-model", client=client,
                                                    name="k"))
    cell(ip, "-S k", f'[[words 3]] why does curl -H "X-Key: {key}" fail?')
    assert key.encode() in emu.requests[-1].raw          # sent as typed
    capsys.readouterr()
    ip.run_line_magic("chat", "history -S k --width 200")
    ip.run_line_magic("chat", "history -S k --full --width 200")
    out = capsys.readouterr().out
    assert key not in out
    assert out.count('why does curl -H "X-Key: [REDACTED]" fail?') == 2


def load_with_env(ip: Any, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """``%load_ext ipy_ctxrecovery`` in an environment with ``env`` set."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")


def test_the_load_line_names_the_endpoint_and_proxy(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    load_with_env(ip, monkeypatch, {
        "OPENAI_API_KEY": "sk-test-not-used-0000000000",
        "OPENAI_BASE_URL": "https://llm.example.internal/v1",
        "HTTPS_PROXY": "http://bob:hunter2@proxy.example:3128",
    })
    assert capsys.readouterr().out == (
        "ipy_ctxrecovery: %%chat uses openai:gpt-5.4-mini (OPENAI_API_KEY is set) at "
        "https://llm.example.internal/v1 via proxy http://[REDACTED]@proxy.example:3128 "
        "(HTTPS_PROXY); no payload cap configured. %chat help lists commands.\n")


def test_the_no_cap_hint_is_a_notebook_command(chat: ChatMagics, ip: Any,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "config no_cap_warn_bytes=4KB")
    capsys.readouterr()
    cell(ip, "", "x" * 5000)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ℹ history ")
    assert out[0].endswith("— if your network has a proxy/gateway, set its limit with "
                           "%chat config CHATCLI_MAX_PAYLOAD=5MB (or the environment variable "
                           "CHATCLI_MAX_PAYLOAD)")
    assert "export" not in out[0]


def test_a_cut_at_the_models_own_limit_names_that_limit(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "emulator --max-output-tokens 10")
    capsys.readouterr()
    result = cell(ip, "", "[[words 40]]")
    assert result.result.finish_reason == "length"
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("⚠ answer cut at 10 tokens: that is the most emulator writes in one "
                       "answer — ask for a shorter answer, or for the rest in the next cell")
    assert not any("raise" in line for line in out)


def test_max_tokens_above_the_models_limit_is_said(chat: ChatMagics, ip: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "--max-tokens 10000000", "hi")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("ℹ --max-tokens 10,000,000 is above emulator's output limit of 4,096 "
                      "tokens — asking for 4,096")
    assert chat.workspace.emulator.requests[-1].body["max_tokens"] == 4096


def test_a_failing_tool_shows_its_error_on_one_line(chat: ChatMagics, ip: Any,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery import chat_tool

    @chat_tool
    def lookup_order(order: str) -> str:
        """Find an order."""
        raise RuntimeError("database unreachable\nkey sk-proj-abcdefghijklmnopqrstuvwxyz0123 "
                           "rejected")

    capsys.readouterr()
    cell(ip, "--tools lookup_order", '[[tool lookup_order {"order": "42"}]]')
    tool_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("⚙")]
    assert tool_lines == ["⚙ lookup_order failed: Error: lookup_order raised RuntimeError: "
                          "database unreachable key [REDACTED] rejected"]


def test_ctrl_c_is_one_line_and_keeps_the_history(chat: ChatMagics, ip: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery.notebook.display import ChatInterrupted

    cell(ip, "", "before")
    session = chat.workspace.session()
    history = session.history

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt     # what Ctrl-C raises deep inside the HTTP client

    session.provider.send = interrupted  # type: ignore[method-assign]
    capsys.readouterr()
    result = cell(ip, "", "this one is interrupted")
    error = result.error_in_exec
    assert isinstance(error, ChatInterrupted) and isinstance(error, KeyboardInterrupt)
    assert error._render_traceback_() == [
        "KeyboardInterrupt: the request was interrupted — the working history is as it was "
        "before this cell (2 messages); your message stays in the transcript."]
    captured = capsys.readouterr()
    shown = captured.out + captured.err     # IPython prints tracebacks to stdout
    assert shown == f"{error._render_traceback_()[0]}\n" and "Traceback" not in shown
    assert session.history == history


# -- configuration like IPython's own ---------------------------------------------------------------

def test_a_refused_config_value_is_not_applied_again_on_reload(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("config", "ChatMagics.max_payload = 'garbage'")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("It stays None.\n")
    assert "max_payload" not in ip.config.ChatMagics
    ip.run_line_magic("reload_ext", "ipy_ctxrecovery")
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("ipy_ctxrecovery: %%chat uses")


def test_env_warnings_do_not_contradict_and_rejected_values_are_not_the_source(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    load_with_env(ip, monkeypatch, {
        "CHATCLI_MAX_PAYLOAD": "lots",
        "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "6",
        "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "5",
    })
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "⚠ ignoring CHATCLI_MAX_PAYLOAD: CHATCLI_MAX_PAYLOAD='lots' is not a valid size; "
        "expected a size such as 5MB, 512KB, 2.5MB, 1GB or 1024B (binary units; a bare number "
        "means MB; 0 means no cap). Using the default (none).",
        # Named with the values set, not a default the user never wrote; the other
        # value stays in force.
        "⚠ ignoring CHATCLI_MICROCOMPACT_TRUNCATE_TURNS=6: "
        "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS=5 is below CHATCLI_MICROCOMPACT_TRUNCATE_TURNS=6; "
        "results must be truncated before they are summarized, so set it to at least the "
        "truncate age. Using the default (2).",
    ]
    ip.run_line_magic("chat", "config max_payload")
    ip.run_line_magic("chat", "config CHATCLI_MICROCOMPACT_TRUNCATE_TURNS")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["CHATCLI_MAX_PAYLOAD", "max_payload", "no", "cap", "(default;",
                              "CHATCLI_MAX_PAYLOAD='lots'", "was", "ignored)"]
    assert out[1].split()[2:4] == ["2", "(default;"]


def test_a_malformed_prices_variable_is_named_once(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    load_with_env(ip, monkeypatch, {"CHATCLI_PRICES": "emulator=1/2"})
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("⚠ ignoring CHATCLI_PRICES: the price of 'emulator' is not four "
                           "non-negative numbers; expected model=in/cached/write/out")
    assert line.count("CHATCLI_PRICES") == 1 and line.endswith("Using the default (none).")


def test_bad_env_values_never_cost_a_good_one_its_value(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Two bad variables (one out of range, one contradicting a default) used to make the
    # whole set ignored, the proxy cap with them: "no payload cap configured".
    load_with_env(ip, monkeypatch, {
        "CHATCLI_MAX_PAYLOAD": "512KB",
        "CHATCLI_EMERGENCY_KEEP_MESSAGES": "0",
        "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "6",
        "CHATCLI_MAX_TOKEN_ESCALATIONS": "-1",
    })
    err = sorted(capsys.readouterr().err.splitlines())
    assert [line.split(":")[0] for line in err] == [
        "⚠ ignoring CHATCLI_EMERGENCY_KEEP_MESSAGES=0",
        "⚠ ignoring CHATCLI_MAX_TOKEN_ESCALATIONS",
        "⚠ ignoring CHATCLI_MICROCOMPACT_TRUNCATE_TURNS=6"]
    assert "must be at least 1" in err[0] and "Using the default (10)" in err[0]
    assert "expected a whole number ≥ 0" in err[1]          # 0 escalations is allowed
    assert "is below CHATCLI_MICROCOMPACT_TRUNCATE_TURNS=6" in err[2]
    chat = ip.magics_manager.registry["ChatMagics"]
    settings = chat.settings()
    assert settings.max_payload == 512 * 1024
    assert (settings.emergency_keep_messages, settings.microcompact_truncate_turns,
            settings.max_token_escalations) == (10, 2, 2)


def test_env_values_that_agree_are_kept_whatever_their_order() -> None:
    from ipy_ctxrecovery.notebook.environment import env_settings
    settings, warnings = env_settings({"CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "6",
                                       "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "8"})
    assert warnings == []
    assert (settings.microcompact_truncate_turns, settings.microcompact_summarize_turns) == (6, 8)


def test_config_says_what_a_zero_means_and_lists_every_setting_it_set(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # QA: "set context_window=0" then read back None; turn_timeout=30 missing from the list.
    ip.run_line_magic("chat", "config context_window=0 turn_timeout=30")
    assert capsys.readouterr().out == ("set context_window=0 (the model's own window), "
                                       "turn_timeout=30\n")
    ip.run_line_magic("chat", "config")
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    timeout = [line for line in listed if line[0] == "turn_timeout"]
    assert timeout == [["turn_timeout", "30.0", "(%chat", "config)"]], listed
    assert chat.settings().turn_timeout == 30
    ip.run_line_magic("chat", "config context_window")
    assert capsys.readouterr().out.split() == [
        "CHATCLI_CONTEXT_WINDOW", "context_window", "the", "model's", "own", "window",
        "(default)"]                                     # 0 set it back to the default


def test_config_shows_one_key_and_takes_a_size_with_a_space(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ip.run_line_magic("chat", "config CHATCLI_MAX_PAYLOAD=5 MB")
    assert chat.settings().max_payload == 5 * 1024 * 1024
    capsys.readouterr()
    ip.run_line_magic("chat", "config max_payload")
    assert capsys.readouterr().out.split() == ["CHATCLI_MAX_PAYLOAD", "max_payload", "5",
                                               "MB", "(%chat", "config)"]
    ip.run_line_magic("chat", "config verbosity")
    assert capsys.readouterr().out == "ChatMagics.verbosity = 'normal' (default)\n"
    monkeypatch.setenv("CHATCLI_CONTEXT_WINDOW", "32000")
    ip.run_line_magic("chat", "config context_window")
    assert capsys.readouterr().out.split()[2:] == ["32000", "(environment)"]
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "2 MB")   # a space in the environment too
    ip.run_line_magic("config", "ChatMagics.max_payload = None")
    assert chat.settings().max_payload == 2 * 1024 * 1024


def test_config_shows_several_keys_given_alone(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # QA: "%chat config server_compaction openai_api" said "'server_compaction' is not
    # KEY=VALUE", although `%chat help` reads "config [KEY[=VALUE] …]".
    ip.run_line_magic("chat", "config server_compaction CHATCLI_OPENAI_API verbosity")
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in out[:2]] == [
        ["CHATCLI_SERVER_COMPACTION", "server_compaction", "auto"],
        ["CHATCLI_OPENAI_API", "openai_api", "auto"]]
    assert out[2:] == ["ChatMagics.verbosity = 'normal' (default)"]


def test_a_bad_flag_setting_is_told_the_words_it_takes(
        chat: ChatMagics, ip: Any) -> None:
    # QA: "openai_store='perhaps' is not on or off; use True or False." named two pairs
    # of words, as if on/off were not accepted.
    for key in ("openai_store", "CHATCLI_BACKGROUND_COMPACTION"):
        with pytest.raises(UsageError) as raised:
            ip.run_line_magic("chat", f"config {key}=perhaps")
        assert str(raised.value) == (f"%chat config: {key}='perhaps' is not valid; use on "
                                     "or off (or True or False).")
    assert chat.settings().openai_store is False
    assert chat.settings().background_compaction is True


def test_config_rows_without_a_variable_and_no_cap_read_like_the_others(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "config chat_budget_ratio")
    assert capsys.readouterr().out == "chat_budget_ratio = 0.75 (default)\n"
    ip.run_line_magic("chat", "config max_payload")
    assert capsys.readouterr().out.split() == ["CHATCLI_MAX_PAYLOAD", "max_payload", "no",
                                               "cap", "(default)"]
    ip.run_line_magic("chat", "config chat_budget_ratio=0.5")
    capsys.readouterr()
    ip.run_line_magic("chat", "config")
    row = next(line for line in capsys.readouterr().out.splitlines()
               if "chat_budget_ratio" in line)
    assert row.startswith("chat_budget_ratio ") and row.split() == [
        "chat_budget_ratio", "0.5", "(%chat", "config)"]
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("chat", "config chat_budget_ratio=1.5")
    assert str(refused.value) == ("%chat config: chat_budget_ratio=1.5 must be a fraction in "
                                  "(0, 1].")


def test_a_number_flag_given_a_word_says_it_is_not_a_whole_number(
        chat: ChatMagics, ip: Any) -> None:
    result = cell(ip, "--max-tokens abc", "hi")
    assert str(result.error_in_exec) == ("%%chat: argument --max-tokens: 'abc' is not a whole "
                                         "number; see %%chat? for the options.")
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("chat", "emulator --context-window lots")
    assert "argument --context-window: 'lots' is not a whole number" in str(refused.value)
    for word in ("slow", "-1", "nan"):
        with pytest.raises(UsageError) as refused:
            ip.run_line_magic("chat", f"emulator --latency {word}")
        assert (f"argument --latency: '{word}' is not a number of seconds from 0 to 3600 "
                f"(e.g. 0.5)"
                in str(refused.value))


def test_an_unknown_tool_is_told_what_is_there(chat: ChatMagics, ip: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ipy_ctxrecovery.session import tools as tools_module

    monkeypatch.setattr(tools_module, "_REGISTRY", {})
    result = cell(ip, "--tools nosuchtool", "hi")
    assert str(result.error_in_exec) == (
        "--tools: no tool named 'nosuchtool'; none is registered with @chat_tool yet "
        "(read_file is built in and offered without --tools).")
    result = cell(ip, "--tools read_file", "hi")
    assert str(result.error_in_exec) == (
        "--tools: read_file is built in and offered without --tools (unless --no-read-file "
        "or read_file=False).")


def test_options_are_checked_against_the_sdk(chat: ChatMagics, ip: Any) -> None:
    for line, sentence in (
            ("-o temperature abc", "%%chat: -o temperature \"abc\" is not valid: OpenAI "
                                   "chat.completions.create takes a number (e.g. 0.2) for "
                                   "temperature."),
            ("-o bogus 1", "%%chat: -o bogus is not a parameter of OpenAI "
                           "chat.completions.create (it takes: ")):
        result = cell(ip, line, "hi")
        assert isinstance(result.error_in_exec, UsageError)
        assert str(result.error_in_exec).startswith(sentence)
    assert str(result.error_in_exec).endswith("to send a field as is, write -o extra.bogus "
                                              "VALUE.")
    assert cell(ip, "-o extra.top_k 40 -o seed 7 -o reasoning_effort low", "hi").success
    body = chat.workspace.emulator.requests[-1].body
    assert (body["top_k"], body["seed"], body["reasoning_effort"]) == (40, 7, "low")
    result = cell(ip, "emulator:anthropic -S a -o top_k many", "hi")
    assert "Anthropic messages.create" in str(result.error_in_exec)


# -- habits from jupyter-ai and llm -----------------------------------------------------------------

def test_interpolation_is_opt_in_and_knows_in_out_and_err(
        chat: ChatMagics, ip: Any) -> None:
    ip.user_ns["name"] = "Ada"
    cell(ip, "-i", "hello {name}, braces {{kept}}")
    assert chat.workspace.session().history[-2].text == "hello Ada, braces {kept}"
    code = ip.run_cell("1 + 41", store_history=True)
    failed = ip.run_cell("int('x')", store_history=True)
    assert not failed.success
    n, m = code.execution_count, failed.execution_count
    cell(ip, "-i", f"In: {{In[{n}]}} Out: {{Out[{n}]}}\nErr: {{Err[{m}]}}")
    sent = chat.workspace.session().history[-2].text
    assert sent.startswith("In: 1 + 41 Out: 42\nErr: Traceback (most recent call last):")
    assert sent.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'x'")
    result = cell(ip, "-i", "what is {nowhere}?")
    assert str(result.error_in_exec) == ("%%chat -i: {nowhere} is not defined in this kernel; "
                                         "define it, or write {{ and }} for literal braces.")
    assert cell(ip, "-s 'Be brief.' -S short", "hi").success      # -s is --system
    assert chat.workspace.sessions["short"].history[0].text == "Be brief."


def test_chat_error_asks_about_the_last_failed_cell(chat: ChatMagics, ip: Any,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="no cell outside %%chat has failed since "
                                         "ipy_ctxrecovery was loaded; run"):
        ip.run_line_magic("chat", "error")
    # A failed %%chat cell is not what it asks about, and it says so (QA: "no cell has
    # failed" right after one had).
    assert not ip.run_cell("%%chat --nosuch\nhi", store_history=True).success
    with pytest.raises(UsageError, match="a %%chat cell's failure is already its one sentence"):
        ip.run_line_magic("chat", "error")
    assert not ip.run_cell("values = [1, 2]\nvalues[5]", store_history=True).success
    capsys.readouterr()
    result = ip.run_cell("%chat error why index 5?", store_history=True)
    assert result.success
    asked = chat.workspace.emulator.requests[-1].body["messages"][-1]["content"]
    assert asked.startswith("This notebook cell failed.\n\n~~~python\nvalues = [1, 2]\n"
                            "values[5]\n~~~\n\nTraceback:\n~~~\nTraceback (most recent call")
    assert "IndexError: list index out of range" in asked and asked.endswith("why index 5?")
    assert capsys.readouterr().out.startswith('Emulator reply: you said "This notebook cell')


def test_code_format_takes_every_block(chat: ChatMagics, ip: Any,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery.session import ChatSession
    from tests.fakes import FakeProvider

    reply = ("Install, then run:\n```bash\npip install rich\n```\n"
             "```python\nfrom rich import print\nprint('hi')\n```")
    fake = FakeProvider([reply])
    chat.workspace.replace_session("code", ChatSession("fake", provider=fake, name="code"))
    result = cell(ip, "-S code -f code", "show me")
    assert ip.rl_next_input == ("# bash:\n# pip install rich\n\nfrom rich import print\n"
                                "print('hi')")
    assert result.result._repr_mimebundle_()[0]["text/markdown"] == (
        "```bash\npip install rich\n```\n\n```python\nfrom rich import print\nprint('hi')\n```")
    # Prose with no code block makes no cell (QA: it became the next input), and says so.
    fake.script.append("Use a dict comprehension; it reads better.")
    ip.rl_next_input = None
    capsys.readouterr()
    cell(ip, "-S code -f code", "and now?")
    assert ip.rl_next_input is None
    assert "no cell was made from it" in capsys.readouterr().err


def test_models_name_the_variable_each_provider_needs_in_aligned_columns(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "models")
    out = capsys.readouterr().out.splitlines()
    headers = [line for line in out if " — needs " in line]
    assert headers == [
        "openai — needs OPENAI_API_KEY (OPENAI_BASE_URL for another OpenAI-compatible server)",
        "anthropic — needs ANTHROPIC_API_KEY (ANTHROPIC_BASE_URL for a gateway)",
        "emulator — needs nothing: the built-in emulator on 127.0.0.1 (%chat emulator changes "
        "its limits)"]
    rows = [line for line in out if line.startswith("  ")]
    assert len({line.index(" window ") for line in rows}) == 1
    assert len({line.index(" max output ") for line in rows}) == 1
    assert len({len(line) for line in rows}) == 1


def test_models_show_the_window_the_emulator_was_configured_with(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def emulator_row() -> tuple[str, list[str]]:
        ip.run_line_magic("chat", "models")
        out = capsys.readouterr().out.splitlines()
        rows = [line for line in out if line.startswith("  ")]
        # The columns stay aligned whatever follows the emulator's row.
        assert len({line.index(" max output ") for line in rows}) == 1
        return next(line for line in rows if line.startswith("  emulator")), out

    row, out = emulator_row()
    assert re.search(r"window +8,192  max output +[\d,]+$", row), row   # the catalogue's
    ip.run_line_magic("chat", "emulator --context-window 4000")
    row, out = emulator_row()
    assert re.search(r"window +4,000  max output +[\d,]+  \(set with %chat emulator "
                     r"--context-window\)$", row), row
    assert not any(line.startswith("context window ") for line in out)
    ip.run_line_magic("config", "ChatMagics.context_window = 3000")
    row, out = emulator_row()
    assert row.endswith("(set with %chat config or %config ChatMagics.context_window; the "
                        "emulator itself holds 4,000)") and " window     3,000 " in row
    assert out[-1] == ("context window 3,000 tokens set with %chat config or %config "
                       "ChatMagics.context_window: used for every model instead of the "
                       "window listed")
    assert chat.workspace.session().window == 3000          # what the session uses too
    chat.context_window = None
    monkeypatch.setenv("CHATCLI_CONTEXT_WINDOW", "5000")
    row, out = emulator_row()
    assert "window     5,000 " in row and "(from CHATCLI_CONTEXT_WINDOW; the emulator " \
        "itself holds 4,000)" in row


def test_semicolon_right_after_the_magic_and_an_empty_cell(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%%chat;\nquietly\n", store_history=True)
    assert result.success and result.result is None
    assert chat.workspace.session().history[-2].text == "quietly"
    assert "quietly" not in capsys.readouterr().out
    result = cell(ip, "", "   \n\t ")
    assert str(result.error_in_exec) == ("%%chat: the cell has no message; write it below the "
                                         "%%chat line.")
    assert len(chat.workspace.session().history) == 2


# -- terminal IPython and code calling the magic ----------------------------------------------------

def test_a_terminal_streams_the_answer_once(chat: ChatMagics, ip: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert chat.stream_mode() == "print"        # no kernel: a terminal
    result = cell(ip, "", "[[words 5]]")
    out = capsys.readouterr().out
    assert out == "w1 w2 w3 w4 w5\n"           # streamed; no second copy as Out[n]
    assert ip.user_ns["_"] is result.result and result.result == "w1 w2 w3 w4 w5"


def test_a_terminal_prints_a_continued_answer_whole_then_the_escalations(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    result = cell(ip, "--max-tokens 20", "[[words 60]]")
    lines = capsys.readouterr().out.splitlines()
    words = " ".join(f"w{i}" for i in range(1, 61))
    assert result.result == words
    assert lines[0] == words                    # no status line through the printed answer
    assert lines[1:] == ["↗ answer cut at max_tokens=20 — continued with max_tokens=40 "
                         "(escalation 1/2)"]


def test_a_loop_of_calls_shows_every_answer(chat: ChatMagics, ip: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    loop = ("for n in (2, 3):\n"
            "    get_ipython().run_cell_magic('chat', '{}', f'[[words {{n}}]]')\n")
    ip.run_cell(loop.format(""), store_history=True)
    assert capsys.readouterr().out == "w1 w2\nw1 w2 w3\n"
    ip.run_cell(loop.format("--no-stream"), store_history=True)  # shown once each, complete
    assert capsys.readouterr().out == "w1 w2\nw1 w2 w3\n"


def test_called_as_the_last_expression_the_answer_is_shown_once(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    capsys.readouterr()
    try:
        result = ip.run_cell("get_ipython().run_cell_magic('chat', '', '[[words 3]]')",
                             store_history=True)
    finally:
        ip.display_pub = saved
    answer = result.result
    assert isinstance(answer, Answer) and ip.user_ns["_"] is answer
    # One display area ends as the answer; as the cell's value it shows nothing more.
    assert {c["transient"]["display_id"] for c in publisher.calls} == {
        publisher.calls[0]["transient"]["display_id"]}
    assert publisher.calls[-1]["data"]["text/plain"] == "w1 w2 w3"
    assert "w1 w2 w3" not in capsys.readouterr().out


def test_ctrl_c_during_a_manual_compaction_is_one_line(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery.notebook.display import ChatInterrupted

    for i in range(4):
        cell(ip, "", f"message number {i} " + "lorem ipsum dolor sit amet " * 40)
    session = chat.workspace.session()
    history = session.history

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    session.provider.send = interrupted  # type: ignore[method-assign]
    capsys.readouterr()
    with pytest.raises(ChatInterrupted) as raised:
        ip.run_line_magic("chat", "compact")
    assert raised.value._render_traceback_() == [
        "KeyboardInterrupt: the compaction was interrupted — the history is as it was "
        "(8 messages)."]
    assert session.history == history
    # That line is the one said: no second line telling the same (the cancelled phase).
    shown = capsys.readouterr()
    assert "cancelled" not in shown.out + shown.err, shown


def test_a_streamed_answer_shows_again_in_a_later_cell(chat: ChatMagics, ip: Any) -> None:
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        cell(ip, "", "[[words 2]]")
    finally:
        ip.display_pub = saved
    answer = ip.user_ns["_"]
    assert ip.display_formatter.format(answer)[0]["text/plain"] == "w1 w2"   # _ shows it


def test_a_streamed_answer_shows_again_after_cells_that_store_no_history(
        chat: ChatMagics, ip: Any) -> None:
    # Cells run without storing history (a front end's silent runs) leave the execution
    # count as it was, so the count cannot tell one cell from the next: the run can.
    chat.live_display, chat.stream_interval, chat.show_panel = "always", 0.0, False
    publisher = RecordingPublisher(shell=ip)
    saved, ip.display_pub = ip.display_pub, publisher
    try:
        ip.run_cell("%%chat\n[[words 2]]\n", store_history=False)
        answer = ip.user_ns["_"]
        assert isinstance(answer, Answer) and answer == "w1 w2"
        assert publisher.calls[-1]["data"]["text/plain"] == "w1 w2"   # shown where it streamed
        assert ip.display_formatter.format(answer)[0]["text/plain"] == "w1 w2"  # between cells
        publisher.calls.clear()
        ip.run_cell("display(_)", store_history=False)                # a later cell
        assert [c["data"]["text/plain"] for c in publisher.calls] == ["w1 w2"]
        publisher.calls.clear()
        # In the cell that streamed it, the answer as the cell's value shows nothing more.
        ip.run_cell("get_ipython().run_cell_magic('chat', '', '[[words 3]]')",
                    store_history=False)
        assert [c["data"]["text/plain"] for c in publisher.calls][-1] == "w1 w2 w3"
        assert len({c["transient"]["display_id"] for c in publisher.calls}) == 1
    finally:
        ip.display_pub = saved


def test_config_refusals_say_what_is_accepted(chat: ChatMagics, ip: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("config", "ChatMagics.verbosity = 'loud'")
    ip.run_line_magic("config", "ChatMagics.stream = 'sometimes'")
    assert capsys.readouterr().err.splitlines() == [
        "⚠ %config ChatMagics.verbosity: verbosity='loud' is not valid; use one of quiet, "
        "normal, debug. It stays 'normal'.",
        "⚠ %config ChatMagics.stream: stream='sometimes' is not valid; use True or False. "
        "It stays True."]
    ip.run_line_magic("config", "ChatMagics.verbosity = 'debug'")
    assert chat.verbosity == "debug" and capsys.readouterr().err == ""


def test_forget_limits_after_the_proxy_limit_was_raised(chat: ChatMagics, ip: Any,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    cell(ip, "", "hello")
    emulator = chat.workspace.emulator
    emulator.configure(context_window=1_000_000, max_body="16KB")
    for i in range(6):
        cell(ip, "", f"message {i} " + "lorem ipsum dolor sit amet " * 100)
    session = chat.workspace.session()
    assert session.caps.source == "learned"
    learned = session.caps.effective()
    assert learned is not None and learned < 16 * 1024
    emulator.configure(max_body="1MB")          # the network team raised the limit
    capsys.readouterr()
    with pytest.raises(ChatError, match="%chat forget-limits if the proxy/gateway limit "
                                        "was raised since"):
        session.send("a long paste " + "x" * 20 * 1024)
    ip.run_line_magic("chat", "forget-limits")
    out = capsys.readouterr().out
    assert out.startswith(f"forgot the learned payload cap ({format_size(learned)}) for every "
                          "session on this network path")
    assert session.caps.effective() is None
    session.send("a long paste " + "x" * 20 * 1024)            # goes through now
    assert emulator.requests[-1].status == 200 and emulator.requests[-1].body_bytes > 16 * 1024
    ip.run_line_magic("chat", "forget-limits")
    assert capsys.readouterr().out.startswith("nothing was learned to forget")


def test_status_names_only_the_kernels_own_emulator_as_embedded(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str], emulator: Any) -> None:
    cell(ip, "", "hello")
    other = emulator(context_window=64_000)
    chat.workspace.replace_session("other", ChatSession("emulator", emulator=other,
                                                        name="other"))
    capsys.readouterr()
    ip.run_line_magic("chat", "status -S other")
    out = capsys.readouterr().out
    assert f"endpoint: an emulator at http://127.0.0.1:{other.port}/v1/" in out
    assert "embedded" not in out and "\nemulator:" not in out
    ip.run_line_magic("chat", "status")
    out = capsys.readouterr().out
    assert "endpoint: the embedded emulator at " in out and "\nemulator: " in out


def test_usage_and_status_show_the_cache_split_and_the_cost(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "one")
    capsys.readouterr()
    ip.run_line_magic("chat", "usage")
    out = capsys.readouterr().out
    assert "cached reads" not in out        # the emulator bills nothing, caches nothing
    # Priced by the user: $1 per million input tokens, $1,000,000 per million answer ones.
    ip.run_line_magic("chat", "config prices=emulator=1/0.1/1.25/1000000")
    capsys.readouterr()
    ip.run_line_magic("chat", "usage")
    out = capsys.readouterr().out.splitlines()
    status = chat.workspace.sessions["default"].status()
    assert out[1:] == [f"  0 cached reads + 0 cache writes + {status.prompt_tokens:,} "
                       "uncached input tokens",
                       f"  cost: ≈ ${status.cost:,.2f} (estimated; input and answer)"]
    assert status.cost == pytest.approx(status.prompt_tokens / 1e6 + status.completion_tokens)
    ip.run_line_magic("chat", "status")
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"cache: {out[1].strip()}")
    assert lines[at + 1] == out[2].strip()


def test_setting_prices_says_what_it_drops_and_when_it_misses_the_sessions_model(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # A second prices= silently dropped the first one's models, and an entry for another
    # model (or a typo) left the session's cost as it was with nothing said.
    ip.run_line_magic("chat", "config prices=emulator=3/0.3/3.75/15")
    assert capsys.readouterr().out == "set prices=emulator=3/0.3/3.75/15\n"
    ip.run_line_magic("chat", "config prices=gpt4o=1/1/0/1")
    assert capsys.readouterr().out.splitlines() == [
        "set prices=gpt4o=1/1/0/1",
        "ℹ prices replaces the earlier setting: emulator is no longer in it (list every model "
        "in one prices=, comma separated)",
        "ℹ prices has no entry for session default's model, emulator, which keeps its list "
        "price (its entry would be emulator=IN/CACHED/WRITE/OUT)"]
    ip.run_line_magic("chat", "config prices=gpt4o=1/1/0/1,emulator=1/0.1/1.25/2")
    assert capsys.readouterr().out == "set prices=gpt4o=1/1/0/1,emulator=1/0.1/1.25/2\n"


def test_turning_prompt_caching_off_says_openai_caches_all_the_same(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # Off, the OpenAI wire went on reporting cached reads, with nothing said of why.
    ip.run_line_magic("chat", "config prompt_caching=off")
    assert capsys.readouterr().out.splitlines() == [
        "set prompt_caching=off",
        "ℹ prompt_caching off: no cache breakpoints are sent (the Anthropic wire caches "
        "nothing then); OpenAI still caches a repeated prefix on its own, which no request "
        "setting turns off"]
    ip.run_line_magic("chat", "config prompt_caching=off")      # already off: said once
    assert capsys.readouterr().out == "set prompt_caching=off\n"
