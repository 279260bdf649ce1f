"""The provider seam: one ``send`` method, plus ``encode`` for the exact request bytes.

A provider hides a wire format. ``encode(request)`` returns the exact serialized body
bytes the SDK will put on the wire (pre-flight measures these); ``send`` performs the
request and either returns a :class:`Response` or raises :class:`ChatError` whose
``failure`` was classified with ``request_bytes`` attached. SDK exceptions never cross
this boundary.

Optional capability — :class:`Measurable`: a provider may also offer
``measure(request) -> int``, a fast ``len(encode(request))`` (within 1%, exact for the
built-in adapters) that skips the SDK's request pipeline. Callers that size many
candidate histories (the compactor's search) use it when present
(``isinstance(provider, Measurable)``) and fall back to ``len(encode(...))``; the bytes
actually sent are still measured with ``encode``. It is not a required ``Provider``
member, so test fakes and third-party providers need not implement it.

:func:`prepare` gives pre-flight a :class:`Prepared` — body size and the max_tokens the
body carries — from any provider: the built-in adapters answer it without encoding (the
size is ``measure``'s, exact; the max_tokens is data, never read back from bytes), and
``send`` then encodes the request exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from ..core.catalogue import ModelInfo
from ..core.history import History, Message

__all__ = [
    "AdvertisesWindow",
    "Caching",
    "Cancel",
    "ClearToolUses",
    "Closable",
    "ContextEdit",
    "ContextManagement",
    "CountsTokens",
    "DefaultsMaxTokens",
    "Measurable",
    "Prepared",
    "Provider",
    "Refreshable",
    "Request",
    "Response",
    "StopReason",
    "TextCallback",
    "ToolSpec",
    "Usage",
    "prepare",
]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model: name, description, JSON-schema ``parameters``."""

    name: str
    description: str
    parameters: Mapping[str, Any]


