"""The Anthropic path's context management: server compaction, context editing, token
counting (no I/O, no HTTP).

What the Messages API does with ``context_management`` (platform.claude.com/docs/en/
build-with-claude/compaction and …/context-editing), played by the emulator's token rule:

* **Beta headers.** ``context_management`` needs ``anthropic-beta`` ``compact-2026-01-12``
  or ``context-management-2025-06-27``; without either the API answers 400
  ``context_management: Extra inputs are not permitted`` (the body recorded in
  anthropics/claude-code#14135). ``compact_20260112`` needs the first, the two clearing
  edits the second; a ``compaction`` block sent back needs the first.
* **A compaction block sent back** (in an assistant message): everything before the last
  one that has ``content`` is ignored, and the block counts as its ``content``. A block
  with null content is a no-op. Its ``encrypted_content`` is the emulator's seal over the
  content: a block whose content was changed is refused (``compaction_content_mismatch``,
  an error code of the SDK's ``CompactionContentMismatchError``); one in a user message is
  misplaced (``compaction_block_misplaced``).
* **``clear_thinking_20251015``** (listed first when several edits are given) keeps the
  thinking blocks of the last ``keep`` assistant turns that have some (default 1, or
  ``"all"``), then **``clear_tool_uses_20250919``**: once the prompt passes ``trigger``
  (default 100,000 input tokens, or a number of tool uses), the oldest tool results — not
  the latest ``keep`` (3) tool uses, not those of ``exclude_tools`` — are replaced by
  :data:`CLEARED_TOOL_RESULT` (their inputs by ``{}`` with ``clear_tool_inputs``), unless
  that clears fewer than ``clear_at_least`` tokens. Each edit that cleared something is in
  ``context_management.applied_edits`` with its ``cleared_input_tokens`` and the turns or
  tool uses it cleared.
* **``compact_20260112``**: once the prompt (after the edits) reaches ``trigger``
  (default 150,000; the emulator accepts any value of at least
  :data:`MIN_COMPACT_TRIGGER`, the catalogue's ``min_compact_trigger`` for ``emulator``;
  below it the request is a 400), the reply starts with a ``compaction`` block whose
  ``content`` is :func:`summary_of` what it replaced — every message of the request (the
  request being answered included) — and the answer is computed on that summary and the
  request it answers. ``pause_after_compaction``: the reply is the block alone, stop
  reason ``compaction``. Streamed: ``content_block_start`` (a compaction block with null
  content), one ``compaction_delta`` with the content and ``encrypted_content``,
  ``content_block_stop``. With the compaction beta every reply's usage carries
  ``iterations`` (a ``compaction`` entry first when one ran, whose tokens the top-level
  fields leave out, then the ``message`` entry).
* **``count_tokens``** applies compaction blocks and the clearing edits, never compacts:
  ``{"input_tokens": N}``, plus ``context_management.original_input_tokens`` when asked.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.catalogue import SERVER_COMPACTION_FAMILIES
from . import replies
from .faults import Answer, _date, request_id

__all__ = [
    "CLEARED_TOOL_RESULT",
    "COMPACT_BETA",
    "CONTEXT_BETA",
    "MIN_COMPACT_TRIGGER",
    "Managed",
    "Rejection",
    "betas_of",
    "count_answer",
    "finish_events",
    "finish_message",
    "manage",
    "rejection_answer",
    "seal",
    "summary_of",
]

COMPACT_BETA = "compact-2026-01-12"
CONTEXT_BETA = "context-management-2025-06-27"
COMPACT = "compact_20260112"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
EDIT_TYPES = (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT)
MIN_COMPACT_TRIGGER = SERVER_COMPACTION_FAMILIES["emulator"]
"""The lowest compaction trigger the emulator accepts (the API's is 50,000)."""
DEFAULT_COMPACT_TRIGGER = 150_000
DEFAULT_CLEAR_TRIGGER = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1
CLEARED_TOOL_RESULT = "[Tool result cleared by context management]"
"""What a cleared tool result reads (the API writes a placeholder of its own)."""
NOT_PERMITTED = "context_management: Extra inputs are not permitted"
"""The API's 400 for ``context_management`` without a beta header (claude-code#14135)."""
#: Characters of each user request a summary quotes, and how many requests it quotes.
QUOTE_CHARS = 60
QUOTED_REQUESTS = 12
SUMMARY_HEAD = "[Emulator compaction summary"
_SEAL_PREFIX = "emu-compaction-v1:"


@dataclass(frozen=True, slots=True)
class Rejection:
    """A 400 the API gives such a request: its message and ``details.error_code``."""

    message: str
    code: str | None = None


@dataclass(frozen=True, slots=True)
class Managed:
    """A request after its context management: ``body`` is what the model reads (compaction
    blocks as the text of their content, everything before the last one gone, the
    clearing edits applied) and what the token rule counts."""

    body: dict[str, Any]
    requested: bool = False
    """The request carried ``context_management`` (the reply then says what was applied)."""
    compaction_beta: bool = False
    """The compaction beta was on: the reply's usage carries ``iterations``."""
    original_tokens: int = 0
    """The prompt tokens of the request as sent (count_tokens' ``original_input_tokens``)."""
    applied: tuple[dict[str, Any], ...] = ()
    compaction: dict[str, Any] | None = None
    """The compaction block this request wrote (None: none ran)."""
    compaction_usage: tuple[int, int] = (0, 0)
    """(input, output) tokens of the compaction step."""
    pause: bool = False
    plan_body: dict[str, Any] | None = None
    """After a compaction, what the answer is computed on: the summary and the request."""
    notes: dict[str, Any] = field(default_factory=dict)


def betas_of(header: str | None) -> frozenset[str]:
    """The beta names of an ``anthropic-beta`` header (comma-separated)."""
    if not header:
        return frozenset()
    return frozenset(p.strip() for p in header.split(",") if p.strip())


def seal(content: str) -> str:
    """The emulator's ``encrypted_content`` for a compaction block's ``content``."""
    return _SEAL_PREFIX + hashlib.sha256(content.encode()).hexdigest()[:40]


def _tokens(body: Mapping[str, Any]) -> int:
    return replies.prompt_tokens(replies.anthropic_turns(body), body.get("tools") or None)


# --------------------------------------------------------------------------- validation


def _edits(body: Mapping[str, Any], betas: frozenset[str]) -> list[dict[str, Any]] | Rejection:
    cm = body.get("context_management")
    if cm is None:
        return []
    if not betas & {COMPACT_BETA, CONTEXT_BETA}:
        return Rejection(NOT_PERMITTED)
    if not isinstance(cm, Mapping):
        return Rejection("context_management: Input should be a valid dictionary")
    edits = cm.get("edits") or []
    if not isinstance(edits, list):
        return Rejection("context_management.edits: Input should be a valid list")
    out: list[dict[str, Any]] = []
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        allowed = {COMPACT: COMPACT_BETA in betas,
                   CLEAR_TOOL_USES: CONTEXT_BETA in betas,
                   CLEAR_THINKING: CONTEXT_BETA in betas}
        if not allowed.get(str(kind)):
            expected = ", ".join(f"'{t}'" for t, ok in allowed.items() if ok)
            return Rejection(f"context_management.edits.{i}: Input tag '{kind}' found using "
                             f"'type' does not match any of the expected tags: {expected}")
        assert isinstance(edit, Mapping)
        if kind == CLEAR_THINKING and i > 0:
            return Rejection(f"context_management.edits.{i}: {CLEAR_THINKING} must be the "
                             "first edit when several are given")
        if kind == COMPACT:
            trigger = edit.get("trigger")
            if trigger is not None:
                value = trigger.get("value") if isinstance(trigger, Mapping) else None
                if not isinstance(trigger, Mapping) or trigger.get("type") != "input_tokens":
                    return Rejection(f"context_management.edits.{i}.trigger.type: Input "
                                     "should be 'input_tokens'")
                if isinstance(value, bool) or not isinstance(value, int) \
                        or value < MIN_COMPACT_TRIGGER:
                    return Rejection(f"context_management.edits.{i}.trigger.value: Input "
                                     f"should be greater than or equal to {MIN_COMPACT_TRIGGER}")
        out.append(dict(edit))
    return out


def _has_compaction(messages: Sequence[Any]) -> bool:
    return any(isinstance(block, Mapping) and block.get("type") == "compaction"
               for message in messages if isinstance(message, Mapping)
               and isinstance(message.get("content"), list) for block in message["content"])


def _compaction_point(messages: Sequence[Any], betas: frozenset[str]
                      ) -> tuple[int, int, str] | Rejection | None:
    """(message, block, content) of the last compaction block with content, None when
    there is none, or the 400 a compaction block gets."""
    found: tuple[int, int, str] | None = None
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for i, block in enumerate(content):
            if not isinstance(block, Mapping) or block.get("type") != "compaction":
                continue
            where = f"messages.{m}.content.{i}"
            if COMPACT_BETA not in betas:
                return Rejection(f"{where}: a compaction block needs the anthropic-beta "
                                 f"header {COMPACT_BETA}")
            if message.get("role") != "assistant":
                return Rejection(f"{where}: a compaction block belongs in an assistant "
                                 "message", "compaction_block_misplaced")
            text = block.get("content")
            if text is None:                # a failed compaction: the server's no-op
                continue
            if not isinstance(text, str) or not text:
                return Rejection(f"{where}.content: a compaction block's content is a "
                                 "non-empty string or null")
            sealed = block.get("encrypted_content")
            if isinstance(sealed, str) and sealed.startswith(_SEAL_PREFIX) \
                    and sealed != seal(text):
                return Rejection(f"{where}: the compaction block's content differs from "
                                 "the content its encrypted_content recorded; send the "
                                 "block back unchanged", "compaction_content_mismatch")
            found = (m, i, text)
    return found


# --------------------------------------------------------------------------- edits


def _as_text(block: Mapping[str, Any], text: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "text", "text": text}
    if block.get("cache_control") is not None:
        out["cache_control"] = block["cache_control"]
    return out


def _after_compaction(messages: list[Any], betas: frozenset[str]
                      ) -> tuple[list[Any], int] | Rejection:
    """The messages the model reads (compaction blocks applied) and how many were dropped."""
    point = _compaction_point(messages, betas)
    if isinstance(point, Rejection):
        return point
    out: list[Any] = []
    for m, message in enumerate(messages):
        if point is not None and m < point[0]:
            continue
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        blocks = []
        for i, block in enumerate(content):
            if point is not None and m == point[0] and i < point[1]:
                continue
            if isinstance(block, Mapping) and block.get("type") == "compaction":
                if point is not None and (m, i) == point[:2]:
                    blocks.append(_as_text(block, point[2]))
                continue                     # a no-op (null content) block
            blocks.append(block)
        out.append({**message, "content": blocks})
    return out, (point[0] if point is not None else 0)


def _clear_thinking(messages: list[Any], edit: Mapping[str, Any]) -> dict[str, Any] | None:
    keep = edit.get("keep", {"type": "thinking_turns", "value": DEFAULT_KEEP_THINKING_TURNS})
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return None
    n = keep.get("value", DEFAULT_KEEP_THINKING_TURNS) if isinstance(keep, Mapping) \
        else DEFAULT_KEEP_THINKING_TURNS
    with_thinking = [m for m, msg in enumerate(messages)
                     if msg.get("role") == "assistant" and isinstance(msg.get("content"), list)
                     and any(isinstance(b, Mapping) and b.get("type") in (
                         "thinking", "redacted_thinking") for b in msg["content"])]
    cleared = with_thinking[:max(len(with_thinking) - int(n), 0)]
    if not cleared:
        return None
    before = _tokens({"messages": messages})
    for m in cleared:
        messages[m] = {**messages[m], "content": [
            b for b in messages[m]["content"]
            if not (isinstance(b, Mapping) and b.get("type") in ("thinking", "redacted_thinking"))]}
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": len(cleared),
            "cleared_input_tokens": before - _tokens({"messages": messages})}


