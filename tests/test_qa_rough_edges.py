"""Rough edges a first-time user hits in terminal IPython: each gets one sentence that says
what to type instead, and the conversation is left as it was."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError


@pytest.fixture
def ip(loaded_shell: Any) -> Any:
    loaded_shell.run_cell("%%chat\n" + "a long message " * 40 + "\n", store_history=True)
    return loaded_shell


@pytest.mark.parametrize("width", ["0", "-5"])
def test_history_width_must_be_positive(ip: Any, width: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # A width of 0 or below used to print every message whole (a wall of text).
    capsys.readouterr()
    result = ip.run_cell(f"%chat history --width {width}", store_history=True)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    sentence = str(result.error_in_exec)
    assert "--width" in sentence and "positive" in sentence and "\n" not in sentence
    assert "a long message a long message" not in capsys.readouterr().out


def test_a_flag_before_the_subcommand_says_where_it_goes(ip: Any) -> None:
    result = ip.run_cell("%chat -S default status", store_history=True)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    sentence = str(result.error_in_exec)
    assert "%chat status -S default" in sentence, sentence
    assert "unknown subcommand" not in sentence and "\n" not in sentence


def test_explore_names_the_session_as_the_user_does(ip: Any) -> None:
    # The kernel's default session is stored under a generated name; what the user typed
    # (nothing, or -S NAME) is what %chat status and %chat explore must call it.
    widget = ip.run_line_magic("chat", "explore")
    assert widget.text().startswith("explore session default: "), widget.text()[:80]
    assert "<code>default</code>" in widget.title.value


def test_the_readme_lists_every_subcommand() -> None:
    import re
    from pathlib import Path

    from ipy_ctxrecovery.notebook.subcommands import SUBCOMMANDS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    listed = readme.split("`%chat help` lists the subcommands:", 1)[1].split("A failure", 1)[0]
    named = {m.split()[0] for m in re.findall(r"`([^`]+)`", listed)}
    assert set(SUBCOMMANDS) - {"help"} <= named, set(SUBCOMMANDS) - {"help"} - named


def test_an_emulator_restart_says_which_earlier_limits_are_gone(
        ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "emulator --latency 0.01 --max-body 64KB")
    capsys.readouterr()
    ip.run_line_magic("chat", "emulator --max-body 16KB")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "emulator restarted: rejects requests over 16 KB (HTTP 413)"
    assert out[1] == ("  no longer: 0.01 s delay per answer (give every limit you want on "
                      "one line)")
    ip.run_line_magic("chat", "emulator --max-body 8KB")
    assert "no longer" not in capsys.readouterr().out     # nothing else was dropped
