"""Successful answers in each wire format: JSON bodies and SSE event streams.

OpenAI Chat Completions: a ``chat.completion`` object, or ``chat.completion.chunk`` events
(``data: {...}`` lines, a final chunk with ``finish_reason``, an optional usage chunk with
``choices: []`` when ``stream_options.include_usage`` is true, then ``data: [DONE]``).
Anthropic Messages: a ``message`` object, or the named events ``message_start``,
``content_block_start``, ``ping``, ``content_block_delta`` (``text_delta`` /
``input_json_delta``), ``content_block_stop``, ``message_delta`` (stop reason and cumulative
usage), ``message_stop``. With extended thinking, the answer's first block is a
``thinking`` block (streamed as ``thinking_delta`` pieces and one ``signature_delta``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

from .cache import CacheUsage
from .replies import Plan

__all__ = [
    "anthropic_events",
    "anthropic_message",
    "openai_chunks",
    "openai_completion",
    "sse",
    "text_pieces",
]

OPENAI_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}
ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
SYSTEM_FINGERPRINT = "fp_emulator"
#: Streamed text arrives in pieces of whole words up to about this many characters.
PIECE_CHARS = 24
#: Tool-call arguments stream in slices of this many characters.
ARGS_PIECE_CHARS = 16

_WORD_RE = re.compile(r"\s*\S+\s*|\s+")


def text_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """Split ``text`` into deltas of whole words (the concatenation is ``text``)."""
    pieces: list[str] = []
    current = ""
    for word in _WORD_RE.findall(text):
        if current and len(current) + len(word) > size:
            pieces.append(current)
            current = ""
        current += word
    if current:
        pieces.append(current)
    return pieces


def _slices(text: str, size: int = ARGS_PIECE_CHARS) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event (``event:`` line only for Anthropic's named events)."""
    payload = data if isinstance(data, str) else _compact(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


# --------------------------------------------------------------------------- OpenAI

_NO_CACHE = CacheUsage()


def _openai_usage(plan: Plan, cache: CacheUsage = _NO_CACHE) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cache.read, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }


