"""A real second-hand gateway: LiteLLM's proxy (PyPI ``litellm[proxy]``) in front of the emulator.

The proxy re-wraps every upstream error in its own envelope ("litellm.ContextWindowExceededError:
… OpenAIException - …", ``code: "413"``); a ChatSession talking to the proxy through the real
openai SDK must still classify a context overflow, a 413 and an output-limit rejection, and
recover from each. The proxy runs offline: ``LITELLM_LOCAL_MODEL_COST_MAP=True`` keeps it from
fetching its model price map, telemetry is off, and its only upstream is the emulator on
127.0.0.1. Locally the tests skip with one line when litellm is not installed (``pip install
-e '.[gateway]'``); under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from needs import unavailable

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.classify import classify
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.failures import FailureKind

pytestmark = pytest.mark.gateway

MODEL = "gw-model"
START_TIMEOUT = 120.0
TIMEOUT = 60.0
SMALL = Settings(per_result_max_chars=2_000, turn_budget_chars=6_000, budget_head_chars=800,
                 budget_tail_chars=200, microcompact_min_chars=600,
                 microcompact_head_chars=300, microcompact_tail_chars=100)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def litellm_available() -> None:
    if importlib.util.find_spec("litellm") is None:
        unavailable("litellm is not installed (pip install -e '.[gateway]'); the LiteLLM "
                    "gateway tests cannot run")


@pytest.fixture(scope="module")
def gateway(litellm_available: None, upstream: Emulator,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A LiteLLM proxy on 127.0.0.1 whose one model is the emulator; yields (url, key)."""
    home = tmp_path_factory.mktemp("litellm")
    config = home / "config.yaml"
    config.write_text(f"""model_list:
  - model_name: {MODEL}
    litellm_params:
      model: openai/{MODEL}
      api_base: {upstream.openai_base_url}
      api_key: {upstream.token}
litellm_settings:
  num_retries: 0
  request_timeout: {int(TIMEOUT)}
  telemetry: false
""")
    key = "sk-" + secrets.token_hex(32)
    port = _free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": key,
           "LITELLM_TELEMETRY": "False", "HOME": str(home), "NO_PROXY": "127.0.0.1,localhost",
           "no_proxy": "127.0.0.1,localhost"}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "DATABASE_URL"):
        env.pop(name, None)
    log = home / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys, litellm; sys.argv[0] = 'litellm'; "
             "litellm.run_server()", "--config", str(config), "--host", "127.0.0.1",
             "--port", str(port), "--num_workers", "1"],
            cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, log)
        yield f"http://127.0.0.1:{port}", key
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import httpx2

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the LiteLLM proxy exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx2.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the LiteLLM proxy did not answer within {START_TIMEOUT}s: "
                       f"{log.read_text(errors='replace')[-3000:]}")


def _client(gateway: tuple[str, str]) -> Any:
    url, key = gateway
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)


def _session(gateway: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             **kwargs: Any) -> ChatSession:
    monkeypatch.chdir(tmp_path)  # conftest already points IPY_CTXRECOVERY_DIR at a temp dir
    return ChatSession(f"openai:{MODEL}", client=_client(gateway), settings=SMALL,
                       builtin_tools=False, sleep=lambda _s: None, **kwargs)


def _converse(session: ChatSession, turns: int, size: int) -> list[str]:
    return [session.send(f"turn {i}: " + "lorem ipsum " * (size // 12), stream=False).text
            for i in range(turns)]


def _rejected(upstream: Emulator, since: int) -> list[int | None]:
    return [r.status for r in upstream.requests[since:] if r.status != 200]


def test_overflow_rewrapped_by_the_gateway_classifies_and_recovers(
        gateway: tuple[str, str], upstream: Emulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    upstream.reset()
    upstream.configure(context_window=3_000, max_output_tokens=None, max_body=None)
    with pytest.raises(openai.BadRequestError) as info:
        _client(gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 20_000}])
    assert "litellm.ContextWindowExceededError" in str(info.value)
    failure = classify(info.value)
    assert failure.kind is FailureKind.CONTEXT_OVERFLOW, failure
    assert failure.limit_tokens == 3_000 and failure.prompt_tokens is not None

    session = _session(gateway, tmp_path, monkeypatch, max_tokens=200)
    start = len(upstream.requests)
    replies = _converse(session, turns=8, size=2_400)
    assert all(r.startswith("Emulator reply") for r in replies)
    assert 400 in _rejected(upstream, start + 1)  # the window was hit through the gateway …
    assert upstream.requests[-1].status == 200  # … and the session recovered


def test_413_rewrapped_by_the_gateway_classifies_and_recovers(
        gateway: tuple[str, str], upstream: Emulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    upstream.reset()
    upstream.configure(context_window=1_000_000, max_output_tokens=None, max_body="12KB")
    with pytest.raises(openai.APIStatusError) as info:
        _client(gateway).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 20_000}])
    assert info.value.status_code == 413
    assert classify(info.value).kind is FailureKind.PAYLOAD_TOO_LARGE

    session = _session(gateway, tmp_path, monkeypatch)
    start = len(upstream.requests)
    replies = _converse(session, turns=8, size=2_400)
    assert all(r.startswith("Emulator reply") for r in replies)
    assert 413 in _rejected(upstream, start)
    assert upstream.requests[-1].status == 200


def test_output_limit_rewrapped_by_the_gateway_classifies_and_recovers(
        gateway: tuple[str, str], upstream: Emulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    upstream.reset()
    upstream.configure(context_window=1_000_000, max_output_tokens=100, max_body=None)
    with pytest.raises(openai.BadRequestError) as info:
        _client(gateway).chat.completions.create(
            model=MODEL, max_tokens=500, messages=[{"role": "user", "content": "hi"}])
    failure = classify(info.value)
    assert failure.kind is FailureKind.OUTPUT_LIMIT, failure
    assert (failure.limit_tokens, failure.output_tokens) == (100, 500)

    session = _session(gateway, tmp_path, monkeypatch, max_tokens=500)
    start = len(upstream.requests)
    reply = session.send("hello through the gateway", stream=False)
    assert reply.text.startswith('Emulator reply: you said "hello through the gateway"')
    statuses = [r.status for r in upstream.requests[start:]]
    assert statuses[0] == 400 and statuses[-1] == 200
    assert upstream.requests[-1].body.get("max_tokens", 100) <= 100
