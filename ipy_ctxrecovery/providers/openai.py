"""The OpenAI Chat Completions adapter, on the official ``openai`` SDK.

Works with any OpenAI-compatible server (vLLM, Ollama, LM Studio, gateways, the
emulator) through the SDK's own settings: a user-built client is used as is, otherwise
``openai.OpenAI()`` reads ``OPENAI_API_KEY``/``OPENAI_BASE_URL``/proxy variables itself.

``max_tokens`` is sent only when the request sets it, as ``max_completion_tokens`` for
the families that reject ``max_tokens`` (o-series reasoning models, gpt-5 and later) and
as ``max_tokens`` for everything else, which is what OpenAI-compatible servers read. An
option with either name in ``Request.options`` picks the name explicitly.
Streaming asks for ``stream_options={"include_usage": True}`` so usage arrives too.
``Request.caching`` adds ``prompt_cache_key`` and ``prompt_cache_retention`` where it asks
for them and the model takes them (``_common.openai_cache_parameters``, as the Responses
adapter does); an option of the same name wins.

Consecutive messages of one role (system, user or assistant) go out as one message
(:func:`to_wire`), as the Anthropic adapter does: after a compaction the history holds a
summary, a notice and the request as three user messages, and the chat templates of many
open models (served by vLLM, llama.cpp, TGI) reject anything but strict user/assistant
alternation ("Conversation roles must alternate user/assistant/user/assistant/..."). A
merged message's content is one plain string: its texts in order, each whole, joined by a
blank line and a dash (:data:`TEXT_JOIN`, ``core.markers.MERGED_TEXT_JOIN``: no text of
the run starts a line, which a firewall reads as a command; empty texts are left out). A string is what every server
accepts: a list of text parts makes the chat templates of llama.cpp-based servers fail
(llama-cpp-python answers HTTP 500 "can only concatenate str (not "list") to str"). The
blank line is the break the compactor itself puts between messages when it renders them
for the summarizer, so the summary, a notice and the request still read as separate
paragraphs, and no word of one runs into the next. Tool calls are concatenated. Tool
results stay one message each, as the API wants. The history itself is not changed, so
its messages keep their tags.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import httpx2
import openai

from ..core.catalogue import ModelInfo
from ..core.history import Message, Text, ToolCall, ToolResult, to_openai
from ..core.markers import MERGED_TEXT_JOIN
from ..errors import ConfigError, redact
from ._common import (
    SDKAdapter,
    StreamProgress,
    converted_size,
    field,
    incomplete_reply,
    openai_cache_parameters,
    plain,
    split_options,
)
from ._guard import ReplyRefused
from ._replies import no_answer
from ._wire import for_body
from .base import Request, Response, StopReason, TextCallback, Usage
from .tokenize import Tokenizer, tokenize_url

__all__ = ["TEXT_JOIN", "OpenAIProvider", "to_wire", "uses_max_completion_tokens"]

STOP_REASONS = {
    "stop": StopReason.END,
    "length": StopReason.LENGTH,
    "tool_calls": StopReason.TOOL_CALLS,
    "function_call": StopReason.TOOL_CALLS,
    "content_filter": StopReason.FILTERED,
}

ADVERTISED_WINDOW_KEYS = ("max_model_len", "context_length", "max_context_length",
                          "context_window")
"""Where OpenAI-compatible servers put a model's window in ``/v1/models`` (vLLM,
OpenRouter, LM Studio, others)."""
ADVERTISED_WINDOW_TIMEOUT = 3.0

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


_MERGED_ROLES = frozenset({"system", "user", "assistant"})

TEXT_JOIN = MERGED_TEXT_JOIN
"""What goes between the texts of the messages ``to_wire`` merges into one."""


def to_wire(history: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a request: ``history.to_openai`` with each run of consecutive
    system, user or assistant messages merged into one (module docstring)."""
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for d in map(_for_body, history, to_openai(history)):
        if run and d["role"] == run[-1]["role"] and d["role"] in _MERGED_ROLES:
            run.append(d)
            continue
        if run:
            out.append(_merge(run))
        run = [d]
    if run:
        out.append(_merge(run))
    return out


