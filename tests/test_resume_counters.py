"""Resuming a saved session: its counters (tokens, turns, compactions, recoveries) come
back as ``status`` showed them, an undo of a compaction from before the resume says why
it cannot be done, and the resume line counts what the model will see."""

from __future__ import annotations

import itertools
import json
import warnings
from typing import Any

import pytest
from fakes import FakeProvider, killed
from IPython.core.error import UsageError

from ipy_ctxrecovery import ChatError, ChatSession, Settings
from ipy_ctxrecovery.core import prompts
from ipy_ctxrecovery.errors import CtxRecoveryError
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.notebook.magics import ChatMagics, get_magics
from ipy_ctxrecovery.providers.base import Request, Usage
from ipy_ctxrecovery.session.store import Transcript

COUNTERS = ("prompt_tokens", "completion_tokens", "turns", "compactions", "recoveries",
            "cached_tokens", "cache_write_tokens", "cache_write_1h_tokens")


def counters(session: ChatSession) -> dict[str, int]:
    status = session.status()
    return {field: getattr(status, field) for field in COUNTERS}


def busy_session(emulator: Any, name: str) -> tuple[ChatSession, Any]:
    """A session on an emulator rejecting bodies over 16 KB: one 413 recovered (a learned
    cap), compactions to stay under it, a manual one, and turns after them (9 in all)."""
    emu = emulator(max_body="16KB")
    # recall off: the counts below are tuned to the bytes of each request, and the recall
    # tool (offered after the first compaction) adds some 700 to every later one.
    s = ChatSession("emulator", emulator=emu, settings=Settings(recall_max_chars=0), name=name)
    for i in range(5):
        s.send(f"part {i}: " + "x" * 5000)
    assert s.status().recoveries == 1 and s.caps.source == "learned"
    assert s.status().compactions == 1
    add_items(s, 3)
    assert s.compact("keep the item numbers").applied
    s.send("after the compaction")
    return s, emu


def add_items(s: ChatSession, n: int) -> None:
    for i in range(n):
        s.send(f"item {i}: " + "lorem ipsum dolor " * 60)


def test_resume_after_a_kill_restores_the_counters_status_shows(emulator: Any) -> None:
    s, emu = busy_session(emulator, "counted")
    before = counters(s)
    assert before["turns"] == 9 and before["compactions"] == 2 and before["recoveries"] == 1
    assert before["prompt_tokens"] > 0 and before["completion_tokens"] > 0
    # No close(): what a killed kernel left on disk (snapshot + journal lines).
    killed(s)
    resumed = ChatSession.resume("counted", emulator=emu, settings=Settings())
    assert counters(resumed) == before
    assert "compactions: {compactions} · recoveries: {recoveries}".format(**before) \
        in str(resumed.status())
    # They go on counting from there, and a clean close keeps them too.
    resumed.send("after the resume")
    assert counters(resumed)["turns"] == 10
    assert counters(resumed)["prompt_tokens"] > before["prompt_tokens"]
    later = counters(resumed)
    resumed.close()
    again = ChatSession.resume("counted", emulator=emu, settings=Settings())
    assert counters(again) == later
    again.close()


def test_a_turn_writes_its_counters_in_its_journal_line_and_no_other_file(
        emulator: Any) -> None:
    s, _ = busy_session(emulator, "flat")
    directory = s.directory
    # learned.json follows its own rule (written when what was learned changed).
    others = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()
              if p.name not in ("transcript.jsonl", "history.journal", "learned.json")}
    assert {"session.json", "history.json"} <= set(others)
    lines_before = len((directory / "history.journal").read_text().splitlines())
    s.send("one more turn")
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()
            if p.name in others} == others
    lines = (directory / "history.journal").read_text().splitlines()
    assert len(lines) == lines_before + 1
    saved = json.loads(lines[-1])["counters"]
    assert {k: v for k, v in saved.items() if k in COUNTERS} == counters(s)
    # The usage by model rides with them (the cost prices each model's tokens at its own).
    assert {k: v for k, v in saved.items() if k not in COUNTERS} == {
        f"by_model:emulator|{field}": counters(s)[field] for field in (
            "prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens",
            "cache_write_1h_tokens")}


def test_a_failed_turn_and_an_unrecorded_one_keep_their_counts_across_a_resume() -> None:
    broke = ChatError(Failure(FailureKind.OTHER, "the server broke"), "the server broke")
    s = ChatSession(provider=FakeProvider(["first", broke], window=10_000_000),
                    name="failing", settings=Settings(), sleep=lambda _: None)
    s.send("hello")
    with pytest.raises(ChatError):
        s.send("this one fails")
    s.send("not kept", record=False)
    before = counters(s)
    assert before["turns"] == 2 and before["prompt_tokens"] > 0
    killed(s)
    resumed = ChatSession.resume("failing", provider=FakeProvider(window=10_000_000))
    assert counters(resumed) == before
    resumed.close()


