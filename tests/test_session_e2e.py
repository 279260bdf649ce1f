"""ChatSession end to end: the real openai/anthropic SDKs against the emulator, every failure mode.

Each scenario runs a long conversation through one fault (context window, nginx 413,
WAF 403, connection dropped on a large body, max_tokens cut) on both wire formats and
checks, from what the emulator received: every turn answered; at most one rejected request
per distinct limit, none after it; the SYSTEM NOTICE given once; the latest user request
in every request; tool pairing valid in every request; the transcript holding every
message; and a resume after a simulated restart against a fresh emulator.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core import markers
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT
from ipy_ctxrecovery.core.events import (
    CapChanged,
    CompactionPhase,
    Event,
    LadderStep,
    NoticeInjected,
    WindowLearned,
)
from ipy_ctxrecovery.core.history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    Compaction,
    History,
    Message,
    Role,
    Text,
    ToolCall,
    ToolResult,
    from_openai,
    is_server_compaction,
    problems,
)
from ipy_ctxrecovery.core.prompts import PAYLOAD_NOTICE
from ipy_ctxrecovery.core.wording import describe
from ipy_ctxrecovery.emulator.replies import paragraph_pieces
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.session.sizing import RequestSpec
from ipy_ctxrecovery.settings import format_size

WIRES = ["emulator", "emulator:anthropic"]
NOTICE_HEAD = "[SYSTEM NOTICE — PAYLOAD LIMIT HIT]"
API_KEY = "sk-test-e2e-0123456789abcdefSECRET"

# Limits scaled down with the windows/caps, so tests stay fast.
SMALL = Settings(per_result_max_chars=2_000, turn_budget_chars=6_000, budget_head_chars=800,
                 budget_tail_chars=200, microcompact_min_chars=600,
                 microcompact_head_chars=300, microcompact_tail_chars=100,
                 server_compaction="off")
# The package's own compaction: under "auto" the emulator compacts on its server on the
# Anthropic wire, and the package's summary then does not run (docs/server-compaction.md).
OWN = Settings(server_compaction="off")


def body_history(record: Any) -> History:
    """The messages of a request body the emulator received, back in our model."""
    body = record.body
    if "/chat/completions" in record.path:
        # The adapter merges consecutive messages of one role (a summary, a notice, the
        # request) into one string; each piece of a merged user message (the emulator's
        # reading: the package's own paragraphs, and the text between them) was one of ours.
        expanded: list[dict[str, Any]] = []
        for m in body["messages"]:
            content = m.get("content")
            if isinstance(content, str) and m["role"] == "user":
                expanded.extend({"role": "user", "content": piece}
                                for piece in paragraph_pieces(content))
            else:
                expanded.append(m)
        return from_openai(expanded)
    out: list[Message] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else "".join(b.get("text", "") for b in system)
        out.append(Message.system(text))
    for m in body["messages"]:
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if m["role"] == "assistant":
            parts: list[Any] = []
            for b in blocks:
                if b["type"] == "text":
                    parts.append(Text(b["text"]))
                elif b["type"] == "tool_use":
                    parts.append(ToolCall(b["id"], b["name"], json.dumps(b["input"])))
                elif b["type"] == "compaction":
                    # The server's compaction, sent back: it stands for what it replaced.
                    parts.append(Compaction("anthropic", json.dumps(b), b.get("content")))
            out.append(Message(Role.ASSISTANT, tuple(parts)))
            continue
        texts = [b["text"] for b in blocks if b["type"] == "text"]
        for b in blocks:
            if b["type"] == "tool_result":
                c = b["content"]
                c = c if isinstance(c, str) else "".join(x.get("text", "") for x in c)
                out.append(Message(Role.TOOL, (ToolResult(b["tool_use_id"], c),)))
        # The adapter merges consecutive user messages (a summary, a notice, the request)
        # into one; each text block was one message of ours.
        out.extend(Message.user(t) for t in texts)
    return tuple(out)


def is_summarizer(history: History) -> bool:
    return any(m.role is Role.SYSTEM and "STRUCTURED SUMMARY" in m.text for m in history)


@dataclass
class Run:
    session: ChatSession
    emu: Any
    texts: list[str]
    replies: list[Any]
    spans: list[tuple[int, int]]     # emu.requests index range of each turn
    events: list[Event]


def converse(session: ChatSession, emu: Any, texts: list[str], **send: Any) -> Run:
    events: list[Event] = []
    session.subscribe(events.append)
    replies, spans = [], []
    for text in texts:
        start = len(emu.requests)
        replies.append(session.send(text, **send))
        spans.append((start, len(emu.requests)))
    return Run(session, emu, texts, replies, spans, events)


def check_run(run: Run, *, limit: int | None = None, payload: bool = False,
              tool_results: bool = False) -> list[Any]:
    """The checks every scenario shares; returns the rejected requests."""
    records = run.emu.requests
    for reply in run.replies:
        assert reply.text and reply.finish_reason == "end", reply
    rejected = [r for r in records if r.status != 200]
    assert len(rejected) <= 1, [(r.status, r.body_bytes, r.fault) for r in rejected]
    if rejected and limit is not None:
        after = records[records.index(rejected[0]) + 1:]
        assert all(r.body_bytes <= limit for r in after)
    for i, (start, end) in enumerate(run.spans):
        for record in records[start:end]:
            if record.body is None:
                continue
            history = body_history(record)
            if is_summarizer(history):
                continue
            assert run.texts[i] in [m.text for m in history if m.role is Role.USER], i
            assert problems(history) == [], (i, problems(history))
            notices = sum(m.text.count(NOTICE_HEAD) for m in history)
            assert notices <= 1
            # A continuation prompt is only ever the last message of its request.
            assert all(m.text != CONTINUATION_PROMPT for m in history[:-1])
    injected = [e for e in run.events if isinstance(e, NoticeInjected) and e.notice == "payload"]
    if payload:
        assert len(injected) == 1
        assert any(PAYLOAD_NOTICE in json.dumps(r.body, ensure_ascii=False).replace("\\n", "\n")
                   for r in records if r.body is not None)
    else:
        assert injected == []
    # The transcript holds every message said, in order, uncompacted.
    said = [m for m in run.session.transcript if m.role is Role.USER]
    assert [m.text for m in said] == run.texts
    answers = [m.text for m in run.session.transcript
               if m.role is Role.ASSISTANT and not m.tool_calls and not is_server_compaction(m)]
    assert answers == [r.text for r in run.replies]
    if tool_results:
        full = [m.text for m in run.session.transcript if m.role is Role.TOOL]
        assert full and all("omitted" not in t and "saved to" not in t for t in full)
    assert problems(run.session.history) == []
    return rejected


def check_resume(run: Run, start_emulator: Callable[..., Any], wire: str,
                 provider_kwargs: dict[str, Any] | None = None, **limits: Any) -> None:
    """Close, start a fresh emulator, resume the session by name and keep talking."""
    session = run.session
    history, transcript = session.history, session.transcript
    session.close()
    emu = start_emulator(api_key=API_KEY, **limits)
    kwargs: dict[str, Any] = {"settings": session.settings}
    if provider_kwargs is not None:
        kwargs["provider"] = make_provider(wire, emulator=emu, **provider_kwargs)
    else:
        kwargs["emulator"] = emu
    again = ChatSession.resume(session.name, **kwargs)
    assert again.history == history
    assert again.transcript == transcript
    reply = again.send("after the restart: still there?")
    assert reply.text
    assert [r.status for r in emu.requests if r.status != 200] == []
    assert again.transcript[-2].text == "after the restart: still there?"
    again.close()
    # No key anywhere on disk.
    for path in session.directory.rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(encoding="utf-8", errors="replace"), path


def fetch(n: int) -> str:
    """Return n characters of log output.

    Args:
        n: how many characters.
    """
    return "".join(f"log line {k}\n" for k in range(n))[:n]


def mixed(turns: int, chars: int, tool_chars: int) -> list[str]:
    """Long user messages, every third turn a big tool result instead."""
    return [f'Turn {i}: [[tool fetch {{"n": {tool_chars}}}]]' if i % 3 == 1 else filler(i, chars)
            for i in range(turns)]


def filler(i: int, chars: int) -> str:
    """A distinct, readable user message of about ``chars`` characters."""
    words = " ".join(f"item{i}-{k}" for k in range(chars // 9))
    return f"Turn {i}: please keep note of these values: {words}"[:chars]


@pytest.mark.parametrize("wire", WIRES)
def test_context_window_overflow_long_conversation(emulator: Any, wire: str,
                                                   tmp_path: Path) -> None:
    emu = emulator(context_window=2048, api_key=API_KEY)
    session = ChatSession(wire, emulator=emu, settings=SMALL, name=f"ctx-{wire.replace(':', '-')}",
                          tools=[fetch], files_root=tmp_path)
    texts = mixed(30, 700, 5000)
    run = converse(session, emu, texts)
    rejected = check_run(run, tool_results=True)
    assert all(r.fault == "context" for r in rejected)
    assert session.status().compactions >= 1
    check_resume(run, emulator, wire, context_window=2048)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("style", ["nginx", "cloudflare"])
def test_payload_too_large_413(emulator: Any, wire: str, style: str) -> None:
    limit = 32 * 1024
    emu = emulator(context_window=200_000, max_body=limit, body_limit_style=style,
                   api_key=API_KEY)
    session = ChatSession(wire, emulator=emu, settings=Settings(), tools=[fetch],
                          name=f"p413-{style}-{wire.replace(':', '-')}")
    run = converse(session, emu, mixed(30, 3000, 8000))
    rejected = check_run(run, limit=limit, payload=True, tool_results=True)
    assert len(rejected) == 1 and rejected[0].status == 413
    status = session.status()
    assert status.cap is not None and status.cap < limit and status.cap_source == "learned"
    check_resume(run, emulator, wire, context_window=200_000, max_body=limit,
                 body_limit_style=style)


@pytest.mark.parametrize("wire", WIRES)
def test_waf_403_block_page(emulator: Any, wire: str) -> None:
    limit = 32 * 1024
    emu = emulator(context_window=200_000, waf_over=limit, api_key=API_KEY)
    session = ChatSession(wire, emulator=emu, settings=Settings(), tools=[fetch],
                          name=f"waf-{wire.replace(':', '-')}")
    run = converse(session, emu, mixed(30, 3000, 8000))
    rejected = check_run(run, limit=limit, payload=True, tool_results=True)
    assert len(rejected) == 1 and rejected[0].status == 403
    check_resume(run, emulator, wire, context_window=200_000, waf_over=limit)


@pytest.mark.parametrize("wire", WIRES)
def test_connection_dropped_on_a_large_body(emulator: Any, wire: str) -> None:
    limit = 600 * 1024
    emu = emulator(context_window=2_000_000, drop_over=limit, api_key=API_KEY)
    # SDK retries off, so every dropped request shows in emu.requests as one rejection.
    provider = make_provider(wire, emulator=emu, max_retries=0)
    session = ChatSession(wire, provider=provider, settings=Settings(), tools=[fetch],
                          name=f"drop-{wire.replace(':', '-')}")
    run = converse(session, emu, mixed(18, 60_000, 90_000))
    rejected = check_run(run, limit=limit, payload=True, tool_results=True)
    # The oversized tool results were previewed in requests, and kept whole on disk.
    persisted = list((session.directory / "results").iterdir())
    assert persisted and max(p.stat().st_size for p in persisted) == 90_000
    assert len(rejected) == 1 and rejected[0].status is None
    check_resume(run, emulator, wire, provider_kwargs={"max_retries": 0},
                 context_window=2_000_000, drop_over=limit)


@pytest.mark.parametrize("wire", WIRES)
def test_max_tokens_cut_is_continued_and_stitched(emulator: Any, wire: str) -> None:
    emu = emulator(context_window=8192, api_key=API_KEY)
    session = ChatSession(wire, emulator=emu, settings=Settings(), max_tokens=16,
                          name=f"cut-{wire.replace(':', '-')}")
    texts = [f"Turn {i}: answer at length [[words {30 + i}]]" for i in range(30)]
    run = converse(session, emu, texts)
    check_run(run)
    for i, reply in enumerate(run.replies):
        assert reply.text == " ".join(f"w{k}" for k in range(1, 31 + i))
    # One stitched answer per turn; no partials, no continuation prompts kept.
    assert [m.role for m in session.history].count(Role.ASSISTANT) <= 30
    for m in (*session.history, *session.transcript):
        assert m.text != CONTINUATION_PROMPT
    continuations = [r for r in emu.requests
                     if CONTINUATION_PROMPT in json.dumps(r.body, ensure_ascii=False)
                     .replace("\\n", "\n")]
    prefilled = [r for r in emu.requests if r.body["messages"][-1]["role"] == "assistant"]
    # Escalation really happened: by prefill where the model allows it (the emulator's
    # Anthropic path), by the continuation prompt otherwise.
    if wire == "emulator:anthropic":
        assert prefilled and not continuations
    else:
        assert continuations and not prefilled
    check_resume(run, emulator, wire, context_window=8192)


@pytest.mark.parametrize("wire", WIRES)
def test_manual_compact_and_undo(emulator: Any, wire: str) -> None:
    emu = emulator(context_window=8192)
    session = ChatSession(wire, emulator=emu, settings=Settings(), system="You are terse.",
                          name=f"manual-{wire.replace(':', '-')}")
    for i in range(8):
        session.send(filler(i, 800))
    before = session.history
    size_before = session.status().history_bytes
    report = session.compact("keep the item numbers")
    assert report.applied and report.summarized_messages > 0
    assert session.status().history_bytes < size_before
    assert session.history[0].text == "You are terse."
    assert any(m.text.startswith("[STRUCTURED SUMMARY — covering") for m in session.history)
    summarizer = [r for r in emu.requests if r.body is not None
                  and "keep the item numbers" in json.dumps(r.body, ensure_ascii=False)]
    assert summarizer  # the instructions reached the summarizer
    assert session.status().compactions == 1
    session.send("after compaction")
    session.undo_compact()
    assert session.history[:len(before)] == before
    assert [m.text for m in session.history[len(before):]][0] == "after compaction"
    with pytest.raises(Exception, match="no compaction to undo"):
        session.undo_compact()
    assert len([m for m in session.transcript if m.role is Role.USER]) == 9


def test_wrong_key_fails_with_one_redacted_sentence_and_history_kept(emulator: Any) -> None:
    emu = emulator(api_key="sk-right-key-000000000000")
    wrong = "sk-wrong-key-1234567890abcdef"
    client = emu.openai_client(api_key=wrong, max_retries=0)
    session = ChatSession("openai:emulator", client=client, settings=Settings(), name="auth")
    with pytest.raises(ChatError) as info:
        session.send("hello")
    message = str(info.value)
    assert info.value.failure.kind is FailureKind.AUTH
    assert wrong not in message and "\n" not in message
    assert session.history == ()
    assert [m.text for m in session.transcript] == ["hello"]
    assert [r.status for r in emu.requests] == [401, 401]  # one retry, then the error
    session.close()
    assert wrong not in "".join(p.read_text() for p in session.directory.rglob("*")
                                if p.is_file())


@pytest.mark.parametrize("wire", WIRES)
def test_transient_errors_retry_through_the_injected_sleep(emulator: Any, wire: str) -> None:
    emu = emulator()
    emu.fail_next(503, times=2)
    sleeps: list[float] = []
    provider = make_provider(wire, emulator=emu, max_retries=0)
    session = ChatSession(wire, provider=provider, settings=Settings(), sleep=sleeps.append)
    assert session.send("hello").text.startswith("Emulator reply")
    assert [r.status for r in emu.requests] == [503, 503, 200]
    assert len(sleeps) == 2 and sleeps[1] >= sleeps[0] > 0
    emu.fail_next(429, retry_after=3, times=1)
    session.send("again")
    assert sleeps[-1] == 3


@pytest.mark.parametrize("wire", WIRES)
def test_output_limit_is_learned_once(emulator: Any, wire: str) -> None:
    emu = emulator(context_window=8192, max_output_tokens=300)
    provider = make_provider(wire, emulator=emu, max_retries=0)
    # The catalogue would not know this model's output limit; make the provider not know it.
    provider.info = dataclasses.replace(provider.info, max_output_tokens=4096)
    session = ChatSession(wire, provider=provider, settings=Settings(), max_tokens=1000)
    for i in range(5):
        assert session.send(f"turn {i}").finish_reason == "end"
    rejected = [r for r in emu.requests if r.status != 200]
    assert len(rejected) == 1 and rejected[0].fault == "output_limit"
    assert all(r.body.get("max_tokens", r.body.get("max_completion_tokens")) <= 300
               for r in emu.requests[1:])


def logs_request(*sizes: int) -> str:
    return "three logs " + " ".join(f'[[tool fetch {{"n": {n}}}]]' for n in sizes)


@pytest.mark.parametrize("wire", WIRES)
def test_a_turn_over_the_window_after_compaction_is_fitted_before_it_is_sent(
        emulator: Any, wire: str) -> None:
    # The turn's own tool results stay in the kept tail, so compaction cannot reach its
    # target; the body must be fitted (previews of the persisted results), not sent blind.
    emu = emulator(context_window=4096)
    session = ChatSession(wire, emulator=emu, tools=[fetch], builtin_tools=False,
                          name=f"fit-{wire.replace(':', '-')}")
    texts = ["here is my trace:\n" + "trace line 0123456789\n" * 300,
             logs_request(30_000, 30_001, 30_002), "what do the logs say?"]
    run = converse(session, emu, texts, stream=False)
    assert [r.status for r in emu.requests] == [200] * len(emu.requests)
    check_run(run, tool_results=True)
    last = body_history(emu.requests[run.spans[1][1] - 1])
    results = [m.text for m in last if m.role is Role.TOOL]
    assert len(results) == 3 and all(len(t) < 30_000 for t in results)
    # Fitted below the compaction trigger: the next turn does not summarize again.
    start, end = run.spans[2]
    assert not any(is_summarizer(body_history(r)) for r in emu.requests[start:end])


def test_a_body_over_a_learned_cap_is_fitted_not_rejected_again(emulator: Any) -> None:
    emu = emulator(context_window=200_000, max_body="16KB")
    session = ChatSession("emulator", emulator=emu, tools=[fetch], builtin_tools=False,
                          name="learned-cap-fit")
    texts = [filler(1, 9000), filler(2, 9000), logs_request(30_000, 30_001, 30_002),
             "what do the logs say?"]
    run = converse(session, emu, texts, stream=False)
    rejected = [r for r in emu.requests if r.status != 200]
    assert len(rejected) == 1 and rejected[0].status == 413
    after = emu.requests[emu.requests.index(rejected[0]) + 1:]
    assert all(r.body_bytes < rejected[0].body_bytes for r in after)
    assert session.caps.smallest_rejected == rejected[0].body_bytes
    check_run(run, payload=True, tool_results=True)


def test_a_message_too_big_for_the_proxy_is_named_against_what_was_learned(
        emulator: Any) -> None:
    # The give-up sentence quotes the rejected size as a rejection and the learned cap the
    # status line gave — not the rejected size as what the path "can carry" (a user who
    # trimmed to just under it failed again).
    emu = emulator(context_window=128_000, max_body="20KB")
    session = ChatSession("emulator", emulator=emu, builtin_tools=False, name="too-big")
    learned: list[Any] = []
    session.subscribe(lambda e: learned.append(e) if isinstance(e, CapChanged)
                      and e.source == "learned" else None)
    session.send("hello", stream=False)
    with pytest.raises(ChatError) as caught:
        session.send("big " + "lorem ipsum dolor " * 1500, stream=False)
    rejected = [r for r in emu.requests if r.status == 413]
    assert len(rejected) == 1
    said = str(caught.value)
    assert "can carry" not in said
    assert f"the {format_size(rejected[0].body_bytes)} request the proxy/gateway already " \
        "rejected" in said
    assert learned and f"looks to be about {format_size(learned[-1].cap)}" in said
    assert learned[-1].cap < 20 * 1024 < rejected[0].body_bytes
    assert session.history[-1].text.startswith("Emulator reply")    # nothing was lost


@pytest.mark.parametrize("wire", WIRES)
def test_sizes_are_measured_without_the_sdk_encoding_each_candidate(emulator: Any,
                                                                    wire: str) -> None:
    # Compaction and fitting size many candidate histories: the provider's fast
    # ``measure`` does that; the SDK encodes a body once per request sent (plus the
    # pre-flight measurement of a request that compaction then replaced).
    emu = emulator(context_window=4096)
    session = ChatSession(wire, emulator=emu, tools=[fetch], builtin_tools=False,
                          name=f"encodes-{wire.replace(':', '-')}", settings=OWN)
    encodes = 0
    encode = session.provider.encode

    def counted(request: Any) -> bytes:
        nonlocal encodes
        encodes += 1
        return encode(request)

    session.provider.encode = counted  # type: ignore[method-assign]
    converse(session, emu, ["here is my trace:\n" + "trace line 0123456789\n" * 300,
                            logs_request(30_000, 30_001, 30_002), "what do the logs say?"],
             stream=False)
    compactions = session.status().compactions
    assert compactions >= 1
    assert encodes <= len(emu.requests) + compactions


# -- a window learned from the provider; event order and wording; summary before drop -------

@pytest.mark.parametrize("wire", WIRES)
def test_a_window_reported_by_the_provider_is_learned_once(emulator: Any, wire: str) -> None:
    # The user set CHATCLI_CONTEXT_WINDOW=32000, the server's real window is 4096: the
    # first overflow teaches the window, so it does not come back every few turns.
    emu = emulator(context_window=4096)
    # (in the turns: a summary prepared in the background may meet the real window first,
    # with its own max_tokens — a second rejection this test is not about; see the note)
    session = ChatSession(wire, emulator=emu,
                          settings=Settings(context_window=32_000, background_compaction=False),
                          name=f"learn-window-{wire.replace(':', '-')}")
    texts = [f"Turn {i}: " + f"value{i} " * 100 for i in range(20)]
    run = converse(session, emu, texts, stream=False)
    rejected = check_run(run)
    assert [r.fault for r in rejected] == ["context"]
    learned = [e for e in run.events if isinstance(e, WindowLearned)]
    assert [(e.window, e.previous) for e in learned] == [(4096, 32_000)]
    status = session.status()
    assert status.window == 4096 and status.window_learned
    assert "4,096-token window (learned from the provider)" in str(status)
    # An explicit new window replaces the learned one; the same settings again do not.
    session.update(settings=session.settings)
    assert session.window == 4096
    session.update(settings=Settings(context_window=3000))
    assert session.window == 3000 and not session.status().window_learned


def payload_turns(n: int) -> list[str]:
    return [filler(i, 1500) for i in range(n)]


@pytest.mark.parametrize("wire", WIRES)
def test_after_a_413_the_oldest_messages_are_summarized_not_dropped(emulator: Any,
                                                                    wire: str) -> None:
    emu = emulator(context_window=200_000)
    provider = make_provider(wire, emulator=emu, max_retries=0)
    session = ChatSession(wire, provider=provider, settings=OWN,
                          name=f"p413-summary-{wire.replace(':', '-')}")
    texts = payload_turns(12)
    events: list[Event] = []
    session.subscribe(events.append)
    for text in texts[:10]:
        session.send(text, stream=False)
    emu.script("413:nginx")
    first = len(emu.requests)
    for text in texts[10:]:
        session.send(text, stream=False)
    statuses = [r.status for r in emu.requests[first:]]
    assert statuses.count(413) == 1 and statuses.count(200) == len(statuses) - 1
    assert is_summarizer(body_history(emu.requests[first + 1]))
    tags = [m.tag for m in session.history]
    assert TAG_SUMMARY in tags and TAG_COMPACTION_NOTICE not in tags
    assert tags.count(TAG_PAYLOAD_NOTICE) == 1
    steps = [e for e in events if isinstance(e, LadderStep)]
    assert len(steps) == 1 and "dropped" not in describe(steps[0])
    assert describe(steps[0]).startswith("⚠ Recoverable failure (payload too large (413))")
    # The ⚠ line comes before what was learned from it.
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("LadderStep") < kinds.index("CapChanged")
    # Every later request stays under the learned cap; all user messages stay known.
    cap = session.caps.effective()
    assert cap is not None
    assert all(r.body_bytes <= cap for r in emu.requests[first + 1:])
    assert [m.text for m in session.transcript if m.role is Role.USER] == texts
    assert problems(session.history) == []


@pytest.mark.parametrize("wire", WIRES)
def test_a_failing_summarizer_after_a_413_still_recovers_by_dropping(emulator: Any,
                                                                     wire: str) -> None:
    emu = emulator(context_window=200_000)
    provider = make_provider(wire, emulator=emu, max_retries=0)
    session = ChatSession(wire, provider=provider, settings=OWN,
                          name=f"p413-nosummary-{wire.replace(':', '-')}")
    texts = payload_turns(11)
    events: list[Event] = []
    session.subscribe(events.append)
    for text in texts[:10]:
        session.send(text, stream=False)
    emu.script("413:nginx", 500)     # the request, then the summarizer's (no retry of its own)
    first = len(emu.requests)
    reply = session.send(texts[10], stream=False)
    assert reply.finish_reason == "end"
    assert [r.status for r in emu.requests[first:]] == [413, 500, 200]
    tags = [m.tag for m in session.history]
    assert TAG_SUMMARY not in tags and TAG_COMPACTION_NOTICE in tags
    assert session.status().compactions == 0
    steps = [describe(e) for e in events if isinstance(e, LadderStep)]
    assert steps[0].startswith("⚠ Recoverable failure")
    assert "summary not used (the summarizer failed" in steps[1]
    assert "messages dropped" in steps[1] and "⚠" not in steps[1]


@pytest.mark.parametrize("wire", WIRES)
def test_a_dropped_connection_is_called_dropped_and_the_warning_comes_first(
        emulator: Any, wire: str) -> None:
    emu = emulator(context_window=2_000_000)
    provider = make_provider(wire, emulator=emu, max_retries=0)
    session = ChatSession(wire, provider=provider, settings=Settings(),
                          name=f"drop-words-{wire.replace(':', '-')}")
    big = "x" * 520_000     # over 500 KB: a dropped connection then means "payload"
    session.send("first " + big[:100_000], stream=False)
    events: list[Event] = []
    session.subscribe(events.append)
    emu.script("drop")
    session.send("second " + big, stream=False)
    lines = [line for e in events for line in describe(e).splitlines()]
    warn = next(i for i, line in enumerate(lines) if line.startswith("⚠"))
    learned = next(i for i, line in enumerate(lines) if line.startswith("ℹ Learned"))
    assert warn < learned
    assert "request was dropped" in lines[learned]
    assert not any("request was rejected" in line for line in lines)


def test_the_summarizer_input_is_bounded_by_the_learned_cap(emulator: Any) -> None:
    # A history far above a cap learned late: the summarizer's own request must fit the
    # cap too, or the proxy that taught it would reject the summary as well.
    emu = emulator(context_window=200_000)
    provider = make_provider("emulator", emulator=emu, max_retries=0)
    session = ChatSession("emulator", provider=provider, settings=Settings(),
                          name="summarizer-under-cap")
    for i in range(12):
        session.send(filler(i, 4000), stream=False)
    assert session.status().history_bytes > 45 * 1024
    session.caps.record_rejection(30 * 1024)       # a learned cap of about 22 KB
    cap = session.caps.effective()
    assert cap is not None and cap < 30 * 1024
    first = len(emu.requests)
    session.send("and now?", stream=False)
    summarizer = [r for r in emu.requests[first:] if is_summarizer(body_history(r))]
    assert summarizer
    assert all(r.body_bytes <= cap for r in emu.requests[first:])
    assert any(m.tag == TAG_SUMMARY for m in session.history)


def test_a_learned_cap_survives_resume_on_the_same_emulator_only(emulator: Any) -> None:
    emu = emulator(context_window=200_000, max_body="16KB", api_key=API_KEY)
    session = ChatSession("emulator", emulator=emu, builtin_tools=False, name="persist-cap")
    run = converse(session, emu, [filler(i, 6000) for i in range(4)], stream=False)
    rejected = check_run(run, payload=True)
    assert len(rejected) == 1 and rejected[0].status == 413
    cap, bpt = session.caps.effective(), session.estimator.bytes_per_token
    assert session.status().cap_source == "learned" and session.estimator.samples >= 1
    session.close()
    saved = session.directory / "learned.json"
    assert saved.stat().st_mode & 0o777 == 0o600
    assert API_KEY not in saved.read_text(encoding="utf-8")

    # Same emulator (same path, same model): the cap is back, no second 413.
    first = len(emu.requests)
    again = ChatSession.resume("persist-cap", emulator=emu)
    assert again.caps.effective() == cap and again.status().cap_source == "learned"
    assert again.estimator.bytes_per_token == bpt
    more = [filler(i, 6000) for i in range(4, 8)]
    for text in more:
        assert again.send(text, stream=False).text
    after = emu.requests[first:]
    assert len(after) >= len(more) and [r.status for r in after if r.status != 200] == []
    assert all(r.body_bytes <= cap for r in after)
    # The payload notice is in the restored history already: not injected a second time.
    assert all(sum(m.text.count(NOTICE_HEAD) for m in body_history(r)) <= 1 for r in after
               if r.body is not None and not is_summarizer(body_history(r)))
    bpt = again.estimator.bytes_per_token
    again.close()

    # A new emulator is a new path: no learned cap (status says why), calibration kept.
    fresh = emulator(context_window=200_000, max_body="16KB")
    third = ChatSession.resume("persist-cap", emulator=fresh)
    status = third.status()
    assert status.cap is None and status.cap_source is None
    assert "not restored" in str(status) and "no payload cap configured" in str(status)
    assert third.estimator.bytes_per_token == bpt and third.estimator.samples >= 1
    third.close()


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "model": "emulator"}',
                                     '{"version": 1, "model": "emulator", "caps": "x"}'])
def test_a_corrupt_learned_state_file_is_ignored_with_one_warning(emulator: Any,
                                                                  content: str) -> None:
    emu = emulator(context_window=200_000, max_body="16KB")
    session = ChatSession("emulator", emulator=emu, builtin_tools=False, name="persist-bad")
    session.send("hello", stream=False)
    session.close()
    (session.directory / "learned.json").write_text(content, encoding="utf-8")
    with pytest.warns(RuntimeWarning) as caught:
        again = ChatSession.resume("persist-bad", emulator=emu)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "learned.json" in messages[0] and "\n" not in messages[0]
    assert ("unknown format version 99" in messages[0]) == ("99" in content)
    assert again.status().cap is None and again.estimator.samples == 0
    assert again.send("still works", stream=False).text
    again.close()
    # The next save replaced the bad file with a valid one.
    assert json.loads((session.directory / "learned.json").read_text())["version"] == 1


@pytest.mark.parametrize("wire", WIRES)
def test_a_compaction_the_chat_budget_asks_for_says_so_first(emulator: Any, wire: str,
                                                             tmp_path: Path) -> None:
    # Within the window and with no cap, but over 75 % of the window: the compaction is
    # announced with its reason (before, only "Summarizing older messages…" was shown).
    emu = emulator(context_window=8000)
    lines: list[str] = []
    session = ChatSession(wire, emulator=emu, files_root=tmp_path,
                          settings=OWN.replace(background_compaction=False),  # in the turn
                          on_event=lambda e: lines.append(describe(e)))
    for i in range(10):
        session.send(filler(i, 2500), stream=False)
    said = [line for line in lines if line]
    first = next(i for i, line in enumerate(said) if "Summarizing older messages" in line)
    assert said[first - 1].startswith("ℹ pre-flight: history ")
    assert said[first - 1].endswith(
        "(75% of the 8,000-token window: chat_budget_ratio) — compacting")
    assert session.status().compactions >= 1


# -- a summary that reads every message it replaces (issue 27) ------------------------------

def _user_texts(record: Any) -> str:
    return "\n".join(m.text for m in body_history(record) if m.role is Role.USER)


@pytest.mark.parametrize("wire", WIRES)
def test_a_long_history_is_summarized_in_chunks_within_the_cap(emulator: Any,
                                                               wire: str) -> None:
    emu = emulator(context_window=200_000, max_body="24KB")
    # (the summaries run in the turns, where their requests are counted: not prepared ahead)
    session = ChatSession(wire, emulator=emu, builtin_tools=False, name=f"chunks-{wire[-3:]}",
                          settings=OWN.replace(background_compaction=False))
    events: list[Event] = []
    session.subscribe(events.append)
    texts = [filler(i, 3_000) for i in range(12)]
    for text in texts:
        assert session.send(text, stream=False).text
    summarizer = [r for r in emu.requests if r.body is not None
                  and is_summarizer(body_history(r))]
    applied = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"
               and e.outcome == "summary"]
    assert applied and max(e.chunks for e in applied) > 1          # read in chunks
    assert sum(e.summary_requests for e in applied) == len(summarizer)
    # Every summary request fit the proxy's cap (and the window: none was refused).
    assert all(r.status == 200 and r.body_bytes <= 24 * 1024 for r in summarizer)
    # Every message the summaries replaced reached a summarizer whole.
    kept = "\n".join(m.text for m in session.history)
    sent = [_user_texts(r) for r in summarizer]
    replaced = [t for t in texts if t not in kept]
    assert replaced
    for text in replaced:
        assert any(text in s for s in sent), text[:40]
    assert all(e.dropped_unread == 0 for e in applied)
    session.close()


def test_past_the_summary_request_bound_the_oldest_are_dropped_and_told(emulator: Any) -> None:
    emu = emulator(context_window=200_000, max_body="24KB")
    session = ChatSession("emulator", emulator=emu, builtin_tools=False, name="chunks-bound",
                          settings=Settings(summary_max_requests=1,
                                            background_compaction=False))
    events: list[Event] = []
    session.subscribe(events.append)
    for i in range(12):
        assert session.send(filler(i, 3_000), stream=False).text
    summarizer = [r for r in emu.requests if r.body is not None
                  and is_summarizer(body_history(r))]
    applied = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"
               and e.outcome == "summary"]
    assert applied and all(e.summary_requests <= 1 and e.chunks <= 1 for e in applied)
    dropped = [e for e in applied if e.dropped_unread]
    assert dropped and len(summarizer) == sum(e.summary_requests for e in applied)
    line = describe(dropped[0])
    assert f"{dropped[0].dropped_unread} messages dropped unread (summary-request bound 1)" \
        in line
    notices = [m for m in session.history if m.tag == TAG_COMPACTION_NOTICE]
    assert len(notices) == 1 and "left unread" in notices[0].text
    session.close()


def test_the_summarizers_reply_says_when_it_was_cut_and_a_cut_one_is_retried(
        emulator: Any) -> None:
    from ipy_ctxrecovery.core.compactor import SummaryReply
    from ipy_ctxrecovery.session.compaction import SessionCompactor

    emu = emulator(context_window=200_000)
    session = ChatSession("emulator", emulator=emu, builtin_tools=False, name="chunks-cut",
                          settings=Settings(background_compaction=False))
    for i in range(6):
        session.send(filler(i, 2_000), stream=False)
    sizer, bus = session._sizer, session.bus        # the session's own, as it builds them
    real = SessionCompactor(sizer, bus, session.settings)
    reply = real._ask_model(markers.preamble(2) + "\n\n" + filler(0, 2_000), 5, None)
    assert isinstance(reply, SummaryReply) and reply.truncated
    assert reply.output_tokens == 5 and reply.input_tokens
    asked: list[int] = []

    said = " ".join(session.history[0].text.split()[:40])   # a summary keeps some facts

    def cut_once(text: str, tokens: int, _log: Any) -> SummaryReply:
        asked.append(tokens)
        return SummaryReply(f"## Current step\n- {said}", truncated=len(asked) == 1)

    compactor = SessionCompactor(sizer, bus, session.settings, summarize=cut_once)
    spec = RequestSpec(max_tokens=None, stream=False)
    new, report = compactor.run(session.history, 2_000, spec, None, force=True)
    settings, tokens = compactor.bounded_settings()
    assert asked == [tokens, compactor.retry_tokens(settings, tokens)]
    assert asked[1] == min(2 * tokens, sizer.output_cap)
    assert report.applied and report.summary_requests == 2
