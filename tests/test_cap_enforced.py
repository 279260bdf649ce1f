"""The configured max_payload is a limit the session never sends past (issue 12 item 6)."""

from __future__ import annotations

import contextlib
from typing import Any

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
        "Your message makes the request 601 KB with the system prompt, more than 64 KB (the "
        "configured payload cap) — send a shorter message (a tool can read large content in "
        "ranges), or raise the limit with %chat config CHATCLI_MAX_PAYLOAD=SIZE if the "
        "proxy/gateway allows more.")
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


def _refusing_the_first_summary(kind: str, status: int) -> tuple[FakeProvider, list[int]]:
    from fakes import failure

    from ipy_ctxrecovery.failures import FailureKind

    rejected: list[int] = []
    fake = FakeProvider(window=6_000, max_output=1024)

    def answer(request: Any) -> Any:
        summary = "STRUCTURED SUMMARY" in (request.messages[0].text or "")
        if summary and not rejected:
            rejected.append(len(fake.encode(request)))
            raise failure(FailureKind(kind), "refused by the proxy", status=status,
                          request_bytes=rejected[0])
        return None

    fake.script.extend(answer for _ in range(200))
    return fake, rejected


def test_a_proxy_rejecting_the_summarizer_request_as_too_large_teaches_the_cap() -> None:
    """Found by the soak: the main request was then sent larger than the rejected one."""
    fake, rejected = _refusing_the_first_summary("payload_too_large", 413)
    s = ChatSession(provider=fake, settings=Settings(), sleep=lambda x: None)
    for i in range(12):
        with contextlib.suppress(ChatError):
            s.send(f"turn {i} " + "z" * 4_000)
    assert rejected, "no summary was asked for"
    first = next(i for i, r in enumerate(fake.requests)
                 if "STRUCTURED SUMMARY" in (r.messages[0].text or ""))
    assert all(len(b) < rejected[0] for b in fake.bodies[first + 1:])


def test_a_firewall_blocking_a_small_summary_request_teaches_nothing_about_size() -> None:
    """Behind ModSecurity: a summary request no bigger than the turns that passed was
    blocked for its content. It learned a 3 KB cap and the session collapsed (issue 24)."""
    from ipy_ctxrecovery import describe

    fake, rejected = _refusing_the_first_summary("waf_rejection", 403)
    s = ChatSession(provider=fake, settings=Settings(), sleep=lambda x: None)
    lines: list[str] = []
    s.subscribe(lambda e: lines.append(describe(e)))
    for i in range(12):
        s.send(f"turn {i} " + "z" * 4_000)              # every turn answered
    assert rejected and rejected[0] <= s.caps.largest_ok
    assert s.caps.smallest_rejected is None and s.caps.effective() is None
    assert any("not about size" in line for line in lines), lines
    assert len(s.transcript) == 24


def test_no_summary_request_is_sent_at_a_size_already_rejected() -> None:
    """Found by the long soak: with a tiny learned cap the summary request went out anyway."""
    fake = FakeProvider(window=50_000_000, max_output=4096)
    s = ChatSession(provider=fake, settings=Settings(), sleep=lambda x: None)
    for i in range(6):
        s.send(f"turn {i} " + "w" * 400)
    s.caps.record_rejection(950)        # about the summary prompt alone
    sent = len(fake.bodies)
    report = s.compact()
    assert not report.applied
    assert all(len(b) < 950 for b in fake.bodies[sent:])
