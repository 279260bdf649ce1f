"""``_files``: only regular files are read or opened for writing, with a size bound (issue 26)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from diskfaults import KIND_WORDS, finishes, not_a_file

from ipy_ctxrecovery._files import NotAFile, append_record, open_private, read_regular


@pytest.mark.parametrize("kind", ["fifo", "dir", "zero", "dangling"])
def test_read_regular_names_what_is_there_instead_of_a_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "history.json"
    not_a_file(path, kind)
    with pytest.raises(NotAFile) as caught:
        finishes(lambda: read_regular(path, 1 << 20), fifo=path)
    assert caught.value.strerror == f"it is {KIND_WORDS[kind]}, not a file"
    assert caught.value.filename == str(path)


def test_read_regular_refuses_a_file_larger_than_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    path.write_bytes(b"x" * 3000)
    assert read_regular(path, 3000) == b"x" * 3000
    with pytest.raises(NotAFile) as caught:
        read_regular(path, 2048)
    assert caught.value.strerror == ("it is 2.93 KiB, more than the 2 KiB a file of this kind "
                                     "may be")


def test_read_regular_keeps_a_missing_file_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "nothing", 10)


@pytest.mark.parametrize("kind", ["fifo", "dir", "zero"])
def test_writes_never_block_on_or_follow_what_is_not_a_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "transcript.jsonl"
    not_a_file(path, kind)
    # A FIFO opened for writing takes 64 KiB and then blocks the writer forever.
    with pytest.raises(OSError) as caught:
        finishes(lambda: [append_record(path, b"y" * 70_000 + b"\n") for _ in range(3)],
                 fifo=path)
    assert isinstance(caught.value, NotAFile), caught.value
    assert not stat.S_ISREG(os.lstat(path).st_mode)      # nothing was put in its place
    if kind == "fifo":
        with pytest.raises(NotAFile):
            open_private(path, os.O_RDWR)
