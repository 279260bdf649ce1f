"""%%chat and %chat driven through a real IPython shell against the embedded emulator."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from ipy_ctxrecovery.notebook.display import Answer
from ipy_ctxrecovery.notebook.magics import ChatMagics, get_magics


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


def test_still_cut_wording_without_a_session_event() -> None:
    from ipy_ctxrecovery import events as ev
    from ipy_ctxrecovery.notebook.magics import _still_cut

    steps = [ev.Escalation(attempt=n, max_tokens=t, previous=t // 2, of=2)
             for n, t in ((1, 200), (2, 400))]
    assert _still_cut(steps, 100) == (
        "⚠ answer still cut at max_tokens=400 after 2 escalations — raise --max-tokens or "
        "CHATCLI_MAX_TOKEN_ESCALATIONS, or ask for a shorter answer")
    assert _still_cut([], None).startswith("⚠ answer still cut at the model's output limit "
                                           "with no escalation left")


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
        assert ip.run_line_magic("chat", "panel") is None  # shown on demand, same panel
    finally:
        ip.display_pub = saved
    assert publisher.calls[0]["transient"]["display_id"] == panel.display_id


def test_formats(chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    text = cell(ip, "-f text", "plain").result
    assert set(text._repr_mimebundle_()[0]) == {"text/plain"}
    code = cell(ip, "-f code", "[[words 3]]").result
    assert ip.rl_next_input == "w1 w2 w3" == str(code)
    assert code._repr_mimebundle_()[0]["text/markdown"] == "```python\nw1 w2 w3\n```"
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
    result = cell(ip, "-S elsewhere", "hi")
    assert isinstance(result.error_in_exec, UsageError)
    assert "set IPY_CTXRECOVERY_DIR to a writable directory" in str(result.error_in_exec)


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
                 "--no-stream", "--option", "--tools", "MODEL"):
        assert flag in out
    ip.run_cell("%chat?")
    out = capsys.readouterr().out
    assert "%chat emulator" in out and "%chat export" in out


# -- configuration --------------------------------------------------------------------------------

def test_config_round_trips_and_precedence(chat: ChatMagics, ip: Any,
                                           caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "1MB")
    assert chat.settings().max_payload == 1024 * 1024  # env
    ip.run_line_magic("config", "ChatMagics.max_payload = '2MB'")
    assert ip.run_line_magic("config", "ChatMagics.max_payload") == "2MB"
    assert chat.settings().max_payload == 2 * 1024 * 1024  # %config beats env
    ip.run_line_magic("config", "ChatMagics.max_payload = 'lots'")
    # %config reports a trait error as one logged line, no traceback.
    assert [r.getMessage() for r in caplog.records if "lots" in r.getMessage()] == [
        "max_payload='lots' is not a valid size; expected "
        "a size such as 5MB, 512KB, 2.5MB, 1GB or 1024B (binary units; a bare number "
        "means MB; 0 means no cap)."]
    assert chat.max_payload == "2MB"

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
    out = capsys.readouterr().out
    assert out.startswith("default") and "\nother" in out


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
    ip.run_line_magic("reload_ext", "ipy_ctxrecovery")  # as good as a kernel restart
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
    # Every request offers the built-in read_file: it is listed, marked built-in.
    assert out[0] == "offered to the model in session default:"
    assert out[1].startswith("  read_file (built-in): Read lines of a text file")
    assert out[2] == "registered, not offered yet (add with %%chat --tools NAME):"
    assert "  shout: Upper-case a text." in out[3:]  # (other tests register tools too)
    cell(ip, "--tools shout", "hi")
    capsys.readouterr()
    ip.run_line_magic("chat", "tools")
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("  read_file (built-in): ")
    assert out[2] == "  shout: Upper-case a text."
    assert "  shout: Upper-case a text." not in out[3:]
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
    assert session.status().prompt_tokens > 0 and chat.workspace.cells["default"] == 2


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
