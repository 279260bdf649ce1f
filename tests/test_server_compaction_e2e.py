"""Server compaction end to end, on both wires that carry it (docs/server-compaction.md):
the real Anthropic SDK (``compact_20260112``) and the real OpenAI SDK on the Responses API
(``context_management`` ``compact_threshold``), against the emulator behind a proxy cap —
the emulator's own ``max_body`` and a real nginx in front of it — and the package's own
compaction on a reasoning model, whose latest reasoning items must survive it.

Skipped unless the emulator compacts on its server — found by feature, not by name: a
request that asks for ``compact_20260112`` past a low trigger must come back with a
``compaction`` block — and unless the Anthropic provider carries the session's
``ContextManagement`` into the body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from middlebox_chat import sdk_client
from middleboxes import Middlebox

from ipy_ctxrecovery import ChatSession, Emulator, Settings
from ipy_ctxrecovery.core.events import CompactionPhase, Event, LadderStep, ServerCompacted
from ipy_ctxrecovery.core.history import (
    TAG_SERVER_COMPACTION,
    TAG_SUMMARY,
    Message,
    Reasoning,
    Role,
    ToolCall,
)
from ipy_ctxrecovery.core.prompts import SUMMARIZE_SYSTEM_PROMPT
from ipy_ctxrecovery.providers.anthropic import COMPACT_BETA
from ipy_ctxrecovery.providers.base import ContextManagement, Request

CAP = 32 * 1024
LOWEST = 1_000          # the emulator's lowest server compaction trigger
TURNS = 30
WIRES = [pytest.param("anthropic", id="anthropic"), pytest.param("responses", id="responses")]
MODEL = {"anthropic": "emulator:anthropic", "responses": "emulator:openai"}
API = {"anthropic": {}, "responses": {"openai_api": "responses"}}


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


# -- both wires: what the bodies carry, what a compaction replaced, the cap ------------------
#
# One conversation per wire against an emulator with a 32 KB body cap the session is not
# told of (so the first body over it is rejected and the cap learned), in a window far
# above the cap: only the cap presses, and only the server may compact.


def units(wire: str, body: Any) -> list[tuple[str, str]]:
    """What a body carries besides its system prompt and its compactions, one entry per
    text block / tool use / tool result (Anthropic) or per input item (Responses)."""
    out: list[tuple[str, str]] = []
    if wire == "anthropic":
        for message in body.get("messages") or ():
            content = message["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for block in blocks:
                kind = block.get("type")
                if kind == "text":
                    out.append((message["role"], block["text"]))
                elif kind == "tool_use":
                    out.append(("tool_use", block["id"]))
                elif kind == "tool_result":
                    out.append(("tool_result", json.dumps(block.get("content"))))
                elif kind in ("thinking", "redacted_thinking"):
                    out.append((kind, block.get("signature") or block.get("data") or ""))
        return out
    for item in body.get("input") or ():
        kind = item.get("type") or "message"
        if kind == "message" and item.get("role") not in ("system", "developer"):
            out.append((item["role"], json.dumps(item["content"])))
        elif kind == "function_call":
            out.append((kind, item["call_id"] + item["arguments"]))
        elif kind == "function_call_output":
            out.append((kind, item["call_id"] + json.dumps(item["output"])))
        elif kind == "reasoning":
            out.append((kind, item["id"]))
    return out


def compactions(wire: str, body: Any) -> list[Any]:
    """The compaction blocks (Anthropic) or items (Responses) a body sends back."""
    if wire == "anthropic":
        return [b for m in body.get("messages") or () if isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "compaction"]
    return [i for i in body.get("input") or () if i.get("type") == "compaction"]


def summary_requests(records: list[Any]) -> list[Any]:
    """Requests of the package's own summary (its summarizer's system prompt)."""
    marker = SUMMARIZE_SYSTEM_PROMPT[:80]
    return [r for r in records if r.raw is not None and marker in r.raw.decode()]


def check_bodies(wire: str, records: list[Any], session: ChatSession) -> None:
    """Every body asks the compaction as its API documents it, with the beta header on
    Anthropic; after the cap is learned the trigger is under it."""
    assert records
    learned = session.caps.learned
    for record in records:
        body = record.body
        if wire == "anthropic":
            assert record.path == "/v1/messages"
            assert COMPACT_BETA in (record.header("anthropic-beta") or "").split(",")
            edits = body["context_management"]["edits"]
            assert [e["type"] for e in edits] == ["compact_20260112"]
            assert set(edits[0]) == {"type", "trigger"}
            assert edits[0]["trigger"]["type"] == "input_tokens"
            trigger = edits[0]["trigger"]["value"]
        else:
            assert record.path == "/v1/responses"
            assert record.header("anthropic-beta") is None
            assert body["store"] is False
            [entry] = body["context_management"]
            assert set(entry) == {"type", "compact_threshold"} and entry["type"] == "compaction"
            trigger = entry["compact_threshold"]
        assert isinstance(trigger, int) and trigger >= LOWEST
    # Once the cap is learned, the server is asked to compact below it.
    assert learned is not None and learned <= CAP
    bpt = session.limits.tokens.bytes_per_token
    last = records[-1].body
    trigger = (last["context_management"]["edits"][0]["trigger"]["value"] if wire == "anthropic"
               else last["context_management"][0]["compact_threshold"])
    assert trigger * bpt <= CAP


def check_replaced(wire: str, records: list[Any]) -> None:
    """After the first compaction, no later body carries any message or item it replaced:
    everything the compacting request sent (but its system prompt) is gone for good."""
    sent = [r for r in records if r.body is not None]
    first = next(i for i, r in enumerate(sent) if compactions(wire, r.body))
    compacting = max(i for i in range(first) if sent[i].status == 200 and sent[i].fault is None)
    replaced = set(units(wire, sent[compacting].body))
    assert len(replaced) >= 6      # the conversation so far, both sides
    for record in sent[compacting + 1:]:
        assert not replaced & set(units(wire, record.body)), record.body_bytes
        # One compaction goes back: the latest (a later one replaced the earlier too).
        assert len(compactions(wire, record.body)) == 1, record.body_bytes
    assert sent[first].body_bytes < sent[compacting].body_bytes / 2


def check_turns(session: ChatSession, replies: list[Any], texts: list[str],
                events: list[Event]) -> None:
    assert all(r.text and r.finish_reason == "end" for r in replies)
    assert [m.text for m in session.transcript if m.role is Role.USER] == texts
    assert any(isinstance(e, ServerCompacted) for e in events), "the server never compacted"
    assert not any(isinstance(e, CompactionPhase) for e in events)


def note(i: int) -> str:
    return f"note {i}: remember the value v{i}-" + "detail " * 300


@pytest.fixture(scope="module", params=[(w, s) for w in ("anthropic", "responses")
                                        for s in (False, True)],
                ids=["anthropic-whole", "anthropic-streamed", "responses-whole",
                     "responses-streamed"])
def capped(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One conversation per wire (whole and streamed replies) behind the emulator's 32 KB
    cap (not configured)."""
    wire, stream = request.param
    # Module-scoped: set up before conftest's per-test data directory, so its own.
    with pytest.MonkeyPatch.context() as patch, \
            Emulator(context_window=200_000, max_body=CAP) as emu:
        patch.setenv("IPY_CTXRECOVERY_DIR", str(tmp_path_factory.mktemp("ctxstate")))
        for var in ("CHATCLI_MAX_PAYLOAD", "CHATCLI_CONTEXT_WINDOW"):
            patch.delenv(var, raising=False)
        if not emulator_compacts(emu):
            pytest.skip("the emulator does not compact on its server (context_management)")
        emu.reset()
        session = ChatSession(MODEL[wire], emulator=emu, name=f"sc-e2e-{wire}",
                              settings=Settings(server_compaction="on", **API[wire]))
        events: list[Event] = []
        session.subscribe(events.append)
        texts = [note(i) for i in range(TURNS)]
        try:
            replies = [session.send(text, stream=stream) for text in texts]
            assert all(bool(r.body.get("stream")) is stream
                       for r in emu.requests if r.body is not None)
            yield {"wire": wire, "emu": emu, "session": session, "events": events,
                   "texts": texts, "replies": replies}
        finally:
            session.close()


