"""Failure classification: a corpus of real error responses, asserted three ways.

Each file in ``tests/corpus/`` is one real response (status, headers, body) with a ``source``
note and the expected kind and numbers. Every case is checked (1) with ``classify(status=,
body=, headers=)``, (2) through the real ``openai`` SDK and (3) through the real
``anthropic`` SDK: a local HTTP server replies with exactly that response, the client
raises, and ``classify(exc)`` must agree. Connection drops are served the same way.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quiet_server import QuietHTTPServer

from ipy_ctxrecovery.core import classify as _classify
from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.errors import ChatError, redact
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.settings import Settings, format_size

CORPUS_DIR = Path(__file__).parent / "corpus"
CASES: list[dict[str, Any]] = [
    json.loads(p.read_text(encoding="utf-8")) for p in sorted(CORPUS_DIR.glob("*.json"))
]
CASE_BY_ID = {case["id"]: case for case in CASES}
NUMBER_FIELDS = ("prompt_tokens", "limit_tokens", "output_tokens", "retry_after")
LARGE = 600 * 1024
SMALL = 10 * 1024


# Errors that arrive inside a 200 event stream: (events, cut off?) — the status says nothing.
_OPENAI_CHUNK = json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0,
                            "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"},
                                                       "finish_reason": None}]})
STREAMS: dict[str, tuple[list[str], bool]] = {
    # docs.claude.com streaming guide, "Error events": event: error / overloaded_error.
    "anthropic_overloaded": (['event: ping\ndata: {"type": "ping"}\n\n',
                              'event: error\ndata: {"type": "error", "error": {"type": '
                              '"overloaded_error", "message": "Overloaded"}}\n\n'], False),
    # llama.cpp answering an over-long prompt with an error event mid-stream (public test
    # fixture: {"error": {"message": "the request exceeds the available context size", ...}}).
    "openai_llamacpp_overflow": ([f"data: {_OPENAI_CHUNK}\n\n",
                                  'data: {"error": {"message": "the request exceeds the available '
                                  'context size, try increasing it", "code": 400, "type": '
                                  '"exceed_context_size_error", "n_prompt_tokens": 5000, '
                                  '"n_ctx": 4096}}\n\n'], False),
    # OpenAI server_error delivered inside the stream.
    "openai_server_error": (['data: {"error": {"message": "The server had an error while '
                             'processing your request. Sorry about that!", "type": '
                             '"server_error", "param": null, "code": null}}\n\n'], False),
    # The Responses API refusing an input over the window inside its stream, after
    # response.created: the error event as dyad-sh/dyad#1672 met it.
    "openai_responses_overflow": (
        ['event: response.created\ndata: {"type": "response.created", "sequence_number": 0, '
         '"response": {"id": "resp_1", "object": "response", "status": "in_progress", '
         '"output": []}}\n\n',
         'event: error\ndata: {"type": "error", "sequence_number": 2, "error": {"type": '
         '"invalid_request_error", "code": "context_length_exceeded", "message": "Your input '
         'exceeds the context window of this model. Please adjust your input and try again.", '
         '"param": "input"}}\n\n'], False),
    # The answer started and was cut off: a network failure, never a payload problem.
    "openai_cut": ([f"data: {_OPENAI_CHUNK}\n\n"], True),
    "anthropic_cut": (['event: ping\ndata: {"type": "ping"}\n\n'], True),
}


# --------------------------------------------------------------------------- server
class _Handler(BaseHTTPRequestHandler):
    """Replies with a corpus case (``/case/<id>/…``) or drops the connection (``/drop/…``)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as two writes; without NODELAY each reply waits for a
        # delayed ACK (~40 ms), which over 250 replies is most of this file's run time.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        parts = self.path.strip("/").split("/")
        if parts[0] == "drop":
            self._drop(parts[1])
            return
        if parts[0] == "stream":
            self._stream(parts[1])
            return
        self._read_body()
        # One shared client per SDK names its case in a header; the path form stays for others.
        case = CASE_BY_ID[self.headers.get("X-Corpus-Case") or parts[1]]
        body = case["body"].encode("utf-8")
        self.send_response(case["status"])
        for name, value in case["headers"].items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, name: str) -> None:
        """A 200 event stream that carries an error event (or is cut off mid-way)."""
        self._read_body()
        events, cut = STREAMS[name]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            data = event.encode("utf-8")
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        if cut:  # no terminating chunk: the body ends mid-stream
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")

    def _read_body(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or 0)
        while length > 0:
            chunk = self.rfile.read(min(length, 65536))
            if not chunk:
                break
            length -= len(chunk)

    def _drop(self, how: str) -> None:
        if how == "after_body":
            self._read_body()  # the whole request arrived; the answer never comes
        elif how == "reset":
            self._read_body()
            # SO_LINGER 0 turns close() into a TCP RST ("connection reset by peer").
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # the peer may already be gone
            if exc.errno not in (errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET):
                raise
        self.connection.close()


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    server = QuietHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _openai_error(base_url: str, content: str = "hi", stream: bool = False) -> BaseException:
    client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=20)
    try:
        result = client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": content}], stream=stream)
        if stream:
            for _chunk in result:
                pass
    except openai.OpenAIError as exc:
        return exc
    finally:
        client.close()
    raise AssertionError("the openai client did not raise")


