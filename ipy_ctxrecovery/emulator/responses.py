"""The OpenAI Responses API of the emulator: ``POST /v1/responses`` (streamed and not),
``/v1/responses/compact`` and ``/v1/responses/input_tokens`` (no I/O; the server routes).

The same deterministic replies as Chat Completions (:mod:`.replies`), read from the
Responses input: ``input`` as a string or as items — messages (``input_text`` /
``output_text`` parts or a string content), ``function_call``, ``function_call_output``,
``reasoning`` and ``compaction`` items — with ``instructions`` as a leading system message
and ``tools`` in the flat form (``{"type": "function", "name": …}``). Each item is one
message for the token rule (its text + 4); a reasoning item counts its summary text, a
compaction item the summary it stands for.

* ``max_output_tokens`` (≥ 16, as the API wants) cuts the answer: ``status:
  "incomplete"``, ``incomplete_details: {"reason": "max_output_tokens"}``.
* ``usage``: ``input_tokens`` (with ``input_tokens_details.cached_tokens`` from the
  emulator's OpenAI prompt cache, :mod:`.cache`), ``output_tokens`` (the answer and the
  reasoning, ``output_tokens_details.reasoning_tokens``).
* Reasoning: every answer starts with a ``reasoning`` item (unless ``reasoning.effort`` is
  ``"none"``), with a summary when ``reasoning.summary`` is asked and an
  ``encrypted_content`` when ``include`` names ``reasoning.encrypted_content``. Sent back
  with a bad ``encrypted_content`` it is the API's 400; sent back by id alone when it was
  not stored, the API's 404 (items are not persisted with ``store: false``). A
  ``function_call`` item sent back with the id the emulator gave it, when its answer had
  a reasoning item, needs that reasoning item before it in the input (stored or not: the
  emulator remembers the pairs, bounded): without it, the API's 400 "Item 'fc_…' of type
  'function_call' was provided without its required 'reasoning' item: 'rs_…'."
  (mastra-ai/mastra#8738). A function call sent without an id is not checked (the API
  cannot tell which answer it came from). A reasoning item must be followed by what its
  answer went on with (an assistant message or a function call; a run of reasoning items
  by one), else the API's 400 "Item 'rs_…' of type 'reasoning' was provided without its
  required following item." (continuedev/continue#8933); a ``function_call_output`` needs
  a ``function_call`` with its ``call_id`` before it (in the input or the previous
  response), else "No tool call found for function call output with call_id …."
  (continuedev/continue#10092).
* Storage: ``store`` (default true, as the API) keeps the response; ``previous_response_id``
  puts its input and output before the new input; an unknown id is the API's 400
  ``previous_response_not_found``. At most :data:`KEEP_RESPONSES` are kept.
* Compaction: ``context_management: [{"type": "compaction", "compact_threshold": N}]``
  — past N input tokens the output starts with a ``compaction`` item whose
  ``encrypted_content`` is opaque but deterministic; the emulator reads it back as the
  extractive summary it stands for (:func:`replies.summarize` of every message before it,
  the latest request included). Items before a compaction item are ignored.
  ``/v1/responses/compact`` returns the user messages and one compaction item.
* The window: the input (after compaction) over the window is the API's 400
  ``context_length_exceeded`` ("Your input exceeds the context window of this model.
  Please adjust your input and try again.", ``param: "input"`` — the Responses API's
  wording, not Chat Completions': dyad-sh/dyad#1672, the-open-agent/openagent#2344);
  streamed, the same error arrives as the stream's ``error`` event after
  ``response.created`` and ``response.in_progress`` (HTTP 200, as users met it there).
"""

from __future__ import annotations

import base64
import json
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import faults, replies, wire
from .cache import CacheUsage, PromptCache, retention_error
from .faults import Answer

__all__ = [
    "COMPACT_PATH",
    "INPUT_TOKENS_PATH",
    "KEEP_PAIRS",
    "KEEP_RESPONSES",
    "MIN_OUTPUT_TOKENS",
    "RESPONSES_PATH",
    "ResponseStore",
    "decode",
    "encode",
    "path_kind",
    "respond",
    "turns_of",
]

