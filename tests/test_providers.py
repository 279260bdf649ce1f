"""Provider adapters against real local HTTP servers, through the real SDKs.

A small stdlib recorder server (below) stores every request body byte for byte and
answers canned replies in both wire formats, so ``encode()`` can be compared with what
actually arrived and every reply shape (streamed tool-call pieces, thinking signatures,
truncated bodies, dropped connections) can be produced on demand.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quiet_server import QuietHTTPServer
from rawserver import serving
from strategies import valid_histories

from ipy_ctxrecovery.core.catalogue import ModelInfo
from ipy_ctxrecovery.core.history import Message, Reasoning, Role, Text, ToolCall
from ipy_ctxrecovery.core.markers import MERGED_TEXT_JOIN
from ipy_ctxrecovery.errors import ChatError, ConfigError
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers import (
    Provider,
    Request,
    StopReason,
    ToolSpec,
    make_provider,
)
from ipy_ctxrecovery.providers._wire import JsonFloat, encode_converted, encode_value
from ipy_ctxrecovery.providers.anthropic import AnthropicProvider, to_anthropic
from ipy_ctxrecovery.providers.base import Measurable, prepare
from ipy_ctxrecovery.providers.openai import OpenAIProvider, to_wire, uses_max_completion_tokens
from ipy_ctxrecovery.settings import Settings

OPENAI_KEY = "sk-test-SECRETSECRETSECRET1234"
ANTHROPIC_KEY = "sk-ant-test-SECRETSECRETSECRET1234"


# -- the recorder server ----------------------------------------------------------------------

@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    events: list[bytes] | None = None      # SSE frames, written one by one
    drop: bool = False                     # close the connection without answering
    declare: int | None = None             # a Content-Length other than the body's
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Recorder:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[Reply] = deque()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                recorder.requests.append(Recorded(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                reply = recorder.script.popleft() if recorder.script else auto_reply(self.path, body)
                if reply.drop:
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if reply.events is not None:
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for frame in reply.events:
                        self.wfile.write(frame)
                        self.wfile.flush()
                    self.close_connection = True
                    return
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(reply.declare or len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
                if reply.declare:
                    self.close_connection = True

        self.server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        port = self.server.server_address[1]
        self.openai_url = f"http://127.0.0.1:{port}/v1"
        self.anthropic_url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"{head}data: {payload}\n\n".encode()


# OpenAI reply shapes
def oa_completion(content: str | None = "Hello ☃ world", *, finish: str = "stop",
                  tool_calls: list[dict[str, Any]] | None = None, usage: tuple[int, int] = (11, 3),
                  extra: dict[str, Any] | None = None) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content, **(extra or {})}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                      "total_tokens": sum(usage)}}
    return Reply(body=json.dumps(body).encode())


def oa_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def oa_stream(deltas: list[dict[str, Any]], *, finish: str | None = "stop",
              usage: tuple[int, int] | None = (11, 3), done: bool = True) -> Reply:
    frames = [oa_chunk({"role": "assistant", "content": ""})]
    frames += [oa_chunk(d) for d in deltas]
    if finish is not None:
        frames.append(oa_chunk({}, finish))
    if usage is not None:
        frames.append(sse({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                           "model": "m", "choices": [],
                           "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                     "total_tokens": sum(usage)}}))
    if done:
        frames.append(b"data: [DONE]\n\n")
    return Reply(events=frames)


# Anthropic reply shapes
def an_message(content: list[dict[str, Any]] | None = None, *, stop: str = "end_turn",
               usage: tuple[int, int] = (10, 2)) -> Reply:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": content if content is not None else [{"type": "text", "text": "Hello ☃"}],
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}
    return Reply(body=json.dumps(body).encode())


def an_stream(blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]], *,
              stop: str | None = "end_turn", usage: tuple[int, int] = (10, 2),
              end: bool = True) -> Reply:
    frames = [sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1}}}, "message_start"),
        sse({"type": "ping"}, "ping")]
    for i, (start, deltas) in enumerate(blocks):
        frames.append(sse({"type": "content_block_start", "index": i, "content_block": start},
                          "content_block_start"))
        frames += [sse({"type": "content_block_delta", "index": i, "delta": d},
                       "content_block_delta") for d in deltas]
        frames.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    if stop is not None:
        frames.append(sse({"type": "message_delta",
                           "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": usage[1]}}, "message_delta"))
    if end:
        frames.append(sse({"type": "message_stop"}, "message_stop"))
    return Reply(events=frames)


def text_block(*pieces: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces]


def auto_reply(path: str, body: bytes) -> Reply:
    data = json.loads(body)
    if path.split("?")[0].endswith("/chat/completions"):
        return oa_stream([{"content": "Hello"}, {"content": " ☃"}, {"content": " world"}]) \
            if data.get("stream") else oa_completion()
    return an_stream([text_block("Hello", " ☃")]) if data.get("stream") else an_message()


@pytest.fixture
def server() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.close()


def oa_provider(server: Recorder, model: str = "gpt-4o", **kw: Any) -> OpenAIProvider:
    client = openai.OpenAI(base_url=server.openai_url, api_key=OPENAI_KEY, max_retries=0)
    return OpenAIProvider(model, client=client, **kw)


def an_provider(server: Recorder, model: str = "claude-sonnet-5-5", **kw: Any) -> AnthropicProvider:
    client = anthropic.Anthropic(base_url=server.anthropic_url, api_key=ANTHROPIC_KEY, max_retries=0)
    return AnthropicProvider(model, client=client, **kw)


WEATHER = ToolSpec("get_weather", "Weather for a city — °C",
                   {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]})

HISTORY_WITH_TOOLS = (
    Message.system("You are terse. Ünïcödé ✓"),
    Message.user("Wetter in Zürich? 🌦"),
    Message(Role.ASSISTANT, (Reasoning("Need the tool…", signature="sig-abc=="),
                             Text("Checking."),
                             ToolCall("call_1", "get_weather", '{"city": "Zürich"}'))),
    Message.tool("call_1", "12 °C, Regen", name="get_weather"),
    Message.tool("call_2", "boom", is_error=True),
    Message.user("Danke! 日本語も"),
)


def requests_to_check() -> list[Request]:
    unicode_only = (Message.system("Système ☃"), Message.user("héllo \u2028 \"quoted\" \\ 🚀"))
    return [
        Request(unicode_only, stream=False),
        Request(unicode_only, stream=True, max_tokens=77),
        Request(HISTORY_WITH_TOOLS, tools=(WEATHER,), stream=True,
                options={"temperature": 0.25, "top_k": 5}),
        Request(HISTORY_WITH_TOOLS, tools=(WEATHER,), stream=False, max_tokens=1000),
    ]


# -- (1) encode() is exactly what the server received ---------------------------------------

@pytest.mark.parametrize("make", [oa_provider, an_provider], ids=["openai", "anthropic"])
def test_encode_equals_received_bytes(server: Recorder, make: Any) -> None:
    provider = make(server)
    for request in requests_to_check():
        before = provider.encode(request)
        response = provider.send(request)
        received = server.requests[-1].body
        assert received == before
        assert response.body_bytes == len(received)
    # The bytes are raw UTF-8, not \u escapes: measuring them is measuring the wire.
    assert "Zürich".encode() in server.requests[-1].body


def test_encode_equals_received_bytes_for_reasoning_models(server: Recorder) -> None:
    provider = oa_provider(server, "o3-mini")
    request = Request((Message.user("think ✓"),), max_tokens=500, stream=True,
                      options={"reasoning_effort": "low"})
    assert provider.encode(request) == (provider.send(request), server.requests[-1].body)[1]
    sent = server.requests[-1].json()
    assert sent["max_completion_tokens"] == 500 and "max_tokens" not in sent
    assert sent["reasoning_effort"] == "low"


# -- what each adapter puts in the body ------------------------------------------------------

def test_openai_body_shape(server: Recorder) -> None:
    provider = oa_provider(server)
    body = json.loads(provider.encode(Request(HISTORY_WITH_TOOLS, tools=(WEATHER,), stream=True,
                                              options={"temperature": 0.5, "top_k": 3})))
    assert body["model"] == "gpt-4o"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "max_tokens" not in body and "max_completion_tokens" not in body
    assert body["temperature"] == 0.5 and body["top_k"] == 3   # unknown option → extra_body
    assert body["tools"][0]["function"]["name"] == "get_weather"
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Zürich"}'
    no_stream = json.loads(provider.encode(Request((Message.user("x"),), stream=False,
                                                   max_tokens=9)))
    assert no_stream["max_tokens"] == 9 and "stream_options" not in no_stream


def test_max_tokens_option_picks_the_parameter_name(server: Recorder) -> None:
    provider = oa_provider(server, "my-azure-deployment")
    body = json.loads(provider.encode(Request((Message.user("x"),), max_tokens=50,
                                              options={"max_completion_tokens": None})))
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    body = json.loads(provider.encode(Request((Message.user("x"),),
                                              options={"max_tokens": 70})))
    assert body["max_tokens"] == 70


def test_max_completion_tokens_families() -> None:
    for model in ("o1", "o3-mini", "o4-mini-2025-04-16", "gpt-5", "gpt-5.1-mini", "openai/gpt-5"):
        assert uses_max_completion_tokens(model), model
    for model in ("gpt-4o", "gpt-4.1-mini", "gpt-3.5-turbo", "llama3:8b", "emulator", "omni"):
        assert not uses_max_completion_tokens(model), model


def test_anthropic_conversion_rules() -> None:
    history = (
        Message.system("first"),
        Message.user("hi"),
        Message.user("again"),                      # consecutive users merge
        Message.system("late system"),              # joins the system parameter, in order
        Message(Role.ASSISTANT, (Reasoning("unsigned"), Reasoning("signed", "s1"), Text(""),
                                 Text("ok"), ToolCall("t1", "f", "not json"),
                                 ToolCall("t2", "g", ""), ToolCall("t3", "h", "[1]"))),
        Message.tool("t1", "r1"),
        Message.tool("t2", "r2", is_error=True),
        Message.tool("t3", ""),
        Message.user("next"),
    )
    system, messages = to_anthropic(history)
    assert system == "first\n\nlate system"
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == [{"type": "text", "text": "hi"},
                                      {"type": "text", "text": "again"}]
    assistant = messages[1]["content"]
    assert assistant[0] == {"type": "thinking", "thinking": "signed", "signature": "s1"}
    assert assistant[1] == {"type": "text", "text": "ok"}
    assert assistant[2]["input"] == {"_raw_arguments": "not json"}
    assert assistant[3]["input"] == {}
    assert assistant[4]["input"] == {"_raw_arguments": "[1]"}
    results = messages[2]["content"]
    assert [b["type"] for b in results] == ["tool_result"] * 3 + ["text"]
    assert "is_error" not in results[0] and results[1]["is_error"] is True
    assert results[0]["tool_use_id"] == "t1"


def test_anthropic_body_defaults(server: Recorder) -> None:
    provider = an_provider(server, "claude-3-haiku")           # max output 4096 in catalogue
    body = json.loads(provider.encode(Request(HISTORY_WITH_TOOLS, tools=(WEATHER,),
                                              options={"temperature": 0.1})))
    assert body["max_tokens"] == 4096 and body["temperature"] == 0.1
    assert body["system"] == "You are terse. Ünïcödé ✓"
    assert body["tools"][0]["input_schema"]["required"] == ["city"]
    small = an_provider(server, "claude-x", info=ModelInfo("claude-x", 3000, 1000))
    assert json.loads(small.encode(Request((Message.user("x"),))))["max_tokens"] == 1000
    # A large max_tokens without streaming still goes out (the SDK would refuse it unless
    # a timeout is given; the adapter passes the client's own).
    big = Request((Message.user("x"),), max_tokens=64_000, stream=False)
    assert provider.send(big).stop is StopReason.END
    assert server.requests[-1].json()["max_tokens"] == 64_000


class _FixedLimits:
    """Stands in for an Emulator where only its reported limits matter (nothing is sent)."""

    context_window = 3000
    max_output_tokens = 1000
    openai_base_url = "http://127.0.0.1:9/v1"
    anthropic_base_url = "http://127.0.0.1:9"


# -- (2) round trips ----------------------------------------------------------------------------

def test_openai_text_round_trip(server: Recorder) -> None:
    provider = oa_provider(server)
    response = provider.send(Request((Message.user("hi"),), stream=False))
    assert response.message.role is Role.ASSISTANT
    assert response.message.text == "Hello ☃ world"
    assert response.stop is StopReason.END and response.raw_stop == "stop"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (11, 3)


def test_openai_streaming_deltas_in_order(server: Recorder) -> None:
    provider = oa_provider(server)
    server.script.append(oa_stream([{"content": p} for p in ("a", "β", "c", "🚀")],
                                   usage=(40, 4)))
    seen: list[str] = []
    response = provider.send(Request((Message.user("hi"),)), on_text=seen.append)
    assert seen == ["a", "β", "c", "🚀"]
    assert response.message.text == "aβc🚀"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (40, 4)


def test_openai_streamed_tool_calls_assembled(server: Recorder) -> None:
    provider = oa_provider(server)
    server.script.append(oa_stream([
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Zürich"}'}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": ' "Oslo"}'}}]},
    ], finish="tool_calls"))
    response = provider.send(Request((Message.user("weather"),), tools=(WEATHER,)))
    assert response.stop is StopReason.TOOL_CALLS
    calls = response.message.tool_calls
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("call_a", "get_weather", {"city": "Zürich"}),
        ("call_b", "get_weather", {"city": "Oslo"})]
    # Tool result goes back and the server sees a valid tool message.
    history = (Message.user("weather"), response.message,
               Message.tool("call_a", "12 °C"), Message.tool("call_b", "3 °C"))
    final = provider.send(Request(history, tools=(WEATHER,)))
    sent = server.requests[-1].json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert sent[1]["tool_calls"][1]["id"] == "call_b" and sent[3]["tool_call_id"] == "call_b"
    assert final.stop is StopReason.END


def test_openai_non_stream_tool_call_and_reasoning_content(server: Recorder) -> None:
    provider = oa_provider(server)
    server.script.append(oa_completion(None, finish="tool_calls", tool_calls=[
        {"id": "call_z", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        extra={"reasoning_content": "let me think"}))
    response = provider.send(Request((Message.user("x"),), stream=False))
    assert response.message.tool_calls == (ToolCall("call_z", "f", "{}"),)
    assert response.message.blocks[0] == Reasoning("let me think")
    server.script.append(oa_stream([{"reasoning_content": "hmm "}, {"reasoning_content": "ok"},
                                    {"content": "done"}]))
    streamed = provider.send(Request((Message.user("x"),)))
    assert streamed.message.blocks == (Reasoning("hmm ok"), Text("done"))


def test_openai_streamed_refusal_is_the_answer(server: Recorder) -> None:
    provider = oa_provider(server)
    server.script.append(oa_stream([{"refusal": "I can't "}, {"refusal": "help with that."}]))
    seen: list[str] = []
    response = provider.send(Request((Message.user("x"),)), on_text=seen.append)
    assert response.message.text == "I can't help with that." and len(seen) == 2


@pytest.mark.parametrize("stream", [True, False])
def test_openai_length_and_filter_stops(server: Recorder, stream: bool) -> None:
    provider = oa_provider(server)
    for raw, stop in (("length", StopReason.LENGTH), ("content_filter", StopReason.FILTERED),
                      ("weird", StopReason.OTHER)):
        server.script.append(oa_stream([{"content": "w1 w2"}], finish=raw) if stream
                             else oa_completion("w1 w2", finish=raw))
        response = provider.send(Request((Message.user("x"),), max_tokens=2, stream=stream))
        assert (response.stop, response.raw_stop) == (stop, raw)
        assert response.message.text == "w1 w2"


def test_anthropic_text_round_trip(server: Recorder) -> None:
    provider = an_provider(server)
    response = provider.send(Request((Message.user("hi"),), stream=False))
    assert response.message.text == "Hello ☃"
    assert response.stop is StopReason.END and response.raw_stop == "end_turn"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (10, 2)


def test_anthropic_streaming_deltas_in_order(server: Recorder) -> None:
    provider = an_provider(server)
    server.script.append(an_stream([text_block("a", "β", "c", "🚀")], usage=(33, 4)))
    seen: list[str] = []
    response = provider.send(Request((Message.user("hi"),)), on_text=seen.append)
    assert seen == ["a", "β", "c", "🚀"]
    assert response.message.text == "aβc🚀"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (33, 4)


def test_anthropic_thinking_signature_and_tool_use_round_trip(server: Recorder) -> None:
    provider = an_provider(server)
    server.script.append(an_stream([
        ({"type": "thinking", "thinking": "", "signature": ""},
         [{"type": "thinking_delta", "thinking": "Let me "},
          {"type": "thinking_delta", "thinking": "check."},
          {"type": "signature_delta", "signature": "EqQBCgIYAhIM=="}]),
        text_block("Checking."),
        ({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
         [{"type": "input_json_delta", "partial_json": ""},
          {"type": "input_json_delta", "partial_json": '{"city": "Z'},
          {"type": "input_json_delta", "partial_json": 'ürich"}'}]),
    ], stop="tool_use"))
    request = Request((Message.user("weather?"),), tools=(WEATHER,),
                      options={"thinking": {"type": "enabled", "budget_tokens": 1024}})
    response = provider.send(request)
    assert response.stop is StopReason.TOOL_CALLS and response.raw_stop == "tool_use"
    reasoning, text, call = response.message.blocks
    assert reasoning == Reasoning("Let me check.", "EqQBCgIYAhIM==")
    assert text == Text("Checking.")
    assert call == ToolCall("toolu_1", "get_weather", '{"city": "Zürich"}')
    assert server.requests[-1].json()["thinking"] == {"type": "enabled", "budget_tokens": 1024}

    history = (Message.user("weather?"), response.message,
               Message.tool("toolu_1", "12 °C", name="get_weather"))
    provider.send(Request(history, tools=(WEATHER,), options=request.options))
    sent = server.requests[-1].json()["messages"]
    assert sent[1]["content"][0] == {"type": "thinking", "thinking": "Let me check.",
                                     "signature": "EqQBCgIYAhIM=="}
    assert sent[1]["content"][2] == {"type": "tool_use", "id": "toolu_1",
                                     "name": "get_weather", "input": {"city": "Zürich"}}
    assert sent[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 °C"}]}


def test_anthropic_tool_input_sent_whole_in_block_start(server: Recorder) -> None:
    provider = an_provider(server)
    server.script.append(an_stream([
        ({"type": "tool_use", "id": "toolu_2", "name": "f", "input": {"q": "ß"}}, []),
        ({"type": "tool_use", "id": "toolu_3", "name": "g", "input": {"stale": 1}},
         [{"type": "input_json_delta", "partial_json": '{"fresh": 2}'}]),
    ], stop="tool_use"))
    calls = provider.send(Request((Message.user("x"),))).message.tool_calls
    assert [json.loads(c.arguments) for c in calls] == [{"q": "ß"}, {"fresh": 2}]


def test_anthropic_non_stream_blocks(server: Recorder) -> None:
    provider = an_provider(server)
    server.script.append(an_message([
        {"type": "thinking", "thinking": "hm", "signature": "sig"},
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {"a": [1, "ü"]}}],
        stop="tool_use"))
    response = provider.send(Request((Message.user("x"),), stream=False))
    assert response.message.blocks == (Reasoning("hm", "sig"), Text("Let me look."),
                                       ToolCall("toolu_9", "f", '{"a": [1, "ü"]}'))


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_stop_reasons(server: Recorder, stream: bool) -> None:
    provider = an_provider(server)
    cases = [("max_tokens", StopReason.LENGTH), ("stop_sequence", StopReason.END),
             ("refusal", StopReason.FILTERED), ("pause_turn", StopReason.OTHER)]
    for raw, stop in cases:
        server.script.append(an_stream([text_block("w1 w2")], stop=raw) if stream
                             else an_message([{"type": "text", "text": "w1 w2"}], stop=raw))
        response = provider.send(Request((Message.user("x"),), max_tokens=2, stream=stream))
        assert (response.stop, response.raw_stop) == (stop, raw)
        assert response.message.text == "w1 w2"


# -- (3) every failure becomes a ChatError with the request size -----------------------------

OVERFLOW_OPENAI = json.dumps({"error": {
    "message": "This model's maximum context length is 8192 tokens. However, your messages "
               "resulted in 9000 tokens. Please reduce the length of the messages.",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
OVERFLOW_ANTHROPIC = json.dumps({"type": "error", "error": {
    "type": "invalid_request_error", "message": "prompt is too long: 9000 tokens > 8192 maximum"}})
NGINX_413 = (b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
             b"<center><h1>413 Request Entity Too Large</h1></center>\r\n"
             b"<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n")
BARE_403 = b"<html><head><title>403 Forbidden</title></head><body><h1>Forbidden</h1></body></html>"


def _auth_body(api: str) -> bytes:
    if api == "openai":
        return json.dumps({"error": {"message": f"Incorrect API key provided: {OPENAI_KEY}.",
                                     "type": "invalid_request_error", "code": "invalid_api_key"}}).encode()
    return json.dumps({"type": "error", "error": {"type": "authentication_error",
                                                  "message": "invalid x-api-key"}}).encode()


FAULTS = {
    "overflow": (lambda api: Reply(400, (OVERFLOW_OPENAI if api == "openai"
                                         else OVERFLOW_ANTHROPIC).encode()),
                 FailureKind.CONTEXT_OVERFLOW),
    "nginx413": (lambda api: Reply(413, NGINX_413, "text/html"), FailureKind.PAYLOAD_TOO_LARGE),
    "html403": (lambda api: Reply(403, BARE_403, "text/html"), FailureKind.WAF_REJECTION),
    "auth401": (lambda api: Reply(401, _auth_body(api)), FailureKind.AUTH),
    "dropped": (lambda api: Reply(drop=True), FailureKind.TRANSIENT),
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "nostream"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_failures_become_chat_errors(server: Recorder, api: str, fault: str, stream: bool) -> None:
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    reply, kind = FAULTS[fault]
    server.script.append(reply(api))
    request = Request(HISTORY_WITH_TOOLS, tools=(WEATHER,), stream=stream)
    with pytest.raises(ChatError) as info:
        provider.send(request, on_text=lambda _t: None)
    failure = info.value.failure
    assert failure.request_bytes == len(server.requests[-1].body) == len(provider.encode(request))
    assert failure.kind is kind, failure
    assert isinstance(info.value.__cause__, openai.OpenAIError | anthropic.AnthropicError)
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, "SECRETSECRET"):
        assert secret not in str(info.value)
        assert secret not in repr(failure)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_dropped_connection_on_a_large_request_is_likely_payload(server: Recorder,
                                                                 api: str) -> None:
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    server.script.append(Reply(drop=True))
    request = Request((Message.user("ü" * 300_000),))           # 600 KB of UTF-8
    with pytest.raises(ChatError) as info:
        provider.send(request)
    assert info.value.failure.request_bytes == len(server.requests[-1].body) > 600_000
    assert info.value.failure.kind is FailureKind.LIKELY_PAYLOAD


@pytest.mark.parametrize("wire", ["emulator", "emulator:anthropic"])
def test_large_body_drop_is_not_resent_by_the_sdk_but_small_drops_are(wire: str,
                                                                      emulator: Any) -> None:
    emu = emulator(drop_over="600KB", context_window=1_000_000)
    provider = make_provider(wire, emulator=emu, max_retries=2)  # the SDK's own retries on
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("x" * 700_000),), max_tokens=64))
    assert info.value.failure.kind is FailureKind.LIKELY_PAYLOAD
    assert [r.fault for r in emu.requests] == ["drop"]           # one rejection, not three
    emu.reset()
    emu.script("drop")                                            # a one-off drop, small body
    reply = provider.send(Request((Message.user("hello"),), max_tokens=64))
    assert reply.message.text
    assert [r.fault for r in emu.requests] == ["drop", None]     # the SDK retried it


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_truncated_json_reply_is_one_sentence(server: Recorder, api: str) -> None:
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    good = (oa_completion() if api == "openai" else an_message()).body
    server.script.append(Reply(body=good[: len(good) // 2]))
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("x"),), stream=False))
    message = str(info.value)
    assert "cut off or is not valid JSON" in message and "\n" not in message
    assert info.value.failure.request_bytes == len(server.requests[-1].body)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_stream_that_ends_early(server: Recorder, api: str) -> None:
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    server.script.append(
        oa_stream([{"content": "partial"}], finish=None, usage=None, done=False) if api == "openai"
        else an_stream([text_block("partial")], stop=None, end=False))
    seen: list[str] = []
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("x"),)), on_text=seen.append)
    assert seen == ["partial"]
    assert "stream ended early" in str(info.value)
    assert info.value.failure.kind is FailureKind.TRANSIENT
    assert not info.value.failure.empty_stream          # an answer had begun
    assert info.value.failure.request_bytes == len(server.requests[-1].body)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("frames", ["none", "preamble"])
def test_a_stream_that_ends_before_any_answer_is_an_empty_stream(server: Recorder, api: str,
                                                                 frames: str) -> None:
    # A 200 event stream with nothing of an answer: no event at all (llama-cpp-python), or
    # only what precedes one (OpenAI's role-only chunk, Anthropic's ping).
    preamble = ([oa_chunk({"role": "assistant"})] if api == "openai"
                else [sse({"type": "ping"}, "ping")])
    server.script.append(Reply(events=preamble if frames == "preamble" else []))
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("x"),)))
    failure = info.value.failure
    assert failure.empty_stream and failure.kind is FailureKind.TRANSIENT
    assert failure.request_bytes == len(server.requests[-1].body)
    assert "before any answer or usage arrived" in str(info.value)


def test_a_stream_cut_before_any_answer_is_an_empty_stream_and_after_one_is_not() -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = oa_chunk({"content": "Hel"})
    with serving() as start:
        for reply, empty in ((head, True),
                             (head + b"%x\r\n%s\r\n" % (len(chunk), chunk), False)):
            raw = start(reply, stall=0)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{raw.port}/v1", api_key="k",
                                   max_retries=0, timeout=10)
            with pytest.raises(ChatError) as info:
                OpenAIProvider("gpt-4o", client=client).send(Request((Message.user("x"),)))
            failure = info.value.failure
            assert failure.empty_stream is empty, reply
            assert failure.kind is FailureKind.TRANSIENT and failure.request_bytes


def test_llama_cpp_pythons_streamed_overflow_is_an_empty_stream_then_its_400(emulator: Any) -> None:
    # The emulator as llama-cpp-python's server: the streamed request over the window gets
    # an empty 200 stream, the same history unstreamed its 400 with the numbers.
    emu = emulator(context_window=2048, empty_stream_on_error=True, stream_usage=False)
    provider = make_provider("emulator", emulator=emu, max_retries=0)
    history = (Message.system("Be terse."), Message.user("word " * 2000))
    with pytest.raises(ChatError) as info:
        provider.send(Request(history, stream=True))
    streamed = info.value.failure
    assert streamed.empty_stream and streamed.kind is FailureKind.TRANSIENT
    assert streamed.request_bytes == emu.requests[-1].body_bytes
    assert (emu.requests[-1].status, emu.requests[-1].fault) == (200, "context")
    with pytest.raises(ChatError) as info:
        provider.send(Request(history, stream=False))
    whole = info.value.failure
    assert whole.kind is FailureKind.CONTEXT_OVERFLOW and not whole.empty_stream
    assert whole.limit_tokens == 2048 and whole.prompt_tokens and whole.prompt_tokens >= 2048
    assert whole.request_bytes == emu.requests[-1].body_bytes
    # The same empty stream again on the same body is the same failure, told as such.
    with pytest.raises(ChatError) as info:
        provider.send(Request(history, stream=True))
    assert info.value.failure.repeats(streamed) and not whole.repeats(streamed)
    provider.close()


def test_a_server_that_leaves_usage_out_of_streams_says_so_in_the_response(emulator: Any) -> None:
    emu = emulator(stream_usage=False)
    provider = make_provider("emulator", emulator=emu, max_retries=0)
    streamed = provider.send(Request((Message.user("hi"),), stream=True))
    assert streamed.streamed and not streamed.usage.reported
    whole = provider.send(Request((Message.user("hi"),), stream=False))
    assert not whole.streamed and whole.usage.reported and whole.usage.prompt_tokens
    provider.close()
    usual = make_provider("emulator", emulator=emulator(), max_retries=0)
    assert usual.send(Request((Message.user("hi"),), stream=True)).usage.reported
    usual.close()


def test_a_compacted_history_reaches_a_string_content_server(emulator: Any) -> None:
    emu = emulator(string_content_only=True)
    provider = make_provider("emulator", emulator=emu, max_retries=0)
    history = (Message.system("Be terse."),
               Message.user("[STRUCTURED SUMMARY — covering 4 earlier messages]\n- a"),
               Message.user("[[words 3]] please"))
    for stream in (True, False):
        assert provider.send(Request(history, stream=stream)).message.text == "w1 w2 w3"
    assert [r.status for r in emu.requests] == [200, 200]
    provider.close()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_5xx_that_repeats_on_the_same_body_is_told_apart(server: Recorder, api: str) -> None:
    # The same server error twice — only its request id differs — on the same body repeats;
    # another error, or the same one on another body, does not.
    def error(text: str) -> Reply:
        rid = f"req_{abs(hash((text, len(server.requests)))):016x}"
        if api == "openai":
            body = {"error": {"message": f"{text} (Please include the request ID {rid} in "
                                         "your email.)", "type": "server_error"}}
        else:
            body = {"type": "error", "error": {"type": "api_error", "message": text},
                    "request_id": rid}
        return Reply(status=500, body=json.dumps(body).encode())

    provider = oa_provider(server) if api == "openai" else an_provider(server)
    failures = []
    for text, message in (("The server had an error.", "x"), ("The server had an error.", "x"),
                          ("Something else broke.", "x"), ("The server had an error.", "xy")):
        server.script.append(error(text))
        with pytest.raises(ChatError) as info:
            provider.send(Request((Message.user(message),), stream=False))
        failures.append(info.value.failure)
    first, again, other, bigger = failures
    assert first.status == 500 and first.fingerprint and len(first.fingerprint) == 16
    assert again.repeats(first) and first.repeats(again)
    assert not other.repeats(first) and other.fingerprint != first.fingerprint
    assert bigger.fingerprint == first.fingerprint and not bigger.repeats(first)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_garbled_stream_event(server: Recorder, api: str) -> None:
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    frames = [b"data: {\"id\": \"c1\", \"choices\": [{\"ind\n\n"] if api == "openai" else \
        [b"event: message_start\ndata: {\"type\": \"message_st\n\n"]
    server.script.append(Reply(events=frames))
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("x"),)))
    assert "not valid JSON" in str(info.value)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_body_shorter_than_its_content_length(server: Recorder, api: str) -> None:
    provider = oa_provider(server) if api == "openai" else an_provider(server)
    good = (oa_completion() if api == "openai" else an_message()).body
    server.script.append(Reply(body=good[:20], declare=len(good)))
    with pytest.raises(ChatError) as info:
        provider.send(Request((Message.user("x"),), stream=False))
    assert info.value.failure.request_bytes == len(server.requests[-1].body)
    assert info.value.failure.kind is FailureKind.TRANSIENT


def test_error_events_inside_a_stream(server: Recorder) -> None:
    oa = oa_provider(server)
    server.script.append(Reply(events=[
        oa_chunk({"content": "par"}),
        sse({"error": {"message": "The server had an error while processing your request.",
                       "type": "server_error"}})]))
    with pytest.raises(ChatError) as info:
        oa.send(Request((Message.user("x"),)))
    assert isinstance(info.value.__cause__, openai.APIError)
    an = an_provider(server)
    server.script.append(Reply(events=(an_stream([text_block("par")], stop=None,
                                                 end=False).events or [])
                               + [sse({"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "Overloaded"}},
                                      "error")]))
    with pytest.raises(ChatError) as info:
        an.send(Request((Message.user("x"),)))
    assert isinstance(info.value.__cause__, anthropic.APIStatusError)
    assert info.value.failure.kind is FailureKind.TRANSIENT
    assert info.value.failure.request_bytes == len(server.requests[-1].body)


@pytest.mark.parametrize("make", [oa_provider, an_provider], ids=["openai", "anthropic"])
def test_callback_errors_are_not_swallowed(server: Recorder, make: Any) -> None:
    def broken(_text: str) -> None:
        raise ValueError("display failed")

    with pytest.raises(ValueError, match="display failed"):
        make(server).send(Request((Message.user("x"),)), on_text=broken)


def test_every_sdk_exception_type_is_mapped() -> None:
    from ipy_ctxrecovery.providers import anthropic as an_mod
    from ipy_ctxrecovery.providers import openai as oa_mod

    for module, caught in ((openai, oa_mod._SDK_ERRORS), (anthropic, an_mod._SDK_ERRORS)):
        types = [v for v in list(vars(module).values())
                 if isinstance(v, type) and issubclass(v, Exception)
                 and v.__module__.startswith(module.__name__)]
        assert len(types) > 10
        # Webhook signature checks are not part of a chat call.
        unmapped = [t.__name__ for t in types
                    if not issubclass(t, caught) and "Webhook" not in t.__name__]
        assert unmapped == [], f"{module.__name__}: {unmapped}"


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_emulator_body_cap_reaches_classify(wire: str, emulator: Any) -> None:
    emu = emulator(max_body="2KB")
    provider = make_provider("emulator" if wire == "openai" else "emulator:anthropic",
                             emulator=emu, max_retries=0)
    request = Request((Message.user("x" * 4000),))
    with pytest.raises(ChatError) as info:
        provider.send(request)
    assert info.value.failure.kind is FailureKind.PAYLOAD_TOO_LARGE
    assert info.value.failure.request_bytes == len(provider.encode(request))
    assert emu.requests[-1].status == 413


def test_sdk_retries_stay_on_for_transient_errors(server: Recorder) -> None:
    client = openai.OpenAI(base_url=server.openai_url, api_key=OPENAI_KEY)
    provider = OpenAIProvider("gpt-4o", client=client, max_retries=1)
    server.script.append(Reply(500, b'{"error": {"message": "oops"}}',
                               headers={"retry-after-ms": "1"}))
    response = provider.send(Request((Message.user("x"),), stream=False))
    assert response.stop is StopReason.END
    assert len(server.requests) == 2 and server.requests[0].body == server.requests[1].body


# -- (4) a user-built client is used as is -----------------------------------------------------

def test_user_built_openai_client_untouched(server: Recorder) -> None:
    client = openai.OpenAI(base_url=server.openai_url, api_key=OPENAI_KEY,
                           default_headers={"X-Corp-Gateway": "team-42"})
    provider = make_provider("openai:gpt-4o", client=client)
    assert isinstance(provider, OpenAIProvider) and provider.client is client
    request = Request((Message.user("x"),))
    provider.encode(request)
    provider.send(request)
    assert len(server.requests) == 1                   # encode() sent nothing
    assert server.requests[0].headers["x-corp-gateway"] == "team-42"
    assert server.requests[0].path == "/v1/chat/completions"
    assert str(client.base_url) == server.openai_url + "/"
    assert OPENAI_KEY not in repr(provider)


def test_user_built_anthropic_client_untouched(server: Recorder) -> None:
    client = anthropic.Anthropic(base_url=server.anthropic_url, api_key=ANTHROPIC_KEY,
                                 default_headers={"X-Corp-Gateway": "team-42"})
    # A bare non-claude name still goes to Anthropic when the client speaks Anthropic.
    provider = make_provider("us.anthropic.claude-sonnet-4-5-v1:0", client=client)
    assert isinstance(provider, AnthropicProvider) and provider.client is client
    provider.send(Request((Message.user("x"),), stream=False))
    assert server.requests[0].headers["x-corp-gateway"] == "team-42"
    headers = server.requests[0].headers
    assert ANTHROPIC_KEY in (headers.get("x-api-key"),
                             headers.get("authorization", "").removeprefix("Bearer "))
    assert server.requests[0].path == "/v1/messages"
    assert str(client.base_url).rstrip("/") == server.anthropic_url
    assert ANTHROPIC_KEY not in repr(provider)


def test_user_built_azure_client_untouched(server: Recorder) -> None:
    client = openai.AzureOpenAI(api_key="az-SECRETSECRET-1234", api_version="2024-06-01",
                                azure_endpoint=server.anthropic_url, max_retries=0)
    provider = make_provider("openai:my-gpt4o-deployment", client=client)
    for stream in (True, False):
        request = Request((Message.user("héllo"),), stream=stream, max_tokens=20)
        body = provider.encode(request)
        assert provider.send(request).stop is StopReason.END
        assert server.requests[-1].body == body
    assert server.requests[-1].path.startswith("/openai/deployments/my-gpt4o-deployment/")


def test_user_built_bedrock_client_body_rewrite_is_measured(server: Recorder) -> None:
    pytest.importorskip("botocore")
    client = anthropic.AnthropicBedrock(aws_access_key="AKIAXXXXXXXXXXXXXXXX",
                                        aws_secret_key="not-a-secret", aws_region="us-east-1",
                                        base_url=server.anthropic_url, max_retries=0)
    provider = make_provider("anthropic.claude-3-5-sonnet-20241022-v2:0", client=client)
    assert isinstance(provider, AnthropicProvider)
    request = Request((Message.user("héllo"),), stream=False)
    body = provider.encode(request)
    assert not server.requests                        # encode() sent nothing
    assert provider.send(request).message.text == "Hello ☃"
    assert server.requests[-1].body == body
    sent = server.requests[-1].json()                 # Bedrock moves the model into the URL
    assert "model" not in sent and "anthropic_version" in sent
    assert server.requests[-1].path.endswith("/invoke")
    assert server.requests[-1].headers["authorization"].startswith("AWS4-HMAC-SHA256")
    # Bedrock streams AWS event-stream frames; SSE bytes fail botocore's checksum, and that
    # decoder error is mapped at the boundary like any SDK error.
    streamed = Request((Message.user("héllo"),), stream=True)
    with pytest.raises(ChatError) as info:
        provider.send(streamed)
    assert info.value.failure.request_bytes == len(provider.encode(streamed))
    assert server.requests[-1].path.endswith("/invoke-with-response-stream")


def test_env_vars_configure_the_default_clients(server: Recorder,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_url)
    for spec in ("openai:gpt-4o-mini", "claude-haiku-4-5"):
        provider = make_provider(spec, max_retries=0)
        provider.send(Request((Message.user("x"),)))
        assert OPENAI_KEY not in repr(provider) and ANTHROPIC_KEY not in repr(provider)
    assert [r.path for r in server.requests] == ["/v1/chat/completions", "/v1/messages"]
    assert server.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_missing_keys_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="No OpenAI key found — set OPENAI_API_KEY"):
        make_provider("openai:gpt-4o")
    with pytest.raises(ConfigError, match="No Anthropic key found — set ANTHROPIC_API_KEY"):
        make_provider("anthropic:claude-sonnet-5-5")


# -- (5) make_provider --------------------------------------------------------------------------

def test_make_provider_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    from ipy_ctxrecovery.providers.openai_responses import OpenAIResponsesProvider

    # OpenAI's own service speaks the Responses API (Settings.openai_api "auto"), any
    # other server Chat Completions (test_responses_api.py: test_the_api_is_chosen_per_endpoint).
    cases = {
        "openai:gpt-4o": (OpenAIResponsesProvider, "openai:gpt-4o", "gpt-4o", 128_000),
        "anthropic:claude-opus-4-1": (AnthropicProvider, "anthropic:claude-opus-4-1",
                                      "claude-opus-4-1", 200_000),
        "claude-sonnet-4-5-20250929": (AnthropicProvider, "anthropic:claude-sonnet-4-5-20250929",
                                       "claude-sonnet-4-5-20250929", 200_000),
        "gpt-4.1-mini": (OpenAIResponsesProvider, "openai:gpt-4.1-mini", "gpt-4.1-mini",
                         1_047_576),
        "llama3:8b": (OpenAIResponsesProvider, "openai:llama3:8b", "llama3:8b", 8_192),
    }
    for spec, (cls, full, model_id, window) in cases.items():
        provider = make_provider(spec)
        assert isinstance(provider, cls) and isinstance(provider, Provider)
        assert isinstance(provider, OpenAIProvider | AnthropicProvider | OpenAIResponsesProvider)
        assert (provider.model, provider.model_id, provider.info.context_window) == \
            (full, model_id, window), spec
        provider.close()
    overridden = make_provider("openai:gpt-4o", settings=Settings(context_window=50_000))
    assert overridden.info.context_window == 50_000 and overridden.info.window_overridden
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    local = make_provider("llama3:8b")
    assert isinstance(local, OpenAIProvider)
    local.close()


@pytest.mark.parametrize("spec, words", [
    ("", "empty"), ("   ", "empty"), ("openai:", "no model name"), ("anthropic: ", "no model name"),
    ("gpt 4o", "spaces"), ("emulator:gemini", "emulator speaks"),
    ("azure:gpt-4o", "AzureOpenAI"), ("ollama:llama3", "OPENAI_BASE_URL"),
])
def test_make_provider_bad_specs(spec: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_provider(spec)
    message = str(info.value)
    assert words in message and "openai:MODEL, anthropic:MODEL, emulator" in message


def test_make_provider_rejects_mismatched_arguments(server: Recorder) -> None:
    oa = openai.OpenAI(base_url=server.openai_url, api_key=OPENAI_KEY)
    an = anthropic.Anthropic(base_url=server.anthropic_url, api_key=ANTHROPIC_KEY)
    with pytest.raises(ConfigError, match="not a synchronous Anthropic client"):
        make_provider("anthropic:claude-x", client=oa)
    with pytest.raises(ConfigError, match="not a synchronous OpenAI client"):
        make_provider("openai:gpt-4o", client=an)
    with pytest.raises(ConfigError, match="not a synchronous OpenAI client"):
        make_provider("openai:gpt-4o", client=openai.AsyncOpenAI(api_key=OPENAI_KEY))
    with pytest.raises(ConfigError, match="client= cannot be combined"):
        make_provider("emulator", client=oa)
    # An emulator handed along for another model is ignored (a session keeps one around).
    assert make_provider("openai:gpt-4o", client=oa, emulator=_FixedLimits()).info.name == "gpt-4o"


# -- the emulator through make_provider ----------------------------------------------------------

@pytest.mark.parametrize("spec", ["emulator", "emulator:anthropic"])
def test_emulator_providers_round_trip(spec: str, emulator: Any) -> None:
    emu = emulator(context_window=4096, max_output_tokens=512)
    provider = make_provider(spec, emulator=emu, max_retries=0)
    assert isinstance(provider, OpenAIProvider | AnthropicProvider)
    assert provider.model == spec and provider.info.context_window == 4096
    assert provider.info.max_output_tokens == 512
    seen: list[str] = []
    request = Request((Message.system("be brief"), Message.user("hello there ☃")))
    response = provider.send(request, on_text=seen.append)
    assert response.stop is StopReason.END
    assert "hello there ☃" in response.message.text and "".join(seen) == response.message.text
    assert response.usage.prompt_tokens and response.usage.completion_tokens
    assert emu.requests[-1].body_bytes == len(provider.encode(request)) == response.body_bytes
    cut = provider.send(Request((Message.user("[[words 50]]"),), max_tokens=5, stream=False))
    assert cut.stop is StopReason.LENGTH
    assert provider.emulator is emu
    provider.close()                              # not ours: the emulator keeps running
    assert emu.running


@pytest.mark.parametrize("spec", ["emulator", "emulator:anthropic"])
def test_emulator_tool_call_round_trip(spec: str, emulator: Any) -> None:
    provider = make_provider(spec, emulator=emulator(), max_retries=0)
    history: tuple[Message, ...] = (Message.user('[[tool get_weather {"city": "Zürich"}]]'),)
    first = provider.send(Request(history, tools=(WEATHER,)))
    assert first.stop is StopReason.TOOL_CALLS
    (call,) = first.message.tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Zürich"}
    history += (first.message, Message.tool(call.id, "12 °C", name="get_weather"))
    second = provider.send(Request(history, tools=(WEATHER,), stream=False))
    assert second.stop is StopReason.END and "get_weather" in second.message.text


def test_an_answer_that_was_its_thinking_alone_is_not_sent_back(emulator: Any) -> None:
    # Sent back, an assistant message ending in its thinking block is the API's 400
    # "The final block in an assistant message cannot be `thinking`." on every later turn.
    emu = emulator()
    provider = make_provider("emulator:anthropic", emulator=emu, max_retries=0)
    think = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    history: tuple[Message, ...] = (Message.user("[[words 0]]"),)
    empty = provider.send(Request(history, max_tokens=2048, options=think))
    assert [type(b) for b in empty.message.blocks] == [Reasoning, Text]
    assert empty.message.text == ""
    history += (empty.message, Message.user("and now?"))
    answers = []
    for options in ({}, think):
        again = provider.send(Request(history, max_tokens=2048, options=options))
        assert again.stop is StopReason.END and again.message.text
        answers.append(again.message)
        sent = emu.requests[-1].body["messages"]
        assert [m["role"] for m in sent] == ["user"]          # the two requests, merged
        assert provider.measure(Request(history, max_tokens=2048, options=options)) \
            == emu.requests[-1].body_bytes
    # Thinking before text goes back as it came.
    history += (answers[-1], Message.user("more"))
    provider.send(Request(history, max_tokens=2048, options=think))
    assert [b["type"] for b in emu.requests[-1].body["messages"][1]["content"]] \
        == ["thinking", "text"]
    provider.close()


@pytest.mark.parametrize("spec", ["emulator", "emulator:anthropic"])
def test_owned_emulator_started_and_stopped(spec: str) -> None:
    provider = make_provider(spec, settings=Settings(context_window=3000), max_retries=0)
    assert isinstance(provider, OpenAIProvider | AnthropicProvider)
    assert provider.info.context_window == 3000
    assert provider.send(Request((Message.user("hi"),))).stop is StopReason.END
    emu = provider.emulator
    assert emu.running
    provider.close()
    assert not emu.running
    with pytest.raises(RuntimeError, match="is closed"):
        provider.send(Request((Message.user("hi"),)))


# -- measure(): the fast body size -------------------------------------------------------------

NOWHERE = "http://127.0.0.1:9"  # encode() and measure() never connect


def _offline(kind: str, model: str | None = None) -> Any:
    if kind == "openai":
        return OpenAIProvider(model or "gpt-4o", client=openai.OpenAI(
            base_url=NOWHERE, api_key=OPENAI_KEY, max_retries=0))
    return AnthropicProvider(model or "claude-sonnet-5-5", client=anthropic.Anthropic(
        base_url=NOWHERE, api_key=ANTHROPIC_KEY, max_retries=0))


OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"temperature": 0.25, "top_k": 5},
    {"temperature": None, "extra_body": {"ünï": "cödé ✓", "n": [1, 2.5, None]}},
    {"stop": ["\n\n", "☃"], "metadata": {"user_id": "u-1"}},
]


def _variants(history: Any) -> list[Request]:
    return [Request(history, max_tokens=mt, tools=tools, options=opts, stream=stream)
            for stream in (True, False) for tools in ((), (WEATHER,))
            for mt, opts in ((None, OPTION_SETS[0]), (300, OPTION_SETS[1]),
                             (None, OPTION_SETS[2]), (64, OPTION_SETS[3]))]


@pytest.mark.parametrize("kind, model", [("openai", "gpt-4o"), ("openai", "o3-mini"),
                                         ("anthropic", "claude-sonnet-5-5")])
def test_measure_is_the_encoded_length(kind: str, model: str) -> None:
    provider = _offline(kind, model)
    assert isinstance(_offline(kind, model), Measurable)
    merged = (Message.user("a"), Message.system("mid-way ✓"), Message.user(""),
              Message.user("[STRUCTURED SUMMARY — covering 3 earlier messages]"),
              Message.user("b 日本"), Message(Role.ASSISTANT, (Reasoning("unsigned"),)),
              Message.assistant("c"), Message(Role.ASSISTANT, (Reasoning("r", "sig"),)),
              Message.user("d"))
    requests = requests_to_check() + _variants(HISTORY_WITH_TOOLS) + _variants(merged)
    for request in requests + requests:       # the second pass uses the learnt offsets
        assert provider.measure(request) == len(provider.encode(request))


def test_measure_is_exact_when_same_role_runs_are_merged() -> None:
    # OpenAI: a run of system, user or assistant messages goes out as one message (its texts
    # joined into one string, its tool calls concatenated); Anthropic: a run's blocks join one
    # message. measure() follows both, byte for byte, whatever the run holds.
    calls = [ToolCall(f"call_{i}", "weather", f'{{"city": "Zürich {i}"}}') for i in range(3)]
    runs = (Message.system("a"), Message.system(""), Message.system("b ✓"),
            Message.user("[STRUCTURED SUMMARY — covering 3 earlier messages]\n- x ✓"),
            Message.user("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] compacted."),
            Message.user("the request 日本"),
            Message.assistant("thinking aloud"), Message.assistant("", [calls[0]]),
            Message.assistant("and more", [calls[1]]),
            Message.tool("call_0", "sunny"), Message.tool("call_1", "rain ☔"),
            Message.assistant("done"), Message.assistant(""),
            Message(Role.ASSISTANT, (Reasoning("unsigned"),)),
            Message.user(""), Message.user("one text in the run"), Message.user(""),
            Message.assistant("", [calls[2]]), Message.tool("call_2", "{}"),
            Message.assistant(""), Message.assistant(""), Message.user("end"))
    requests = _variants(runs) + [Request(runs[:k]) for k in range(1, len(runs) + 1)] \
        + [Request(runs[k:]) for k in range(len(runs))]
    for kind in ("openai", "anthropic"):
        provider = _offline(kind)
        for request in requests + requests:
            assert provider.measure(request) == len(provider.encode(request)), request.messages
    body = json.loads(_offline("openai").encode(Request(runs)))
    assert [m["role"] for m in body["messages"]] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool",
        "assistant", "user"]
    # A run's texts go out as one string, each whole, a blank line between them.
    assert body["messages"][0]["content"] == "a\n\n— b ✓"
    assert body["messages"][1]["content"] == MERGED_TEXT_JOIN.join(m.text for m in runs[3:6])
    assert [c["id"] for c in body["messages"][2]["tool_calls"]] == ["call_0", "call_1"]
    assert body["messages"][6]["content"] == "one text in the run"
    assert body["messages"][9] == {"role": "assistant", "content": ""}


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.text(max_size=30), min_size=1, max_size=6),
       role=st.sampled_from([Role.SYSTEM, Role.USER, Role.ASSISTANT]))
def test_a_merged_run_reads_as_its_messages_one_paragraph_each(texts: list[str],
                                                              role: Role) -> None:
    # A run of same-role messages goes out as one message whose content is a plain string
    # (what every server's chat template takes): the texts whole, in order, a blank line
    # between them — the compactor's own break between messages — so no word of one runs
    # into the next; an empty text adds nothing; one text is sent as it is.
    run = tuple(Message(role, (Text(t),)) for t in texts)
    kept = [t for t in texts if t]
    wire = to_wire((*run, Message.user("end") if role is not Role.USER else Message.assistant("x")))
    content = wire[0]["content"]
    if not kept:
        assert content in ("", None)
        return
    assert content == MERGED_TEXT_JOIN.join(kept)
    assert isinstance(content, str)
    # Each text is read whole and where it stood: the content starts with the first, ends
    # with the last, and splits back into them wherever no text holds the join itself.
    assert content.startswith(kept[0]) and content.endswith(kept[-1])
    if not any(MERGED_TEXT_JOIN in t or t.endswith("\n") for t in kept):
        assert content.split(MERGED_TEXT_JOIN) == kept
    provider, request = _offline("openai"), Request(run)
    assert provider.measure(request) == len(provider.encode(request))


def test_summary_notice_and_request_go_out_as_one_string() -> None:
    summary = Message.user("[STRUCTURED SUMMARY — covering 6 earlier messages]\n## Key points\n"
                           "- the build uses make ✓", tag="summary")
    notice = Message.user("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] compacted.", tag="payload-notice")
    request = Message.user("and now?")
    body = json.loads(_offline("openai").encode(Request((Message.system("Be terse."), summary,
                                                         notice, request))))
    assert body["messages"][1] == {"role": "user", "content":
                                   f"{summary.text}\n\n— {notice.text}\n\n— {request.text}"}
    # No list content anywhere in the body: llama.cpp-based servers answer 500 to one.
    assert all(isinstance(m["content"], str) for m in body["messages"])


def test_measure_resumes_only_after_a_history_the_request_extends() -> None:
    # measure() resumes its size fold after a history measured before when the request
    # extends it; a history that differs inside (a message replaced, one removed, a run
    # merged across the old end) must be measured afresh, byte for byte.
    a, b, c = Message.user("a ✓"), Message.assistant("b"), Message.user("c")
    steps = [(a, b, c), (a, b, c, Message.user("merged into c's run")),
             (a, Message.assistant("b, longer now"), c), (a, c), (a, b),
             (a, b, c, Message.assistant("d"), Message.user("e 日本")),
             (Message.system("sys"), a, b, c), (a, b, c, Message.system("late sys"))]
    for kind in ("openai", "anthropic"):
        provider = _offline(kind)
        for history in steps + steps[::-1]:
            request = Request(history)
            assert provider.measure(request) == len(provider.encode(request)), (kind, history)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=valid_histories(max_turns=4, max_result_chars=4_000), pick=st.integers(0, 15))
def test_measure_is_exact_on_generated_histories(history: Any, pick: int) -> None:
    request = _variants(history)[pick]
    for kind in ("openai", "anthropic"):
        provider = _MEASURED[kind]
        assert provider.measure(request) == len(provider.encode(request))


_MEASURED = {"openai": _offline("openai"), "anthropic": _offline("anthropic")}


_RUN_MESSAGES = (Message.system("s ✓"), Message.system(""), Message.user("u"), Message.user(""),
                 Message.assistant("a 日本"), Message.assistant(""),
                 Message.assistant("", [ToolCall("c1", "weather", '{"city": "Zürich"}')]),
                 Message.assistant("and", [ToolCall("c2", "weather", "{}")]),
                 Message.tool("c1", "sunny"), Message.tool("c2", ""),
                 Message(Role.ASSISTANT, (Reasoning("r", "sig"),)))


@settings(max_examples=200, deadline=None)
@given(picks=st.lists(st.integers(0, len(_RUN_MESSAGES) - 1), max_size=40),
       split=st.integers(0, 40))
def test_the_bulk_size_fold_is_the_fold_one_message_at_a_time(picks: list[int],
                                                             split: int) -> None:
    # _fold_many sums the sizes of messages that merge with nothing in C; whatever the
    # runs (merged system/user/assistant runs, tool results side by side, where the open
    # run was left), it must end in the very state of _fold applied one by one.
    from functools import reduce

    from ipy_ctxrecovery.providers._common import SizeMemo
    from ipy_ctxrecovery.providers.openai import _START, _fold, _fold_many, _message_size

    messages = [_RUN_MESSAGES[i] for i in picks]
    memo = SizeMemo()
    items = memo.get_many(messages[:split], _message_size)
    assert items == [_message_size(m) for m in messages[:split]]
    start = reduce(_fold, items, _START)
    rest = memo.get_many(messages[split:], _message_size)
    assert rest == [memo.get(m, _message_size) for m in messages[split:]]
    assert _fold_many(start, rest) == reduce(_fold, rest, start)
    assert _fold_many(_START, items + rest) == reduce(_fold, items + rest, _START)


def test_measure_falls_back_to_the_sdk_for_values_json_cannot_take() -> None:
    when = datetime(2026, 11, 30, 2, 0, 0)
    for kind in ("openai", "anthropic"):
        provider = _offline(kind)
        request = Request((Message.user("hi"),), options={"extra_body": {"when": when}})
        assert provider.measure(request) == len(provider.encode(request))
        assert when.isoformat().encode() in provider.encode(request)


def test_measure_through_azure_and_bedrock_rewrites() -> None:
    azure = make_provider("openai:my-deployment", client=openai.AzureOpenAI(
        api_key="az-SECRET", api_version="2024-06-01", azure_endpoint=NOWHERE, max_retries=0))
    providers: list[Any] = [azure]
    try:
        import botocore  # noqa: F401
    except ImportError:
        pass
    else:
        providers.append(make_provider("anthropic.claude-3-5-sonnet-20241022-v2:0",
                                       client=anthropic.AnthropicBedrock(
                                           aws_access_key="AKIAXXXXXXXXXXXXXXXX",
                                           aws_secret_key="not-a-secret",
                                           aws_region="us-east-1", base_url=NOWHERE,
                                           max_retries=0)))
    for provider in providers:
        for request in _variants(HISTORY_WITH_TOOLS):
            assert provider.measure(request) == len(provider.encode(request))


def test_measure_is_optional_for_providers() -> None:
    class Bare:
        model = "x"
        info = ModelInfo("x", 1000, 100)

        def encode(self, request: Request) -> bytes:
            return b"{}"

        def send(self, request: Request, on_text: Any = None) -> Any:
            raise NotImplementedError

    assert isinstance(Bare(), Provider) and not isinstance(Bare(), Measurable)


# -- the fast path: the encoded body posted through the SDK's own client -----------------------

FAST_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "openai": [
        {},
        {"temperature": 0.25, "top_k": 5},
        {"temperature": None, "extra_body": {"ünï": "cödé ✓", "n": [1, 2.5, None]}},
        {"stop": ["\n\n", "☃"], "metadata": {"user_id": "u-1"}, "seed": 7},
        {"max_tokens": 33, "extra_headers": {"X-Team": "team-42"}, "timeout": 12.5},
        {"reasoning_effort": "low", "user": "u-2", "parallel_tool_calls": False},
    ],
    "anthropic": [
        {},
        {"temperature": 0.25, "top_k": 5},
        {"temperature": None, "extra_body": {"ünï": "cödé ✓", "n": [1, 2.5, None]}},
        {"stop_sequences": ["\n\n", "☃"], "metadata": {"user_id": "u-1"}},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}, "workspace_id": "ws-1"},
        {"extra_headers": {"X-Team": "team-42"}, "timeout": 12.5, "service_tier": "auto"},
    ],
}
FAST_MODELS = [("openai", "gpt-4o"), ("openai", "o3-mini"), ("anthropic", "claude-sonnet-5-5")]


def _fast_variants(wire: str, history: Any) -> list[Request]:
    return [Request(history, max_tokens=mt, tools=tools, options=opts, stream=stream)
            for stream in (True, False) for tools in ((), (WEATHER,))
            for mt in (None, 64) for opts in FAST_OPTIONS[wire]]


def _sdk_and_fast_requests(provider: Any, request: Request) -> tuple[Any, Any]:
    """The request the SDK method builds, and the one the fast path posts (both captured
    by the provider's in-memory transport: nothing leaves the process)."""
    kwargs = provider._kwargs(request)
    sdk = provider._capture.request(lambda c: provider._create(c, kwargs))
    template = provider._template(kwargs)
    assert template is not None and template.call is not None, "the fast path is off"
    body = provider.encode(request)
    fast = provider._capture.request(lambda c: template.call.send(c, body))
    return sdk, fast


def _assert_same_request(sdk: Any, fast: Any) -> None:
    assert fast.content == sdk.content                   # byte for byte
    assert (fast.method, fast.url) == (sdk.method, sdk.url)
    assert list(fast.headers.multi_items()) == list(sdk.headers.multi_items())


_FAST = {f"{wire}:{model}": _offline(wire, model) for wire, model in FAST_MODELS}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=valid_histories(max_turns=4, max_result_chars=4_000), pick=st.integers(0, 47))
def test_fast_path_sends_the_sdks_own_bytes_on_generated_histories(history: Any,
                                                                    pick: int) -> None:
    for key, provider in _FAST.items():
        request = _fast_variants(provider.wire, history)[pick]
        sdk, fast = _sdk_and_fast_requests(provider, request)
        _assert_same_request(sdk, fast)
        assert provider.measure(request) == len(sdk.content), key
        prepared = prepare(provider, request)
        body = json.loads(sdk.content)
        assert prepared.size == len(sdk.content)
        assert prepared.max_tokens == body.get("max_tokens", body.get("max_completion_tokens"))