def _tool_uses(messages: Sequence[Any]) -> list[tuple[int, int, str, str]]:
    """(message, block, id, name) of every tool_use block, in order."""
    found = []
    for m, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, Mapping) else None
        if msg.get("role") != "assistant" or not isinstance(content, list):
            continue
        for i, block in enumerate(content):
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                found.append((m, i, str(block.get("id", "")), str(block.get("name", ""))))
    return found


def _clear_tool_uses(body: dict[str, Any], edit: Mapping[str, Any]) -> dict[str, Any] | None:
    messages: list[Any] = body["messages"]
    uses = _tool_uses(messages)
    trigger = edit.get("trigger") or {"type": "input_tokens", "value": DEFAULT_CLEAR_TRIGGER}
    if trigger.get("type") == "tool_uses":
        if len(uses) <= int(trigger.get("value", 0)):
            return None
    elif _tokens(body) <= int(trigger.get("value", DEFAULT_CLEAR_TRIGGER)):
        return None
    keep = edit.get("keep") or {}
    n_keep = int(keep.get("value", DEFAULT_KEEP_TOOL_USES)) if isinstance(keep, Mapping) \
        else DEFAULT_KEEP_TOOL_USES
    excluded = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs") or False
    clearable = [u for u in uses if u[3] not in excluded]
    targets = clearable[:max(len(clearable) - n_keep, 0)]
    ids = {u[2]: u for u in targets}
    edited = copy.deepcopy(messages)
    cleared = 0
    for msg in edited:
        content = msg.get("content")
        if msg.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result" \
                    and block.get("tool_use_id") in ids \
                    and block.get("content") != CLEARED_TOOL_RESULT:
                block["content"] = CLEARED_TOOL_RESULT
                cleared += 1
    for m, i, _, name in targets:
        if inputs is True or (isinstance(inputs, list) and name in inputs):
            block = edited[m]["content"][i]
            if block.get("input"):
                block["input"] = {}
                cleared += 1
    before = _tokens(body)
    after = _tokens({**body, "messages": edited})
    least = edit.get("clear_at_least")
    floor = int(least.get("value", 0)) if isinstance(least, Mapping) else 0
    if not cleared or before - after <= 0 or before - after < floor:
        return None
    body["messages"] = edited
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(targets),
            "cleared_input_tokens": before - after}


