"""The configured max_payload is a limit the session never sends past (issue 12 item 6)."""

from __future__ import annotations

import pytest
from fakes import FakeProvider

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.errors import ChatError

KB = 1024


def test_a_body_over_the_configured_cap_is_never_sent() -> None:
    fake = FakeProvider(window=50_000_000, max_output=4096)
    s = ChatSession(provider=fake, settings=Settings(max_payload=64 * KB),
                    sleep=lambda x: None)
    s.send("a small first turn")
    before = s.history
    with pytest.raises(ChatError) as caught:
        s.send("pasted " + "x" * 600 * KB)       # the request alone is over the cap
    assert str(caught.value) == (
        "The request is 601 KB even after fitting, over the configured 64 KB payload cap; "
        "send a shorter message or raise CHATCLI_MAX_PAYLOAD if the proxy takes more.")
    assert max(len(b) for b in fake.bodies) <= 64 * KB
    assert s.history == before
    assert s.transcript[-1].text.startswith("pasted ")     # nothing the user said is lost


def test_an_old_history_over_the_configured_cap_is_fitted_under_it() -> None:
    fake = FakeProvider(window=50_000_000, max_output=4096)
    s = ChatSession(provider=fake, settings=Settings(), sleep=lambda x: None)
    for i in range(12):
        s.send(f"turn {i} " + "y" * 20 * KB)
    s.update(settings=Settings(max_payload=64 * KB))
    s.send("the latest question")
    assert max(len(b) for b in fake.bodies[12:]) <= 64 * KB
    assert s.history[-2].text == "the latest question"
