"""Replies that are not what an API sends (providers/_replies.py, issue 26): a page or a text
in a 200, a redirect loop, an empty answer — each one sentence through the real SDK clients
against a hostile server on 127.0.0.1, and nothing of the conversation lost."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from rawserver import serving

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import Message, Role
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers import Request
from ipy_ctxrecovery.providers._replies import EXCERPT_CHARS, excerpt
from ipy_ctxrecovery.providers.anthropic import AnthropicProvider
from ipy_ctxrecovery.providers.openai import OpenAIProvider

SECRET = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX1234"
PORTAL = ("<!DOCTYPE html><html><head><title>Hotel Wi-Fi &amp; Lounge</title>"
          "<style>body { color: red }</style><script>var token = 1;</script></head>"
          f"<body><h1>Welcome!</h1><p>Please accept the terms to go online. ref {SECRET}</p>"
          "</body></html>")


class _Mine(openai.OpenAI):
    """Not the SDK's own class: requests go through the SDK's method, not the fast send."""


class _MineToo(anthropic.Anthropic):
    pass


def http(status: str, body: bytes | str, content_type: str | None = "application/json",
         *extra: str) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    head = [f"HTTP/1.1 {status}", "connection: close", f"content-length: {len(data)}", *extra]
    if content_type is not None:
        head.append(f"content-type: {content_type}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


@pytest.fixture
def start() -> Iterator[Any]:
    with serving() as starting:
        yield starting


def session(port: int, wire: str, how: str = "fast") -> ChatSession:
    """A session on the real SDK client of ``wire`` against 127.0.0.1:``port``; ``how``:
    ``fast`` (the SDK's own client class) or ``sdk`` (a subclass: the SDK's method)."""
    if wire == "openai":
        cls = openai.OpenAI if how == "fast" else _Mine
        provider: Any = OpenAIProvider("gpt-4o-mini", client=cls(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0))
    else:
        acls = anthropic.Anthropic if how == "fast" else _MineToo
        provider = AnthropicProvider("claude-sonnet-4-5", client=acls(
            base_url=f"http://127.0.0.1:{port}", api_key="sk-x", max_retries=0))
    return ChatSession(provider=provider, settings=Settings(), sleep=lambda s: None)


def failed_turn(s: ChatSession, *, stream: bool) -> ChatError:
    """One turn that fails; the conversation is as before it (the user's message kept in
    the transcript only)."""
    with pytest.raises(ChatError) as caught:
        s.send("hello there", stream=stream)
    assert s.history == ()
    assert [m.text for m in s.transcript if m.role is Role.USER] == ["hello there"]
    return caught.value


def _path(wire: str) -> str:
    return "/v1/chat/completions" if wire == "openai" else "/v1/messages"


# -- a page or a text in a 200 ------------------------------------------------------------

@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("how", ["fast", "sdk"])
def test_a_portal_page_in_a_200_names_its_content_type_and_first_words(
        start: Any, wire: str, stream: bool, how: str) -> None:
    srv = start(http("200 OK", PORTAL, "text/html; charset=utf-8"), stall=0)
    s = session(srv.port, wire, how)
    error = failed_turn(s, stream=stream)
    said = str(error)
    assert said == error.failure.reason and "\n" not in said
    assert "HTTP 200" in said and "an HTML page" in said
    # The SDK's own method hands back the page's text without its headers: the content
    # type is then not told, never a wrong one.
    assert ("(content type text/html)" in said) is (how == "fast" or stream)
    assert '"Hotel Wi-Fi & Lounge Welcome! Please accept the terms to go online. ref ' in said
    assert SECRET not in said and "[REDACTED]" in said
    assert "color" not in said and "token" not in said and "<" not in said
    assert "captive portal" in said and "base URL" in said
    assert "Expecting value" not in said and "JSONDecodeError" not in said
    assert error.failure.kind is FailureKind.OTHER      # not retried, not a size limit
    assert srv.connections == 1 and s.caps.effective() is None
    s.close()


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_plain_text_or_a_page_labelled_json_in_a_200_is_named_too(
        start: Any, wire: str, stream: bool) -> None:
    text = start(http("200 OK", "upstream said: all good " * 20, "text/plain"), stall=0)
    error = failed_turn(session(text.port, wire), stream=stream)
    what = "an event stream" if stream else "JSON"
    quoted = re.search(f'with a body that is not {what} \\(content type text/plain\\): '
                       '"(.*?)" — ', str(error))
    assert quoted is not None, str(error)
    assert quoted.group(1).startswith("upstream said: all good upstream said: ")
    assert quoted.group(1).endswith("good…") and len(quoted.group(1)) <= EXCERPT_CHARS
    assert f"from http://127.0.0.1:{text.port}{_path(wire)} " in str(error)
    labelled = start(http("200 OK", PORTAL, "application/json"), stall=0)
    error = failed_turn(session(labelled.port, wire), stream=stream)
    assert "an HTML page (content type application/json): \"Hotel Wi-Fi" in str(error)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_redirect_to_a_login_page_says_where_it_went(start: Any, wire: str,
                                                       stream: bool) -> None:
    def answer(head: bytes) -> bytes:
        if head.startswith(b"GET /login"):
            return http("200 OK", PORTAL, "text/html")
        return http("302 Found", b"", None, f"location: http://user:hunter2@127.0.0.1:"
                    f"{srv.port}/login?key={SECRET}")

    srv = start(answer, stall=0)
    said = str(failed_turn(session(srv.port, wire), stream=stream))
    assert (f"answered HTTP 200 after a redirect to http://[REDACTED]@127.0.0.1:{srv.port}"
            "/login?key=[REDACTED] with an HTML page") in said
    assert "hunter2" not in said and SECRET not in said


# -- a redirect loop ------------------------------------------------------------------------

@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_redirect_loop_is_named_with_where_it_goes(start: Any, wire: str,
                                                     stream: bool) -> None:
    srv = start(b"", stall=0)
    srv.reply = http("307 Temporary Redirect", b"", "text/plain",
                     f"location: http://user:hunter2@127.0.0.1:{srv.port}{_path(wire)}"
                     f"?key={SECRET}")
    s = session(srv.port, wire)
    error = failed_turn(s, stream=stream)
    said = str(error)
    assert said.startswith("The request ran into a redirect loop: the server kept "
                           "redirecting it until the client gave up, last to "
                           f"http://[REDACTED]@127.0.0.1:{srv.port}{_path(wire)}"
                           "?key=[REDACTED]; check the base URL")
    assert "hunter2" not in said and SECRET not in said
    assert "dropped" not in said and "payload" not in said and "CHATCLI_MAX_PAYLOAD" not in said
    assert error.failure.kind is FailureKind.OTHER and error.failure.signature is None
    # One send (the client's own 20 redirects), no resend, no size limit learned.
    assert srv.connections == 21 and s.caps.effective() is None
    s.close()


# -- an empty answer ------------------------------------------------------------------------

def _oa_empty(stream: bool) -> bytes:
    usage = {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
    if not stream:
        return http("200 OK", json.dumps({"id": "c", "object": "chat.completion", "created": 1,
                                          "model": "m", "choices": [], "usage": usage}))
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [], "usage": usage}
    return http("200 OK", f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", "text/event-stream")


def _an_empty(stream: bool) -> bytes:
    message = {"id": "m", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
               "content": [], "stop_reason": "end_turn" if not stream else None,
               "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 0}}
    if not stream:
        return http("200 OK", json.dumps(message))
    events = [("message_start", {"type": "message_start", "message": message}),
              ("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                 "usage": {"output_tokens": 0}}),
              ("message_stop", {"type": "message_stop"})]
    body = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return http("200 OK", body, "text/event-stream")


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_answer_in_a_200_is_one_sentence(start: Any, wire: str, stream: bool) -> None:
    srv = start((_oa_empty if wire == "openai" else _an_empty)(stream), stall=0)
    error = failed_turn(session(srv.port, wire), stream=stream)
    api, what = ("OpenAI", "an empty choices list") if wire == "openai" else \
        ("Anthropic", "an empty content list")
    if stream:
        what = ("an event stream in which no chunk has a choice" if wire == "openai"
                else "an event stream without a content block")
    assert str(error) == (f"The {api} server answered HTTP 200 with {what}, so there is no "
                          "answer to keep; retry, and if it repeats check the server or any "
                          "gateway in between (one that drops the model's output).")
    assert error.failure.kind is FailureKind.TRANSIENT


# -- what still goes through ------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/plain", "application/json", None])
def test_an_event_stream_under_another_content_type_is_still_read(
        start: Any, content_type: str | None) -> None:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"},
                            "finish_reason": None}]},
              {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    srv = start(http("200 OK", body, content_type), stall=0)
    s = session(srv.port, "openai")
    assert s.send("hello", stream=True).text == "Hi"
    assert [m.role for m in s.history] == [Role.USER, Role.ASSISTANT]


def test_excerpt_reads_a_page_as_its_words_masked_and_short() -> None:
    assert excerpt(PORTAL, page=True) == ("Hotel Wi-Fi & Lounge Welcome! Please accept the "
                                          "terms to go online. ref [REDACTED]")
    assert excerpt("a  b\n\tc " * 40, limit=12) == "a b c a b c…"
    assert excerpt(f"Authorization: Bearer {SECRET}") == "Authorization: Bearer [REDACTED]"


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_client_with_strict_validation_gets_the_same_sentence(start: Any, wire: str) -> None:
    # The SDK itself refuses the page (APIResponseValidationError). Its with_options copies
    # drop the flag, so this is the provider on the client as given.
    srv = start(http("200 OK", PORTAL, "text/html"), stall=0)
    if wire == "openai":
        provider: Any = OpenAIProvider("gpt-4o-mini", client=_Mine(
            base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="sk-x", max_retries=0,
            _strict_response_validation=True))
    else:
        provider = AnthropicProvider("claude-sonnet-4-5", client=_MineToo(
            base_url=f"http://127.0.0.1:{srv.port}", api_key="sk-x", max_retries=0,
            _strict_response_validation=True))
    with pytest.raises(ChatError) as caught:
        provider.send(Request((Message.user("hello"),), stream=False))
    assert isinstance(caught.value.__cause__, openai.APIResponseValidationError
                      if wire == "openai" else anthropic.APIResponseValidationError)
    assert f"from http://127.0.0.1:{srv.port}{_path(wire)} with an HTML page (content type " \
           'text/html): "Hotel Wi-Fi' in str(caught.value)