RESPONSES_PATH = "/v1/responses"
COMPACT_PATH = "/v1/responses/compact"
INPUT_TOKENS_PATH = "/v1/responses/input_tokens"
#: Stored responses kept (oldest forgotten first). Each holds its whole context (the items
#: a chain shares are shared, not copied), so the bound is a count a client's chains need.
KEEP_RESPONSES = 256
#: Function call items whose reasoning item the emulator remembers (oldest forgotten).
KEEP_PAIRS = 4096
#: The API's least ``max_output_tokens``.
MIN_OUTPUT_TOKENS = 16

WINDOW_MESSAGE = ("Your input exceeds the context window of this model. Please adjust your "
                  "input and try again.")
"""The Responses API's context-window error (dyad-sh/dyad#1672, the-open-agent/openagent#2344)."""

# What the emulator's opaque contents start with: Fernet tokens (what OpenAI's look like)
# start with ``gAAAAA``.
_OPAQUE = "gAAAAAemu"

Streamed = tuple[tuple[tuple[str, str], ...], Iterable[bytes]]


def path_kind(path: str) -> str | None:
    """``responses`` | ``compact`` | ``input_tokens`` for a Responses API path, else None."""
    trimmed = path.rstrip("/")
    if trimmed.endswith(COMPACT_PATH):
        return "compact"
    if trimmed.endswith(INPUT_TOKENS_PATH):
        return "input_tokens"
    if trimmed.endswith(RESPONSES_PATH):
        return "responses"
    return None


def encode(kind: str, payload: Mapping[str, Any]) -> str:
    """Deterministic opaque content for an item of ``kind`` standing for ``payload``."""
    raw = json.dumps({"k": kind, **payload}, sort_keys=True, ensure_ascii=False).encode()
    return _OPAQUE + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode()


def decode(kind: str, content: Any) -> dict[str, Any] | None:
    """What :func:`encode` put in ``content`` for ``kind``; None when it is not the
    emulator's (changed, cut, or of another kind)."""
    if not isinstance(content, str) or not content.startswith(_OPAQUE):
        return None
    try:
        data = json.loads(zlib.decompress(base64.urlsafe_b64decode(content[len(_OPAQUE):])))
    except (ValueError, zlib.error):
        return None
    if not isinstance(data, dict) or data.get("k") != kind:
        return None
    return data


@dataclass(frozen=True, slots=True)
class _Stored:
    items: tuple[Any, ...]        # the context it was answered from (input items), then its output


class ResponseStore:
    """The responses an emulator stored (``store`` true), bounded, thread-safe."""

    def __init__(self, keep: int = KEEP_RESPONSES) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._responses: OrderedDict[str, _Stored] = OrderedDict()
        self._item_ids: dict[str, int] = {}
        # function_call item id -> the reasoning item id its answer had (stored or not).
        self._reasoning_of: OrderedDict[str, str] = OrderedDict()

    def pair(self, call_item: str, reasoning_item: str) -> None:
        """Remember that the function call item ``call_item`` was produced with the
        reasoning item ``reasoning_item`` (at most :data:`KEEP_PAIRS`, oldest forgotten)."""
        with self._lock:
            self._reasoning_of[call_item] = reasoning_item
            while len(self._reasoning_of) > KEEP_PAIRS:
                self._reasoning_of.popitem(last=False)

    def reasoning_of(self, call_item: str) -> str | None:
        """The reasoning item id the function call item ``call_item`` was produced with."""
        with self._lock:
            return self._reasoning_of.get(call_item)

    def put(self, ident: str, items: Sequence[Any]) -> None:
        with self._lock:
            self._responses[ident] = _Stored(tuple(items))
            for item in items:
                if isinstance(item, Mapping) and isinstance(item.get("id"), str):
                    self._item_ids[item["id"]] = self._item_ids.get(item["id"], 0) + 1
            while len(self._responses) > self._keep:
                _, old = self._responses.popitem(last=False)
                for item in old.items:
                    if isinstance(item, Mapping) and isinstance(item.get("id"), str):
                        left = self._item_ids.get(item["id"], 1) - 1
                        if left:
                            self._item_ids[item["id"]] = left
                        else:
                            self._item_ids.pop(item["id"], None)

    def get(self, ident: str) -> tuple[Any, ...] | None:
        with self._lock:
            found = self._responses.get(ident)
            return None if found is None else found.items

    def has_item(self, ident: str) -> bool:
        with self._lock:
            return ident in self._item_ids

    def clear(self) -> None:
        with self._lock:
            self._responses.clear()
            self._item_ids.clear()
            self._reasoning_of.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._responses)