def test_a_kill_mid_journal_line_loses_the_counts_of_that_turn_only() -> None:
    s = ChatSession(provider=FakeProvider(window=10_000_000), name="torn",
                    settings=Settings(), sleep=lambda _: None)
    for i in range(3):
        s.send(f"q{i}")
    before = (s.history, counters(s))
    s.send("the last turn")
    after = (s.history, counters(s))
    journal = s.directory / "history.journal"
    full = journal.read_bytes()
    start = full.rstrip(b"\n").rfind(b"\n") + 1
    killed(s)
    for cut in [*range(start, len(full), 7), len(full)]:
        journal.write_bytes(full[:cut])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed = ChatSession.resume("torn", provider=FakeProvider(window=10_000_000))
        killed(resumed)
        assert (resumed.history, counters(resumed)) in (before, after), cut
    assert (resumed.history, counters(resumed)) == after


def test_undo_after_a_resume_says_the_compaction_came_before_it(emulator: Any) -> None:
    s, emu = busy_session(emulator, "undo")
    s.close()
    resumed = ChatSession.resume("undo", emulator=emu, settings=Settings())
    with pytest.raises(CtxRecoveryError, match="session undo's 2 compactions happened before "
                                               "it was resumed and cannot be undone"):
        resumed.undo_compact()
    # A compaction made after the resume is undone as ever.
    add_items(resumed, 3)
    history = resumed.history
    assert resumed.compact().applied
    resumed.undo_compact()
    assert resumed.history == history
    with pytest.raises(CtxRecoveryError, match="happened before it was resumed"):
        resumed.undo_compact()
    resumed.reset()
    with pytest.raises(CtxRecoveryError, match="there is no compaction to undo"):
        resumed.undo_compact()
    resumed.close()


# -- every request the session paid for is counted ---------------------------------------

WIRES = ("emulator", "emulator:anthropic")


def paid_usage(s: ChatSession, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Usage]]:
    """Every answer the session's provider got, as (kind, usage): "summary" for a
    compaction's summary request, "turn" for the others — what the session paid for."""
    paid: list[tuple[str, Usage]] = []
    send = s.provider.send

    def spy(request: Request, on_text: Any = None) -> Any:
        response = send(request, on_text)
        summary = request.messages[0].text == prompts.SUMMARIZE_SYSTEM_PROMPT
        paid.append(("summary" if summary else "turn", response.usage))
        return response

    monkeypatch.setattr(s.provider, "send", spy)
    return paid


def totals(paid: list[tuple[str, Usage]]) -> tuple[int, int]:
    return (sum(u.prompt_tokens or 0 for _, u in paid),
            sum(u.completion_tokens or 0 for _, u in paid))