def _for_body(message: Message, d: dict[str, Any]) -> dict[str, Any]:
    """``d`` (``to_openai``'s new dict for ``message``) with its text as ``_wire.for_body``
    copies it: only the str the history holds (a text kept packed, or joined from several
    blocks, is a new str already)."""
    content = d.get("content")
    if isinstance(content, str) and not content.isascii() and _held(message, content):
        d["content"] = for_body(content)
    for call in d.get("tool_calls", ()):
        function = call["function"]
        if not function["arguments"].isascii():
            function["arguments"] = for_body(function["arguments"])
    return d


def _held(message: Message, content: str) -> bool:
    """Whether ``content`` is a str ``message`` itself holds."""
    return any(content is (b.content if isinstance(b, ToolResult) else b.text)
               for b in message.blocks
               if isinstance(b, ToolResult) or (isinstance(b, Text) and not b.packed))


def _merge(run: list[dict[str, Any]]) -> dict[str, Any]:
    if len(run) == 1:
        return run[0]
    texts = [d["content"] for d in run if d.get("content")]
    calls = [c for d in run for c in d.get("tool_calls", ())]
    content: Any
    if len(texts) == 1:
        content = texts[0]
    elif texts:
        content = TEXT_JOIN.join(texts)      # a new str: no history holds it (``for_body``)
    else:
        content = None if calls else ""
    merged: dict[str, Any] = {"role": run[0]["role"], "content": content}
    if calls:
        merged["tool_calls"] = calls
    return merged


@functools.lru_cache(maxsize=64)
def uses_max_completion_tokens(model_id: str) -> bool:
    """Whether ``model_id`` belongs to a family that wants ``max_completion_tokens``."""
    return bool(_COMPLETION_TOKENS_MODELS.match(model_id.strip().lower().rsplit("/", 1)[-1]))


class _Refused(ReplyRefused, openai.OpenAIError):
    """A reply refused for its size (``_guard``), as the SDK's own error: not retried."""


