"""A session's Redactor knows what its client sends: a gateway that echoes the credentials
it received (user info sent as ``Authorization: Basic …``, ``?key=`` values of the client's
``default_query`` — a base URL cannot carry a query) gets them masked in the error
sentence, the events and the session's files.

The real OpenAI SDK talks over HTTP to a 127.0.0.1 gateway that echoes them in a 401.
"""

from __future__ import annotations

import base64
from pathlib import Path

import openai
import pytest
from auth_echo import auth_echo

from ipy_ctxrecovery import ChatError, ChatSession, Settings
from ipy_ctxrecovery.core.events import Event
from ipy_ctxrecovery.core.wording import describe
from ipy_ctxrecovery.redaction import MASK

BASIC = "Basic " + base64.b64encode(b"bob:hunter2pass").decode()

# (base URL, the client's default_query, the secrets that must never be shown or stored)
URLS: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "userinfo": ("http://bob:hunter2pass@127.0.0.1:{port}/v1", {},
                 ["hunter2pass", "bob:hunter2pass", BASIC.split()[1]]),
    "query-key": ("http://127.0.0.1:{port}/v1", {"key": "qs-secret-77"}, ["qs-secret-77"]),
    "both": ("http://bob:hunter2pass@127.0.0.1:{port}/v1",
             {"api-version": "2024-10-21", "sig": "Sig/xyz=9"},
             ["hunter2pass", BASIC.split()[1], "Sig%2Fxyz%3D9", "Sig/xyz=9"]),
}


def files_text(directory: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace")
                     for p in sorted(directory.rglob("*")) if p.is_file())


@pytest.mark.parametrize("kind", sorted(URLS))
def test_credentials_in_the_base_url_echoed_in_a_401_are_masked(kind: str) -> None:
    template, query, secrets = URLS[kind]
    with auth_echo() as (port, seen):
        client = openai.OpenAI(base_url=template.format(port=port), api_key="sk-unused-0000",
                               max_retries=0, default_query=query)
        session = ChatSession("openai:gpt-4o", client=client, settings=Settings(),
                              name=f"url-{kind}")
        events: list[Event] = []
        session.subscribe(events.append)
        assert all(s not in repr(session.provider) for s in secrets)
        with pytest.raises(ChatError) as info:
            session.send("hello")
        session.close()
    if "@" in template:
        assert set(seen) == {BASIC}  # httpx2 sent the URL's user info as Basic auth
    shown = [str(info.value), info.value.failure.reason, *(describe(e) for e in events)]
    assert "Incorrect API key provided" in shown[0] and MASK in shown[0]
    for line in shown:
        assert [s for s in secrets if s in line] == [], line
    if "api-version" in query:
        assert "api-version=2024-10-21" in shown[0]  # not a credential: still shown
    on_disk = files_text(session.directory)
    assert "hello" in on_disk                    # the turn was kept
    assert [s for s in secrets if s in on_disk] == []


def test_a_short_url_password_is_masked_in_its_longer_forms_only() -> None:
    # "pw12" alone is too short to mask verbatim (it would mask ordinary words), but the
    # Basic value built from it is not.
    basic = base64.b64encode(b"bob:pw12").decode()
    with auth_echo() as (port, seen):
        client = openai.OpenAI(base_url=f"http://bob:pw12@127.0.0.1:{port}/v1",
                               api_key="sk-unused-0000", max_retries=0)
        session = ChatSession("openai:gpt-4o", client=client, name="short-pw")
        with pytest.raises(ChatError) as info:
            session.send("pw12 stays in my words")
        session.close()
    assert set(seen) == {f"Basic {basic}"}
    assert basic not in str(info.value) and MASK in str(info.value)
    assert "pw12 stays in my words" in session.transcript[0].text
    assert basic not in files_text(session.directory)
