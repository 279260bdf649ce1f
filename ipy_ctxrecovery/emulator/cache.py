"""The emulator's two prompt caches: :class:`PromptCache` (one per emulator, clock injected).

Token counts are the emulator's own (``replies.prompt_tokens``); the rules are
:mod:`ipy_ctxrecovery.core.caching`'s.

OpenAI (automatic): a request's prefix is its tools, then its messages, whole: the shared
prefix with a recent request of the same model (one used within its retention's life:
``OPENAI_CACHE_TTL`` in memory, a day with ``prompt_cache_retention="24h"``,
``caching.OPENAI_RETENTION_TTLS``) ends at the first message that differs. ``cached_tokens`` is that prefix's tokens, 0 below
1,024, in steps of 128 past it (``caching.openai_cached_tokens``).

Anthropic (breakpoints): the request is a list of blocks — each tool, each ``system``
block (a string is one), each message's content blocks (a string content is one) — and a
block's prefix tokens are the tokens of everything up to its end. At each ``cache_control``
block the cache looks for an entry written for the same model and the same prefix at that
block or at any of the 20 before it (``LOOKBACK_BLOCKS``); the furthest entry found is
read (``cache_read_input_tokens``) and its life starts again. Every breakpoint whose
prefix reaches the model's minimum (``caching.min_cacheable_tokens``) then writes (or
refreshes) its entry for its ``ttl`` (``5m`` by default, ``1h``): the tokens from the read
up to the last such breakpoint are ``cache_creation_input_tokens`` (split by TTL in
``cache_creation``), and ``input_tokens`` is what remains. More than four breakpoints,
a ``cache_control`` that is not ``{"type": "ephemeral"}`` with a ``5m``/``1h`` ttl, or one
on a thinking block, is a 400 (:func:`breakpoint_error`). A refused request reads and writes nothing.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import caching
from .replies import (
    BYTES_PER_TOKEN,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REQUEST,
    Turn,
    _text_of,
    count_tokens,
)

__all__ = ["CacheUsage", "PromptCache", "anthropic_blocks", "breakpoint_error",
           "retention_error"]

#: Recent prompts remembered per model on the OpenAI path, and Anthropic entries in all.
KEEP_PROMPTS = 32
KEEP_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """What one request read from and wrote to a cache (tokens)."""

    read: int = 0
    write: int = 0
    write_1h: int = 0
    """The part of ``write`` written with a one-hour TTL (Anthropic)."""


@dataclass(frozen=True, slots=True)
class Block:
    """One Anthropic block: the key of the prefix it ends, its prefix tokens, its
    ``cache_control`` (None when it has none)."""

    key: int
    tokens: int
    cache_control: Any = None


_PLAIN_TEXT = frozenset({"type", "text", "cache_control"})


def _content_key(value: Any) -> Any:
    """What a block's content is, for the cache key: its ``cache_control`` left out (a
    text block is keyed by its text, hashed once by Python; any other by its JSON)."""
    if type(value) is str:
        return value
    if type(value) is dict or isinstance(value, Mapping):
        if value.get("type") == "text" and value.keys() <= _PLAIN_TEXT:
            return ("text", value.get("text"))
        value = {k: v for k, v in value.items() if k != "cache_control"}
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _tokens(nbytes: int) -> int:
    return math.ceil(nbytes / BYTES_PER_TOKEN)


def _counted(block: Mapping[str, Any]) -> str:
    """What ``replies.anthropic_turns`` counts of a content block."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "thinking":
        return str(block.get("thinking", ""))
    if kind == "redacted_thinking":
        return str(block.get("data", ""))
    if kind in ("tool_use", "server_tool_use"):
        return str(block.get("name", "")) + json.dumps(block.get("input", {}))
    if kind == "tool_result":
        return _text_of(block.get("content"))
    return ""


