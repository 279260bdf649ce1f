"""The OpenAI Responses API: the emulator's ``/v1/responses`` (with the real SDK), the
``OpenAIResponsesProvider`` against it, and a ChatSession on it through every failure mode
the package handles on Chat Completions (window, 413, WAF, drop, output limit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import valid_histories

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT
from ipy_ctxrecovery.core.events import WindowLearned
from ipy_ctxrecovery.core.history import (
    Compaction,
    Message,
    Reasoning,
    Role,
    ToolCall,
    problems,
)
from ipy_ctxrecovery.core.wording import describe
from ipy_ctxrecovery.emulator import responses as emu_responses
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers import make_provider, uses_responses_api
from ipy_ctxrecovery.providers.base import (
    ContextManagement,
    CountsTokens,
    Measurable,
    Request,
    StopReason,
    ToolSpec,
)
from ipy_ctxrecovery.providers.openai import OpenAIProvider
from ipy_ctxrecovery.providers.openai_responses import (
    MIN_OUTPUT_TOKENS,
    OpenAIResponsesProvider,
    encrypts_reasoning,
    from_output,
    to_items,
)

RESPONSES = Settings(openai_api="responses")
WEATHER = ToolSpec("weather", "The weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]})
BIG = " ".join(f"note{k} lorem ipsum dolor" for k in range(400))      # ~2,500 tokens


def provider_for(emu: Any, **settings: Any) -> Any:
    provider = make_provider("emulator", emulator=emu,
                             settings=Settings(openai_api="responses", **settings))
    assert isinstance(provider, OpenAIResponsesProvider)
    return provider


def events_of(stream: Any) -> list[Any]:
    return list(stream)


# =========================================================================== the emulator

def test_a_string_input_is_answered_whole_and_streamed_with_the_real_event_names(
        emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    whole = client.responses.create(model="emulator", input="hello there",
                                    instructions="be brief")
    assert whole.status == "completed" and whole.incomplete_details is None
    assert whole.output_text.startswith('Emulator reply: you said "hello there" (2 messages')
    assert [o.type for o in whole.output] == ["reasoning", "message"]
    assert whole.usage.input_tokens == 16 and whole.usage.output_tokens > 0
    events = events_of(client.responses.create(model="emulator", input="hello there",
                                               instructions="be brief", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for name in ("response.output_item.added", "response.content_part.added",
                 "response.output_text.delta", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        assert name in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    record = emu.requests[-1]
    assert record.path == "/v1/responses" and record.stream


def test_items_in_every_form_are_read_as_the_chat_path_reads_messages(emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    items: list[Any] = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": '[[tool weather {"city": "Oslo"}]]'}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ]
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER.parameters}]
    first = client.responses.create(model="emulator", input=items[:2], tools=tools)
    call = [o for o in first.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in call] == [("weather", {"city": "Oslo"})]
    assert call[0].call_id.startswith("call_emu")
    assert first.status == "completed"
    after = client.responses.create(model="emulator", input=items, tools=tools)
    assert after.output_text.startswith("Tool weather returned 11 chars.")
    # The same conversation on Chat Completions counts the same prompt tokens.
    chat = client.chat.completions.create(model="emulator", tools=[
        {"type": "function", "function": {"name": "weather", "parameters": WEATHER.parameters}}],
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": '[[tool weather {"city": "Oslo"}]]'},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])
    flat = [{"type": "function", "name": "weather", "parameters": WEATHER.parameters}]
    nested = [{"type": "function", "function": {"name": "weather",
                                                "parameters": WEATHER.parameters}}]
    tools_gap = (emu_responses.replies.count_tokens(json.dumps(nested))
                 - emu_responses.replies.count_tokens(json.dumps(flat)))
    assert chat.usage is not None
    # The function_call item counts as its own message (no assistant text item beside it).
    assert after.usage.input_tokens == chat.usage.prompt_tokens - tools_gap


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_cuts_the_answer_as_incomplete(emulator: Any, stream: bool) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    result = client.responses.create(model="emulator", input="[[words 80]]",
                                     max_output_tokens=20, stream=stream)
    if stream:
        events = events_of(result)
        assert events[-1].type == "response.incomplete"
        result = events[-1].response
    assert result.status == "incomplete"
    assert result.incomplete_details.reason == "max_output_tokens"
    assert result.output_text == " ".join(f"w{k}" for k in range(1, 81))[:80]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="emulator", input="hi", max_output_tokens=8)
    assert info.value.body["code"] == "integer_below_min_value"


def test_cached_tokens_come_from_the_emulators_prompt_cache(emulator: Any) -> None:
    emu = emulator(context_window=100_000)
    client = emu.openai_client(max_retries=0)
    first = client.responses.create(model="emulator", input=[{"role": "user", "content": BIG},
                                                             {"role": "user", "content": "a"}])
    again = client.responses.create(model="emulator", input=[{"role": "user", "content": BIG},
                                                             {"role": "user", "content": "b"}])
    assert first.usage.input_tokens_details.cached_tokens == 0
    cached = again.usage.input_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0 and cached <= again.usage.input_tokens


def test_reasoning_is_encrypted_only_when_asked_and_must_come_back_unchanged(
        emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    plain = client.responses.create(model="emulator", input="hi", store=False)
    assert plain.output[0].type == "reasoning" and plain.output[0].encrypted_content is None
    asked = client.responses.create(model="emulator", input="hi", store=False,
                                    include=["reasoning.encrypted_content"],
                                    reasoning={"summary": "auto"})
    item = asked.output[0].to_dict()
    assert item["encrypted_content"].startswith("gAAAAA") and item["summary"][0]["text"]
    answer = asked.output[1].to_dict()
    follow = [{"role": "user", "content": "hi"}, item, answer,
              {"role": "user", "content": "more"}]
    assert client.responses.create(model="emulator", input=follow, store=False).status \
        == "completed"
    tampered = dict(item, encrypted_content=item["encrypted_content"][:-6] + "AAAAAA")
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="emulator", input=[tampered, *follow[2:]], store=False)
    assert "could not be verified" in bad.value.message
    by_id = {"type": "reasoning", "id": item["id"], "summary": []}
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="emulator", input=[by_id, *follow[2:]], store=False)
    assert "Items are not persisted when `store` is set to false" in gone.value.message
    assert client.responses.create(model="emulator", input="no reasoning",
                                   reasoning={"effort": "none"}).output[0].type == "message"


def _weather_loop(client: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                        dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A tool loop's first round, stored nowhere: (tools, the user's input, the answer's
    reasoning item and function call as sent back, the call's output)."""
    tools = [{"type": "function", "name": "weather", "description": "The weather.",
              "parameters": {"type": "object", "properties": {}}}]
    asked = [{"role": "user", "content": '[[tool weather {"city": "Oslo"}]]'}]
    first = client.responses.create(model="emulator", input=asked, tools=tools, store=False,
                                    include=["reasoning.encrypted_content"])
    reasoning, call = (o.to_dict() for o in first.output)
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    return tools, asked, reasoning, call, result


