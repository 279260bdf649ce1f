"""Persistence: the history journal (O(new messages) per turn), crash safety, full and
read-only disks, damaged files. Issue 11 (persistence) and issue 12 items 2 and 3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
from diskfaults import KIND_WORDS, finishes, full_disk, not_a_file, read_only, resume_in_child
from fakes import FakeProvider, killed

from ipy_ctxrecovery import ChatError, ChatSession, Settings
from ipy_ctxrecovery.core.budget import ResultStore
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.session.store import Transcript


def make(name: str, *, window: int = 10_000_000, **kwargs: Any) -> ChatSession:
    provider = kwargs.pop("provider", None) or FakeProvider(window=window, max_output=4096)
    return ChatSession(provider=provider, name=name, sleep=lambda s: None,
                       settings=kwargs.pop("settings", Settings()), **kwargs)


def saving_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "nothing is being saved" in str(w.message)]


# -- the journal ----------------------------------------------------------------------------

def test_turns_append_to_the_journal_and_leave_the_snapshot_alone() -> None:
    s = make("journal", system="Be brief.")
    s.send("the first turn writes the snapshot")
    snapshot = s.directory / "history.json"
    before = (snapshot.stat().st_ino, snapshot.read_bytes())
    for i in range(5):
        s.send(f"question {i}")
    assert (snapshot.stat().st_ino, snapshot.read_bytes()) == before
    lines = (s.directory / "history.journal").read_text().splitlines()
    assert len(lines) == 5
    assert [len(json.loads(line)["add"]) for line in lines] == [2] * 5
    assert Transcript("journal").load_history() == s.history


def test_reset_undo_and_close_rewrite_the_snapshot_and_empty_the_journal() -> None:
    s = make("rewrite")
    for i in range(3):
        s.send(f"q{i}")
    s.reset()
    assert (s.directory / "history.journal").read_bytes() == b""
    assert Transcript("rewrite").load_history() == s.history == ()
    s.send("after reset")
    assert len((s.directory / "history.journal").read_text().splitlines()) == 1
    s.close()
    assert (s.directory / "history.journal").read_bytes() == b""
    data = json.loads((s.directory / "history.json").read_text())
    assert data["version"] == 2 and len(data["messages"]) == 2
    assert Transcript("rewrite").load_history() == s.history


def test_a_journal_line_from_before_the_last_snapshot_is_ignored() -> None:
    """A kill between the snapshot's rename and the journal's reset leaves old lines."""
    s = make("stale")
    for i in range(3):
        s.send(f"q{i}")
    old_journal = (s.directory / "history.journal").read_bytes()
    s.reset()
    (s.directory / "history.journal").write_bytes(old_journal)
    assert Transcript("stale").load_history() == ()


def _bytes_written() -> int:
    """Bytes this process has passed to write(2) so far (the kernel's count)."""
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io")
def test_bytes_written_per_turn_are_at_most_twice_the_new_messages() -> None:
    s = make("bytes")
    for i in range(40):
        before_len, before_bytes = len(s.history), _bytes_written()
        s.send(f"turn {i} " + "lorem ipsum " * 800)     # ~10 KB per user message
        written = _bytes_written() - before_bytes
        new = s.history[before_len:]
        new_bytes = sum(len(json.dumps(m.to_dict(), ensure_ascii=False)) for m in new)
        assert written <= 2 * new_bytes + 2048, (i, written, new_bytes)


def test_a_turn_masks_and_encodes_each_new_message_once() -> None:
    # The transcript line and the journal line carry the same masked bytes: a 1 MB paste
    # is masked and encoded once, not once per file.
    s = make("mask-once")
    s.send("the first turn writes the snapshot")
    masked: list[str] = []
    message = s.redactor.message
    s.redactor.message = lambda m: masked.append(m.text) or message(m)  # type: ignore[method-assign]
    secret = "sk-proj-" + "A1b2C3d4" * 6
    s.send(f"paste {secret} " + "x" * 100_000)
    assert sorted(masked) == sorted(m.text for m in s.history[-2:])
    journal = json.loads((s.directory / "history.journal").read_text().splitlines()[-1])
    records = [json.loads(line) for line in
               (s.directory / "transcript.jsonl").read_text().splitlines()]
    said = [r["message"] for r in records if r["type"] == "message"][-2:]
    assert journal["add"] == said
    assert secret not in json.dumps(said) and "[REDACTED]" in said[0]["blocks"][0]["text"]


def test_cutting_the_journal_at_every_byte_of_its_last_line_loses_at_most_that_turn() -> None:
    s = make("cuts")
    for i in range(3):
        s.send(f"q{i}")
    before = s.history
    s.send("the last turn")
    after = s.history
    journal = s.directory / "history.journal"
    full = journal.read_bytes()
    saved = {p: p.read_bytes() for p in s.directory.iterdir() if p.is_file()}
    start = full.rstrip(b"\n").rfind(b"\n") + 1
    killed(s)
    for cut in range(start, len(full) + 1):
        for path, data in saved.items():
            path.write_bytes(data)
        journal.write_bytes(full[:cut])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed = ChatSession.resume("cuts", provider=FakeProvider(window=10_000_000))
        assert resumed.history in (before, after), cut
        # The next turn saves on top of whatever was restored, and reads back the same.
        resumed.send("next")
        assert Transcript("cuts").load_history() == resumed.history, cut
        killed(resumed)


_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from fakes import FakeProvider, killed
    from ipy_ctxrecovery import ChatSession, Settings, _files

    kill_at = int(sys.argv[1])
    calls = 0
    real = _files.write_all

    def write_all(fd, data):
        global calls
        calls += 1
        if calls == kill_at:
            # Die mid-write: half the bytes reach the file, then the process is gone.
            os.write(fd, bytes(data)[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real(fd, data)

    _files.write_all = write_all
    s = ChatSession(provider=FakeProvider(window=10_000_000), name="killed",
                    settings=Settings())
    for i in range(4):
        s.send(f"turn {{i}} " + "x" * 300)
        print(i, flush=True)
    s.close()
""")


def test_a_process_killed_at_any_write_loses_at_most_the_turn_in_flight(
        tmp_path: Path, data_dir: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
    kills = 0
    for kill_at in range(1, 40):
        for sub in (data_dir / "sessions").glob("*"):
            for f in sorted(sub.rglob("*"), reverse=True):
                f.unlink() if f.is_file() else f.rmdir()
            sub.rmdir()
        done = subprocess.run([sys.executable, str(script), str(kill_at)], env=env,
                              capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            break                                # past the last write: nothing to kill
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        kills += 1
        completed = len(done.stdout.split())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed = ChatSession.resume("killed", provider=FakeProvider(window=10_000_000))
        turns = [m.text.split()[1] for m in resumed.history if m.role == "user"]
        # Turns in order, none missing: the completed ones, perhaps the one in flight.
        assert turns == [str(i) for i in range(len(turns))], (kill_at, turns)
        assert completed <= len(turns) <= completed + 1, (kill_at, completed, turns)
        assert all(m.text for m in resumed.history), kill_at
        resumed.send("after the crash")
        assert Transcript("killed").load_history() == resumed.history
        killed(resumed)
    assert kills >= 10


_IN_FLIGHT = textwrap.dedent("""
    import os, signal, sys, threading, time
    sys.path.insert(0, {tests!r})
    from fakes import FakeProvider, killed
    from ipy_ctxrecovery import ChatSession, Settings

    wait = float(sys.argv[1])
    provider = FakeProvider(window=10_000_000)
    real_send = provider.send

    def send(request, on_text=None):
        if len(provider.requests) == 2:       # the third turn's request is in flight
            time.sleep(wait)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_send(request, on_text)

    provider.send = send
    s = ChatSession(provider=provider, name="flight", settings=Settings())
    for i in range(4):
        s.send(f"turn {{i}} " + "x" * 300)
        print(i, flush=True)
""")


@pytest.mark.parametrize("wait", [0.0, 0.5])
def test_a_kill_while_the_request_is_in_flight_loses_at_most_that_turn(
        tmp_path: Path, data_dir: Path, wait: float) -> None:
    # The user's line is masked and written while the request is in flight: a kill then
    # keeps every completed turn, and the in-flight message at most (always, once the
    # request has waited long enough for its line to be written).
    script = tmp_path / "child.py"
    script.write_text(_IN_FLIGHT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(wait)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1"]
    said = [m.text.split()[:2] for m in Transcript("flight").messages()]
    completed = [["turn", "0"], ["echo:", "turn"], ["turn", "1"], ["echo:", "turn"]]
    assert said in (completed, [*completed, ["turn", "2"]])
    if wait:
        assert said[-1] == ["turn", "2"]
    resumed = ChatSession.resume("flight", provider=FakeProvider(window=10_000_000))
    assert [m.text.split()[:2] for m in resumed.history] == completed
    resumed.send("after the crash")
    assert Transcript("flight").load_history() == resumed.history
    resumed.close()


def test_a_failed_turn_keeps_the_users_message_on_disk() -> None:
    failure = ChatError(Failure(FailureKind.OTHER, "the server broke"), "the server broke")
    s = make("failed", provider=FakeProvider([failure], window=10_000_000))
    with pytest.raises(ChatError):
        s.send("please keep this")
    assert [m.text for m in Transcript("failed").messages()] == ["please keep this"]
    assert s.history == ()
    s.close()


# -- full and read-only disks ------------------------------------------------------------------

def test_a_record_cut_by_a_full_disk_never_swallows_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    t = Transcript("full")
    t.append(Message.user("A"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with full_disk(monkeypatch, t.directory, left=20):
            t.append(Message.user("B" * 100))    # 20 bytes fit, then ENOSPC
            t.append(Message.user("C"))
        t.append(Message.user("D"))              # space again: B and C go first
    assert len(saving_warnings(caught)) == 1
    assert [m.text for m in t.messages()] == ["A", "B" * 100, "C", "D"]


def test_send_on_a_full_disk_answers_warns_once_and_saves_when_space_returns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = make("fullsend", system="sys")
    s.send("one")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with full_disk(monkeypatch, s.directory):
            reply = s.send("two")
            s.send("three")
        assert "two" in reply.text
        assert [m.text for m in s.history if m.role == "user"] == ["one", "two", "three"]
        s.send("four")
    assert len(saving_warnings(caught)) == 1
    killed(s)
    resumed = ChatSession.resume("fullsend", provider=FakeProvider(window=10_000_000))
    assert resumed.history == s.history
    assert [m.text for m in resumed.transcript] == [m.text for m in s.transcript]


def test_resume_works_while_the_disk_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    s = make("fullresume")
    s.send("kept")
    s.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with full_disk(monkeypatch, s.directory):
            resumed = ChatSession.resume("fullresume",
                                         provider=FakeProvider(window=10_000_000))
            resumed.send("more")
    assert resumed.history[0].text == "kept" and len(resumed.history) == 4
    assert len(saving_warnings(caught)) <= 1


def test_a_read_only_state_dir_lets_a_session_chat_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with read_only(monkeypatch, data_dir):
            s = make("readonly", system="sys")
            s.send("hello " + "x" * 30_000)      # a big tool-free turn, then a second one
            s.send("again")
            s.compact()
            s.reset()
            s.close()
    assert len(saving_warnings(caught)) == 1, [str(w.message) for w in caught]
    assert "readonly" in saving_warnings(caught)[0] or str(data_dir) in saving_warnings(caught)[0]


def test_a_tool_result_that_cannot_be_saved_stays_readable_in_memory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with read_only(monkeypatch, tmp_path):
            path = store.persist("full content " * 1000)
    assert store.load(path) == "full content " * 1000
    assert len(saving_warnings(caught)) == 1


def _can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


def test_a_real_small_tmpfs_filling_up_and_remounted_read_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "mnt"
    where.mkdir()
    if not _can_mount_tmpfs(where):
        pytest.skip("needs root and tmpfs mounts")
    try:
        monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(where / "state"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s = make("tmpfs")
            for i in range(12):                 # ~40 KB a turn into 256 KB: it fills up
                s.send(f"turn {i} " + "y" * 20_000)
            assert len(saving_warnings(caught)) == 1
            s.close()       # its writer's lock is an open file: a busy mount stays writable
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
            resumed = ChatSession.resume("tmpfs", provider=FakeProvider(window=10_000_000))
            resumed.send("read-only now")
            fresh = make("fresh-on-ro")
            fresh.send("hello")
        turns = [m.text.split()[1] for m in resumed.history if m.role == "user"
                 and m.text.startswith("turn")]
        assert turns == [str(i) for i in range(len(turns))] and turns
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


# -- damaged files --------------------------------------------------------------------------

def _said(name: str, texts: list[str]) -> Transcript:
    t = Transcript(name)
    for text in texts:
        t.append(Message.user(text))
    return t


@pytest.mark.parametrize("bad, why", [
    (b'{"type": "message", "message": {"role": "user", "blocks": [{"type": "text", '
     b'"text": "\xff"}]}}', "not UTF-8"),
    (b"[1, 2, 3]", "a JSON list, not an object"),
    (b'"just a string"', "a JSON str, not an object"),
    (b'{"type": "message", "message": {"blocks": []}}', "has no role"),
    (b'{"type": "message", "message": {"role": "robot", "blocks": []}}', "'robot' is not known"),
    (b'{"type": "message", "ts": 1, "mess', "not valid JSON"),
])
def test_one_bad_line_is_named_and_the_rest_of_the_session_opens(bad: bytes, why: str) -> None:
    t = _said("badline", ["first"])
    with open(t.path, "ab") as f:
        f.write(bad + b"\n")
    t.append(Message.user("third"))
    t.release()
    with pytest.warns(RuntimeWarning) as caught:
        resumed = ChatSession.resume("badline", provider=FakeProvider())
    text = " ".join(str(w.message) for w in caught)
    assert "transcript.jsonl: line 2" in text and why in text, text
    assert [m.text for m in resumed.transcript] == ["first", "third"]


def test_a_non_utf8_session_json_is_named_and_the_session_opens() -> None:
    s = make("badmeta", system="keep me")
    s.send("hello")
    s.close()
    (s.directory / "session.json").write_bytes(b'{"model": "\xff\xfe"}')
    with pytest.warns(RuntimeWarning, match=r"session.json could not be read \(byte 12"):
        resumed = ChatSession.resume("badmeta", provider=FakeProvider(window=10_000_000))
    assert [m.text for m in resumed.history] == [m.text for m in s.history]


def test_rebuilding_a_damaged_history_never_brings_back_what_was_reset_away() -> None:
    s = make("resetaway", system="sys")
    s.send("before the reset")
    s.reset()
    s.send("after the reset")
    (s.directory / "history.json").write_bytes(b"\x00garbage")
    killed(s)
    with pytest.warns(RuntimeWarning, match="history.json could not be read"):
        resumed = ChatSession.resume("resetaway", provider=FakeProvider())
    texts = [m.text for m in resumed.history]
    assert "before the reset" not in texts
    assert texts[0] == "sys" and "after the reset" in texts


def test_a_damaged_journal_line_in_the_middle_rebuilds_from_the_transcript() -> None:
    s = make("midjournal")
    s.send("the first turn writes the snapshot")
    for i in range(3):
        s.send(f"q{i}")
    journal = s.directory / "history.journal"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + b'{"gen": 1, "ba\n' + lines[2])
    with pytest.warns(RuntimeWarning, match=r"history.journal could not be read \(line 2"):
        history = Transcript("midjournal").load_history()
    assert [m.text for m in history or ()][2::2] == ["q0", "q1", "q2"]


def test_append_record_starts_on_a_new_line_after_a_torn_one(tmp_path: Path) -> None:
    from ipy_ctxrecovery._files import append_record

    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"torn')
    append_record(path, b'{"b": 2}\n')
    assert path.read_bytes() == b'{"a": 1}\n{"torn\n{"b": 2}\n'


# -- learned.json -------------------------------------------------------------------------------

def test_learned_json_is_written_only_on_a_real_change(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[str] = []
    real = Transcript.save_learned

    def counting(self: Transcript, text: str) -> None:
        writes.append(text)
        real(self, text)

    monkeypatch.setattr(Transcript, "save_learned", counting)
    s = make("learned-writes")
    for i in range(30):
        s.send(f"turn {i} " + "words " * (50 + 7 * i))   # usage and body drift every turn
    assert 1 <= len(writes) <= 12, len(writes)
    # A real change (a learned cap) is written at once.
    before = len(writes)
    s.caps.record_rejection(100_000)
    s.send("after a rejection")
    assert len(writes) == before + 1
    assert json.loads(writes[-1])["caps"]["smallest_rejected"] == 100_000


# -- files that are not files, damage repaired or told (issue 26) -------------------------------

def _thirteen(name: str) -> ChatSession:
    """A session of 13 messages (system + 6 turns), left as a killed process leaves it."""
    s = make(name, system="sys")
    for i in range(6):
        s.send(f"q{i}")
    assert len(s.history) == 13
    return killed(s)


def _resumed(name: str, fifo: Path | None = None, **kwargs: Any) -> tuple[ChatSession, list[str]]:
    def run() -> tuple[ChatSession, list[str]]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            session = ChatSession.resume(name, provider=FakeProvider(window=10_000_000),
                                         sleep=lambda s: None, **kwargs)
        return session, [str(w.message) for w in seen]
    return finishes(run, fifo=fifo)


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir"])
@pytest.mark.parametrize("file", ["history.json", "history.journal", "session.json",
                                  "learned.json"])
def test_a_state_file_that_is_not_a_file_is_named_and_the_rest_opens(file: str,
                                                                      kind: str) -> None:
    s = _thirteen(f"nf-{kind}")
    path = s.directory / file
    not_a_file(path, kind)
    if kind == "zero":      # reading it grows memory without bound: in a bounded child
        child = resume_in_child(f"nf-{kind}")
        assert child["error"] is None, child
        said, history = child["warnings"], child["history"]
    else:
        resumed, said = _resumed(f"nf-{kind}", fifo=path if kind == "fifo" else None)
        history = [m.text for m in resumed.history]
        resumed.send("and it goes on")
        resumed.close()
    assert len(said) == 1, said
    assert str(path) in said[0] and f"it is {KIND_WORDS[kind]}, not a file" in said[0]
    # The history survives: loaded, or rebuilt from the transcript.
    assert history == [m.text for m in s.history]


@pytest.mark.parametrize("kind", ["fifo", "dir", "zero"])
def test_a_transcript_that_is_not_a_file_is_not_a_missing_session(kind: str) -> None:
    from ipy_ctxrecovery.errors import ConfigError
    from ipy_ctxrecovery.session.store import saved_sessions

    s = _thirteen("nft")
    not_a_file(s._files.path, kind)
    assert Transcript.exists("nft")
    with pytest.raises(ConfigError) as caught:
        _resumed("nft", fifo=s._files.path if kind == "fifo" else None)
    text = str(caught.value)
    assert "no saved session" not in text
    assert f"{s._files.path} is {KIND_WORDS[kind]}, not a file" in text
    [row] = saved_sessions()
    assert row.damage == f"transcript.jsonl is {KIND_WORDS[kind]}, not a file"


def test_a_deleted_history_json_is_rebuilt_from_the_transcript_with_one_warning() -> None:
    s = _thirteen("nohist")
    (s.directory / "history.json").unlink()
    resumed, said = _resumed("nohist")
    assert len(said) == 1 and "history.json could not be read (it is missing)" in said[0], said
    assert [m.text for m in resumed.history] == [m.text for m in s.history]


@pytest.mark.parametrize("damage", ["emptied", "generation 1e9", "generation -1",
                                    "last lines cut"])
def test_a_journal_that_lost_turns_is_rebuilt_from_the_transcript(damage: str) -> None:
    s = _thirteen("lostturns")
    journal, snapshot = s.directory / "history.journal", s.directory / "history.json"
    if damage == "emptied":
        journal.write_bytes(b"")
    elif damage == "last lines cut":
        journal.write_bytes(b"".join(journal.read_bytes().splitlines(keepends=True)[:2]))
    else:
        data = json.loads(snapshot.read_text())
        data["generation"] = 10**9 if damage == "generation 1e9" else -1
        snapshot.write_text(json.dumps(data))
    resumed, said = _resumed("lostturns")
    assert len(said) == 1, said
    assert ("behind its transcript" in said[0] or "history.json could not be read" in said[0])
    assert [m.text for m in resumed.history] == [m.text for m in s.history]


def test_a_kill_in_the_turn_in_flight_is_not_called_damage() -> None:
    """The user's message is on disk before the journal line: that is no lost turn."""
    s = make("inflight", system="sys")
    for i in range(3):
        s.send(f"q{i}")
    journal = s.directory / "history.journal"
    journal.write_bytes(b"".join(journal.read_bytes().splitlines(keepends=True)[:-1]))
    killed(s)
    resumed, said = _resumed("inflight")
    assert said == []
    assert [m.text for m in resumed.history] == [m.text for m in s.history][:-2]


@pytest.mark.parametrize("record, why", [
    (b'{"type": 5, "ts": 1, "message": {"role": "user", "blocks": []}}', "its type is not a string"),
    (b'{"type": "mesage", "ts": 1}', "its type 'mesage' is not known"),
    (b'{"ts": 1, "message": {"role": "user", "blocks": []}}', "it has no type"),
])
def test_a_record_of_a_wrong_type_is_named_not_dropped_silently(record: bytes, why: str) -> None:
    s = _thirteen("wrongtype")
    lines = s._files.path.read_bytes().splitlines(keepends=True)
    s._files.path.write_bytes(lines[0] + record + b"\n" + b"".join(lines[1:]))
    resumed, said = _resumed("wrongtype")
    assert len(said) == 1 and f"transcript.jsonl: line 2 ({why})" in said[0], said
    assert [m.text for m in resumed.transcript] == [m.text for m in s.transcript]


@pytest.mark.parametrize("caps, shown", [
    ({"largest_ok": 10**400}, "caps.largest_ok is far more than 64 GB"),
    ({"smallest_rejected": 0}, "caps.smallest_rejected is 0 B"),
    ({"smallest_rejected": 10}, "caps.smallest_rejected is 10 B"),
    ({"assumed": 1}, "caps.assumed is 1 B"),
    ({"learned_window": 10**12}, "learned_window is"),
    ({"bytes_per_token": 1e308}, "bytes_per_token is 1e+308"),
])
def test_learned_values_no_network_could_mean_are_ignored_with_one_warning(
        caps: dict[str, Any], shown: str) -> None:
    s = _thirteen("senseless")
    path = s.directory / "learned.json"
    data = json.loads(path.read_text())
    for key, value in caps.items():
        if key in data["caps"]:
            data["caps"][key] = value
        elif key in data["calibration"]:
            data["calibration"][key] = value
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    resumed, said = _resumed("senseless")
    assert len(said) == 1 and str(path) in said[0] and shown in said[0], said
    assert "no network path or model could mean" in said[0]
    reply = resumed.send("every send still works")     # no OverflowError, no "-1 B"
    assert reply.text.startswith("echo:")
    cap = resumed.caps.effective()
    assert cap is None or cap >= 4096


def test_a_state_directory_deleted_mid_session_is_made_again_with_one_warning() -> None:
    import shutil
    import stat

    s = make("vanished", system="sys")
    for i in range(3):
        s.send(f"q{i}")
    shutil.rmtree(s.directory)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s.send("after the directory went")
        s.send("and one more")
    said = [str(w.message) for w in seen]
    assert len(said) == 1 and f"{s.directory} was deleted while session" in said[0], said
    assert stat.S_IMODE(s.directory.stat().st_mode) == 0o700
    assert {"transcript.jsonl", "history.json", "session.json"} <= {
        p.name for p in s.directory.iterdir()}
    history = s.history
    killed(s)
    resumed, said = _resumed("vanished")
    assert said == []
    assert [m.text for m in resumed.history] == [m.text for m in history]
    assert resumed.system == "sys"


def test_a_damaged_session_json_with_a_client_opens_on_the_model_learned_json_names(
        emulator: Any) -> None:
    from ipy_ctxrecovery.errors import ConfigError

    emu = emulator()
    s = ChatSession("openai:gpt-4o-mini", client=emu.openai_client(max_retries=0),
                    name="withclient", settings=Settings(), sleep=lambda x: None)
    s.send("hello")
    s.close()
    (s.directory / "session.json").write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match="session.json could not be read"):
        resumed = ChatSession.resume("withclient", client=emu.openai_client(max_retries=0))
    assert resumed.model == "openai:gpt-4o-mini"
    assert resumed.send("again").text
    resumed.close()
    (s.directory / "learned.json").unlink()
    (s.directory / "session.json").write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning), pytest.raises(ConfigError) as caught:
        ChatSession.resume("withclient", client=emu.openai_client(max_retries=0))
    assert "session.json is missing or damaged" in str(caught.value)
    assert "model='openai:…'" in str(caught.value)


def test_a_fifo_in_place_of_the_lock_never_hangs_the_list_of_sessions() -> None:
    from ipy_ctxrecovery.session.store import LOCK_FILE, saved_sessions

    s = _thirteen("fifolock")
    lock = s.directory / LOCK_FILE
    not_a_file(lock, "fifo")
    [row] = finishes(saved_sessions, fifo=lock)
    assert row.name == "fifolock" and row.messages == 13 and row.open_elsewhere is None