# --------------------------------------------------------------------------- errors

def _error(status: int, message: str, *, param: str | None = None,
           code: str | None = None, type: str = "invalid_request_error") -> Answer:
    return faults.openai_error(status, message, type=type, param=param, code=code)


def _not_found(ident: str) -> Answer:
    # maximhq/bifrost#2441, bigduu/Bamboo-agent#513.
    return _error(400, f"Previous response with id '{ident}' not found.",
                  param="previous_response_id", code="previous_response_not_found")


def _unverified(ident: str, index: int) -> Answer:
    return _error(400, f"The encrypted content for item {ident} could not be verified.",
                  param=f"input[{index}]", code="invalid_encrypted_content")


def _item_not_stored(ident: str, index: int) -> Answer:
    # The API's answer to a reasoning item sent back by id with store=false.
    return _error(404, f"Item with id '{ident}' not found. Items are not persisted when "
                  "`store` is set to false. Try again with `store` set to true, or remove "
                  "this item from your input.", param=f"input[{index}]")


def _without_reasoning(call_item: str, reasoning_item: str) -> Answer:
    # mastra-ai/mastra#8738 (o3 on api.openai.com): param "input", code null.
    return _error(400, f"Item '{call_item}' of type 'function_call' was provided without its "
                  f"required 'reasoning' item: '{reasoning_item}'.", param="input")


def _without_following(reasoning_item: str) -> Answer:
    # continuedev/continue#8933, #10428 (api.openai.com): param "input", code null.
    return _error(400, f"Item '{reasoning_item}' of type 'reasoning' was provided without its "
                  "required following item.", param="input")


def _output_without_call(call_id: str) -> Answer:
    # continuedev/continue#10092, agentscope-ai/AgentTeams#299: param "input", code null.
    return _error(400, f"No tool call found for function call output with call_id {call_id}.",
                  param="input")


# What a reasoning item's answer goes on with: the assistant's own output items.
_FOLLOWING = frozenset({"function_call", "custom_tool_call", "web_search_call",
                        "file_search_call", "computer_call", "code_interpreter_call",
                        "image_generation_call", "local_shell_call", "mcp_call"})


def _follows_reasoning(item: Any) -> bool:
    """Whether ``item`` can be what a reasoning item before it belongs to (another
    reasoning item continues the run: the item after the run decides)."""
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type") or "message"
    if kind == "message":
        return item.get("role") == "assistant"
    return kind in _FOLLOWING or kind == "reasoning"


# --------------------------------------------------------------------------- input

def _parts_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text",
                                                             "text", "summary_text",
                                                             "reasoning_text", "refusal"):
            out.append(str(part.get("text", part.get("refusal", ""))))
        elif isinstance(part, str):
            out.append(part)
    return "".join(out)


def _summary_of(item: Mapping[str, Any]) -> str:
    return _parts_text(item.get("summary"))


def turns_of(items: Sequence[Any], instructions: Any) -> list[replies.Turn]:
    """Normalized turns of a context (instructions first; items before the last compaction
    item left out; a compaction item is the user-side summary it stands for)."""
    turns: list[replies.Turn] = []
    if isinstance(instructions, str) and instructions:
        turns.append(replies.Turn("system", instructions, instructions))
    for item in _after_compaction(items):
        turn = _turn(item)
        if turn is not None:
            turns.append(turn)
    return turns


