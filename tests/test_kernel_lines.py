"""What a real Jupyter kernel shows (ipykernel via jupyter_client): Ctrl-C during a request
is one line and keeps the history; the load line comes after the warnings it depends on;
``run_cell_magic`` as a cell's last expression shows its answer once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kernels
import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

TIMEOUT = 60


@pytest.fixture
def kernel(data_dir: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """(manager, client) of a python3 kernel; it inherits the environment set before it."""
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "lots")        # a warning the load line follows
    with kernels.started_kernel(TIMEOUT) as (manager, client):
        yield manager, client


def run(client: Any, code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; return the execute_reply content and the iopub messages."""
    return kernels.run(client, code, TIMEOUT)


def of_type(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m["content"] for m in messages if m["msg_type"] == kind]


def test_interrupt_warnings_and_last_expression_in_a_real_kernel(
        kernel: tuple[Any, Any], tmp_path: Path) -> None:
    manager, client = kernel
    reply, messages = run(client, "%load_ext ipy_ctxrecovery")
    streams = [(s["name"], s["text"]) for s in of_type(messages, "stream")]
    names = [name for name, _ in streams]
    # The warning it depends on first; the load line (stdout) last, saying the cap is off.
    assert names.index("stderr") < names.index("stdout")
    assert streams[-1][0] == "stdout" and "no payload cap configured" in streams[-1][1]
    assert "ignoring CHATCLI_MAX_PAYLOAD" in "".join(t for n, t in streams if n == "stderr")

    reply, _ = run(client, "%config ChatMagics.show_panel = False\n"
                           "%config ChatMagics.stream_interval = 0\n"
                           "get_ipython().run_cell_magic('chat', '', 'warm up')")
    assert reply["status"] == "ok"

    # run_cell_magic as the last expression: the answer's display area, and nothing else.
    reply, messages = run(client, "get_ipython().run_cell_magic('chat', '', '[[words 5]]')")
    words = "w1 w2 w3 w4 w5"
    assert of_type(messages, "execute_result") == []
    shown = [d["data"]["text/plain"] for d in of_type(messages, "display_data")]
    updates = [u["data"]["text/plain"] for u in of_type(messages, "update_display_data")]
    assert len(shown) == 1 and (updates or shown)[-1] == words

    # Ctrl-C while the request waits on the emulator: one line, the history as it was.
    marker = tmp_path / "sending"
    reply, _ = run(client, f"""
from ipy_ctxrecovery.notebook import get_magics
magics = get_magics()
magics.workspace.emulator.latency = 30
session = magics.workspace.session()
before = len(session.history)
session.subscribe(lambda e: open({str(marker)!r}, "w").close()
                  if type(e).__name__ == "Preflight" else None)
""")
    assert reply["status"] == "ok"
    msg_id = client.execute("%%chat\nthis request is interrupted")
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.05)
    manager.interrupt_kernel()
    errors: list[dict[str, Any]] = []
    streamed: list[str] = []
    while True:
        message = client.get_iopub_msg(timeout=TIMEOUT)
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "error":
            errors.append(message["content"])
        elif message["msg_type"] == "stream":
            streamed.append(message["content"]["text"])
        elif message["msg_type"] == "status" and \
                message["content"]["execution_state"] == "idle":
            break
    assert len(errors) == 1
    assert errors[0]["traceback"] == [
        "KeyboardInterrupt: the request was interrupted — the working history is as it was "
        "before this cell (4 messages); your message stays in the transcript."]
    assert not any("Traceback" in text or "httpcore" in text for text in streamed)
    reply, messages = run(client, "magics.workspace.emulator.latency = 0\n"
                                  "print(len(session.history) == before, before)")
    assert "".join(s["text"] for s in of_type(messages, "stream")) == "True 4\n"