def _chained(client: Any, asked: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """The loop stored, then its call's output sent after ``previous_response_id`` alone
    (the reasoning is among the stored items)."""
    stored = client.responses.create(model="emulator", input=asked, tools=tools)
    return client.responses.create(
        model="emulator", previous_response_id=stored.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": stored.output[1].call_id,
                "output": "rain"}])


def test_a_function_call_sent_back_by_its_id_needs_its_reasoning_item_before_it(
        emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    tools, asked, reasoning, call, result = _weather_loop(client)
    assert (reasoning["type"], call["type"]) == ("reasoning", "function_call")
    whole = client.responses.create(model="emulator", input=[*asked, reasoning, call, result],
                                    tools=tools, store=False)
    assert whole.status == "completed"
    for without in ([*asked, call, result], [*asked, call, reasoning, result]):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="emulator", input=without, tools=tools, store=False)
        assert info.value.body == {
            "message": f"Item '{call['id']}' of type 'function_call' was provided without its "
                       f"required 'reasoning' item: '{reasoning['id']}'.",
            "type": "invalid_request_error", "param": "input", "code": None}
    # Without its id the API cannot tell which answer the call came from: accepted.
    anonymous = {k: v for k, v in call.items() if k not in ("id", "status")}
    assert client.responses.create(model="emulator", input=[*asked, anonymous, result],
                                   tools=tools, store=False).status == "completed"
    # Stored and continued by previous_response_id, the reasoning is in the stored items.
    assert _chained(client, asked, tools).status == "completed"
    # A model asked not to reason gives a call no reasoning item to need.
    plain = client.responses.create(model="emulator", input=asked, tools=tools, store=False,
                                    reasoning={"effort": "none"})
    bare = plain.output[0].to_dict()
    assert bare["type"] == "function_call"
    answered = dict(result, call_id=bare["call_id"])
    assert client.responses.create(model="emulator", input=[*asked, bare, answered],
                                   tools=tools, store=False).status == "completed"
    emu.reset()
    assert client.responses.create(model="emulator", input=[*asked, call, result],
                                   tools=tools, store=False).status == "completed"


def test_a_reasoning_item_needs_what_followed_it_and_an_output_needs_its_call(
        emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    tools, asked, reasoning, call, result = _weather_loop(client)
    later = {"role": "user", "content": "and tomorrow?"}
    # A reasoning item last, or followed by a user message or a tool output: the API's 400
    # (continuedev/continue#8933), whatever the call it belonged to.
    for without in ([*asked, reasoning], [*asked, reasoning, later],
                    [*asked, reasoning, result, later]):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="emulator", input=without, tools=tools, store=False)
        assert info.value.body == {
            "message": f"Item '{reasoning['id']}' of type 'reasoning' was provided without "
                       "its required following item.",
            "type": "invalid_request_error", "param": "input", "code": None}
    # An output whose call is not before it (left out, or after it): the API's 400
    # (continuedev/continue#10092).
    for orphaned in ([*asked, result], [*asked, result, reasoning, call]):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="emulator", input=orphaned, tools=tools, store=False)
        assert info.value.body == {
            "message": "No tool call found for function call output with call_id "
                       f"{call['call_id']}.",
            "type": "invalid_request_error", "param": "input", "code": None}
    # An answer's reasoning followed by its message, and a run of reasoning items before
    # what they belonged to, are accepted; so is an output whose call a stored response
    # holds.
    plain = client.responses.create(model="emulator", input="hi", store=False,
                                    include=["reasoning.encrypted_content"])
    thought, said = (o.to_dict() for o in plain.output)
    assert client.responses.create(
        model="emulator", input=["hi", thought, said, "more"], store=False).status == "completed"
    assert client.responses.create(
        model="emulator", input=[*asked, thought, reasoning, call, result], tools=tools,
        store=False).status == "completed"
    assert _chained(client, asked, tools).status == "completed"


def test_previous_response_id_continues_a_stored_response(emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    first = client.responses.create(model="emulator", input="remember 42")
    chained = client.responses.create(model="emulator", input="and now?",
                                      previous_response_id=first.id)
    full = client.responses.create(model="emulator", store=False, input=[
        {"role": "user", "content": "remember 42"},
        *[o.to_dict() for o in first.output], {"role": "user", "content": "and now?"}])
    assert chained.output_text == full.output_text
    assert chained.usage.input_tokens == full.usage.input_tokens
    unstored = client.responses.create(model="emulator", input="x", store=False)
    for missing in ("resp_nope", unstored.id):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="emulator", input="y", previous_response_id=missing)
        assert info.value.body == {"message": f"Previous response with id '{missing}' not found.",
                                   "type": "invalid_request_error",
                                   "param": "previous_response_id",
                                   "code": "previous_response_not_found"}
    emu.reset()
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="emulator", input="y", previous_response_id=first.id)


