"""A scripted fake Provider: a queue of replies/failures and a record of what it was sent.

Like httpx's MockTransport: the session under test talks to it through the real
``Provider`` seam. ``encode`` is a deterministic JSON body (OpenAI-style messages), so
pre-flight measures real, growing byte counts.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ipy_ctxrecovery.core.catalogue import ModelInfo
from ipy_ctxrecovery.core.history import Message, ToolCall, to_openai
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.providers.base import Request, Response, StopReason, TextCallback, Usage

Script = Response | ChatError | str | Callable[[Request], "Response | str"]


def failure(kind: FailureKind, reason: str = "scripted failure", **numbers: Any) -> ChatError:
    return ChatError(Failure(kind, reason, **numbers))


def tool_call_reply(name: str, arguments: dict[str, Any] | str, call_id: str = "call_1",
                    text: str = "") -> Response:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Response(Message.assistant(text, [ToolCall(call_id, name, args)]),
                    StopReason.TOOL_CALLS, Usage(10, 5), 0)


def cut_reply(text: str) -> Response:
    return Response(Message.assistant(text), StopReason.LENGTH, Usage(10, 5), 0)


class FakeProvider:
    """Replies from ``script`` in order; when it runs out, echoes the latest user text."""

    def __init__(self, script: Iterable[Script] = (), *, model: str = "fake",
                 window: int = 8192, max_output: int = 4096) -> None:
        self.model = model
        self.info = ModelInfo(model, window, max_output)
        self.script: deque[Script] = deque(script)
        self.requests: list[Request] = []
        self.bodies: list[bytes] = []
        self.refreshed = 0

    def encode(self, request: Request) -> bytes:
        payload = {"model": self.model, "messages": to_openai(request.messages),
                   "max_tokens": request.max_tokens,
                   "tools": [{"name": t.name, "parameters": dict(t.parameters)}
                             for t in request.tools]}
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")

    def refresh(self) -> None:
        self.refreshed += 1

    def send(self, request: Request, on_text: TextCallback | None = None) -> Response:
        body = self.encode(request)
        self.requests.append(request)
        self.bodies.append(body)
        item: Any = self.script.popleft() if self.script else None
        if callable(item):
            item = item(request)
        if isinstance(item, ChatError):
            raise item
        if item is None:
            latest = next((m.text for m in reversed(request.messages) if m.role == "user"), "")
            item = f"echo: {latest[:60]}"
        if isinstance(item, str):
            item = Response(Message.assistant(item), StopReason.END,
                            Usage(len(body) // 4, len(item) // 4), len(body))
        if on_text and item.message.text:
            on_text(item.message.text)
        return Response(item.message, item.stop, item.usage, len(body), item.raw_stop)


def killed(session: Any) -> Any:
    """What a killed process leaves of ``session``: its files as they are, and no lock (the
    OS frees a dead process's locks), so it can be resumed; the object is not used again."""
    session._files.release()
    return session
