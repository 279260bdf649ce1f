"""The emulator, driven over HTTP by the real openai and anthropic SDKs.

Every fault is checked in both wire formats, streamed and not: the exception type and
status each SDK raises, the exact body, the headers that matter, what ``classify`` reads
from it, and what ``emu.requests`` recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ipy_ctxrecovery.emulator as emulator_pkg
from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT
from ipy_ctxrecovery.core.prompts import summary_header, with_recall_hint
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.api import INTERLEAVED_THINKING_BETA
from ipy_ctxrecovery.emulator.faults import parse_fault
from ipy_ctxrecovery.emulator.replies import Turn, count_tokens, plan, summarize
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.failures import FailureKind

WIRES = ("openai", "anthropic")
STREAMS = (False, True)
TIMEOUT = 20.0

NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    b"<center><h1>413 Request Entity Too Large</h1></center>\r\n"
    b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
CLOUDFLARE_413 = NGINX_413.replace(b"<center>nginx</center>", b"<center>cloudflare</center>")
#: SPEC §1's proxy signals: the bare WAF page must contain none of them.
SIGNALS = ("firewall", "waf", "security policy", "blocked by", "cloudflare", "cf-ray",
           "mod_security", "akamai", "proxy denied", "policy violation")


# --------------------------------------------------------------------------- helpers

def clients(emu: Emulator, **kw: Any) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", TIMEOUT)
    return emu.openai_client(**kw), emu.anthropic_client(**kw)


def ask(emu: Emulator, wire: str, messages: list[dict[str, Any]], *, stream: bool = False,
        max_tokens: int | None = None, system: str | None = None,
        tools: list[dict[str, Any]] | None = None, **client_kw: Any) -> dict[str, Any]:
    """One request through the real SDK; returns text, tool calls, stop reason and usage."""
    oc, ac = clients(emu, **client_kw)
    if wire == "openai":
        msgs = ([{"role": "system", "content": system}] if system else []) + messages
        kw: dict[str, Any] = {"model": "emulator", "messages": msgs}
        if max_tokens is not None:
            kw["max_tokens"] = max_tokens
        if tools:
            kw["tools"] = [{"type": "function", "function": t} for t in tools]
        if not stream:
            r = oc.chat.completions.create(**kw)
            choice = r.choices[0]
            calls = [(c.id, c.function.name, json.loads(c.function.arguments))
                     for c in choice.message.tool_calls or []]
            return {"text": choice.message.content or "", "stop": choice.finish_reason,
                    "calls": calls, "prompt": r.usage.prompt_tokens,
                    "completion": r.usage.completion_tokens}
        text, stop, usage = "", None, None
        calls_acc: dict[int, list[str]] = {}
        for chunk in oc.chat.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **kw):
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    acc = calls_acc.setdefault(tc.index, ["", "", ""])
                    acc[0] += tc.id or ""
                    acc[1] += (tc.function.name or "") if tc.function else ""
                    acc[2] += (tc.function.arguments or "") if tc.function else ""
                stop = choice.finish_reason or stop
        assert usage is not None
        return {"text": text, "stop": stop,
                "calls": [(i, n, json.loads(a)) for i, n, a in calls_acc.values()],
                "prompt": usage.prompt_tokens, "completion": usage.completion_tokens}
    akw: dict[str, Any] = {"model": "claude-emulator", "messages": messages,
                           "max_tokens": max_tokens or 4096}
    if system:
        akw["system"] = system
    if tools:
        akw["tools"] = [{"name": t["name"], "description": t.get("description", ""),
                         "input_schema": t["parameters"]} for t in tools]
    if stream:
        with ac.messages.stream(**akw) as s:
            deltas = "".join(s.text_stream)
            m = s.get_final_message()
        assert deltas == "".join(b.text for b in m.content if b.type == "text")
    else:
        m = ac.messages.create(**akw)
    return {"text": "".join(b.text for b in m.content if b.type == "text"),
            "stop": m.stop_reason,
            "calls": [(b.id, b.name, b.input) for b in m.content if b.type == "tool_use"],
            "prompt": m.usage.input_tokens, "completion": m.usage.output_tokens}


def fail(emu: Emulator, wire: str, content: str, *, stream: bool = False,
         max_tokens: int | None = None, **client_kw: Any) -> Any:
    """The SDK exception the request raised (typed Any: tests read SDK-specific fields)."""
    with pytest.raises((openai.APIError, anthropic.APIError)) as info:
        ask(emu, wire, [{"role": "user", "content": content}], stream=stream,
            max_tokens=max_tokens, **client_kw)
    return info.value


def kind_of(exc: Exception, emu: Emulator) -> FailureKind:
    return classify(exc, request_bytes=emu.requests[-1].body_bytes).kind


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(1, n + 1))


# --------------------------------------------------------------------------- public surface

def test_public_names_are_pinned() -> None:
    assert sorted(emulator_pkg.__all__) == sorted([
        "Emulator", "Fault", "RequestRecord", "body_too_large", "count_tokens", "drop",
        "http_error", "stream_cut", "stream_error", "waf_block"])


def test_urls_and_lifecycle() -> None:
    emu = Emulator()
    assert not emu.running
    with emu:
        assert emu.running and emu.port > 0
        assert emu.openai_base_url == f"http://127.0.0.1:{emu.port}/v1"
        assert emu.anthropic_base_url == f"http://127.0.0.1:{emu.port}"
        models = urllib.request.Request(emu.openai_base_url + "/models",
                                        headers=emu.token_headers)
        with urllib.request.urlopen(models, timeout=TIMEOUT) as r:
            assert json.load(r)["data"][0]["id"] == "emulator"
    assert not emu.running
    emu.close()  # idempotent


def test_settings_accept_sizes_and_reject_bad_values() -> None:
    emu = Emulator(max_body="256KB", waf_over="1MB", drop_over=4096)
    assert (emu.max_body, emu.waf_over, emu.drop_over) == (262144, 1048576, 4096)
    for bad in (dict(max_body="lots"), dict(context_window=0), dict(latency=-1),
                dict(body_limit_style="haproxy"), dict(waf_style="akamai"),
                dict(max_output_tokens=1.5)):
        with pytest.raises(ConfigError) as info:
            Emulator(**bad)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        parse_fault("teapot")


# --------------------------------------------------------------------------- token rule

def test_token_rule() -> None:
    assert [count_tokens(t) for t in ("", "a", "abcd", "abcde", "é" * 2, "日本")] == \
        [0, 1, 1, 2, 1, 2]


@pytest.mark.parametrize("wire", WIRES)
def test_prompt_tokens_follow_the_documented_rule(emulator: Callable[..., Emulator],
                                                  wire: str) -> None:
    emu = emulator()
    tools = [{"name": "get_weather", "description": "Weather.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    got = ask(emu, wire, [{"role": "user", "content": "hello there"}], system="Be brief.",
              tools=tools)
    sent_tools = emu.requests[-1].body["tools"]
    expected = (count_tokens("Be brief.") + 4) + (count_tokens("hello there") + 4) + 3 \
        + count_tokens(json.dumps(sent_tools))
    assert got["prompt"] == expected
    assert got["text"] == (f'Emulator reply: you said "hello there" (2 messages, '
                           f'{expected} prompt tokens).')
    assert got["completion"] == count_tokens(got["text"])


# --------------------------------------------------------------------------- replies

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
def test_default_reply(emulator: Callable[..., Emulator], wire: str, stream: bool) -> None:
    emu = emulator()
    long = "Please explain the difference between a list and a tuple in Python, with examples."
    got = ask(emu, wire, [{"role": "user", "content": long}], stream=stream)
    p = count_tokens(long) + 4 + 3
    assert got["text"] == f'Emulator reply: you said "{long[:60]}" (1 message, {p} prompt tokens).'
    assert got["stop"] == ("stop" if wire == "openai" else "end_turn")
    assert got["prompt"] == p
    rec = emu.requests[-1]
    assert (rec.status, rec.fault, rec.stream) == (200, None, stream)
    assert rec.body_bytes == len(rec.raw or b"") and json.loads(rec.raw or b"") == rec.body


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
def test_max_tokens_cut_and_continuation_resume_exactly(
        emulator: Callable[..., Emulator], wire: str, stream: bool) -> None:
    emu = emulator()
    full = words(60)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "count [[words 60]]"}]
    first = ask(emu, wire, messages, stream=stream, max_tokens=20)
    assert first["stop"] == ("length" if wire == "openai" else "max_tokens")
    assert first["text"] == full.encode()[:80].decode()
    assert first["completion"] == 20
    parts = [first["text"]]
    for _ in range(10):
        messages = [*messages, {"role": "assistant", "content": parts[-1]},
                    {"role": "user", "content": CONTINUATION_PROMPT}]
        got = ask(emu, wire, messages, stream=stream, max_tokens=20)
        parts.append(got["text"])
        if got["stop"] in ("stop", "end_turn"):
            break
    assert "".join(parts) == full
    assert len(parts) == 3  # 60 words ≈ 230 bytes: two cuts at 80 bytes, then the rest


def test_continuation_survives_stitched_and_stripped_partials(
        emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    full = words(40)
    first = ask(emu, "openai", [{"role": "user", "content": "[[words 40]]"}], max_tokens=10)
    stripped = first["text"].rstrip()
    rest = ask(emu, "openai", [{"role": "user", "content": "[[words 40]]"},
                               {"role": "assistant", "content": stripped},
                               {"role": "user", "content": CONTINUATION_PROMPT}])
    assert stripped + rest["text"] == full


def test_output_budget_is_the_room_left_in_the_window(emulator: Callable[..., Emulator]) -> None:
    emu = emulator(context_window=100)
    got = ask(emu, "openai", [{"role": "user", "content": "[[words 500]]"}])
    assert got["stop"] == "length"
    assert got["completion"] == 100 - got["prompt"]


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
def test_tool_call_then_result(emulator: Callable[..., Emulator], wire: str,
                               stream: bool) -> None:
    emu = emulator()
    tools = [{"name": "read_file", "description": "Read a file.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    ask_text = 'look [[tool read_file {"path": "data/notes.txt", "lines": [1, 20]}]]'
    user = {"role": "user", "content": ask_text}
    got = ask(emu, wire, [user], stream=stream, tools=tools)
    prefix = "call_emu" if wire == "openai" else "toolu_emu"
    [(ident, name, arguments)] = got["calls"]
    assert ident.startswith(prefix) and ident[len(prefix):].isdigit()
    assert (name, arguments) == ("read_file", {"path": "data/notes.txt", "lines": [1, 20]})
    # Asked the same again, a new id: the real APIs' ids are random, never repeated.
    again = ask(emu, wire, [user], stream=stream, tools=tools)
    assert again["calls"][0][0] != ident
    assert got["stop"] == ("tool_calls" if wire == "openai" else "tool_use")
    assert got["text"] == ""
    result = "x" * 1234
    args = json.dumps({"path": "data/notes.txt", "lines": [1, 20]})
    follow: list[dict[str, Any]]
    if wire == "openai":
        follow = [user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": ident, "type": "function",
             "function": {"name": "read_file", "arguments": args}}]},
            {"role": "tool", "tool_call_id": ident, "content": result}]
    else:
        follow = [user, {"role": "assistant", "content": [
            {"type": "tool_use", "id": ident, "name": "read_file",
             "input": json.loads(args)}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": ident, "content": result}]}]
    done = ask(emu, wire, follow, stream=stream, tools=tools)
    assert done["calls"] == []
    assert done["stop"] == ("stop" if wire == "openai" else "end_turn")
    assert done["text"].startswith("Tool read_file returned 1234 chars. Emulator reply: you said")
    # The tool result and the call's name + arguments are counted by the token rule.
    sent_tools = emu.requests[-1].body["tools"]
    assert done["prompt"] == (count_tokens(ask_text) + 4) \
        + (count_tokens("read_file" + args) + 4) + (count_tokens(result) + 4) + 3 \
        + count_tokens(json.dumps(sent_tools))


@pytest.mark.parametrize("wire", WIRES)
def test_summarization_request_gets_an_extractive_summary(
        emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator(context_window=100_000)
    lines = []
    for i in range(40):
        lines += [f"user: please read src/module_{i}.py and fix the failing test {i}",
                  f"assistant: ran `pytest tests/test_{i}.py`; AssertionError in case {i}",
                  f"assistant: we decided to keep the cache for step {i}"]
    text = "\n".join(lines)
    got = ask(emu, wire, [{"role": "user", "content": text}],
              system="Write a STRUCTURED SUMMARY of the conversation below.")
    summary = got["text"]
    assert summary.startswith("[STRUCTURED SUMMARY — covering 120 earlier messages]\n")
    assert len(summary) <= min(len(text) // 4, 2000)
    assert "## Files" in summary and "## Errors and resolutions" in summary
    items = [ln[2:].rstrip("…") for ln in summary.splitlines() if ln.startswith("- ")]
    assert items and all(item in text for item in items)
    assert summary == summarize(text)


SUMMARY_BLOCK = "[STRUCTURED SUMMARY — covering 6 earlier messages]\n## Key points\n- x"
NOTICE_BLOCK = "[SYSTEM NOTICE: 3 older tool results were cleared to save context.]"
COMPACTED_BLOCK = "[Context was automatically compacted: 12 messages summarized.]"


def _blocks(*texts: str) -> list[dict[str, Any]]:
    """One user message made of several text blocks (Anthropic) / parts (OpenAI)."""
    return [{"type": "text", "text": t} for t in texts]


@pytest.mark.parametrize("machine", [SUMMARY_BLOCK, NOTICE_BLOCK, COMPACTED_BLOCK])
@pytest.mark.parametrize("wire", WIRES)
def test_request_after_a_notice_block_in_the_same_message_is_seen(
        emulator: Callable[..., Emulator], wire: str, machine: str) -> None:
    emu = emulator()
    got = ask(emu, wire, [{"role": "user", "content": _blocks(machine, "[[words 5]] please")}])
    assert got["text"] == "w1 w2 w3 w4 w5"
    # An earlier request is not quoted instead of the one after the notice.
    history: list[dict[str, Any]] = [{"role": "user", "content": "first question"},
               {"role": "assistant", "content": "an answer"},
               {"role": "user", "content": _blocks(machine, "second question ✓")}]
    got = ask(emu, wire, history)
    assert got["text"].startswith('Emulator reply: you said "second question ✓" (')
    # A notice block alone is still not a request: the earlier one is answered.
    history[-1] = {"role": "user", "content": _blocks(machine)}
    assert ask(emu, wire, history)["text"].startswith('Emulator reply: you said "first question"')


@pytest.mark.parametrize("machine", [SUMMARY_BLOCK, NOTICE_BLOCK, COMPACTED_BLOCK])
def test_request_after_a_notice_paragraph_in_one_string_is_seen(
        emulator: Callable[..., Emulator], machine: str) -> None:
    # The OpenAI adapter sends a merged run as one string, a blank line between its texts:
    # the request is what follows the package's own paragraphs, blank lines and all.
    emu = emulator()
    content = f"{machine}\n\n[[words 5]] please"
    assert ask(emu, "openai", [{"role": "user", "content": content}])["text"] == "w1 w2 w3 w4 w5"
    history: list[dict[str, Any]] = [{"role": "user", "content": "first question"},
                                     {"role": "assistant", "content": "an answer"},
                                     {"role": "user", "content": f"{machine}\n\nsecond\n\npart ✓"}]
    assert ask(emu, "openai", history)["text"].startswith(
        'Emulator reply: you said "second\n\npart ✓" (')
    history[-1] = {"role": "user", "content": machine}
    assert ask(emu, "openai", history)["text"].startswith('Emulator reply: you said "first question"')


@pytest.mark.parametrize("wire", WIRES)
def test_tool_directive_after_a_summary_block_is_obeyed(
        emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator()
    tools = [{"name": "read_file", "description": "Read a file.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    content = _blocks(SUMMARY_BLOCK, NOTICE_BLOCK, 'now [[tool read_file {"path": "a.py"}]]')
    got = ask(emu, wire, [{"role": "user", "content": content}], tools=tools)
    assert [(name, args) for _, name, args in got["calls"]] == [("read_file", {"path": "a.py"})]


@pytest.mark.parametrize("spec", ["emulator", "emulator:anthropic"])
def test_summary_then_request_through_the_adapters(spec: str,
                                                   emulator: Callable[..., Emulator]) -> None:
    """The compactor's history shape: a summary user message right before the request;
    the Anthropic adapter merges the two into one message of two text blocks."""
    from ipy_ctxrecovery.core.history import Message
    from ipy_ctxrecovery.providers import Request, make_provider

    emu = emulator()
    provider: Any = make_provider(spec, emulator=emu, max_retries=0)
    try:
        history = (Message.system("Be brief."), Message.user(SUMMARY_BLOCK),
                   Message.user("[[words 5]] please"))
        assert provider.send(Request(history, stream=False)).message.text == "w1 w2 w3 w4 w5"
    finally:
        provider.close()
    if spec == "emulator:anthropic":
        assert len(emu.requests[-1].body["messages"]) == 1


def test_continuation_after_a_notice_block_still_resumes() -> None:
    from ipy_ctxrecovery.emulator.replies import anthropic_turns

    request = "[[words 40]] go"
    full = plan([Turn("user", request, request)]).text
    first = plan([Turn("user", request, request)], limit=10).text
    assert first and full.startswith(first) and first != full
    body = {"messages": [
        {"role": "user", "content": request},
        {"role": "assistant", "content": [{"type": "text", "text": first}]},
        {"role": "user", "content": _blocks(NOTICE_BLOCK, CONTINUATION_PROMPT)}]}
    rest = plan(anthropic_turns(body)).text
    assert first + rest == full


def test_summary_of_a_tiny_text_is_only_the_header() -> None:
    assert summarize("hi") == "[STRUCTURED SUMMARY — covering 1 earlier messages]"


def test_openai_stream_wire_format(emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    oc, _ = clients(emu)
    with oc.chat.completions.with_streaming_response.create(
            model="emulator", messages=[{"role": "user", "content": "[[words 5]]"}],
            stream=True, stream_options={"include_usage": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in resp.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(ln.startswith("data: ") for ln in lines)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "",
                                                "refusal": None}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks[:-1]) == words(5)


def test_anthropic_stream_event_sequence(emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    _, ac = clients(emu)
    with ac.messages.with_streaming_response.create(
            model="claude-emulator", max_tokens=50, stream=True,
            messages=[{"role": "user", "content": "[[words 12]]"}]) as resp:
        events = [ln[7:] for ln in resp.iter_lines() if ln.startswith("event: ")]
    deltas = events.count("content_block_delta")
    assert deltas >= 2
    assert events == ["message_start", "content_block_start", "ping",
                      *["content_block_delta"] * deltas, "content_block_stop",
                      "message_delta", "message_stop"]


# --------------------------------------------------------------------------- provider faults

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
def test_context_window_exceeded(emulator: Callable[..., Emulator], wire: str,
                                 stream: bool) -> None:
    emu = emulator(context_window=1000)
    content = "y" * 4400  # 1100 tokens + 4 + 3
    exc = fail(emu, wire, content, stream=stream, max_tokens=100)
    assert isinstance(exc, openai.BadRequestError | anthropic.BadRequestError)
    assert exc.status_code == 400
    if wire == "openai":
        assert exc.body == {
            "message": "This model's maximum context length is 1000 tokens. However, your "
                       "messages resulted in 1107 tokens. Please reduce the length of the "
                       "messages.",
            "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}
    else:
        body: Any = exc.body
        assert body["type"] == "error" and body["request_id"].startswith("req_")
        assert body["error"] == {"type": "invalid_request_error",
                                     "message": "prompt is too long: 1107 tokens > 1000 maximum"}
    failure = classify(exc, request_bytes=emu.requests[-1].body_bytes)
    assert (failure.kind, failure.prompt_tokens, failure.limit_tokens) == \
        (FailureKind.CONTEXT_OVERFLOW, 1107, 1000)
    assert emu.requests[-1].fault == "context"


@pytest.mark.parametrize("wire", WIRES)
def test_prompt_plus_max_tokens_over_the_window(emulator: Callable[..., Emulator],
                                                wire: str) -> None:
    emu = emulator(context_window=1000)
    content = "y" * 3600  # 900 + 7 = 907 prompt tokens
    exc = fail(emu, wire, content, max_tokens=200)
    message = exc.body["message"] if wire == "openai" else exc.body["error"]["message"]
    if wire == "openai":
        assert message == ("This model's maximum context length is 1000 tokens. However, you "
                           "requested 1107 tokens (907 in the messages, 200 in the "
                           "completion). Please reduce the length of the messages or "
                           "completion.")
    else:
        assert message == ("input length and `max_tokens` exceed context limit: 907 + 200 > "
                           "1000, decrease input length or `max_tokens` and try again")
    failure = classify(exc)
    assert (failure.kind, failure.prompt_tokens, failure.output_tokens, failure.limit_tokens) \
        == (FailureKind.CONTEXT_OVERFLOW, 907, 200, 1000)
    # The same prompt with room for the answer passes.
    assert ask(emu, wire, [{"role": "user", "content": content}], max_tokens=90)["stop"] \
        in ("stop", "end_turn", "length", "max_tokens")


@pytest.mark.parametrize("wire", WIRES)
def test_max_tokens_above_the_output_limit(emulator: Callable[..., Emulator],
                                           wire: str) -> None:
    emu = emulator(max_output_tokens=256)
    exc = fail(emu, wire, "hi", max_tokens=1000)
    assert exc.status_code == 400
    if wire == "openai":
        assert exc.body["message"] == ("max_tokens is too large: 1000. This model supports at "
                                       "most 256 completion tokens, whereas you provided 1000.")
        assert exc.body["param"] == "max_tokens"
    else:
        assert exc.body["error"]["message"] == (
            "max_tokens: 1000 > 256, which is the maximum allowed number of output tokens "
            "for claude-emulator")
    assert kind_of(exc, emu) is FailureKind.OUTPUT_LIMIT
    assert emu.requests[-1].fault == "output_limit"
    assert ask(emu, wire, [{"role": "user", "content": "[[words 300]]"}],
               max_tokens=256)["completion"] == 256


@pytest.mark.parametrize("wire", WIRES)
def test_wrong_key_is_a_401_in_each_format(emulator: Callable[..., Emulator],
                                           wire: str) -> None:
    emu = emulator(api_key="sk-right-0123456789abcdef")
    exc = fail(emu, wire, "hi", api_key="sk-wrong-0123456789abcdef")
    assert isinstance(exc, openai.AuthenticationError | anthropic.AuthenticationError)
    body: Any = exc.body
    if wire == "openai":
        assert body["code"] == "invalid_api_key"
        assert "0123456789ab" not in body["message"]  # the key is masked
    else:
        assert body["error"] == {"type": "authentication_error",
                                     "message": "invalid x-api-key"}
    assert kind_of(exc, emu) is FailureKind.AUTH
    assert ask(emu, wire, [{"role": "user", "content": "hi"}])["stop"] in ("stop", "end_turn")


@pytest.mark.parametrize("wire", WIRES)
def test_missing_key_wording(emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator(api_key="sk-right-0123456789abcdef")
    url = emu.openai_base_url + "/chat/completions" if wire == "openai" \
        else emu.anthropic_base_url + "/v1/messages"
    req = urllib.request.Request(url, data=b'{"model":"m","max_tokens":5,"messages":[]}',
                                 headers={"Content-Type": "application/json",
                                          **emu.token_headers})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=TIMEOUT)
    body = json.loads(info.value.read())
    assert info.value.code == 401
    if wire == "openai":
        assert body["error"]["message"].startswith("You didn't provide an API key.")
    else:
        assert body["error"]["message"] == "x-api-key header is required"


@pytest.mark.parametrize("wire", WIRES)
def test_records_keep_headers_with_credentials_masked(emulator: Callable[..., Emulator],
                                                      wire: str) -> None:
    key = "sk-right-0123456789abcdef"
    emu = emulator(api_key=key, max_body="1KB")
    headers = {"X-Team": "analytics", "X-Gateway-Key": "gw-secret-value-42"}
    ask(emu, wire, [{"role": "user", "content": "hi"}], api_key=key, default_headers=headers)
    fail(emu, wire, "x" * 4_000, api_key=key, default_headers=headers)   # a middlebox 413
    emu.openai_client(api_key=key, default_headers=headers).models.list()
    records = emu.requests
    assert [(r.method, r.status) for r in records] == [("POST", 200), ("POST", 413),
                                                       ("GET", 200)]
    for record in records:
        assert record.header("x-team") == "analytics"          # any case
        assert record.header("X-Gateway-Key") == "[REDACTED]"
        assert record.header("X-Emulator-Token") == "[REDACTED]"
        sent_key = record.header("authorization") or record.header("x-api-key")
        assert sent_key == "[REDACTED]"
        assert record.header("Content-Type") in ("application/json", None)
        assert record.header("X-Not-Sent") is None
        shown = repr(record.headers)
        assert key not in shown and "gw-secret" not in shown and emu.token not in shown


@pytest.mark.parametrize("wire", WIRES)
def test_answers_requests_sent_to_it_as_a_forward_proxy(emulator: Callable[..., Emulator],
                                                        wire: str) -> None:
    emu = emulator(max_body="1KB")
    # .example never resolves: the answers can only come through the proxy.
    base = "http://llm.internal.example" + ("/v1" if wire == "openai" else "")
    sdk: Any = openai if wire == "openai" else anthropic
    client = (openai.OpenAI if wire == "openai" else anthropic.Anthropic)(
        base_url=base, api_key="sk-proxy-0123456789abcdef", max_retries=0,
        default_headers=emu.token_headers,
        http_client=sdk.DefaultHttpxClient(proxy=emu.url, timeout=TIMEOUT))
    if wire == "openai":
        reply = client.chat.completions.create(
            model="emulator", messages=[{"role": "user", "content": "via the proxy"}])
        assert reply.choices[0].message.content.startswith('Emulator reply: you said "via')
        assert [m.id for m in client.models.list().data] == ["emulator"]
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(
                model="emulator", messages=[{"role": "user", "content": "x" * 4_000}])
    else:
        reply = client.messages.create(model="emulator", max_tokens=50,
                                       messages=[{"role": "user", "content": "via the proxy"}])
        assert reply.content[0].text.startswith('Emulator reply: you said "via')
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(model="emulator", max_tokens=50,
                                   messages=[{"role": "user", "content": "x" * 4_000}])
    assert info.value.status_code == 413
    paths = ["/v1/chat/completions", "/v1/models", "/v1/chat/completions"] if wire == "openai" \
        else ["/v1/messages", "/v1/messages"]
    assert [r.path for r in emu.requests] == paths
    assert all(r.header("Host") == "llm.internal.example" for r in emu.requests)


@pytest.mark.parametrize("wire", WIRES)
def test_fault_queue(emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator()
    emu.fail_next(429, retry_after=7)
    emu.script(500, "529")
    assert [f.label for f in emu.pending_faults] == ["429", "500", "529"]
    exc = fail(emu, wire, "hi")
    assert isinstance(exc, openai.RateLimitError | anthropic.RateLimitError)
    assert exc.response.headers["retry-after"] == "7"
    failure = classify(exc)
    assert (failure.kind, failure.retry_after) == (FailureKind.TRANSIENT, 7.0)
    exc = fail(emu, wire, "hi")
    assert isinstance(exc, openai.InternalServerError | anthropic.InternalServerError)
    assert exc.status_code == 500
    exc = fail(emu, wire, "hi")
    assert exc.status_code == 529
    if wire == "anthropic":
        assert isinstance(exc, anthropic.OverloadedError)
        body: Any = exc.body
        assert body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert kind_of(exc, emu) is FailureKind.TRANSIENT
    assert ask(emu, wire, [{"role": "user", "content": "hi"}])["stop"] in ("stop", "end_turn")
    assert [(r.status, r.fault) for r in emu.requests] == \
        [(429, "429"), (500, "500"), (529, "529"), (200, None)]


@pytest.mark.parametrize("wire", WIRES)
def test_sdk_retries_a_scripted_transient_error(emulator: Callable[..., Emulator],
                                                wire: str) -> None:
    emu = emulator()
    emu.fail_next(429, retry_after=0.01)
    got = ask(emu, wire, [{"role": "user", "content": "hi"}], max_retries=2)
    assert got["stop"] in ("stop", "end_turn")
    assert [r.status for r in emu.requests] == [429, 200]


def test_scripted_middlebox_faults_and_reset(emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    emu.script("413:envoy", "waf:bare", "drop")
    assert fail(emu, "openai", "hi").status_code == 413
    assert fail(emu, "openai", "hi").status_code == 403
    assert isinstance(fail(emu, "openai", "hi"), openai.APIConnectionError)
    assert [r.fault for r in emu.requests] == ["413:envoy", "waf:bare", "drop"]
    emu.script(500)
    emu.reset()
    assert emu.requests == [] and emu.pending_faults == ()



@pytest.mark.parametrize("wire", WIRES)
def test_stream_error_breaks_off_with_the_providers_error_event(
        emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator()
    oc, ac = clients(emu)
    emu.script("stream-error")
    got = ""
    with pytest.raises((openai.APIError, anthropic.APIError)) as info:
        if wire == "openai":
            for chunk in oc.chat.completions.create(
                    model="emulator", stream=True,
                    messages=[{"role": "user", "content": "[[words 40]]"}]):
                got += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        else:
            with ac.messages.stream(model="claude-emulator", max_tokens=500,
                                    messages=[{"role": "user", "content": "[[words 40]]"}]) as s:
                for text in s.text_stream:
                    got += text
    exc: Any = info.value
    body: Any = exc.body
    assert got and words(40).startswith(got) and got != words(40)
    if wire == "openai":
        # OpenAI: a `data: {"error": …}` line inside the 200 stream -> APIError, no status.
        assert type(exc) is openai.APIError and body["type"] == "server_error"
    else:
        # Anthropic: `event: error` -> APIStatusError carrying the 200 of the stream.
        assert isinstance(exc, anthropic.APIStatusError) and exc.status_code == 200
        assert body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert classify(exc).kind is FailureKind.TRANSIENT
    assert [(r.status, r.fault) for r in emu.requests] == [(200, "stream-error")]
    # Not streamed, the same fault is the provider's error status.
    emu.script("stream-error")
    exc = fail(emu, wire, "hi")
    assert exc.status_code == (500 if wire == "openai" else 529)


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
def test_stream_cut_closes_the_connection_halfway(emulator: Callable[..., Emulator],
                                                  wire: str, stream: bool) -> None:
    emu = emulator()
    emu.script("stream-cut")
    with pytest.raises(Exception) as info:
        ask(emu, wire, [{"role": "user", "content": "[[words 40]]"}], stream=stream)
    exc = info.value
    # anthropic lets the transport error through while a stream is iterated; openai wraps it.
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    assert "RemoteProtocolError" in names
    assert classify(exc).kind is FailureKind.TRANSIENT
    assert [(r.status, r.fault) for r in emu.requests] == [(200, "stream-cut")]


def test_provider_faults_wait_for_a_request_that_reaches_the_provider(
        emulator: Callable[..., Emulator]) -> None:
    emu = emulator(max_body="16KB", context_window=10**6)
    emu.script(429, "drop")
    assert fail(emu, "openai", "b" * 20_000).status_code == 413  # the proxy answered
    assert fail(emu, "openai", "small").status_code == 429
    assert isinstance(fail(emu, "openai", "small"), openai.APIConnectionError)
    assert [(r.status, r.fault) for r in emu.requests] == \
        [(413, "413:nginx"), (429, "429"), (None, "drop")]


# --------------------------------------------------------------------------- middleboxes

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("style", ["nginx", "cloudflare", "aws", "envoy"])
def test_body_over_max_body_is_a_413(emulator: Callable[..., Emulator], style: str, wire: str,
                                     stream: bool) -> None:
    emu = emulator(max_body="16KB", body_limit_style=style, context_window=1_000_000)
    exc = fail(emu, wire, "z" * 20_000, stream=stream)
    assert isinstance(exc, openai.APIStatusError | anthropic.APIStatusError)
    assert exc.status_code == 413
    headers = exc.response.headers
    raw = exc.response.content
    if style == "nginx":
        assert raw == NGINX_413 and headers["server"] == "nginx"
        assert headers["content-type"] == "text/html"
    elif style == "cloudflare":
        assert raw == CLOUDFLARE_413 and headers["server"] == "cloudflare"
        assert re.fullmatch(r"[0-9a-f]{16}-[A-Z]{3}", headers["cf-ray"])
    elif style == "aws":
        assert raw == b'{"message":"Request Too Long"}'
        assert headers["content-type"] == "application/json"
    else:
        assert raw == b"payload too large" and headers["server"] == "envoy"
        assert headers["content-type"] == "text/plain"
    assert kind_of(exc, emu) is FailureKind.PAYLOAD_TOO_LARGE
    rec = emu.requests[-1]
    assert (rec.status, rec.fault, rec.body) == (413, f"413:{style}", None)
    assert rec.body_bytes > 16 * 1024
    # Below the cap the provider answers, on the same client.
    assert ask(emu, wire, [{"role": "user", "content": "small"}])["stop"] in ("stop", "end_turn")


@pytest.mark.parametrize("wire", WIRES)
def test_waf_cloudflare_block_page(emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator(waf_over="16KB", context_window=1_000_000)
    exc = fail(emu, wire, "z" * 20_000)
    assert isinstance(exc, openai.PermissionDeniedError | anthropic.PermissionDeniedError)
    page = exc.response.text
    assert "Sorry, you have been blocked" in page and "Attention Required! | Cloudflare" in page
    ray = exc.response.headers["cf-ray"]
    assert exc.response.headers["server"] == "cloudflare"
    assert f"Cloudflare Ray ID: <strong class=\"font-semibold\">{ray.split('-')[0]}</strong>" \
        in page
    assert kind_of(exc, emu) is FailureKind.WAF_REJECTION
    rec = emu.requests[-1]
    assert (rec.status, rec.fault) == (403, "waf:cloudflare")
    assert rec.raw is not None and len(rec.raw) == rec.body_bytes  # a WAF reads the body


@pytest.mark.parametrize("wire", WIRES)
def test_waf_bare_403_has_no_signal_words(emulator: Callable[..., Emulator], wire: str) -> None:
    emu = emulator(waf_over="16KB", waf_style="bare", context_window=1_000_000)
    exc = fail(emu, wire, "z" * 20_000, stream=True)
    assert exc.status_code == 403
    text = (exc.response.text + " ".join(f"{k}: {v}" for k, v in exc.response.headers.items()))
    assert exc.response.text.lstrip().startswith("<html>")
    assert not [s for s in SIGNALS if s in text.lower()]
    assert kind_of(exc, emu) is FailureKind.WAF_REJECTION


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("wire", WIRES)
def test_drop_over_closes_the_connection_without_a_response(
        emulator: Callable[..., Emulator], wire: str, stream: bool) -> None:
    emu = emulator(drop_over="600KB", context_window=10_000_000)
    exc = fail(emu, wire, "q" * 700_000, stream=stream)
    assert isinstance(exc, openai.APIConnectionError | anthropic.APIConnectionError)
    assert not isinstance(exc, openai.APITimeoutError | anthropic.APITimeoutError)
    rec = emu.requests[-1]
    assert (rec.status, rec.fault, rec.body, rec.raw) == (None, "drop", None, None)
    assert rec.body_bytes > 700_000
    assert kind_of(exc, emu) is FailureKind.LIKELY_PAYLOAD
    # A drop on a small body is a plain network blip.
    emu.configure(drop_over="1KB")
    exc = fail(emu, wire, "q" * 2_000, stream=stream)
    assert isinstance(exc, openai.APIConnectionError | anthropic.APIConnectionError)
    assert kind_of(exc, emu) is FailureKind.TRANSIENT


def test_limits_apply_in_order_drop_then_413_then_waf(emulator: Callable[..., Emulator]) -> None:
    emu = emulator(drop_over="64KB", max_body="32KB", waf_over="16KB", context_window=10**7)
    for size in (100, 20_000, 40_000, 80_000):
        with contextlib.suppress(openai.APIStatusError, openai.APIConnectionError):
            ask(emu, "openai", [{"role": "user", "content": "a" * size}])
    assert [r.status for r in emu.requests] == [200, 403, 413, None]
    rejected = [r for r in emu.requests if r.status != 200]
    assert len(rejected) == 3


def test_concurrent_requests_are_all_recorded(emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            got = ask(emu, WIRES[i % 2], [{"role": "user", "content": f"n{i}"}],
                      stream=bool(i % 3))
            assert f'"n{i}"' in got["text"]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert errors == []
    assert len(emu.requests) == 12 and {r.status for r in emu.requests} == {200}


def test_unknown_path_is_a_404(emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    req = urllib.request.Request(emu.url + "/v1/engines", data=b"{}", headers=emu.token_headers)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=TIMEOUT)
    assert info.value.code == 404
    assert json.loads(info.value.read())["error"]["message"] == "Invalid URL (POST /v1/engines)"


# --------------------------------------------------------------------------- command line

def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ipy_ctxrecovery.emulator", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_cli_serves_and_stops_cleanly() -> None:
    proc = _cli("--port", "0", "--max-body", "16KB", "--context-window", "4096")
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        second = proc.stdout.readline()
        base = first.split()[-1]
        assert first.startswith("OpenAI base URL:") and base.endswith("/v1")
        assert second.split()[-1] == base[:-3]
        emu_like = openai.OpenAI(base_url=base, api_key="sk-x", max_retries=0, timeout=TIMEOUT)
        r = emu_like.chat.completions.create(model="emulator",
                                             messages=[{"role": "user", "content": "ping"}])
        assert (r.choices[0].message.content or "").startswith('Emulator reply: you said "ping"')
        with pytest.raises(openai.APIStatusError) as info:
            emu_like.chat.completions.create(
                model="emulator", messages=[{"role": "user", "content": "p" * 20_000}])
        assert info.value.status_code == 413
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "POST /v1/chat/completions 413" in out and "emulator stopped" in out
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [["--max-body", "huge"], ["--context-window", "0"],
                                  ["--body-limit-style", "haproxy"], ["--latency", "-2"]])
def test_cli_bad_values_exit_2_with_one_line(args: list[str]) -> None:
    proc = _cli("--port", "0", *args)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1 and "error" in err
    assert out == ""


def test_cli_main_function_is_the_script_entry() -> None:
    from ipy_ctxrecovery.emulator.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--port", "notaport"])
    assert info.value.code == 2


# --------------------------------------------------------------------------- properties (no HTTP)


@settings(max_examples=200, deadline=None)
@given(user=st.text(min_size=1, max_size=120).filter(lambda t: t.strip()),
       n=st.integers(0, 120), limit=st.integers(1, 40))
def test_continuations_rebuild_the_answer_exactly(user: str, n: int, limit: int) -> None:
    """Whatever the text (multibyte too) and budget: cut parts join to the uncut answer."""
    content = f"{user} [[words {n}]]" if n else user
    turns = [Turn("user", content, content)]
    full = plan(turns).text
    parts: list[str] = []
    for _ in range(200):
        step = plan(turns, limit=limit)
        parts.append(step.text)
        assert count_tokens(step.text) <= limit
        if step.finish == "stop":
            break
        assert step.finish == "length"
        turns += [Turn("assistant", step.text, step.text),
                  Turn("user", CONTINUATION_PROMPT, CONTINUATION_PROMPT)]
    assert "".join(parts) == full


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=6000))
def test_summaries_are_bounded_and_extractive(text: str) -> None:
    summary = summarize(text)
    header, _, rest = summary.partition("\n")
    assert re.fullmatch(r"\[STRUCTURED SUMMARY — covering \d+ earlier messages\]", header)
    assert len(summary) <= max(min(len(text) // 4, 2000), len(header))
    normalized = "\n".join(" ".join(line.split()) for line in text.splitlines())
    for line in rest.splitlines():
        if line.startswith("- "):
            assert line[2:].rstrip("…") in normalized


def test_cli_port_in_use_is_one_clear_line() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = _cli("--port", str(busy.getsockname()[1]))
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1
    assert len(err.strip().splitlines()) == 1 and "choose another --port" in err


def test_close_also_ends_keep_alive_connections() -> None:
    emu = Emulator().start()
    oc, _ = clients(emu)
    assert ask(emu, "openai", [{"role": "user", "content": "hi"}])["stop"] == "stop"
    oc.chat.completions.create(model="emulator", messages=[{"role": "user", "content": "a"}])
    emu.close()
    with pytest.raises(openai.APIConnectionError):
        oc.chat.completions.create(model="emulator", messages=[{"role": "user", "content": "b"}])
    assert len(emu.requests) == 2


def test_summary_of_the_compactors_input_quotes_the_conversation_not_the_framing() -> None:
    from ipy_ctxrecovery.core.compactor import compact
    from ipy_ctxrecovery.core.history import Message as HMessage
    from ipy_ctxrecovery.core.history import ToolCall as HToolCall
    from ipy_ctxrecovery.core.history import to_openai
    from ipy_ctxrecovery.settings import Settings

    def measure(history: tuple[HMessage, ...]) -> int:
        return len(json.dumps(to_openai(history), ensure_ascii=False).encode("utf-8"))

    earlier = HMessage.user("[STRUCTURED SUMMARY — covering 4 earlier messages]\n"
                            "## Files read\n- notes/plan.md", tag="summary")
    history = (HMessage.system("Be brief."), earlier,
               HMessage.user("please fix the failing test in src/app.py"),
               HMessage.assistant("", [HToolCall("c1", "read_file", '{"path": "src/app.py"}')]),
               HMessage.tool("c1", "def f():\n    raise ValueError('bad input')\n" * 40,
                             name="read_file"),
               HMessage.assistant("We decided to validate the input before calling f."),
               HMessage.user("now run the tests"))
    inputs: list[str] = []

    def summarizer(text: str) -> str:
        inputs.append(text)
        return summarize(text)

    settings = Settings().replace(summarizer_input_max_chars=1_500)
    out, report = compact(history, target_bytes=measure(history) // 3, measure=measure,
                          summarize=summarizer, settings=settings,
                          instructions="focus on the tests")
    assert report.applied and len(inputs) > 1            # in chunks, the summary so far carried
    sent = inputs[0]
    assert sent.startswith("Summarize these 5 earlier messages")     # the framing is there…
    assert "Message 2 of 5, from the user: please fix" in sent and "part 1 of" in sent
    assert all("chars omitted" not in text for text in inputs)       # nothing cut out
    raw = summarize(sent)
    assert raw.startswith("[STRUCTURED SUMMARY — covering 5 earlier messages]\n")
    for text in inputs:
        raw = summarize(text)
        items = [ln[2:].rstrip("…") for ln in raw.splitlines() if ln.startswith("- ")]
        assert items                                                  # …but never quoted
        for item in items:
            assert not item.startswith(("Summarize these", "Message ", "…",
                                        "Additional instructions", "[STRUCTURED SUMMARY", "## ",
                                        "The summary so far"))
            assert "omitted" not in item and "end of message" not in item
            assert "summary so far" not in item
            assert item in text
    first = summarize(inputs[0])
    assert "src/app.py" in first
    assert "notes/plan.md" in first            # the earlier summary's fact, not its heading
    assert "notes/plan.md" in inputs[-1]       # carried forward in the summary so far
    assert out[1].text.startswith(with_recall_hint(summary_header(8)) + "\n")


def test_framing_lines_alone_give_only_the_header() -> None:
    from ipy_ctxrecovery.core import markers

    text = (markers.preamble(3) + "\n\n"
            "Message 1 of 3, from the user: — end of message 1\n\n"
            "Message 2 of 3, from the assistant: … 120 chars omitted … — end of message 2\n"
            + markers.omitted_note(2, 300) + "\n"
            + markers.instructions("keep it short")) * 3
    assert summarize(text) == "[STRUCTURED SUMMARY — covering 3 earlier messages]"


# -- extended thinking (Anthropic) -----------------------------------------------------------

_THINK = {"type": "enabled", "budget_tokens": 1024}
_WEATHER = [{"name": "weather", "description": "The weather.",
             "input_schema": {"type": "object", "properties": {}}}]


@pytest.mark.parametrize("stream", STREAMS)
def test_with_thinking_on_the_answer_starts_with_a_signed_thinking_block(
        emulator: Any, stream: bool) -> None:
    emu = emulator()
    client = emu.anthropic_client(max_retries=0)
    asked = [{"role": "user", "content": '[[tool weather {"city": "Oslo"}]]'}]
    kwargs: dict[str, Any] = {"model": "emulator", "max_tokens": 2048, "messages": asked,
                              "tools": _WEATHER, "thinking": _THINK}
    if stream:
        with client.messages.stream(**kwargs) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(**kwargs)
    thought, call = (b.to_dict() for b in reply.content)
    assert thought["type"] == "thinking" and thought["thinking"].startswith("Read 1 message")
    assert thought["signature"].startswith("EmuThinking") and call["type"] == "tool_use"
    assert reply.stop_reason == "tool_use"
    # The same request again: the same block (deterministic).
    again = client.messages.create(**{**kwargs, "stream": False}) if stream else \
        client.messages.create(**kwargs)
    assert again.content[0].to_dict() == thought
    # Without thinking: no block, as before.
    plain = client.messages.create(model="emulator", max_tokens=64, messages=asked,
                                   tools=_WEATHER)
    assert [b.type for b in plain.content] == ["tool_use"]


def test_a_tool_loop_sent_back_without_its_thinking_block_is_refused(emulator: Any) -> None:
    emu = emulator()
    client = emu.anthropic_client(max_retries=0)
    asked = [{"role": "user", "content": '[[tool weather {"city": "Oslo"}]]'}]
    reply = client.messages.create(model="emulator", max_tokens=2048, messages=asked,
                                   tools=_WEATHER, thinking=_THINK)
    content = [b.to_dict() for b in reply.content]
    result = {"role": "user", "content": [{"type": "tool_result",
                                           "tool_use_id": content[1]["id"], "content": "sunny"}]}
    whole = [*asked, {"role": "assistant", "content": content}, result]
    done = client.messages.create(model="emulator", max_tokens=2048, messages=whole,
                                  tools=_WEATHER, thinking=_THINK)
    assert done.content[0].type == "thinking" and done.content[1].type == "text"
    stripped = [*asked, {"role": "assistant", "content": content[1:]}, result]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="emulator", max_tokens=2048, messages=stripped,
                               tools=_WEATHER, thinking=_THINK)
    message = info.value.body["error"]["message"]
    assert message.startswith("messages.1.content.0.type: Expected `thinking` or "
                              "`redacted_thinking`, but found `tool_use`. When `thinking` is "
                              "enabled, a final `assistant` message must start with a thinking "
                              "block (preceeding the lastmost set of `tool_use` and "
                              "`tool_result` blocks).")
    assert (emu.requests[-1].status, emu.requests[-1].fault) == (400, "thinking")
    # Thinking off, or a turn that is not a tool loop: no such rule.
    assert client.messages.create(model="emulator", max_tokens=64, messages=stripped,
                                  tools=_WEATHER).content[0].type == "text"
    later = [*stripped, {"role": "assistant", "content": "It is sunny."},
             {"role": "user", "content": "thanks"}]
    assert client.messages.create(model="emulator", max_tokens=2048, messages=later,
                                  tools=_WEATHER, thinking=_THINK).content[0].type == "thinking"


def test_a_tool_use_id_sent_twice_is_refused_and_the_emulator_never_repeats_one(
        emulator: Any) -> None:
    emu = emulator()
    client = emu.anthropic_client(max_retries=0)
    asked = [{"role": "user", "content": '[[tool weather {"city": "Oslo"}]]'}]

    def loop(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        reply = client.messages.create(model="emulator", max_tokens=64, messages=messages,
                                       tools=_WEATHER)
        call = reply.content[0].to_dict()
        return [{"role": "assistant", "content": [call]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                              "content": "sunny"}]}]

    # The same history twice (as after a compaction shortened it): two ids all the same.
    first, second = loop(asked), loop(asked)
    assert first[0]["content"][0]["id"] != second[0]["content"][0]["id"]
    again = [*asked, *first, {"role": "assistant", "content": "Sunny."}, *asked, *second]
    assert client.messages.create(model="emulator", max_tokens=64, messages=again,
                                  tools=_WEATHER).content[0].type == "text"
    repeated = [*asked, *first, {"role": "assistant", "content": "Sunny."}, *asked, *first]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="emulator", max_tokens=64, messages=repeated,
                               tools=_WEATHER)
    assert info.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "messages.5.content.0: `tool_use` ids must be unique"}


def test_a_thinking_budget_under_1024_or_not_below_max_tokens_is_refused(
        emulator: Any) -> None:
    emu = emulator()
    client = emu.anthropic_client(max_retries=0)
    asked = [{"role": "user", "content": "hello"}]

    def refusal(max_tokens: int, budget: int, **kwargs: Any) -> str:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="emulator", max_tokens=max_tokens, messages=asked,
                                   thinking={"type": "enabled", "budget_tokens": budget},
                                   **kwargs)
        assert emu.requests[-1].fault == "thinking"
        return str(info.value.body["error"]["message"])

    # anthropics/claude-code#8756; danny-avila/LibreChat#8346.
    over = ("`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            "documentation at https://docs.claude.com/en/docs/build-with-claude/"
            "extended-thinking#max-tokens-and-context-window-size")
    assert refusal(2048, 2048) == refusal(1500, 2048) == over
    assert refusal(4096, 1023) == ("thinking.enabled.budget_tokens: Input should be greater "
                                   "than or equal to 1024")
    for max_tokens, budget in ((1025, 1024), (4096, 2048)):
        reply = client.messages.create(model="emulator", max_tokens=max_tokens, messages=asked,
                                       thinking={"type": "enabled", "budget_tokens": budget})
        assert reply.content[0].type == "thinking"
    # Interleaved thinking's budget spans the tool loop: it may exceed max_tokens.
    reply = client.beta.messages.create(
        model="emulator", max_tokens=1500, messages=asked, betas=[INTERLEAVED_THINKING_BETA],
        thinking={"type": "enabled", "budget_tokens": 2048})
    assert reply.content[0].type == "thinking"
    # Adaptive thinking has no budget to check.
    assert client.messages.create(model="emulator", max_tokens=64, messages=asked,
                                  thinking={"type": "adaptive"}).content[0].type == "thinking"


def test_an_assistant_message_ending_in_thinking_is_refused(emulator: Any) -> None:
    emu = emulator()
    client = emu.anthropic_client(max_retries=0)
    asked = [{"role": "user", "content": "hello"}]
    reply = client.messages.create(model="emulator", max_tokens=2048, messages=asked,
                                   thinking=_THINK)
    thought, said = (b.to_dict() for b in reply.content)
    later = {"role": "user", "content": "and now?"}
    for thinking in (_THINK, None):
        extra = {"thinking": thinking} if thinking else {}
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="emulator", max_tokens=2048, **extra,
                                   messages=[*asked, {"role": "assistant", "content": [thought]},
                                             later])
        assert info.value.body["error"]["message"] == (
            "messages.1: The final block in an assistant message cannot be `thinking`.")
    assert client.messages.create(
        model="emulator", max_tokens=2048, thinking=_THINK,
        messages=[*asked, {"role": "assistant", "content": [thought, said]}, later]).content