def _openai_tool_calls(plan: Plan) -> list[dict[str, Any]]:
    return [{"id": c.wire_id("call_"), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in plan.tool_calls]


def openai_completion(plan: Plan, *, model: str, ident: str,
                      created: int | None = None, cache: CacheUsage = _NO_CACHE) -> bytes:
    """A non-streamed ``chat.completion`` body (pretty-printed, as the real API sends)."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": plan.text if not plan.tool_calls else None,
                               "refusal": None, "annotations": []}
    if plan.tool_calls:
        message["tool_calls"] = _openai_tool_calls(plan)
    body = {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": OPENAI_FINISH[plan.finish]}],
        "usage": _openai_usage(plan, cache),
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    return (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode()


def openai_chunks(plan: Plan, *, model: str, ident: str, include_usage: bool = False,
                  created: int | None = None, cache: CacheUsage = _NO_CACHE) -> Iterator[bytes]:
    """The SSE byte stream of a streamed chat completion, ending with ``data: [DONE]``."""
    stamp = int(time.time()) if created is None else created

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": ident, "object": "chat.completion.chunk", "created": stamp, "model": model,
            "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    if plan.tool_calls:
        for index, call in enumerate(plan.tool_calls):
            head: dict[str, Any] = {"tool_calls": [{
                "index": index, "id": call.wire_id("call_"), "type": "function",
                "function": {"name": call.name, "arguments": ""}}]}
            if index == 0:
                head = {"role": "assistant", "content": None, **head, "refusal": None}
            yield chunk(head)
            for piece in _slices(call.arguments):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    else:
        yield chunk({"role": "assistant", "content": "", "refusal": None})
        for piece in text_pieces(plan.text):
            yield chunk({"content": piece})
    yield chunk({}, OPENAI_FINISH[plan.finish])
    if include_usage:
        yield sse({"id": ident, "object": "chat.completion.chunk", "created": stamp,
                   "model": model, "service_tier": "default",
                   "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [],
                   "usage": _openai_usage(plan, cache)})
    yield sse("[DONE]")


# --------------------------------------------------------------------------- Anthropic

def _anthropic_usage(plan: Plan, output_tokens: int,
                     cache: CacheUsage = _NO_CACHE) -> dict[str, Any]:
    """``input_tokens`` is the uncached remainder: the prompt less what was read or written."""
    return {"input_tokens": plan.prompt_tokens - cache.read - cache.write,
            "cache_creation_input_tokens": cache.write,
            "cache_read_input_tokens": cache.read,
            "cache_creation": {"ephemeral_5m_input_tokens": cache.write - cache.write_1h,
                               "ephemeral_1h_input_tokens": cache.write_1h},
            "output_tokens": output_tokens, "service_tier": "standard"}


def _anthropic_content(plan: Plan) -> list[dict[str, Any]]:
    if plan.tool_calls:
        return [{"type": "tool_use", "id": c.wire_id("toolu_"), "name": c.name,
                 "input": c.input()} for c in plan.tool_calls]
    return [{"type": "text", "text": plan.text}]


def anthropic_message(plan: Plan, *, model: str, ident: str,
                      cache: CacheUsage = _NO_CACHE,
                      thinking: dict[str, Any] | None = None) -> bytes:
    """A non-streamed ``message`` body (``thinking``: its thinking block, first)."""
    body = {
        "id": ident, "type": "message", "role": "assistant", "model": model,
        "content": [*([thinking] if thinking else []), *_anthropic_content(plan)],
        "stop_reason": ANTHROPIC_STOP[plan.finish], "stop_sequence": None,
        "usage": _anthropic_usage(plan, plan.completion_tokens, cache),
    }
    return _compact(body).encode()


def anthropic_events(plan: Plan, *, model: str, ident: str,
                     cache: CacheUsage = _NO_CACHE,
                     thinking: dict[str, Any] | None = None) -> Iterator[bytes]:
    """The SSE byte stream of a streamed message, as the Messages API sends it."""
    start: dict[str, Any] = {"id": ident, "type": "message", "role": "assistant", "model": model,
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": _anthropic_usage(plan, 1, cache)}
    yield sse({"type": "message_start", "message": start}, "message_start")
    first = 0
    if thinking:
        yield sse({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
                  "content_block_start")
        for piece in text_pieces(thinking["thinking"]):
            yield sse({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "thinking_delta", "thinking": piece}},
                      "content_block_delta")
        yield sse({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "signature_delta", "signature": thinking["signature"]}},
                  "content_block_delta")
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        first = 1
    if plan.tool_calls:
        for number, call in enumerate(plan.tool_calls):
            index = first + number
            block = {"type": "tool_use", "id": call.wire_id("toolu_"), "name": call.name,
                     "input": {}}
            yield sse({"type": "content_block_start", "index": index,
                       "content_block": block}, "content_block_start")
            if number == 0:
                yield sse({"type": "ping"}, "ping")
            for piece in ["", *_slices(call.arguments)]:
                yield sse({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": piece}},
                          "content_block_delta")
            yield sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    else:
        yield sse({"type": "content_block_start", "index": first,
                   "content_block": {"type": "text", "text": ""}}, "content_block_start")
        yield sse({"type": "ping"}, "ping")
        for piece in text_pieces(plan.text):
            yield sse({"type": "content_block_delta", "index": first,
                       "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
        yield sse({"type": "content_block_stop", "index": first}, "content_block_stop")
    yield sse({"type": "message_delta",
               "delta": {"stop_reason": ANTHROPIC_STOP[plan.finish], "stop_sequence": None},
               "usage": {"output_tokens": plan.completion_tokens}}, "message_delta")
    yield sse({"type": "message_stop"}, "message_stop")