class OpenAIProvider(SDKAdapter):
    """Chat Completions through ``client.chat.completions.create``."""

    api = "OpenAI"
    wire = "openai"
    server_compaction = False
    """The API carries a server compaction (``session/server_side.api_supports``)."""
    plain_client = openai.OpenAI
    refusal = _Refused

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
        self._tokenizer = Tokenizer(tokenize_url(getattr(client, "base_url", None)))

    # -- request building ---------------------------------------------------------------
    def _kwargs(self, request: Request, *, convert: bool = True) -> dict[str, Any]:
        self._check_open()
        create = self.client.chat.completions.create
        kwargs, extra = split_options(create, request.options, _RESERVED)
        kwargs["model"] = self.model_id
        kwargs["messages"] = to_wire(request.messages) if convert else []
        for name, value in openai_cache_parameters(request.caching, self.model_id).items():
            kwargs.setdefault(name, value)
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

    def _resource(self, client: Any) -> Any:
        return client.chat.completions

    def advertised_window(self) -> int | None:
        """The context window the server advertises for this model in its model list —
        vLLM's ``max_model_len``, OpenRouter's ``context_length``, LM Studio's
        ``max_context_length`` — or None (not listed, not told, or no answer). One request
        through the SDK, bounded: a few seconds and no retry."""
        try:
            listing = self.client.with_options(timeout=ADVERTISED_WINDOW_TIMEOUT,
                                               max_retries=0).models.list()
            for model in listing.data:
                if model.id != self.model_id:
                    continue
                extra = model.model_extra or {}
                for key in ADVERTISED_WINDOW_KEYS:
                    value = extra.get(key)
                    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        return value
                return None
        except Exception:  # any answer but a usable one means "not told"
            return None
        return None

    def count_tokens(self, request: Request) -> int | None:
        """The request's input tokens from the server's tokenize endpoint (vLLM's, llama.cpp
        server's: ``providers/tokenize.py``), or None: no endpoint (remembered, so asked
        once), OpenAI's own service (none there: nothing sent), or no usable answer. One
        request through the SDK's client, a few seconds at most, no retry
        (``base.CountsTokens``)."""
        tokenizer = self._tokenizer
        if not tokenizer.available or self._closed:
            return None
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                   "parameters": plain(t.parameters)}}
                 for t in request.tools]
        try:
            messages = to_wire(request.messages)
        except (TypeError, ValueError):
            return None
        return tokenizer.count(self.client, model=self.model_id, messages=messages,
                               tools=tools or None, texts=lambda: _texts(messages))

    def _sdk_errors(self) -> tuple[type[BaseException], ...]:
        return _SDK_ERRORS

    def _messages_size(self, messages: tuple[Message, ...]) -> int:
        # Per-message sizes, merged as ``to_wire`` merges same-role runs.
        return _finish(self._folded(messages))

    def _fold_parts(self) -> tuple[Callable[[Message], Any], Any, Callable[[Any, Any], Any]]:
        return _message_size, _START, _fold

    def _fold_steps(self) -> Callable[[Any, list[Any]], Any]:
        return _fold_many

    def message_size(self, message: Message) -> int:
        """What ``message`` adds to the body after a message of another role (its JSON and
        a comma); after one of its own role it is merged into it (``to_wire``), which a
        fit settles with an exact ``measure``."""
        hit = self._memo.seen.get(id(message))       # a fit asks once per kept message
        if hit is not None and hit[0] is message:
            return hit[1].size + 1
        return self._memo.get(message, _message_size).size + 1

    def message_sizes(self, request: Request) -> tuple[int, list[int]]:
        """``(base, parts)`` with ``measure(request) == base + sum(parts)`` exactly: the body
        without messages, and what each message adds to it where it stands (a message
        merged into the run before it adds its part of the merged message)."""
        base = self.measure(dataclasses.replace(request, messages=()))
        items = [self._memo.get(m, _message_size) for m in request.messages]
        parts: list[int] = []
        run: list[_Sized] = []
        for item in items:
            if run and item.role == run[-1].role and item.role in _MERGED_ROLES:
                before = _merged_size(run)
                run.append(item)
                parts.append(_merged_size(run) - before)
            else:
                run = [item]
                parts.append(_merged_size(run) + (1 if parts else 0))
        return base, parts

    def _read_reply(self, result: Any, size: int) -> Response:
        return _read_completion(result, size, self.api)

    def _read_stream(self, stream: Any, on_text: TextCallback | None, size: int,
                     progress: StreamProgress) -> Response:
        return _read_stream(stream, on_text, size, self.api, progress)


class _Sized(NamedTuple):
    """What ``_messages_size`` needs of one converted message."""

    role: str
    size: int                   # the message alone
    text: int | None            # its content as a JSON string, quotes left out; None: empty
    calls: int                  # its tool calls, encoded, without separators
    n_calls: int


# JSON escapes a str character by character, so a joined text encodes as its texts' encodings
# (quotes left out) with the separator's between them, inside one pair of quotes.
_JOIN_SIZE = converted_size(TEXT_JOIN) - len('""')
_CALLS_OVERHEAD = len(',"tool_calls":[]')


def _message_size(message: Message) -> _Sized:
    d = _for_body(message, to_openai((message,))[0])
    text = d.get("content") or None
    calls = d.get("tool_calls", ())
    return _Sized(d["role"], converted_size(d),
                  converted_size(text) - len('""') if text is not None else None,
                  sum(converted_size(c) for c in calls), len(calls))


# A run of same-role messages merged into one, as far as its size needs: (role, messages,
# the first's size, texts, the texts' sizes without quotes, calls, their size).
_Run = tuple[str, int, int, int, int, int, int]
# The messages array so far: (size of the closed runs, how many, the open run or None).
_Fold = tuple[int, int, _Run | None]
_START: _Fold = (0, 0, None)