# --------------------------------------------------------------------------- compaction


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= QUOTE_CHARS else line[:QUOTE_CHARS] + "…"


def _earlier_requests(summary: str) -> tuple[int, list[str]]:
    """(requests covered, the quoted request lines) of an earlier emulator summary."""
    if not summary.startswith(SUMMARY_HEAD):
        return 0, []
    head = summary.split("\n", 1)[0]
    covered = 0
    for word in head.replace("(", " ").split():
        if word.isdigit():
            covered = int(word)
    quoted = [ln[2:] for ln in summary.split("\n") if ln.startswith("- ")]
    return covered, quoted


def summary_of(messages: Sequence[Any], *, instructions: str | None = None) -> str:
    """The deterministic summary of ``messages`` (Anthropic request messages, an earlier
    compaction already read as the text of its content): a head saying how many messages
    and user requests it covers, the user's requests quoted (their first 60 characters,
    the latest :data:`QUOTED_REQUESTS`), the latest one named, and the ``instructions``
    it was given."""
    turns = replies.anthropic_turns({"messages": list(messages)})
    covered, quoted = 0, list[str]()
    if turns and turns[0].role == "assistant":
        covered, quoted = _earlier_requests(turns[0].text)
    asked = [text for t in turns if (text := replies._real_text(t)) is not None]
    quoted += [f'"{_one_line(text)}"' for text in asked]
    covered += len(asked)
    shown = quoted[-QUOTED_REQUESTS:]
    lines = [f"{SUMMARY_HEAD}: {len(turns)} messages replaced, {covered} user requests]"]
    if len(quoted) > len(shown):
        lines.append(f"({len(quoted) - len(shown)} earlier requests not quoted)")
    lines.append("User requests so far:")
    lines += [f"- {q}" for q in shown]
    if asked:
        lines.append(f'Latest request: "{_one_line(asked[-1])}"')
    if instructions:
        lines.append(f"Instructions followed: {_one_line(instructions)}")
    return "\n".join(lines)


