"""Transcript files: where they go, their modes, append-only JSONL, snapshots, resume data."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ipy_ctxrecovery.core.history import Message, ToolCall
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.session.store import (
    Transcript,
    data_root,
    list_sessions,
    session_dir,
    validate_name,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_data_root_follows_conventions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(tmp_path / "explicit"))
    assert data_root() == tmp_path / "explicit"
    monkeypatch.delenv("IPY_CTXRECOVERY_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "ipy_ctxrecovery"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == tmp_path / "home" / ".local" / "state" / "ipy_ctxrecovery"


def test_conftest_points_the_root_at_a_tmp_dir(data_dir: Path) -> None:
    assert data_root() == data_dir
    assert session_dir("s1") == data_dir / "sessions" / "s1"


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x" * 101, "sp ace", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="session name"):
        validate_name(name)


def test_files_and_dirs_are_private(data_dir: Path) -> None:
    old = os.umask(0o022)
    try:
        t = Transcript("private")
        t.append(Message.user("hi"))
        t.save_history((Message.user("hi"),))
        t.save_meta({"model": "emulator"})
    finally:
        os.umask(old)
    for d in (data_dir, data_dir / "sessions", t.directory, t.results_dir):
        assert mode(d) == 0o700, d
    for f in (t.path, t.history_path, t.meta_path):
        assert mode(f) == 0o600, f
    assert not [p for p in t.directory.iterdir() if p.name.endswith(".tmp")]


def test_append_only_jsonl_round_trip() -> None:
    t = Transcript("log")
    messages = [
        Message.system("be brief"),
        Message.user("héllo ✓"),
        Message.assistant("calling", [ToolCall("c1", "read_file", '{"path": "a"}')]),
        Message.tool("c1", "x" * 10_000, name="read_file"),
        Message.assistant("done"),
    ]
    for m in messages[:3]:
        t.append(m)
    prefix = t.path.read_bytes()
    t.mark("reset")
    for m in messages[3:]:
        t.append(m)
    assert t.path.read_bytes().startswith(prefix)  # earlier lines untouched
    assert t.messages() == tuple(messages)
    records = list(t.records())
    assert [r["type"] for r in records] == ["message"] * 3 + ["reset"] + ["message"] * 2
    assert all(isinstance(r["ts"], float) for r in records)
    # A later writer on the same name (once this one let go) appends; it never truncates.
    t.release()
    again = Transcript("log")
    again.append(Message.user("more"))
    assert len(Transcript("log").messages()) == len(messages) + 1


def test_torn_last_line_is_skipped() -> None:
    t = Transcript("torn")
    t.append(Message.user("kept"))
    with open(t.path, "a", encoding="utf-8") as f:
        f.write('{"type": "message", "ts": 1, "mess')
    with pytest.warns(RuntimeWarning, match=r"transcript.jsonl: line 2 \(cut off mid-write\)"):
        assert [m.text for m in t.messages()] == ["kept"]
    # The next record starts on its own line: the torn one never swallows it.
    t.append(Message.user("after"))
    with pytest.warns(RuntimeWarning, match="line 2"):
        assert [m.text for m in t.messages()] == ["kept", "after"]


def test_history_snapshot_and_meta() -> None:
    t = Transcript("snap")
    assert t.load_history() is None and t.load_meta() == {}
    t.create()
    history = (Message.system("s"), Message.user("u"), Message.assistant("a"))
    t.save_history(history)
    assert t.load_history() == history
    t.save_history(history[:1])
    assert t.load_history() == history[:1]
    t.save_meta({"model": "emulator", "system": None})
    assert t.load_meta() == {"model": "emulator", "system": None}
    assert json.loads(t.history_path.read_text())["version"] == 2


def test_a_corrupt_snapshot_is_rebuilt_from_the_transcript() -> None:
    t = Transcript("broken")
    said = [Message.user("q1"), Message.assistant("a1"), Message.user("q2")]
    for m in said:
        t.append(m)
    t.save_history((Message.user("q2"),))
    t.history_path.write_text('{"version": 1, "messages": [{"role": "us', encoding="utf-8")
    with pytest.warns(RuntimeWarning, match="rebuilt from the session's transcript"):
        rebuilt = t.load_history()
    assert rebuilt == tuple(said)


def test_list_sessions() -> None:
    assert list_sessions() == []
    Transcript("b").create()
    Transcript("a").create()
    Transcript("unused")                    # nothing said: nothing saved
    assert list_sessions() == ["a", "b"]
    assert Transcript.exists("a") and not Transcript.exists("c")


def test_learned_state_file_is_private_atomic_and_optional() -> None:
    t = Transcript("learned-files")
    assert t.load_learned() is None
    t.create()
    t.save_learned('{"version": 1}')
    assert t.load_learned() == '{"version": 1}'
    assert mode(t.learned_path) == 0o600 and t.learned_path.parent == t.directory
    t.learned_path.write_bytes(b"\xff\xfe broken")
    assert "broken" in (t.load_learned() or "")     # undecodable bytes do not raise
    assert [p.name for p in t.directory.iterdir() if p.name.endswith(".tmp")] == []