def _grow(run: _Run | None, item: _Sized) -> _Run:
    """``run`` with ``item`` merged in (a new run when None)."""
    text = item.text is not None
    if run is None:
        return (item.role, 1, item.size, int(text), item.text or 0, item.n_calls, item.calls)
    role, n, first, n_texts, texts, n_calls, calls = run
    if text:
        n_texts += 1
        texts += item.text or 0
    return (role, n + 1, first, n_texts, texts, n_calls + item.n_calls, calls + item.calls)


@functools.lru_cache(maxsize=8)
def _shell_size(role: str) -> int:
    """``{"role":ROLE,"content":}``: a merged message without its content."""
    return converted_size({"role": role, "content": ""}) - len('""')


def _run_size(run: _Run) -> int:
    """Encoded size of ``_merge`` of the messages ``run`` stands for."""
    role, n, first, n_texts, texts, n_calls, calls = run
    if n == 1:
        return first
    if n_texts:
        content = len('""') + texts + _JOIN_SIZE * (n_texts - 1)
    else:
        content = len("null") if n_calls else len('""')
    size = _shell_size(role) + content
    if n_calls:
        size += _CALLS_OVERHEAD + calls + n_calls - 1
    return size


def _merged_size(run: list[_Sized]) -> int:
    """Encoded size of ``_merge`` of the messages ``run`` stands for."""
    return _run_size(functools.reduce(_grow, run[1:], _grow(None, run[0])))


def _fold(state: _Fold, item: _Sized) -> _Fold:
    """``state`` after one more message (merged into the open run when ``to_wire`` would)."""
    inner, units, run = state
    if run is not None and item.role == run[0] and item.role in _MERGED_ROLES:
        return inner, units, _grow(run, item)
    if run is not None:
        inner += _run_size(run)
        units += 1
    return inner, units, _grow(None, item)


def _fold_many(state: _Fold, items: list[_Sized]) -> _Fold:
    """``_fold`` over ``items`` in turn. Between the items that merge into the one before
    them (``to_wire``'s runs; none in a plain alternation), every item is a whole message
    of its own: those sizes are summed in C instead of folded one by one."""
    n = len(items)
    if n < 3:
        return functools.reduce(_fold, items, state)
    roles = [item.role for item in items]
    same = list(map(operator.eq, roles, itertools.islice(roles, 1, None)))
    merges = [j + 1 for j in itertools.compress(itertools.count(), same)
              if roles[j] in _MERGED_ROLES] if True in same else []
    state = _fold(state, items[0])                    # it may merge into the open run
    done = 1
    for j in merges:
        state = _fold(_separate(state, items, done, j), items[j])
        done = j + 1
    return _separate(state, items, done, n)


def _separate(state: _Fold, items: list[_Sized], start: int, stop: int) -> _Fold:
    """``_fold`` over ``items[start:stop]``, none of which merges into the one before it."""
    if stop <= start:
        return state
    inner, units, run = state
    assert run is not None                            # an item was folded before ``start``
    inner += _run_size(run) + sum(map(_SIZE, itertools.islice(items, start, stop - 1)))
    return inner, units + stop - start, _grow(None, items[stop - 1])


_SIZE = operator.attrgetter("size")


def _finish(state: _Fold) -> int:
    inner, units, run = state
    if run is not None:
        inner += _run_size(run)
        units += 1
    return 2 + inner + max(units - 1, 0)


def _messages_size(sizes: Sequence[_Sized]) -> int:
    """Encoded size of ``to_wire``'s messages array from per-message sizes."""
    return _finish(functools.reduce(_fold, sizes, _START))


# -- reading replies ------------------------------------------------------------------------