def _plan_messages(messages: list[Any], summary: str) -> list[Any]:
    """What the answer after a compaction is computed on: the summary, then the request it
    answers (the last user message with text of its own, and what follows it)."""
    turns = replies.anthropic_turns({"messages": messages})
    u = replies._last_real_user(turns)
    rest = messages[u:] if u is not None else messages[-1:]
    return [{"role": "assistant", "content": [{"type": "text", "text": summary}]}, *rest]


# --------------------------------------------------------------------------- the request


def manage(body: Mapping[str, Any], betas: frozenset[str], *, count_only: bool = False
           ) -> Managed | Rejection:
    """``body`` after its context management (see the module docstring), or its 400.
    ``count_only``: for count_tokens, which applies compaction blocks and clearing edits
    but never compacts."""
    edits = _edits(body, betas)
    if isinstance(edits, Rejection):
        return edits
    messages = body.get("messages")
    if not isinstance(messages, list):
        return Managed(dict(body))
    if not edits and "context_management" not in body and not _has_compaction(messages):
        # The usual request: nothing to apply, nothing more to count.
        return Managed(body if isinstance(body, dict) else dict(body),
                       compaction_beta=COMPACT_BETA in betas)
    dropped = _after_compaction(messages, betas)
    if isinstance(dropped, Rejection):
        return dropped
    effective, _ = dropped
    out = {**body, "messages": effective}
    out.pop("context_management", None)
    original = _tokens(body)
    applied: list[dict[str, Any]] = []
    compact: Mapping[str, Any] | None = None
    for edit in edits:
        if edit["type"] == CLEAR_THINKING:
            thinned = list(out["messages"])
            done = _clear_thinking(thinned, edit)
            if done is not None:
                out["messages"] = thinned
                applied.append(done)
        elif edit["type"] == CLEAR_TOOL_USES:
            done = _clear_tool_uses(out, edit)
            if done is not None:
                applied.append(done)
        else:
            compact = edit
    managed = Managed(out, requested="context_management" in body,
                      compaction_beta=COMPACT_BETA in betas, original_tokens=original,
                      applied=tuple(applied))
    if compact is None or count_only:
        return managed
    trigger = compact.get("trigger") or {}
    threshold = int(trigger.get("value", DEFAULT_COMPACT_TRIGGER))
    tokens = _tokens(out)
    has_content = any(t.role in ("user", "assistant", "tool") and t.counted
                      for t in replies.anthropic_turns({"messages": out["messages"]}))
    if tokens < threshold or not has_content:
        return managed
    instructions = compact.get("instructions")
    summary = summary_of(out["messages"], instructions=instructions
                         if isinstance(instructions, str) else None)
    block = {"type": "compaction", "content": summary, "encrypted_content": seal(summary)}
    plan_body = {**out, "messages": _plan_messages(out["messages"], summary)}
    return Managed(out, requested=True, compaction_beta=True, original_tokens=original,
                   applied=tuple(applied), compaction=block,
                   compaction_usage=(tokens, replies.count_tokens(summary)),
                   pause=bool(compact.get("pause_after_compaction")), plan_body=plan_body)