def test_the_bodies_carry_what_the_api_documents(capped: dict[str, Any]) -> None:
    records = [r for r in capped["emu"].requests if r.body is not None]
    check_bodies(capped["wire"], records, capped["session"])


def test_later_bodies_carry_nothing_a_compaction_replaced(capped: dict[str, Any]) -> None:
    check_replaced(capped["wire"], list(capped["emu"].requests))


def test_behind_the_cap_every_turn_is_answered_with_one_rejection_and_no_summary(
        capped: dict[str, Any]) -> None:
    emu, session = capped["emu"], capped["session"]
    check_turns(session, capped["replies"], capped["texts"], capped["events"])
    rejected = [r for r in emu.requests if r.status != 200]
    assert [(r.status, r.fault) for r in rejected] == [(413, "413:nginx")]
    after = emu.requests[emu.requests.index(rejected[0]) + 1:]
    assert after and all(r.body_bytes <= CAP for r in after)
    assert summary_requests(emu.requests) == []
    # One request a turn, and the rejected one: nothing else was asked.
    assert len(emu.requests) == len(capped["texts"]) + len(rejected)
    # It compacted more than once: the learned cap kept the trigger under it.
    assert len([e for e in capped["events"] if isinstance(e, ServerCompacted)]) >= 2


# -- behind a real nginx -----------------------------------------------------------------


