"""Anthropic's own context management, on the real ``anthropic`` SDK against the emulator:
server compaction (``compact_20260112``), context editing (``clear_tool_uses_20250919``,
``clear_thinking_20251015``) and token counting — what the bodies carry, what comes back,
and that a request with context management is measured exactly like any other.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import valid_histories

from ipy_ctxrecovery.core.catalogue import SERVER_COMPACTION_FAMILIES, lookup
from ipy_ctxrecovery.core.history import (
    TAG_SERVER_COMPACTION,
    Compaction,
    Message,
    Role,
    ToolCall,
    problems,
)
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator import context as managing
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.providers.anthropic import (
    COMPACT_BETA,
    CONTEXT_BETA,
    AnthropicProvider,
)
from ipy_ctxrecovery.providers.base import (
    ClearToolUses,
    ContextEdit,
    ContextManagement,
    CountsTokens,
    Request,
)

TRIGGER = 1_000
PAD = "p" * 600


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(context_window=200_000) as emulator:
        yield emulator


@pytest.fixture
def provider(emu: Emulator) -> Iterator[AnthropicProvider]:
    made = make_provider("emulator:anthropic", emulator=emu)
    assert isinstance(made, AnthropicProvider)
    yield made
    made.close()


def _long_history(turns: int = 12, tag: str = "request") -> tuple[Message, ...]:
    out: list[Message] = [Message.system("You are terse.")]
    for i in range(turns):
        out += [Message.user(f"{tag} {i}: please look at item {i} {PAD}"),
                Message.assistant(f"answer {i}")]
    out.append(Message.user(f"{tag} {turns}: the last question"))
    return tuple(out)


def _compact(trigger: int = TRIGGER, **more: Any) -> ContextManagement:
    return ContextManagement(compact_trigger=trigger, **more)


def _split(message: Message) -> tuple[Message, Message]:
    """The reply as the session keeps it: the compaction message, then the answer."""
    first, *rest = message.blocks
    assert isinstance(first, Compaction)
    return (Message(Role.ASSISTANT, (first,), tag=TAG_SERVER_COMPACTION),
            Message(Role.ASSISTANT, tuple(rest)))


# -- the bodies ---------------------------------------------------------------------------


def test_the_body_carries_the_edits_and_beta_headers_the_api_documents(
        emu: Emulator, provider: AnthropicProvider) -> None:
    context = _compact(5_000, compact_instructions="Keep the numbers.",
                       clear_tool_uses=ClearToolUses(trigger=3_000, keep=2, clear_at_least=10,
                                                     exclude_tools=("recall",)),
                       clear_thinking=True)
    provider.send(Request((Message.user("hi"),), context=context, stream=False))
    record = emu.requests[-1]
    assert record.path == "/v1/messages" and record.status == 200
    assert set((record.header("anthropic-beta") or "").split(",")) == {CONTEXT_BETA,
                                                                      COMPACT_BETA}
    # Thinking is off: its clearing is left out (the API ties it to extended thinking).
    assert record.body["context_management"] == {"edits": [
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 3000},
         "keep": {"type": "tool_uses", "value": 2},
         "clear_at_least": {"type": "input_tokens", "value": 10}, "exclude_tools": ["recall"]},
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 5000},
         "instructions": "Keep the numbers."}]}
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    request = Request((Message.user("hi"),), context=context, options=thinking)
    kinds = [e["type"] for e in json.loads(provider.encode(request))["context_management"]["edits"]]
    assert kinds == ["clear_thinking_20251015", "clear_tool_uses_20250919", "compact_20260112"]


def test_no_context_means_the_plain_messages_call(emu: Emulator,
                                                 provider: AnthropicProvider) -> None:
    provider.send(Request((Message.user("hi"),)))
    record = emu.requests[-1]
    assert record.header("anthropic-beta") is None and "context_management" not in record.body
    # A trigger below the model's lowest (the emulator's 1,000) is left out, not refused.
    low = Request((Message.user("hi"),), context=_compact(TRIGGER - 1))
    assert "context_management" not in json.loads(provider.encode(low))


# -- compaction ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_compaction_comes_back_first_and_says_what_it_replaced(
        emu: Emulator, provider: AnthropicProvider, stream: bool) -> None:
    history = _long_history()
    response = provider.send(Request(history, context=_compact(), stream=stream))
    block = response.message.blocks[0]
    assert isinstance(block, Compaction) and block.wire == "anthropic"
    data = json.loads(block.data)
    assert data["type"] == "compaction" and data["content"] == block.summary
    assert data["encrypted_content"] == managing.seal(data["content"])
    assert block.summary is not None
    for i in range(1, 12):                     # the requests it replaced, quoted
        assert f'"request {i}: please look at item {i} ppp' in block.summary
    assert '- "request 12: the last question"' in block.summary
    assert "13 user requests" in block.summary and "(1 earlier requests not quoted)" in \
        block.summary and "request 0:" not in block.summary
    assert response.message.text.startswith('Emulator reply: you said "request 12: the last')
    # The usage is the compacted context's: far below what was sent.
    assert response.usage.prompt_tokens is not None
    sent = provider.count_tokens(Request(history))
    assert sent is not None and response.usage.prompt_tokens < sent // 4


def test_a_tool_loop_with_thinking_goes_on_after_its_compaction(
        emu: Emulator, provider: AnthropicProvider) -> None:
    # The reply that compacted starts with the compaction block, then its thinking and the
    # call: sent back so, as the API returned it, the loop goes on (its thinking block is
    # the first after the compaction).
    from ipy_ctxrecovery.core.history import Reasoning
    from ipy_ctxrecovery.providers.base import ToolSpec

    weather = ToolSpec("weather", "The weather.", {"type": "object", "properties": {}})
    think = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    history = (*_long_history()[:-1],
               Message.user('the last question [[tool weather {"city": "Oslo"}]]'))
    first = provider.send(Request(history, context=_compact(), tools=(weather,),
                                  options=think, max_tokens=2048))
    compaction, answer = _split(first.message)
    assert [type(b) for b in answer.blocks] == [Reasoning, ToolCall]
    (call,) = answer.tool_calls
    history += (compaction, answer, Message.tool(call.id, "sunny", name="weather"))
    done = provider.send(Request(history, context=_compact(), tools=(weather,),
                                 options=think, max_tokens=2048))
    assert emu.requests[-1].status == 200
    assert done.message.text
    looped = emu.requests[-1].body["messages"][-2]
    assert [b["type"] for b in looped["content"]] == ["compaction", "thinking", "tool_use"]


def test_whole_and_streamed_replies_read_the_same_compaction(
        emu: Emulator, provider: AnthropicProvider) -> None:
    history = _long_history()
    whole = provider.send(Request(history, context=_compact(), stream=False))
    streamed = provider.send(Request(history, context=_compact(), stream=True))
    assert whole.message == streamed.message
    assert whole.usage.prompt_tokens == streamed.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_sent_back_the_compaction_hides_what_precedes_it(
        emu: Emulator, provider: AnthropicProvider, stream: bool) -> None:
    history = _long_history()
    first = provider.send(Request(history, context=_compact(), stream=stream))
    compaction, answer = _split(first.message)
    follow = Message.user("and now the next step")
    # Everything kept, as a client that lets the API drop it would send…
    kept = (*history, compaction, answer, follow)
    # …and what the session sends: the compaction in place of all before it.
    dropped = (history[0], compaction, answer, follow)
    assert problems(list(dropped)) == []
    replies = []
    for h in (kept, dropped):
        replies.append(provider.send(Request(h, context=_compact(), stream=stream)))
        record = emu.requests[-1]
        assert COMPACT_BETA in (record.header("anthropic-beta") or "")
        blocks = [b for m in record.body["messages"] for b in m["content"]]
        sent_back = [b for b in blocks if b.get("type") == "compaction"]
        assert sent_back == [json.loads(compaction.blocks[0].data)]   # verbatim
    full, short = replies
    assert full.message == short.message
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (
        short.usage.prompt_tokens, short.usage.completion_tokens)
    assert not any(isinstance(b, Compaction) for b in full.message.blocks)  # no new one
    assert full.message.text.startswith('Emulator reply: you said "and now the next step"')
    assert emu.requests[-2].body_bytes > 5 * emu.requests[-1].body_bytes


def test_the_compaction_message_goes_back_without_context_too(
        emu: Emulator, provider: AnthropicProvider) -> None:
    history = _long_history()
    compaction, answer = _split(provider.send(Request(history, context=_compact())).message)
    reply = provider.send(Request((compaction, answer, Message.user("go on"))))
    assert COMPACT_BETA in (emu.requests[-1].header("anthropic-beta") or "")
    assert "context_management" not in emu.requests[-1].body
    assert reply.message.text.startswith('Emulator reply: you said "go on"')


def test_a_second_compaction_carries_the_first_ones_requests(
        emu: Emulator, provider: AnthropicProvider) -> None:
    history = _long_history(tag="early")
    compaction, answer = _split(provider.send(Request(history, context=_compact())).message)
    later = [history[0], compaction, answer]
    for i in range(12):
        later += [Message.user(f"later {i}: {PAD}"), Message.assistant(f"ok {i}")]
    later.append(Message.user("later 12: done?"))
    second = provider.send(Request(tuple(later), context=_compact())).message.blocks[0]
    assert isinstance(second, Compaction) and second.summary is not None
    assert "26 user requests" in second.summary
    assert '"later 12: done?"' in second.summary


def test_instructions_are_followed_and_pause_stops_after_the_block(emu: Emulator) -> None:
    client = emu.anthropic_client(max_retries=0)
    messages = [{"role": "user", "content": f"question {i} {PAD}"} for i in range(8)]
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": TRIGGER},
            "instructions": "Keep file names.", "pause_after_compaction": True}
    paused = client.beta.messages.create(
        model="emulator", max_tokens=100, messages=messages, betas=[COMPACT_BETA],
        context_management={"edits": [edit]})
    assert paused.stop_reason == "compaction"
    assert [b.type for b in paused.content] == ["compaction"]
    assert "Instructions followed: Keep file names." in (paused.content[0].content or "")
    iterations = paused.usage.iterations or []
    assert [i.type for i in iterations] == ["compaction"]
    assert paused.usage.input_tokens == 0
    assert iterations[0].input_tokens == managing._tokens(
        {"messages": messages}) and iterations[0].output_tokens > 0


def test_usage_iterations_as_the_api_reports_them(emu: Emulator) -> None:
    client = emu.anthropic_client(max_retries=0)
    messages = [{"role": "user", "content": f"question {i} {PAD}"} for i in range(8)]
    edits = {"edits": [{"type": "compact_20260112",
                        "trigger": {"type": "input_tokens", "value": TRIGGER}}]}
    with client.beta.messages.stream(model="emulator", max_tokens=100, messages=messages,
                                     betas=[COMPACT_BETA], context_management=edits) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["compaction", "text"]
    kinds = [i.type for i in final.usage.iterations or []]
    assert kinds == ["compaction", "message"]
    message = (final.usage.iterations or [])[1]
    assert (message.input_tokens, message.output_tokens) == (final.usage.input_tokens,
                                                             final.usage.output_tokens)
    # Below the trigger: no compaction, and still the iterations (the beta is on).
    small = client.beta.messages.create(model="emulator", max_tokens=100,
                                        messages=messages[:1], betas=[COMPACT_BETA],
                                        context_management=edits)
    assert [b.type for b in small.content] == ["text"]
    assert [i.type for i in small.usage.iterations or []] == ["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_compacted_reply_reports_the_input_as_sent_apart(emu: Emulator,
                                                            provider: AnthropicProvider,
                                                            stream: bool) -> None:
    """The top-level usage of a compacted reply is the compacted input's; the compaction
    iteration's input is the whole body's, which the provider reports on its own."""
    history = _long_history()
    compacted = provider.send(Request(messages=history, max_tokens=64, context=_compact(),
                                      stream=stream))
    assert isinstance(compacted.message.blocks[0], Compaction)
    counted = provider.count_tokens(Request(messages=history, max_tokens=64))
    assert compacted.usage.compaction_input_tokens == counted
    assert compacted.usage.prompt_tokens is not None
    assert compacted.usage.prompt_tokens < counted / 2
    assert compacted.usage.compaction is not None
    assert (compacted.usage.compaction.completion_tokens or 0) > 0     # the summary it wrote
    billed = compacted.usage.billed()
    assert billed.prompt_tokens == compacted.usage.prompt_tokens + counted
    plain = provider.send(Request(messages=history[:3], max_tokens=64, context=_compact(),
                                  stream=stream))
    assert plain.usage.compaction_input_tokens is None


def test_a_compacted_reply_calibrates_and_bills_by_what_was_sent(emu: Emulator) -> None:
    """bytes/token is the body's over its tokens: a reply the server compacted calibrates
    by its compaction's count, not by the compacted input's (which would make every later
    estimate several times too small)."""
    from ipy_ctxrecovery import ChatSession, Settings

    with ChatSession("emulator:anthropic", emulator=emu,
                     settings=Settings(context_window=6_000)) as session:
        compactions: list[Any] = []
        session.subscribe(lambda e: compactions.append(e)
                          if type(e).__name__ == "ServerCompacted" else None)
        rates, billed = [], []
        for i in range(12):
            seen = len(compactions)
            reply = session.send(f"turn {i}: " + "the quick brown fox " * 150, stream=False)
            rates.append(session.limits.tokens.bytes_per_token)
            billed.append((reply.usage.prompt_tokens, len(compactions) > seen))
        assert compactions, "the server never compacted: the test shows nothing"
        # A compacting turn is billed the whole input (its compaction read it) and the
        # answer's compacted input: more than the turn before it, never less.
        for (earlier, _), (prompt, compacted) in zip(billed, billed[1:], strict=False):
            if compacted:
                assert prompt > earlier, billed
        # Skewed, a compacted reply moved it by 40% (4.2 → 5.9 bytes/token); kept, by 1%.
        assert max(rates) < 1.1 * min(rates), rates


# -- what the API refuses -----------------------------------------------------------------


def test_what_the_api_refuses(emu: Emulator) -> None:
    client = emu.anthropic_client(max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    compact = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": TRIGGER}}
    with pytest.raises(anthropic.BadRequestError) as no_beta:
        client.messages.create(model="emulator", max_tokens=10, messages=hi,
                               extra_body={"context_management": {"edits": [compact]}})
    assert "'context_management: Extra inputs are not permitted'" in no_beta.value.message
    with pytest.raises(anthropic.BadRequestError, match="expected tags"):
        client.beta.messages.create(model="emulator", max_tokens=10, messages=hi,
                                    betas=[CONTEXT_BETA], context_management={"edits": [compact]})
    low = {**compact, "trigger": {"type": "input_tokens", "value": TRIGGER - 1}}
    with pytest.raises(anthropic.BadRequestError, match=f"greater than or equal to {TRIGGER}"):
        client.beta.messages.create(model="emulator", max_tokens=10, messages=hi,
                                    betas=[COMPACT_BETA], context_management={"edits": [low]})
    block = {"type": "compaction", "content": "earlier", "encrypted_content":
             managing.seal("earlier")}
    changed = {**block, "content": "earlier, edited"}
    with pytest.raises(anthropic.BadRequestError) as mismatch:
        client.beta.messages.create(model="emulator", max_tokens=10, betas=[COMPACT_BETA],
                                    messages=[{"role": "assistant", "content": [changed]}, *hi])
    assert mismatch.value.error_code == "compaction_content_mismatch"
    with pytest.raises(anthropic.BadRequestError) as misplaced:
        client.beta.messages.create(model="emulator", max_tokens=10, betas=[COMPACT_BETA],
                                    messages=[{"role": "user", "content": [block]}])
    assert misplaced.value.error_code == "compaction_block_misplaced"
    with pytest.raises(anthropic.BadRequestError, match="needs the anthropic-beta"):
        client.messages.create(model="emulator", max_tokens=10,
                               messages=[{"role": "assistant", "content": [block]}, *hi])
    assert SERVER_COMPACTION_FAMILIES["emulator"] == managing.MIN_COMPACT_TRIGGER == TRIGGER
    # A compaction that failed (null content) is a no-op the server accepts.
    noop = client.beta.messages.create(model="emulator", max_tokens=50, betas=[COMPACT_BETA],
                                       messages=[{"role": "assistant", "content": [
                                           {"type": "compaction", "content": None}]}, *hi])
    assert noop.content[0].type == "text"


# -- context editing ----------------------------------------------------------------------


def _tool_history(rounds: int = 6) -> tuple[Message, ...]:
    out: list[Message] = [Message.user("look things up")]
    for i in range(rounds):
        name = "recall" if i == 0 else "search"
        out += [Message.assistant("", [ToolCall(f"toolu_{i}", name, json.dumps({"q": i}))]),
                Message.tool(f"toolu_{i}", f"result {i} " + "r" * 2_000, name=name)]
    out += [Message.assistant("done"), Message.user("and so?")]
    return tuple(out)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_cleared_tool_uses_are_reported_as_edits(
        emu: Emulator, provider: AnthropicProvider, stream: bool) -> None:
    history = _tool_history()
    plain = provider.send(Request(history, stream=stream))
    assert plain.edits == ()
    context = ContextManagement(clear_tool_uses=ClearToolUses(
        trigger=1_000, keep=2, exclude_tools=("recall",)))
    edited = provider.send(Request(history, context=context, stream=stream))
    assert CONTEXT_BETA in (emu.requests[-1].header("anthropic-beta") or "")
    assert plain.usage.prompt_tokens is not None and edited.usage.prompt_tokens is not None
    saved = plain.usage.prompt_tokens - edited.usage.prompt_tokens
    # Six tool uses, one excluded, two kept: three cleared.
    assert edited.edits == (ContextEdit("clear_tool_uses", saved, 3),) and saved > 1_000
    # Not past the trigger, or clearing less than asked: nothing is applied.
    high = ContextManagement(clear_tool_uses=ClearToolUses(trigger=100_000))
    assert provider.send(Request(history, context=high, stream=stream)).edits == ()
    most = ContextManagement(clear_tool_uses=ClearToolUses(trigger=1_000,
                                                           clear_at_least=saved * 10))
    assert provider.send(Request(history, context=most, stream=stream)).edits == ()


def test_old_thinking_is_cleared(emu: Emulator) -> None:
    client = emu.anthropic_client(max_retries=0)
    thinking = {"type": "thinking", "thinking": "t" * 400, "signature": "sig"}
    messages: list[dict[str, Any]] = []
    for i in range(3):
        messages += [{"role": "user", "content": f"q{i}"},
                     {"role": "assistant", "content": [thinking, {"type": "text", "text": "a"}]}]
    messages.append({"role": "user", "content": "q3"})
    reply = client.beta.messages.create(
        model="emulator", max_tokens=50, messages=messages, betas=[CONTEXT_BETA],
        context_management={"edits": [{"type": "clear_thinking_20251015"}]})
    applied = reply.context_management.applied_edits if reply.context_management else []
    assert [(e.type, e.cleared_thinking_turns, e.cleared_input_tokens) for e in applied] == [
        ("clear_thinking_20251015", 2, 200)]
    kept = client.beta.messages.create(
        model="emulator", max_tokens=50, messages=messages, betas=[CONTEXT_BETA],
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    assert kept.context_management is not None and kept.context_management.applied_edits == []
    assert kept.usage.input_tokens == reply.usage.input_tokens + 200


# -- token counting -----------------------------------------------------------------------


def test_count_tokens_agrees_with_the_prompt_tokens(emu: Emulator,
                                                   provider: AnthropicProvider) -> None:
    assert isinstance(provider, CountsTokens)
    history = _long_history()
    compaction, answer = _split(provider.send(Request(history, context=_compact())).message)
    tools = _tool_history()
    cases = [
        Request(history),                                   # plain: the non-beta endpoint
        Request((history[0], compaction, answer, Message.user("next"))),
        Request((*history, compaction, answer, Message.user("next")), context=_compact()),
        Request(tools, context=ContextManagement(clear_tool_uses=ClearToolUses(trigger=1_000))),
    ]
    for request in cases:
        counted = provider.count_tokens(request)
        counted_at = emu.requests[-1]
        assert counted_at.path == "/v1/messages/count_tokens"
        assert "max_tokens" not in counted_at.body and "stream" not in counted_at.body
        reply = provider.send(request)
        assert counted == reply.usage.prompt_tokens, request.messages[-1]
    # count_tokens never compacts: the whole history, though past the trigger.
    whole = provider.count_tokens(Request(history, context=_compact()))
    assert whole == provider.count_tokens(Request(history)) and whole is not None
    assert whole > TRIGGER


def test_count_tokens_is_one_bounded_request(emu: Emulator,
                                             provider: AnthropicProvider) -> None:
    request = Request((Message.user("hi"),))
    before = emu.received
    emu.fail_next(529, times=3)
    assert provider.count_tokens(request) is None
    assert emu.received == before + 1                # one request: no retries
    while emu.pending_faults:                        # let the scripted faults go
        assert provider.count_tokens(request) is None
    assert provider.count_tokens(request) == provider.send(request).usage.prompt_tokens


def test_the_raw_endpoint_reports_the_original_tokens(emu: Emulator) -> None:
    client = emu.anthropic_client(max_retries=0)
    messages = [{"role": "user", "content": f"question {i} {PAD}"} for i in range(8)]
    edits = {"edits": [{"type": "compact_20260112"}]}
    counted = client.beta.messages.count_tokens(model="emulator", messages=messages,
                                                betas=[COMPACT_BETA], context_management=edits)
    assert counted.input_tokens == managing._tokens({"messages": messages})
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == counted.input_tokens
    plain = client.messages.count_tokens(model="emulator", messages=messages)
    assert plain.input_tokens == counted.input_tokens


# -- conversion and exact sizes -----------------------------------------------------------


def test_another_wires_compaction_goes_as_its_summary_or_not_at_all(
        provider: AnthropicProvider) -> None:
    summarized = Message(Role.ASSISTANT, (Compaction("openai", '{"type":"compaction"}', "gist"),),
                         tag=TAG_SERVER_COMPACTION)
    opaque = Message(Role.ASSISTANT, (Compaction("openai", '{"type":"compaction"}', None),),
                     tag=TAG_SERVER_COMPACTION)
    body = json.loads(provider.encode(Request((summarized, Message.user("q")))))
    assert body["messages"][0] == {"role": "assistant",
                                   "content": [{"type": "text", "text": "gist"}]}
    body = json.loads(provider.encode(Request((opaque, Message.user("q")))))
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "q"}]}]


def test_a_cache_breakpoint_may_sit_on_the_compaction(emu: Emulator,
                                                     provider: AnthropicProvider) -> None:
    history = _long_history()
    compaction, _ = _split(provider.send(Request(history, context=_compact())).message)
    # The compaction is the last message: the final breakpoint lands on it.
    request = Request((history[0], Message.user("first " + PAD * 10), compaction),
                      context=_compact(), stream=False)
    body = json.loads(provider.encode(request))
    last = body["messages"][-1]["content"][-1]
    assert last["type"] == "compaction" and last.get("cache_control") == {"type": "ephemeral"}
    assert provider.measure(request) == len(provider.encode(request))
    provider.send(request)
    assert emu.requests[-1].status == 200


_OFFLINE = AnthropicProvider("claude-opus-4-6", client=anthropic.Anthropic(
    base_url="http://127.0.0.1:9", api_key="sk-ant-test", max_retries=0))
_BLOCK = {"type": "compaction", "content": "Summary: the user wants a plot ✓ \u2028 \"q\"",
          "encrypted_content": "opaque+/=", "tool_changes": [], "n": 2.5e-07}
_HELD = Message(Role.ASSISTANT, (Compaction("anthropic", json.dumps(_BLOCK), _BLOCK["content"]),),
                tag=TAG_SERVER_COMPACTION)
_CONTEXTS = [None, _compact(60_000), _compact(60_000, compact_instructions="Keep ✓ names."),
             ContextManagement(clear_tool_uses=ClearToolUses(trigger=5_000, keep=1,
                                                             exclude_tools=("x",),
                                                             clear_inputs=True),
                               clear_thinking=True),
             _compact(49_999)]
_OPTIONS = [{}, {"thinking": {"type": "adaptive"}},
            {"temperature": 0.5, "top_k": 3}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=valid_histories(max_turns=4, max_result_chars=4_000),
       held=st.booleans(), context=st.sampled_from(_CONTEXTS),
       options=st.sampled_from(_OPTIONS), stream=st.booleans(), caching=st.booleans())
def test_measure_is_exact_with_context_management(history: Any, held: bool, context: Any,
                                                  options: Any, stream: bool,
                                                  caching: bool) -> None:
    messages = tuple(history)
    if held:          # a server compaction in place of what came before the first request
        system = [m for m in messages if m.role is Role.SYSTEM]
        rest = [m for m in messages if m.role is not Role.SYSTEM]
        messages = (*system, _HELD, *rest)
    request = Request(messages, context=context, options=options, stream=stream)
    if not caching:
        request = dataclasses.replace(request, caching=None)
    provider = _OFFLINE
    kwargs = provider._kwargs(request)
    sdk = provider._capture.request(lambda c: provider._create(c, kwargs))
    assert provider.measure(request) == len(provider.encode(request)) == len(sdk.content)
    assert provider.encode(request) == sdk.content
    base, parts = provider.message_sizes(request)
    assert base + sum(parts) == provider.measure(request)
    template = provider._template(kwargs)
    assert template is not None and template.call is not None, "the fast path is off"
    fast = provider._capture.request(lambda c: template.call.send(c, sdk.content))
    assert (fast.url, fast.content) == (sdk.url, sdk.content)
    assert list(fast.headers.multi_items()) == list(sdk.headers.multi_items())
    beta = sdk.headers.get("anthropic-beta")
    if held or (context is not None and context.compact_trigger == 60_000):
        assert beta is not None and COMPACT_BETA in beta
    if held:
        sent = [b for m in json.loads(sdk.content)["messages"] for b in m["content"]
                if b.get("type") == "compaction"]
        assert [{k: v for k, v in b.items() if k != "cache_control"} for b in sent] == [_BLOCK]


def test_the_catalogue_says_which_models_compact() -> None:
    for model in ("claude-opus-4-6", "claude-opus-4-7-20260401", "claude-opus-4-8",
                  "claude-opus-5", "claude-sonnet-4-6", "claude-sonnet-5", "claude-fable-5",
                  "claude-mythos-5"):
        info = lookup(model)
        assert (info.server_compaction, info.min_compact_trigger) == (True, 50_000), model
    for model in ("claude-opus-4-5", "claude-haiku-4-5", "claude-opus-5-5", "gpt-4o"):
        assert not lookup(model).server_compaction, model
    info = lookup("emulator")
    assert (info.server_compaction, info.min_compact_trigger) == (True, TRIGGER)


def test_a_failed_compaction_replaces_nothing() -> None:
    # Null content: the API's no-op. Kept, it would make the session drop the history.
    from ipy_ctxrecovery.providers.anthropic import _read_message

    usage = {"input_tokens": 10, "output_tokens": 2}
    reply = _read_message({"content": [{"type": "compaction", "content": None},
                                       {"type": "text", "text": "hi"}],
                           "stop_reason": "end_turn", "usage": usage}, 100, "Anthropic")
    assert reply.message.blocks == (Message.assistant("hi").blocks[0],)
    held = _read_message({"content": [{"type": "text", "text": "hi"},
                                      {"type": "compaction", "content": "gist",
                                       "cache_control": {"type": "ephemeral"}}],
                          "stop_reason": "end_turn", "usage": usage}, 100, "Anthropic")
    first = held.message.blocks[0]
    assert isinstance(first, Compaction) and first.summary == "gist"
    assert json.loads(first.data) == {"type": "compaction", "content": "gist"}


def test_the_users_own_betas_go_by_the_beta_resource(emu: Emulator,
                                                    provider: AnthropicProvider) -> None:
    provider.send(Request((Message.user("hi"),), options={"betas": ["some-beta-2026-01-01"]}))
    record = emu.requests[-1]
    assert record.header("anthropic-beta") == "some-beta-2026-01-01"
    assert "betas" not in record.body
    provider.send(Request((Message.user("hi"),), context=_compact(),
                          options={"betas": ["some-beta-2026-01-01"]}))
    assert emu.requests[-1].header("anthropic-beta") == f"some-beta-2026-01-01,{COMPACT_BETA}"


def test_a_prompt_over_the_window_is_too_long_even_to_compact() -> None:
    with Emulator(context_window=3_000) as emu:
        provider = make_provider("emulator:anthropic", emulator=emu)
        try:
            fits = provider.send(Request(_long_history(8), context=_compact()))
            assert isinstance(fits.message.blocks[0], Compaction)
            with pytest.raises(Exception, match="prompt is too long"):
                provider.send(Request(_long_history(30), context=_compact(), retries=False))
            assert emu.requests[-1].fault == "context"
        finally:
            provider.close()


def test_a_server_without_a_counter_is_asked_once(emu: Emulator,
                                                  provider: AnthropicProvider) -> None:
    request = Request((Message.user("hi"),))
    emu.fail_next(404)
    before = emu.received
    assert provider.count_tokens(request) is None
    assert provider.count_tokens(request) is None
    assert emu.received == before + 1


def test_count_tokens_goes_through_the_middleboxes_and_is_recorded(
        emu: Emulator, provider: AnthropicProvider) -> None:
    request = Request(_long_history())
    emu.script("413:nginx")
    assert provider.count_tokens(request) is None
    record = emu.requests[-1]
    assert (record.path, record.status, record.fault) == ("/v1/messages/count_tokens", 413,
                                                          "413:nginx")
    counted = provider.count_tokens(request)                # a 413 is no proof of no counter
    assert counted is not None and emu.requests[-1].status == 200
    assert emu.requests[-1].body_bytes == record.body_bytes


def test_clearing_tool_inputs_clears_more(emu: Emulator, provider: AnthropicProvider) -> None:
    history = list(_tool_history())
    history[1] = Message.assistant("", [ToolCall("toolu_0", "recall", json.dumps(
        {"q": "x" * 3_000}))])
    results = []
    for inputs in (False, True):
        context = ContextManagement(clear_tool_uses=ClearToolUses(trigger=1_000, keep=1,
                                                                  clear_inputs=inputs))
        results.append(provider.send(Request(tuple(history), context=context)).edits)
    (results_only,), (with_inputs,) = results
    assert results_only.cleared_items == with_inputs.cleared_items == 5
    assert with_inputs.cleared_tokens > results_only.cleared_tokens + 700