def rejection_answer(rejection: Rejection) -> Answer:
    """The API's 400 envelope, with ``details.error_code`` when the rejection has one."""
    error: dict[str, Any] = {"type": "invalid_request_error", "message": rejection.message}
    if rejection.code is not None:
        error["details"] = {"error_code": rejection.code}
    rid = request_id()
    body = {"type": "error", "error": error, "request_id": rid}
    return Answer(400, json.dumps(body, separators=(",", ":")).encode(),
                  (("Date", _date()), ("Content-Type", "application/json"), ("request-id", rid)))


def count_answer(managed: Managed) -> Answer:
    """count_tokens' answer for a request after its context management."""
    body: dict[str, Any] = {"input_tokens": _tokens(managed.body)}
    if managed.requested:
        body["context_management"] = {"original_input_tokens": managed.original_tokens}
    return Answer(200, json.dumps(body, separators=(",", ":")).encode(),
                  (("Content-Type", "application/json"), ("request-id", request_id())))


# --------------------------------------------------------------------------- the reply


def _iterations(managed: Managed, usage: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    if managed.compaction is not None:
        given, written = managed.compaction_usage
        out.append({"type": "compaction", "input_tokens": given, "output_tokens": written,
                    "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
    if not managed.pause:
        out.append({"type": "message",
                    "input_tokens": usage.get("input_tokens", 0),
                    "output_tokens": usage.get("output_tokens", 0),
                    "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0),
                    "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0)})
    return out


def _paused_usage(usage: dict[str, Any]) -> None:
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                "cache_read_input_tokens"):
        usage[key] = 0


def finish_message(raw: bytes, managed: Managed) -> bytes:
    """A non-streamed ``message`` body with what context management adds to it."""
    body = json.loads(raw)
    if managed.compaction is not None:
        if managed.pause:
            body["content"] = [dict(managed.compaction)]
            body["stop_reason"] = "compaction"
            _paused_usage(body["usage"])
        else:
            body["content"] = [dict(managed.compaction), *body["content"]]
    if managed.compaction_beta:
        body["usage"]["iterations"] = _iterations(managed, body["usage"])
    if managed.requested:
        body["context_management"] = {"applied_edits": list(managed.applied)}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _parse(event: bytes) -> tuple[str | None, Any]:
    name = None
    data = ""
    for line in event.decode().split("\n"):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
    return name, json.loads(data) if data else None


def _sse(data: Any, name: str) -> bytes:
    return (f"event: {name}\ndata: "
            f"{json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n").encode()


def _compaction_events(block: Mapping[str, Any]) -> list[bytes]:
    return [
        _sse({"type": "content_block_start", "index": 0,
              "content_block": {"type": "compaction", "content": None}},
             "content_block_start"),
        _sse({"type": "content_block_delta", "index": 0,
              "delta": {"type": "compaction_delta", "content": block["content"],
                        "encrypted_content": block["encrypted_content"]}},
             "content_block_delta"),
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
    ]


def finish_events(events: Iterable[bytes], managed: Managed) -> Iterator[bytes]:
    """A streamed message's events with what context management adds: the compaction
    block first (the answer's blocks one index later), the applied edits and the usage
    iterations in ``message_delta``."""
    if not managed.requested and not managed.compaction_beta:
        yield from events
        return
    usage: dict[str, Any] = {}
    shift = 1 if managed.compaction is not None else 0
    for event in events:
        name, data = _parse(event)
        if not isinstance(data, dict):
            yield event
            continue
        kind = data.get("type")
        if kind == "message_start":
            usage = dict(data["message"].get("usage") or {})
            if managed.pause:
                _paused_usage(data["message"]["usage"])
            yield _sse(data, "message_start")
            if managed.compaction is not None:
                yield from _compaction_events(managed.compaction)
            continue
        if managed.pause and kind in ("content_block_start", "content_block_delta",
                                      "content_block_stop", "ping"):
            continue
        if kind in ("content_block_start", "content_block_delta", "content_block_stop") \
                and shift:
            data["index"] = data["index"] + shift
            yield _sse(data, str(name))
            continue
        if kind == "message_delta":
            delta_usage = data.setdefault("usage", {})
            if managed.pause:
                data["delta"]["stop_reason"] = "compaction"
                delta_usage["output_tokens"] = 0
            usage["output_tokens"] = delta_usage.get("output_tokens", 0)
            if managed.compaction_beta:
                delta_usage["iterations"] = _iterations(managed, usage)
            if managed.requested:
                data["context_management"] = {"applied_edits": list(managed.applied)}
            yield _sse(data, "message_delta")
            continue
        yield event