def _after_compaction(items: Sequence[Any]) -> Sequence[Any]:
    last = max((i for i, item in enumerate(items) if isinstance(item, Mapping)
                and item.get("type") == "compaction"), default=None)
    return items if last is None else items[last:]


def _turn(item: Any) -> replies.Turn | None:
    if isinstance(item, str):
        return replies.Turn("user", item, item, pieces=tuple(replies.paragraph_pieces(item)))
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type") or "message"
    if kind == "message":
        role = str(item.get("role", "user"))
        role = "system" if role == "developer" else role
        content = item.get("content")
        text = _parts_text(content)
        if isinstance(content, str):
            pieces = tuple(replies.paragraph_pieces(content))
        else:
            pieces = tuple(_parts_text([p]) for p in content or () if _parts_text([p]))
        return replies.Turn(role, text, text, pieces=pieces or (text,))
    if kind == "function_call":
        name, args = str(item.get("name", "")), str(item.get("arguments", ""))
        return replies.Turn("assistant", "", name + args, ((name, args),))
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _parts_text(output)
        return replies.Turn("tool", "", text, tool_results=(text,))
    if kind == "reasoning":
        summary = _summary_of(item)
        return replies.Turn("assistant", "", summary)
    if kind == "compaction":
        data = decode("compaction", item.get("encrypted_content")) or {}
        summary = str(data.get("summary", ""))
        return replies.Turn("user", summary, summary, pieces=(summary,))
    return None


def _check_items(items: Sequence[Any], store: ResponseStore,
                 before: Sequence[Any] = ()) -> Answer | None:
    """The API's refusal of an item it cannot read back, or None (``before``: the items of
    a previous response the input continues)."""
    reasoned = {str(i.get("id")) for i in before
                if isinstance(i, Mapping) and i.get("type") == "reasoning"}
    called = {str(i.get("call_id")) for i in before
              if isinstance(i, Mapping) and i.get("type") == "function_call"}
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "reasoning" and item.get("id"):
            reasoned.add(str(item["id"]))
        if item.get("type") == "reasoning" and not _follows_reasoning(
                items[index + 1] if index + 1 < len(items) else None):
            return _without_following(str(item.get("id") or "reasoning"))
        if item.get("type") == "function_call":
            called.add(str(item.get("call_id")))
        if item.get("type") == "function_call_output" \
                and str(item.get("call_id")) not in called:
            return _output_without_call(str(item.get("call_id")))
        if item.get("type") == "function_call" and isinstance(item.get("id"), str):
            needed = store.reasoning_of(item["id"])
            if needed is not None and needed not in reasoned:
                return _without_reasoning(item["id"], needed)
        if item.get("type") not in ("reasoning", "compaction"):
            continue
        kind = str(item["type"])
        ident = str(item.get("id") or "")
        content = item.get("encrypted_content")
        if content is None:
            if kind == "reasoning" and ident and not store.has_item(ident):
                return _item_not_stored(ident, index)
            if kind == "compaction":
                return _unverified(ident or "compaction", index)
            continue
        if decode(kind, content) is None:
            return _unverified(ident or kind, index)
    return None


def _input_items(body: Mapping[str, Any]) -> list[Any]:
    given = body.get("input")
    if given is None:
        return []
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return list(given) if isinstance(given, list) else []


def _context(body: Mapping[str, Any], store: ResponseStore
             ) -> tuple[list[Any], list[Any]] | Answer:
    """(the whole context's items: a previous response's and the new input, the new input)."""
    new = _input_items(body)
    previous = body.get("previous_response_id")
    items: list[Any] = []
    if previous is not None:
        stored = store.get(str(previous))
        if stored is None:
            return _not_found(str(previous))
        items.extend(stored)
    refused = _check_items(new, store, items)
    if refused is not None:
        return refused
    items.extend(new)
    return items, new


