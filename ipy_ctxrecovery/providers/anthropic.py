"""The Anthropic Messages adapter, on the official ``anthropic`` SDK.

History conversion (our blocks → Messages API):

- every system message, wherever it stands, goes into the ``system`` parameter, joined
  with a blank line in history order (the API has no mid-conversation system role);
- tool results become ``tool_result`` blocks (``is_error`` kept) in a user message, tool
  calls become ``tool_use`` blocks whose ``input`` is the parsed JSON arguments (blank →
  ``{}``; not a JSON object → ``{"_raw_arguments": "<text>"}``, see
  ``_common.parse_arguments``);
- reasoning goes back as a ``thinking`` block only when it carries Anthropic's
  signature (the API rejects unsigned thinking), and never last in an assistant message
  (the API rejects that too: an answer that was its thinking alone is not sent); other
  reasoning is dropped;
- consecutive messages of the same role are merged into one (the API wants alternating
  roles), and empty text blocks are left out (the API rejects them).

A cut answer is continued by *prefill* (``continues_by_prefill``, read by
``escalation.resume_for``): the partial answer as the final assistant turn, which the model
continues as is — where the catalogue says the model accepts one (``assistant_prefill``) and
the request does not turn on extended thinking, which rejects a prefill. Elsewhere the
continuation prompt is used.

Prompt caching (``Request.caching``, the ``prompt_caching`` setting, on by default): a
``cache_control`` breakpoint on the last block of the last message; at the end of the
prefix the session expects to keep (``Caching.keep``: before the first message a batched
rewrite may still change, so the request that rewrites reads what comes before it — the
entries of the last messages all end after the rewrite); on the last block of the message
two before the last — the previous request's last message, so its entry is read however
many blocks a tool round added (the API looks back only 20); on the system prompt (then
sent as one text block) and on the last tool. At most four: the previous request's
breakpoint gives way first when the last one's lookback reaches it, then the tools' (the
system's entry covers them). Each only where the prefix it ends is estimated to reach the
model's minimum cacheable length (``core.caching.min_cacheable_tokens``), and never on a
thinking block (the API takes none there: the block before it, or none). With
``Caching.retention`` "long" every breakpoint carries ``ttl: "1h"`` (one TTL for all: the
API wants a longer one before a shorter one), and the request the beta that TTL needs
(``core.caching.EXTENDED_TTL_BETA``, through the SDK's beta resource, as context
management). ``measure`` counts them: the size is exact.

Context management (``Request.context``): the body goes through the SDK's beta messages
resource with ``context_management.edits`` and the ``betas`` the API documents —
``clear_thinking_20251015`` (only when the request turns thinking on; listed first, as the
API requires), ``clear_tool_uses_20250919`` (``context-management-2025-06-27``) and
``compact_20260112`` with an ``input_tokens`` trigger and the instructions
(``compact-2026-01-12``; left out when the trigger is below the model's
``min_compact_trigger``, which the API refuses). A ``compaction`` block in a reply becomes
a :class:`Compaction` — ``data`` the block as sent (JSON, without ``cache_control``),
``summary`` its ``content`` — first in the reply's message; the session keeps it as a
message of its own (``TAG_SERVER_COMPACTION``) and it goes back verbatim, merged with the
answer that followed it, with the compaction beta whenever the history holds one (a
breakpoint may be set on it like on any block). A ``Compaction`` of another wire goes as
the text of its summary, or not at all. ``context_management.applied_edits`` becomes
``Response.edits``. :meth:`AnthropicProvider.count_tokens` asks ``messages.count_tokens``
(the beta one with context management) once, bounded, with no retries.

``max_tokens`` is required by the API: when a request leaves it unset the adapter sends
``min(4096, info.max_output_tokens, info.context_window // 2)`` (the last term only matters
for small windows such as the emulator's, where the input must fit next to it).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2

from ..core.caching import (
    DEFAULT_TTL,
    EXTENDED_TTL_BETA,
    LONG_TTL,
    LOOKBACK_BLOCKS,
    MAX_BREAKPOINTS,
    breakpoint,
    min_cacheable_tokens,
)
from ..core.catalogue import ModelInfo
from ..core.history import (
    Block,
    Compaction,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
    leading_compaction,
)
from ..errors import ConfigError
from ._common import (
    PrefixFold,
    SDKAdapter,
    StreamProgress,
    converted_size,
    field,
    incomplete_reply,
    json_size,
    parse_arguments,
    plain,
    split_options,
)
from ._guard import ReplyRefused
from ._replies import no_answer
from ._wire import FastCall, JsonFloat, for_body, prove_call
from .base import (
    ClearToolUses,
    ContextEdit,
    ContextManagement,
    Request,
    Response,
    StopReason,
    TextCallback,
    Usage,
)

__all__ = ["COMPACT_BETA", "CONTEXT_BETA", "DEFAULT_MAX_TOKENS", "AnthropicProvider",
           "context_management", "to_anthropic"]

DEFAULT_MAX_TOKENS = 4096
"""Sent when a request sets no max_tokens (capped by the model's output limit)."""

STOP_REASONS = {
    "end_turn": StopReason.END,
    "stop_sequence": StopReason.END,
    "max_tokens": StopReason.LENGTH,
    # The answer was cut because the context window filled up: truncated like max_tokens.
    "model_context_window_exceeded": StopReason.LENGTH,
    "tool_use": StopReason.TOOL_CALLS,
    "refusal": StopReason.FILTERED,
    # pause_turn (a server tool paused a long turn) and anything new: the caller decides.
}

_RESERVED = frozenset({"model", "messages", "system", "stream", "tools", "max_tokens"})

COMPACT_BETA = "compact-2026-01-12"
"""The beta header of server compaction (platform.claude.com/docs/en/build-with-claude/compaction)."""
CONTEXT_BETA = "context-management-2025-06-27"
"""The beta header of context editing (…/build-with-claude/context-editing)."""
COMPACT_EDIT = "compact_20260112"
CLEAR_TOOL_USES_EDIT = "clear_tool_uses_20250919"
CLEAR_THINKING_EDIT = "clear_thinking_20251015"
_EDIT_KINDS = {CLEAR_TOOL_USES_EDIT: "clear_tool_uses", CLEAR_THINKING_EDIT: "clear_thinking"}
_NOT_COUNTED = frozenset({"extra_body", "extra_headers", "extra_query", "timeout"})
COUNT_TIMEOUT = 10.0
"""Seconds :meth:`AnthropicProvider.count_tokens` waits for its one request."""

_SDK_ERRORS: tuple[type[BaseException], ...] = (anthropic.AnthropicError, httpx2.HTTPError)


def _sdk_errors() -> tuple[type[BaseException], ...]:
    """``_SDK_ERRORS`` plus botocore's, once the Bedrock client has loaded botocore: its
    event-stream decoder raises its own errors while a Bedrock stream is read."""
    extra: list[type[BaseException]] = []
    for module, name in (("botocore.eventstream", "ParserError"),
                         ("botocore.exceptions", "BotoCoreError")):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            extra.append(cls)
    return _SDK_ERRORS + tuple(extra)

NO_KEY_MESSAGE = (
    "No Anthropic key found — set ANTHROPIC_API_KEY, pass client=…, or use the emulator."
)


def to_anthropic(history: Sequence[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """``(system, messages)`` for the Messages API; see the module docstring for the rules."""
    return _system(history), _messages(history)


def _messages(history: Sequence[Message]) -> list[dict[str, Any]]:
    """``to_anthropic``'s messages: one pass, every message's blocks converted (a turn's
    request converts the whole history, so this loop is kept flat)."""
    out: list[dict[str, Any]] = []
    last: str | None = None
    content: list[dict[str, Any]] = []
    system, assistant = Role.SYSTEM, Role.ASSISTANT
    for m in history:
        role = m.role
        if role is system:
            continue
        blocks = [b for b in map(_block, m.blocks) if b is not None]
        if role is assistant:
            _drop_trailing_thinking(blocks)
        if not blocks:
            continue
        name = "assistant" if role is assistant else "user"
        if name == last:
            content.extend(blocks)
        else:
            content = blocks
            out.append({"role": name, "content": blocks})
            last = name
    return out


def _system(history: Sequence[Message]) -> str | None:
    return "\n\n".join(m.text for m in history if m.role is Role.SYSTEM and m.text) or None


def _system_part(m: Message) -> str | None:
    return m.text if m.role is Role.SYSTEM and m.text else None


def _add_part(parts: tuple[str, ...], part: str | None) -> tuple[str, ...]:
    return parts if part is None else (*parts, part)


def _role(m: Message) -> str:
    return "assistant" if m.role is Role.ASSISTANT else "user"


def _blocks(m: Message) -> list[dict[str, Any]]:
    blocks = [b for b in (_block(x) for x in m.blocks) if b is not None]
    if m.role is Role.ASSISTANT:
        _drop_trailing_thinking(blocks)
    return blocks


def _drop_trailing_thinking(blocks: list[dict[str, Any]]) -> None:
    """An assistant message's converted ``blocks`` without the thinking blocks it ends
    with: the API refuses an assistant message whose last block is thinking — 400
    "messages.1: The final block in an assistant message cannot be `thinking`."
    (tailcallhq/forgecode#2107) — which an answer that was its thinking alone (an empty
    text) would be on every later turn. Thinking of an earlier turn is optional."""
    while blocks and blocks[-1].get("type") == "thinking":
        blocks.pop()


def _message_size(m: Message) -> tuple[str, int, int] | None:
    """(role, total encoded size of its blocks, number of blocks); None if not sent."""
    if m.role is Role.SYSTEM:
        return None
    blocks = _blocks(m)
    if not blocks:
        return None
    return _role(m), sum(converted_size(b) for b in blocks), len(blocks)


_EMPTY_MESSAGE = {role: converted_size({"role": role, "content": []}) for role in ("user", "assistant")}


_Fold = tuple[int, int, str | None, int, int]   # (inner, units, open role, its size, blocks)
_START: _Fold = (0, 0, None, 0, 0)


def _fold(state: _Fold, item: tuple[str, int, int] | None) -> _Fold:
    """``state`` after one more message: a run of one role merges into one message."""
    if item is None:
        return state
    inner, units, role, size, count = state
    if item[0] == role:
        return inner, units, role, size + item[1], count + item[2]
    if role is not None:
        inner += _EMPTY_MESSAGE[role] + size + count - 1
        units += 1
    return inner, units, item[0], item[1], item[2]


def _finish(state: _Fold) -> int:
    inner, units, role, size, count = state
    if role is not None:
        inner += _EMPTY_MESSAGE[role] + size + count - 1
        units += 1
    return 2 + inner + max(units - 1, 0)


def _messages_size(sizes: Sequence[tuple[str, int, int] | None]) -> int:
    """Encoded size of ``to_anthropic``'s messages array from per-message sizes: runs of
    one role merge into one message whose content joins all their blocks."""
    return _finish(functools.reduce(_fold, sizes, _START))


def _block(block: Block) -> dict[str, Any] | None:
    if isinstance(block, Text):
        text = block.text
        if not text:
            return None
        return {"type": "text", "text": text if block.packed else for_body(text)}
    if isinstance(block, Reasoning):
        if not block.signature:
            return None
        return {"type": "thinking", "thinking": for_body(block.text),
                "signature": block.signature}
    if isinstance(block, ToolCall):
        return {"type": "tool_use", "id": block.id, "name": block.name,
                "input": parse_arguments(block.arguments)}     # a new object each time
    if isinstance(block, ToolResult):
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.call_id,
                                  "content": for_body(block.content)}
        if block.is_error:
            result["is_error"] = True
        return result
    if isinstance(block, Compaction):
        return _compaction_param(block)
    return None


def _compaction_param(block: Compaction) -> dict[str, Any] | None:
    """A compaction block as the server sent it (a new object each time); another wire's
    as the text of its summary, or nothing."""
    if block.wire == "anthropic":
        try:
            value = json.loads(block.data, parse_float=JsonFloat, parse_constant=JsonFloat)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict) and value.get("type") == "compaction":
            value.pop("cache_control", None)
            return value
    return {"type": "text", "text": for_body(block.summary)} if block.summary else None


def _thinking_on(options: Mapping[str, Any]) -> bool:
    extra = options.get("extra_body")
    return any(isinstance(t, Mapping) and t.get("type") not in (None, "disabled")
               for t in (options.get("thinking"),
                         extra.get("thinking") if isinstance(extra, Mapping) else None))


def _clear_edit(clear: ClearToolUses) -> dict[str, Any]:
    edit: dict[str, Any] = {"type": CLEAR_TOOL_USES_EDIT,
                            "trigger": {"type": "input_tokens", "value": clear.trigger},
                            "keep": {"type": "tool_uses", "value": clear.keep}}
    if clear.clear_at_least:
        edit["clear_at_least"] = {"type": "input_tokens", "value": clear.clear_at_least}
    if clear.exclude_tools:
        edit["exclude_tools"] = list(clear.exclude_tools)
    if clear.clear_inputs:
        edit["clear_tool_inputs"] = True
    return edit


def context_management(context: ContextManagement | None, *, thinking: bool = False,
                       min_trigger: int = 0) -> tuple[list[str], dict[str, Any] | None]:
    """(betas, ``context_management``) for ``context``: the edits the API takes, in the
    order it requires (thinking clearing first), each with its beta header. Clearing
    thinking only when ``thinking`` is on; compaction only from ``min_trigger`` up."""
    if context is None:
        return [], None
    edits: list[dict[str, Any]] = []
    betas: list[str] = []
    if context.clear_thinking and thinking:
        edits.append({"type": CLEAR_THINKING_EDIT})
    if context.clear_tool_uses is not None:
        edits.append(_clear_edit(context.clear_tool_uses))
    if edits:
        betas.append(CONTEXT_BETA)
    trigger = context.compact_trigger
    if trigger is not None and trigger >= max(min_trigger, 1):
        edit: dict[str, Any] = {"type": COMPACT_EDIT,
                                "trigger": {"type": "input_tokens", "value": trigger}}
        if context.compact_instructions:
            edit["instructions"] = context.compact_instructions
        edits.append(edit)
        betas.append(COMPACT_BETA)
    return betas, ({"edits": edits} if edits else None)


def _holds_compaction(messages: Sequence[Message]) -> bool:
    """Whether the history opens with a server compaction message (it then goes with the
    compaction beta). It comes first after the system messages — it replaced everything
    before it (``history.problems``), and the API refuses a compaction block anywhere else
    (the SDK's ``CompactionBlockMisplacedError``): ``history.leading_compaction``."""
    return leading_compaction(messages) is not None


@dataclass(frozen=True, slots=True)
class _Marks:
    """Where a request's cache breakpoints go: the last tool, the system block, and the
    message blocks ``at`` (``(message index, block index)`` in ``to_anthropic``'s messages,
    in order)."""

    tools: bool = False
    system: bool = False
    at: tuple[tuple[int, int], ...] = ()
    ttl: str = DEFAULT_TTL
    """Every breakpoint's (the API wants a longer TTL before a shorter one: one for all)."""


_NO_MARKS = _Marks()


@functools.cache
def _breakpoint_bytes(ttl: str) -> int:
    """What a breakpoint adds to the block it is set on (``,"cache_control":{…}``)."""
    return converted_size({"type": "text", "cache_control": breakpoint(ttl)}) \
        - converted_size({"type": "text"})


def _marked(block: dict[str, Any], ttl: str) -> dict[str, Any]:
    return {**block, "cache_control": breakpoint(ttl)}


def _mark_messages(messages: list[dict[str, Any]], marks: _Marks) -> None:
    """Set the message breakpoints of ``marks`` on ``to_anthropic``'s messages."""
    for at, block in marks.at:
        content = messages[at]["content"]
        content[block] = _marked(content[block], marks.ttl)


def _markable_from_end(m: Message) -> int | None:
    """How many converted blocks of ``m`` come after its last one that may carry a
    breakpoint (0: its last block), or None when it has none: the API takes no
    ``cache_control`` on a thinking block, so a message ending in one is marked on the
    block before it."""
    blocks = [b for b in m.blocks if _block(b) is not None]
    sent = len(_blocks(m))      # an assistant message's trailing thinking is not sent
    for back, block in enumerate(reversed(blocks[:sent])):
        if not isinstance(block, Reasoning):
            return back
    return None


def _position(at: int, group: tuple[int, Message]) -> tuple[int, int] | None:
    """The breakpoint on message ``at`` of ``group`` ``(blocks, its last history message)``:
    its last block that is not thinking, or None."""
    count, last = group
    back = _markable_from_end(last)
    return None if back is None or back >= count else (at, count - 1 - back)


@functools.lru_cache(maxsize=8)
def _count_parameter_names(function: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters) - {"self"}


def _count_parameters(count: Callable[..., Any]) -> frozenset[str]:
    """The keyword arguments ``count_tokens`` takes (its bound method's function's)."""
    return _count_parameter_names(getattr(count, "__func__", count))


class _Refused(ReplyRefused, anthropic.AnthropicError):
    """A reply refused for its size (``_guard``), as the SDK's own error: not retried."""


class AnthropicProvider(SDKAdapter):
    """Messages through ``client.messages.create``."""

    api = "Anthropic"
    wire = "anthropic"
    server_compaction = True
    """The API carries a server compaction (``session/server_side.api_supports``)."""
    plain_client = anthropic.Anthropic
    refusal = _Refused
    _system_fold: PrefixFold | None = None
    _last_marks: tuple[Request, _Marks] | None = None
    _counter: Any = None
    _no_counter = False

    def __init__(self, model_id: str, *, client: Any = None, info: ModelInfo | None = None,
                 spec: str | None = None, max_retries: int | None = None,
                 on_close: Callable[[], None] | None = None, owns_client: bool = False) -> None:
        owns_client = owns_client or client is None
        if client is None:
            client = anthropic.Anthropic() if max_retries is None else anthropic.Anthropic(max_retries=max_retries)
            if not (client.api_key or client.auth_token or getattr(client, "credentials", None)):
                client.close()
                raise ConfigError(NO_KEY_MESSAGE)
        else:
            if not hasattr(client, "messages") or isinstance(client, anthropic.AsyncAnthropic):
                raise ConfigError(
                    f"client={type(client).__name__} is not a synchronous Anthropic client; "
                    "pass anthropic.Anthropic(...), AnthropicBedrock(...) or AnthropicVertex(...)."
                )
            if max_retries is not None:
                client = client.with_options(max_retries=max_retries)
        self._bind(model_id, client, prefix="anthropic", endpoint="/messages",
                   connection_error=anthropic.APIConnectionError, info=info, spec=spec,
                   on_close=on_close, owns_client=owns_client)

    # -- capabilities -------------------------------------------------------------------
    def continues_by_prefill(self, options: Mapping[str, Any]) -> bool:
        """Whether a cut answer can go back as a prefilled final assistant turn: the model
        accepts one and ``options`` (the request's) do not turn on extended thinking."""
        if not self.info.assistant_prefill:
            return False
        extra = options.get("extra_body")
        for thinking in (options.get("thinking"),
                         extra.get("thinking") if isinstance(extra, Mapping) else None):
            if isinstance(thinking, Mapping) and thinking.get("type") != "disabled":
                return False
        return True

    # -- request building ---------------------------------------------------------------
    def _context(self, request: Request) -> tuple[list[str], dict[str, Any] | None]:
        """(betas, ``context_management``) of ``request`` (see the module docstring)."""
        betas, management = context_management(
            request.context, thinking=_thinking_on(request.options),
            min_trigger=self.info.min_compact_trigger)
        if COMPACT_BETA not in betas and _holds_compaction(request.messages):
            betas.append(COMPACT_BETA)
        if request.caching is not None and request.caching.retention == "long":
            betas.append(EXTENDED_TTL_BETA)
        if not betas and request.options.get("betas"):
            betas = [""]          # the user's own betas: the beta resource takes them
        return betas, management

    def _kwargs(self, request: Request, *, convert: bool = True) -> dict[str, Any]:
        self._check_open()
        betas, management = self._context(request)
        create = self.client.beta.messages.create if betas else self.client.messages.create
        kwargs, extra = split_options(create, request.options, _RESERVED)
        system = self._system_of(request.messages)
        messages = _messages(request.messages) if convert else []
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        kwargs["model"] = self.model_id
        kwargs["max_tokens"] = max_tokens
        kwargs["messages"] = messages
        if system is not None:
            kwargs["system"] = system
        tools = [{"name": t.name, "description": t.description,
                  "input_schema": plain(t.parameters)} for t in request.tools]
        marks = self._marks(request, tools, system)
        self._last_marks = (request, marks)
        if marks.tools:
            tools[-1] = _marked(tools[-1], marks.ttl)
        if tools:
            kwargs["tools"] = tools
        if marks.system and system is not None:
            kwargs["system"] = [_marked({"type": "text", "text": system}, marks.ttl)]
        if convert:
            _mark_messages(messages, marks)
        if management is not None:
            kwargs["context_management"] = management
        if betas:
            given = kwargs.get("betas")
            kwargs["betas"] = [b for b in dict.fromkeys(
                [*(given if isinstance(given, list | tuple) else ()), *betas]) if b]
        kwargs["stream"] = request.stream
        if not request.stream and "timeout" not in kwargs:
            # The SDK refuses non-streaming calls with a large max_tokens unless a timeout
            # is given; passing the client's own timeout keeps its behaviour and settings.
            kwargs["timeout"] = self.client.timeout
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _resource(self, client: Any) -> Any:
        return client.messages

    def _resource_for(self, client: Any, kwargs: Mapping[str, Any]) -> Any:
        """The beta messages resource for a request with ``betas``, else the plain one."""
        return client.beta.messages if "betas" in kwargs else client.messages

    def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        return self._resource_for(client, kwargs).create(**kwargs)

    def _prove(self, probe: dict[str, Any], sdk_request: httpx2.Request) -> FastCall | None:
        if type(self.client) is not self.plain_client:
            return None
        resource_type = type(self._resource_for(self.client, probe))
        return prove_call(resource_type, self.client, probe, sdk_request,
                          lambda call, body: self._capture.request(lambda c: call.send(c, body)))

    def count_tokens(self, request: Request) -> int | None:
        """The request's input tokens from the API's own counter (``CountsTokens``): one
        request through ``messages.count_tokens`` (the beta one when the request has
        context management or a compaction), at most :data:`COUNT_TIMEOUT` seconds, no
        retries; None when the server has no counter (then never asked again) or did not
        answer."""
        if self._no_counter:
            return None
        kwargs = self._kwargs(dataclasses.replace(request, caching=None, stream=True))
        if self._counter is None:
            self._counter = self.client.with_options(max_retries=0, timeout=COUNT_TIMEOUT)
        failures: tuple[type[BaseException], ...] = (*self._sdk_errors(), AttributeError,
                                                      TypeError)
        try:
            count = self._resource_for(self._counter, kwargs).count_tokens
            named = _count_parameters(count)
            result = count(**{k: v for k, v in kwargs.items()
                              if k in named and k not in _NOT_COUNTED})
        except failures as exc:
            # No such endpoint (a gateway's 404/405, Bedrock's "not supported"): not asked
            # again. A transient failure (overloaded, timed out) is asked again next time.
            status = getattr(exc, "status_code", None)
            if status in (404, 405) or isinstance(exc, AttributeError | TypeError) or (
                    type(exc) is anthropic.AnthropicError):
                self._no_counter = True
            return None
        tokens = field(result, "input_tokens")
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None

    def _marks(self, request: Request, tools: list[dict[str, Any]],
               system: str | None) -> _Marks:
        """The breakpoints ``request`` gets, at most four, each only where the prefix it
        ends is estimated (``Request.caching``) to reach the model's minimum cacheable
        length; decided from sizes, so ``measure`` and ``encode`` agree. Wanted, in order
        of need: the last block of the last message; the end of ``Caching.keep`` (the
        prefix the session expects to keep, so a rewrite after it still reads it); the
        last block of the message two before the last (the previous turn's last message,
        needed only when more than 20 blocks follow it: else the last one's lookback
        finds its entry); the system block; the last tool (the system's entry covers the
        tools too). Never on a thinking block."""
        caching = request.caching
        if caching is None:
            return _NO_MARKS
        least = min_cacheable_tokens(self.model_id) * caching.bytes_per_token
        done = json_size(tools) if tools else 0
        on_tools = bool(tools) and done >= least
        if system is not None:
            done += converted_size(system)
        on_system = system is not None and done >= least
        messages = request.messages
        runs, tail, groups = self._tail(messages)
        total = done + self._messages_size(messages)
        final = earlier = keep = None
        redundant = False
        if runs >= 1 and total >= least and groups:
            final = _position(runs - 1, groups[0])
        if runs >= 3 and len(groups) >= 3 and total - tail >= least:
            earlier = _position(runs - 3, groups[2])
            if earlier is not None and final is not None:
                # Blocks from the earlier breakpoint to the last one: within the lookback,
                # the last one finds the earlier entry on its own.
                apart = groups[2][0] - 1 - earlier[1] + groups[1][0] + final[1] + 1
                redundant = apart <= LOOKBACK_BLOCKS
        if caching.keep is not None and 0 < caching.keep < len(messages):
            keep = self._keep_position(messages[:caching.keep], done, least)
        at = {p for p in (keep, final, None if redundant else earlier) if p is not None}
        room = MAX_BREAKPOINTS - len(at)
        on_system = on_system and room >= 1
        room -= on_system
        on_tools = on_tools and room >= 1
        room -= on_tools
        if redundant and earlier is not None and room >= 1:
            at.add(earlier)            # a free slot: kept as before, harmless
        return _Marks(on_tools, on_system, tuple(sorted(at)),
                      LONG_TTL if caching.retention == "long" else DEFAULT_TTL)

    def _keep_position(self, prefix: tuple[Message, ...], done: int,
                       least: float) -> tuple[int, int] | None:
        """Where the breakpoint after ``prefix`` (the first messages of the history) goes."""
        state = self._folded(prefix)
        _, units, role, _, count = state
        if role is None or done + _finish(state) < least:
            return None
        last = next((m for m in reversed(prefix) if self._memo.get(m, _message_size)), None)
        if last is None:
            return None
        back = _markable_from_end(last)
        return None if back is None or back >= count else (units, count - 1 - back)

    def _tail(self, messages: tuple[Message, ...]
              ) -> tuple[int, int, list[tuple[int, Message]]]:
        """(messages ``to_anthropic`` sends, bytes of its last two, for each of its last
        three ``(blocks, the history message its last block comes from)``, last first):
        from the size fold and the memoized sizes of the history's tail."""
        _, units, role, _, _ = self._folded(messages)
        runs = units + (role is not None)
        seen, last, tail = 0, None, 0
        groups: list[tuple[int, Message]] = []
        for m in reversed(messages):
            item = self._memo.get(m, _message_size)
            if item is None:
                continue
            if item[0] != last:
                seen += 1
                if seen > 3:
                    break
                last = item[0]
                groups.append((0, m))
                if seen <= 2:
                    tail += _EMPTY_MESSAGE[item[0]]
            groups[-1] = (groups[-1][0] + item[2], groups[-1][1])
            if seen <= 2:
                tail += item[1] + item[2]
        return runs, tail, groups

    def _marks_size(self, request: Request) -> int:
        """The bytes the message breakpoints add (those on tools and system are in their
        own fields): the marks ``_kwargs`` just decided for this request."""
        last = self._last_marks
        if last is None or last[0] is not request:
            self._kwargs(request, convert=False)
            last = self._last_marks
        assert last is not None
        marks = last[1]
        return _breakpoint_bytes(marks.ttl) * len(marks.at)

    @property
    def default_max_tokens(self) -> int:
        """What a request that sets no max_tokens sends (the API requires one): never more
        than half the window, so with a small window (an emulator, an override) the input
        still fits next to it."""
        return max(1, min(DEFAULT_MAX_TOKENS, self.info.max_output_tokens,
                          self.info.context_window // 2))

    def _sdk_errors(self) -> tuple[type[BaseException], ...]:
        return _sdk_errors()

    def _messages_size(self, messages: tuple[Message, ...]) -> int:
        # Per-message block sizes, merged as ``to_anthropic`` merges same-role runs.
        return _finish(self._folded(messages))

    def _fold_parts(self) -> tuple[Callable[[Message], Any], Any, Callable[[Any, Any], Any]]:
        return _message_size, _START, _fold

    def _system_of(self, messages: tuple[Message, ...]) -> str | None:
        """``_system(messages)``, resumed after an earlier history ``messages`` extends
        (pre-flight asks for it several times a turn)."""
        if self._system_fold is None:
            self._system_fold = PrefixFold(None, _system_part, (), _add_part)
        return "\n\n".join(self._system_fold(messages)) or None

    def message_size(self, message: Message) -> int:
        """What ``message`` adds to the body as a message of its own after another one (a
        system message: its share of the joined ``system`` text). Exact for replacing a
        message by one of the same role and number of blocks, merged or not."""
        if message.role is Role.SYSTEM:
            return converted_size(message.text) + 2 if message.text else 0
        item = self._memo.get(message, _message_size)
        if item is None:
            return 0
        role, size, count = item
        return _EMPTY_MESSAGE[role] + size + count

    def message_sizes(self, request: Request) -> tuple[int, list[int]]:
        """``(base, parts)`` with ``measure(request) == base + sum(parts)`` exactly: the body
        without messages or system text, and what each message adds in this history (a
        message merged into the one before adds its blocks only; system messages add
        their share of the ``system`` text)."""
        base = self.measure(dataclasses.replace(request, messages=()))
        parts: list[int] = []
        previous: str | None = None
        system_key: int | None = None
        for m in request.messages:
            if m.role is Role.SYSTEM:
                if not m.text:
                    parts.append(0)
                elif system_key is None:
                    probe = dataclasses.replace(request, messages=(Message.system("x"),))
                    system_key = self.measure(probe) - base - converted_size("x")
                    parts.append(system_key + converted_size(m.text))
                else:                          # joined with "\n\n": 4 bytes once escaped
                    parts.append(converted_size(m.text) - 2 + 4)
                continue
            item = self._memo.get(m, _message_size)
            if item is None:
                parts.append(0)
                continue
            role, size, count = item
            if role == previous:
                parts.append(size + count)     # its blocks join the previous message's
            else:
                parts.append(_EMPTY_MESSAGE[role] + size + count - 1 + (previous is not None))
                previous = role
        # Cache breakpoints (and a system block that carries one) are the last message's.
        rest = self.measure(request) - base - sum(parts)
        if rest and parts:
            parts[-1] += rest
        return base, parts

    def _read_reply(self, result: Any, size: int) -> Response:
        return _read_message(result, size, self.api)

    def _read_stream(self, stream: Any, on_text: TextCallback | None, size: int,
                     progress: StreamProgress) -> Response:
        return _read_stream(stream, on_text, size, self.api, progress)


# -- reading replies ------------------------------------------------------------------------

def _usage(usage: Any, earlier: Usage | None = None) -> Usage:
    """The SDK's ``Usage`` (or a ``message_delta``'s): ``prompt_tokens`` is input_tokens +
    cache_creation_input_tokens + cache_read_input_tokens — cached prompt tokens are
    prompt tokens too, the window holds all of them. What it leaves out is ``earlier``'s
    (a stream's ``message_start``)."""
    before = earlier or Usage()
    if usage is None:
        return before
    uncached, written, read = (field(usage, name) for name in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    written = written if isinstance(written, int) else before.cache_write_tokens
    read = read if isinstance(read, int) else before.cached_tokens
    total = before.prompt_tokens
    if isinstance(uncached, int):
        total = uncached + (written or 0) + (read or 0)
    output = field(usage, "output_tokens")
    long = field(field(usage, "cache_creation"), "ephemeral_1h_input_tokens")
    return Usage(total, output if isinstance(output, int) else before.completion_tokens,
                 read, written, _compaction_usage(usage, before.compaction),
                 long if isinstance(long, int) else before.cache_write_1h_tokens)


def _compaction_usage(usage: Any, earlier: Usage | None) -> Usage | None:
    """The usage of the ``compaction`` iteration among ``usage.iterations`` — the whole
    input as sent and the summary written, its cache reads and writes apart — or
    ``earlier`` (the top-level counts are the answer's, on the compacted input)."""
    iterations = field(usage, "iterations")
    if not isinstance(iterations, list):
        return earlier
    for entry in iterations:
        if field(entry, "type") == "compaction" and isinstance(field(entry, "input_tokens"), int):
            return _usage(entry)
    return earlier


def _stop(raw: str | None) -> StopReason:
    return STOP_REASONS.get(raw or "", StopReason.OTHER)


def _reply_block(block: Any) -> Block | None:
    kind = field(block, "type")
    if kind == "text":
        return Text(field(block, "text") or "")
    if kind == "thinking":
        return Reasoning(field(block, "thinking") or "", field(block, "signature") or None)
    if kind == "tool_use":
        return ToolCall(field(block, "id") or "", field(block, "name") or "",
                        json.dumps(field(block, "input"), ensure_ascii=False))
    if kind == "compaction":
        return _compaction(_as_dict(block))
    return None  # redacted_thinking, server tool blocks: not representable in our history


def _as_dict(block: Any) -> dict[str, Any]:
    """A reply block as the JSON the server sent (the SDK's model of it: the fields set)."""
    if isinstance(block, dict):
        return dict(block)
    to_dict = getattr(block, "to_dict", None)
    return dict(to_dict(mode="json")) if callable(to_dict) else {"type": field(block, "type")}


def _compaction(block: dict[str, Any]) -> Compaction | None:
    """A server compaction block read from a reply: ``data`` as sent, minus cache_control.
    None for a compaction that failed (null content: the API's no-op, which replaced
    nothing, so the history must keep what came before it)."""
    if not isinstance(block.get("content"), str):
        return None
    block.pop("cache_control", None)
    # ``type`` first, the rest as sent: a streamed block (started, then its delta set on
    # it) reads as the same data as the whole one.
    block = {"type": block.get("type"), **block}
    content = block.get("content")
    return Compaction("anthropic", json.dumps(block, ensure_ascii=False, separators=(",", ":")),
                      str(content))


def _first_compaction(blocks: list[Block]) -> list[Block]:
    """The reply's blocks with its compaction first (the contract's order)."""
    held = [b for b in blocks if isinstance(b, Compaction)]
    return held + [b for b in blocks if not isinstance(b, Compaction)] if held else blocks


def _edits(management: Any) -> tuple[ContextEdit, ...]:
    """``context_management.applied_edits`` as :class:`ContextEdit` s."""
    applied = field(management, "applied_edits") if management is not None else None
    out = []
    for edit in applied or ():
        kind = _EDIT_KINDS.get(field(edit, "type") or "")
        if kind is None:
            continue
        tokens = field(edit, "cleared_input_tokens")
        items = field(edit, "cleared_tool_uses" if kind == "clear_tool_uses"
                      else "cleared_thinking_turns")
        out.append(ContextEdit(kind, tokens if isinstance(tokens, int) else 0,
                               items if isinstance(items, int) else 0))
    return tuple(out)


def _read_message(message: Any, size: int, api: str) -> Response:
    """A whole reply: the SDK's ``Message`` or the JSON it is built from."""
    content = field(message, "content")
    raw = field(message, "stop_reason")
    if not content and raw != "refusal":
        raise no_answer(size, api, "no content in it" if content is None
                        else "an empty content list")
    blocks = [b for b in (_reply_block(x) for x in content or ()) if b is not None]
    return Response(Message(Role.ASSISTANT, tuple(_first_compaction(blocks))), _stop(raw),
                    _usage(field(message, "usage")), size, raw,
                    edits=_edits(field(message, "context_management")))


class _BlockParts:
    __slots__ = ("id", "input_given", "kind", "name", "parts", "signature", "whole")

    def __init__(self, start: Any) -> None:
        self.kind: str = getattr(start, "type", "")
        # A compaction block: as it started, its compaction_delta fields set on it.
        self.whole: dict[str, Any] | None = _as_dict(start) if self.kind == "compaction" \
            else None
        self.id: str = getattr(start, "id", "") or ""
        self.name: str = getattr(start, "name", "") or ""
        self.signature: str = getattr(start, "signature", "") or ""
        initial = getattr(start, "text", None) or getattr(start, "thinking", None) or ""
        self.input_given = False
        if self.kind == "tool_use" and getattr(start, "input", None):
            self.input_given = True
            # Normally the input streams as input_json_delta pieces after an empty {};
            # a server that sends it whole up front is taken at its word.
            initial = json.dumps(start.input, ensure_ascii=False)
        self.parts: list[str] = [initial] if initial else []

    def block(self) -> Block | None:
        joined = "".join(self.parts)
        if self.kind == "text":
            return Text(joined)
        if self.kind == "thinking":
            return Reasoning(joined, self.signature or None)
        if self.kind == "tool_use":
            return ToolCall(self.id, self.name, joined or "{}")
        if self.whole is not None:
            return _compaction(self.whole)
        return None


def _read_stream(stream: Any, on_text: TextCallback | None, size: int, api: str,
                 progress: StreamProgress) -> Response:
    blocks: dict[int, _BlockParts] = {}
    stop: str | None = None
    usage = Usage()
    edits: tuple[ContextEdit, ...] = ()
    for event in stream:
        kind = getattr(event, "type", None)
        if kind in _ANSWER_EVENTS:
            progress.said = True
        if kind == "message_start":
            usage = _usage(event.message.usage)
        elif kind == "content_block_start":
            blocks[event.index] = _BlockParts(event.content_block)
        elif kind == "content_block_delta":
            parts = blocks.get(event.index)
            if parts is None:
                continue
            delta = event.delta
            dkind = getattr(delta, "type", None)
            if dkind == "text_delta":
                parts.parts.append(delta.text)
                if on_text is not None and delta.text:
                    on_text(delta.text)
            elif dkind == "thinking_delta":
                parts.parts.append(delta.thinking)
            elif dkind == "signature_delta":
                parts.signature += delta.signature
            elif dkind == "input_json_delta":
                if parts.input_given:           # deltas follow after all: they are the input
                    parts.parts, parts.input_given = [], False
                parts.parts.append(delta.partial_json)
            elif dkind == "compaction_delta" and parts.whole is not None:
                # One delta with the whole content (the SDK's accumulator sets, not adds).
                for name in ("content", "encrypted_content"):
                    parts.whole[name] = getattr(delta, name, None)
        elif kind == "message_delta":
            stop = event.delta.stop_reason or stop
            usage = _usage(event.usage, usage)
            edits = _edits(getattr(event, "context_management", None)) or edits
    if stop is None:
        raise incomplete_reply(size, api, "no stop_reason arrived", empty=not progress.said)
    if not blocks and stop != "refusal":
        raise no_answer(size, api, "an event stream without a content block")
    result = [b for b in (blocks[i].block() for i in sorted(blocks)) if b is not None]
    return Response(Message(Role.ASSISTANT, tuple(_first_compaction(result))), _stop(stop),
                    usage, size, stop, edits=edits, streamed=True)


# Events that are part of an answer (``message_start`` carries the usage); ``ping`` is not.
_ANSWER_EVENTS = frozenset({"message_start", "content_block_start", "content_block_delta",
                            "message_delta"})