@pytest.mark.nginx
@pytest.mark.parametrize("wire", [p.values[0] for p in WIRES], ids=["anthropic", "responses"])
def test_behind_a_real_nginx_every_turn_is_answered_with_at_most_one_413(
        wire: str, middlebox: Callable[..., Middlebox]) -> None:
    with Emulator(context_window=200_000) as upstream:
        if not emulator_compacts(upstream):
            pytest.skip("the emulator does not compact on its server (context_management)")
        upstream.reset()
        box = middlebox("nginx-413", upstream.url, limit=CAP)
        client = sdk_client("anthropic" if wire == "anthropic" else "openai", box, upstream)
        session = ChatSession("anthropic:emulator" if wire == "anthropic" else "openai:emulator",
                              client=client, name=f"sc-nginx-{wire}", builtin_tools=False,
                              settings=Settings(server_compaction="on", context_window=200_000,
                                                **API[wire]))
        events: list[Event] = []
        session.subscribe(events.append)
        texts = [note(i) for i in range(TURNS)]
        try:
            replies = [session.send(text) for text in texts]       # streamed, the default
            check_turns(session, replies, texts, events)
            logged = box.requests()
            path = "/v1/messages" if wire == "anthropic" else "/v1/responses"
            assert {r.path for r in logged} == {path}
            refused = [r for r in logged if r.status == 413]
            assert len(refused) <= 1
            assert all(r.status in (200, 413) for r in logged)
            assert all((r.body_bytes or 0) > CAP for r in refused)
            # nginx saw one request a turn and the refused one; the emulator got the rest.
            assert len(logged) == len(texts) + len(refused)
            assert len(upstream.requests) == len(texts)
            assert all(r.status == 200 for r in upstream.requests)
            assert all(r.body_bytes <= CAP for r in upstream.requests)
            assert summary_requests(upstream.requests) == []
            check_bodies(wire, list(upstream.requests), session)
            check_replaced(wire, list(upstream.requests))
        finally:
            session.close()
            client.close()
            box.stop()


# -- the package's own compaction keeps the latest reasoning ----------------------------------


def fetch(n: int) -> str:
    """Return n characters of log output.

    Args:
        n: how many characters.
    """
    return "".join(f"log line {k}\n" for k in range(n))[:n]


