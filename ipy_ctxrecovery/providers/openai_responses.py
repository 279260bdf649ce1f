"""The OpenAI Responses API adapter, on the official ``openai`` SDK (``client.responses``).

The same client as :mod:`.openai` (a user-built one as is, else ``openai.OpenAI()`` from
the environment) and the same skeleton (``SDKAdapter``: the body from a per-shape
template, ``measure == len(encode)`` exactly, the fast send, every SDK error a
ChatError). What differs is the wire:

* The history goes as ``input`` items (:func:`to_items`): system and user messages as
  messages with a string content (``{"role": "system"|"user", "content": …}``), an
  assistant message as its blocks in order — a ``Compaction`` of this wire as the item the
  server wrote (verbatim), of another wire as an assistant message of its summary (left
  out without one), a ``Reasoning`` with an item id and ``encrypted_content`` as that
  ``reasoning`` item (others are left out: the API cannot read them; so is one that no
  text or tool call of its answer follows — an empty answer —, which the API refuses),
  text as an assistant message, tool calls as ``function_call`` items — and a tool
  result as a ``function_call_output`` item. Items need no merging (the API has no role
  alternation to keep), so a body is its messages' items side by side.
* ``max_output_tokens`` only when the request sets it, at least 16 (the API refuses
  less: "Invalid 'max_output_tokens': integer below minimum value. Expected a value >=
  16", tests/corpus/openai_responses_max_output_tokens_below_min.json). A reply cut there
  (``status: "incomplete"``, ``incomplete_details.reason: "max_output_tokens"``) is
  ``StopReason.LENGTH``, so the package's continuation runs as on Chat Completions.
* Reasoning items are carried between turns without server state: ``store`` is false and,
  for a reasoning model (:func:`encrypts_reasoning`; the emulator's too),
  ``include: ["reasoning.encrypted_content"]`` asks for the encrypted reasoning, which
  goes back with its id on the next turn. Other models refuse that ``include``.
* ``Request.context.compact_trigger`` is ``context_management: [{"type": "compaction",
  "compact_threshold": N}]``; the reply then starts with a ``compaction`` item, returned
  as ``Compaction("openai", data, None)`` at the head of the assistant message (the
  session splits it off). ``compact_instructions`` and the Anthropic edits have no field
  here and are left out.
* ``store=True`` (the ``openai_store`` setting): ``store: true`` and, when a request's
  items start with everything one of the last few stored replies covered (its request
  and its answer), only the new items after that ``previous_response_id``. Any change of that prefix (a compaction,
  a removed message) sends the whole input again. A ``previous_response_not_found``
  (the server forgot it) drops the chain and is a transient failure: the next attempt
  sends everything.
* ``count_tokens`` (``base.CountsTokens``): ``client.responses.input_tokens.count`` of
  the same input, one bounded request.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx2
import openai

from ..core.catalogue import ModelInfo
from ..core.history import (
    Compaction,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
)
from ..errors import ChatError, ConfigError, redact
from ..failures import FailureKind
from ._common import (
    SDKAdapter,
    StreamProgress,
    converted_size,
    field,
    incomplete_reply,
    json_size,
    openai_cache_parameters,
    plain,
    split_options,
)
from ._guard import ReplyRefused
from ._replies import no_answer
from ._wire import for_body
from .base import Prepared, Request, Response, StopReason, TextCallback, Usage
from .openai import NO_KEY_MESSAGE, OpenAIProvider, uses_max_completion_tokens

__all__ = ["MIN_OUTPUT_TOKENS", "OpenAIResponsesProvider", "encrypts_reasoning", "from_output",
           "to_items"]

MIN_OUTPUT_TOKENS = 16
"""The least ``max_output_tokens`` the API takes."""
COUNT_TIMEOUT = 10.0
"""Seconds ``count_tokens`` waits for its one request."""
ENCRYPTED_REASONING = "reasoning.encrypted_content"
_CHAINS = 4
"""Stored replies whose chains are remembered (``store``)."""

_RESERVED = frozenset({"model", "input", "instructions", "stream", "tools",
                       "max_output_tokens", "max_tokens", "max_completion_tokens", "store",
                       "previous_response_id", "include", "context_management"})

_SDK_ERRORS: tuple[type[BaseException], ...] = (openai.OpenAIError, httpx2.HTTPError)

_INCOMPLETE_STOPS = {"max_output_tokens": StopReason.LENGTH,
                     "content_filter": StopReason.FILTERED}


# -- the history as items ---------------------------------------------------------------

def encrypts_reasoning(model_id: str) -> bool:
    """Whether the model is of a reasoning family (o-series, gpt-5 and later, codex; not
    the ``-chat`` ones), whose reasoning the API hands back encrypted. Any other model
    refuses the ``include``: 400 "Encrypted content is not supported with this model."
    (param ``include``: pydantic/pydantic-ai#2865, ShishirPatil/gorilla#1148)."""
    name = model_id.strip().lower().rsplit("/", 1)[-1]
    return uses_max_completion_tokens(model_id) and "-chat" not in name


def _message_items(message: Message) -> tuple[dict[str, Any], ...]:
    """The input items of one message (module docstring)."""
    role = message.role
    if role is Role.TOOL:
        result = message.tool_result
        assert result is not None
        return ({"type": "function_call_output", "call_id": result.call_id,
                 "output": for_body(result.content)},)
    if role is not Role.ASSISTANT:
        return ({"role": role.value, "content": for_body(message.text)},)
    items: list[dict[str, Any]] = []
    for block in message.blocks:
        if isinstance(block, Compaction):
            if block.wire == "openai":
                items.append(json.loads(block.data))
            elif block.summary:
                items.append({"role": "assistant", "content": for_body(block.summary)})
        elif isinstance(block, Reasoning):
            if block.id and block.signature:
                items.append({"type": "reasoning", "id": block.id,
                              "summary": [{"type": "summary_text", "text": for_body(block.text)}]
                              if block.text else [],
                              "encrypted_content": block.signature})
        elif isinstance(block, Text):
            if block.chars:
                items.append({"role": "assistant", "content": for_body(block.text)})
        elif isinstance(block, ToolCall):
            items.append({"type": "function_call", "call_id": block.id, "name": block.name,
                          "arguments": for_body(block.arguments)})
        elif isinstance(block, ToolResult):      # not in an assistant message; kept whole
            items.append({"type": "function_call_output", "call_id": block.call_id,
                          "output": for_body(block.content)})
    return tuple(_answered_reasoning(items))


def _answered_reasoning(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` without the reasoning items nothing of their answer follows: an answer
    that was its reasoning alone (an empty text) is refused whole by the API when sent
    back — 400 "Item 'rs_…' of type 'reasoning' was provided without its required
    following item." (continuedev/continue#8933) — on every later turn."""
    kept: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "reasoning":
            pending.append(item)
            continue
        if item.get("role") == "assistant" or item.get("type") == "function_call":
            kept.extend(pending)
        pending = []
        kept.append(item)
    return kept


def to_items(history: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``input`` of a request: every message's items in order."""
    return [item for m in history for item in _message_items(m)]


# -- the reply as a message ---------------------------------------------------------------

def _as_dict(item: Any) -> dict[str, Any]:
    if type(item) is dict:
        return item
    to_dict = getattr(item, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(item)


def _parts_text(parts: Any) -> str:
    out = []
    for part in parts or ():
        kind = field(part, "type")
        if kind == "output_text":
            out.append(field(part, "text") or "")
        elif kind == "refusal":
            out.append(field(part, "refusal") or "")
    return "".join(out)


def from_output(output: Sequence[Any]) -> Message:
    """The assistant message of a reply's ``output`` items: a compaction first (as the
    server put it), then reasoning, text and tool calls in order."""
    blocks: list[Any] = []
    for item in output or ():
        kind = field(item, "type")
        if kind == "compaction":
            data = json.dumps(_as_dict(item), ensure_ascii=False, separators=(",", ":"))
            blocks.append(Compaction("openai", data, None))
        elif kind == "reasoning":
            text = "".join(field(s, "text") or "" for s in field(item, "summary") or ())
            blocks.append(Reasoning(text, field(item, "encrypted_content"), field(item, "id")))
        elif kind == "message":
            text = _parts_text(field(item, "content"))
            if text:
                blocks.append(Text(text))
        elif kind == "function_call":
            blocks.append(ToolCall(field(item, "call_id") or "", field(item, "name") or "",
                                   field(item, "arguments") or "{}"))
    return Message(Role.ASSISTANT, tuple(blocks))


def _usage(usage: Any) -> Usage:
    """``ResponseUsage``: the whole input (cache reads included), the output, the reads."""
    if usage is None:
        return Usage()
    details = field(usage, "input_tokens_details")
    cached = field(details, "cached_tokens") if details is not None else None
    return Usage(field(usage, "input_tokens"), field(usage, "output_tokens"),
                 cached if isinstance(cached, int) else 0)


def _stop(response: Any, message: Message) -> tuple[StopReason, str | None]:
    status = field(response, "status")
    if status == "incomplete":
        details = field(response, "incomplete_details")
        reason = field(details, "reason") if details is not None else None
        return _INCOMPLETE_STOPS.get(reason or "", StopReason.OTHER), reason or status
    if status == "completed":
        return (StopReason.TOOL_CALLS if message.tool_calls else StopReason.END), status
    return StopReason.OTHER, status


def _failed(response: Any, request: Any = None) -> openai.APIError:
    """The SDK's error for a ``response.failed`` (or an ``error`` event without a body)."""
    error = field(response, "error")
    body = _as_dict(error) if error is not None else {"message": "response failed"}
    message = body.get("message") if isinstance(body.get("message"), str) else None
    return openai.APIError(message or "The response failed.", request, body=body)


class _Refused(ReplyRefused, openai.OpenAIError):
    """A reply refused for its size (``_guard``), as the SDK's own error: not retried."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Chain:
    """What the last stored reply covered: its request's items and its answer's."""

    response_id: str
    items: tuple[Any, ...]


class OpenAIResponsesProvider(SDKAdapter):
    """The Responses API through ``client.responses.create``."""

    api = "OpenAI Responses"
    wire = "openai"
    server_compaction = True
    """The API carries a server compaction (``session/server_side.api_supports``)."""
    plain_client = openai.OpenAI
    refusal = _Refused

    def __init__(self, model_id: str, *, client: Any = None, info: ModelInfo | None = None,
                 spec: str | None = None, max_retries: int | None = None,
                 on_close: Callable[[], None] | None = None, owns_client: bool = False,
                 store: bool = False, encrypted_reasoning: bool | None = None) -> None:
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
            if not hasattr(client, "responses") or isinstance(client, openai.AsyncOpenAI):
                raise ConfigError(
                    f"client={type(client).__name__} is not a synchronous OpenAI client with "
                    "the Responses API; pass openai.OpenAI(...)."
                )
            if max_retries is not None:
                client = client.with_options(max_retries=max_retries)
        if not isinstance(store, bool):
            raise ConfigError(f"store={store!r} must be True or False.")
        self.store = store
        self.encrypted_reasoning = encrypts_reasoning(model_id) \
            if encrypted_reasoning is None else bool(encrypted_reasoning)
        # The last few stored replies' chains, newest first: a summary request between two
        # turns (another history) does not break the conversation's own chain.
        self._chains: tuple[_Chain, ...] = ()
        self._chain_lock = threading.Lock()
        self._items_memo: dict[int, tuple[Message, tuple[dict[str, Any], ...]]] = {}
        self._bind(model_id, client, prefix="openai", endpoint="/responses",
                   connection_error=openai.APIConnectionError, info=info, spec=spec,
                   on_close=on_close, owns_client=owns_client)

    # -- items ----------------------------------------------------------------------------
    def _items_of(self, message: Message) -> tuple[dict[str, Any], ...]:
        # By identity with the message held (a frozen message converts the same each time).
        hit = self._items_memo.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        items = _message_items(message)
        if len(self._items_memo) >= 4096:
            self._items_memo.clear()
        self._items_memo[id(message)] = (message, items)
        return items

    def _history_items(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        return [item for m in messages for item in self._items_of(m)]

    def _plan(self, request: Request) -> tuple[list[dict[str, Any]] | None, str | None]:
        """(the items to send — None when there is no chain to check and the sizes are
        the messages' own —, the previous response id)."""
        chains = self._chains if self.store else ()
        if not chains:
            return None, None
        items = self._history_items(request.messages)
        best: _Chain | None = None
        for chain in chains:
            n = len(chain.items)
            if 0 < n < len(items) and (best is None or n > len(best.items)) \
                    and items[:n] == list(chain.items):
                best = chain
        if best is not None:
            return items[len(best.items):], best.response_id
        return items, None

    # -- request building ---------------------------------------------------------------
    def _kwargs(self, request: Request, *, convert: bool = True) -> dict[str, Any]:
        self._check_open()
        create = self.client.responses.create
        kwargs, extra = split_options(create, request.options, _RESERVED)
        kwargs["model"] = self.model_id
        items, previous = self._plan(request)
        for name, value in openai_cache_parameters(request.caching, self.model_id).items():
            kwargs.setdefault(name, value)
        if convert:
            kwargs["input"] = items if items is not None else to_items(request.messages)
        else:
            kwargs["input"] = []
        if previous is not None:
            kwargs["previous_response_id"] = previous
        if request.tools:
            kwargs["tools"] = [
                {"type": "function", "name": t.name, "description": t.description,
                 "parameters": plain(t.parameters)}
                for t in request.tools
            ]
        limit = request.max_tokens if request.max_tokens is not None else next(
            (request.options[k] for k in ("max_output_tokens", "max_tokens",
                                          "max_completion_tokens")
             if isinstance(request.options.get(k), int)), None)
        if limit is not None:
            kwargs["max_output_tokens"] = max(int(limit), MIN_OUTPUT_TOKENS)
        kwargs["store"] = self.store
        if self.encrypted_reasoning:
            kwargs["include"] = [ENCRYPTED_REASONING]
        context = request.context
        if context is not None and context.compact_trigger:
            kwargs["context_management"] = [{"type": "compaction",
                                             "compact_threshold": int(context.compact_trigger)}]
        kwargs["stream"] = request.stream
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _resource(self, client: Any) -> Any:
        return client.responses

    def _sdk_errors(self) -> tuple[type[BaseException], ...]:
        return _SDK_ERRORS

    def _fold_parts(self) -> tuple[Callable[[Message], Any], Any, Callable[[Any, Any], Any]]:
        return _sized, (0, 0), _add

    def _messages_size(self, messages: tuple[Message, ...]) -> int:
        size, count = self._folded(messages)
        return 2 + size + max(count - 1, 0)

    def _input_size(self, request: Request) -> int:
        items, _ = self._plan(request)
        if items is None:
            return self._messages_size(tuple(request.messages))
        return converted_size(items)

    def measure(self, request: Request) -> int:
        """``len(encode(request))`` without encoding the history: the shape's template and
        each message's memoized items size (exact: ``encode`` fills the same template)."""
        kwargs = self._kwargs(request, convert=False)
        template = self._template(kwargs)
        if template is not None:
            try:
                sizes = {k: json_size(kwargs[k]) if k == "tools" else converted_size(kwargs[k])
                         for k in template.slots if k != "input"}
                if "input" in template.slots:
                    sizes["input"] = self._input_size(request)
                return template.size(sizes)
            except (TypeError, ValueError):
                pass
        return len(self.encode(request))

    def message_size(self, message: Message) -> int:
        """What ``message`` adds to the ``input`` after other items: its items and their
        commas (a fit settles the total with an exact ``measure``)."""
        size, count = self._memo.get(message, _sized)
        return size + count

    def prepare(self, request: Request) -> Prepared:
        """Pre-flight's view: the exact size, and the ``max_output_tokens`` the body carries."""
        prepared = super().prepare(request)
        kwargs = self._kwargs(request, convert=False)
        return dataclasses.replace(prepared, max_tokens=kwargs.get("max_output_tokens"))

    # -- sending ------------------------------------------------------------------------
    def send(self, request: Request, on_text: TextCallback | None = None) -> Response:
        chained = self._plan(request)[1] if self.store else None
        try:
            response = super().send(request, on_text)
        except ChatError as error:
            if chained is not None and _previous_not_found(error):
                with self._chain_lock:
                    self._chains = tuple(c for c in self._chains if c.response_id != chained)
                failure = dataclasses.replace(error.failure, kind=FailureKind.TRANSIENT)
                raise ChatError(failure) from error
            raise
        if self.store and response.response_id:
            covered = (*self._history_items(request.messages),
                       *_message_items(response.message))
            with self._chain_lock:
                kept = tuple(c for c in self._chains if c.response_id != chained)
                self._chains = (_Chain(response.response_id, covered), *kept)[:_CHAINS]
        if chained is not None:
            response = dataclasses.replace(response, chained=True)
        return response

    def forget_chain(self) -> None:
        """Send the whole input next time (``store``): the server's copies are not used."""
        with self._chain_lock:
            self._chains = ()

    advertised_window = OpenAIProvider.advertised_window

    def count_tokens(self, request: Request) -> int | None:
        """The input tokens of ``request`` by the API's own counter
        (``responses.input_tokens.count``): one request, no retry; None when it fails."""
        kwargs = self._kwargs(request)
        args: dict[str, Any] = {"model": kwargs["model"], "input": kwargs["input"]}
        for name in ("tools", "previous_response_id"):
            if name in kwargs:
                args[name] = kwargs[name]
        try:
            counted = self.client.with_options(timeout=COUNT_TIMEOUT, max_retries=0) \
                .responses.input_tokens.count(**args)
        except Exception:  # any answer but a count means "not told"
            return None
        tokens = field(counted, "input_tokens")
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None

    def _read_reply(self, result: Any, size: int) -> Response:
        output = field(result, "output")
        if output is None:
            raise no_answer(size, self.api, "no output in it")
        if field(result, "status") == "failed":
            raise _failed(result)
        message = from_output(output)
        stop, raw = _stop(result, message)
        return Response(message, stop, _usage(field(result, "usage")), size, raw,
                        response_id=field(result, "id"))

    def _read_stream(self, stream: Any, on_text: TextCallback | None, size: int,
                     progress: StreamProgress) -> Response:
        items: dict[int, Any] = {}
        final: Any = None
        ident: str | None = None
        for event in stream:
            kind = field(event, "type")
            # A refusal streams in its own events; it is the visible answer all the same.
            if kind in ("response.output_text.delta", "response.refusal.delta"):
                piece = field(event, "delta")
                if isinstance(piece, str) and piece:
                    progress.said = True
                    if on_text is not None:
                        on_text(piece)
            elif kind == "response.output_item.done":
                progress.said = True
                index = field(event, "output_index")
                items[index if isinstance(index, int) else len(items)] = field(event, "item")
            elif kind in ("response.created", "response.in_progress"):
                ident = field(field(event, "response"), "id") or ident
            elif kind in ("response.completed", "response.incomplete"):
                final = field(event, "response")
                progress.said = True
            elif kind == "response.failed":
                raise _failed(field(event, "response"),
                              getattr(getattr(stream, "response", None), "request", None))
            elif kind == "error":
                raise _failed({"error": {"code": field(event, "code"),
                                         "message": field(event, "message"),
                                         "param": field(event, "param")}},
                              getattr(getattr(stream, "response", None), "request", None))
            elif kind is not None and kind.startswith("response.") and kind.endswith(".delta"):
                progress.said = True
        if final is None:
            raise incomplete_reply(size, self.api, "no response.completed arrived",
                                   empty=not progress.said)
        output = field(final, "output") or [items[i] for i in sorted(items)]
        message = from_output(output)
        stop, raw = _stop(final, message)
        return Response(message, stop, _usage(field(final, "usage")), size, raw,
                        response_id=field(final, "id") or ident, streamed=True)


def _sized(message: Message) -> tuple[int, int]:
    items = _message_items(message)
    return sum(converted_size(i) for i in items), len(items)


def _add(state: tuple[int, int], item: tuple[int, int]) -> tuple[int, int]:
    return state[0] + item[0], state[1] + item[1]


def _previous_not_found(error: ChatError) -> bool:
    cause = error.__cause__
    body = getattr(cause, "body", None)
    code = body.get("code") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
    return code == "previous_response_not_found"
