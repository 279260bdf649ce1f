"""The README's Python examples run as written (against the emulator, no network)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    # The corporate-gateway example builds a client only; it must not need a real key.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-example-not-a-real-key")
    namespace: dict[str, object] = {"__name__": f"readme_example_{index}"}
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), namespace)
    session = namespace.get("session") or namespace.get("s")
    if hasattr(session, "close"):
        session.close()  # type: ignore[union-attr]
    assert "sk-readme-example" not in capsys.readouterr().out


# -- the sample session is produced by running it ---------------------------------------------------

SESSION = re.search(r"## A first session\n.*?```text\n(.*?)```", README.read_text(encoding="utf-8"),
                    re.S)
_PORT = re.compile(r"127\.0\.0\.1:\d+")


def session_cells(block: str) -> list[tuple[int, str, list[str]]]:
    """(execution count, source, output lines) of each ``In [n]:`` cell of a transcript."""
    cells: list[tuple[int, str, list[str]]] = []
    for line in block.splitlines():
        prompt = re.match(r"In \[(\d+)\]: (.*)", line)
        if prompt:
            cells.append((int(prompt.group(1)), prompt.group(2), []))
        elif line.startswith("   ...: ") and cells and not cells[-1][2]:
            n, source, out = cells[-1]
            cells[-1] = (n, source + "\n" + line[len("   ...: "):], out)
        elif cells:
            cells[-1][2].append(line)
    return [(n, source, _trimmed(out)) for n, source, out in cells]


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def test_the_first_session_is_what_running_it_prints(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from IPython.testing import globalipapp

    assert SESSION is not None, "README.md has no ```text block under 'A first session'"
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "HTTPS_PROXY",
                "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()
    ip = globalipapp.get_ipython()
    if "ipy_ctxrecovery" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
    ip.config.pop("ChatMagics", None)
    cells = session_cells(SESSION.group(1))
    assert len(cells) >= 5
    # The shared test shell has run other tests' cells (one here stands for them). The
    # transcript numbers its cells from In [1], so it is replayed as a session of its own: a
    # fresh history session, as a new IPython starts, or its line numbers collide with those
    # already logged and IPython says "Session/line number was not unique in database".
    ip.run_cell("pass", store_history=True)
    history = ip.history_manager
    history.reset(new_session=True)
    try:
        for count, source, expected in cells:
            ip.execution_count = count
            capsys.readouterr()
            result = ip.run_cell(source, store_history=True)
            assert result.success, (source, result.error_in_exec)
            captured = capsys.readouterr()
            shown = _trimmed((captured.out + captured.err).splitlines())
            assert [_PORT.sub("127.0.0.1:PORT", line) for line in shown] == \
                [_PORT.sub("127.0.0.1:PORT", line) for line in expected], source
        history.writeout_cache()
        assert "not unique" not in "".join(capsys.readouterr())
        logged = history.db.execute("SELECT line, source_raw FROM history WHERE session = ?",
                                    (history.session_number,)).fetchall()
        assert logged == [(count, source) for count, source, _ in cells]
    finally:
        if "ipy_ctxrecovery" in ip.extension_manager.loaded:
            ip.run_line_magic("unload_ext", "ipy_ctxrecovery")