@pytest.mark.parametrize("wire, model", FAST_MODELS)
def test_fast_path_covers_every_option_set_and_the_hand_made_histories(wire: str,
                                                                       model: str) -> None:
    provider = _offline(wire, model)
    merged = (Message.user("a"), Message.system("mid-way ✓"), Message.user(""),
              Message.user("b 日本 \u2028 \"q\" \\"), Message(Role.ASSISTANT, (Reasoning("r", "sig"),)),
              Message.assistant("c"), Message.user("d"))
    for history in (HISTORY_WITH_TOOLS, merged, (Message.user("x"),)):
        for request in _fast_variants(wire, history):
            _assert_same_request(*_sdk_and_fast_requests(provider, request))


@pytest.mark.parametrize("make", [oa_provider, an_provider], ids=["openai", "anthropic"])
def test_fast_send_reaches_the_server_as_the_sdk_call_does(server: Recorder, make: Any) -> None:
    provider = make(server)
    for request in _fast_variants(provider.wire, HISTORY_WITH_TOOLS)[::5]:
        response = provider.send(request)
        ours = server.requests[-1]
        result = provider._create(provider.client, provider._kwargs(request))
        if request.stream:
            with result as stream:
                for _ in stream:
                    pass
        theirs = server.requests[-1]
        assert ours.body == theirs.body and ours.path == theirs.path
        assert ours.headers == theirs.headers
        assert response.body_bytes == len(ours.body)


