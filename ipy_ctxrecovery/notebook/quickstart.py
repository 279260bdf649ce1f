"""``python -m ipy_ctxrecovery quickstart``: run the quickstart notebook on the emulator and
tell its story in the terminal, cell by cell, then say where the executed copy is.

A newcomer's first command: no key, no network (the notebook talks to the built-in
emulator on 127.0.0.1), and nothing of theirs touched — the kernel runs with no API keys
and no ``CHATCLI_*`` settings, its session files go to a directory of the run's own, and
the executed notebook is written next to them, never over the committed one.
:func:`execute` is also how ``notebooks/execute.py`` re-executes the tutorials.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._files import ensure_private_dir, write_private_atomic

__all__ = ["QUICKSTART", "clean_environment", "execute", "main", "story_lines"]

QUICKSTART = "00_quickstart.ipynb"

_DROPPED = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL",
            "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY",
            "https_proxy", "http_proxy", "all_proxy")
"""Variables that would send the tutorials elsewhere or change their story."""

SOURCE_LINES = 4
"""A cell's source is shown whole up to this many lines, else its first lines and a count."""

PROSE_LINES = 3
"""The lines of a section's text shown (of a cell without a heading: its first sentence,
in one line fewer); the notebook has the rest."""

ANSWER_RUN = 3
"""Answers in a row shown in full up to this many, else the first, a count and the last."""

RICH_LINES = 3
"""The lines of a rich display's text (a turn card) shown; the notebook shows it whole."""

WIDTH = 92
"""Where a markdown cell's text is wrapped."""


def clean_environment(state_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The kernel's environment: ``base`` (default: this process's) without API keys, base
    URLs, proxies or ``CHATCLI_*`` settings, with session files under ``state_dir``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in _DROPPED and not k.startswith("CHATCLI_")}
    env["IPY_CTXRECOVERY_DIR"] = str(state_dir)
    return env


def _kernel_manager() -> Any:
    """A kernel manager that runs ipykernel with this very interpreter (the one that has
    ipy_ctxrecovery installed), whatever kernelspec ``python3`` names elsewhere."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f",
                                    "{connection_file}"],
                              display_name="Python 3 (ipykernel)", language="python",
                              resource_dir="")

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def execute(notebook: Path, *, cwd: Path, env: Mapping[str, str],
            on_cell: Callable[[Any, int], None] | None = None,
            before_cell: Callable[[Any, int], None] | None = None,
            timeout: int = 300, kernel_log: Path | None = None) -> tuple[Any, Any]:
    """Run the cells of ``notebook`` in a fresh kernel (``cwd``, ``env``) until one raises.

    Returns the executed notebook (``nbformat.NotebookNode``, with no timing metadata and
    no widget state) and ``nbclient``'s ``CellExecutionError`` of the cell that raised, or
    None. ``before_cell``/``on_cell`` see each cell before it runs and once its outputs are
    in. ``kernel_log``: where the kernel process's own messages go (default: this stderr).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(notebook, as_version=4)
    hooks: dict[str, Any] = {}
    if before_cell is not None:
        hooks["on_cell_start"] = lambda cell, cell_index: before_cell(cell, cell_index)
    if on_cell is not None:
        hooks["on_cell_executed"] = lambda cell, cell_index, execute_reply: on_cell(
            cell, cell_index)
    client = NotebookClient(nb, km=_kernel_manager(), timeout=timeout,
                            record_timing=False, store_widget_state=False,
                            resources={"metadata": {"path": str(cwd)}}, **hooks)
    failed = None
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(kernel_log.open("ab")) if kernel_log is not None else None
        try:
            client.execute(env=dict(env), cwd=str(cwd),
                           **({"stderr": log, "stdout": log} if log is not None else {}))
        except CellExecutionError as e:
            failed = e
    nb.metadata.pop("widgets", None)
    return nb, failed


# -- the story in the terminal ------------------------------------------------------------------

def _text(output: Any) -> str:
    """What a person reads of one output: stream text, text/plain, or the error line."""
    kind = output.get("output_type")
    if kind == "stream":
        return str(output.get("text", ""))
    if kind in ("display_data", "execute_result"):
        return str(output.get("data", {}).get("text/plain", ""))
    if kind == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    return ""


def _is_answer(output: Any) -> bool:
    """A ``%%chat`` answer (shown as markdown), as opposed to status lines and turn cards."""
    return "text/markdown" in output.get("data", {})


def _output_lines(outputs: Sequence[Any]) -> list[str]:
    """The outputs' text; each answer on one line, and a run of more than
    :data:`ANSWER_RUN` answers in a row shortened to its first and last."""
    lines: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) > ANSWER_RUN:
            run[1:-1] = [f"… ({len(run) - 2} more answers like these)"]
        lines.extend(run)
        run.clear()

    for output in outputs:
        if _is_answer(output):
            run.append(" ".join(_text(output).split()))
            continue
        flush()
        text = _text(output).rstrip("\n").splitlines()
        if "text/html" in output.get("data", {}) and len(text) > RICH_LINES + 1:
            # A turn card: its first lines (what was sent, the history after); its steps
            # repeat the status lines above it.
            text = text[:RICH_LINES] + [f"  … ({len(text) - RICH_LINES} more lines on the "
                                        "card in the notebook)"]
        lines.extend(text)
    flush()
    return lines


