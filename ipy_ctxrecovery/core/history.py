"""The history model: messages, content blocks, ages, sizes, validity, and the dict forms.

A history is an immutable ``tuple[Message, ...]``. Every step of the recovery core takes a
history and returns a new one; nothing edits what it was given.

Conversion to and from OpenAI-style chat message dicts (the common interchange format)
lives here and only here; the Anthropic adapter converts from our blocks directly.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "Block",
    "Compaction",
    "History",
    "Message",
    "Reasoning",
    "Role",
    "Text",
    "ToolCall",
    "ToolResult",
    "ages",
    "char_size",
    "from_openai",
    "is_server_compaction",
    "leading_compaction",
    "latest_user_index",
    "problems",
    "storable",
    "to_openai",
    "unstorable_at",
]


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_PACK_MIN_CHARS = 2048
"""Shorter text is kept as it is: what packing could save is less than it costs."""


def _pack(text: str) -> str | bytes:
    """``text`` as a :class:`Text` keeps it: its UTF-8 bytes when they take at most three
    quarters of the str's memory, else the str itself.

    CPython stores a str at the width of its widest character: one "—" makes a long English
    text two bytes a character, one emoji four, while its UTF-8 stays about one. CJK text
    (three UTF-8 bytes a character against two) and ASCII are kept as str.
    """
    if len(text) < _PACK_MIN_CHARS or text.isascii():
        return text
    raw = text.encode("utf-8", "surrogatepass")    # lone surrogates come back the same
    return raw if 4 * len(raw) <= 3 * sys.getsizeof(text) else text


@dataclass(frozen=True, slots=True, init=False, repr=False, match_args=False)
class Text:
    """A text block. Its ``text`` is kept packed (:func:`_pack`) and given back as a str;
    equal texts make equal blocks however they are kept."""

    _kept: str | bytes
    _chars: int

    __match_args__ = ("text",)

    def __init__(self, text: str) -> None:
        object.__setattr__(self, "_kept", _pack(text))
        object.__setattr__(self, "_chars", len(text))

    @property
    def text(self) -> str:
        kept = self._kept
        return kept if isinstance(kept, str) else kept.decode("utf-8", "surrogatepass")

    @property
    def chars(self) -> int:
        """``len(self.text)``, without unpacking it."""
        return self._chars

    @property
    def packed(self) -> bool:
        """Kept as UTF-8: each ``text`` is a new str that no history holds."""
        return type(self._kept) is not str

    def __repr__(self) -> str:
        return f"Text({self.text!r})"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A reasoning/thinking block. ``signature`` is Anthropic's, needed to send it back."""

    text: str
    signature: str | None = None
    id: str | None = None
    """The provider's id for it (OpenAI Responses reasoning items), sent back with it;
    ``signature`` then holds the item's ``encrypted_content``."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """A provider's server-side compaction: what the server wrote in place of everything
    before it (Anthropic's ``compaction`` block, OpenAI's ``compaction`` item).

    ``data`` is the block or item as the server sent it (JSON text, without any
    ``cache_control``) and goes back verbatim: its ``encrypted_content`` and ``signature``
    must round-trip unchanged. ``summary`` is the readable text the server wrote, where
    it wrote one (Anthropic's ``content``); None for an opaque item (OpenAI's) or a
    compaction that failed (Anthropic's null content, which the server treats as a no-op).
    """

    wire: str
    """The wire whose server wrote it ("anthropic" or "openai"): only that one reads it."""
    data: str
    summary: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call by the assistant; ``arguments`` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    content: str
    is_error: bool = False
    name: str | None = None


Block = Text | Reasoning | ToolCall | ToolResult | Compaction

# Tags mark messages the package itself wrote, so they can be found, replaced, not stacked.
TAG_PAYLOAD_NOTICE = "payload_notice"
TAG_COMPACTION_NOTICE = "compaction_notice"
TAG_SUMMARY = "summary"
TAG_CONTINUATION = "continuation"
TAG_SYNTHETIC_RESULT = "synthetic_result"
TAG_PINNED_RULES = "pinned_rules"
"""The user's standing instructions, kept verbatim across compactions (``core/pins.py``)."""
TAG_USER_WORDS = "user_words"
"""The user's own messages a summary replaced, kept verbatim after it (``core/pins.py``)."""
TAG_SERVER_COMPACTION = "server_compaction"
"""An assistant message holding only a :class:`Compaction`: the provider's server
summarized everything before it, which is no longer sent (the transcript keeps it)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message. A ``tool`` message holds exactly one :class:`ToolResult` block."""

    role: Role
    blocks: tuple[Block, ...] = ()
    tag: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def system(cls, text: str, *, tag: str | None = None) -> Message:
        return cls(Role.SYSTEM, (Text(text),), tag=tag)

    @classmethod
    def user(cls, text: str, *, tag: str | None = None) -> Message:
        return cls(Role.USER, (Text(text),), tag=tag)

    @classmethod
    def assistant(cls, text: str = "", tool_calls: Iterable[ToolCall] = (),
                  reasoning: str | None = None, *, tag: str | None = None) -> Message:
        blocks: list[Block] = []
        if reasoning:
            blocks.append(Reasoning(reasoning))
        if text:
            blocks.append(Text(text))
        blocks.extend(tool_calls)
        return cls(Role.ASSISTANT, tuple(blocks), tag=tag)

    @classmethod
    def tool(cls, call_id: str, content: str, *, is_error: bool = False,
             name: str | None = None, tag: str | None = None) -> Message:
        return cls(Role.TOOL, (ToolResult(call_id, content, is_error, name),), tag=tag)

    # -- views --------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The visible text: text blocks joined (a tool message's result content)."""
        if self.role is Role.TOOL:
            return "".join(b.content for b in self.blocks if isinstance(b, ToolResult))
        return "".join(b.text for b in self.blocks if isinstance(b, Text))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(b for b in self.blocks if isinstance(b, ToolCall))

    @property
    def tool_result(self) -> ToolResult | None:
        for b in self.blocks:
            if isinstance(b, ToolResult):
                return b
        return None

    def with_blocks(self, blocks: Iterable[Block]) -> Message:
        return Message(self.role, tuple(blocks), self.tag, self.meta)

    def char_size(self) -> int:
        """Characters of content (text, reasoning, call names/arguments, results)."""
        total = 0
        for b in self.blocks:
            if isinstance(b, Text):
                total += b.chars
            elif isinstance(b, Reasoning):
                total += len(b.text)
            elif isinstance(b, ToolCall):
                total += len(b.name) + len(b.arguments) + len(b.id)
            elif isinstance(b, Compaction):
                total += len(b.data)
            else:
                total += len(b.content) + len(b.call_id)
        return total

    # -- our own JSON form (transcript files) --------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role.value, "blocks": [_block_to_dict(b) for b in self.blocks]}
        if self.tag:
            out["tag"] = self.tag
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        return cls(Role(data["role"]), tuple(_block_from_dict(b) for b in data.get("blocks", ())),
                   data.get("tag"), dict(data.get("meta", {})))


History = tuple[Message, ...]


def _block_to_dict(block: Block) -> dict[str, Any]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Reasoning):
        out = {"type": "reasoning", "text": block.text, "signature": block.signature}
        if block.id is not None:
            out["id"] = block.id
        return out
    if isinstance(block, Compaction):
        return {"type": "compaction", "wire": block.wire, "data": block.data,
                "summary": block.summary}
    if isinstance(block, ToolCall):
        return {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.arguments}
    return {"type": "tool_result", "call_id": block.call_id, "content": block.content,
            "is_error": block.is_error, "name": block.name}


