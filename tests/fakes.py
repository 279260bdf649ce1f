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
from ipy_ctxrecovery.core.history import Compaction, Message, Role, Text, ToolCall, to_openai
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.providers.base import (
    ContextEdit,
    Request,
    Response,
    StopReason,
    TextCallback,
    Usage,
)

Script = Response | ChatError | str | Callable[[Request], "Response | str"]


def failure(kind: FailureKind, reason: str = "scripted failure", **numbers: Any) -> ChatError:
    return ChatError(Failure(kind, reason, **numbers))


def tool_call_reply(name: str, arguments: dict[str, Any] | str, call_id: str = "call_1",
                    text: str = "") -> Response:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Response(Message.assistant(text, [ToolCall(call_id, name, args)]),
                    StopReason.TOOL_CALLS, Usage(10, 5), 0)


def compaction_reply(text: str, summary: str | None = "the server's summary", *,
                     wire: str = "anthropic", edits: tuple[ContextEdit, ...] = ()) -> Response:
    """A reply that carries a server compaction: its message starts with the
    :class:`Compaction` block (``summary`` None: an opaque one, as OpenAI's), then the
    answer's text — the shape the providers return (docs/server-compaction.md)."""
    if wire == "anthropic":
        data = json.dumps({"type": "compaction", "content": summary})
    else:
        data = json.dumps({"type": "compaction", "id": "cmp_1",
                           "encrypted_content": "gAAAA" + "x" * 40})
    blocks = (Compaction(wire, data, summary), Text(text))
    return Response(Message(Role.ASSISTANT, blocks), StopReason.END, Usage(10, 5), 0,
                    edits=edits)


def cut_reply(text: str) -> Response:
    return Response(Message.assistant(text), StopReason.LENGTH, Usage(10, 5), 0)


class FakeProvider:
    """Replies from ``script`` in order; when it runs out, echoes the latest user text."""

    def __init__(self, script: Iterable[Script] = (), *, model: str = "fake",
                 window: int = 8192, max_output: int = 4096, wire: str | None = None,
                 server_compaction: bool = False, min_compact_trigger: int = 0,
                 compacts: bool = False) -> None:
        self.model = model
        self.info = ModelInfo(model, window, max_output, server_compaction=server_compaction,
                              min_compact_trigger=min_compact_trigger)
        if wire is not None:
            self.wire = wire    # "anthropic": its API carries server compaction
        self.compacts = compacts
        """Answer like a server that compacts: a request past its ``compact_trigger``
        (input tokens, a quarter of the body's bytes) gets a compaction and an echo."""
        self.compactions = 0
        self.script: deque[Script] = deque(script)
        self.requests: list[Request] = []
        self.bodies: list[bytes] = []
        self.refreshed = 0

    def encode(self, request: Request) -> bytes:
        payload: dict[str, Any] = {
            "model": self.model, "messages": to_openai(request.messages),
            "max_tokens": request.max_tokens,
            "tools": [{"name": t.name, "parameters": dict(t.parameters)}
                      for t in request.tools]}
        # A server compaction is sent back verbatim (as the providers do), and what the
        # request asks of the server's context management is in the body too.
        compactions = [b.data for m in request.messages for b in m.blocks
                       if isinstance(b, Compaction)]
        if compactions:
            payload["compactions"] = compactions
        if request.context is not None:
            context = request.context
            payload["context_management"] = {
                "compact_trigger": context.compact_trigger,
                "clear_tool_uses": None if context.clear_tool_uses is None else
                context.clear_tool_uses.trigger}
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
            trigger = request.context.compact_trigger if request.context else None
            if self.compacts and trigger is not None and len(body) // 4 > trigger:
                self.compactions += 1
                reply = compaction_reply(item, f"summary {self.compactions} of "
                                               f"{len(request.messages)} messages")
                item = Response(reply.message, reply.stop, Usage(len(body) // 4, 5),
                                len(body))
        if isinstance(item, str):
            item = Response(Message.assistant(item), StopReason.END,
                            Usage(len(body) // 4, len(item) // 4), len(body))
        if on_text and item.message.text:
            on_text(item.message.text)
        return Response(item.message, item.stop, item.usage, len(body), item.raw_stop,
                        edits=item.edits, response_id=item.response_id)


def killed(session: Any) -> Any:
    """What a killed process leaves of ``session``: its files as they are, and no lock (the
    OS frees a dead process's locks), so it can be resumed; the object is not used again."""
    session._files.release()
    return session
