"""read_file: the deny list, regular files only, bounded ranged reads (a 5 GB file is never
read whole, and the turn's deadline stops a long scan), the on/off switch and root from
Settings, ``%config``/``%chat config`` and ``%%chat --no-read-file``."""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeProvider, tool_call_reply
from IPython.core.error import UsageError
from test_magics import cell, chat, ip  # noqa: F401  (fixtures)

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.notebook.magics import ChatMagics
from ipy_ctxrecovery.redaction import mask_secrets
from ipy_ctxrecovery.session.tools import Tool, make_read_file
from ipy_ctxrecovery.settings import ConfigError


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A working directory that looks like $HOME."""
    root = tmp_path / "home"
    for rel, text in {
        ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n",
        ".ssh/config": "Host x\n",
        ".aws/credentials": "[default]\naws_secret_access_key = x\n",
        ".env": "TOKEN=1\n",
        ".netrc": "machine x login y password z\n",
        ".git-credentials": "https://u:p@github.com\n",
        ".pgpass": "db:5432:*:u:p\n",
        "id_rsa": "key\n",
        "certs/server.pem": "cert\n",
        "deploy/prod.key": "key\n",
        "project/.git/config": "[core]\n",
        "project/terraform.tfstate": "{}\n",
        "project/notes.txt": "".join(f"line {i}\n" for i in range(500)),
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "innocent.txt").symlink_to(root / ".ssh" / "id_ed25519")
    return root


def run(tool: Tool, **arguments: Any) -> tuple[str, bool]:
    return tool.run(json.dumps(arguments))


def peak_memory(tool: Tool, **arguments: Any) -> tuple[str, bool, int]:
    """Run ``tool`` and return its result and the peak bytes Python allocated meanwhile."""
    mask_secrets("warm up")  # detect-secrets' one-time import is not read_file's memory
    tracemalloc.start()
    try:
        text, is_error = run(tool, **arguments)
        return text, is_error, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("path", [
    ".ssh/id_ed25519", ".ssh/config", ".aws/credentials", ".env", ".netrc",
    ".git-credentials", ".pgpass", "id_rsa", "certs/server.pem", "deploy/prod.key",
    "project/.git/config", "project/terraform.tfstate", "innocent.txt",
    "project/../.ssh/id_ed25519",
])
def test_the_deny_list_refuses_keys_and_credentials(home: Path, path: str) -> None:
    tool = make_read_file(home, home / "results")
    for given in (path, str(home / path)):
        text, is_error = run(tool, path=given)
        assert is_error and "deny list" in text and "\n" not in text
        assert "PRIVATE KEY" not in text and "password" not in text


def test_ordinary_files_are_still_read(home: Path) -> None:
    text, is_error = run(make_read_file(home, home / "results"), path="project/notes.txt",
                         offset=10, limit=2)
    assert not is_error and text == "[project/notes.txt: lines 10-11 of 500]\nline 10\nline 11\n"


def test_a_named_pipe_is_refused_without_blocking(home: Path) -> None:
    os.mkfifo(home / "pipe")
    tool = make_read_file(home, home / "results")
    result: list[tuple[str, bool]] = []
    reader = threading.Thread(target=lambda: result.append(run(tool, path="pipe")), daemon=True)
    reader.start()
    reader.join(30)  # a guard against a hang, not a timing: it returns at once
    assert not reader.is_alive(), "read_file blocked on a FIFO"
    text, is_error = result[0]
    assert is_error and "not a regular file" in text and "\n" not in text


def test_a_large_file_is_read_in_the_range_asked_for(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with open(big, "w") as f:
        for block in range(200):  # 40 MB, 400,000 lines of ~100 bytes
            f.write("".join(f"{block * 2000 + i:09d} " + "x" * 89 + "\n" for i in range(2000)))
    tool = make_read_file(tmp_path, tmp_path / "results")
    text, is_error, peak = peak_memory(tool, path="big.log", offset=300_000, limit=3)
    assert not is_error
    # The total is counted only a few MB past the range: "at least" that many.
    header = text.splitlines()[0]
    assert header.startswith("[big.log: lines 300000-300002 of at least ")
    assert 300_003 < int(header.rsplit(" ", 1)[1].rstrip("]")) < 400_000
    assert text.splitlines()[1].startswith("000300000 ")
    assert peak < 2 * 1024 * 1024  # the old read_file held all 40 MB (and a list of lines)


def test_one_huge_line_is_cut_and_the_model_can_move_past_it(tmp_path: Path) -> None:
    (tmp_path / "min.js").write_text("a" * 5_000_000 + "\nsecond line\n")
    tool = make_read_file(tmp_path, tmp_path / "results", max_chars=1000)
    text, is_error, peak = peak_memory(tool, path="min.js")
    assert not is_error and "line 0 is longer than 1000 chars" in text
    assert "continue with offset=1" in text and len(text) < 1200
    assert peak < 1024 * 1024
    assert run(tool, path="min.js", offset=1)[0].endswith("second line\n")


def test_binary_files_and_directories_get_one_sentence(home: Path) -> None:
    (home / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    tool = make_read_file(home, home / "results")
    for path, words in (("blob.bin", "binary"), ("project", "directory"),
                        ("missing.txt", "does not exist")):
        text, is_error = run(tool, path=path)
        assert is_error and words in text and "\n" not in text


def test_settings_turn_read_file_off_and_choose_its_root(home: Path, tmp_path: Path) -> None:
    off = ChatSession("emulator", settings=Settings(read_file=False), files_root=home,
                      name="no-read-file")
    assert "read_file" not in {t.name for t in off.tools}
    rooted = ChatSession("emulator", settings=Settings(read_file_root=str(home / "project")),
                         files_root=tmp_path, name="rooted")
    text, is_error = run(next(t for t in rooted.tools if t.name == "read_file"),
                         path="notes.txt", limit=1)
    assert not is_error and "line 0" in text
    # Live: a settings update turns it off and on again, user tools untouched.
    rooted.update(settings=rooted.settings.replace(read_file=False))
    assert [t.name for t in rooted.tools] == []
    rooted.update(settings=rooted.settings.replace(read_file=True))
    assert [t.name for t in rooted.tools] == ["read_file"]
    with pytest.raises(ConfigError, match="not a directory"):
        Settings().updated({"read_file_root": str(tmp_path / "nowhere")})
    for session in (off, rooted):
        session.close()


def offered(chat: ChatMagics) -> list[str]:  # noqa: F811
    body = chat.workspace.emulator.requests[-1].body
    return [t["function"]["name"] for t in body.get("tools", [])]


def test_the_magics_switch_read_file(chat: ChatMagics, ip: Any,  # noqa: F811
                                     home: Path) -> None:
    cell(ip, "", "hello")
    assert offered(chat) == ["read_file"]
    cell(ip, "--no-read-file", "this cell only")
    assert offered(chat) == []
    cell(ip, "", "and back")
    assert offered(chat) == ["read_file"]
    ip.run_line_magic("chat", "config read_file=False")
    cell(ip, "", "off for the session")
    assert offered(chat) == []
    ip.run_line_magic("config", "ChatMagics.read_file = True")
    ip.run_line_magic("config", f"ChatMagics.read_file_root = {str(home / 'project')!r}")
    session = chat.workspace.session()
    tool = next(t for t in session.tools if t.name == "read_file")
    assert "line 3" in run(tool, path="notes.txt", offset=3, limit=1)[0]
    with pytest.raises(UsageError, match="read_file_root=.* is not a directory"):
        ip.run_line_magic("chat", f"config read_file_root={home / 'nowhere'}")


# -- a file of many GB: only the lines asked for, inside the turn's deadline ----------------

def bytes_read() -> int:
    """What this process has read from files so far (``rchar`` of /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.fixture
def sparse(tmp_path: Path) -> Path:
    """5 GB: 1,000 real lines, then a sparse hole (no newline in it)."""
    path = tmp_path / "huge.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    os.truncate(path, 5 * 1024 ** 3)
    return path


def test_a_huge_file_is_never_read_whole(sparse: Path) -> None:
    tool = make_read_file(sparse.parent, sparse.parent / "results")
    before = bytes_read()
    text, is_error = run(tool, path="huge.log", offset=10, limit=3)
    read = bytes_read() - before
    assert not is_error
    assert text.startswith("[huge.log: lines 10-12 of at least ")
    assert text.splitlines()[1:] == ["line 10", "line 11", "line 12"]
    # The old read_file counted every line: 5 GB read per call (30-52 s each).
    assert read < 16 * 1024 * 1024, f"{read:,} bytes read for 3 lines"


def test_a_small_file_still_says_its_exact_total(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("a\nb\nc")          # no newline at the end
    tool = make_read_file(tmp_path, tmp_path / "results")
    assert run(tool, path="short.txt", limit=1)[0] == "[short.txt: lines 0-0 of 3]\na\n"
    assert run(tool, path="short.txt", offset=5)[0] == \
        "[short.txt: no lines at offset 5; the file has 3 lines]"


def test_the_turns_deadline_stops_a_long_scan_and_names_read_file(sparse: Path) -> None:
    # offset 5,000 lies in the hole: finding it would read all 5 GB (about a minute here).
    provider = FakeProvider([tool_call_reply("read_file", {"path": "huge.log", "offset": 5000})])
    session = ChatSession(provider=provider, files_root=sparse.parent, name="huge-scan",
                          settings=Settings(turn_timeout=2.0))
    started = time.monotonic()
    with pytest.raises(ChatError) as caught:
        session.send("read it")
    took = time.monotonic() - started
    sentence = str(caught.value)
    assert "turn_timeout (2 seconds) ran out during the tool read_file" in sentence
    assert "not while waiting for the server" in sentence and "\n" not in sentence
    assert took < 20, f"the turn took {took:.0f} s"        # a wide margin: ~2 s here
    assert session.history == ()
    session.close()