THINK = {"thinking": {"type": "enabled", "budget_tokens": 1024}}


@pytest.mark.parametrize("wire", [p.values[0] for p in WIRES], ids=["anthropic", "responses"])
def test_reasoning_survives_the_packages_own_compaction(emulator: Any, tmp_path: Path,
                                                       wire: str) -> None:
    """Server compaction off, the emulator reasoning — extended thinking on Anthropic
    (signed thinking blocks), encrypted reasoning items on the Responses API (as the
    package asks a reasoning model) — and a window small enough that the package compacts
    on its own — the last time in the middle of the latest turn's tool loop, its big tool
    result pushing the history over the budget. The loop's reasoning still goes with its
    tool calls, right before them, and the API accepts it: the emulator refuses a tool loop whose thinking block is
    missing (Anthropic), and a function call sent by its id without its reasoning item
    (Responses; the package sends none by id, so there the order is checked here)."""
    emu = emulator(context_window=5_000)
    session = ChatSession(MODEL[wire], emulator=emu, tools=[fetch], files_root=tmp_path,
                          settings=Settings(server_compaction="off", **API[wire]),
                          name=f"sc-e2e-reasoning-{wire}")
    options = THINK if wire == "anthropic" else None
    texts = [f'Turn {i}: [[tool fetch {{"n": 1500}}]]' if i % 3 == 2 else
             f"Turn {i}: " + " ".join(f"item{i}-{k}" for k in range(150)) for i in range(9)]
    texts.append('Turn 9: [[tool fetch {"n": 9000}]]')
    try:
        start = 0
        for text in texts:
            start = len(emu.requests)
            assert session.send(text, stream=False, options=options).text
        assert session.status().compactions >= 2
        assert all(r.status == 200 for r in emu.requests), \
            [(r.status, r.fault) for r in emu.requests if r.status != 200]
        # The latest turn: its tool call asked and answered, then the package's summary
        # (mid-loop), then the loop's last request.
        turn = emu.requests[start:]
        called = next(k for k, r in enumerate(turn) if not summary_requests([r]))
        assert summary_requests(turn[called + 1:-1]), "no compaction inside the tool loop"
        assert not summary_requests(turn[-1:])
        # The latest turn's tool loop as the transcript keeps it.
        last_user = max(i for i, m in enumerate(session.transcript) if m.role is Role.USER)
        loop = [m for m in session.transcript[last_user:]
                if m.role is Role.ASSISTANT and m.tool_calls]
        assert loop, "the latest turn called no tool"
        body = emu.requests[-1].body
        for message in loop:
            thought = [b for b in message.blocks if isinstance(b, Reasoning)]
            calls = [b for b in message.blocks if isinstance(b, ToolCall)]
            assert thought and all(b.signature for b in thought)
            if wire == "anthropic":
                at = max(k for k, m in enumerate(body["messages"])
                         if m["role"] == "assistant" and isinstance(m["content"], list)
                         and any(b.get("id") == calls[0].id for b in m["content"]))
                sent = body["messages"][at]["content"][:len(thought)]
                assert sent == [{"type": "thinking", "thinking": b.text,
                                 "signature": b.signature} for b in thought]
            else:
                items = body["input"]
                at = next(k for k, i in enumerate(items) if i.get("type") == "function_call"
                          and i["call_id"] == calls[0].id)
                assert all(b.id for b in thought)
                assert items[at - len(thought):at] == [
                    {"type": "reasoning", "id": b.id, "summary": [],
                     "encrypted_content": b.signature} for b in thought]
        # The last body is a compacted one: the package's summary first, the early turns gone.
        assert session.history[0].tag == TAG_SUMMARY
        assert session.history[0].text.startswith("[STRUCTURED SUMMARY — covering ")
        first = (body["messages"][0]["content"][0]["text"] if wire == "anthropic"
                 else body["input"][0]["content"])
        assert first == session.history[0].text
        assert texts[0] not in json.dumps(body, ensure_ascii=False)
    finally:
        session.close()
