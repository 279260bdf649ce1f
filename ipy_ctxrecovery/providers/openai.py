"""The OpenAI Chat Completions adapter, on the official ``openai`` SDK.

Works with any OpenAI-compatible server (vLLM, Ollama, LM Studio, gateways, the
emulator) through the SDK's own settings: a user-built client is used as is, otherwise
``openai.OpenAI()`` reads ``OPENAI_API_KEY``/``OPENAI_BASE_URL``/proxy variables itself.

``max_tokens`` is sent only when the request sets it, as ``max_completion_tokens`` for
the families that reject ``max_tokens`` (o-series reasoning models, gpt-5 and later) and
as ``max_tokens`` for everything else, which is what OpenAI-compatible servers read. An
option with either name in ``Request.options`` picks the name explicitly.
Streaming asks for ``stream_options={"include_usage": True}`` so usage arrives too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx2
import openai

from ..catalogue import ModelInfo
from ..errors import ConfigError, redact
from ..history import Message, ToolCall, to_openai
from ._common import (
    SDKAdapter,
    incomplete_reply,
    json_size,
    plain,
    split_options,
)
from .base import Request, Response, StopReason, TextCallback, Usage

__all__ = ["OpenAIProvider", "uses_max_completion_tokens"]

STOP_REASONS = {
    "stop": StopReason.END,
    "length": StopReason.LENGTH,
    "tool_calls": StopReason.TOOL_CALLS,
    "function_call": StopReason.TOOL_CALLS,
    "content_filter": StopReason.FILTERED,
}

# Families whose API rejects ``max_tokens`` and wants ``max_completion_tokens``.
_COMPLETION_TOKENS_MODELS = re.compile(r"^(o\d|gpt-5|gpt-[6-9]|codex)")

_RESERVED = frozenset({"model", "messages", "stream", "stream_options", "tools",
                       "max_tokens", "max_completion_tokens"})

# Errors a send can raise below our boundary: the SDK's tree, and httpx2 transport errors
# that escape while a stream is being read.
_SDK_ERRORS: tuple[type[BaseException], ...] = (openai.OpenAIError, httpx2.HTTPError)

NO_KEY_MESSAGE = (
    "No OpenAI key found — set OPENAI_API_KEY (any value for a local OpenAI-compatible "
    "server), pass client=…, or use the emulator."
)


def uses_max_completion_tokens(model_id: str) -> bool:
    """Whether ``model_id`` belongs to a family that wants ``max_completion_tokens``."""
    return bool(_COMPLETION_TOKENS_MODELS.match(model_id.strip().lower().rsplit("/", 1)[-1]))


class OpenAIProvider(SDKAdapter):
    """Chat Completions through ``client.chat.completions.create``."""

    api = "OpenAI"

    def __init__(self, model_id: str, *, client: Any = None, info: ModelInfo | None = None,
                 spec: str | None = None, max_retries: int | None = None,
                 on_close: Callable[[], None] | None = None, owns_client: bool = False) -> None:
        owns_client = owns_client or client is None
        if client is None:
            try:
                client = openai.OpenAI() if max_retries is None else openai.OpenAI(max_retries=max_retries)
            except openai.OpenAIError as exc:
                if "credentials" in str(exc).lower() or "api_key" in str(exc).lower():
                    raise ConfigError(NO_KEY_MESSAGE) from exc
                raise ConfigError(
                    f"The OpenAI client could not be built from the environment: {redact(str(exc))}"
                ) from exc
        else:
            if not hasattr(client, "chat") or isinstance(client, openai.AsyncOpenAI):
                raise ConfigError(
                    f"client={type(client).__name__} is not a synchronous OpenAI client; "
                    "pass openai.OpenAI(...) or openai.AzureOpenAI(...)."
                )
            if max_retries is not None:
                client = client.with_options(max_retries=max_retries)
        self._bind(model_id, client, prefix="openai", endpoint="/chat/completions",
                   connection_error=openai.APIConnectionError, info=info, spec=spec,
                   on_close=on_close, owns_client=owns_client)

    # -- request building ---------------------------------------------------------------
    def _kwargs(self, request: Request, *, convert: bool = True) -> dict[str, Any]:
        self._check_open()
        create = self.client.chat.completions.create
        kwargs, extra = split_options(create, request.options, _RESERVED)
        kwargs["model"] = self.model_id
        kwargs["messages"] = to_openai(request.messages) if convert else []
        if request.tools:
            kwargs["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": plain(t.parameters)}}
                for t in request.tools
            ]
        # An option named max_completion_tokens/max_tokens picks the parameter name (for
        # e.g. Azure deployments whose names hide the family); else the family decides.
        if "max_completion_tokens" in request.options:
            name = "max_completion_tokens"
        elif "max_tokens" in request.options:
            name = "max_tokens"
        else:
            name = "max_completion_tokens" if uses_max_completion_tokens(self.model_id) else "max_tokens"
        limit = request.max_tokens if request.max_tokens is not None else request.options.get(name)
        if limit is not None:
            kwargs[name] = limit
        kwargs["stream"] = request.stream
        if request.stream:
            kwargs["stream_options"] = {"include_usage": True}
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        return client.chat.completions.create(**kwargs)

    def _sdk_errors(self) -> tuple[type[BaseException], ...]:
        return _SDK_ERRORS

    def _messages_size(self, messages: tuple[Message, ...]) -> int:
        sizes = [self._memo.get(m, _message_size) for m in messages]
        return 2 + sum(sizes) + max(len(sizes) - 1, 0)

    def _read_reply(self, result: Any, size: int) -> Response:
        return _read_completion(result, size, self.api)

    def _read_stream(self, stream: Any, on_text: TextCallback | None, size: int) -> Response:
        return _read_stream(stream, on_text, size, self.api)


def _message_size(message: Message) -> int:
    return json_size(to_openai((message,))[0])


# -- reading replies ------------------------------------------------------------------------

def _reasoning_of(obj: Any) -> str | None:
    """``reasoning_content`` (DeepSeek/vLLM) or ``reasoning`` (OpenRouter/Ollama), if sent."""
    for name in ("reasoning_content", "reasoning"):
        value = getattr(obj, name, None)
        if isinstance(value, str) and value:
            return value
    return None


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    return Usage(getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))


def _stop(raw: str | None) -> StopReason:
    return STOP_REASONS.get(raw or "", StopReason.OTHER)


def _read_completion(completion: Any, size: int, api: str) -> Response:
    choices = getattr(completion, "choices", None)
    if not choices:
        raise incomplete_reply(size, api, "the reply has no choices")
    choice = choices[0]
    msg = choice.message
    if msg is None:                      # "message": null from a compatible server
        raise incomplete_reply(size, api, "the reply's choice has no message")
    text = msg.content or getattr(msg, "refusal", None) or ""
    calls = [ToolCall(c.id, c.function.name, c.function.arguments or "{}")
             for c in (msg.tool_calls or ()) if getattr(c, "function", None) is not None]
    message = Message.assistant(text, calls, _reasoning_of(msg))
    raw = choice.finish_reason
    return Response(message, _stop(raw), _usage(completion.usage), size, raw)


class _CallParts:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


def _read_stream(stream: Any, on_text: TextCallback | None, size: int, api: str) -> Response:
    text: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, _CallParts] = {}
    finish: str | None = None
    usage = Usage()
    for chunk in stream:
        if getattr(chunk, "usage", None) is not None:
            usage = _usage(chunk.usage)
        for choice in chunk.choices or ():
            if getattr(choice, "index", 0) not in (0, None):
                continue
            delta = choice.delta
            if delta is not None:
                piece = _reasoning_of(delta)
                if piece:
                    reasoning.append(piece)
                # A refusal streams in its own field; it is the visible answer all the same.
                for piece in (delta.content, getattr(delta, "refusal", None)):
                    if isinstance(piece, str) and piece:
                        text.append(piece)
                        if on_text is not None:
                            on_text(piece)
                for tc in delta.tool_calls or ():
                    _add_call_delta(calls, tc)
            if choice.finish_reason:
                finish = choice.finish_reason
    if finish is None:
        raise incomplete_reply(size, api, "no finish_reason arrived")
    tool_calls = [ToolCall(p.id, p.name, "".join(p.arguments) or "{}")
                  for _, p in sorted(calls.items())]
    message = Message.assistant("".join(text), tool_calls, "".join(reasoning) or None)
    return Response(message, _stop(finish), usage, size, finish)


def _add_call_delta(calls: dict[int, _CallParts], tc: Any) -> None:
    index = tc.index
    if index is None:
        # Some compatible servers omit the index; match by id, else start a new call.
        index = next((i for i, p in calls.items() if tc.id and p.id == tc.id), len(calls))
    parts = calls.setdefault(index, _CallParts())
    if tc.id and not parts.id:
        parts.id = tc.id
    fn = tc.function
    if fn is not None:
        # Most servers send the name once; some repeat it in every chunk, a few split it.
        if fn.name and fn.name != parts.name:
            parts.name = fn.name if not parts.name else parts.name + fn.name
        if fn.arguments:
            parts.arguments.append(fn.arguments)
