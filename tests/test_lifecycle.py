"""Sessions you can trust (issue 13): one conversation, one transcript, one writer.

Where a case is about kernels it runs in real ones (ipykernel via jupyter_client): a
restart is a new kernel on the same state directory, two writers are two live kernels.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from test_magics import cell, chat, ip  # noqa: F401  (fixtures)

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.events import CompactionPhase, Event, LadderStep
from ipy_ctxrecovery.errors import ConfigError, SessionInUse
from ipy_ctxrecovery.notebook.magics import ChatMagics
from ipy_ctxrecovery.session.store import (
    Transcript,
    held_elsewhere,
    list_sessions,
    saved_sessions,
)

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

TIMEOUT = 60


@pytest.fixture
def kernels(data_dir: Any) -> Iterator[Callable[[], Any]]:
    """Start kernels of this environment on the test's state directory (IPY_CTXRECOVERY_DIR)."""
    from jupyter_client.manager import start_new_kernel

    started: list[tuple[Any, Any]] = []

    def start() -> Any:
        manager, client = start_new_kernel(kernel_name="python3", startup_timeout=TIMEOUT)
        started.append((manager, client))
        run(client, "%load_ext ipy_ctxrecovery\n%config ChatMagics.default_model = 'emulator'")
        return client

    yield start
    for manager, client in started:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run(client: Any, code: str) -> tuple[dict[str, Any], str]:
    """Execute ``code``; return the reply and everything printed (stdout and stderr)."""
    printed: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append(msg["content"]["evalue"])

    reply = client.execute_interactive(code, timeout=TIMEOUT, output_hook=hook,
                                       allow_stdin=False)
    return reply["content"], "".join(printed)


def said(name: str) -> list[str]:
    return [m.text for m in Transcript(name).messages()]


# -- 1. a saved name continues its conversation in a new kernel ------------------------------

def test_a_saved_name_continues_in_a_new_kernel_and_new_keeps_the_old_one(
        kernels: Callable[[], Any]) -> None:
    first = kernels()
    reply, _ = run(first, "%%chat -S foo\nremember the code word: heron")
    assert reply["status"] == "ok"
    first.shutdown()
    # A shutdown request is answered before the process is gone (ipykernel 7 exits a
    # little later): the new kernel comes after the old one, as after a restart.
    deadline = time.monotonic() + TIMEOUT
    while held_elsewhere("foo") is not None and time.monotonic() < deadline:
        time.sleep(0.1)

    second = kernels()
    reply, out = run(second, "%%chat -S foo\nwhat was the code word?")
    assert reply["status"] == "ok"
    assert "ℹ continuing saved session foo: 2 messages, last used" in out
    # The model saw the earlier exchange, and the transcript is one conversation.
    reply, out = run(second, "from ipy_ctxrecovery.notebook import get_magics\n"
                             "emu = get_magics().workspace.emulator\n"
                             "print(len(emu.requests[-1].body['messages']))")
    assert out.strip() == "3"
    texts = said("foo")
    assert len(texts) == 4 and texts[0] == "remember the code word: heron"
    assert texts[1].startswith('Emulator reply: you said "remember the code word: heron"')
    assert texts[2] == "what was the code word?"

    reply, out = run(second, "%%chat -S foo --new\na fresh start")
    assert reply["status"] == "ok"
    kept = [n for n in list_sessions() if n.startswith("foo.")]
    assert len(kept) == 1 and f"the earlier one is kept as {kept[0]}" in out
    assert said("foo")[0] == "a fresh start" and len(said("foo")) == 2
    assert said(kept[0])[0] == "remember the code word: heron" and len(said(kept[0])) == 4


# -- 2. one writer per session --------------------------------------------------------------

def test_a_second_kernel_on_the_same_session_is_told_who_holds_it(
        kernels: Callable[[], Any]) -> None:
    one, two = kernels(), kernels()
    reply, _ = run(one, "%%chat -S shared\nfirst kernel")
    assert reply["status"] == "ok"
    reply, out = run(two, "%%chat -S shared\nsecond kernel")
    assert reply["status"] == "error" and reply["ename"] == "UsageError"
    assert "session 'shared' is open in another process (pid " in out
    assert out.count("\n") <= 1 and "Traceback" not in out
    assert said("shared") == ["first kernel", said("shared")[1]]      # never interleaved
    # The way out it names works (``--new`` would not: the files are in use).
    assert "--new" not in out and "(%%chat -S shared-2)" in out
    reply, out = run(two, "%%chat -S shared-2\nsecond kernel, own session")
    assert reply["status"] == "ok"
    run(two, "%chat sessions")
    reply, out = run(two, "%chat sessions")
    row = next(line for line in out.splitlines() if " shared " in f" {line} ")
    assert row.startswith("!")                                 # open in another process
    one.shutdown()                    # its lock dies with it
    deadline = time.monotonic() + 30
    while held_elsewhere("shared") and time.monotonic() < deadline:
        time.sleep(0.2)
    reply, out = run(two, "%%chat -S shared\nnow it is mine")
    assert reply["status"] == "ok" and "continuing saved session shared" in out