def test_the_response_store_is_bounded_and_forgets_its_items_with_them() -> None:
    store = emu_responses.ResponseStore(keep=3)
    shared = {"id": "rs_shared", "type": "reasoning"}
    for n in range(5):
        store.put(f"resp_{n}", [shared, {"id": f"msg_{n}", "type": "message"}])
    assert len(store) == 3 and store.get("resp_0") is None and store.get("resp_4") is not None
    assert not store.has_item("msg_1") and store.has_item("msg_2")
    assert store.has_item("rs_shared")            # still held by the responses kept
    store.clear()
    assert len(store) == 0 and not store.has_item("rs_shared")


def test_server_compaction_past_the_threshold_and_what_the_item_stands_for(
        emulator: Any) -> None:
    emu = emulator(context_window=4000)
    client = emu.openai_client(max_retries=0)
    items = [{"role": "user", "content": BIG[:4000]}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "what now?"}]
    manage = [{"type": "compaction", "compact_threshold": 500}]
    low = client.responses.create(model="emulator", input=items, store=False)
    assert [o.type for o in low.output] == ["reasoning", "message"]
    high = client.responses.create(model="emulator", input=items, store=False,
                                   context_management=manage)
    assert [o.type for o in high.output] == ["compaction", "reasoning", "message"]
    assert high.output_text == low.output_text           # the answer to the same request
    assert high.usage.input_tokens < low.usage.input_tokens
    again = client.responses.create(model="emulator", input=items, store=False,
                                    context_management=manage)
    item = high.output[0].to_dict()
    assert again.output[0].encrypted_content == item["encrypted_content"]   # deterministic
    summary = emu_responses.decode("compaction", item["encrypted_content"])
    assert summary is not None and "note1 lorem" in summary["summary"]
    assert "note1 lorem" not in item["encrypted_content"]                     # opaque
    # Items before a compaction item are not read: the same tokens with or without them.
    after = [item, {"role": "user", "content": "next"}]
    alone = client.responses.create(model="emulator", input=after, store=False)
    with_old = client.responses.create(model="emulator", input=items + after, store=False)
    assert alone.usage.input_tokens == with_old.usage.input_tokens
    assert alone.output_text == with_old.output_text
    assert alone.output_text.startswith('Emulator reply: you said "next" (2 messages')


def test_standalone_compact_and_the_input_token_counter(emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    items = [{"role": "user", "content": "first question"},
             {"role": "assistant", "content": "first answer"},
             {"role": "user", "content": "second question"}]
    compacted = client.responses.compact(model="emulator", input=items)
    assert compacted.object == "response.compaction"
    kinds = [o.type for o in compacted.output]
    assert kinds == ["message", "message", "compaction"]
    counted = client.responses.input_tokens.count(model="emulator", input=items)
    answered = client.responses.create(model="emulator", input=items, store=False)
    assert counted.input_tokens == answered.usage.input_tokens


def test_the_window_error_is_the_responses_apis_own(emulator: Any) -> None:
    emu = emulator(context_window=1000)
    client = emu.openai_client(max_retries=0)
    corpus = json.loads((Path(__file__).parent / "corpus" /
                         "openai_responses_context_window.json").read_text())
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="emulator", input=BIG)
    assert info.value.body == json.loads(corpus["body"])["error"]
    assert (emu.requests[-1].status, emu.requests[-1].fault) == (400, "context")
    # Streamed, the stream opens and the same error is its error event (the SDK raises it).
    stream = client.responses.create(model="emulator", input=BIG, stream=True)
    seen = []
    with pytest.raises(openai.APIError) as streamed:
        for event in stream:
            seen.append(event.type)
    assert seen == ["response.created", "response.in_progress"]
    assert not isinstance(streamed.value, openai.APIStatusError)
    assert streamed.value.body == json.loads(corpus["body"])["error"]
    assert (emu.requests[-1].status, emu.requests[-1].fault) == (200, "context")


@pytest.mark.parametrize("fault, status", [("413:nginx", 413), ("413:cloudflare", 413),
                                           ("waf", 403), ("429", 429)])
def test_faults_reach_the_responses_path_unchanged(emulator: Any, fault: str,
                                                   status: int) -> None:
    emu = emulator()
    emu.script(fault)
    client = emu.openai_client(max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(model="emulator", input="hi")
    assert info.value.status_code == status
    assert client.responses.create(model="emulator", input="hi").status == "completed"


def test_a_stream_error_on_the_responses_path_is_its_error_event(emulator: Any) -> None:
    emu = emulator()
    emu.script("stream-error")
    client = emu.openai_client(max_retries=0)
    with pytest.raises(openai.APIError) as info:
        events_of(client.responses.create(model="emulator", input="[[words 300]]",
                                          stream=True))
    assert isinstance(info.value.body, dict) and info.value.body["type"] == "server_error"


# =========================================================================== the provider

NOWHERE = "http://127.0.0.1:9"


def offline(**kwargs: Any) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider("gpt-5", client=openai.OpenAI(
        base_url=NOWHERE, api_key="sk-test", max_retries=0), **kwargs)


_SPECIAL = (Message(Role.ASSISTANT, (Reasoning("thought ✓", "gAAAA-enc", "rs_1"),
                                     ToolCall("c9", "weather", '{"city": "Zürich"}'))),
            Message.tool("c9", "sunny 日本"),
            Message(Role.ASSISTANT, (Compaction("openai", json.dumps(
                {"id": "cmp_1", "type": "compaction", "encrypted_content": "gAAAA-x"}), None),
                Reasoning("unsigned"),)),
            Message(Role.ASSISTANT, (Compaction("anthropic", "{}", "the summary ✓"),)),
            Message(Role.ASSISTANT, (Compaction("anthropic", "{}", None),)),
            Message.assistant(""), Message.system("mid-way"))


def variants(history: Any) -> list[Request]:
    return [Request(history, max_tokens=mt, tools=tools, options=opts, stream=stream,
                    context=context)
            for stream in (True, False) for tools in ((), (WEATHER,))
            for mt, opts, context in ((None, {}, None),
                                      (300, {"temperature": 0.2, "top_k": 4},
                                       ContextManagement(compact_trigger=20_000)),
                                      (4, {"extra_body": {"ü": "✓"}}, None))]


def test_measure_is_the_encoded_length() -> None:
    provider = offline()
    assert isinstance(provider, Measurable) and isinstance(provider, CountsTokens)
    history = (Message.system("s"), Message.user("u ✓"), *_SPECIAL, Message.user("end"))
    for request in variants(history) * 2:
        assert provider.measure(request) == len(provider.encode(request))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=valid_histories(max_turns=4, max_result_chars=4_000),
       pick=st.integers(0, 11), special=st.lists(st.integers(0, len(_SPECIAL) - 1),
                                                 max_size=3))
