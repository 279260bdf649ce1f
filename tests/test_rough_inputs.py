"""Inputs that used to crash raw (issue 12 item 8): deeply nested tool arguments, a tool
result whose ``__str__`` raises, ``"message": null`` in a reply, export through symlinks
and over existing files, and an existing directory given as the state dir."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fakes import FakeProvider, tool_call_reply
from IPython.core.error import UsageError
from IPython.testing import globalipapp
from rawserver import serving

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import Message, ToolCall
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.providers.anthropic import to_anthropic
from ipy_ctxrecovery.providers.openai import OpenAIProvider
from ipy_ctxrecovery.session.tools import as_tool

DEEP_LIST = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a": ' + DEEP_LIST + "}"


def listed(a: list | None = None) -> str:
    """Take a list.

    Args:
        a: anything listy.
    """
    return "ran"


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("no text for you")

    __repr__ = __str__


def unprintable() -> Any:
    """Return something that cannot be printed."""
    return Unprintable()


class BadError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("nor for this")


def raises_badly() -> str:
    """Raise an exception that cannot be printed."""
    raise BadError()


@pytest.mark.parametrize("arguments", [DEEP_LIST, DEEP_OBJECT], ids=["list", "object"])
def test_deeply_nested_tool_arguments_are_an_error_result(arguments: str) -> None:
    content, is_error = as_tool(listed).run(arguments)
    assert is_error and content == "Error: the arguments for listed are nested too deeply to read."


def test_deeply_nested_arguments_in_a_session_on_both_wires() -> None:
    fake = FakeProvider([tool_call_reply("listed", DEEP_OBJECT)])
    s = ChatSession(provider=fake, tools=[listed], sleep=lambda x: None)
    reply = s.send("go")
    assert reply.text.startswith("echo")
    assert s.history[2].text == "Error: the arguments for listed are nested too deeply to read."
    # The Anthropic wire parses arguments into tool_use input: kept as raw text instead.
    _, messages = to_anthropic((Message.user("go"),
                                Message.assistant("", [ToolCall("c1", "listed", DEEP_LIST)])))
    assert messages[1]["content"][0]["input"] == {"_raw_arguments": DEEP_LIST}


@pytest.mark.parametrize("tool, words", [
    (unprintable, "Error: the result of unprintable (a Unprintable) could not be turned "
                  "into text (ValueError)."),
    (raises_badly, "Error: raises_badly raised BadError: (its message could not be shown)"),
])
def test_a_tool_whose_result_or_error_cannot_be_printed_is_an_error_result(
        tool: Any, words: str) -> None:
    fake = FakeProvider([tool_call_reply(tool.__name__, {})])
    s = ChatSession(provider=fake, tools=[tool], sleep=lambda x: None)
    s.send("go")
    assert s.history[2].text == words and s.history[2].tool_result.is_error


def _completion(message: str) -> bytes:
    body = ('{"id": "c1", "object": "chat.completion", "created": 1, "model": "m", '
            '"choices": [{"index": 0, "finish_reason": "stop", "message": ' + message + '}], '
            '"usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}').encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_message_null_in_a_reply_is_one_sentence_and_the_history_is_unchanged() -> None:
    with serving() as start:
        srv = start(_completion("null"), stall=0)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="sk-x",
                               max_retries=0)
        s = ChatSession(provider=OpenAIProvider("gpt-4o-mini", client=client),
                        settings=Settings(), sleep=lambda x: None)
        with pytest.raises(ChatError) as caught:
            s.send("hello", stream=False)
        assert str(caught.value) == (
            "The OpenAI reply stream ended early (the reply's choice has no message); retry, "
            "and if it repeats check the server or any proxy in between.")
        assert s.history == ()
        s.close()


# -- export --------------------------------------------------------------------------------------

@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.config.pop("ChatMagics", None)
    shell.run_line_magic("load_ext", "ipy_ctxrecovery")
    shell.run_cell("%%chat\nexport me\n", store_history=True)
    yield shell
    if "ipy_ctxrecovery" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "ipy_ctxrecovery")


def test_export_never_follows_a_symlink(ip: Any, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.md"
    target.write_text("precious")
    os.chmod(target, 0o644)
    link = tmp_path / "chat.md"
    link.symlink_to(target)
    with pytest.raises(UsageError, match=r"is a symbolic link; give the path of a regular file"):
        ip.run_line_magic("chat", f"export {link}")
    assert target.read_text() == "precious" and stat.S_IMODE(target.stat().st_mode) == 0o644


def test_export_over_an_existing_file_keeps_its_mode(ip: Any, tmp_path: Path) -> None:
    existing = tmp_path / "notes.json"
    existing.write_text("old")
    os.chmod(existing, 0o644)
    with pytest.raises(UsageError, match="exists; add --force"):
        ip.run_line_magic("chat", f"export {existing}")
    assert existing.read_text() == "old"                    # nothing written without --force
    ip.run_line_magic("chat", f"export {existing} --force")
    assert json.loads(existing.read_text())["messages"][0]["blocks"][0]["text"] == "export me"
    assert stat.S_IMODE(existing.stat().st_mode) == 0o644
    fresh = tmp_path / "new.json"
    ip.run_line_magic("chat", f"export {fresh}")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_export_to_a_fifo_is_refused_without_blocking(ip: Any, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        ip.run_line_magic("chat", f"export {fifo}")


# -- the state directory ------------------------------------------------------------------------

def test_an_existing_state_dir_keeps_its_mode(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(home))
    s = ChatSession(provider=FakeProvider(), name="in-home", sleep=lambda x: None)
    s.send("hi")
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    assert stat.S_IMODE((home / "sessions").stat().st_mode) == 0o700
    assert stat.S_IMODE(s.directory.stat().st_mode) == 0o700