def _prose(markdown: str, most: int, *, sentence: bool = False) -> list[str]:
    """The start of a markdown cell's text as plain wrapped lines: its first paragraph (and
    the list item after it when it ends with ":"), or only its first sentence; emphasis
    and link targets dropped; at most ``most`` lines, the last ending in "…" when there is
    more."""
    blocks: list[str] = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            blocks.append("")
        elif stripped.startswith(("- ", "* ", "1. ")) or not blocks or not blocks[-1]:
            blocks.append(stripped)
        else:
            blocks[-1] += " " + stripped
    blocks = [b for b in blocks if b]
    shown = blocks[:2] if blocks and blocks[0].endswith(":") else blocks[:1]
    if sentence and shown:
        first, *rest = re.split(r"(?<=[.!?])\s+", shown[0], maxsplit=1)
        shown, blocks = [first], [first, *rest, *blocks[1:]]
    lines: list[str] = []
    for block in shown:
        text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", block).replace("**", "")
        text = re.sub(r"(?<![\w*])\*([^*]+)\*(?![\w*])", r"\1", text)
        lines += textwrap.wrap(text, WIDTH, subsequent_indent="  " if text[:2] == "- " else "")
    if len(lines) > most or len(shown) < len(blocks):
        lines = lines[:most]
        lines[-1] += " …"
    return lines


def story_lines(cell: Any) -> list[str]:
    """The lines the terminal shows for one cell: a markdown cell's first heading and the
    start of its text; a code cell's source (cut after a few lines, without the test
    markers) under an ``In [n]`` prompt, then what its outputs say (the status lines, the
    turn cards' text, the answers — one line each, a long run of them shortened)."""
    if cell.get("cell_type") == "markdown":
        text = str(cell.source)
        headings = [line.lstrip("#").strip() for line in text.splitlines()
                    if line.startswith("#")]
        if headings:
            return [f"\n== {headings[0]} =="] + _prose(text, PROSE_LINES)
        return _prose(text, PROSE_LINES - 1, sentence=True)
    if cell.get("cell_type") != "code":
        return []
    source = [line for line in str(cell.source).splitlines()
              if line.strip() and not line.startswith("# NBVAL_")]
    shown = source if len(source) <= SOURCE_LINES else source[: SOURCE_LINES - 1]
    prompt = f"In [{cell.get('execution_count') or ' '}]: "
    lines = [(prompt if i == 0 else "...: ".rjust(len(prompt))) + line
             for i, line in enumerate(shown)]
    if len(shown) < len(source):
        lines.append(" " * len(prompt) + f"… ({len(source) - len(shown)} more lines)")
    return lines + _output_lines(cell.get("outputs", ()))


def _notebooks_dir() -> Path | None:
    """The tutorials next to the package (a source checkout), else under the cwd."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "notebooks" / QUICKSTART).is_file():
            return root / "notebooks"
    return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad usage is one sentence and exit status 2, not argparse's usage block."""
        self.exit(2, f"quickstart: {message}; python -m ipy_ctxrecovery quickstart --help "
                     "lists the options.\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m ipy_ctxrecovery quickstart",
        description="Run the quickstart notebook on the built-in emulator (no API key, no "
                    "network), show what each cell sent, what failed and how it recovered, and "
                    "write the executed notebook to open.")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="PATH",
                   help="where to write the executed notebook (default: a new directory "
                        "under the system's temporary directory)")
    p.add_argument("--notebook", type=Path, default=None, metavar="PATH",
                   help=f"the notebook to run (default: notebooks/{QUICKSTART})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the quickstart; 0 when every cell ran, 1 when one failed, 2 for bad usage."""
    args = _parser().parse_args(argv)
    notebook = args.notebook
    if notebook is None:
        found = _notebooks_dir()
        if found is None:
            print(f"quickstart: notebooks/{QUICKSTART} is not here; run this from the "
                  "ipy_ctxrecovery source checkout, or give --notebook PATH.", file=sys.stderr)
            return 2
        notebook = found / QUICKSTART
    if not notebook.is_file():
        print(f"quickstart: {notebook} is not a notebook file; give --notebook PATH.",
              file=sys.stderr)
        return 2
    try:
        import nbclient  # noqa: F401
    except ImportError:
        print("quickstart: nbclient is not installed; pip install -e '.[notebook]' adds it.",
              file=sys.stderr)
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="ipy_ctxrecovery-quickstart-"))
    output = args.output if args.output is not None else run_dir / notebook.name
    if output.is_dir():
        output = output / notebook.name
    if output.resolve() == notebook.resolve():
        print("quickstart: --output must not be the notebook itself; give another path.",
              file=sys.stderr)
        return 2
    state = run_dir / "state"
    print(f"Running {notebook} on the built-in emulator: no API key, nothing leaves "
          f"127.0.0.1 (session files under {state}).", flush=True)

    def on_cell(cell: Any, index: int) -> None:
        for line in story_lines(cell):
            print(line, flush=True)

    def on_markdown(cell: Any, index: int) -> None:
        if cell.get("cell_type") == "markdown":
            on_cell(cell, index)

    try:
        executed, failed = execute(notebook, cwd=notebook.parent.parent,
                                   env=clean_environment(state), on_cell=on_cell,
                                   before_cell=on_markdown, kernel_log=run_dir / "kernel.log")
    except KeyboardInterrupt:
        print("\nquickstart: interrupted; nothing was written.", file=sys.stderr)
        return 1
    import nbformat

    try:
        # Private like every file the package writes: it holds the run's session ids/paths.
        ensure_private_dir(output.parent)
        write_private_atomic(output, nbformat.writes(executed))
    except OSError as e:
        print(f"\nquickstart: the executed notebook could not be written to {output} "
              f"({e.strerror or e}); give another --output PATH.", file=sys.stderr)
        return 1
    print()
    if failed is not None:
        print(f"✗ a cell failed ({getattr(failed, 'ename', 'error')}: "
              f"{getattr(failed, 'evalue', failed)}); the notebook as far as it ran is in "
              f"{output}", file=sys.stderr)
        return 1
    print(f"✓ the executed notebook is at {output}")
    print(f"  open it with: jupyter notebook {output}")
    return 0
