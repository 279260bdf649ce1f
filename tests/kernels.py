"""A real python3 kernel for a test (jupyter_client), and running code in it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def started_kernel(timeout: float) -> Iterator[tuple[Any, Any]]:
    """(manager, client) of a new python3 kernel, shut down after; it inherits the
    environment as it is when it starts."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", startup_timeout=timeout)
    try:
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run(client: Any, code: str, timeout: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; return the execute_reply content and the iopub messages."""
    messages: list[dict[str, Any]] = []
    reply = client.execute_interactive(code, timeout=timeout, output_hook=messages.append,
                                       allow_stdin=False)
    return reply["content"], messages