# --------------------------------------------------------------------------- compaction

def _compact_threshold(body: Mapping[str, Any]) -> int | None:
    for entry in body.get("context_management") or ():
        if isinstance(entry, Mapping) and entry.get("type") == "compaction":
            value = entry.get("compact_threshold")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _rendered(turns: Sequence[replies.Turn]) -> str:
    """The conversation as the summarizer reads it: one labelled paragraph per message."""
    lines = []
    for t in turns:
        if t.role == "system":
            continue
        text = t.text or t.counted
        if text.strip():
            lines.append(f"[{t.role}] {text}")
    return "\n\n".join(lines)


def _compaction_item(turns: Sequence[replies.Turn], new_id: Callable[[str], str]
                     ) -> tuple[dict[str, Any], str]:
    summary = replies.summarize(_rendered(turns))
    item = {"id": new_id("cmp_emu"), "type": "compaction",
            "encrypted_content": encode("compaction", {"summary": summary}),
            "created_by": "server"}
    return item, summary


# --------------------------------------------------------------------------- output


def _reasoning_text(turns: Sequence[replies.Turn], prompt: int) -> str:
    n = len(turns)
    return f"Read {n} message{'' if n == 1 else 's'} ({prompt} input tokens) and planned the answer."


def _message_item(ident: str, text: str, status: str) -> dict[str, Any]:
    return {"id": ident, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}]}


def _usage(prompt: int, cached: CacheUsage, output: int, reasoning: int) -> dict[str, Any]:
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached.read, "cache_write_tokens": 0},
            "output_tokens": output + reasoning,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + output + reasoning}


def _envelope(body: Mapping[str, Any], ident: str, model: str, *, status: str,
              output: list[Any], usage: dict[str, Any] | None, created: int,
              incomplete: str | None = None) -> dict[str, Any]:
    reasoning = _reasoning_options(body)
    return {
        "id": ident, "object": "response", "created_at": created, "status": status,
        "background": False, "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
        "model": model, "output": output, "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort", "medium"),
                      "summary": reasoning.get("summary")},
        "safety_identifier": None, "service_tier": "default",
        "store": body.get("store", True) is not False,
        "temperature": 1.0, "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_logprobs": 0, "top_p": 1.0, "truncation": body.get("truncation", "disabled"),
        "usage": usage, "user": None, "metadata": body.get("metadata") or {},
    }


def _reasoning_options(body: Mapping[str, Any]) -> Mapping[str, Any]:
    given = body.get("reasoning")
    return given if isinstance(given, Mapping) else {}


def _events(envelope: dict[str, Any], final: str) -> Iterator[bytes]:
    """The event stream of a response whose finished envelope is ``envelope``."""
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return wire.sse(data, kind)

    opened = {**envelope, "status": "in_progress", "output": [], "usage": None,
              "incomplete_details": None}
    yield event("response.created", response=opened)
    yield event("response.in_progress", response=opened)
    for index, item in enumerate(envelope["output"]):
        kind = item["type"]
        if kind == "message":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield event("response.content_part.added", item_id=item["id"],
                        output_index=index, content_index=0, part=part)
            text = item["content"][0]["text"]
            for piece in wire.text_pieces(text):
                yield event("response.output_text.delta", item_id=item["id"],
                            output_index=index, content_index=0, delta=piece, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=text, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part={**part, "text": text})
        elif kind == "function_call":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            for piece in wire._slices(item["arguments"]):
                yield event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=index, delta=piece)
            yield event("response.function_call_arguments.done", item_id=item["id"],
                        output_index=index, name=item["name"], arguments=item["arguments"])
        elif kind == "reasoning":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "summary": []})
            for s, part in enumerate(item["summary"]):
                yield event("response.reasoning_summary_part.added", item_id=item["id"],
                            output_index=index, summary_index=s,
                            part={"type": "summary_text", "text": ""})
                yield event("response.reasoning_summary_text.delta", item_id=item["id"],
                            output_index=index, summary_index=s, delta=part["text"])
                yield event("response.reasoning_summary_text.done", item_id=item["id"],
                            output_index=index, summary_index=s, text=part["text"])
                yield event("response.reasoning_summary_part.done", item_id=item["id"],
                            output_index=index, summary_index=s, part=part)
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(final, response=envelope)


