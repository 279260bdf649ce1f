"""What the kernel's environment shows: the load line and ``%chat status`` name where
requests go, with the credentials a base URL carries masked — its user info and the
values of credential query parameters — and what is not a credential still shown.

The whole path a user takes: ``OPENAI_BASE_URL`` set, ``%load_ext``, a ``%%chat`` cell
answered by a gateway that echoes what it received in a 401, ``%chat status``.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from auth_echo import auth_echo
from IPython.core.error import UsageError
from test_magics import cell, ip  # noqa: F401  (fixtures)

from ipy_ctxrecovery.notebook.environment import describe_endpoint
from ipy_ctxrecovery.redaction import MASK

BASIC_TOKEN = base64.b64encode(b"bob:hunter2pass").decode()

CASES = {
    "query-key": ("http://127.0.0.1:{port}/v1?key=qs-secret-77", ["qs-secret-77"],
                  "http://127.0.0.1:{port}/v1?key=[REDACTED]"),
    "userinfo": ("http://bob:hunter2pass@127.0.0.1:{port}/v1",
                 ["hunter2pass", "bob:", BASIC_TOKEN], "http://[REDACTED]@127.0.0.1:{port}/v1"),
    "azure-sas": ("http://127.0.0.1:{port}/openai?api-version=2024-10-21&sig=Zm9vYmFyYmF6cXV4",
                  ["Zm9vYmFyYmF6cXV4"],
                  "http://127.0.0.1:{port}/openai?api-version=2024-10-21&sig=[REDACTED]"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_base_url_with_credentials_is_masked_from_load_line_to_status(
        kind: str, ip: Any, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    template, secrets, masked = CASES[kind]
    with auth_echo() as (port, seen):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used-0000000000")
        monkeypatch.setenv("OPENAI_BASE_URL", template.format(port=port))
        ip.run_line_magic("load_ext", "ipy_ctxrecovery")
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