@pytest.mark.parametrize("make", [oa_provider, an_provider], ids=["openai", "anthropic"])
def test_fast_send_runs_the_sdk_method_once_per_shape(server: Recorder, make: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    provider = make(server)
    resource_type = type(provider._resource(provider.client))
    calls: list[int] = []
    original = resource_type.create

    def counted(self: Any, **kwargs: Any) -> Any:
        calls.append(len(kwargs["messages"]))
        return original(self, **kwargs)

    monkeypatch.setattr(resource_type, "create", counted)
    history: tuple[Message, ...] = ()
    for turn in range(4):
        history = (*history, Message.user(f"turn {turn} ✓"))
        response = provider.send(Request(history, tools=(WEATHER,)))
        history = (*history, response.message)
    # The shape's probe (a one-message sentinel history) on the capture client and once
    # recorded; then never again: the SDK's transform of the history ran zero times.
    assert calls == [1, 1]
    assert [len(json.loads(r.body)["messages"]) for r in server.requests] == [1, 3, 5, 7]
    # Nothing keeps the body after the send.
    assert not [v for v in vars(provider).values() if isinstance(v, bytes | bytearray)]


def test_fast_path_falls_back_and_says_so(server: Recorder,
                                          caplog: pytest.LogCaptureFixture) -> None:
    class Mine(openai.OpenAI):
        pass

    caplog.set_level(logging.DEBUG, logger="ipy_ctxrecovery.providers")
    azure = openai.AzureOpenAI(api_key="az-SECRETSECRET-1234", api_version="2024-06-01",
                               azure_endpoint=server.anthropic_url, max_retries=0)
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (azure, {}, "is not OpenAI"),
        (Mine(base_url=server.openai_url, api_key=OPENAI_KEY, max_retries=0), {},
         "is not OpenAI"),
        (openai.OpenAI(base_url=server.openai_url, api_key=OPENAI_KEY, max_retries=0),
         {"extra_body": {"messages": [{"role": "user", "content": "override"}]}},
         "no body template"),
        (openai.OpenAI(base_url=server.openai_url, api_key=OPENAI_KEY, max_retries=0),
         {"extra_body": {"when": datetime(2026, 11, 30, 2, 0, 0)}}, "no body template"),
    ]
    for client, options, words in cases:
        caplog.clear()
        provider = OpenAIProvider("gpt-4o", client=client)
        request = Request(HISTORY_WITH_TOOLS, options=options, stream=False)
        body = provider.encode(request)
        provider.send(request)
        assert server.requests[-1].body == body
        assert provider.measure(request) == len(body)
        assert words in caplog.text, (words, caplog.text)
        assert "sending through the SDK method" in caplog.text