def _anthropic_error(base_url: str, content: str = "hi", stream: bool = False) -> BaseException:
    client = anthropic.Anthropic(base_url=base_url, api_key="test", max_retries=0, timeout=20)
    try:
        result = client.messages.create(model="claude-test", max_tokens=16, stream=stream,
                                        messages=[{"role": "user", "content": content}])
        if stream:
            for _event in result:
                pass
    except anthropic.AnthropicError as exc:
        return exc
    except httpx2.HTTPError as exc:
        # anthropic does not wrap a transport error raised while iterating a stream
        # (openai wraps it in APIConnectionError): the adapter must catch httpx2 too.
        return exc
    finally:
        client.close()
    raise AssertionError("the anthropic client did not raise")


def _assert_matches(failure: Failure, case: dict[str, Any]) -> None:
    expect = case["expect"]
    assert failure.kind == FailureKind(expect["kind"]), (case["id"], failure)
    for name in NUMBER_FIELDS:
        if name in expect:
            assert getattr(failure, name) == expect[name], (case["id"], name, failure)
        elif name != "retry_after":
            assert getattr(failure, name) is None, (case["id"], name, failure)
    assert failure.status == case["status"]
    _assert_reason_is_clean(failure.reason)


def _assert_reason_is_clean(reason: str) -> None:
    assert reason and "\n" not in reason
    assert len(reason) < 700
    assert "<html" not in reason.lower() and "<!doctype" not in reason.lower()
    assert "<div" not in reason.lower()


# --------------------------------------------------------------------------- corpus
# Every family issue 9 names, with the corpus files that cover it. A family with no public
# body found is listed with an empty tuple and the reason, so the gap stays visible.
FAMILIES: dict[str, tuple[str, ...]] = {
    "OpenAI": ("openai_",),
    "OpenAI Responses API": ("openai_responses_",),
    "CC Switch (a Codex proxy relaying /responses)": ("ccswitch_",),
    "Azure OpenAI (content filter, gateway)": ("azure_content_filter", "azure_401"),
    "Anthropic": ("anthropic_",),
    "Bedrock (Converse, InvokeModel, families)": ("bedrock_", "anthropic_via_bedrock"),
    "Vertex/Gemini": ("gemini_",),
    "Mistral": ("mistral_",),
    "Groq": ("groq_",),
    "Together": ("together_",),
    "DeepSeek": ("deepseek_",),
    "xAI": ("xai_",),
    "Cohere": ("cohere_",),
    "OpenRouter": ("openrouter_",),
    "LiteLLM proxy": ("litellm_",),
    "vLLM (old and new)": ("vllm_v0", "vllm_main", "vllm_max_tokens", "vllm_openai"),
    "TGI": ("tgi_",),
    "llama.cpp": ("llamacpp_",),
    "Ollama": ("ollama_",),
    "LM Studio": ("lmstudio_",),
    "nginx": ("nginx_", "openresty_"),
    "Apache": ("apache_",),
    "IIS": ("iis_",),
    "Cloudflare": ("cloudflare_",),
    "Akamai": ("akamai_",),
    "AWS ALB / API Gateway / WAF / CloudFront": ("awselb_", "aws_api_gateway", "aws_waf",
                                                 "cloudfront_", "aws_lambda"),
    "Azure Application Gateway WAF": ("azure_app_gateway",),
    "GCP load balancer / Cloud Armor": ("gfe_", "gcp_cloud_armor"),
    "F5": ("f5_",),
    "ModSecurity": ("apache_modsecurity", "nginx_403_modsecurity"),
    "Envoy/Istio": ("envoy_", "istio_"),
    "Kong": ("kong_",),
    "HAProxy": ("haproxy_",),
    "Squid": ("squid_",),
    # No public error body or wording was found for these (see the corpus report).
    "Fireworks": (),
    "Azure Front Door": (),
    "Traefik": (),
    "Zscaler / Netskope": (),
}


def test_corpus_covers_every_family_issue_9_names() -> None:
    ids = [case["id"] for case in CASES]
    for family, prefixes in FAMILIES.items():
        if prefixes:
            assert any(i.startswith(prefixes) for i in ids), family
    covered = [f for f, prefixes in FAMILIES.items() if prefixes]
    assert len(covered) >= 30


def test_corpus_cases_name_their_source_and_evidence() -> None:
    for case in CASES:
        assert len(case["source"].strip()) >= 20, case["id"]  # names where it was seen
        # "body": the whole response was seen; "wording": only the message text was, and the
        # envelope around it is the family's documented one.
        assert case.get("evidence", "body") in ("body", "wording"), case["id"]


def test_corpus_is_large_and_covers_every_kind() -> None:
    assert len(CASES) >= 120
    kinds = {case["expect"]["kind"] for case in CASES}
    # likely_payload is a connection drop, not an HTTP response: covered by the drop tests.
    assert kinds == {k.value for k in FailureKind} - {"likely_payload"}
    for case in CASES:
        assert case["source"].strip(), case["id"]
        assert isinstance(case["status"], int) and isinstance(case["body"], str)
    assert len({(c["status"], c["body"]) for c in CASES}) == len(CASES), "cases must differ"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_direct(case: dict[str, Any]) -> None:
    _assert_matches(classify(status=case["status"], body=case["body"],
                             headers=case["headers"]), case)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_direct_bytes_body(case: dict[str, Any]) -> None:
    _assert_matches(classify(status=case["status"], body=case["body"].encode("utf-8"),
                             headers=case["headers"]), case)