# --------------------------------------------------------------------------- respond

def respond(kind: str, body: Any, *, presented_key: str | None, api_key: str | None,
            context_window: int, max_output_tokens: int | None,
            new_id: Callable[[str], str], store: ResponseStore,
            continuation: replies.Continuation | None = None,
            cache: PromptCache | None = None, stream_usage: bool = True,
            ) -> tuple[str | None, Answer | Streamed]:
    """The answer to a Responses API request of ``kind`` (:func:`path_kind`) and the
    fault label when it is a refusal (``auth``, ``output_limit``, ``context``)."""
    if api_key is not None and presented_key != api_key:
        return "auth", faults.auth_error("openai", presented_key)
    if not isinstance(body, dict):
        return None, faults.bad_request(
            "openai", "We could not parse the JSON body of your request. (HINT: This "
            "likely means you aren't using your HTTP library correctly.)")
    model = str(body.get("model") or "emulator")
    headers = (("x-request-id", faults.request_id()), ("openai-version", "2020-10-01"))
    retention = retention_error(body)
    if retention is not None:
        return None, _error(400, retention, param="prompt_cache_retention",
                            code="invalid_value")
    found = _context(body, store)
    if isinstance(found, Answer):
        return None, found
    items, new = found
    instructions = body.get("instructions")
    tools = body.get("tools") or None
    turns = turns_of(items, instructions)
    prompt = replies.prompt_tokens(turns, tools)
    if kind == "input_tokens":
        out = {"object": "response.input_tokens", "input_tokens": prompt}
        return None, _json(out, headers)
    if kind == "compact":
        return None, _compact(body, model, items, turns, prompt, new_id, headers)

    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < MIN_OUTPUT_TOKENS):
        return None, _error(400, f"Invalid 'max_output_tokens': integer below minimum value. "
                                 f"Expected a value >= {MIN_OUTPUT_TOKENS}, but got {limit} "
                                 "instead.", param="max_output_tokens",
                            code="integer_below_min_value")
    if limit is not None and max_output_tokens is not None and limit > max_output_tokens:
        return "output_limit", faults.output_limit_error(
            "openai", requested=limit, cap=max_output_tokens, model=model,
            param="max_output_tokens")

    # Server compaction: past the threshold the context becomes its summary (and the
    # instructions), which is what the window then holds.
    threshold = _compact_threshold(body)
    compaction: dict[str, Any] | None = None
    seen = turns
    if threshold is not None and prompt > threshold:
        compaction, summary = _compaction_item(turns, new_id)
        seen = [t for t in turns if t.role == "system"] + [
            replies.Turn("user", summary, summary, pieces=(summary,))]
    seen_tokens = replies.prompt_tokens(seen, tools)
    if seen_tokens > context_window:
        if body.get("stream"):
            return "context", (headers, _refused_stream(body, new_id("resp_emu"), model))
        return "context", _error(400, WINDOW_MESSAGE, param="input",
                                 code="context_length_exceeded")
    room = [context_window - seen_tokens]
    if limit is not None:
        room.append(limit)
    if max_output_tokens is not None:
        room.append(max_output_tokens)
    plan = replies.plan(turns, tools=tools, limit=max(min(room), 0), continuation=continuation)
    plan = replies.with_call_ids(plan, new_id, "call_emu")
    cached = cache.openai(model, seen, tools, body.get("prompt_cache_retention")) \
        if cache is not None else CacheUsage()

    reasoning = _reasoning_options(body)
    include = body.get("include") or ()
    output: list[dict[str, Any]] = []
    if compaction is not None:
        output.append(compaction)
    thought = 0
    rid: str | None = None
    if reasoning.get("effort") != "none":
        text = _reasoning_text(turns, prompt)
        thought = replies.count_tokens(text)
        rid = new_id("rs_emu")
        item: dict[str, Any] = {"id": rid, "type": "reasoning",
                                "summary": [{"type": "summary_text", "text": text}]
                                if reasoning.get("summary") else []}
        if "reasoning.encrypted_content" in include:
            item["encrypted_content"] = encode("reasoning", {"text": text, "id": rid})
        output.append(item)
    cut = plan.finish == "length"
    if plan.tool_calls:
        for call in plan.tool_calls:
            fc = new_id("fc_emu")
            if rid is not None:
                store.pair(fc, rid)
            output.append({"id": fc, "type": "function_call",
                           "status": "completed", "arguments": call.arguments,
                           "call_id": call.wire_id("call_"), "name": call.name})
    else:
        output.append(_message_item(new_id("msg_emu"), plan.text,
                                    "incomplete" if cut else "completed"))
    ident = new_id("resp_emu")
    usage = _usage(seen_tokens, cached, plan.completion_tokens, thought)
    envelope = _envelope(body, ident, model, status="incomplete" if cut else "completed",
                         output=output, usage=usage, created=int(time.time()),
                         incomplete="max_output_tokens" if cut else None)
    if body.get("store", True) is not False:
        store.put(ident, [*items, *output])
    if body.get("stream"):
        if not stream_usage:
            envelope["usage"] = None
        final = "response.incomplete" if cut else "response.completed"
        return None, (headers, _events(envelope, final))
    return None, _json(envelope, headers)