def test_prepare_tells_the_max_tokens_the_body_carries_as_data() -> None:
    small = ModelInfo("claude-x", 3000, 8000)
    anth = _offline("anthropic")
    assert anth.default_max_tokens == 4096
    assert prepare(anth, Request((Message.user("x"),))).max_tokens == 4096
    assert prepare(anth, Request((Message.user("x"),), max_tokens=7)).max_tokens == 7
    tiny = AnthropicProvider("claude-x", info=small, client=anthropic.Anthropic(
        base_url=NOWHERE, api_key=ANTHROPIC_KEY))
    assert prepare(tiny, Request((Message.user("x"),))).max_tokens == 1500
    oai = _offline("openai")
    assert oai.default_max_tokens is None
    assert prepare(oai, Request((Message.user("x"),))).max_tokens is None
    assert prepare(oai, Request((Message.user("x"),), options={"max_tokens": 9})).max_tokens == 9

    class Bare:
        model = "x"
        info = ModelInfo("x", 1000, 100)
        default_max_tokens = 55

        def encode(self, request: Request) -> bytes:
            return b'{"a": 1}'

        def send(self, request: Request, on_text: Any = None) -> Any:
            raise NotImplementedError

    bare = prepare(Bare(), Request((Message.user("x"),)))
    assert (bare.size, bare.max_tokens) == (8, 55)


