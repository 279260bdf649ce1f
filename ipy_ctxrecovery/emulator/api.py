"""The fake provider behind both paths: validate a request, then answer it (no I/O).

Checks in the order the real APIs apply them — the key, the body, ``max_tokens`` against
the output limit, the prompt (and prompt + ``max_tokens``) against the context window —
then plans the reply (:mod:`.replies`) and formats it for the wire (:mod:`.wire`). The body
checks include, when configured, strict role alternation on the OpenAI path
(:mod:`.roles`) and, on the Anthropic path, a final assistant turn (a prefill): refused
outright as by Claude 4.6 and later, or when it ends in whitespace as by every model. The
OpenAI path also plays, when asked, how llama-cpp-python's server differs (:mod:`.quirks`).

Extended thinking (Anthropic, ``thinking`` of type ``enabled`` or ``adaptive``): the answer
starts with a ``thinking`` block signed by the emulator (:func:`thinking_block`); a request
that continues a tool loop (its last message holds ``tool_result`` blocks) must send the
assistant message of that loop starting with its thinking block, else the API's 400
(:func:`thinking_missing`, fault ``thinking``). A budget (``enabled``) under 1024 tokens,
or not below ``max_tokens`` (without the interleaved-thinking beta), is the API's 400 too
(:func:`thinking_budget_error`, fault ``thinking``), and so is an assistant message that ends
in a thinking block (:func:`ends_in_thinking`).

Tool calls get ids from the emulator's counter (``call_emu…`` / ``toolu_emu…``), never the
same twice, as the real APIs' random ones; an Anthropic request carrying one ``tool_use``
id twice is the API's 400 (:func:`repeated_tool_use`).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from . import context as managing
from . import faults, quirks, replies, roles, wire
from .cache import CacheUsage, PromptCache, breakpoint_error, retention_error
from .faults import Answer

__all__ = ["NO_PREFILL", "PREFILL_WHITESPACE", "Streamed", "count_tokens", "ends_in_thinking",
           "repeated_tool_use", "respond", "thinking_block", "thinking_budget_error",
           "thinking_missing"]

NO_PREFILL = ("This model does not support assistant message prefill. The conversation must "
              "end with a user message.")
"""The Anthropic API's answer to a prefill on Claude 4.6 and later (strands-agents/sdk-python#1694)."""
PREFILL_WHITESPACE = "messages: final assistant content cannot end with trailing whitespace"
"""The Anthropic API's answer to a prefill ending in whitespace (tailcallhq/forgecode#1872)."""

Streamed = tuple[tuple[tuple[str, str], ...], Iterable[bytes]]
"""Extra response headers and the SSE events of a streamed answer."""

_THINKING_REQUIRED = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking")
"""The Anthropic API's refusal of a tool loop sent back without its thinking block
(mastra-ai/mastra#7799, anomalyco/opencode#3077, Kilo-Org/kilocode#5219)."""

MIN_THINKING_BUDGET = 1024
"""The least ``thinking.budget_tokens`` the Anthropic API takes."""
THINKING_BUDGET_TOO_SMALL = ("thinking.enabled.budget_tokens: Input should be greater than or "
                             "equal to 1024")
"""The Anthropic API's refusal of a smaller budget (danny-avila/LibreChat#8346)."""
THINKING_OVER_MAX_TOKENS = (
    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
    "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    "#max-tokens-and-context-window-size")
"""The Anthropic API's refusal of a budget at or over ``max_tokens``
(anthropics/claude-code#8756)."""
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
"""With it the budget spans a whole tool loop and may exceed ``max_tokens``."""


def _thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def thinking_block(turns: list[replies.Turn], prompt: int) -> dict[str, Any]:
    """The thinking block the emulator's answer starts with, signed (deterministic)."""
    n = len(turns)
    text = (f"Read {n} message{'' if n == 1 else 's'} ({prompt} input tokens) and planned "
            "the answer.")
    digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return {"type": "thinking", "thinking": text, "signature": "EmuThinking" + digest}


def thinking_budget_error(body: dict[str, Any], betas: frozenset[str]) -> str | None:
    """The API's refusal of the budget of ``thinking`` of type ``enabled``: under
    :data:`MIN_THINKING_BUDGET`, or not below ``max_tokens`` (unless interleaved thinking's
    beta lets it span a tool loop); else None."""
    thinking = body.get("thinking")
    if not (isinstance(thinking, dict) and thinking.get("type") == "enabled"):
        return None
    budget = thinking.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        return THINKING_BUDGET_TOO_SMALL
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and max_tokens <= budget \
            and INTERLEAVED_THINKING_BETA not in betas:
        return THINKING_OVER_MAX_TOKENS
    return None


def thinking_missing(body: dict[str, Any]) -> str | None:
    """With thinking on, the API's refusal of a request continuing a tool loop whose
    assistant message does not start with a thinking block (after the compaction block
    a compacting reply starts with); else None."""
    messages = body.get("messages")
    if not _thinking_on(body) or not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else None
    if not (isinstance(last, dict) and last.get("role") == "user" and isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)):
        return None
    index = next((i for i in range(len(messages) - 2, -1, -1)
                  if isinstance(messages[i], dict) and messages[i].get("role") == "assistant"),
                 None)
    if index is None:
        return None
    blocks = messages[index].get("content")
    # A compaction block the server put first in its reply comes before its thinking.
    first = "text" if isinstance(blocks, str) else next(
        (str(b.get("type")) for b in blocks or ()
         if isinstance(b, dict) and b.get("type") != "compaction"), "text")
    if first in ("thinking", "redacted_thinking"):
        return None
    return _THINKING_REQUIRED.format(index=index, found=first)


