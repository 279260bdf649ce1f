"""One %%chat conversation through a real Jupyter kernel (ipykernel via jupyter_client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kernels
import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

TIMEOUT = 60


@pytest.fixture
def kernel(data_dir: Any) -> Iterator[Any]:
    """A python3 kernel of this environment; it inherits IPY_CTXRECOVERY_DIR (tmp)."""
    with kernels.started_kernel(TIMEOUT) as (manager, client):
        yield client


def run(client: Any, code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; return the execute_reply content and the iopub messages."""
    return kernels.run(client, code, TIMEOUT)


def of_type(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m["content"] for m in messages if m["msg_type"] == kind]


def test_chat_cell_streams_returns_and_fails_in_a_real_kernel(kernel: Any) -> None:
    reply, messages = run(kernel, "%load_ext ipy_ctxrecovery")
    assert reply["status"] == "ok"
    loaded = "".join(s["text"] for s in of_type(messages, "stream"))
    assert "emulator (no OPENAI_API_KEY/ANTHROPIC_API_KEY set)" in loaded

    reply, messages = run(kernel, "%config ChatMagics.stream_interval = 0\n"
                                  "%config ChatMagics.default_model = 'emulator'")
    assert reply["status"] == "ok"

    reply, messages = run(kernel, "%%chat\nhello from a kernel [[words 30]]")
    assert reply["status"] == "ok"
    widget = "application/vnd.jupyter.widget-view+json"
    displays = of_type(messages, "display_data")
    # No panel unless asked (%chat panel), and a routine turn writes no card.
    assert [d for d in displays if widget in d["data"]] == []
    streamed = displays
    assert len(streamed) == 1
    stream_id = streamed[0]["transient"]["display_id"]
    updates = [u for u in of_type(messages, "update_display_data")
               if u["transient"]["display_id"] == stream_id]
    words = " ".join(f"w{i}" for i in range(1, 31))
    # The streamed area ends as the answer itself (formats and metadata): the cell's one
    # answer output, no empty leftover and no second copy as an execute_result.
    assert all(u["data"].get("text/plain") for u in updates)
    assert updates[-1]["data"] == {"text/plain": words, "text/markdown": words}
    meta = updates[-1]["metadata"]["ipy_ctxrecovery"]
    assert meta["model"] == "emulator" and meta["usage"]["completion_tokens"] > 0
    assert of_type(messages, "execute_result") == []
    count = reply["execution_count"]
    reply, messages = run(kernel, f"print(repr(str(_)), Out[{count}] is _, type(_).__name__)")
    printed = "".join(s["text"] for s in of_type(messages, "stream"))
    assert printed == f"{words!r} True Answer\n"  # _ and Out[n] hold the answer

    reply, _ = run(kernel, "from ipy_ctxrecovery.notebook import get_magics\n"
                           "get_magics().workspace.emulator.fail_next(400, message='Model is busy.')")
    assert reply["status"] == "ok"
    reply, messages = run(kernel, "%%chat\nthis one fails")
    assert reply["status"] == "error" and reply["ename"] == "UsageError"
    assert reply["traceback"] == []
    errors = "".join(s["text"] for s in of_type(messages, "stream") if s["name"] == "stderr")
    assert errors.startswith("UsageError: ") and errors.count("\n") == 1
    assert "Traceback" not in errors