def test_measure_is_exact_on_generated_histories(history: Any, pick: int,
                                                 special: list[int]) -> None:
    full = tuple(history) + tuple(_SPECIAL[i] for i in special)
    request = variants(full)[pick]
    provider = _MEASURED
    assert provider.measure(request) == len(provider.encode(request))


_MEASURED = offline()
_STORED = offline(store=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=valid_histories(max_turns=4, max_result_chars=2_000),
       pick=st.integers(0, 11), cut=st.floats(0, 1))
def test_measure_is_exact_after_previous_response_id_too(history: Any, pick: int,
                                                         cut: float) -> None:
    from ipy_ctxrecovery.providers.openai_responses import _Chain

    full = tuple(history)
    covered = to_items(full[:int(len(full) * cut)])
    _STORED._chains = (_Chain("resp_prev", tuple(covered)),)
    request = variants(full)[pick]
    body = json.loads(_STORED.encode(request))
    assert _STORED.measure(request) == len(_STORED.encode(request))
    items = to_items(full)
    if 0 < len(covered) < len(items):
        assert body["previous_response_id"] == "resp_prev"
        assert body["input"] == items[len(covered):]
    else:
        assert "previous_response_id" not in body and body["input"] == items


def test_the_body_carries_what_the_api_documents() -> None:
    provider = offline()
    history = (Message.system("be brief"), Message.user("hi"), *_SPECIAL[:3],
               Message.user("go"))
    body = json.loads(provider.encode(Request(history, max_tokens=4, tools=(WEATHER,),
                                              context=ContextManagement(compact_trigger=9000,
                                                                        clear_thinking=True))))
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["max_output_tokens"] == MIN_OUTPUT_TOKENS
    assert body["context_management"] == [{"type": "compaction", "compact_threshold": 9000}]
    assert body["tools"] == [{"type": "function", "name": "weather",
                              "description": WEATHER.description,
                              "parameters": WEATHER.parameters}]
    assert "previous_response_id" not in body and "messages" not in body
    assert body["input"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text",
                                                         "text": "thought ✓"}],
         "encrypted_content": "gAAAA-enc"},
        {"type": "function_call", "call_id": "c9", "name": "weather",
         "arguments": '{"city": "Zürich"}'},
        {"type": "function_call_output", "call_id": "c9", "output": "sunny 日本"},
        # The compaction item verbatim; the unsigned reasoning left out.
        {"id": "cmp_1", "type": "compaction", "encrypted_content": "gAAAA-x"},
        {"role": "user", "content": "go"}]
    assert to_items(history) == body["input"]
    # A model that does not reason is not asked for encrypted reasoning (it would refuse).
    plain = OpenAIResponsesProvider("gpt-4o", client=openai.OpenAI(base_url=NOWHERE,
                                                                   api_key="sk-test"))
    assert "include" not in json.loads(plain.encode(Request(history)))
    assert [m for m in ("o3", "gpt-5", "gpt-5.4-mini", "openai/gpt-6", "codex-mini-latest",
                        "gpt-4o", "gpt-4.1", "gpt-5-chat-latest") if encrypts_reasoning(m)] \
        == ["o3", "gpt-5", "gpt-5.4-mini", "openai/gpt-6", "codex-mini-latest"]
    # Another wire's compaction: its summary as text, or nothing.
    assert to_items(_SPECIAL[3:5]) == [{"role": "assistant", "content": "the summary ✓"}]