# -- the fast path's encoder and reply reader ---------------------------------------------------

_JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.text(),
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-07, 1e16, -0.0, 5e-324, 1e22, 0.1, 2 ** 64, -(2 ** 63) - 1]),
)
_JSON = st.recursive(_JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=8), _JSON, max_size=4), text=st.text())
def test_fast_encoder_gives_jsons_bytes_for_tool_arguments_with_any_numbers(
        arguments: dict[str, Any], text: str) -> None:
    # Floats (orjson writes 1e-7 where json writes 1e-07) and ints past 64 bits are where
    # orjson and json differ: the converters' values must still encode as json does.
    history = (Message.user(text or "q"),
               Message(Role.ASSISTANT, (ToolCall("toolu_1", "calc", json.dumps(arguments)),)),
               Message.tool("toolu_1", text))
    for messages in (to_anthropic(history)[1], to_wire(history)):
        assert encode_converted(messages) == encode_value(messages)
    provider = _FAST["anthropic:claude-sonnet-5-5"]
    request = Request(history, stream=False)
    sdk, fast = _sdk_and_fast_requests(provider, request)
    _assert_same_request(sdk, fast)
    assert provider.measure(request) == len(sdk.content)


def test_fast_encoder_leaves_to_json_what_orjson_would_encode_otherwise() -> None:
    class Name(str):
        pass

    deep: Any = "leaf"
    for _ in range(300):                     # past orjson's nesting limit
        deep = [deep]
    for value in ([JsonFloat(1e-07), "x"], [2 ** 64, 1], [{1: "int key"}], [Name("n")],
                  deep, {"a": JsonFloat(0.5)}, "plain ✓ \u2028 \x00 \"q\""):
        assert encode_converted(value) == encode_value(value), value
    with pytest.raises(ValueError):          # NaN: refused by both, as the SDK refuses it
        encode_converted([{"input": JsonFloat("nan")}])