@pytest.fixture(scope="module")
def openai_client(server_url: str) -> Iterator[Any]:
    client = openai.OpenAI(base_url=f"{server_url}/case/any", api_key="test", max_retries=0,
                           timeout=20)
    yield client
    client.close()


@pytest.fixture(scope="module")
def anthropic_client(server_url: str) -> Iterator[Any]:
    client = anthropic.Anthropic(base_url=f"{server_url}/case/any", api_key="test", max_retries=0,
                                 timeout=20)
    yield client
    client.close()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_through_openai_sdk(openai_client: Any, case: dict[str, Any]) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        openai_client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Corpus-Case": case["id"]})
    _assert_matches(classify(info.value), case)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_through_anthropic_sdk(anthropic_client: Any, case: dict[str, Any]) -> None:
    with pytest.raises(anthropic.APIStatusError) as info:
        anthropic_client.messages.create(
            model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Corpus-Case": case["id"]})
    _assert_matches(classify(info.value), case)


# --------------------------------------------------------------------------- drops
DROPS = ["after_body", "reset", "early"]


@pytest.mark.parametrize("how", DROPS)
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_dropped_connection_depends_on_request_size(server_url: str, sdk: str, how: str) -> None:
    call = _openai_error if sdk == "openai" else _anthropic_error
    exc = call(f"{server_url}/drop/{how}", content="x" * LARGE)
    big = classify(exc, request_bytes=LARGE)
    assert big.kind is FailureKind.LIKELY_PAYLOAD, big
    assert big.request_bytes == LARGE and big.status is None
    assert "600 KB" in big.reason
    small = classify(exc, request_bytes=SMALL)
    assert small.kind is FailureKind.TRANSIENT, small
    # Its size and the way out if the "blip" keeps coming back at that size.
    assert f"while sending a {format_size(SMALL)} request" in small.reason
    assert f"set CHATCLI_MAX_PAYLOAD below {format_size(SMALL)}" in small.reason
    unknown = classify(exc)
    assert unknown.kind is FailureKind.TRANSIENT


@pytest.mark.parametrize(("sdk", "name", "kind"), [
    ("anthropic", "anthropic_overloaded", FailureKind.TRANSIENT),
    ("openai", "openai_llamacpp_overflow", FailureKind.CONTEXT_OVERFLOW),
    ("openai", "openai_server_error", FailureKind.TRANSIENT),
    ("openai", "openai_cut", FailureKind.TRANSIENT),
    ("anthropic", "anthropic_cut", FailureKind.TRANSIENT),
])
def test_errors_inside_a_200_stream(server_url: str, sdk: str, name: str,
                                    kind: FailureKind) -> None:
    call = _openai_error if sdk == "openai" else _anthropic_error
    exc = call(f"{server_url}/stream/{name}", content="x" * LARGE, stream=True)
    failure = classify(exc, request_bytes=LARGE)
    assert failure.kind is kind, failure
    assert failure.status is None
    _assert_reason_is_clean(failure.reason)
    if name == "openai_llamacpp_overflow":
        assert (failure.prompt_tokens, failure.limit_tokens) == (5000, 4096)


RESPONSES_CASES = [c for c in CASES if c["id"].startswith(("openai_responses_", "ccswitch_"))]


def test_the_corpus_holds_the_responses_api_errors() -> None:
    # Window, output limit (above the cap, under the floor), a 413 a gateway relays, a
    # previous_response_id the server does not have.
    kinds = {c["expect"]["kind"] for c in RESPONSES_CASES}
    assert {"context_overflow", "output_limit", "payload_too_large", "other"} <= kinds
    assert any(c["status"] == 413 and "/responses" in c["body"] for c in RESPONSES_CASES)


@pytest.mark.parametrize("case", RESPONSES_CASES, ids=[c["id"] for c in RESPONSES_CASES])
def test_responses_corpus_through_the_responses_endpoint(openai_client: Any,
                                                         case: dict[str, Any]) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        openai_client.responses.create(model="gpt-test", input="hi",
                                       extra_headers={"X-Corpus-Case": case["id"]})
    assert str(info.value.request.url).endswith("/responses")
    _assert_matches(classify(info.value), case)


def test_an_output_limit_names_the_responses_parameter() -> None:
    case = CASE_BY_ID["openai_responses_max_output_tokens_too_large"]
    failure = classify(status=case["status"], body=case["body"], headers=case["headers"])
    assert "max_output_tokens=32000" in failure.reason and "max_tokens=" not in failure.reason


def test_a_responses_stream_error_event_is_read_as_its_error(server_url: str) -> None:
    client = openai.OpenAI(base_url=f"{server_url}/stream/openai_responses_overflow",
                           api_key="test", max_retries=0, timeout=20)
    try:
        with pytest.raises(openai.APIError) as info:
            for _event in client.responses.create(model="gpt-test", input="hi", stream=True):
                pass
    finally:
        client.close()
    failure = classify(info.value, request_bytes=LARGE)
    assert failure.kind is FailureKind.CONTEXT_OVERFLOW and failure.status is None, failure
    _assert_reason_is_clean(failure.reason)


def test_drop_reason_names_the_root_cause(server_url: str) -> None:
    exc = _openai_error(f"{server_url}/drop/after_body")
    reason = classify(exc, request_bytes=LARGE).reason
    assert "Server disconnected" in reason or "RemoteProtocolError" in reason, reason


def test_threshold_is_the_settings_default() -> None:
    assert Settings().likely_payload_min_bytes == _classify.LIKELY_PAYLOAD_MIN_BYTES
    at = _classify.LIKELY_PAYLOAD_MIN_BYTES
    drop = ConnectionResetError(104, "Connection reset by peer")
    assert classify(drop, request_bytes=at).kind is FailureKind.TRANSIENT
    assert classify(drop, request_bytes=at + 1).kind is FailureKind.LIKELY_PAYLOAD


@pytest.mark.parametrize("exc", [
    ConnectionResetError(104, "Connection reset by peer"),
    BrokenPipeError(32, "Broken pipe"),
    ConnectionAbortedError("aborted"),
    httpx2.RemoteProtocolError("Server disconnected without sending a response."),
    httpx2.ReadError("[Errno 104] Connection reset by peer"),
    httpx2.WriteError("[Errno 32] Broken pipe"),
    EOFError("unexpected EOF"),
])
def test_os_and_httpx_drops(exc: BaseException) -> None:
    assert classify(exc, request_bytes=LARGE).kind is FailureKind.LIKELY_PAYLOAD
    assert classify(exc, request_bytes=SMALL).kind is FailureKind.TRANSIENT


@pytest.mark.parametrize("exc", [
    TimeoutError("timed out"),
    httpx2.PoolTimeout("pool timed out"),
    httpx2.ReadTimeout("The read operation timed out"),
    httpx2.WriteTimeout("The write operation timed out"),
    httpx2.ConnectTimeout("timed out"),
    httpx2.ConnectError("[Errno 111] Connection refused"),
    ConnectionRefusedError(111, "Connection refused"),
    socket.gaierror(-2, "Name or service not known"),
])
def test_timeouts_and_refused_connections_are_transient_whatever_the_size(
        exc: BaseException) -> None:
    assert classify(exc, request_bytes=LARGE).kind is FailureKind.TRANSIENT
    assert classify(exc).kind is FailureKind.TRANSIENT


def test_sdk_connection_error_reads_the_cause_chain() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    for sdk in (openai, anthropic):
        try:
            try:
                raise httpx2.ConnectError("[Errno 111] Connection refused")
            except httpx2.ConnectError as inner:
                raise sdk.APIConnectionError(request=request) from inner
        except sdk.APIConnectionError as exc:
            refused = exc
        assert classify(refused, request_bytes=LARGE).kind is FailureKind.TRANSIENT
        try:
            try:
                raise httpx2.RemoteProtocolError("Server disconnected without sending a response.")
            except httpx2.RemoteProtocolError as inner:
                raise sdk.APIConnectionError(request=request) from inner
        except sdk.APIConnectionError as exc:
            dropped = exc
        assert classify(dropped, request_bytes=LARGE).kind is FailureKind.LIKELY_PAYLOAD
        timeout = sdk.APITimeoutError(request=request)
        assert classify(timeout, request_bytes=LARGE).kind is FailureKind.TRANSIENT


def test_drop_words_in_a_bare_text() -> None:
    assert classify(body="read tcp: unexpected EOF", request_bytes=LARGE).kind \
        is FailureKind.LIKELY_PAYLOAD
    assert classify(body="stream error: stream ID 3; INTERNAL_ERROR",
                    request_bytes=SMALL).kind is FailureKind.TRANSIENT


# --------------------------------------------------------------------------- misfires
def test_413_inside_an_id_or_text_is_not_a_413() -> None:
    for body in ('{"error":{"message":"Invalid request (request id req_413413)"}}',
                 "upstream 4130 failed; trace 413-abc"):
        assert classify(status=400, body=body).kind is FailureKind.OTHER
        assert classify(body=body).kind is FailureKind.OTHER


def test_request_uri_too_long_is_not_an_overflow() -> None:
    assert classify(status=414, body="Request-URI Too Long").kind is FailureKind.OTHER
    assert classify(body="414 Request-URI Too Long").kind is FailureKind.OTHER


def test_403_json_auth_is_auth_even_behind_cloudflare() -> None:
    body = json.dumps({"type": "error", "error": {"type": "permission_error",
                                                  "message": "not allowed"}})
    headers = {"server": "cloudflare", "cf-ray": "1-SJC"}
    assert classify(status=403, body=body, headers=headers).kind is FailureKind.AUTH
    assert classify(status=403, body="").kind is FailureKind.AUTH
    assert classify(status=403, body="", headers=headers).kind is FailureKind.WAF_REJECTION
    assert classify(status=403, body="Forbidden", headers={"server": "AkamaiGHost"}).kind \
        is FailureKind.WAF_REJECTION
    assert classify(status=403, body="Request blocked by security policy").kind \
        is FailureKind.WAF_REJECTION


def test_spec_seed_wordings_without_status_are_overflows() -> None:
    for text in ("context length exceeded", "prompt is too long", "request too large",
                 "max_tokens exceed the limit", "input too long", "token limit reached",
                 "context_length_exceeded", "maximum context length", "input is too long",
                 "exceeds the maximum number of tokens", "too many tokens"):
        assert classify(body=text).kind is FailureKind.CONTEXT_OVERFLOW, text
        assert classify(body=text.upper()).kind is FailureKind.CONTEXT_OVERFLOW, text
    # ... but a rate limit that mentions tokens is not.
    assert classify(body="Rate limit exceeded: too many tokens per minute").kind \
        is FailureKind.TRANSIENT


def test_spec_seed_payload_wordings_without_status() -> None:
    for text in ("413 Payload Too Large", "Request Entity Too Large", "body too large",
                 "exceeds the maximum request size", "431 Request Header Fields Too Large"):
        assert classify(body=text).kind is FailureKind.PAYLOAD_TOO_LARGE, text


def test_httpx_status_error_is_read_like_an_sdk_error() -> None:
    case = CASE_BY_ID["gemini_native"]
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1beta/models/x:generateContent")
    response = httpx2.Response(case["status"], request=request, text=case["body"],
                               headers=case["headers"])
    try:
        response.raise_for_status()
    except httpx2.HTTPStatusError as exc:
        _assert_matches(classify(exc), case)
    else:  # pragma: no cover
        raise AssertionError("no HTTPStatusError")


def test_401_is_auth_whatever_the_body() -> None:
    assert classify(status=401, body="<html><title>401</title></html>").kind is FailureKind.AUTH


def test_retry_after_forms() -> None:
    ok = classify(status=429, body="slow down", headers={"Retry-After": "7"})
    assert ok.kind is FailureKind.TRANSIENT and ok.retry_after == 7.0
    ms = classify(status=529, body="", headers={"retry-after-ms": "1500"})
    assert ms.retry_after == 1.5
    date = classify(status=503, body="", headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert date.retry_after == 0.0
    assert classify(status=503, body="").retry_after is None


def test_chat_error_keeps_its_verdict() -> None:
    failure = classify(status=413, body="too big")
    again = classify(ChatError(failure), request_bytes=1234)
    assert again.kind is FailureKind.PAYLOAD_TOO_LARGE and again.request_bytes == 1234


def test_html_bodies_are_summarised_not_dumped() -> None:
    case = CASE_BY_ID["cloudflare_block_page_403"]
    failure = classify(status=403, body=case["body"], headers=case["headers"])
    assert failure.reason.startswith("A proxy returned HTTP 403 with an HTML block page")
    assert "Cloudflare" in failure.reason and "8f2b6c1d9e0a4b3c" in failure.reason
    assert "cf-wrapper" not in failure.reason


@settings(max_examples=300, deadline=None)
@given(status=st.one_of(st.none(), st.integers(100, 599)),
       body=st.one_of(st.none(), st.text(max_size=300), st.binary(max_size=100)),
       headers=st.one_of(st.none(), st.dictionaries(st.text(max_size=20),
                                                    st.text(max_size=40), max_size=4)),
       request_bytes=st.one_of(st.none(), st.integers(0, 10**8)))
def test_classify_never_raises(status: int | None, body: str | bytes | None,
                               headers: dict[str, str] | None,
                               request_bytes: int | None) -> None:
    failure = classify(status=status, body=body, headers=headers, request_bytes=request_bytes)
    assert isinstance(failure.kind, FailureKind) and failure.reason


# --------------------------------------------------------------------------- secrets
@pytest.mark.parametrize(("text", "secret"), [
    ("key sk-abcdefghijklmnopqrstuvwx1234 failed", "abcdefghijklmnopqrstuvwx1234"),
    ("key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv-123 failed", "AbCdEfGhIjKlMnOpQrStUv"),
    ("key sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123 failed", "AbCdEfGhIjKlMnOpQrStUvWxYz"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ("authorization=Bearer abcdefgh12345678", "abcdefgh12345678"),
    ('{"x-api-key": "sk-ant-api03-zzzzzzzzzzzzzzzz"}', "zzzzzzzzzzzzzzzz"),
    ("x-api-key: plainsecretvalue", "plainsecretvalue"),
    ("api-key=azuresecret0123456789", "azuresecret0123456789"),
    ("Proxy-Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("GET /v1/models?api_key=querysecret123", "querysecret123"),
    ("x-goog-api-key: AIzaSyA1234567890abcdefghijklmnopq", "1234567890abcdefghij"),
    ("https://generativelanguage.googleapis.com/v1?key=AIzaSyA1234567890abcdefghijklm",
     "1234567890abcdefghij"),
])
def test_redact_masks_secrets(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert "REDACTED" in masked


def test_redact_leaves_ordinary_text_alone() -> None:
    for text in ("prompt is too long: 202128 tokens > 200000 maximum (task-list, sk8ers)",
                 '{"code": "invalid_api_key", "type": "invalid_request_error"}',
                 "HTTP 401: authentication failed — check the API key: invalid x-api-key."):
        assert redact(text) == text


def test_reason_never_carries_a_key(server_url: str) -> None:
    key = "sk-proj-" + "Q" * 40
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {key}.",
                                 "code": "invalid_api_key", "type": "invalid_request_error"}})
    for failure in (classify(status=401, body=body),
                    classify(status=400, body=body),
                    classify(body=f"Authorization: Bearer {key} rejected")):
        assert key not in failure.reason and "Q" * 20 not in failure.reason
    error = ChatError(classify(status=401, body=body), message=f"failed with {key}")
    assert key not in str(error)


# --------------------------------------------------------------------------- every SDK type
def _sdk_exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module, base in ((openai, openai.OpenAIError), (anthropic, anthropic.AnthropicError)):
        for name in sorted(dir(module)):
            value = getattr(module, name, None)
            if isinstance(value, type) and issubclass(value, BaseException) and (
                    issubclass(value, base) or name.endswith("Error")):
                found[f"{module.__name__}.{value.__qualname__}"] = value
    try:  # anthropic's per-error_code subclasses, not all re-exported at the top level
        from anthropic._error_classes import ERROR_CLASSES
    except ImportError:  # pragma: no cover - private module moved
        ERROR_CLASSES = {}
    for cls in ERROR_CLASSES.values():
        found[f"anthropic.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


SDK_CLASSES = _sdk_exception_classes()


def _status_for(cls: type[BaseException]) -> int:
    try:
        from anthropic._error_classes import ERROR_CLASSES
        for (status, _code), value in ERROR_CLASSES.items():
            if value is cls:
                return status
    except ImportError:  # pragma: no cover
        pass
    declared = getattr(cls, "status_code", None)
    if isinstance(declared, int):
        return declared
    return 500 if "Server" in cls.__name__ else 400


def _instantiate(cls: type[BaseException]) -> BaseException:
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/messages")
    response = httpx2.Response(_status_for(cls), request=request,
                               json={"type": "error", "error": {"type": "api_error",
                                                                "message": "boom"}})
    body = {"type": "error", "error": {"type": "api_error", "message": "boom"}}

    def completion() -> Any:
        from openai.types.chat import ChatCompletion
        return ChatCompletion.model_construct(id="x", choices=[], created=0, model="m",
                                              object="chat.completion", usage=None)

    attempts = (
        lambda: cls("boom", response=response, body=body),  # type: ignore[call-arg]
        lambda: cls(response=response, body=body),  # type: ignore[call-arg]
        lambda: cls(response, body),
        lambda: cls(request=request),  # type: ignore[call-arg]
        lambda: cls("boom", request, body=body),  # type: ignore[call-arg]
        lambda: cls("boom", unsent_messages=[]),  # type: ignore[call-arg]
        lambda: cls(completion=completion()),  # type: ignore[call-arg]
        lambda: cls("boom"),
        lambda: cls(),
    )
    errors = []
    for attempt in attempts:
        try:
            return attempt()
        except TypeError as exc:
            errors.append(exc)
    raise AssertionError(f"cannot construct {cls!r}: {errors}")


@pytest.mark.parametrize("cls", SDK_CLASSES, ids=[c.__qualname__ for c in SDK_CLASSES])
def test_every_sdk_exception_type_maps_to_a_kind(cls: type[BaseException]) -> None:
    exc = _instantiate(cls)
    failure = classify(exc)
    assert isinstance(failure.kind, FailureKind)
    assert failure.reason
    assert classify(exc, request_bytes=LARGE).kind in set(FailureKind)


def test_sdk_exception_walk_found_the_core_types() -> None:
    names = {c.__qualname__ for c in SDK_CLASSES}
    assert {"APIConnectionError", "APITimeoutError", "RateLimitError", "AuthenticationError",
            "OverloadedError", "ContentTooLargeError", "LengthFinishReasonError",
            "CredentialsError"} <= names
    assert len(SDK_CLASSES) > 40


@pytest.mark.parametrize(("name", "kind"), [
    ("AuthenticationError", FailureKind.AUTH),
    ("RateLimitError", FailureKind.TRANSIENT),
    ("InternalServerError", FailureKind.TRANSIENT),
    ("APITimeoutError", FailureKind.TRANSIENT),
    ("APIConnectionError", FailureKind.TRANSIENT),
])
def test_known_sdk_types_map_sensibly(name: str, kind: FailureKind) -> None:
    for module in (openai, anthropic):
        assert classify(_instantiate(getattr(module, name))).kind is kind, (module, name)
    assert classify(_instantiate(anthropic.OverloadedError)).kind is FailureKind.TRANSIENT
    assert classify(_instantiate(anthropic.ContentTooLargeError)).kind \
        is FailureKind.PAYLOAD_TOO_LARGE
    assert classify(_instantiate(anthropic.CredentialsError)).kind is FailureKind.AUTH


# --------------------------------------------------------------------------- precedence properties
# The rules in _classify's module docstring, as properties over generated bodies.
AUTH_403_BODIES = [c for c in CASES if c["status"] == 403 and c["expect"]["kind"] == "auth"]
BLOCK_PHRASES = ["Request blocked by the web application firewall.", "Blocked by WAF rule 942100",
                 "This request was blocked by the security policy.",
                 "The requested URL was rejected. Please consult with your administrator.",
                 "Request forbidden by administrative rules."]
WEAK_HEADERS = [{"server": "cloudflare", "cf-ray": "8f2b6c1d9e0a4b3c-SJC"},
                {"server": "AkamaiGHost"}, {"server": "awselb/2.0"},
                {"server": "cloudflare"}]
# Noise that cannot itself be block evidence (free text could spell "WEB FILTER").
_words = st.text(alphabet="0123456789abcdef-", max_size=40).map(
    lambda s: f" (request {s})" if s else "")


def _auth_403_body(draw: Any) -> tuple[str, dict[str, str]]:
    """A 403 that carries auth evidence: a real corpus one or a structured auth error."""
    if draw(st.booleans()):
        case = draw(st.sampled_from(AUTH_403_BODIES))
        return case["body"], dict(case["headers"])
    etype = draw(st.sampled_from(sorted(_classify.P.AUTH_TYPES)))
    message = draw(st.sampled_from(["Your API key does not have permission to use the model.",
                                    "Invalid token", "not allowed to sample from this model"]))
    return json.dumps({"error": {"type": etype, "message": message + draw(_words)}}), \
        {"content-type": "application/json"}


@st.composite
def auth_403(draw: Any) -> tuple[str, dict[str, str]]:
    return _auth_403_body(draw)


@settings(max_examples=150, deadline=None)
@given(auth=auth_403(), phrase=st.sampled_from(BLOCK_PHRASES), how=st.sampled_from(
    ["header", "message", "body"]))
def test_block_evidence_turns_any_403_auth_body_into_a_waf_rejection(
        auth: tuple[str, dict[str, str]], phrase: str, how: str) -> None:
    body, headers = auth
    assert classify(status=403, body=body, headers=headers).kind is FailureKind.AUTH
    if how == "header":
        headers = {**headers, "x-amzn-waf-action": "block"}
    elif not body.startswith("{"):  # a plain-text 403 (Istio's "RBAC: access denied")
        body = f"{body}\n{phrase}"
    elif how == "message":
        parsed = json.loads(body)
        inner = parsed.get("error", parsed)
        inner["message"] = f"{inner.get('message', '')} {phrase}"
        body = json.dumps(parsed)
    else:
        body = json.dumps({"message": phrase, "detail": json.loads(body)})
    assert classify(status=403, body=body, headers=headers).kind is FailureKind.WAF_REJECTION


@settings(max_examples=100, deadline=None)
@given(auth=auth_403(), weak=st.sampled_from(WEAK_HEADERS))
def test_weak_proxy_headers_never_outweigh_auth_evidence(
        auth: tuple[str, dict[str, str]], weak: dict[str, str]) -> None:
    body, headers = auth
    assert classify(status=403, body=body, headers={**headers, **weak}).kind is FailureKind.AUTH
    # ... but decide a 403 that says nothing about credentials.
    assert classify(status=403, body='{"message": "Forbidden"}', headers=weak).kind \
        is FailureKind.WAF_REJECTION


_ids_with_413 = st.builds(lambda a, b: f"{a}413{b}", st.text("0123456789abcdef", max_size=8),
                          st.text("0123456789abcdef", max_size=8))


@settings(max_examples=200, deadline=None)
@given(status=st.one_of(st.none(), st.integers(400, 599).filter(lambda s: s not in (413, 431))),
       ident=_ids_with_413, where=st.sampled_from(["message", "request_id", "header"]))
def test_a_413_inside_an_identifier_never_makes_a_payload_failure(
        status: int | None, ident: str, where: str) -> None:
    error: dict[str, Any] = {"message": "Something went wrong.", "type": "server_error"}
    body: dict[str, Any] = {"error": error}
    headers = {"content-type": "application/json"}
    if where == "message":
        error["message"] = f"Something went wrong (request id req_{ident}, code {ident})."
    elif where == "request_id":
        body["request_id"] = f"req_{ident}"
    else:
        headers["x-request-id"] = ident
    failure = classify(status=status, body=json.dumps(body), headers=headers)
    assert failure.kind is not FailureKind.PAYLOAD_TOO_LARGE


_any_text = st.sampled_from([c["body"] for c in CASES] + ["prompt is too long", "blocked by WAF",
                                                          "413 Payload Too Large", ""])


@settings(max_examples=150, deadline=None)
@given(body=_any_text, status=st.sampled_from([401, 413, 414, 431]))
def test_statuses_no_text_can_change(body: str, status: int) -> None:
    failure = classify(status=status, body=body)
    if status == 401:
        assert failure.kind is FailureKind.AUTH
    elif status == 414:
        assert failure.kind is FailureKind.OTHER
    elif status == 431:
        assert failure.kind is FailureKind.PAYLOAD_TOO_LARGE
    else:  # 413: bytes, or tokens when the body states a token count over a token limit
        assert failure.kind in (FailureKind.PAYLOAD_TOO_LARGE, FailureKind.CONTEXT_OVERFLOW)
        if failure.kind is FailureKind.CONTEXT_OVERFLOW:
            assert failure.prompt_tokens is not None and failure.limit_tokens is not None


# Wordings with numbers: (template, fields it carries). Every number must land in its field.
NUMERIC_WORDINGS = [
    ("This model's maximum context length is {lim} tokens. However, you requested {o} output "
     "tokens and your prompt contains at least {p} input tokens, for a total of at least "
     "{total} tokens.", "plo"),
    ("This model's maximum context length is {lim} tokens. However, you requested {o} output "
     "tokens and your prompt contains {p} input tokens, for a total of {total} tokens.", "plo"),
    ("You passed {p} input tokens and requested {o} output tokens. However, the model's "
     "context length is only {lim} tokens, resulting in a maximum input length of 1 tokens.",
     "plo"),
    ("This model's maximum context length is {lim} tokens. However, your request has {p} input "
     "tokens. Please reduce the length of the input messages.", "pl"),
    ("This model's maximum context length is {lim} tokens. However, you requested {total} "
     "tokens ({p} in the messages, {o} in the completion).", "plo"),
    ("This model's maximum context length is {lim} tokens. However, your messages resulted in "
     "{p} tokens.", "pl"),
    ("prompt is too long: {p} tokens > {lim} maximum", "pl"),
    ("input length and `max_tokens` exceed context limit: {p} + {o} > {lim}, decrease input "
     "length or `max_tokens` and try again", "plo"),
    ("The input token count ({p}) exceeds the maximum number of tokens allowed ({lim}).", "pl"),
    ("The number of tokens to keep from the initial prompt is greater than the context length "
     "(n_keep: {p}>= n_ctx: {lim}).", "pl"),
    ("The input ({p} tokens) is longer than the model's context length ({lim} tokens).", "pl"),
    ("Prompt contains {p} tokens and 0 draft tokens, too large for model with {lim} maximum "
     "context length", "pl"),
    ("request ({p} tokens) exceeds the available context size ({lim} tokens)", "pl"),
    ("Input validation error: `inputs` tokens + `max_new_tokens` must be <= {lim}. Given: {p} "
     "`inputs` tokens and {o} `max_new_tokens`", "plo"),
    ("Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit {lim}, "
     "Requested {p}. The input or output tokens must be reduced.", "pl"),
]
OUTPUT_WORDINGS = [
    ("max_tokens is too large: {o}. This model supports at most {lim} completion tokens, "
     "whereas you provided {o}.", "lo"),
    ("max_tokens: {o} > {lim}, which is the maximum allowed number of output tokens for "
     "claude-x", "lo"),
    ("The maximum tokens you requested exceeds the model limit of {lim}. Try again with a "
     "maximum tokens value that is lower than {lim}.", "l"),
    ("max_tokens={o} cannot be greater than max_model_len=max_total_tokens={lim}. Please "
     "request fewer output tokens.", "lo"),
]
_count = st.integers(1, 10_000_000)


@settings(max_examples=300, deadline=None)
@given(wording=st.sampled_from(NUMERIC_WORDINGS), p=_count, o=_count, lim=_count,
       status=st.sampled_from([400, 422, 500, None]), wrap=st.booleans())
def test_overflow_numbers_are_read_into_the_failure(wording: tuple[str, str], p: int, o: int,
                                                    lim: int, status: int | None,
                                                    wrap: bool) -> None:
    template, fields = wording
    text = template.format(p=p, o=o, lim=lim, total=p + o)
    body = json.dumps({"error": {"message": text, "type": "invalid_request_error"}}) \
        if wrap else text
    failure = classify(status=status, body=body)
    assert failure.kind is FailureKind.CONTEXT_OVERFLOW, (text, failure)
    assert failure.prompt_tokens == p and failure.limit_tokens == lim
    assert failure.output_tokens == (o if "o" in fields else None)


@settings(max_examples=150, deadline=None)
@given(wording=st.sampled_from(OUTPUT_WORDINGS), o=_count, lim=_count)
def test_output_limits_win_over_overflow_and_carry_their_numbers(
        wording: tuple[str, str], o: int, lim: int) -> None:
    template, fields = wording
    failure = classify(status=400, body=json.dumps({"message": template.format(o=o, lim=lim)}))
    assert failure.kind is FailureKind.OUTPUT_LIMIT
    assert failure.limit_tokens == lim
    assert failure.output_tokens == (o if "o" in fields else None)


@settings(max_examples=150, deadline=None)
@given(word=st.sampled_from(["too many tokens", "token limit", "request too large",
                             "input is too long", "prompt too long"]),
       marker=st.sampled_from(["please wait before trying again", "rate limit", "per minute",
                               "try again in 20s"]))
def test_a_rate_limit_marker_vetoes_weak_overflow_words(word: str, marker: str) -> None:
    failure = classify(status=429, body=f"{word}, {marker}")
    assert failure.kind is FailureKind.TRANSIENT


def test_issue_9_cases() -> None:
    """The four responses issue 9 reported misclassified."""
    ollama = classify(status=400, body=CASE_BY_ID["ollama_openai_embed_no_numbers"]["body"])
    assert ollama.kind is FailureKind.CONTEXT_OVERFLOW
    bedrock = classify(status=400,
                       body=CASE_BY_ID["bedrock_invoke_max_tokens_over_model_limit"]["body"])
    assert (bedrock.kind, bedrock.limit_tokens) == (FailureKind.OUTPUT_LIMIT, 4096)
    waf = classify(status=403, body=json.dumps({"message": "Forbidden", "error": {
        "type": "authentication_error", "message": "Request blocked by AWS WAF"}}))
    assert waf.kind is FailureKind.WAF_REJECTION
    vllm = classify(status=400, body=CASE_BY_ID["vllm_v030_prompt_contains_at_least"]["body"])
    assert (vllm.prompt_tokens, vllm.output_tokens, vllm.limit_tokens) == (4097, 4096, 8192)


@pytest.mark.parametrize("body_bytes", [700, 2_000_000])
def test_a_redirect_loop_is_named_not_taken_for_a_drop_whatever_the_size(body_bytes: int) -> None:
    # httpx2 raises TooManyRedirects with the request it would have sent next; the SDKs
    # wrap it in their APIConnectionError.
    url = "https://user:pw@portal.example/login?sig=abc123&next=/v1"
    loop = httpx2.TooManyRedirects("Exceeded maximum allowed redirects.",
                                   request=httpx2.Request("POST", url))
    wrapped = openai.APIConnectionError(request=httpx2.Request("POST", "https://api.x/v1"))
    wrapped.__cause__ = loop
    for error in (loop, wrapped):
        failure = classify(error, request_bytes=body_bytes)
        assert failure.kind is FailureKind.OTHER and failure.signature is None
        assert failure.reason == (
            "The request ran into a redirect loop: the server kept redirecting it until the "
            "client gave up, last to https://[REDACTED]@portal.example/login?sig=[REDACTED]"
            "&next=/v1; check the base URL — a proxy or a login page that redirects every "
            "request is answering for the API.")
    bare = classify(httpx2.TooManyRedirects("Exceeded maximum allowed redirects."))
    assert bare.kind is FailureKind.OTHER
    assert bare.reason.startswith("The request ran into a redirect loop: the server kept "
                                  "redirecting it until the client gave up; check")