def anthropic_blocks(body: Mapping[str, Any]) -> list[Block]:
    """The blocks of a Messages request in cache order (tools, system, messages), each with
    its prefix tokens: the last one's equal ``replies.prompt_tokens`` of the request."""
    key = hash(("model", str(body.get("model") or "")))
    blocks: list[Block] = []

    def add(marker: str, block: Any, tokens: int) -> None:
        # A chain of Python hashes: the key of a block stands for its whole prefix.
        nonlocal key
        key = hash((key, marker, _content_key(block)))
        control = block.get("cache_control") if isinstance(block, Mapping) else None
        blocks.append(Block(key, tokens, control))

    base = TOKENS_PER_REQUEST
    tools = body.get("tools") or None
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            add("tool", tool, base + count_tokens(json.dumps(tools[:i + 1])))
        base += count_tokens(json.dumps(tools))
    elif tools:
        base += count_tokens(json.dumps(tools))
    system = body.get("system")
    parts = [system] if isinstance(system, str) else \
        [p for p in system if isinstance(p, Mapping | str)] if isinstance(system, list) else []
    if _text_of(system):
        used = 0
        for part in parts:
            used += len(_text_of([part]).encode())
            add("system", part, base + TOKENS_PER_MESSAGE + _tokens(used))
        base += count_tokens(_text_of(system)) + TOKENS_PER_MESSAGE
    else:
        for part in parts:
            add("system", part, base)
    for message in body.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        marker = "message:" + str(message.get("role", "user"))
        content = message.get("content")
        if isinstance(content, str) or content is None:
            text = content or ""
            add(marker, {"type": "text", "text": text}, base + TOKENS_PER_MESSAGE
                + count_tokens(text))
            base += TOKENS_PER_MESSAGE + count_tokens(text)
            continue
        used = 0
        for block in content:
            if not isinstance(block, Mapping):
                continue
            used += len(_counted(block).encode())
            add(marker, block, base + TOKENS_PER_MESSAGE + _tokens(used))
            marker = "block"
        base += TOKENS_PER_MESSAGE + _tokens(used)
    return blocks