def _refused_stream(body: Mapping[str, Any], ident: str, model: str) -> Iterator[bytes]:
    """A streamed request over the window: the stream opens, then its ``error`` event
    (sequence number 2, after ``response.created`` and ``response.in_progress``), as the
    API sends it (dyad-sh/dyad#1672; the-open-agent/openagent#2344: "received error while
    streaming")."""
    opened = _envelope(body, ident, model, status="in_progress", output=[], usage=None,
                       created=int(time.time()))
    yield wire.sse({"type": "response.created", "sequence_number": 0, "response": opened},
                   "response.created")
    yield wire.sse({"type": "response.in_progress", "sequence_number": 1, "response": opened},
                   "response.in_progress")
    yield wire.sse({"type": "error", "sequence_number": 2,
                    "error": {"type": "invalid_request_error", "code": "context_length_exceeded",
                              "message": WINDOW_MESSAGE, "param": "input"}}, "error")


def _compact(body: Mapping[str, Any], model: str, items: Sequence[Any],
             turns: Sequence[replies.Turn], prompt: int, new_id: Callable[[str], str],
             headers: tuple[tuple[str, str], ...]) -> Answer:
    """``/v1/responses/compact``: every user message, then one compaction item."""
    compaction, summary = _compaction_item(turns, new_id)
    users = [{"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": _parts_text(item.get("content"))}]}
             for item in _after_compaction(items)
             if isinstance(item, Mapping) and (item.get("type") or "message") == "message"
             and item.get("role") == "user"]
    written = replies.count_tokens(summary)
    out = {"id": new_id("resp_emu"), "object": "response.compaction",
           "created_at": int(time.time()), "output": [*users, compaction],
           "usage": _usage(prompt, CacheUsage(), written, 0)}
    return _json(out, headers)


def _json(body: Mapping[str, Any], headers: tuple[tuple[str, str], ...]) -> Answer:
    return Answer(200, (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode(),
                  (("Content-Type", "application/json"), *headers))


def stream_error_event() -> bytes:
    """The error event the Responses API sends inside a 200 stream when it fails."""
    body = {"type": "error", "sequence_number": 2,
            "error": {"type": "server_error", "code": "server_error",
                      "message": "The server had an error while processing your request. "
                                 "Sorry about that!", "param": None}}
    return wire.sse(body, "error")
