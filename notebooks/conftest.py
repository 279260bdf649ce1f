"""The tutorials run under nbval (``python -m pytest``) as ``notebooks/execute.py`` runs them.

Each notebook's kernel starts with a private, throwaway data directory of its own (so
one notebook's saved sessions never show in another's ``%chat sessions``) and without API
keys, base URLs, proxies or ``CHATCLI_*`` settings: the notebooks use the built-in
emulator, and what they print is what a reader with no configuration sees. The rest of
the test run keeps its environment.

The cells marked ``# NBVAL_CHECK_OUTPUT`` are compared with their saved output after
``nbval_sanitize.cfg`` has replaced ports, temporary paths, dates and timings.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipy_ctxrecovery.notebook.quickstart import clean_environment

HERE = Path(__file__).resolve().parent

STATE_PREFIX = "ipy_ctxrecovery-nb-"
"""As in execute.py: nbval_sanitize.cfg recognises the directories by it."""

_started: set[str] = set()
_made: list[str] = []
"""The kernels' data directories, made where execute.py makes them (the temporary
directory's top level), so the paths the notebooks record — and so the sizes they print —
are as long under nbval as in the saved run."""


def pytest_configure(config: pytest.Config) -> None:
    option = config.option
    if hasattr(option, "nbval_sanitize_with") and option.nbval_sanitize_with is None:
        option.nbval_sanitize_with = str(HERE / "nbval_sanitize.cfg")


def pytest_unconfigure(config: pytest.Config) -> None:
    for state in _made:
        shutil.rmtree(state, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Around the setup of a notebook's first cell (where nbval starts its kernel): the
    kernel's environment."""
    notebook = item.parent
    first = notebook is not None and str(notebook.path).endswith(".ipynb") \
        and str(notebook.path) not in _started
    if not first:
        yield
        return
    assert notebook is not None
    _started.add(str(notebook.path))
    state = tempfile.mkdtemp(prefix=STATE_PREFIX)
    _made.append(state)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_environment(Path(state), saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
