"""Real nginx in front of the emulator: a genuine nginx 413 reaches the SDK and is classified.

Needs the nginx binary (Debian's nginx-light; ``.ci/run`` installs it). Locally the tests
skip with the reason when it is absent; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.failures import FailureKind

pytestmark = pytest.mark.nginx

CLIENT_MAX_BODY = 16 * 1024
START_TIMEOUT = 15.0
TIMEOUT = 20.0


def _nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace') if log.exists() else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on 127.0.0.1:{port} within {START_TIMEOUT}s")


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    binary = _nginx_binary()
    if binary is None:
        reason = ("nginx is not installed (apt-get install nginx-light); the real-nginx 413 "
                  "test cannot run")
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}, and CI=true requires it.")
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="module")
def upstream() -> Iterator[Emulator]:
    with Emulator(context_window=1_000_000) as emu:
        yield emu


@pytest.fixture(scope="module")
def nginx(nginx_binary: str, upstream: Emulator,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A non-daemon nginx reverse proxy (client_max_body_size 16k) in front of the emulator;
    yields its root URL and is stopped at teardown."""
    prefix = tmp_path_factory.mktemp("nginx")
    port = _free_port()
    log = prefix / "error.log"
    temp = "\n".join(f"  {name}_temp_path {prefix / name};"
                     for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = prefix / "nginx.conf"
    conf.write_text(f"""{user}daemon off;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {log} warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
{temp}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size {CLIENT_MAX_BODY // 1024}k;
    location / {{
      proxy_pass {upstream.url};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
""")
    proc = subprocess.Popen([nginx_binary, "-p", str(prefix), "-e", str(log), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def nginx_version(nginx_binary: str) -> str:
    out = subprocess.run([nginx_binary, "-v"], capture_output=True, text=True, timeout=TIMEOUT)
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