def _block_from_dict(data: Mapping[str, Any]) -> Block:
    kind = data["type"]
    if kind == "text":
        return Text(data["text"])
    if kind == "reasoning":
        return Reasoning(data["text"], data.get("signature"), data.get("id"))
    if kind == "compaction":
        return Compaction(data["wire"], data["data"], data.get("summary"))
    if kind == "tool_call":
        return ToolCall(data["id"], data["name"], data.get("arguments", "{}"))
    if kind == "tool_result":
        return ToolResult(data["call_id"], data["content"], bool(data.get("is_error")), data.get("name"))
    raise ValueError(f"unknown block type {kind!r}")


# -- whole-history helpers ----------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def unstorable_at(text: str) -> int | None:
    """Where ``text`` holds a lone surrogate (not valid Unicode: it cannot be written as
    UTF-8), or None when it can be stored."""
    found = _SURROGATE.search(text)
    return found.start() if found else None


def storable(message: Message) -> Message:
    """``message`` with any lone surrogate replaced by U+FFFD, so what is kept in memory is
    exactly what can be written to disk (the same object when there is none)."""
    def fix(text: str) -> str:
        return _SURROGATE.sub("\ufffd", text)

    blocks = []
    changed = False
    for block in message.blocks:
        if isinstance(block, Text) and unstorable_at(block.text) is not None:
            block = Text(fix(block.text))
            changed = True
        elif isinstance(block, Reasoning) and unstorable_at(block.text) is not None:
            block = dataclasses.replace(block, text=fix(block.text))
            changed = True
        elif isinstance(block, ToolCall) and unstorable_at(block.arguments) is not None:
            block = dataclasses.replace(block, arguments=fix(block.arguments))
            changed = True
        elif isinstance(block, ToolResult) and unstorable_at(block.content) is not None:
            block = dataclasses.replace(block, content=fix(block.content))
            changed = True
        blocks.append(block)
    return message.with_blocks(blocks) if changed else message