class Cancel:
    """Set by a caller that has given up on a send (the turn's deadline passed): the
    provider stops at once and releases its connection. What a provider registers with
    :meth:`on_cancel` is run (once) when it is set, on the caller's thread."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._actions: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            actions, self._actions = self._actions, []
        for action in actions:
            action()

    def on_cancel(self, action: Callable[[], None]) -> None:
        """Run ``action`` when this is set (now, if it already is)."""
        with self._lock:
            if not self._event.is_set():
                self._actions.append(action)
                return
        action()


@dataclass(frozen=True, slots=True)
class Caching:
    """Prompt-caching breakpoints for a request, on a wire that takes them (Anthropic's):
    a breakpoint is placed only where the prefix before it is estimated, at
    ``bytes_per_token`` body bytes a token, to reach the model's minimum cacheable length."""

    bytes_per_token: float = 4.0
    keep: int | None = None
    """How many leading messages of the history the session expects to send unchanged
    for a while (before the first one a batched rewrite may still change): a breakpoint
    after them, so the request that rewrites a later message still reads them from the
    cache (None: none)."""
    retention: str = "auto"
    """How long the cache should live (the ``cache_retention`` setting, decided for this
    request): "long" — Anthropic's breakpoints get ``ttl: "1h"``, OpenAI is sent
    ``prompt_cache_retention: "24h"``; "short" — 5-minute breakpoints, OpenAI's
    ``"in_memory"``; "auto" — the provider's default (nothing sent). OpenAI's values only
    where the model takes them (``core.caching.openai_retentions``)."""
    key: str | None = None
    """OpenAI's ``prompt_cache_key``: the conversation's, so its requests are routed to the
    machines that hold its prefix rather than by the first tokens alone, which every
    conversation with the same system prompt shares (None: not sent)."""


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    """Anthropic's ``clear_tool_uses_20250919`` edit: past ``trigger`` input tokens the
    server clears old tool results (their inputs too with ``clear_inputs``), keeping the
    latest ``keep`` tool uses, and only when it clears at least ``clear_at_least`` tokens."""

    trigger: int
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: tuple[str, ...] = ()
    clear_inputs: bool = False


@dataclass(frozen=True, slots=True)
class ContextManagement:
    """What a request asks of the provider's own context management (the
    ``server_compaction`` setting and context editing; see docs/server-compaction.md).

    A provider that cannot do a part of it leaves that part out of the body: asking is
    never an error. ``compact_trigger`` (input tokens) turns on server compaction:
    Anthropic's ``compact_20260112`` edit, OpenAI's Responses ``context_management``
    ``compact_threshold``."""

    compact_trigger: int | None = None
    compact_instructions: str | None = None
    clear_tool_uses: ClearToolUses | None = None
    clear_thinking: bool = False
    """Anthropic's ``clear_thinking_20251015``: old thinking blocks are cleared."""


@dataclass(frozen=True, slots=True)
class ContextEdit:
    """An edit the server applied to a request's context before the model read it
    (Anthropic's ``context_management.applied_edits``)."""

    kind: str                   # "clear_tool_uses" | "clear_thinking"
    cleared_tokens: int = 0
    cleared_items: int = 0      # tool uses or thinking turns cleared


@dataclass(frozen=True, slots=True)
class Request:
    messages: History
    max_tokens: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    stream: bool = True
    retries: bool = True
    """Whether the SDK may resend it on its own after a failure. False for a body that
    may be refused for its size: the session's recovery then decides every resend."""
    max_reply: int | None = None
    """The largest reply body read (bytes; None: no bound); a larger one is refused unread."""
    cancel: Cancel | None = field(default=None, compare=False)
    """Set when the caller has given up on this send (the provider stops and lets go)."""
    caching: Caching | None = Caching()
    """Cache breakpoints to place (None: none; the ``prompt_caching`` setting)."""
    context: ContextManagement | None = None
    """The provider's own context management to ask for (None: none)."""


class StopReason(StrEnum):
    """Why the model stopped, neutral across wire formats."""

    END = "end"                 # openai "stop", anthropic "end_turn"/"stop_sequence"
    LENGTH = "length"           # openai "length", anthropic "max_tokens"
    TOOL_CALLS = "tool_calls"   # openai "tool_calls", anthropic "tool_use"
    FILTERED = "content_filter"  # openai "content_filter", anthropic "refusal"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a reply used, as the provider reported them (None: not reported).

    ``prompt_tokens`` is the whole input on both wires: the uncached part, plus what was
    read from the prompt cache (``cached_tokens``: OpenAI's ``prompt_tokens_details.
    cached_tokens``, Anthropic's ``cache_read_input_tokens``), plus what was written to it
    (``cache_write_tokens``: Anthropic's ``cache_creation_input_tokens``; OpenAI writes
    without saying so).
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    """Of ``prompt_tokens`` (the whole input), those read from the provider's prompt cache."""
    cache_write_tokens: int = 0
    """Of ``prompt_tokens``, those written to the prompt cache (Anthropic)."""
    compaction: Usage | None = None
    """The server's compaction's own usage, when it compacted the request before answering
    (Anthropic's ``usage.iterations`` entry of type ``compaction``): its ``prompt_tokens``
    are the input as sent, its ``completion_tokens`` the summary it wrote. The fields
    above are then the answer's, on the compacted input; both are billed."""
    cache_write_1h_tokens: int = 0
    """Of ``cache_write_tokens``, those written with a one-hour TTL (Anthropic's
    ``cache_creation.ephemeral_1h_input_tokens``), billed at 2× input instead of 1.25×."""

    @property
    def reported(self) -> bool:
        """Whether the reply said how many tokens it used at all."""
        return self.prompt_tokens is not None or self.completion_tokens is not None

    @property
    def compaction_input_tokens(self) -> int | None:
        """The input as sent, where the server compacted it (``compaction``); else None."""
        return None if self.compaction is None else self.compaction.prompt_tokens

    def billed(self) -> Usage:
        """Every token billed: the answer's and the server compaction's (None stays None
        where neither reported it)."""
        c = self.compaction
        if c is None:
            return self

        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(add(self.prompt_tokens, c.prompt_tokens),
                     add(self.completion_tokens, c.completion_tokens),
                     self.cached_tokens + c.cached_tokens,
                     self.cache_write_tokens + c.cache_write_tokens,
                     cache_write_1h_tokens=self.cache_write_1h_tokens + c.cache_write_1h_tokens)

    @property
    def uncached_input(self) -> int | None:
        """The input billed at the full price: ``prompt_tokens`` less cache reads and
        writes (None when the prompt tokens were not reported)."""
        if self.prompt_tokens is None:
            return None
        return max(0, self.prompt_tokens - (self.cached_tokens or 0)
                   - (self.cache_write_tokens or 0))


@dataclass(frozen=True, slots=True)
class Response:
    message: Message            # the assistant message (text, reasoning, tool calls)
    stop: StopReason
    usage: Usage
    body_bytes: int             # size of the request body that produced it
    raw_stop: str | None = None
    edits: tuple[ContextEdit, ...] = ()
    """Edits the server applied to the request's context (context editing)."""
    response_id: str | None = None
    """The provider's id for this reply (the Responses API's, for ``previous_response_id``)."""
    chained: bool = False
    """The request sent only what was new after a ``previous_response_id`` (the Responses
    API with ``store``): its usage counts the stored items too, not only ``body_bytes``."""
    streamed: bool = False
    """Read from an event stream. A streamed reply whose ``usage`` is not ``reported`` is a
    server that leaves usage out of streams (llama-cpp-python, servers that ignore
    ``stream_options.include_usage``): only its unstreamed replies say how many tokens a
    body held."""


TextCallback = Callable[[str], None]


@runtime_checkable
class Provider(Protocol):
    model: str                  # full spec, e.g. "openai:gpt-4o-mini", "emulator"
    info: ModelInfo

    def encode(self, request: Request) -> bytes:
        """The exact request body bytes ``send`` would put on the wire."""
        ...

    def send(self, request: Request, on_text: TextCallback | None = None) -> Response:
        """Send; stream text deltas to ``on_text``; raise ChatError on failure."""
        ...


@runtime_checkable
class Measurable(Protocol):
    """Optional provider capability: a fast size of the request body (see module docstring)."""

    def measure(self, request: Request) -> int:
        """``len(encode(request))`` computed cheaply; within 1% of it, ideally exact."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """Optional provider capability: the exact input tokens of a request, from the
    provider's own counter (Anthropic's ``count_tokens``, the Responses API's
    ``input_tokens``, an OpenAI-compatible server's tokenize endpoint). One bounded
    request; None when the server has no counter or did not answer."""

    def count_tokens(self, request: Request) -> int | None:
        ...


@runtime_checkable
class DefaultsMaxTokens(Protocol):
    """Optional provider capability: the max_tokens it sends when a request sets none
    (the Anthropic API requires one), so pre-flight can reserve room for it."""

    @property
    def default_max_tokens(self) -> int:
        ...


@runtime_checkable
class AdvertisesWindow(Protocol):
    """Optional provider capability: ask the server the model's context window (one
    bounded request; None when it does not say)."""

    def advertised_window(self) -> int | None:
        ...


@runtime_checkable
class Refreshable(Protocol):
    """Optional provider capability: re-read credentials after an auth failure."""

    def refresh(self) -> None:
        ...


@runtime_checkable
class Closable(Protocol):
    """Optional provider capability: release what the provider opened (its client)."""

    def close(self) -> None:
        ...
@dataclass(frozen=True, slots=True)
class Prepared:
    """A request as pre-flight sees it: the exact size of its body and the max_tokens the
    body carries (the provider's default when the request sets none; None: not sent).
    It holds no body: ``send`` encodes the request once, and nothing keeps the bytes."""

    request: Request
    size: int
    max_tokens: int | None


def prepare(provider: Provider, request: Request) -> Prepared:
    """:class:`Prepared` for any provider: its own ``prepare`` when it has one; else the
    size from ``measure`` (or ``len(encode())``) and the max_tokens from the request, or
    from the provider's ``default_max_tokens`` attribute (data, never parsed from a body)."""
    own = getattr(provider, "prepare", None)
    if callable(own):
        prepared = own(request)
        if isinstance(prepared, Prepared):
            return prepared
    measure = getattr(provider, "measure", None)
    size = int(measure(request)) if callable(measure) else len(provider.encode(request))
    default = getattr(provider, "default_max_tokens", None)
    sent = request.max_tokens if request.max_tokens is not None else default
    return Prepared(request, size, sent if isinstance(sent, int) else None)
