"""``%chat SUBCOMMAND`` (``notebook/subcommands.py``) in a real IPython shell: the emulator's
quirk flags, taken from their one declaration (``emulator/quirks.py``); ``--help`` on each."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ipy_ctxrecovery.core.wording import compact_result
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


def test_compact_says_when_it_changes_nothing_or_misses_its_target(
        loaded_shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip = loaded_shell
    ip.run_cell_magic("chat", "", "one [[words 3]];")
    capsys.readouterr()
    ip.run_line_magic("chat", "compact")
    assert capsys.readouterr().out == (
        "nothing to compact: 2 messages, all kept (the latest request, what came after it, "
        "and pinned ones); the next %%chat makes them older and summarizable; %chat reset "
        "starts afresh\n")
    ip.run_line_magic("chat", "reset")
    for i in range(2):
        ip.run_cell_magic("chat", "", f"message {i} " + "lorem ipsum dolor " * 400 + ";")
    capsys.readouterr()
    ip.run_line_magic("chat", "compact")
    out = capsys.readouterr().out.splitlines()
    # What the summary was billed, against what it saves each later request, after the
    # result (in tokens: the emulator bills nothing, so no money is said).
    assert re.fullmatch(r"  each later request ≈ [\d,]+ input tokens smaller", out.pop()), out
    assert re.fullmatch(r"  summary request [\d,]+ \+ [\d,]+ tokens", out.pop()), out
    # The latest request (7 KB) is kept whole, so a half-size target cannot be reached.
    assert re.fullmatch(
        r"✓ compacted: 4 → 3 messages, 15\.\d KB → [\d.]+ KB, still over the 7\.\d KB target: "
        r"the latest request and what came after it \(2 messages\) are kept whole, beside "
        r"the summary; the next %%chat makes them older and summarizable; %chat reset starts "
        r"afresh \(%chat undo-compact restores\)", out[-1]), out[-1]
    # Compacting again: the summary is all there is to summarize; the emulator's summary of
    # it keeps fewer lines each time (the fact list too), until one is empty: then the
    # history is unchanged, and the line says why and what to do.
    said = []
    for _ in range(4):
        ip.run_line_magic("chat", "compact")
        lines = capsys.readouterr().out.splitlines()
        said.append(next(ln for ln in reversed(lines) if not ln.startswith("  ")))
        if said[-1].startswith("history unchanged"):
            break
    assert all(line.startswith("✓ compacted: 1 message summarized into one, 3 → 3 messages")
               for line in said[:-1]), said
    assert re.fullmatch(
        r"history unchanged: the summary is empty — still 3 messages, [\d.]+ KB \(target "
        r"[\d.]+ KB\); %chat compact INSTRUCTIONS asks for another summary, %chat reset "
        r"starts afresh \(the transcript keeps every message\)", said[-1]), said


def test_a_compaction_keeping_the_count_says_what_it_summarized() -> None:
    line = compact_result(applied=True, before_messages=4, after_messages=4,
                          before_bytes=20 * 1024, after_bytes=6 * 1024, summarized=1,
                          target_bytes=10 * 1024, kept=2, pinned=0, reason=None)
    assert line == ("✓ compacted: 1 message summarized into one, 4 → 4 messages, "
                    "20 KB → 6 KB (%chat undo-compact restores)")
    line = compact_result(applied=True, before_messages=9, after_messages=5,
                          before_bytes=60 * 1024, after_bytes=41 * 1024, summarized=5,
                          target_bytes=32 * 1024, kept=3, pinned=1, reason=None)
    assert line.startswith("✓ compacted: 9 → 5 messages, 60 KB → 41 KB, still over the "
                           "32 KB target: the latest request and what came after it "
                           "(3 messages and 1 pinned) are kept whole")
    # A summary a few bytes over its target reached it: no warning for rounding.
    near = compact_result(applied=True, before_messages=8, after_messages=3,
                          before_bytes=5734, after_bytes=2900, summarized=6,
                          target_bytes=2867, kept=2, pinned=0, reason=None)
    assert near == "✓ compacted: 8 → 3 messages, 5.6 KB → 2.8 KB (%chat undo-compact restores)"


def test_compact_offers_cancel_in_its_own_output_while_the_summary_runs(
        loaded_shell: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    from ipy_ctxrecovery.core import events as ev
    from ipy_ctxrecovery.notebook.cell_cancel import CancelWidget

    ip = loaded_shell
    magics = get_magics(ip)
    assert magics is not None
    magics.live_display = "always"          # a front end's display areas
    for i in range(3):
        ip.run_cell_magic("chat", "", f"message {i} " + "lorem ipsum dolor " * 200 + ";")
    shown: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, **kwargs: shown.append((obj, kwargs)))
    during: list[int] = []
    session = magics.workspace.session()
    unsubscribe = session.subscribe(lambda e: during.append(len(shown))
                                    if isinstance(e, ev.CompactionPhase) else None)
    try:
        ip.run_line_magic("chat", "compact")
    finally:
        unsubscribe()
    assert "✓ compacted: 6 → 3 messages" in capsys.readouterr().out
    (widget, first), (line, second) = shown
    assert isinstance(widget, CancelWidget) and "update" not in first
    assert second["display_id"] == first["display_id"] and second["update"]
    assert line["text/plain"].startswith("summary of older messages: done in ")
    # (this subscriber hears each phase before the Cancel does) shown from the summary on,
    # until the compaction was applied
    assert during == [0, 0, 0, 1]
    magics.live_display = "auto"


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