def char_size(history: Sequence[Message]) -> int:
    return sum(m.char_size() for m in history)


def ages(history: Sequence[Message]) -> list[int]:
    """Age of each message in model round trips: assistant messages strictly after it.

    Counting round trips rather than user turns means a long tool loop inside one user
    request still ages its old results.
    """
    result = [0] * len(history)
    seen = 0
    for i in range(len(history) - 1, -1, -1):
        result[i] = seen
        if history[i].role is Role.ASSISTANT:
            seen += 1
    return result


def is_server_compaction(message: Message) -> bool:
    """Whether ``message`` is a provider's server compaction (:data:`TAG_SERVER_COMPACTION`)."""
    return any(isinstance(b, Compaction) for b in message.blocks)


def leading_compaction(history: Sequence[Message]) -> Compaction | None:
    """The server compaction ``history`` opens with, None without one. It comes first after
    the system messages — it replaced everything before it (:func:`problems`), and the APIs
    refuse a compaction anywhere else — or after other messages the package wrote (tagged):
    only the history's head is looked at, O(1) per request."""
    for m in history:
        if m.tag == TAG_SERVER_COMPACTION:
            return next((b for b in m.blocks if isinstance(b, Compaction)), None)
        if m.role is not Role.SYSTEM and m.tag is None:
            return None
    return None


def latest_user_index(history: Sequence[Message]) -> int | None:
    """Index of the latest real user request (not a notice, summary or continuation)."""
    fallback = None
    for i in range(len(history) - 1, -1, -1):
        m = history[i]
        if m.role is Role.USER:
            if m.tag is None:
                return i
            if fallback is None and m.tag == TAG_CONTINUATION:
                fallback = i
    return fallback


def problems(history: Sequence[Message]) -> list[str]:
    """What makes ``history`` unsendable; empty when valid.

    Rules: the first non-system message is ``user`` (or a server compaction, which stands
    for everything before it); every assistant message's tool calls
    are answered, each exactly once, by the ``tool`` messages that immediately follow it;
    no ``tool`` message stands anywhere else.
    """
    found: list[str] = []
    first = next((m for m in history if m.role is not Role.SYSTEM), None)
    if first is not None and first.role is not Role.USER and not is_server_compaction(first):
        found.append(f"first non-system message is {first.role.value}, not user")
    i = 0
    n = len(history)
    while i < n:
        m = history[i]
        if m.role is Role.TOOL:
            found.append(f"message {i}: tool result without a preceding tool call")
            i += 1
            continue
        if m.role is Role.ASSISTANT and m.tool_calls:
            wanted = [c.id for c in m.tool_calls]
            j = i + 1
            got: list[str] = []
            while j < n and history[j].role is Role.TOOL:
                r = history[j].tool_result
                got.append(r.call_id if r else "")
                j += 1
            if sorted(got) != sorted(wanted):
                found.append(f"message {i}: tool calls {wanted} answered by {got}")
            i = j
            continue
        i += 1
    return found


# -- OpenAI-style dicts ---------------------------------------------------------------------

def to_openai(history: Sequence[Message]) -> list[dict[str, Any]]:
    """Chat Completions message dicts. Reasoning blocks are not sent (the API has no field)."""
    out: list[dict[str, Any]] = []
    for m in history:
        if m.role is Role.TOOL:
            r = m.tool_result
            assert r is not None
            out.append({"role": "tool", "tool_call_id": r.call_id, "content": r.content})
        elif m.role is Role.ASSISTANT:
            d: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                d["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments}}
                    for c in m.tool_calls
                ]
            elif d["content"] is None:
                d["content"] = ""
            out.append(d)
        else:
            out.append({"role": m.role.value, "content": m.text})
    return out


def from_openai(messages: Iterable[Mapping[str, Any]]) -> History:
    """Parse Chat Completions message dicts (content as a string or a list of text parts)."""
    result: list[Message] = []
    names: dict[str, str] = {}
    for d in messages:
        role = Role("system" if d["role"] == "developer" else d["role"])
        content = d.get("content")
        if isinstance(content, list):
            text = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        else:
            text = content or ""
        if role is Role.TOOL:
            call_id = d.get("tool_call_id", "")
            result.append(Message.tool(call_id, text, name=names.get(call_id)))
        elif role is Role.ASSISTANT:
            calls = []
            for c in d.get("tool_calls") or ():
                fn = c.get("function", {})
                args = fn.get("arguments", "{}")
                if not isinstance(args, str):
                    args = json.dumps(args)
                calls.append(ToolCall(c["id"], fn.get("name", ""), args))
                names[c["id"]] = fn.get("name", "")
            reasoning = d.get("reasoning_content") or d.get("reasoning")
            result.append(Message.assistant(text, calls, reasoning if isinstance(reasoning, str) else None))
        else:
            result.append(Message(role, (Text(text),)))
    return tuple(result)
