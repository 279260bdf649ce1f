"""Server compaction end to end: the real Anthropic SDK against the emulator behind a proxy
cap (docs/server-compaction.md).

Skipped unless the emulator compacts on its server — found by feature, not by name: a
request that asks for ``compact_20260112`` past a low trigger must come back with a
``compaction`` block — and unless the Anthropic provider carries the session's
``ContextManagement`` into the body.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.events import CompactionPhase, Event, LadderStep, ServerCompacted
from ipy_ctxrecovery.core.history import TAG_SERVER_COMPACTION, Message
from ipy_ctxrecovery.providers.base import ContextManagement, Request

CAP = 32 * 1024


def emulator_compacts(emu: Any) -> bool:
    """Whether ``emu`` answers Anthropic's compact edit with a compaction block."""
    client = emu.anthropic_client(max_retries=0)
    try:
        # Raw: the reply is read as JSON, so the check needs no SDK type for the block.
        raw = client.messages.with_raw_response.create(
            model="emulator", max_tokens=64,
            messages=[{"role": "user", "content": "a long message " * 1_200}],
            extra_headers={"anthropic-beta": "compact-2026-01-12"},
            extra_body={"context_management": {"edits": [{
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": 1_000}}]}})
        content = raw.http_response.json().get("content") or []
    except Exception:   # an emulator that refuses the field does not have the feature
        return False
    finally:
        client.close()
    return any(isinstance(block, dict) and block.get("type") == "compaction"
               for block in content)


def provider_carries(session: ChatSession) -> bool:
    """Whether the session's provider puts the compact edit in the body."""
    request = Request(messages=(Message.user("hi"),), max_tokens=16,
                      context=ContextManagement(compact_trigger=1_000))
    return b"compact_20260112" in bytes(session.provider.encode(request))


@pytest.fixture
def compacting(emulator: Any) -> Any:
    emu = emulator(context_window=8_192, max_body=CAP)
    if not emulator_compacts(emu):
        pytest.skip("the emulator does not compact on its server (context_management)")
    return emu


def test_behind_a_cap_the_server_compacts_and_later_bodies_drop_what_it_replaced(
        compacting: Any) -> None:
    session = ChatSession("emulator:anthropic", emulator=compacting,
                          settings=Settings(server_compaction="on", max_payload=CAP),
                          name="server-compaction-e2e")
    if not provider_carries(session):
        session.close()
        pytest.skip("the Anthropic provider does not send context_management yet")
    events: list[Event] = []
    session.subscribe(events.append)
    texts = [f"note {i}: remember the value v{i}-" + "detail " * 300 for i in range(24)]
    try:
        for text in texts:
            session.send(text, stream=False)
        compacted = [e for e in events if isinstance(e, ServerCompacted)]
        assert compacted, "the server never compacted"
        assert not any(isinstance(e, CompactionPhase) and e.phase == "summarize"
                       for e in events)
        # Every turn answered behind the cap, with at most one rejection.
        rejected = [r for r in compacting.requests if r.fault is not None]
        assert len(rejected) <= 1
        assert all(r.body_bytes <= CAP for r in compacting.requests if r.status == 200)
        # After the compaction, the bodies no longer carry what it replaced.
        last = compacting.requests[-1]
        body = json.dumps(last.body)
        assert "note 0:" not in body and "compaction" in body
        assert any(m.tag == TAG_SERVER_COMPACTION for m in session.history)
        assert [m.text for m in session.transcript if m.text.startswith("note ")] == texts
    finally:
        session.close()


@pytest.mark.parametrize("model, settings", [
    ("emulator:anthropic", Settings(max_payload=CAP)),
    ("emulator:openai", Settings(max_payload=CAP, openai_api="responses")),
], ids=["anthropic", "responses"])
def test_a_compacted_replys_usage_does_not_move_the_calibration_or_the_trigger(
        emulator: Any, model: str, settings: Settings) -> None:
    """A reply that compacted reports the tokens the model read after the compaction,
    fewer than the body sent: as a bytes/token sample it would raise the calibration by
    half and lower the next trigger by a third (5,400 → 3,700 tokens, then back up turn
    by turn): the server would compact earlier than the cap needs. The requests after it
    carry the compaction, which on the Responses API is ciphertext counted as the hidden
    summary's tokens: as samples they lowered the trigger by a tenth after each one."""
    emu = emulator(context_window=200_000, max_body=CAP)
    session = ChatSession(model, emulator=emu, settings=settings, name="calibration-e2e")
    events: list[Event] = []
    session.subscribe(events.append)
    text = "The weekly revenue by region rose in the north and fell in the south. " * 40
    rates: list[float] = []
    triggers: list[int] = []
    compacted_at: list[int] = []
    try:
        for i in range(16):
            before = len(events)
            session.send(f"Week {i}: {text}", stream=False)
            if any(isinstance(e, ServerCompacted) for e in events[before:]):
                compacted_at.append(i)
            rates.append(session.limits.tokens.bytes_per_token)
            triggers.append(trigger_of(emu.requests[-1].body))
        assert [i for i in compacted_at if 0 < i < 15], "the server never compacted"
        for i in compacted_at:
            if 0 < i < 15:   # the compacting turn moves neither the rate nor the next trigger
                assert abs(rates[i] / rates[i - 1] - 1) < 0.03, (i, rates)
                assert abs(triggers[i + 1] / triggers[i] - 1) < 0.03, (i, triggers)
        # Nor do the requests that carry the compaction after it (OpenAI's is ciphertext).
        calibrated = triggers[2:]
        assert max(calibrated) <= 1.03 * min(calibrated), triggers
    finally:
        session.close()


def trigger_of(body: dict[str, Any]) -> int:
    """The compaction trigger a request body asked for, on either wire."""
    context = body["context_management"]
    if isinstance(context, list):                         # the Responses API
        return int(context[0]["compact_threshold"])
    return int(next(e for e in context["edits"] if e["type"] == "compact_20260112")
               ["trigger"]["value"])


def test_after_a_413_the_fit_cuts_to_the_cap_and_leaves_the_rest_to_the_server(
        emulator: Any) -> None:
    """A cap nobody told the package, met while the server compacts: the fit after the 413
    drops messages unsummarized, so it drops only what the cap needs (not down to the
    compaction target, 40 % of the cap: 17 of 25 messages here), and the retry, past the
    trigger, is compacted by the server."""
    emu = emulator(context_window=200_000, max_body=CAP)
    session = ChatSession("emulator:anthropic", emulator=emu, name="fit-to-the-cap-e2e")
    events: list[Event] = []
    session.subscribe(events.append)
    rows = "".join(f"store {s:03d} revenue {1000 + s} EUR\n" for s in range(90))
    try:
        for i in range(14):
            before = len(events)
            session.send(f"Week {i}:\n{rows}", stream=False)
            if any(r.status == 413 for r in emu.requests):
                break
        refused = [n for n, r in enumerate(emu.requests) if r.status == 413]
        assert len(refused) == 1, "the proxy never refused a request"
        retry = emu.requests[refused[0] + 1]
        cap = session.caps.effective()
        assert cap is not None and retry.status == 200
        assert 0.75 * cap < retry.body_bytes <= cap, (retry.body_bytes, cap)
        turn = events[before:]
        assert any(isinstance(e, ServerCompacted) for e in turn), "the server did not compact"
        assert not any(isinstance(e, CompactionPhase) and e.phase == "summarize" for e in turn)
        assert session.history[0].tag == TAG_SERVER_COMPACTION
    finally:
        session.close()


@pytest.mark.parametrize("model, extra", [("emulator:anthropic", {}),
                                          ("emulator:openai", {"openai_api": "responses"})])
def test_after_a_413_the_fit_keeps_what_the_cap_takes_and_the_server_reads_it(
        emulator: Any, model: str, extra: dict[str, Any]) -> None:
    """The cap is not configured: the first body over it is rejected. While the server
    compacts, the exact fit drops (no summary of the package's), so it drops only what the
    learned cap needs — not down to the package's compaction target — and the resend,
    past the trigger the cap now gives, is what the server compacts: the messages kept are
    read by its summary instead of being dropped unread."""
    emu = emulator(context_window=200_000, max_body=CAP)
    if model == "emulator:anthropic" and not emulator_compacts(emu):
        pytest.skip("the emulator does not compact on its server (context_management)")
    session = ChatSession(model, emulator=emu, name="server-compaction-413",
                          settings=Settings(server_compaction="on", **extra))
    events: list[Event] = []
    session.subscribe(events.append)
    try:
        for i in range(12):
            start = len(emu.requests)
            session.send(f"note {i}: " + "detail " * 700, stream=False)
            if any(r.status != 200 for r in emu.requests[start:]):
                break
        turn = emu.requests[start:]
        assert [r.status for r in turn] == [413, 200], [(r.status, r.body_bytes) for r in turn]
        rejected, resent = turn
        passed = max(r.body_bytes for r in emu.requests[:start])
        # Just under the cap learned from the largest body that passed, not a third of it.
        assert passed * 0.85 < resent.body_bytes <= passed
        steps = [e for e in events if isinstance(e, LadderStep)]
        assert steps and not any(e.summarizing for e in steps)
        assert not any(isinstance(e, CompactionPhase) and e.phase == "summarize"
                       for e in events)
        # The resend carried the trigger the cap gives, and the server compacted it.
        assert [isinstance(e, ServerCompacted) for e in events].count(True) == 1
        assert any(m.tag == TAG_SERVER_COMPACTION for m in session.history)
    finally:
        session.close()