def test_a_session_object_in_another_process_is_refused_in_python(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import time, sys\n"
            "from ipy_ctxrecovery import ChatSession\n"
            "s = ChatSession('emulator', name='held')\n"
            "s.send('hello')\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(SessionInUse, match=r"'held' is open in another process \(pid "
                                               rf"{holder.pid} on "):
            ChatSession("emulator", name="held")
    finally:
        holder.communicate("\n", timeout=30)
    ChatSession.resume("held").close()                       # free once the holder ended


def test_a_second_open_in_this_process_is_refused_and_frees_nothing() -> None:
    import subprocess
    import sys

    probe = ("from ipy_ctxrecovery import ChatSession\n"
             "from ipy_ctxrecovery.errors import SessionInUse\n"
             "try:\n"
             "    ChatSession('emulator', name='twice').close()\n"
             "    print('opened')\n"
             "except SessionInUse as e:\n"
             "    print(e)\n")

    def from_another_process() -> str:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, env=os.environ.copy())
        return done.stdout.strip()

    first = ChatSession("emulator", name="twice")
    first.send("hello")
    with pytest.raises(SessionInUse) as refused:
        ChatSession("emulator", name="twice")
    sentence = str(refused.value)
    assert sentence.startswith("session 'twice' is open in this process already (another "
                               "ChatSession, since ")
    assert sentence.endswith("; close it there, or start a conversation of your own under "
                             "another name (%%chat -S twice-2).") and "\n" not in sentence
    with pytest.raises(SessionInUse):
        ChatSession.resume("twice")
    Transcript("twice").release()           # another handle letting go frees nothing
    assert from_another_process().startswith("session 'twice' is open in another process")
    first.send("still the one writer")
    first.close()
    assert from_another_process() == "opened"
    assert [m.text for m in Transcript("twice").messages() if m.role == "user"] == [
        "hello", "still the one writer"]                    # each written once, in order


# -- 3. the current session -------------------------------------------------------------------

def test_subcommands_follow_the_current_session(chat: ChatMagics, ip: Any,  # noqa: F811
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "-S proj", "about the project")
    capsys.readouterr()
    ip.run_line_magic("chat", "status")
    assert capsys.readouterr().out.startswith("session proj · model emulator")
    ip.run_line_magic("chat", "history")
    assert "working history of session proj: 2 messages" in capsys.readouterr().out
    ip.run_line_magic("chat", f"export {tmp_path / 'proj.json'}")
    assert "exported 2 messages" in capsys.readouterr().out
    data = json.loads((tmp_path / "proj.json").read_text())
    assert data["session"] == "proj" and data["messages"][0]["blocks"][0]["text"] == \
        "about the project"
    cell(ip, "", "back to the default")
    capsys.readouterr()
    ip.run_line_magic("chat", "status")
    assert capsys.readouterr().out.startswith("session default · model emulator")


def test_continue_reopens_the_latest_saved_session(chat: ChatMagics, ip: Any,  # noqa: F811
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "-S older", "an older conversation")
    cell(ip, "-S latest", "the latest conversation")
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    delattr(ip, "_ipy_ctxrecovery_reopen")               # a kernel restart, in effect
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    capsys.readouterr()
    assert cell(ip, "-c", "and now?").success
    out = capsys.readouterr().out
    assert "continuing saved session latest: 2 messages" in out
    from ipy_ctxrecovery.notebook import get_magics

    ws = get_magics(ip).workspace  # type: ignore[union-attr]
    assert ws.current == "latest" and len(ws.sessions["latest"].history) == 4