def ends_in_thinking(body: dict[str, Any]) -> str | None:
    """The Anthropic API's refusal of an assistant message whose last block is a thinking
    block, else None: "messages.1: The final block in an assistant message cannot be
    `thinking`." (tailcallhq/forgecode#2107)."""
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        last = content[-1] if isinstance(content, list) and content else None
        if isinstance(last, dict) and last.get("type") in ("thinking", "redacted_thinking"):
            return f"messages.{i}: The final block in an assistant message cannot be `thinking`."
    return None


def repeated_tool_use(body: dict[str, Any]) -> str | None:
    """The Anthropic API's refusal of a request whose messages carry one ``tool_use`` id
    twice (at the second), else None: "messages.1.content.1: `tool_use` ids must be
    unique" (anthropics/claude-code#20901, trycua/cua#524)."""
    seen: set[str] = set()
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if not (isinstance(block, dict) and block.get("type") == "tool_use"):
                continue
            ident = str(block.get("id"))
            if ident in seen:
                return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
            seen.add(ident)
    return None


def respond(wire_name: str, body: Any, *, presented_key: str | None, api_key: str | None,
            context_window: int, max_output_tokens: int | None,
            new_id: Callable[[str], str],
            continuation: replies.Continuation | None = None, prefill: str = "continue",
            alternation: str | None = None, string_content_only: bool = False,
            empty_stream_on_error: bool = False, stream_usage: bool = True,
            cache: PromptCache | None = None, betas: frozenset[str] = frozenset(),
            ) -> tuple[str | None, Answer | Streamed]:
    """The provider's answer to a parsed request body, and the fault label if it is one
    (``auth``, ``output_limit``, ``context``, ``prefill``, ``alternation``, ``content``).

    ``continuation`` is how the continuation prompt is answered; ``prefill`` is
    ``continue`` or ``reject``; ``alternation`` a :data:`roles.STYLES` name or None; the
    next three are the OpenAI path's :mod:`quirks <.quirks>`; ``cache`` the emulator's
    prompt caches (:mod:`.cache`), read and written by an answered request only;
    ``betas`` the request's ``anthropic-beta`` names, which turn on the Anthropic path's
    context management (:mod:`.context`).
    """
    if api_key is not None and presented_key != api_key:
        return "auth", faults.auth_error(wire_name, presented_key)
    if not isinstance(body, dict):
        return None, faults.bad_request(
            wire_name, "We could not parse the JSON body of your request. (HINT: This "
            "likely means you aren't using your HTTP library correctly.)")
    model = str(body.get("model") or "emulator")
    stream = bool(body.get("stream"))
    # llama-cpp-python refuses a streamed request only once its stream has started.
    empty_stream = empty_stream_on_error and stream and wire_name == "openai"

    def refused(label: str, answer: Answer) -> tuple[str, Answer | Streamed]:
        return label, (quirks.empty_stream() if empty_stream else answer)

    managed: managing.Managed | None = None
    if wire_name == "anthropic":
        checked = managing.manage(body, betas)
        if isinstance(checked, managing.Rejection):
            return None, managing.rejection_answer(checked)
        managed = checked
        # What the model reads: compaction blocks applied, edits made, or a new summary.
        read = managed.plan_body or managed.body
        turns = replies.anthropic_turns(read)
        param = "max_tokens"
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            return None, faults.bad_request(wire_name, "max_tokens: Field required")
        prefilled = _prefill_text(body)
        if prefilled is not None and prefill == "reject":
            return "prefill", faults.bad_request(wire_name, NO_PREFILL)
        if prefilled is not None and prefilled != prefilled.rstrip():
            return "prefill", faults.bad_request(wire_name, PREFILL_WHITESPACE)
        cache_problem = breakpoint_error(body)
        if cache_problem is not None:
            return None, faults.bad_request(wire_name, cache_problem)
        unthought = thinking_budget_error(body, betas) or ends_in_thinking(body) \
            or thinking_missing(body)
        if unthought is not None:
            return "thinking", faults.bad_request(wire_name, unthought)
        repeated = repeated_tool_use(body)
        if repeated is not None:
            return None, faults.bad_request(wire_name, repeated)
    else:
        messages = body.get("messages")
        if string_content_only and isinstance(messages, list) \
                and quirks.has_list_content(messages):
            return refused("content", quirks.content_rejection())
        if alternation is not None and isinstance(messages, list) \
                and not roles.alternates(messages):
            return refused("alternation", roles.rejection(alternation))
        retention = retention_error(body)
        if retention is not None:
            return None, faults.bad_request(wire_name, retention,
                                            param="prompt_cache_retention")
        prefilled = None
        turns = replies.openai_turns(body)
        param = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
            else "max_tokens"
        max_tokens = body.get(param)
    if max_tokens is not None and (isinstance(max_tokens, bool)
                                   or not isinstance(max_tokens, int) or max_tokens < 1):
        return None, faults.bad_request(
            wire_name, f"Invalid '{param}': integer below minimum value. Expected a value "
            f">= 1, but got {max_tokens} instead.", param=param)
    tools = body.get("tools") or None
    prompt = replies.prompt_tokens(turns, tools)
    cap = max_output_tokens
    if max_tokens is not None and cap is not None and max_tokens > cap:
        return refused("output_limit", faults.output_limit_error(
            wire_name, requested=max_tokens, cap=cap, model=model, param=param))
    if empty_stream_on_error and wire_name == "openai":
        asked = body.get("max_tokens")
        context = quirks.overflow_error(window=context_window, prompt=prompt,
                                        max_tokens=asked if isinstance(asked, int) else None)
    else:
        context = faults.context_error(wire_name, window=context_window, prompt=prompt,
                                       max_tokens=max_tokens, max_tokens_param=param)
    if context is None and managed is not None and managed.compaction is not None:
        # The compaction step reads the whole prompt: it must fit the window itself.
        context = faults.context_error(wire_name, window=context_window,
                                       prompt=managed.compaction_usage[0], max_tokens=None)
    if context is not None:
        return refused("context", context)
    limits = [context_window - prompt]
    if max_tokens is not None:
        limits.append(max_tokens)
    if cap is not None:
        limits.append(cap)
    plan = replies.plan(turns, tools=tools, limit=min(limits), continuation=continuation,
                        prefill=prefilled is not None)
    plan = replies.with_call_ids(plan, new_id,
                                 "toolu_emu" if wire_name == "anthropic" else "call_emu")
    cached = CacheUsage()
    if wire_name == "anthropic":
        assert managed is not None
        if cache is not None:
            cached = cache.anthropic(managed.plan_body or managed.body, betas)
        ident = new_id("msg_emu")
        headers: tuple[tuple[str, str], ...] = (("request-id", faults.request_id()),)
        thought = thinking_block(turns, prompt) if _thinking_on(body) else None
        if stream:
            events = wire.anthropic_events(plan, model=model, ident=ident, cache=cached,
                                           thinking=thought)
            return None, (headers, managing.finish_events(events, managed))
        message = wire.anthropic_message(plan, model=model, ident=ident, cache=cached,
                                         thinking=thought)
        if managed.requested or managed.compaction_beta:
            message = managing.finish_message(message, managed)
        return None, Answer(200, message, (("Content-Type", "application/json"), *headers))
    if cache is not None:
        cached = cache.openai(model, turns, tools, body.get("prompt_cache_retention"))
    ident = new_id("chatcmpl-emu")
    headers = (("x-request-id", faults.request_id()), ("openai-version", "2020-10-01"))
    if stream:
        options = body.get("stream_options") or {}
        include = stream_usage and bool(isinstance(options, dict)
                                        and options.get("include_usage"))
        return None, (headers, wire.openai_chunks(plan, model=model, ident=ident,
                                                  include_usage=include, cache=cached))
    return None, Answer(200, wire.openai_completion(plan, model=model, ident=ident,
                                                    cache=cached),
                        (("Content-Type", "application/json"), *headers))


def count_tokens(body: Any, *, presented_key: str | None, api_key: str | None,
                 betas: frozenset[str] = frozenset()) -> Answer:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` by the token rule, with
    compaction blocks and the clearing edits applied (never a new compaction)."""
    if api_key is not None and presented_key != api_key:
        return faults.auth_error("anthropic", presented_key)
    if not isinstance(body, dict):
        return faults.bad_request(
            "anthropic", "We could not parse the JSON body of your request. (HINT: This "
            "likely means you aren't using your HTTP library correctly.)")
    if not isinstance(body.get("messages"), list):
        return faults.bad_request("anthropic", "messages: Field required")
    managed = managing.manage(body, betas, count_only=True)
    if isinstance(managed, managing.Rejection):
        return managing.rejection_answer(managed)
    return managing.count_answer(managed)


def _prefill_text(body: dict[str, Any]) -> str | None:
    """The text of a final assistant turn in an Anthropic request (a prefill), else None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") != "assistant":
        return None
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    texts = [b.get("text", "") for b in content or () if isinstance(b, dict)
             and b.get("type") == "text"]
    return texts[-1] if texts else ""