def _controls(body: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(where, value) of every ``cache_control`` in a Messages request, in cache order."""
    found: list[tuple[str, Any]] = []

    def look(where: str, block: Any) -> None:
        if isinstance(block, Mapping) and "cache_control" in block \
                and block["cache_control"] is not None:
            found.append((where, block["cache_control"]))

    for i, tool in enumerate(body.get("tools") or ()):
        look(f"tools.{i}", tool)
    system = body.get("system")
    if isinstance(system, list):
        for i, part in enumerate(system):
            look(f"system.{i}", part)
    for m, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for i, block in enumerate(content):
                look(f"messages.{m}.content.{i}", block)
    return found


def breakpoint_error(body: Mapping[str, Any]) -> str | None:
    """The API's 400 message for the request's ``cache_control`` blocks, or None if valid."""
    for m, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        for i, block in enumerate(content if isinstance(content, list) else ()):
            # The SDK's ThinkingBlockParam and RedactedThinkingBlockParam have no
            # cache_control (its text and tool_use blocks do): the API refuses one there.
            if isinstance(block, Mapping) and block.get("cache_control") is not None \
                    and block.get("type") in ("thinking", "redacted_thinking"):
                return (f"messages.{m}.content.{i}.{block['type']}.cache_control: "
                        "Extra inputs are not permitted")
    controls = _controls(body)
    for where, value in controls:
        if not isinstance(value, Mapping) or value.get("type") != "ephemeral":
            return f"{where}.cache_control.type: Input should be 'ephemeral'"
        ttl = value.get("ttl", caching.DEFAULT_TTL)
        if ttl not in caching.CACHE_TTLS:
            return f"{where}.cache_control.ephemeral.ttl: Input should be '5m' or '1h'"
    if len(controls) > caching.MAX_BREAKPOINTS:
        return caching.too_many_breakpoints(len(controls))
    return None


def retention_error(body: Mapping[str, Any]) -> str | None:
    """The OpenAI API's 400 message for the request's ``prompt_cache_retention``, or None."""
    value = body.get("prompt_cache_retention")
    if value is None or value in caching.OPENAI_RETENTION_TTLS:
        return None
    return (f"Invalid value: {json.dumps(value)}. Supported values are: "
            + " and ".join(f"'{v}'" for v in caching.OPENAI_RETENTION_TTLS) + ".")


@dataclass(slots=True)
class _Prompt:
    """A recent OpenAI prompt: its units' keys, tokens after each unit, its last use."""

    keys: tuple[int, ...]
    ends: tuple[int, ...]
    used: float
    life: float = caching.OPENAI_CACHE_TTL


class PromptCache:
    """Both caches of one emulator; ``clock`` (seconds, monotonic) is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._prompts: dict[str, deque[_Prompt]] = {}
        self._entries: OrderedDict[int, tuple[float, float]] = OrderedDict()

    def clear(self) -> None:
        with self._lock:
            self._prompts.clear()
            self._entries.clear()

    # -- OpenAI ---------------------------------------------------------------------------
    def openai(self, model: str, turns: Sequence[Turn], tools: Any = None,
               retention: str | None = None) -> CacheUsage:
        """The cached tokens of this prompt, which is then remembered as a recent one for
        its ``retention``'s life (``prompt_cache_retention``; None: in memory)."""
        keys = [hash(json.dumps(tools, sort_keys=True, default=str)) if tools else 0]
        total = TOKENS_PER_REQUEST + (count_tokens(json.dumps(tools)) if tools else 0)
        ends = [total]
        for t in turns:
            keys.append(hash((t.role, t.counted)))
            total += count_tokens(t.counted) + TOKENS_PER_MESSAGE
            ends.append(total)
        now = self._clock()
        with self._lock:
            recent = self._prompts.setdefault(model, deque(maxlen=KEEP_PROMPTS))
            live = [p for p in recent if now - p.used < p.life]
            shared, best = 0, None
            for p in live:
                n = _common(p.keys, keys)
                if n and p.ends[n - 1] > shared:
                    shared, best = p.ends[n - 1], p
            if best is not None:
                best.used = now
            recent.clear()
            recent.extend(live)
            life = caching.OPENAI_RETENTION_TTLS.get(retention or "in_memory",
                                                     caching.OPENAI_CACHE_TTL)
            recent.append(_Prompt(tuple(keys), tuple(ends), now, life))
        return CacheUsage(read=min(caching.openai_cached_tokens(shared), total))

    # -- Anthropic --------------------------------------------------------------------------
    def anthropic(self, body: Mapping[str, Any], betas: frozenset[str] = frozenset()
                  ) -> CacheUsage:
        """Read and write this request's breakpoints (``breakpoint_error`` already None).
        A ``1h`` TTL lives an hour only with the ``extended-cache-ttl-2025-04-11`` beta
        among ``betas``; without it the entry is a five-minute one, as the API keeps it."""
        long_ok = caching.EXTENDED_TTL_BETA in betas
        if not _controls(body):
            return CacheUsage()
        blocks = anthropic_blocks(body)
        marks = [i for i, b in enumerate(blocks) if b.cache_control is not None]
        least = caching.min_cacheable_tokens(str(body.get("model") or ""))
        now = self._clock()
        with self._lock:
            self._expire(now)
            read_at = -1
            for mark in marks:
                for j in range(mark, max(-1, mark - caching.LOOKBACK_BLOCKS - 1), -1):
                    if blocks[j].key in self._entries:
                        read_at = max(read_at, j)
                        break
            if read_at >= 0:
                key = blocks[read_at].key
                _, life = self._entries[key]
                self._entries[key] = (now + life, life)
                self._entries.move_to_end(key)
            read = blocks[read_at].tokens if read_at >= 0 else 0
            written = write_1h = 0
            done = read
            for mark in marks:
                block = blocks[mark]
                if block.tokens < least:
                    continue
                ttl = block.cache_control.get("ttl", caching.DEFAULT_TTL)
                if not long_ok:
                    ttl = caching.DEFAULT_TTL
                life = caching.CACHE_TTLS[ttl]
                self._entries[block.key] = (now + life, life)
                self._entries.move_to_end(block.key)
                if mark > read_at and block.tokens > done:
                    written += block.tokens - done
                    if ttl == "1h":
                        write_1h += block.tokens - done
                    done = block.tokens
            while len(self._entries) > KEEP_ENTRIES:
                self._entries.popitem(last=False)
        return CacheUsage(read=read, write=written, write_1h=write_1h)

    def _expire(self, now: float) -> None:
        for key in [k for k, (until, _) in self._entries.items() if until <= now]:
            del self._entries[key]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