def test_continue_after_a_restart_brings_the_default_session_back_as_default(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    cell(ip, "", "said in the default session")
    saved = chat.workspace.sessions["default"].name          # generated, on disk
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    delattr(ip, "_ipy_ctxrecovery_reopen")               # a kernel restart, in effect
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    capsys.readouterr()
    ip.run_line_magic("chat", "sessions")                # before -c: said what it was
    assert f" {saved} (a kernel's default) " in capsys.readouterr().out
    assert cell(ip, "-c", "where were we?").success
    out = capsys.readouterr().out
    # Earlier cells said "session default": so does this one, and it names the files too.
    assert f"ℹ continuing saved session default ({saved}): 2 messages, last used" in out
    from ipy_ctxrecovery.notebook import get_magics

    ws = get_magics(ip).workspace  # type: ignore[union-attr]
    assert ws.current == "default" and ws.sessions["default"].name == saved
    assert list(ws.sessions) == ["default"]
    ip.run_line_magic("chat", "status")
    assert capsys.readouterr().out.startswith("session default · model emulator")
    assert ws.panel("default").name == "default"
    # A plain %%chat afterwards carries on the same conversation, not a new one.
    assert cell(ip, "", "and then?").success
    assert ws.sessions["default"].name == saved and len(said(saved)) == 6


def test_continue_keeps_a_default_session_with_its_own_conversation(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    cell(ip, "", "the earlier kernel's default")
    earlier = chat.workspace.sessions["default"].name
    ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    delattr(ip, "_ipy_ctxrecovery_reopen")
    ip.run_line_magic("load_ext", "ipy_ctxrecovery")
    from ipy_ctxrecovery.notebook import get_magics

    ws = get_magics(ip).workspace  # type: ignore[union-attr]
    cell(ip, "", "this kernel's default")
    here = ws.sessions["default"].name
    os.utime(Transcript(earlier).path, (time.time() + 60, time.time() + 60))  # the latest
    capsys.readouterr()
    assert cell(ip, "-c", "which one?").success
    # "default" already holds this kernel's conversation: the earlier one keeps its name.
    assert f"ℹ continuing saved session {earlier}: 2 messages" in capsys.readouterr().out
    assert ws.current == earlier and ws.sessions["default"].name == here


def test_reload_ext_keeps_the_open_sessions(chat: ChatMagics, ip: Any,  # noqa: F811
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "", "the default one")
    cell(ip, "-S work", "a named one")
    default = chat.workspace.sessions["default"].name
    capsys.readouterr()
    ip.run_line_magic("reload_ext", "ipy_ctxrecovery")
    assert "reopened after the reload: default, work" in capsys.readouterr().out
    from ipy_ctxrecovery.notebook import get_magics

    ws = get_magics(ip).workspace  # type: ignore[union-attr]
    assert ws.sessions["default"].name == default and ws.current == "work"
    assert [m.text for m in ws.sessions["work"].history][0] == "a named one"


def test_a_kernel_that_only_looked_saves_nothing(chat: ChatMagics, ip: Any,  # noqa: F811
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("chat", "status")
    ip.run_line_magic("chat", "history")
    chat.workspace.session().close()
    assert list_sessions() == [] and saved_sessions() == []
    capsys.readouterr()
    ip.run_line_magic("chat", "sessions")
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[:3] == ["*", "default", "0"]          # open here, nothing said


def test_sessions_is_a_table_with_what_to_recognise_them_by(
        chat: ChatMagics, ip: Any, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    cell(ip, "-S alpha", "first words of alpha and more")
    cell(ip, "-S beta", "beta begins here")
    capsys.readouterr()
    ip.run_line_magic("chat", "sessions")
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header == ["name", "messages", "size", "last", "used", "first", "words"]
    beta, alpha = lines[1].split(), lines[2].split()
    assert beta[:3] == ["*", "beta", "2"] and lines[1].rstrip().endswith("beta begins here")
    assert alpha[:3] == ["+", "alpha", "2"] and "first words of alpha" in lines[2]
    assert alpha[4] in ("B", "KB")


# -- 4. every shrink undoable, the same for every payload failure -----------------------------

@pytest.mark.parametrize("fault", ["max_body", "waf_over", "drop_over"])
def test_every_payload_failure_summarizes_first_and_undo_restores(
        emulator: Any, fault: str) -> None:
    limit = 600 * 1024 if fault == "drop_over" else 48 * 1024     # a drop needs > 500 KB
    emu = emulator(context_window=10_000_000, **{fault: limit})
    events: list[Event] = []
    with ChatSession("emulator", emulator=emu, on_event=events.append) as s:
        chunk = "numbers of the quarter " * (limit // 23 // 5)
        for i in range(6):
            s.send(f"part {i}: {chunk}")
        rejected = [r for r in emu.requests if r.status != 200]
        assert len(rejected) == 1
        applied = [e for e in events if isinstance(e, CompactionPhase)
                   and e.phase == "applied"]
        assert applied and applied[-1].outcome == "summary"          # summarized, not dropped
        steps = [e for e in events if isinstance(e, LadderStep)]
        assert steps and all(e.summary_not_used is None for e in steps)
        before_undo = s.history
        s.undo_compact()
        assert len(s.history) > len(before_undo)
        assert [m.text for m in s.history][:2] == [f"part 0: {chunk}", s.transcript[1].text]


# -- sizes with sane bounds ------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0.000001", "1e99", "１２MB", "3KB", "2GB"])
def test_a_cap_outside_what_a_proxy_can_have_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings().updated({"CHATCLI_MAX_PAYLOAD": value})
    text = str(caught.value)
    assert "CHATCLI_MAX_PAYLOAD" in text and text.count(".") <= 3 and "\n" not in text


@pytest.mark.parametrize("value", ["100000000000000000000000", "８０００", "12"])
def test_a_window_outside_what_a_model_can_have_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="CHATCLI_CONTEXT_WINDOW"):
        Settings().updated({"CHATCLI_CONTEXT_WINDOW": value})


def test_bounds_apply_through_the_magics_too(chat: ChatMagics, ip: Any) -> None:  # noqa: F811
    with pytest.raises(UsageError, match="outside what a proxy's body limit can be"):
        ip.run_line_magic("chat", "config CHATCLI_MAX_PAYLOAD=0.000001")
    assert chat.settings().max_payload is None


# -- 5. text that cannot be stored; export never destroys a file ------------------------------

def test_a_lone_surrogate_is_refused_and_nothing_differs_from_disk(
        chat: ChatMagics, ip: Any, tmp_path: Path) -> None:  # noqa: F811
    cell(ip, "", "a fine message")
    session = chat.workspace.session()
    before = session.history
    result = ip.run_cell("%%chat\nbroken \ud800 paste", store_history=False)
    assert isinstance(result.error_in_exec, UsageError)
    assert "lone surrogate" in str(result.error_in_exec)
    assert session.history == before
    assert [m.text for m in session.transcript] == [m.text for m in
                                                    Transcript(session.name).messages()]
    target = tmp_path / "kept.md"
    target.write_text("precious notes")
    with pytest.raises(UsageError, match="exists; add --force"):
        ip.run_line_magic("chat", f"export {target}")
    assert target.read_text() == "precious notes"
    ip.run_line_magic("chat", f"export {target} --force")
    assert "a fine message" in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["kept.md"]   # no temporary left over


def test_model_output_with_a_lone_surrogate_is_kept_storable(emulator: Any) -> None:
    from fakes import FakeProvider

    with ChatSession(provider=FakeProvider(["broken \ud83d answer"]), name="surr") as s:
        s.send("hi")
        assert "\ufffd" in s.history[-1].text
        assert [m.text for m in s.transcript] == [m.text for m in Transcript("surr").messages()]


# -- 6. nothing told as applied that was rolled back -------------------------------------------

def test_a_summary_the_caller_refuses_is_told_as_rejected_not_applied() -> None:
    from fakes import FakeProvider

    from ipy_ctxrecovery.core.history import Message
    from ipy_ctxrecovery.core.prompts import summary_header
    from ipy_ctxrecovery.session.sizing import RequestSpec

    summary = summary_header(4) + "\n## Current step\n- reading the logs of note 1 and note 2"
    with ChatSession(provider=FakeProvider([summary] * 4), name="refused") as s:
        history = tuple(m for i in range(4) for m in (
            Message.user(f"question {i} " + "q" * 3000), Message.assistant("a" * 3000)))
        history += (Message.user("the latest request"),)
        phases: list[Event] = []
        s.subscribe(phases.append)
        new, report = s._compactor.run(history, 4_000, RequestSpec(), None,
                                       accept=lambda h, r: "over the 4 KB needed")
        told = [e.phase for e in phases if isinstance(e, CompactionPhase)]
        assert new is history and not report.applied
        assert told[-1] == "rejected" and "applied" not in told
        assert report.rejected_reason == "over the 4 KB needed"