def test_a_reply_is_read_back_into_the_history_model() -> None:
    output = [{"id": "cmp_2", "type": "compaction", "encrypted_content": "gAAAA-c",
               "created_by": "server"},
              {"id": "rs_2", "type": "reasoning", "encrypted_content": "gAAAA-r",
               "summary": [{"type": "summary_text", "text": "a"},
                           {"type": "summary_text", "text": "b"}]},
              {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Hello", "annotations": []}]},
              {"id": "fc_2", "type": "function_call", "call_id": "call_7", "name": "weather",
               "arguments": "{}", "status": "completed"}]
    message = from_output(output)
    compaction, reasoning, *rest = message.blocks
    assert isinstance(compaction, Compaction) and compaction.wire == "openai"
    assert json.loads(compaction.data) == output[0] and compaction.summary is None
    assert reasoning == Reasoning("ab", "gAAAA-r", "rs_2")
    assert message.text == "Hello" and message.tool_calls == (ToolCall("call_7", "weather"),)
    # Sent back: the compaction item as the server wrote it, the reasoning by id.
    items = to_items((message,))
    assert items[0] == output[0] and items[1]["id"] == "rs_2"


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_items_go_back_with_their_encrypted_content(emulator: Any,
                                                              stream: bool) -> None:
    emu = emulator()
    provider = provider_for(emu)
    history: tuple[Message, ...] = (Message.user("hello"),)
    first = provider.send(Request(history, stream=stream))
    reasoning = first.message.blocks[0]
    assert isinstance(reasoning, Reasoning) and reasoning.id and reasoning.signature
    assert first.response_id and first.stop is StopReason.END and first.streamed is stream
    assert first.usage.prompt_tokens is not None and first.usage.completion_tokens
    history += (first.message, Message.user("again"))
    second = provider.send(Request(history, stream=stream))
    sent = emu.requests[-1].body["input"]
    assert {"type": "reasoning", "id": reasoning.id, "summary": [],
            "encrypted_content": reasoning.signature} in sent
    assert second.message.text.startswith('Emulator reply: you said "again"')
    assert len(emu.requests) == 2 and all(r.status == 200 for r in emu.requests)


@pytest.mark.parametrize("stream", [False, True])
def test_an_incomplete_reply_is_a_length_stop(emulator: Any, stream: bool) -> None:
    emu = emulator()
    provider = provider_for(emu)
    response = provider.send(Request((Message.user("[[words 90]]"),), max_tokens=20,
                                     stream=stream))
    assert response.stop is StopReason.LENGTH and response.raw_stop == "max_output_tokens"
    assert response.message.text == " ".join(f"w{k}" for k in range(1, 91))[:80]
    assert response.usage.completion_tokens is not None and response.usage.completion_tokens > 0


def test_usage_reports_the_cached_tokens(emulator: Any) -> None:
    emu = emulator(context_window=100_000)
    provider = provider_for(emu)
    history = (Message.user(BIG), Message.assistant("ok"))
    provider.send(Request((*history, Message.user("a"))))
    again = provider.send(Request((*history, Message.user("b"))))
    assert again.usage.cached_tokens >= 1024
    assert again.usage.prompt_tokens is not None
    assert again.usage.prompt_tokens > again.usage.cached_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_server_compaction_comes_back_first_and_replaces_what_it_stands_for(
        emulator: Any, stream: bool) -> None:
    emu = emulator(context_window=8000)
    provider = provider_for(emu)
    history = (Message.system("terse"), Message.user(BIG[:3000]), Message.assistant("ok"),
               Message.user("what now?"))
    context = ContextManagement(compact_trigger=500)
    response = provider.send(Request(history, context=context, stream=stream))
    assert emu.requests[-1].body["context_management"] == [
        {"type": "compaction", "compact_threshold": 500}]
    first, *answer = response.message.blocks
    assert isinstance(first, Compaction) and first.wire == "openai" and first.summary is None
    assert response.message.text.startswith('Emulator reply: you said "what now?"')
    # What the session does with it (the contract): the compaction message replaces the
    # non-system messages before it; the next body carries none of them.
    compacted = (history[0], Message(Role.ASSISTANT, (first,), tag="server_compaction"),
                 Message(Role.ASSISTANT, tuple(answer)), Message.user("next"))
    assert problems(compacted) == []
    request = Request(compacted, context=context, stream=stream)
    size = provider.measure(request)
    provider.send(request)
    record = emu.requests[-1]
    assert record.body_bytes == size and record.status == 200
    assert BIG[:50] not in record.raw.decode()
    assert record.body["input"][1] == json.loads(first.data)


def test_store_chains_previous_response_id_while_the_prefix_holds(emulator: Any) -> None:
    emu = emulator()
    provider = provider_for(emu, openai_store=True)
    assert provider.store
    history: tuple[Message, ...] = (Message.system("terse"), Message.user("one"))
    first = provider.send(Request(history))
    assert emu.requests[-1].body["store"] is True
    assert "previous_response_id" not in emu.requests[-1].body
    history += (first.message, Message.user("two"))
    request = Request(history)
    size = provider.measure(request)
    second = provider.send(request)
    body = emu.requests[-1].body
    assert body["previous_response_id"] == first.response_id
    assert body["input"] == [{"role": "user", "content": "two"}]
    assert emu.requests[-1].body_bytes == size
    # The server read the whole conversation: the same answer as a full, unstored request.
    full = provider_for(emu).send(Request(history))
    assert second.message.text == full.message.text
    # A changed prefix sends everything again, without the id.
    changed = (Message.system("terse"), Message.user("ONE"), first.message, Message.user("two"))
    provider.send(Request(changed))
    body = emu.requests[-1].body
    assert "previous_response_id" not in body and len(body["input"]) == len(to_items(changed))


def test_a_chained_replys_usage_does_not_calibrate_bytes_per_token(emulator: Any) -> None:
    """With ``openai_store`` a request carries only what is new after
    ``previous_response_id`` while its usage counts the stored items too: as a sample that
    would drive bytes/token down turn after turn (4.2 → 1.3 in eight turns)."""
    emu = emulator(context_window=200_000)
    session = ChatSession("emulator", emulator=emu, name="resp-store-calibration",
                          settings=Settings(openai_api="responses", openai_store=True))
    text = "The weekly revenue by region rose in the north and fell in the south. " * 40
    rates = []
    try:
        for i in range(6):
            session.send(f"Week {i}: {text}", stream=False)
            rates.append(session.limits.tokens.bytes_per_token)
        assert all("previous_response_id" in r.body for r in emu.requests[1:])
        assert max(rates) <= 1.05 * min(rates), rates
    finally:
        session.close()


def test_another_history_between_two_turns_keeps_the_conversations_chain(
        emulator: Any) -> None:
    emu = emulator()
    provider = provider_for(emu, openai_store=True)
    history: tuple[Message, ...] = (Message.user("one"),)
    first = provider.send(Request(history))
    # A summary request (another history) in between is stored too, and chains nothing.
    provider.send(Request((Message.system("STRUCTURED SUMMARY please"), Message.user("one"))))
    assert "previous_response_id" not in emu.requests[-1].body
    history += (first.message, Message.user("two"))
    provider.send(Request(history))
    assert emu.requests[-1].body["previous_response_id"] == first.response_id
    assert emu.requests[-1].body["input"] == [{"role": "user", "content": "two"}]


def test_the_window_the_server_advertises_is_read(emulator: Any) -> None:
    emu = emulator(context_window=3072)
    assert provider_for(emu).advertised_window() == 3072


def test_a_forgotten_previous_response_drops_the_chain_as_a_transient_failure(
        emulator: Any) -> None:
    emu = emulator()
    provider = provider_for(emu, openai_store=True)
    history: tuple[Message, ...] = (Message.user("one"),)
    first = provider.send(Request(history))
    emu.reset()                                   # the server forgot every response
    history += (first.message, Message.user("two"))
    with pytest.raises(ChatError) as info:
        provider.send(Request(history, retries=False))
    assert info.value.failure.kind is FailureKind.TRANSIENT
    again = provider.send(Request(history, retries=False))
    assert again.message.text and "previous_response_id" not in emu.requests[-1].body
    assert len(emu.requests[-1].body["input"]) == len(to_items(history))


def test_count_tokens_is_the_servers_count_of_the_same_input(emulator: Any) -> None:
    emu = emulator()
    provider = provider_for(emu)
    request = Request((Message.system("terse"), Message.user("count me ✓")), tools=(WEATHER,))
    counted = provider.count_tokens(request)
    answered = provider.send(request)
    assert counted is not None and counted == answered.usage.prompt_tokens
    assert emu.requests[0].path == "/v1/responses/input_tokens"
    emu.script("500")
    assert provider.count_tokens(request) is None     # one request, no retry
    assert len(emu.requests) == 3


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("setup, kind", [
    ({"context_window": 200}, FailureKind.CONTEXT_OVERFLOW),
    ({"max_body": 1024}, FailureKind.PAYLOAD_TOO_LARGE),
    ({"waf_over": 1024}, FailureKind.WAF_REJECTION),
    ({"drop_over": 600 * 1024}, FailureKind.LIKELY_PAYLOAD),
])
def test_failures_become_the_same_chat_errors_as_on_chat_completions(
        emulator: Any, setup: dict[str, Any], kind: FailureKind, stream: bool) -> None:
    emu = emulator(**setup)
    provider = provider_for(emu)
    request = Request((Message.user("x" * 700 * 1024),), stream=stream, retries=False)
    with pytest.raises(ChatError) as info:
        provider.send(request)
    failure = info.value.failure
    assert failure.kind is kind, failure
    assert failure.request_bytes == provider.measure(request)


def test_an_error_event_mid_stream_is_a_transient_failure(emulator: Any) -> None:
    emu = emulator()
    emu.script("stream-error")
    provider = provider_for(emu)
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("[[words 300]]"),), retries=False))
    assert info.value.failure.kind is FailureKind.TRANSIENT