def _texts(messages: list[dict[str, Any]]) -> list[str]:
    """The texts of wire messages (contents and tool-call arguments), for a tokenizer that
    reads plain text (``providers/tokenize.py``)."""
    out: list[str] = []
    for d in messages:
        content = d.get("content")
        if isinstance(content, str) and content:
            out.append(content)
        elif isinstance(content, list):
            out.extend(p["text"] for p in content if isinstance(p, dict)
                       and isinstance(p.get("text"), str))
        for call in d.get("tool_calls") or ():
            function = call.get("function") or {}
            out.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return out


def _reasoning_of(obj: Any) -> str | None:
    """``reasoning_content`` (DeepSeek/vLLM) or ``reasoning`` (OpenRouter/Ollama), if sent."""
    for name in ("reasoning_content", "reasoning"):
        value = field(obj, name)
        if isinstance(value, str) and value:
            return value
    return None


def _usage(usage: Any) -> Usage:
    """``CompletionUsage``: the prompt (cache reads included), the completion, and the
    reads as ``prompt_tokens_details.cached_tokens`` (OpenAI reports no writes)."""
    if usage is None:
        return Usage()
    details = field(usage, "prompt_tokens_details")
    cached = field(details, "cached_tokens") if details is not None else None
    return Usage(field(usage, "prompt_tokens"), field(usage, "completion_tokens"),
                 cached if isinstance(cached, int) else 0)


def _stop(raw: str | None) -> StopReason:
    return STOP_REASONS.get(raw or "", StopReason.OTHER)


def _read_completion(completion: Any, size: int, api: str) -> Response:
    """A whole reply: the SDK's ``ChatCompletion`` or the JSON it is built from."""
    choices = field(completion, "choices")
    if not choices:
        raise no_answer(size, api, "no choices in it" if choices is None
                        else "an empty choices list")
    choice = choices[0]
    msg = field(choice, "message")
    if msg is None:                      # "message": null from a compatible server
        raise incomplete_reply(size, api, "the reply's choice has no message")
    text = field(msg, "content") or field(msg, "refusal") or ""
    calls = []
    for call in field(msg, "tool_calls") or ():
        function = field(call, "function")
        if function is not None:
            calls.append(ToolCall(field(call, "id") or "", field(function, "name") or "",
                                  field(function, "arguments") or "{}"))
    message = Message.assistant(text, calls, _reasoning_of(msg))
    raw = field(choice, "finish_reason")
    return Response(message, _stop(raw), _usage(field(completion, "usage")), size, raw)


class _CallParts:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


def _read_stream(stream: Any, on_text: TextCallback | None, size: int, api: str,
                 progress: StreamProgress) -> Response:
    text: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, _CallParts] = {}
    finish: str | None = None
    usage = Usage()
    chose = False                       # any chunk had a choice
    for chunk in stream:
        if getattr(chunk, "usage", None) is not None:
            usage = _usage(chunk.usage)
            progress.said = True
        for choice in chunk.choices or ():
            chose = True
            if getattr(choice, "index", 0) not in (0, None):
                continue
            delta = choice.delta
            if delta is not None:
                piece = _reasoning_of(delta)
                if piece:
                    reasoning.append(piece)
                    progress.said = True
                # A refusal streams in its own field; it is the visible answer all the same.
                for piece in (delta.content, getattr(delta, "refusal", None)):
                    if isinstance(piece, str) and piece:
                        text.append(piece)
                        progress.said = True
                        if on_text is not None:
                            on_text(piece)
                for tc in delta.tool_calls or ():
                    _add_call_delta(calls, tc)
                    progress.said = True
            if choice.finish_reason:
                finish = choice.finish_reason
                progress.said = True
    if finish is None and progress.said and not chose:
        raise no_answer(size, api, "an event stream in which no chunk has a choice")
    if finish is None:
        raise incomplete_reply(size, api, "no finish_reason arrived", empty=not progress.said)
    tool_calls = [ToolCall(p.id, p.name, "".join(p.arguments) or "{}")
                  for _, p in sorted(calls.items())]
    message = Message.assistant("".join(text), tool_calls, "".join(reasoning) or None)
    return Response(message, _stop(finish), usage, size, finish, streamed=True)


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
