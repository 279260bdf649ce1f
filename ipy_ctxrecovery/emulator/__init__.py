"""A local OpenAI/Anthropic API server with deterministic replies and real-world faults.

The embedded default model and the test bench: a real HTTP server on 127.0.0.1 that
speaks ``POST /v1/chat/completions`` (OpenAI Chat Completions) and ``POST /v1/messages``
(Anthropic Messages; ``POST /v1/messages/count_tokens`` too), streamed (SSE) or not, so the official SDKs talk to it unmodified::

    from ipy_ctxrecovery.emulator import Emulator

    with Emulator(context_window=8192, max_body="256KB", body_limit_style="nginx") as emu:
        client = emu.openai_client(max_retries=0)   # sends the emulator's token
        client.chat.completions.create(model="emulator", messages=[...])
        emu.requests[-1].status, emu.requests[-1].body_bytes

Standalone: ``python -m ipy_ctxrecovery.emulator --port 8765 --max-body 256KB``.

It counts tokens as an OpenAI-compatible server does: ``POST /tokenize`` at its root, in
vLLM's shape (``{"model", "messages", "tools"}`` → ``{"count", "max_model_len",
"tokens"}``), by the token rule below — the ``prompt_tokens`` the same chat request
reports (:mod:`.tokenize`). ``Emulator(tokenize=False)`` plays a server without one (404).

It also answers requests sent to it as a forward proxy (absolute-form targets): a client
built with ``http_client=openai.DefaultHttpxClient(proxy=emu.url)`` and any ``http://``
base URL reaches it, as through a corporate proxy that is also the gateway.

The Responses API
-----------------
``POST /v1/responses`` (streamed with the API's events — ``response.created``,
``response.output_item.added``, ``response.output_text.delta``,
``response.output_item.done``, ``response.completed`` / ``response.incomplete`` — or
whole), ``/v1/responses/compact`` and ``/v1/responses/input_tokens``: the same replies,
token rule, prompt cache and faults, read from ``input`` items (``responses.py``).
``max_output_tokens`` cuts as ``status: "incomplete"``; reasoning items carry an
``encrypted_content`` when ``include`` asks for it; ``store`` / ``previous_response_id``
chain stored responses (``emu.responses``, emptied by ``reset()``);
``context_management`` compaction past ``compact_threshold`` answers with an opaque,
deterministic ``compaction`` item the emulator reads back as its summary.

Token and bounds
----------------
An ``Emulator()`` has a random per-instance ``token``; a request without it (header
``X-Emulator-Token``, or the token as the API key) gets a 401 before anything else happens:
no scripted fault is consumed, nothing is recorded or read. ``emu.openai_client()``,
``emu.anthropic_client()`` and the package's ``emulator`` providers send it; other clients
add ``default_headers=emu.token_headers``. ``Emulator(token=None)`` and the standalone
command (unless ``--token``) admit anyone, so curl works as is.

``emu.requests`` holds the last ``keep_requests`` (10,000) records; only the newest bodies
up to ``keep_body_bytes`` (32 MB) in all are kept, older records keep their size, status
and fault (``raw``/``body`` None). ``emu.received`` counts every request recorded. A body
over ``max_request_body`` (32 MB) gets a 413 in the provider's format without being read.

Token rule
----------
``tokens(text) = ceil(len(text.encode("utf-8")) / 4)``. A request's prompt tokens are
``Σ over messages (tokens(message text) + 4) + 3``, plus ``tokens(json.dumps(tools))`` when
tools are offered. A message's text is the concatenation of its text, reasoning/thinking,
tool-call names and arguments (Anthropic ``tool_use`` input as ``json.dumps(input)``) and
tool-result contents. Anthropic's top-level ``system`` counts as one message. Completion
tokens are ``tokens(reply text + tool-call arguments)``.

Replies (deterministic)
-----------------------
The *latest real user message* is the last user text that is not a continuation prompt
and not a notice the recovery machinery wrote (starting with ``[SYSTEM NOTICE``,
``[Context was automatically compacted`` or ``[STRUCTURED SUMMARY``). Each text block
(Anthropic) or text part (OpenAI list content) is judged on its own, and so is each of the
package's own paragraphs in an OpenAI string content and the text between them (paragraphs
are split at blank lines) — both adapters merge consecutive user messages, so a summary
followed by the request is one message — and the request is the last such piece.

* Default: ``Emulator reply: you said "<first 60 chars of it>" (<k> messages, <p> prompt
  tokens).`` (``1 message`` for one) — ``k`` counts every message (system included),
  ``p`` is the prompt tokens.
* ``[[words N]]`` in it: the reply is ``w1 w2 … wN``.
* ``[[echo]]`` in it: the reply is the rest of the message after the directive (one
  newline right after it dropped), verbatim — any text, code block or script to cut.
* ``[[tool NAME {"json": "args"}]]`` in it (several allowed), with no tool result after it:
  the reply is a tool call to NAME with those arguments — ids ``call_emu<n>`` /
  ``toolu_emu<n>`` with ``n`` from the emulator's own counter (never the same twice, as
  the real APIs' random ids), ``finish_reason="tool_calls"`` /
  ``stop_reason="tool_use"``. Once results arrive: ``Tool NAME returned <c> chars.`` per
  result, then the default (or ``[[words N]]``) reply.
* Recall: when the request offers the ``recall_transcript`` tool (the package offers it
  after a compaction) and the request asks about an earlier detail (``recall …``, ``look
  up …``, ``look back …``, ``remind me …``, or ``what was …`` naming a turn or saying
  earlier, before, previously), the reply is a call to it with up to three
  distinctive words of the question (and ``from_turn``/``to_turn`` for "the first turn",
  "turn 3"); once its result arrives, the answer quotes the passage line holding most of
  those words: ``In turn N the user wrote: "…"``.
* Summarization: any system message containing ``STRUCTURED SUMMARY``. The reply is an
  extractive summary of the user-supplied text: a ``[STRUCTURED SUMMARY — covering N
  earlier messages]`` line, then the sections the summarizer prompt asks for
  (``core/prompts.SUMMARY_SECTIONS``: goal and constraints, data and variables, results
  and figures, decisions, open questions, the current step; files, commands and errors
  where lines name them) of lines copied from the input, at most min(len(input)/4, 2000) chars. The
  compactor's framing (``core/markers.py``) is not conversation and is never quoted: its
  ``Summarize these N earlier messages`` instruction (which gives N), the
  ``[message i of N, …]`` label and ``[end of message i]`` mark around each message,
  omission markers, ``Additional instructions for this summary:`` and an earlier
  summary's header and section headings.
* Output limit: the reply is cut (on a character boundary) at the completion budget —
  ``max_tokens``/``max_completion_tokens``, ``max_output_tokens`` and the room left in the
  window, whichever is smallest — with ``finish_reason="length"`` /
  ``stop_reason="max_tokens"``.
* Continuation: when the latest user message (its last block that is not a notice)
  starts with ``Your response was cut off at the token limit.`` the emulator recomputes the original answer from the request that
  produced the first partial and resumes exactly after the assistant text already
  produced since (no repetition; their longest common prefix is skipped). How it resumes
  is configurable, to play the ways real models answer in a new message:
  ``continuation_leading_space=False`` starts the answer at its first visible character
  (the space or newline at the resume point is lost); ``continuation_repeat`` repeats N
  characters first, or restarts the interrupted ``"line"``, or (``"fence"``) writes the
  opening fence line of a code block left open again first, or (``"restart"``) starts
  the answer over with its first words in bold; ``continuation_opener="meta"`` writes a
  meta opener line first ("Here's the continuation:"), ``"echo"`` the continuation
  prompt itself — what small models (SmolLM2-135M) do.
* Prefill (Anthropic path): a request whose last message is an assistant turn is
  continued exactly from that text, as the API does (``prefill="continue"``, the default).
* Extended thinking (Anthropic path, ``thinking`` ``enabled`` or ``adaptive``): the answer
  starts with a signed ``thinking`` block (``Read <k> messages (<p> input tokens) and
  planned the answer.``; streamed as ``thinking_delta`` + ``signature_delta``). A request
  continuing a tool loop (its last message holds ``tool_result`` blocks) whose assistant
  message does not start with a thinking block gets the API's 400 ("Expected `thinking`
  or `redacted_thinking`, but found `tool_use`…", fault ``thinking``); so does an
  ``enabled`` budget under 1024 tokens or not below ``max_tokens`` (unless the
  interleaved-thinking beta is named), and an assistant message ending in a thinking block
  (thinking on or off).
* Tool ids (Anthropic path): a request carrying one ``tool_use`` id twice gets the API's
  400 ("messages.N.content.M: `tool_use` ids must be unique").
* Reasoning (Responses path): see ``responses.py`` — reasoning items, and a
  ``function_call`` sent back by its id without its reasoning item refused as the API does;
  so are a reasoning item without what followed it in its answer and a
  ``function_call_output`` without its ``function_call``.

Prompt caching
--------------
Each emulator keeps both providers' prompt caches (``cache.py``; ``Emulator(clock=…)``
gives their time, ``reset()`` empties them). OpenAI path: ``prompt_tokens_details.
cached_tokens`` is the prefix (tools, then whole messages) shared with a request of the
same model used in the last 5 minutes, 0 below 1,024 tokens, in 128-token steps past it.
Anthropic path: at each ``cache_control`` block (tools → system → messages, at most 4,
else the API's 400) an entry of the same prefix written at it or up to 20 blocks before
it is read (``cache_read_input_tokens``); each breakpoint whose prefix reaches the model's
minimum (1,024 tokens; 2,048 for Haiku 3/3.5, 4,096 for Haiku 4.5 and Opus 4.5+) writes
its entry for its ``ttl`` (``5m`` default, ``1h``), the tokens past the read being
``cache_creation_input_tokens``; ``input_tokens`` is the rest of the prompt.

Context management (Anthropic path)
-----------------------------------
``context.py``, with the ``anthropic-beta`` names the API documents (``compact-2026-01-12``,
``context-management-2025-06-27``; without them ``context_management`` gets the API's 400):
``compact_20260112`` — past its ``trigger`` (at least 1,000 tokens here, the catalogue's
``min_compact_trigger`` for ``emulator``; 50,000 on the API) the reply starts with a
``compaction`` block whose ``content`` names how many messages and user requests it
replaced and quotes the requests (an earlier summary's carried over), sealed by its
``encrypted_content``; the answer is computed on that summary and the request it answers;
streamed as ``content_block_start`` + one ``compaction_delta``; ``usage.iterations`` as
the API reports them; ``pause_after_compaction`` stops after the block. A compaction block
sent back hides everything before it (and counts as its content); a changed one is
refused (``compaction_content_mismatch``). ``clear_tool_uses_20250919`` and
``clear_thinking_20251015`` edit what the token rule counts and are reported in
``context_management.applied_edits``. ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": N}`` by the same rule, applying compaction blocks and clearing edits
(never compacting); it is recorded in ``emu.requests`` and goes through the middleboxes
and scripted faults like any request.

Faults
------
Middleboxes first, in order: ``drop_over`` (connection reset mid-request, no response),
``max_body`` (413 as ``nginx`` / ``cloudflare`` / ``aws`` / ``envoy``), ``waf_over`` (403:
Cloudflare's block page with ``cf-ray``, or a ``bare`` HTML 403 with no signal words).
Then the provider: the API key (401 in each provider's format, when ``api_key`` is set),
request checks — ``alternation="vllm"`` / ``"llama.cpp"`` rejects, on the OpenAI path,
roles that do not alternate as strict chat templates do (400 / 500, see ``roles.py``); on
the Anthropic path a prefill ending in whitespace is refused (400, as the API does), and
every prefill with ``prefill="reject"`` (400, as Claude 4.6 and later do) —
``max_tokens`` above ``max_output_tokens`` (400), the context window (OpenAI
``context_length_exceeded``; Anthropic "prompt is too long: M tokens > N maximum" and
"input length and `max_tokens` exceed context limit: A + B > C, …").

Quirks of OpenAI-compatible servers, on the OpenAI path, each off by default
(``quirks.py``, where each is declared once for the constructor and both command lines):
``string_content_only`` (a list content gets llama-cpp-python's HTTP 500),
``empty_stream_on_error`` (a refused streamed request gets HTTP 200 and an empty event
stream, recorded with its fault and status 200; unstreamed, an overflow gets
llama-cpp-python's 400 by its rule), ``stream_usage=False`` (no usage in streams).

One-off faults queue with ``emu.script(...)`` / ``emu.fail_next(status)`` and are consumed
in order, each by the next request that reaches its layer: middlebox faults (``"drop"``,
``"413:<style>"``, ``"waf[:bare]"``) on arrival; provider faults (a status such as 429
with ``retry_after``, 500, 529; ``"stream-error"`` — half the stream, then the provider's
error event; ``"stream-cut"`` — half the answer, then the connection closes) only by a
request that got past the middleboxes.

Provider answers carry no Cloudflare headers (the real APIs sit behind Cloudflare, but
only the WAF fault should show its signals here). Request headers are never logged; each
record keeps them (``emu.requests[-1].header("X-Team")``) with the values of credential
headers (``Authorization``, ``x-api-key``, the token, cookies) masked.
"""

from __future__ import annotations

from .faults import (
    Fault,
    body_too_large,
    drop,
    http_error,
    stream_cut,
    stream_error,
    waf_block,
)
from .replies import count_tokens
from .server import Emulator, RequestRecord

__all__ = [
    "Emulator",
    "Fault",
    "RequestRecord",
    "body_too_large",
    "count_tokens",
    "drop",
    "http_error",
    "stream_cut",
    "stream_error",
    "waf_block",
]