_ANTHROPIC_REPLIES = [
    {"content": [{"type": "text", "text": "Hi ☃"}], "stop_reason": "end_turn",
     "usage": {"input_tokens": 10, "output_tokens": 2}},
    {"content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                 {"type": "redacted_thinking", "data": "xx"},
                 {"type": "text", "text": "Let me look."},
                 {"type": "tool_use", "id": "toolu_1", "name": "calc",
                  "input": {"x": 1e-07, "n": [1, 2.5, None], "s": "ü"}}],
     "stop_reason": "tool_use",
     "usage": {"input_tokens": 5, "cache_creation_input_tokens": 7,
               "cache_read_input_tokens": 11, "output_tokens": 9}},
    {"content": [{"type": "text", "text": "cut"}], "stop_reason": "max_tokens",
     "usage": {"input_tokens": 3, "output_tokens": 64}},
    {"content": [], "stop_reason": "refusal", "usage": {"input_tokens": 3, "output_tokens": 0}},
]
_OPENAI_REPLIES = [
    {"choices": [{"index": 0, "finish_reason": "stop",
                  "message": {"role": "assistant", "content": "Hi ☃"}}],
     "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}},
    {"choices": [{"index": 0, "finish_reason": "tool_calls",
                  "message": {"role": "assistant", "content": None,
                              "reasoning_content": "think first",
                              "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "calc",
                                                           "arguments": "{\"x\": 1}"}}]}}],
     "usage": None},
    {"choices": [{"index": 0, "finish_reason": "stop",
                  "message": {"role": "assistant", "content": None, "refusal": "No."}}]},
    {"choices": [{"index": 0, "finish_reason": "length",
                  "message": {"role": "assistant", "content": "cut"}}],
     "usage": {"prompt_tokens": 3, "completion_tokens": 64, "total_tokens": 67}},
]