@pytest.mark.parametrize("model", WIRES)
def test_a_manual_compactions_summary_tokens_are_counted_and_saved(
        emulator: Any, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    emu = emulator()
    s = ChatSession(model, emulator=emu, settings=Settings(), name="paid")
    paid = paid_usage(s, monkeypatch)
    add_items(s, 4)
    before = counters(s)
    assert (before["prompt_tokens"], before["completion_tokens"]) == totals(paid)
    assert s.compact().applied
    kind, summary = paid[-1]
    assert kind == "summary" and summary.prompt_tokens and summary.completion_tokens
    after = counters(s)
    assert (after["prompt_tokens"], after["completion_tokens"]) == totals(paid)
    assert after["prompt_tokens"] == before["prompt_tokens"] + summary.prompt_tokens
    # Saved with the compacted history: a kill right after keeps them.
    killed(s)
    resumed = ChatSession.resume("paid", emulator=emu, settings=Settings())
    assert counters(resumed) == after
    resumed.close()


@pytest.mark.parametrize("model", WIRES)
def test_a_compaction_during_a_turn_counts_its_summary_tokens_in_the_turn_and_session(
        emulator: Any, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    # The summary is asked for in the turn (not prepared ahead: tests/test_background.py).
    s = ChatSession(model, emulator=emulator(context_window=4096),   # the package's own
                    settings=Settings(background_compaction=False, server_compaction="off"),
                    name="auto")
    paid = paid_usage(s, monkeypatch)
    for i in range(12):
        start = len(paid)
        reply = s.send(f"item {i}: " + "lorem ipsum dolor " * 60)
        if any(kind == "summary" for kind, _ in paid[start:]):
            break
    else:
        pytest.fail("no turn compacted its history with a summary")
    assert s.status().compactions >= 1
    # The turn's usage is every request it made, the summary's included.
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == totals(paid[start:])
    status = s.status()
    assert (status.prompt_tokens, status.completion_tokens) == totals(paid)


# -- the magics: a kernel restart ------------------------------------------------------------

@pytest.fixture
def ip(loaded_shell: Any) -> Any:
    return loaded_shell


def cell(ip: Any, line: str, body: str) -> None:
    assert ip.run_cell(f"%%chat {line}\n{body}\n", store_history=True).success


def restart(ip: Any) -> ChatMagics:
    """What a kernel restart leaves: the extension loaded afresh, nothing open, the
    sessions' files as the last turn left them (no close)."""
    old = get_magics(ip)
    assert old is not None
    for session in old.workspace.sessions.values():
        session._files.release()            # a dead kernel's lock is gone with it
    old.workspace.sessions.clear()
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    magics = get_magics(ip)
    assert magics is not None and not magics.workspace.sessions
    return magics


def test_after_a_restart_the_resume_line_counts_what_the_model_gets_and_status_the_totals(
        ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "emulator --max-body 16KB")
    ip.run_line_magic("chat", "config recall_max_chars=0")     # as busy_session
    for i in range(5):
        cell(ip, "-S nb", f"part {i}: " + "x" * 5000)
    for i in range(3):
        cell(ip, "-S nb", f"item {i}: " + "lorem ipsum dolor " * 60)
    ip.run_line_magic("chat", "compact -S nb")
    cell(ip, "-S nb", "after the compaction")
    session = get_magics(ip).workspace.sessions["nb"]  # type: ignore[union-attr]
    assert session.status().recoveries == 1 and session.status().compactions == 2
    working, said = len(session.history), len(session.transcript)
    assert working < said
    capsys.readouterr()
    ip.run_line_magic("chat", "status -S nb")
    ip.run_line_magic("chat", "usage -S nb")
    shown = capsys.readouterr().out.splitlines()
    totals = [line for line in shown if line.startswith(("compactions:", "session nb: "))]
    assert any(" over 9 cells" in line for line in totals), shown

    magics = restart(ip)
    capsys.readouterr()
    cell(ip, "-S nb", "after the restart")
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("ℹ continuing saved session nb: "))
    assert line.startswith(f"ℹ continuing saved session nb: {working} messages in the "
                           f"working history ({said} in the transcript), last used ")
    # What the model got is that working history and the new message (the wire joins
    # messages of one role in a row), not the transcript.
    sent = magics.workspace.emulator.requests[-1].body["messages"]  # type: ignore[union-attr]
    resumed = magics.workspace.sessions["nb"]
    roles = [m.role for m in resumed.history[:working]] + ["user"]
    assert len(sent) == 1 + sum(a != b for a, b in itertools.pairwise(roles))
    wire = "\n".join(m["content"] if isinstance(m["content"], str)
                     else "\n".join(part["text"] for part in m["content"]) for m in sent)
    assert all(m.text[:200] in wire for m in resumed.history[:working])
    assert "part 0: " not in wire and "part 0: " in resumed.transcript[0].text
    capsys.readouterr()
    ip.run_line_magic("chat", "status -S nb")
    ip.run_line_magic("chat", "usage -S nb")
    after = capsys.readouterr().out.splitlines()
    assert [x for x in after if x.startswith("compactions:")] == \
        [x for x in totals if x.startswith("compactions:")]
    assert any(" over 10 cells" in x for x in after), after
    assert "0 prompt" not in "\n".join(after)
    with pytest.raises(UsageError, match="happened before it was resumed"):
        ip.run_line_magic("chat", "undo-compact -S nb")


def test_after_a_reset_and_a_restart_the_line_says_the_working_history_is_empty(
        ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "-S beta", "one")
    cell(ip, "-S beta", "two")
    ip.run_line_magic("chat", "reset -S beta")
    magics = restart(ip)
    capsys.readouterr()
    cell(ip, "-S beta", "three")
    out = capsys.readouterr().out
    assert "ℹ continuing saved session beta: 0 messages in the working history (4 in the " \
           "transcript)" in out
    assert len(magics.workspace.emulator.requests[-1].body["messages"]) == 1  # type: ignore[union-attr]
    ip.run_line_magic("chat", "resume beta")
    out = capsys.readouterr().out
    assert out.startswith("resumed beta: 2 messages in the working history (6 in the "
                          "transcript) on emulator")
    assert Transcript("beta").exists("beta")