def test_the_api_is_chosen_per_endpoint(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert uses_responses_api("auto") is True                      # api.openai.com
    assert uses_responses_api("chat") is False and uses_responses_api("responses") is True
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    assert uses_responses_api("auto") is False                     # unknown capability
    local = openai.OpenAI(base_url="http://localhost:8000/v1", api_key="k")
    hosted = openai.OpenAI(base_url="https://api.openai.com/v1", api_key="k")
    assert uses_responses_api("auto", local) is False and uses_responses_api("auto", hosted)
    azure = openai.AzureOpenAI(api_key="k", api_version="2025-01-01",
                               azure_endpoint="https://x.openai.azure.com")
    assert uses_responses_api("auto", azure) is False
    chosen = make_provider("gpt-5", client=hosted, settings=Settings())
    assert isinstance(chosen, OpenAIResponsesProvider)
    assert isinstance(make_provider("gpt-5", client=hosted, settings=Settings(openai_api="chat")),
                      OpenAIProvider)
    assert isinstance(make_provider("gpt-5", client=local, settings=Settings()), OpenAIProvider)
    emu = emulator()
    assert isinstance(make_provider("emulator", emulator=emu, settings=Settings()),
                      OpenAIProvider)                              # auto on the emulator: chat
    assert isinstance(make_provider("emulator", emulator=emu, settings=RESPONSES),
                      OpenAIResponsesProvider)
    for client in (local, hosted, azure):
        client.close()


# =========================================================================== a session on it

def body_messages(record: Any) -> list[Any]:
    return list(record.body.get("input") or [])


def user_texts(record: Any) -> list[str]:
    return [i["content"] for i in body_messages(record)
            if i.get("role") == "user" and isinstance(i.get("content"), str)]


def filler(i: int, chars: int) -> str:
    words = " ".join(f"item{i}-{k}" for k in range(chars // 9))
    return f"Turn {i}: please keep note of these values: {words}"[:chars]


def converse(session: ChatSession, emu: Any, texts: list[str],
             **send: Any) -> list[tuple[Any, list[Any]]]:
    turns = []
    for text in texts:
        start = len(emu.requests)
        reply = session.send(text, **send)
        turns.append((reply, emu.requests[start:]))
    return turns


def check(session: ChatSession, turns: list[tuple[Any, list[Any]]], texts: list[str]) -> None:
    for (reply, records), text in zip(turns, texts, strict=True):
        assert reply.text and reply.finish_reason == "end", reply
        for record in records:
            assert record.path == "/v1/responses"
            if record.status == 200 and record.body is not None and not any(
                    "STRUCTURED SUMMARY" in str(i.get("content")) and i.get("role") == "system"
                    for i in body_messages(record)):
                assert text in "\n".join(user_texts(record))
    assert problems(session.history) == []
    said = [m.text for m in session.transcript if m.role is Role.USER]
    assert said == texts


@pytest.mark.parametrize("setup, status", [
    ({"max_body": 32 * 1024}, 413),
    ({"waf_over": 32 * 1024}, 403),
])
def test_a_session_on_the_responses_api_behind_a_body_cap(emulator: Any, setup: dict[str, Any],
                                                          status: int) -> None:
    emu = emulator(context_window=200_000, **setup)
    session = ChatSession("emulator", emulator=emu, settings=RESPONSES, name=f"resp-{status}")
    texts = [filler(i, 3000) for i in range(24)]
    turns = converse(session, emu, texts)
    check(session, turns, texts)
    rejected = [r for r in emu.requests if r.status != 200]
    assert [r.status for r in rejected] == [status]
    after = emu.requests[emu.requests.index(rejected[0]) + 1:]
    assert all(r.body_bytes <= 32 * 1024 for r in after)
    # Reasoning items travelled with the history that was still sent.
    assert any(i.get("type") == "reasoning" and i.get("encrypted_content")
               for i in body_messages(emu.requests[-1]))
    # Resumed after a restart, against a fresh emulator: the saved reasoning items (and
    # every other item) are read back and accepted.
    history = session.history
    session.close()
    fresh = emulator(context_window=200_000, **setup)
    again = ChatSession.resume(session.name, emulator=fresh, settings=RESPONSES)
    assert again.history == history
    assert again.send("after the restart: still there?").text
    assert [r.status for r in fresh.requests] == [200]
    assert any(i.get("type") == "reasoning" for i in body_messages(fresh.requests[-1]))
    again.close()


def test_a_session_on_the_responses_api_in_a_small_window(emulator: Any) -> None:
    emu = emulator(context_window=2048)
    session = ChatSession("emulator", emulator=emu, settings=RESPONSES, name="resp-window")
    texts = [filler(i, 700) for i in range(20)]
    turns = converse(session, emu, texts)
    check(session, turns, texts)
    assert len([r for r in emu.requests if r.status != 200]) <= 1
    assert session.status().compactions >= 1
    # Reasoning items survive the package's own compaction: the latest answers' ones are sent.
    assert any(i.get("type") == "reasoning" for i in body_messages(emu.requests[-1]))
    session.close()


def test_a_wrong_window_on_the_responses_api_is_rejected_once(emulator: Any) -> None:
    """The Responses window error names no window: the rejected request's size is the
    bound the session keeps under — one rejection, not two for every overflow (a blind
    ladder step finds nothing to cut under the wrong window and sends the same body)."""
    emu = emulator(context_window=4096)
    events: list[Any] = []
    session = ChatSession("emulator", emulator=emu, name="resp-wrong-window",
                          settings=Settings(openai_api="responses", context_window=100_000),
                          on_event=events.append)
    texts = [filler(i, 1000) for i in range(30)]
    turns = converse(session, emu, texts)
    check(session, turns, texts)
    # Streamed, the refusal is the stream's error event (HTTP 200): counted by its fault.
    rejected = [r for r in emu.requests if r.fault is not None]
    assert [r.fault for r in rejected] == ["context"]
    learned = [e for e in events if isinstance(e, WindowLearned)]
    assert len(learned) == 1 and learned[0].bound and learned[0].previous == 100_000
    # The bound is the rejected request's tokens: above the real window, not far.
    assert 4096 < learned[0].window <= 4096 * 1.25
    assert session.window == learned[0].window
    assert "which its error did not name" in describe(learned[0])
    assert session.status().compactions >= 2      # later overflows were compacted before
    session.close()


def test_a_session_on_the_responses_api_when_the_connection_drops(emulator: Any) -> None:
    limit = 600 * 1024
    emu = emulator(context_window=2_000_000, drop_over=limit)
    provider = make_provider("emulator", emulator=emu, settings=RESPONSES, max_retries=0)
    session = ChatSession("emulator", provider=provider, settings=RESPONSES, name="resp-drop")
    texts = [filler(i, 60_000) for i in range(14)]
    turns = converse(session, emu, texts)
    check(session, turns, texts)
    rejected = [r for r in emu.requests if r.status != 200]
    assert len(rejected) == 1 and rejected[0].status is None
    session.close()


def test_a_session_on_the_responses_api_continues_a_cut_answer(emulator: Any) -> None:
    emu = emulator(context_window=8192)
    session = ChatSession("emulator", emulator=emu, settings=RESPONSES, max_tokens=16,
                          name="resp-cut")
    texts = [f"Turn {i}: answer at length [[words {30 + i}]]" for i in range(6)]
    turns = converse(session, emu, texts)
    check(session, turns, texts)
    for i, (reply, _records) in enumerate(turns):
        assert reply.text == " ".join(f"w{k}" for k in range(1, 31 + i))
    continued = [r for r in emu.requests if CONTINUATION_PROMPT in user_texts(r)]
    assert continued and all(r.body["max_output_tokens"] >= MIN_OUTPUT_TOKENS
                             for r in emu.requests)
    session.close()


def test_an_empty_answer_after_its_reasoning_does_not_break_the_next_turns(
        emulator: Any) -> None:
    # The model answered nothing but its reasoning: sent back alone, that reasoning item is
    # the API's 400 on every later turn. It stays in the history; it is not sent.
    emu = emulator(context_window=8192)
    session = ChatSession("emulator", emulator=emu, settings=RESPONSES, name="resp-empty")
    assert session.send("hello").text
    assert session.send("[[words 0]]").text == ""
    assert [type(b) for b in session.history[-1].blocks] == [Reasoning]
    for text in ("and now?", "fine"):
        assert session.send(text).text.startswith("Emulator reply")
    assert [r.status for r in emu.requests] == [200] * 4
    sent = body_messages(emu.requests[2])
    assert [i.get("type") or i["role"] for i in sent] == [
        "user", "reasoning", "assistant", "user", "user"]
    assert problems(session.history) == []
    session.close()


def test_changing_the_api_setting_switches_a_live_sessions_provider(emulator: Any) -> None:
    emu = emulator()
    session = ChatSession("emulator", emulator=emu, settings=Settings(), name="resp-switch")
    session.send("on chat")
    session.update(settings=RESPONSES)
    session.send("on responses")
    session.update(settings=Settings(openai_api="responses", openai_store=True))
    session.send("stored")
    assert [r.path for r in emu.requests] == ["/v1/chat/completions", "/v1/responses",
                                              "/v1/responses"]
    assert emu.requests[1].body["store"] is False and emu.requests[2].body["store"] is True
    # The whole history went each time: the new provider had no chain yet.
    assert "on chat" in user_texts(emu.requests[2])
    session.close()


def fetch(n: int) -> str:
    """Return n characters of log output.

    Args:
        n: how many characters.
    """
    return "".join(f"log line {k}\n" for k in range(n))[:n]


def test_a_session_with_tools_behind_a_cap_and_in_a_small_window(emulator: Any,
                                                                  tmp_path: Path) -> None:
    limit = 16 * 1024
    emu = emulator(context_window=8192, max_body=limit)      # ~32 KB of window, 16 KB cap
    session = ChatSession("emulator", emulator=emu, settings=RESPONSES, tools=[fetch],
                          name="resp-both", files_root=tmp_path)
    texts = [f'Turn {i}: [[tool fetch {{"n": 6000}}]]' if i % 3 == 1 else filler(i, 900)
             for i in range(18)]
    turns = converse(session, emu, texts)
    check(session, turns, texts)
    rejected = [r for r in emu.requests if r.status != 200]
    assert [r.status for r in rejected] == [413]
    after = emu.requests[emu.requests.index(rejected[0]) + 1:]
    assert all(r.body_bytes <= limit for r in after)
    # Tool calls and their results went as function_call / function_call_output items,
    # paired in every request.
    for record in emu.requests:
        if record.body is None:
            continue
        items = body_messages(record)
        calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
        outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
        assert calls == outputs, record.body_bytes
    assert any(i.get("type") == "function_call_output"
               for r in emu.requests if r.body for i in body_messages(r))
    assert session.status().compactions >= 1
    session.close()


def _sse_reply(*events: dict[str, Any]) -> bytes:
    body = b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode())
                    for e in events)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _streamed(reply: bytes) -> tuple[Any, list[str]]:
    from rawserver import serving

    pieces: list[str] = []
    with serving() as start:
        raw = start(reply, stall=0)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{raw.port}/v1", api_key="k",
                               max_retries=0, timeout=10)
        provider = OpenAIResponsesProvider("gpt-5", client=client)
        try:
            return provider.send(Request((Message.user("x"),)), on_text=pieces.append), pieces
        except ChatError as error:
            return error, pieces
        finally:
            provider.close()
            client.close()


