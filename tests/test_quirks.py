"""The emulator's quirk flags (``emulator/quirks.py``): OpenAI-compatible servers as they
really answer, through the real ``openai`` SDK and raw HTTP, against the emulator.

Each flag is what llama-cpp-python's server does: list content answers 500, a refused
streamed request answers an empty 200 event stream (the same body unstreamed gets its
error), streamed replies carry no usage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from thirty_turns import RUNS, WINDOW, client_for, thirty_turns

from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.emulator import quirks, replies
from ipy_ctxrecovery.emulator.__main__ import build_parser
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.failures import FailureKind

PARTS = [{"type": "text", "text": "a summary"}, {"type": "text", "text": "the request"}]
LONG = "word " * 2000           # ~2,500 emulator tokens


def post(emu: Any, body: dict[str, Any]) -> httpx2.Response:
    """``body`` as a raw POST, so the exact bytes of the answer can be read."""
    with httpx2.Client(timeout=10) as client:
        return client.post(emu.openai_base_url + "/chat/completions", json=body,
                           headers={**emu.token_headers, "Authorization": "Bearer sk-x"})


def test_list_content_answers_500_as_llama_cpp_python_does(emulator: Any) -> None:
    emu = emulator(string_content_only=True)
    answer = post(emu, {"model": "m", "messages": [{"role": "user", "content": PARTS}]})
    assert answer.status_code == 500
    assert answer.headers["server"] == "uvicorn"
    # FastAPI's compact JSONResponse of llama_cpp/server/errors.py's ErrorResponse.
    assert answer.content == (b'{"error":{"message":"can only concatenate str (not \\"list\\") '
                              b'to str","type":"internal_server_error","param":null,'
                              b'"code":null}}')
    assert emu.requests[-1].fault == "content"
    # The same text as a string is answered; a plain emulator takes the list as well.
    text = post(emu, {"model": "m", "messages": [{"role": "user", "content": "the request"}]})
    assert text.status_code == 200
    plain = emulator()
    assert post(plain, {"model": "m", "messages": [{"role": "user", "content": PARTS}]}
                ).status_code == 200


def test_a_string_content_server_is_a_server_error_to_the_sdk(emulator: Any) -> None:
    emu = emulator(string_content_only=True)
    client = emu.openai_client(max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": PARTS}])
    failure = classify(info.value, request_bytes=100)
    assert failure.kind is FailureKind.TRANSIENT and failure.status == 500
    assert failure.fingerprint is not None


def test_a_streamed_overflow_is_an_empty_200_stream_and_unstreamed_the_400(emulator: Any) -> None:
    emu = emulator(context_window=2048, empty_stream_on_error=True)
    messages = [{"role": "user", "content": LONG}]
    streamed = post(emu, {"model": "m", "messages": messages, "stream": True,
                          "stream_options": {"include_usage": True}})
    # sse-starlette under uvicorn, when the model call raises after the response started.
    assert streamed.status_code == 200
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert streamed.headers["cache-control"] == "no-store"
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert streamed.content == b""                      # not even data: [DONE]
    assert (emu.requests[-1].status, emu.requests[-1].fault) == (200, "context")
    unstreamed = post(emu, {"model": "m", "messages": messages})
    assert unstreamed.status_code == 400
    error = unstreamed.json()["error"]
    prompt = replies.prompt_tokens(replies.openai_turns({"messages": messages}))
    assert error == {
        "message": f"This model's maximum context length is 2048 tokens. However, you requested "
                   f"{prompt} tokens ({prompt} in the messages, None in the completion). Please "
                   "reduce the length of the messages or completion.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
    failure = classify(status=400, body=unstreamed.content)
    assert failure.kind is FailureKind.CONTEXT_OVERFLOW
    assert (failure.prompt_tokens, failure.limit_tokens) == (prompt, 2048) and prompt >= 2048


def test_its_overflow_rule_is_llama_cpp_pythons(emulator: Any) -> None:
    emu = emulator(context_window=2048, empty_stream_on_error=True)
    client = emu.openai_client(max_retries=0)
    # A prompt that fits, with a max_tokens that does not: cut to fit, not refused.
    short = "word " * 1400                           # ~1,760 tokens
    reply = client.chat.completions.create(model="m", max_tokens=1000, messages=[
        {"role": "user", "content": short + "[[words 2000]]"}])
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= 2048
    # With max_tokens given, the 400 says it as the completion's share.
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", max_tokens=100,
                                       messages=[{"role": "user", "content": LONG}])
    message = info.value.body["message"]  # type: ignore[index]
    assert "in the messages, 100 in the completion)" in message
    failure = classify(info.value)
    assert failure.output_tokens == 100 and failure.limit_tokens == 2048


def test_a_refused_streamed_request_of_any_kind_is_an_empty_stream(emulator: Any) -> None:
    emu = emulator(string_content_only=True, empty_stream_on_error=True, alternation="vllm")
    for messages in ([{"role": "user", "content": PARTS}],
                     [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]):
        streamed = post(emu, {"model": "m", "messages": messages, "stream": True})
        assert (streamed.status_code, streamed.content) == (200, b"")
        assert post(emu, {"model": "m", "messages": messages}).status_code in (400, 500)
    assert [r.fault for r in emu.requests] == ["content", "content", "alternation",
                                               "alternation"]


@pytest.mark.parametrize("stream_usage", [True, False])
def test_stream_usage_can_be_left_out(emulator: Any, stream_usage: bool) -> None:
    emu = emulator(stream_usage=stream_usage)
    client = emu.openai_client(max_retries=0)
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "[[words 5]]"}], stream=True,
        stream_options={"include_usage": True}))
    usage = [c.usage for c in chunks if c.usage is not None]
    assert bool(usage) is stream_usage
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) \
        == "w1 w2 w3 w4 w5"
    # Unstreamed, usage is always there.
    whole = client.chat.completions.create(model="m",
                                           messages=[{"role": "user", "content": "[[words 5]]"}])
    assert whole.usage is not None and whole.usage.prompt_tokens > 0


def test_quirks_are_checked_and_changed_like_any_setting(emulator: Any) -> None:
    emu = emulator()
    assert (emu.string_content_only, emu.empty_stream_on_error, emu.stream_usage) == (
        False, False, True)
    emu.configure(string_content_only=True)
    assert post(emu, {"model": "m", "messages": [{"role": "user", "content": PARTS}]}
                ).status_code == 500
    with pytest.raises(ConfigError, match="stream_usage='no' must be True or False"):
        emu.configure(stream_usage="no")


def test_the_command_line_takes_each_quirk_from_its_one_declaration() -> None:
    parser = build_parser()
    given = parser.parse_args(["--string-content-only", "--empty-stream-on-error",
                               "--no-stream-usage"])
    assert {q.name: getattr(given, q.name) for q in quirks.QUIRKS} == {
        "string_content_only": True, "empty_stream_on_error": True, "stream_usage": False}
    none = parser.parse_args([])
    assert all(getattr(none, q.name) is None for q in quirks.QUIRKS)
    helps = parser.format_help()
    assert all(q.flag in helps for q in quirks.QUIRKS)


def test_the_empty_stream_is_what_sse_starlette_sends() -> None:
    headers, events = quirks.empty_stream()
    assert dict(headers)["content-type"] == "text/event-stream; charset=utf-8"
    assert list(events) == []
    assert json.loads(quirks.content_rejection().body)["error"]["type"] == "internal_server_error"


@pytest.mark.parametrize("stream", RUNS)
def test_thirty_turns_against_the_emulator_playing_llama_cpp_python(
        emulator: Any, stream: bool, tmp_path: Path) -> None:
    # tests/test_llama_cpp_python.py's session, on the three quirks together.
    emu = emulator(context_window=WINDOW, string_content_only=True, empty_stream_on_error=True,
                   stream_usage=False)
    statuses: list[int] = []
    client = client_for(emu.openai_base_url, statuses, default_headers=emu.token_headers)
    thirty_turns(client, statuses, stream=stream, files_root=tmp_path)
    assert [r.fault for r in emu.requests if r.status == 500] == []
