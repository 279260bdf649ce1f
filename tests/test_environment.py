"""What the kernel's environment shows: the load line and ``%chat status`` name where
requests go, with the credentials a base URL carries masked — its user info and the
values of credential query parameters — and what is not a credential still shown.

The whole path a user takes: ``OPENAI_BASE_URL`` set, ``%load_ext``, a ``%%chat`` cell
answered by a gateway that echoes what it received in a 401, ``%chat status``.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from auth_echo import auth_echo
from IPython.core.error import UsageError
from test_magics import cell, ip  # noqa: F401  (fixtures)

from ipy_ctxrecovery import ChatSession
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.notebook.environment import describe_endpoint
from ipy_ctxrecovery.redaction import MASK

BASIC_TOKEN = base64.b64encode(b"bob:hunter2pass").decode()

CASES = {
    "userinfo": ("http://bob:hunter2pass@127.0.0.1:{port}/v1",
                 ["hunter2pass", "bob:", BASIC_TOKEN], "http://[REDACTED]@127.0.0.1:{port}/v1"),
    # A key in a known format in the path (a gateway that takes it there).
    "path-key": ("http://127.0.0.1:{port}/gw/sk-proj-Abc123def456ghi789jkl/v1",
                 ["sk-proj-Abc123def456ghi789jkl"], "http://127.0.0.1:{port}/gw/[REDACTED]/v1"),
    # The session's own key in the path, in no known format (OWN_KEY is OPENAI_API_KEY).
    "path-own-key": ("http://127.0.0.1:{port}/team/gw7Team42Key0f9e/v1", ["gw7Team42Key0f9e"],
                     "http://127.0.0.1:{port}/team/[REDACTED]/v1"),
}
OWN_KEY = "gw7Team42Key0f9e"
# A query string in a base URL cannot work (the SDKs add the request path after it): said
# at setup, its credentials masked.
QUERY_CASES = {
    "query-key": ("http://127.0.0.1:{port}/v1?key=qs-secret-77", ["qs-secret-77"],
                  "http://127.0.0.1:{port}/v1?key=[REDACTED]"),
    "azure-sas": ("http://127.0.0.1:{port}/openai?api-version=2024-10-21&sig=Zm9vYmFyYmF6cXV4",
                  ["Zm9vYmFyYmF6cXV4"],
                  "http://127.0.0.1:{port}/openai?api-version=2024-10-21&sig=[REDACTED]"),
}


@contextlib.contextmanager
def loaded_behind(template: str, shell: Any, monkeypatch: pytest.MonkeyPatch,
                  ) -> Iterator[tuple[int, list[str]]]:
    """The extension loaded with OPENAI_BASE_URL = ``template`` (its ``{port}`` a local
    gateway that records the Authorization values it receives): yields the port and those."""
    with auth_echo() as (port, seen):
        monkeypatch.setenv("OPENAI_API_KEY", OWN_KEY if OWN_KEY in template
                           else "sk-test-not-used-0000000000")
        monkeypatch.setenv("OPENAI_BASE_URL", template.format(port=port))
        shell.run_line_magic("load_ext", "ipy_ctxrecovery")
        yield port, seen


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_base_url_with_credentials_is_masked_from_load_line_to_status(
        kind: str, ip: Any, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    template, secrets, masked = CASES[kind]
    with loaded_behind(template, ip, monkeypatch) as (port, seen):
        load_line = capsys.readouterr().out
        assert f" at {masked.format(port=port)} (no proxy);" in load_line
        result = cell(ip, "", "hello")
        assert seen                                  # the gateway was asked
        capsys.readouterr()
        ip.run_line_magic("chat", "status")
        status = capsys.readouterr().out
    assert isinstance(result.error_in_exec, UsageError)
    error = str(result.error_in_exec)
    assert "Incorrect API key provided" in error and MASK in error
    assert "endpoint: http://" in status and MASK in status
    for text in (load_line, error, status):
        assert [s for s in secrets if s in text] == [], text


def test_a_proxy_url_with_credentials_is_masked() -> None:
    shown = describe_endpoint("https://llm.example/v1", env={
        "HTTPS_PROXY": "http://alice:s3cretpass@proxy.example:3128/?token=tok-12345678"})
    assert shown == ("https://llm.example/v1 via proxy "
                     "http://[REDACTED]@proxy.example:3128/?token=[REDACTED] (HTTPS_PROXY)")


# -- a query string in a base URL ------------------------------------------------------------

def _sent_to(make: Callable[..., Any], call: Callable[[Any], Any], **kwargs: Any) -> str:
    """The URL the SDK client ``make(**kwargs)`` sends ``call``'s request to (answered 404)."""
    urls: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        urls.append(str(request.url))
        return httpx2.Response(404, json={"error": {"message": "not found"}})

    with make(api_key="sk-unused-0000", max_retries=0,
              http_client=httpx2.Client(transport=httpx2.MockTransport(answer)),
              **kwargs) as client, pytest.raises((openai.NotFoundError, anthropic.NotFoundError)):
        call(client)
    return urls[0]