def test_a_streamed_refusal_is_the_answer_and_failed_responses_are_errors() -> None:
    refusal = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    done = {"id": "resp_1", "object": "response", "status": "completed", "output": [refusal],
            "usage": {"input_tokens": 5, "output_tokens": 7,
                      "input_tokens_details": {"cached_tokens": 0}}}
    response, pieces = _streamed(_sse_reply(
        {"type": "response.refusal.delta", "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": "I can't help with that.", "sequence_number": 0},
        {"type": "response.output_item.done", "output_index": 0, "item": refusal,
         "sequence_number": 1},
        {"type": "response.completed", "response": done, "sequence_number": 2}))
    assert response.message.text == "I can't help with that." == "".join(pieces)
    assert response.stop is StopReason.END and response.response_id == "resp_1"
    # response.failed and a bare error event (no "error" object: the SDK yields it) are
    # the API's errors, classified as such.
    failed = {"id": "resp_2", "object": "response", "status": "failed", "output": [],
              "error": {"code": "context_length_exceeded",
                        "message": emu_responses.WINDOW_MESSAGE}}
    error, _ = _streamed(_sse_reply({"type": "response.failed", "response": failed,
                                     "sequence_number": 0}))
    assert isinstance(error, ChatError)
    assert error.failure.kind is FailureKind.CONTEXT_OVERFLOW
    error, _ = _streamed(_sse_reply({"type": "error", "code": "server_error", "param": None,
                                     "message": "The server had an error while processing "
                                                "your request.", "sequence_number": 0}))
    assert isinstance(error, ChatError) and error.failure.kind is FailureKind.TRANSIENT
    # A stream that ends before the response is done is cut off, not an answer.
    error, _ = _streamed(_sse_reply({"type": "response.output_text.delta", "item_id": "m",
                                     "output_index": 0, "content_index": 0, "delta": "Hel",
                                     "sequence_number": 0}))
    assert isinstance(error, ChatError) and error.failure.kind is FailureKind.TRANSIENT


def test_chat_status_says_the_responses_api_is_used(loaded_shell: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """With openai_api=responses the endpoint line says so; on Chat Completions it adds
    nothing (a user who chose the API can see it is the one in use)."""
    def endpoint() -> str:
        capsys.readouterr()
        loaded_shell.run_line_magic("chat", "status")
        return next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("endpoint:"))

    loaded_shell.run_line_magic("config", "ChatMagics.default_model = 'emulator:openai'")
    loaded_shell.run_cell_magic("chat", "", "hello")
    assert endpoint().endswith("/v1/")
    loaded_shell.run_line_magic("chat", "config openai_api=responses")
    loaded_shell.run_cell_magic("chat", "", "hello")
    assert endpoint().endswith("/v1/ (Responses API)")
