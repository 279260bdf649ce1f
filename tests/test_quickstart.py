"""``python -m ipy_ctxrecovery quickstart``: a newcomer's first command tells the story in the
terminal and leaves an executed notebook to open, without touching the committed one."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ipy_ctxrecovery.notebook.quickstart import story_lines

pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "notebooks" / "00_quickstart.ipynb"


def _env() -> dict[str, str]:
    """This process's environment as a newcomer has it: no keys, base URLs or settings;
    the package imported from this checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.endswith(("_API_KEY", "_BASE_URL")) and not k.startswith("CHATCLI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipy_ctxrecovery", *args], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def first_contact(tmp_path_factory: pytest.TempPathFactory) -> tuple[
        subprocess.CompletedProcess[str], Path, str]:
    """One run, with an existing directory as --output: the notebook is written inside it."""
    before = hashlib.sha256(COMMITTED.read_bytes()).hexdigest()
    directory = tmp_path_factory.mktemp("quickstart")
    return _run("quickstart", "--output", str(directory)), directory / COMMITTED.name, before


def test_the_terminal_tells_the_story(first_contact):
    result, output, _ = first_contact
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Traceback" not in out + result.stderr
    # what was sent: the first message and the loop that outgrows the proxy
    assert "Hello! In one sentence, what is a context window?" in out
    assert 'you said "Part 1 of the logs:' in out
    # the rejection by the proxy, and how it recovered
    assert "⚠ Recoverable failure (payload too large (413))" in out
    assert "ℹ Learned a payload limit of about" in out
    assert "✓ Recovered after 1 recovery step" in out
    assert 'you said "Part 15 of the logs:' in out
    assert "1 rejected by the proxy" in out
    # every section heading has something under it (the markdown's text, shortened)
    lines = out.splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("== ")]
    assert len(headings) >= 5
    for i in headings:
        assert lines[i + 1].strip() and not lines[i + 1].startswith("=="), lines[i]
    assert "== What to do in your own setup ==" in out
    assert "OPENAI_API_KEY" in out[out.index("== What to do in your own setup =="):]
    # where the executed notebook was written
    assert f"✓ the executed notebook is at {output}" in out
    assert len(lines) < 130, f"{len(lines)} lines: the story should fit a screen or two"


def test_the_executed_notebook_opens_with_outputs(first_contact):
    result, output, _ = first_contact
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    nb = nbformat.read(output, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    texts = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                    for c in code for o in c.outputs)
    assert "Recovered after 1 recovery step" in texts
    assert not any(o.output_type == "error" for c in code for o in c.outputs)


def test_the_committed_notebook_is_untouched(first_contact):
    result, output, before = first_contact
    assert result.returncode == 0, result.stderr
    assert output.resolve() != COMMITTED.resolve()
    assert hashlib.sha256(COMMITTED.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("args, says", [
    (["quickstart", "--bogus"], "unrecognized arguments: --bogus"),
    (["quickstart", "--output"], "--output"),
    (["quickstart", "--notebook", "no/such/notebook.ipynb"], "is not a notebook file"),
    (["quickstart", "--output", str(COMMITTED)], "must not be the notebook itself"),
    (["frobnicate"], "no command 'frobnicate'"),
])
def test_bad_arguments_are_one_sentence_and_exit_2(args, says):
    before = hashlib.sha256(COMMITTED.read_bytes()).hexdigest()
    result = _run(*args, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    message = result.stderr.strip()
    assert says in message and len(message.splitlines()) == 1, message
    assert "Traceback" not in message
    assert hashlib.sha256(COMMITTED.read_bytes()).hexdigest() == before


def test_answers_one_line_each_cards_their_head_markdown_its_first_lines():
    answers = [nbformat.v4.new_output("execute_result", data={
        "text/markdown": f"reply {i}\nsecond line", "text/plain": f"reply {i}\nsecond line"})
        for i in range(1, 8)]
    cell = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nfor i in range(7): chat(i)",
                                     outputs=answers, execution_count=3)
    assert story_lines(cell) == ["In [3]: for i in range(7): chat(i)", "reply 1 second line",
                                 "… (5 more answers like these)", "reply 7 second line"]
    card = nbformat.v4.new_output("display_data", data={
        "text/html": "<table>…</table>",
        "text/plain": "turn · ✓ answered\n  before  32 KB\n  after   5 KB\n  ✗ send\n  ✓ send"})
    status = nbformat.v4.new_output("stream", text="⚠ Recoverable failure\n✓ Recovered\n")
    cell = nbformat.v4.new_code_cell("%%chat\nhi", outputs=[status, card], execution_count=4)
    assert story_lines(cell) == [
        "In [4]: %%chat", "   ...: hi", "⚠ Recoverable failure", "✓ Recovered",
        "turn · ✓ answered", "  before  32 KB", "  after   5 KB",
        "  … (2 more lines on the card in the notebook)"]
    md = nbformat.v4.new_markdown_cell(
        "## What happened\n\nThe **proxy** refused\none request: see [the card](#card).\n\n"
        "Second paragraph, not shown.")
    assert story_lines(md) == ["\n== What happened ==",
                               "The proxy refused one request: see the card. …"]
    assert story_lines(nbformat.v4.new_markdown_cell(
        "Now a conversation that outgrows it. Watch the lines.")) == [
        "Now a conversation that outgrows it. …"]