def _chat(client: Any) -> Any:
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def _messages(client: Any) -> Any:
    return client.messages.create(model="m", max_tokens=1,
                                  messages=[{"role": "user", "content": "x"}])


def test_the_sdks_put_the_request_path_after_a_base_urls_query() -> None:
    # Why a base URL with a query is refused at setup: no request can reach the API.
    assert _sent_to(openai.OpenAI, _chat, base_url="https://gw.example/v1?key=abc") == \
        "https://gw.example/v1/?key=abcchat/completions"
    assert _sent_to(anthropic.Anthropic, _messages, base_url="https://gw.example?key=abc") == \
        "https://gw.example/?key=abc/v1/messages"
    # What the sentence advises instead: the query as the client's default_query.
    assert _sent_to(openai.OpenAI, _chat, base_url="https://gw.example/v1",
                    default_query={"key": "abc"}) == \
        "https://gw.example/v1/chat/completions?key=abc"
    assert _sent_to(anthropic.Anthropic, _messages, base_url="https://gw.example",
                    default_query={"key": "abc"}) == "https://gw.example/v1/messages?key=abc"


@pytest.mark.parametrize(("model", "variable", "key"), [
    ("openai:gpt-4o-mini", "OPENAI_BASE_URL", "OPENAI_API_KEY"),
    ("anthropic:claude-sonnet-4-5", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
])
def test_a_base_url_with_a_query_is_refused_at_setup_in_one_sentence(
        model: str, variable: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(key, "sk-test-not-used-0000000000")
    monkeypatch.setenv(variable, "http://127.0.0.1:9/v1?api-version=2024-10-21&key=qs-secret-77")
    with pytest.raises(ConfigError) as info:
        ChatSession(model, name="query-url")
    said = str(info.value)
    assert "qs-secret-77" not in said and "\n" not in said
    assert said.startswith(f"{variable} (http://127.0.0.1:9/v1")
    assert f"?api-version=2024-10-21&key={MASK}) has a query string" in said
    assert "SDK cannot use: it adds each request's path after the query" in said
    assert "without the query (http://127.0.0.1:9/v1" in said
    assert "api_key=" in said and "default_headers=" in said
    assert "default_query={'api-version': ..., 'key': ...}" in said


def test_a_client_whose_base_url_has_a_query_is_refused_too() -> None:
    client = openai.OpenAI(api_key="sk-unused-0000",
                           base_url="http://127.0.0.1:9/v1?key=qs-secret-77")
    with pytest.raises(ConfigError, match=r"^the client's base_url \(http://127\.0\.0\.1:9/v1/"
                                          r"\?key=\[REDACTED\]\) has a query string") as info:
        ChatSession("openai:gpt-4o", client=client, name="query-client")
    assert "qs-secret-77" not in str(info.value)
    client.close()


@pytest.mark.parametrize("kind", sorted(QUERY_CASES))
def test_a_base_url_with_a_query_is_said_at_load_and_refused_by_the_cell(
        kind: str, ip: Any, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    template, secrets, masked = QUERY_CASES[kind]
    with loaded_behind(template, ip, monkeypatch) as (port, seen):
        loaded = capsys.readouterr()
        result = cell(ip, "", "hello")
        again = cell(ip, "", "hello again")
        told = capsys.readouterr()
    assert seen == []                            # nothing was sent to the wrong path
    assert f" at {masked.format(port=port)} (no proxy);" in loaded.out
    warning = [line for line in loaded.err.splitlines() if "has a query string" in line]
    assert warning == [f"⚠ OPENAI_BASE_URL ({masked.format(port=port)}) has a query string, "
                       + warning[0].split(" has a query string, ", 1)[1]]
    for failed in (result, again):
        assert isinstance(failed.error_in_exec, UsageError)
        assert "has a query string" in str(failed.error_in_exec)
    for text in (loaded.out, loaded.err, told.out, told.err, str(result.error_in_exec)):
        assert [s for s in secrets if s in text] == [], text
