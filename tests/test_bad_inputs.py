"""The bad-input table (issue 12, "done when"): one row per input, each answered by one
clear sentence — never a traceback — and nothing of the conversation lost.

Rows by where the input comes in: environment variables, settings set by name, the
magics, session names, model strings, the session's files on disk (transcript lines,
history snapshot and journal, session.json, learned.json) and the model's tool arguments.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeProvider, killed
from IPython.core.error import UsageError

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.errors import ConfigError, CtxRecoveryError
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.session.store import Transcript, validate_name
from ipy_ctxrecovery.session.tools import as_tool


def one_sentence(text: str) -> None:
    """One line, no traceback, ends like a sentence, short enough to read."""
    assert "\n" not in text.strip(), text
    assert "Traceback" not in text and 'File "' not in text, text
    assert text.strip().endswith((".", ")", "…")), text
    assert 10 < len(text) < 600, text


# -- environment variables ------------------------------------------------------------------------

_INT_VARS = ["CHATCLI_MAX_RECOVERY_ATTEMPTS", "CHATCLI_MAX_TOKEN_ESCALATIONS",
             "CHATCLI_EMERGENCY_KEEP_MESSAGES", "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS",
             "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS", "CHATCLI_CONTEXT_WINDOW"]
_BAD_INTS = ["abc", "-1", "1.5", "nan", "inf", "1e3", "3 turns", "0x10"]
_BAD_SIZES = ["abc", "-5MB", "5XB", "nan", "inf", "1e999", "five MB", "MB", "-0.5", "MB5",
              # read as 5 MB or as no cap before issue 26
              "5MBB", "5 MB MB", "5MB;rm", "0.0000001", "2KB"]
ENV_ROWS = [(var, value) for var in _INT_VARS for value in _BAD_INTS] + \
    [("CHATCLI_MAX_PAYLOAD", value) for value in _BAD_SIZES] + \
    [("CHATCLI_EMERGENCY_KEEP_MESSAGES", "0"), ("CHATCLI_MAX_RECOVERY_ATTEMPTS", "0"),
     ("CHATCLI_MICROCOMPACT_TRUNCATE_TURNS", "0")]


@pytest.mark.parametrize("var, value", ENV_ROWS)
def test_env(var: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({var: value})
    one_sentence(str(caught.value))
    assert var in str(caught.value)


# -- settings by name (%chat config, Settings.updated) --------------------------------------------

FIELD_ROWS = [
    ("chars_per_token", "0"), ("chars_per_token", "nan"), ("chars_per_token", "abc"),
    ("chars_per_token", "11"), ("chars_per_token", "-1"),
    ("preflight_cap_fraction", "1.5"), ("preflight_cap_fraction", "0"),
    ("preflight_cap_fraction", "x"), ("chat_budget_ratio", "-0.1"),
    ("exact_fit_margin", "1"), ("turn_timeout", "-1"), ("turn_timeout", "0.5"),
    ("turn_timeout", "soon"), ("max_retry_wait", "-1"), ("max_retry_wait", "inf"),
    ("max_retry_wait", "x"), ("per_result_max_chars", "300000"), ("turn_budget_chars", "0"),
    ("summary_max_chars", "0"), ("max_tool_rounds", "many"), ("transient_retries", "-2"),
    ("assumed_cap_bytes", "0"), ("colour", "blue"), ("CHATCLI_NOPE", "1"),
    ("max-payloads", "5MB"),
]


@pytest.mark.parametrize("key, value", FIELD_ROWS)
def test_setting(key: str, value: str) -> None:
    before = Settings()
    with pytest.raises(ConfigError) as caught:
        before.updated({key: value})
    one_sentence(str(caught.value))
    assert key in str(caught.value)
    assert before == Settings()


# -- the magics ----------------------------------------------------------------------------------

@pytest.fixture
def ip(loaded_shell: Any) -> Any:
    loaded_shell.run_cell("%%chat\nkeep this\n", store_history=True)
    return loaded_shell


MAGIC_ROWS = [
    "%chat config CHATCLI_MAX_PAYLOAD=abc",
    "%chat config CHATCLI_CONTEXT_WINDOW=-5",
    "%chat config nonsense",
    "%chat config =5",
    "%chat config colour=blue",
    "%chat config chars_per_token=0",
    "%chat nosuchcommand",
    "%chat resume no-such-session",
    "%chat export /nonexistent-dir/x.md",
    "%chat export notes.txt",
    "%chat emulator --max-body abc",
    "%chat emulator --max-body 5MB;rm",
    "%chat emulator --latency 1e9",
    "%chat emulator --latency -1",
    "%chat history --width abc",
    "%chat undo-compact",
    "%%chat --max-tokens abc\nhello",
    "%%chat -S \"bad name!\"\nhello",
    "%%chat azure:gpt-4o\nhello",
    "%%chat -f nope\nhello",
    "%%chat --tools nosuchtool\nhello",
    "%%chat --tools ,,,\nhello",
    "%%chat openai:gpt-4o-mini\nhello",
    "%%chat emulator:klingon\nhello",
]


@pytest.mark.parametrize("line", MAGIC_ROWS)
def test_magic(ip: Any, line: str) -> None:
    magics = ip.magics_manager.registry["ChatMagics"]
    before = magics.workspace.sessions["default"].history
    result = ip.run_cell(line, store_history=True)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    one_sentence(str(result.error_in_exec))
    assert magics.workspace.sessions["default"].history == before        # nothing lost


@pytest.mark.parametrize("value", ["-1", "float('nan')", "1e9", "float('inf')"])
def test_a_nonsense_stream_interval_is_refused_and_kept(ip: Any, value: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    magics = ip.magics_manager.registry["ChatMagics"]
    before = magics.stream_interval
    ip.run_cell(f"%config ChatMagics.stream_interval = {value}", store_history=True)
    said = capsys.readouterr()
    shown = (said.out + said.err).strip()
    assert "stream_interval" in shown and "seconds from 0 to 3600" in shown, shown
    assert "Traceback" not in shown
    assert magics.stream_interval == before


# -- session names and model strings --------------------------------------------------------------

NAME_ROWS = ["", " ", "../x", "a/b", ".hidden", "x" * 101, "sp ace", "é", "a\x00b", "-lead",
             "semi;colon", "tab\t", "new\nline", "*", "~user"]


@pytest.mark.parametrize("name", NAME_ROWS)
def test_session_name(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_name(name)
    one_sentence(str(caught.value))
    with pytest.raises(ConfigError):
        ChatSession(provider=FakeProvider(), name=name)


MODEL_ROWS = ["", " ", "a b", "emulator:klingon", "openai:", "anthropic:", "azure:gpt-4o",
              "bedrock:claude", "vertex:claude", "ollama:llama3", "vllm:qwen", "lmstudio:x",
              "openai: gpt", "openai:gpt-4o", "anthropic:claude-sonnet-4"]


@pytest.mark.parametrize("spec", MODEL_ROWS)
def test_model(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError) as caught:
        make_provider(spec)
    one_sentence(str(caught.value))


# -- the session's files -------------------------------------------------------------------------------

def _caught(fn: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in seen]


def _session_with_files(name: str) -> ChatSession:
    s = ChatSession(provider=FakeProvider(), name=name, system="sys", sleep=lambda x: None)
    s.send("first")
    s.send("second")
    s.close()
    return s


_MSG = b'{"type": "message", "ts": 1, "message": '
TRANSCRIPT_ROWS = [
    b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b'{"type": "message", "text": "caf\xe9"}',
    b"{", b"nul", b"}{", b"[", b"\x00\x00", b'{"a": 1,}',
    b"42", b'"text"', b"[1, 2]", b"null", b"true",
    _MSG + b'"hello"}', _MSG + b"null}", _MSG + b'{"blocks": []}}',
    _MSG + b'{"role": "robot", "blocks": []}}', _MSG + b'{"role": null, "blocks": []}}',
    _MSG + b'{"role": 7, "blocks": []}}', _MSG + b'{"role": "user", "blocks": "abc"}}',
    _MSG + b'{"role": "user", "blocks": [7]}}',
    _MSG + b'{"role": "user", "blocks": [{"type": "video"}]}}',
    _MSG + b'{"role": "user", "blocks": [{"type": "text"}]}}',
    _MSG + b'{"role": "user", "blocks": [{"type": "text", "text": 5}]}}',
    _MSG + b'{"role": "tool", "blocks": [{"type": "tool_result", "content": "x"}]}}',
    _MSG + b'{"role": "user", "blocks": [], "meta": []}}',
    _MSG + b'{"role": "user", "blocks": [], "tag": 5}}',
    b'{"type": "message", "ts": 1, "mess',
    b"[" * 100_000,
    # dropped with no word before issue 26
    b'{"type": 5, "ts": 1, "message": {"role": "user", "blocks": []}}',
    b'{"type": "mesage", "ts": 1}', b'{"ts": 1}', b'{"type": null}', b'{"type": ["message"]}',
]


@pytest.mark.parametrize("bad", TRANSCRIPT_ROWS, ids=[f"t{i}" for i in range(len(TRANSCRIPT_ROWS))])
def test_transcript_line(bad: bytes) -> None:
    s = _session_with_files("tline")
    lines = s._files.path.read_bytes().splitlines(keepends=True)
    s._files.path.write_bytes(lines[0] + bad + b"\n" + b"".join(lines[1:]))
    resumed, said = _caught(lambda: ChatSession.resume("tline", provider=FakeProvider()))
    assert len(said) == 1, said
    one_sentence(said[0])
    assert "transcript.jsonl: line 2 (" in said[0]
    assert [m.text for m in resumed.transcript] == [m.text for m in s.transcript]
    assert resumed.history == s.history


HISTORY_ROWS = [b"", b"garbage", b"\xff\xfe", b"[]", b'{"messages": "x", "version": 2}',
                b'{"messages": [], "version": 99}', b'{"version": 2, "messages": [{"role": "x"}]}',
                b'{"version": 2, "generation": "x", "messages": []}', b'{"version": 2, "mess',
                b"[" * 100_000,
                b'{"version": 2, "generation": -1, "messages": []}',       # issue 26
                b'{"version": 2, "generation": true, "messages": []}']


@pytest.mark.parametrize("bad", HISTORY_ROWS, ids=[f"h{i}" for i in range(len(HISTORY_ROWS))])
def test_history_snapshot(bad: bytes) -> None:
    s = _session_with_files("hsnap")
    s._files.history_path.write_bytes(bad)
    resumed, said = _caught(lambda: ChatSession.resume("hsnap", provider=FakeProvider()))
    assert len(said) == 1, said
    one_sentence(said[0])
    assert "history.json could not be read (" in said[0]
    assert [m.text for m in resumed.history] == [m.text for m in s.history]


JOURNAL_ROWS = [b"garbage", b"\xff", b"[]", b'{"gen": 1, "base": 99, "set": [], "add": []}',
                b'{"gen": 1, "base": 3, "set": [[0, {"role": "x"}]], "add": []}',
                b'{"gen": 1, "base": 3}', b'{"gen": 1, "base": 3, "set": [[9, {}]], "add": []}']


@pytest.mark.parametrize("bad", JOURNAL_ROWS, ids=[f"j{i}" for i in range(len(JOURNAL_ROWS))])
def test_history_journal(bad: bytes) -> None:
    s = ChatSession(provider=FakeProvider(), name="hjournal", system="sys", sleep=lambda x: None)
    for text in ("first", "second", "third"):
        s.send(text)
    journal = s._files.journal_path
    lines = journal.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2          # the first turn wrote the snapshot
    journal.write_bytes(lines[0] + bad + b"\n" + b"".join(lines[1:]))
    killed(s)
    resumed, said = _caught(lambda: ChatSession.resume("hjournal", provider=FakeProvider()))
    assert len(said) == 1, said
    one_sentence(said[0])
    assert "history.journal could not be read (line 2" in said[0]
    assert [m.text for m in resumed.history] == [m.text for m in s.history]


META_ROWS = [b"\xff\xfe", b"garbage", b"[]", b"", b"[" * 100_000]


@pytest.mark.parametrize("bad", META_ROWS, ids=[f"m{i}" for i in range(len(META_ROWS))])
def test_session_json(bad: bytes) -> None:
    s = _session_with_files("smeta")
    s._files.meta_path.write_bytes(bad)
    resumed, said = _caught(lambda: ChatSession.resume("smeta", provider=FakeProvider()))
    assert len(said) == 1, said
    one_sentence(said[0])
    assert "session.json could not be read (" in said[0]
    assert resumed.history == s.history


@pytest.mark.parametrize("bad", [b'{"model": 5, "system": []}', b'{"system": {"a": 1}}'])
def test_session_json_with_wrong_types_is_ignored(bad: bytes) -> None:
    s = _session_with_files("smeta2")
    s._files.meta_path.write_bytes(bad)
    resumed, said = _caught(lambda: ChatSession.resume("smeta2", provider=FakeProvider()))
    assert said == [] and resumed.history == s.history


def _learned(caps: str = "", calibration: str = "", **fields: str) -> bytes:
    """A learned.json of the shape ``to_json`` writes, with some values replaced."""
    data = {"version": "1", "model": '"fake"', "path": "null", "context_window": "null",
            "caps": '{"largest_ok": 0, "smallest_rejected": null, "assumed": null' + caps + "}",
            "learned_window": "null", "output_limit": "null",
            "calibration": '{"samples": 0, "bytes_per_token": 4.0' + calibration + "}",
            "warned": "false", "payload_notice_sent": "false", **fields}
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in data.items()) + "}").encode()


LEARNED_ROWS = [b"garbage", b"\xff\xfe", b"[]", b'{"version": 99}', b'{"version": 1}',
                b'{"version": 1, "model": "fake", "caps": {"largest_ok": -5}, "calibration": {}}',
                b"[" * 100_000,
                # values that pass the shape but no network could mean: a raw OverflowError
                # or "more than -1 B" on every send before issue 26
                _learned(', "largest_ok": 1' + "0" * 400), _learned(', "smallest_rejected": 0'),
                _learned(', "assumed": 1'), _learned(calibration=', "bytes_per_token": 1e308'),
                _learned(learned_window="1" + "0" * 30), _learned(output_limit="0"),
                _learned(calibration=', "samples": 1' + "0" * 20)]


@pytest.mark.parametrize("bad", LEARNED_ROWS, ids=[f"l{i}" for i in range(len(LEARNED_ROWS))])
def test_learned_json(bad: bytes) -> None:
    s = _session_with_files("slearned")
    s._files.learned_path.write_bytes(bad)
    resumed, said = _caught(lambda: ChatSession.resume("slearned", provider=FakeProvider()))
    assert len(said) == 1, said
    one_sentence(said[0])
    assert "learned.json" in said[0]
    assert resumed.history == s.history
    assert resumed.send("still answers").text.startswith("echo:")


# -- what is not a file in the state directory, and quiet damage (issue 26) ----------------------

NOT_A_FILE_ROWS = [(file, kind) for file in ("history.json", "history.journal", "session.json",
                                             "learned.json", "transcript.jsonl")
                   for kind in ("fifo", "zero", "dir")]


@pytest.mark.parametrize("file, kind", NOT_A_FILE_ROWS)
def test_a_state_file_that_is_not_a_file(file: str, kind: str) -> None:
    from diskfaults import KIND_WORDS, finishes, not_a_file, resume_in_child

    s = _session_with_files("notafile")
    path = s.directory / file
    not_a_file(path, kind)
    fifo = path if kind == "fifo" else None
    if file == "transcript.jsonl":       # what was said is that file: it cannot open
        with pytest.raises(ConfigError) as caught:
            finishes(lambda: ChatSession.resume("notafile", provider=FakeProvider()), fifo=fifo)
        said = [str(caught.value)]
    elif kind == "zero":    # reading it grows memory without bound: in a bounded child
        child = resume_in_child("notafile")
        assert child["error"] is None, child
        said = child["warnings"]
        assert child["history"] == [m.text for m in s.history]
    else:
        resumed, said = finishes(lambda: _caught(
            lambda: ChatSession.resume("notafile", provider=FakeProvider())), fifo=fifo)
        assert resumed.history == s.history
    assert len(said) == 1, said
    one_sentence(said[0])
    assert str(path) in said[0] and f"{KIND_WORDS[kind]}, not a file" in said[0]


def _delete_history(s: ChatSession) -> None:
    s._files.history_path.unlink()


def _empty_journal(s: ChatSession) -> None:
    s._files.journal_path.write_bytes(b"")


def _generation(value: int) -> Any:
    def damage(s: ChatSession) -> None:
        data = json.loads(s._files.history_path.read_text())
        data["generation"] = value
        s._files.history_path.write_text(json.dumps(data))
    return damage


DAMAGE_ROWS = {"history.json deleted": _delete_history, "journal emptied": _empty_journal,
               "generation 10**9": _generation(10**9), "generation -1": _generation(-1)}


@pytest.mark.parametrize("damage", list(DAMAGE_ROWS))
def test_a_working_history_that_lost_turns(damage: str) -> None:
    s = ChatSession(provider=FakeProvider(), name="lost", system="sys", sleep=lambda x: None)
    for text in ("first", "second", "third", "fourth"):
        s.send(text)
    DAMAGE_ROWS[damage](s)
    killed(s)
    resumed, said = _caught(lambda: ChatSession.resume("lost", provider=FakeProvider()))
    assert len(said) == 1, said                          # silent shrinks before issue 26
    one_sentence(said[0])
    assert "rebuilt from the" in said[0]
    assert resumed.history == s.history


def test_a_damaged_session_json_with_only_a_client() -> None:
    import openai

    s = _session_with_files("clientonly")
    s._files.meta_path.write_bytes(b"garbage")
    s._files.learned_path.unlink()
    client = openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError) as caught:
            ChatSession.resume("clientonly", client=client)
    one_sentence(str(caught.value))                # not "client= cannot be combined…"
    assert "session.json is missing or damaged" in str(caught.value)


# -- tool arguments from the model ----------------------------------------------------------------------

def count(n: int, label: str = "") -> str:
    """Count to n.

    Args:
        n: how far.
        label: a name for it.
    """
    return str(n)


TOOL_ROWS = ["{", "[]", "1", "null", '"s"', '{"n": "x"}', '{"n": 1.5}', "{}",
             '{"n": 1, "extra": 2}', "[" * 100_000, '{"n": ' + "[" * 100_000 + "}",
             '{"n": true}', '{"n": NaN}', '{"n": 1, "label": 5}', "\x00"]


@pytest.mark.parametrize("arguments", TOOL_ROWS, ids=[f"a{i}" for i in range(len(TOOL_ROWS))])
def test_tool_arguments(arguments: str) -> None:
    content, is_error = as_tool(count).run(arguments)
    assert is_error and content.startswith("Error: ")
    one_sentence(content)


def test_the_table_has_at_least_150_rows() -> None:
    rows = (len(ENV_ROWS) + len(FIELD_ROWS) + len(MAGIC_ROWS) + len(NAME_ROWS) + len(MODEL_ROWS)
            + len(TRANSCRIPT_ROWS) + len(HISTORY_ROWS) + len(JOURNAL_ROWS) + len(META_ROWS) + 2
            + len(LEARNED_ROWS) + len(TOOL_ROWS) + len(NOT_A_FILE_ROWS) + len(DAMAGE_ROWS) + 1)
    assert rows >= 150, rows


def test_a_bad_file_never_raises_from_transcript_reads(tmp_path: Path) -> None:
    t = Transcript("reads")
    t.append(Message.user("ok"))
    t.path.write_bytes(b"\xff\n" + t.path.read_bytes())
    messages, said = _caught(t.messages)
    assert [m.text for m in messages] == ["ok"] and len(said) == 1
    assert isinstance(json.dumps([m.to_dict() for m in messages]), str)
    assert not isinstance(said, CtxRecoveryError)


def test_a_transcript_that_is_not_a_file_in_the_magics(ip: Any,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from diskfaults import not_a_file

    s = _session_with_files("broken")
    not_a_file(s._files.path, "dir")
    magics = ip.magics_manager.registry["ChatMagics"]
    before = magics.workspace.sessions["default"].history
    capsys.readouterr()
    ip.run_cell("%chat sessions", store_history=True)
    listed = capsys.readouterr().out
    assert "⚠ cannot be opened: transcript.jsonl is a directory, not a file" in listed, listed
    result = ip.run_cell("%chat resume broken", store_history=True)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    one_sentence(str(result.error_in_exec))
    assert "transcript.jsonl is a directory, not a file" in str(result.error_in_exec)
    assert "no saved session" not in str(result.error_in_exec)
    assert magics.workspace.sessions["default"].history == before        # nothing lost
