"""Shared fixtures: every test gets a private data directory and the session a private IPython
directory; ``emulator`` starts emulators; ``middlebox`` starts real proxies
(tests/middleboxes.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True, scope="session")
def ipython_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """IPYTHONDIR points at a fresh tmp directory: the kernels the tests start (nbclient,
    jupyter_client) read no profile or startup file of this machine's, as on a fresh one, and
    log their history there, not in ~/.ipython's database shared with every other kernel."""
    path = tmp_path_factory.mktemp("ipython")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(path))
        yield path


@pytest.fixture(autouse=True)
def data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    """IPY_CTXRECOVERY_DIR points at a fresh tmp directory, so no test touches ~/.local."""
    path = tmp_path_factory.mktemp("ctxstate")
    monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(path))
    for var in ("CHATCLI_MAX_PAYLOAD", "CHATCLI_CONTEXT_WINDOW"):
        monkeypatch.delenv(var, raising=False)
    return path


@pytest.fixture
def emulator() -> Iterator[Callable[..., Any]]:
    """Factory: ``emu = emulator(context_window=2048, max_body="32KB")``, stopped at teardown."""
    from ipy_ctxrecovery.emulator import Emulator

    started: list[Any] = []

    def start(**kwargs: Any) -> Any:
        emu = Emulator(**kwargs)
        emu.__enter__()
        started.append(emu)
        return emu

    yield start
    for emu in reversed(started):
        emu.__exit__(None, None, None)


@pytest.fixture(scope="module")
def middlebox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Factory: ``box = middlebox("squid", emu.url, limit=48 * 1024)`` starts a real
    middlebox in its own tmp directory (tests/middleboxes.py). When its program is missing
    the test is skipped with one line, or fails under ``CI=true``. Every box it started is
    stopped by PID when the module's tests are done (``box.stop()`` ends one sooner)."""
    from middleboxes import missing, start
    from needs import unavailable

    started: list[Any] = []

    def make(kind: str, upstream: str, *, limit: int) -> Any:
        reason = missing(kind)
        if reason is not None:
            unavailable(reason)
        box = start(kind, upstream, limit=limit, workdir=tmp_path_factory.mktemp(kind))
        started.append(box)
        return box

    yield make
    for box in reversed(started):
        box.stop()


@pytest.fixture
def loaded_shell(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The test process's IPython with the extension loaded and no API keys or CHATCLI_*
    settings (so it talks to the embedded emulator with the defaults); unloaded and its
    config cleared after."""
    from IPython.testing import globalipapp

    from ipy_ctxrecovery.settings import ENV_VARS

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", *ENV_VARS):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.config.pop("ChatMagics", None)
    shell.run_line_magic("load_ext", "ipy_ctxrecovery")
    yield shell
    if "ipy_ctxrecovery" in shell.extension_manager.loaded:
        shell.run_line_magic("unload_ext", "ipy_ctxrecovery")
    shell.config.pop("ChatMagics", None)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Any]:
    """An emulator with no limits of its own (a window far above any test's bodies): what a
    real middlebox or gateway sits in front of, one per test module."""
    from ipy_ctxrecovery import Emulator

    with Emulator(context_window=1_000_000) as emu:
        yield emu
