"""``%chat SUBCOMMAND`` (``notebook/subcommands.py``) in a real IPython shell: the emulator's
quirk flags, taken from their one declaration (``emulator/quirks.py``); ``--help`` on each."""

from __future__ import annotations

from typing import Any

import pytest

from ipy_ctxrecovery.emulator import quirks
from ipy_ctxrecovery.notebook.magics import get_magics
from ipy_ctxrecovery.notebook.subcommands import SUBCOMMANDS


def test_chat_emulator_plays_the_quirks_of_llama_cpp_pythons_server(
        loaded_shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip = loaded_shell
    magics = get_magics(ip)
    assert magics is not None
    capsys.readouterr()
    ip.run_line_magic("chat", "emulator --context-window 4000 --string-content-only "
                              "--empty-stream-on-error --no-stream-usage")
    assert capsys.readouterr().out == (
        "emulator restarted: context window 4,000 tokens; HTTP 500 for content sent as a list "
        "of parts; an empty HTTP 200 stream when it refuses a streamed request; no usage in "
        "streamed replies\n")
    emu = magics.workspace.emulator
    assert (emu.string_content_only, emu.empty_stream_on_error, emu.stream_usage) == (
        True, True, False)
    # The package sends text as strings: a chat on it is answered.
    result = ip.run_cell("%%chat\n[[words 4]]\n", store_history=True)
    assert result.success, result.error_in_exec
    assert [r.status for r in emu.requests if r.method == "POST"] == [200]
    ip.run_line_magic("chat", "emulator")
    assert "no usage in streamed replies" in capsys.readouterr().out
    ip.run_line_magic("chat", "emulator --max-body 32KB")
    out = capsys.readouterr().out
    assert "no longer:" in out and "HTTP 500 for content sent as a list of parts" in out
    assert not magics.workspace.emulator.string_content_only


def test_chat_emulator_help_names_each_quirk_flag(loaded_shell: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    loaded_shell.run_line_magic("chat", "help emulator")
    shown = capsys.readouterr().out
    assert all(q.flag in shown for q in quirks.QUIRKS)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_subcommand_answers_help_and_changes_nothing(
        loaded_shell: Any, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    chat = get_magics(loaded_shell)
    assert chat is not None
    capsys.readouterr()
    before = (chat.workspace.current, dict(chat.workspace.sessions))
    for name in SUBCOMMANDS:
        loaded_shell.run_line_magic("chat", f"{name} {flag}")
        out = capsys.readouterr().out
        assert out.startswith(f"usage: %chat {name}"), (name, out[:200])
        assert "unrecognized" not in out
    assert (chat.workspace.current, dict(chat.workspace.sessions)) == before


def test_resume_takes_the_name_chat_sessions_shows_and_a_refusal_keeps_the_conversation(
        loaded_shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery.notebook import get_magics

    ws = get_magics().workspace
    for text in ("first", "second"):
        loaded_shell.run_cell_magic("chat", "", text)
    session = ws.session()
    before = session.history
    capsys.readouterr()
    loaded_shell.run_line_magic("chat", "sessions")
    assert f"default ({session.name})" in capsys.readouterr().out
    # What a user types: the name the listing shows. The conversation is reopened whole.
    loaded_shell.run_line_magic("chat", "resume default")
    assert "resumed default: 4 messages" in capsys.readouterr().out
    assert ws.session().history == before
    # A refused resume changes nothing: the session in use carries on, same object.
    kept = ws.session()
    result = loaded_shell.run_cell("%chat resume no-such-session")
    assert "no saved session named 'no-such-session'" in str(result.error_in_exec)
    assert ws.session() is kept and kept.history == before and ws.current == "default"
    loaded_shell.run_cell_magic("chat", "", "third")
    assert len(ws.session().history) == len(before) + 2
