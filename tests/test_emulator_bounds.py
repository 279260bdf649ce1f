"""The emulator's bounds: a ring of request records with a body budget, a cap on what a
request may carry, and a per-instance token (off in the standalone CLI unless asked)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import openai
import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.server import TOKEN_HEADER
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers import make_provider

TIMEOUT = 20


def raw_post(emu: Emulator, head: dict[str, str], body: bytes = b"",
             path: str = "/v1/chat/completions") -> tuple[int, dict[str, Any]]:
    """POST with exactly these headers (Content-Length may promise more than is sent)."""
    with socket.create_connection(("127.0.0.1", emu.port), timeout=TIMEOUT) as sock:
        lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{emu.port}",
                 *(f"{k}: {v}" for k, v in head.items()), "", ""]
        sock.sendall("\r\n".join(lines).encode() + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected(data):
            chunk = sock.recv(65536)  # the timeout guards against a server waiting for more
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")


def _expected(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return 0


def chat_body(text: str) -> bytes:
    return json.dumps({"model": "emulator",
                       "messages": [{"role": "user", "content": text}]}).encode()


def test_records_are_a_ring_and_bodies_fit_a_budget(emulator: Callable[..., Emulator]) -> None:
    emu = emulator(context_window=1_000_000, keep_requests=50, keep_body_bytes="64KB")
    client = emu.openai_client(max_retries=0)
    for i in range(120):
        client.chat.completions.create(model="emulator",
                                       messages=[{"role": "user", "content": f"{i} " * 2500}])
    records = emu.requests
    assert emu.received == 120 and len(records) == 50          # counters stay exact
    assert all(r.status == 200 and r.body_bytes > 5000 for r in records)
    kept = [r for r in records if r.raw is not None]
    assert 0 < sum(len(r.raw or b"") for r in kept) <= 64 * 1024
    assert records[-1].body["messages"][0]["content"].startswith("119 ")  # newest: whole
    assert records[0].raw is None and records[0].body is None  # oldest: size only
    assert records.index(kept[0]) == len(records) - len(kept)  # bodies kept are the newest
    emu.reset()
    assert emu.received == 0 and emu.requests == []


def test_a_body_over_the_cap_is_refused_without_being_read(
        emulator: Callable[..., Emulator]) -> None:
    emu = emulator(max_request_body="1MB")
    emu.script("429")
    # Promises 200 MB, sends none of it: the answer comes anyway, no fault is consumed.
    status, body = raw_post(emu, {**emu.token_headers, "Content-Length": "200000000",
                                  "Content-Type": "application/json"})
    assert status == 413 and "max_request_body" in body["error"]["message"]
    assert [(r.status, r.fault, r.raw) for r in emu.requests] == \
        [(413, "max_request_body", None)]
    assert len(emu.pending_faults) == 1
    # Chunked: reading stops at the cap.
    chunk = b"x" * 600_000
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(2)) + b"0\r\n\r\n"
    status, _ = raw_post(emu, {**emu.token_headers, "Transfer-Encoding": "chunked"}, chunked)
    assert status == 413
    # Through the SDK, it is a payload failure like any 413.
    client = emu.openai_client(max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="emulator",
                                       messages=[{"role": "user", "content": "y" * 1_200_000}])
    assert classify(info.value).kind is FailureKind.PAYLOAD_TOO_LARGE


def test_requests_without_the_token_get_401_and_change_nothing(
        emulator: Callable[..., Emulator]) -> None:
    emu = emulator()
    assert emu.token and len(emu.token) >= 24
    emu.script("429", "drop")
    for head in ({}, {TOKEN_HEADER: "guess"}, {"Authorization": "Bearer sk-someone-else"}):
        status, body = raw_post(emu, {**head, "Content-Length": str(len(chat_body("hi")))},
                                chat_body("hi"))
        assert status == 401 and TOKEN_HEADER in body["error"]["message"]
        assert "\n" not in body["error"]["message"]
    # 200 MB announced by another process: refused at once, nothing buffered or recorded.
    status, _ = raw_post(emu, {"Content-Length": "200000000"})
    assert status == 401
    request = urllib.request.Request(emu.openai_base_url + "/models")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=TIMEOUT)
    assert info.value.code == 401
    assert emu.requests == [] and emu.refused == 5
    assert [f.label for f in emu.pending_faults] == ["429", "drop"]  # still the notebook's
    # The token is accepted as the API key too (any OpenAI-compatible client).
    status, _ = raw_post(emu, {"Authorization": f"Bearer {emu.token}",
                               "Content-Length": str(len(chat_body("hi")))}, chat_body("hi"))
    assert status == 429


@pytest.mark.parametrize("spec", ["emulator", "emulator:anthropic"])
def test_the_products_own_clients_send_the_token(emulator: Callable[..., Emulator],
                                                 spec: str) -> None:
    emu = emulator()
    provider = make_provider(spec, emulator=emu, max_retries=0)
    session = ChatSession(spec, provider=provider, settings=Settings(), name="token-user")
    assert session.send("hello").text.startswith("Emulator reply")
    assert [r.status for r in emu.requests] == [200] and emu.refused == 0
    session.close()
    provider.close()
    # A session that starts its own emulator, as %%chat does.
    with ChatSession(spec, settings=Settings(), name="own-emulator") as own:
        assert own.send("hi").text.startswith("Emulator reply")
        assert own.provider.emulator.token  # type: ignore[attr-defined]


def test_an_emulator_without_a_token_admits_anyone(emulator: Callable[..., Emulator]) -> None:
    emu = emulator(token=None)
    status, _ = raw_post(emu, {"Content-Length": str(len(chat_body("hi")))}, chat_body("hi"))
    assert status == 200 and emu.token_headers == {}


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ipy_ctxrecovery.emulator", "--port", "0",
                             "--quiet", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _post(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url + "/chat/completions", data=chat_body("curl"),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("token", [None, "s3cret-token", ""])
def test_the_cli_needs_a_token_only_when_asked(token: str | None) -> None:
    proc = _cli(*([] if token is None else ["--token", *([token] if token else [])]))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        proc.stdout.readline()
        if token is None:                       # curl works as is
            assert _post(url, {}) == 200
        else:
            shown = proc.stdout.readline()
            assert shown.startswith("Token:")
            secret = shown.split()[1]
            assert secret == token or (not token and len(secret) >= 24)
            assert _post(url, {}) == 401
            assert _post(url, {TOKEN_HEADER: secret}) == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=TIMEOUT)
