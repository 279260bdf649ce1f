"""Real nginx in front of the emulator: a genuine nginx 413 reaches the SDK and is classified.

Needs the nginx binary (Debian's nginx-light; ``.ci/run`` installs it); nginx is started by
the ``middlebox`` fixture (tests/middleboxes.py). Locally the tests skip with the reason
when it is absent; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import anthropic
import openai
import pytest
from middleboxes import Middlebox, binary

from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.failures import FailureKind

pytestmark = pytest.mark.nginx

CLIENT_MAX_BODY = 16 * 1024
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def nginx(middlebox: Callable[..., Middlebox], upstream: Emulator) -> str:
    """A real nginx reverse proxy (client_max_body_size 16k) in front of the emulator, from
    tests/middleboxes.py; yields its root URL and is stopped at the module's end."""
    return middlebox("nginx-413", upstream.url, limit=CLIENT_MAX_BODY).url


@pytest.fixture(scope="module")
def nginx_version(nginx: str) -> str:
    exe = binary("nginx-413")
    assert exe is not None  # the nginx fixture has started it
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=TIMEOUT)
    match = re.search(r"nginx/(\S+)", out.stderr + out.stdout)
    assert match, out
    return match.group(1)


def _genuine_413(server: str) -> bytes:
    # nginx's ngx_http_error_413_page + ngx_http_error_tail with server_tokens on.
    return (b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
            b"<center><h1>413 Request Entity Too Large</h1></center>\r\n"
            b"<hr><center>" + server.encode() + b"</center>\r\n</body>\r\n</html>\r\n")


@pytest.mark.parametrize("stream", [False, True])
def test_real_nginx_413_reaches_the_openai_sdk(nginx: str, upstream: Emulator,
                                               nginx_version: str, stream: bool) -> None:
    upstream.reset()
    client = openai.OpenAI(base_url=nginx + "/v1", api_key="sk-test", max_retries=0,
                           timeout=TIMEOUT, default_headers=upstream.token_headers)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="emulator", stream=stream,
            messages=[{"role": "user", "content": "x" * (CLIENT_MAX_BODY + 1000)}])
    exc = info.value
    assert exc.status_code == 413
    assert exc.response.headers["server"] == f"nginx/{nginx_version}"
    assert exc.response.headers["content-type"] == "text/html"
    assert exc.response.content == _genuine_413(f"nginx/{nginx_version}")
    failure = classify(exc, request_bytes=CLIENT_MAX_BODY + 1000)
    assert failure.kind is FailureKind.PAYLOAD_TOO_LARGE
    assert failure.status == 413
    assert upstream.requests == []  # nginx stopped it: the emulator never saw the request


def test_real_nginx_413_reaches_the_anthropic_sdk(nginx: str, upstream: Emulator) -> None:
    upstream.reset()
    client = anthropic.Anthropic(base_url=nginx, api_key="sk-ant-test", max_retries=0,
                                 timeout=TIMEOUT, default_headers=upstream.token_headers)
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(model="claude-emulator", max_tokens=10,
                               messages=[{"role": "user", "content": "x" * 20_000}])
    assert info.value.status_code == 413
    assert info.value.response.headers["server"].startswith("nginx")
    assert classify(info.value).kind is FailureKind.PAYLOAD_TOO_LARGE
    assert upstream.requests == []


def test_small_requests_pass_through_nginx(nginx: str, upstream: Emulator) -> None:
    upstream.reset()
    client = openai.OpenAI(base_url=nginx + "/v1", api_key="sk-test", max_retries=0,
                           timeout=TIMEOUT, default_headers=upstream.token_headers)
    reply = client.chat.completions.create(
        model="emulator", messages=[{"role": "user", "content": "through the proxy"}])
    assert (reply.choices[0].message.content or "").startswith(
        'Emulator reply: you said "through the proxy"')
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="emulator", stream=True,
            messages=[{"role": "user", "content": "[[words 40]]"}])
        if chunk.choices)
    assert streamed == " ".join(f"w{i}" for i in range(1, 41))
    assert [(r.path, r.status) for r in upstream.requests] == \
        [("/v1/chat/completions", 200), ("/v1/chat/completions", 200)]