@pytest.mark.parametrize("wire, reply", [("anthropic", r) for r in _ANTHROPIC_REPLIES]
                         + [("openai", r) for r in _OPENAI_REPLIES])
def test_a_reply_read_from_its_json_equals_the_reply_read_from_the_sdks_model(
        wire: str, reply: dict[str, Any]) -> None:
    provider = _FAST["anthropic:claude-sonnet-5-5" if wire == "anthropic" else "openai:gpt-4o"]
    if wire == "anthropic":
        data = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "stop_sequence": None, **reply}
        model: Any = anthropic.types.Message.model_validate(data)
    else:
        data = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m", **reply}
        model = openai.types.chat.ChatCompletion.model_validate(data)
    from_json = provider._read_reply(json.loads(json.dumps(data)), 100)
    from_model = provider._read_reply(model, 100)
    assert from_json == from_model
    assert from_json.message.blocks == from_model.message.blocks


@pytest.mark.parametrize("make", [oa_provider, an_provider], ids=["openai", "anthropic"])
@pytest.mark.parametrize("body", [b"", b"[1, 2]", b"\"text\"", b"{\"choices\": [", b"<html>ok</html>"])
def test_a_whole_reply_that_is_not_the_apis_json_is_one_sentence(server: Recorder, make: Any,
                                                                  body: bytes) -> None:
    provider = make(server)
    server.script.append(Reply(body=body))
    with pytest.raises(ChatError) as caught:
        provider.send(Request((Message.user("hi"),), stream=False))
    sentence = str(caught.value)
    assert sentence.count(". ") <= 1 and "Traceback" not in sentence
    if body.startswith(b"<"):       # not the API answering: retrying does not help
        assert "an HTML page" in sentence and "check the base URL" in sentence
    else:
        assert "retry" in sentence


@pytest.mark.parametrize("make", [oa_provider, an_provider], ids=["openai", "anthropic"])
def test_sending_leaves_the_historys_strings_their_size(server: Recorder, make: Any) -> None:
    # orjson keeps a non-ASCII str's UTF-8 form inside the str: on the history's own text
    # that would be a hidden copy of the body for as long as the session lives.
    import sys

    provider = make(server)
    history = (Message.system("Sé brief ✓"), Message.user("naïve — 日本 " * 500),
               Message(Role.ASSISTANT, (Text("answer ✓ " * 300),
                                        ToolCall("toolu_1", "calc", '{"q": "ü ✓"}'))),
               Message.tool("toolu_1", "résultat ☃ " * 400), Message.user("and é?"))
    strings = [s for m in history for b in m.blocks
               for s in (getattr(b, "text", None), getattr(b, "content", None),
                         getattr(b, "arguments", None)) if isinstance(s, str)]
    before = [sys.getsizeof(s) for s in strings]
    for stream in (False, True):
        request = Request(history, tools=(WEATHER,), stream=stream)
        provider.measure(request)
        provider.encode(request)
        provider.send(request)
    assert [sys.getsizeof(s) for s in strings] == before
