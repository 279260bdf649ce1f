"""Background compaction (session/background.py): a summary prepared ahead of need and
swapped in at the turn that needs room — with the real SDKs against the emulator."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Any

import openai
import pytest
from fakes import FakeProvider, failure

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.events import BackgroundSummary, CompactionPhase
from ipy_ctxrecovery.core.history import TAG_SUMMARY, Message, Role, ToolResult
from ipy_ctxrecovery.core.wording import describe
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers.base import Request, Response
from ipy_ctxrecovery.session.background import same_message, starts_with

WINDOW = 8000


def words(i: int) -> str:
    return f"[turn {i}] " + "some words about the data " * 55


def chat(emulator: Any, latency: float = 0.0,
         **settings: Any) -> tuple[ChatSession, list[Any], Any]:
    emu = emulator(context_window=WINDOW, latency=latency)
    events: list[Any] = []
    session = ChatSession("emulator", emulator=emu,
                          settings=Settings(context_window=WINDOW, **settings))
    session.subscribe(events.append)
    return session, events, emu


def until(session: ChatSession, state: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while session.background != state:
        assert time.monotonic() < end, f"background state stayed {session.background!r}"
        time.sleep(0.02)


def turns_until_ready(session: ChatSession, limit: int = 40) -> int:
    for i in range(limit):
        session.send(words(i), stream=False, max_tokens=50)
        if session.background == "preparing":
            until(session, "ready")
            return i + 1
        if session.background == "ready":
            return i + 1
    raise AssertionError("no background summary was prepared")


def send_until_swapped(session: ChatSession, events: list[Any],
                       first: int) -> tuple[int, tuple[Message, ...]]:
    """Turns from ``first`` on until one swaps the prepared summary in: (its number, the
    history before it)."""
    for i in range(first, first + 30):
        events.clear()
        before = session.history
        session.send(words(i), stream=False, max_tokens=50)
        if of(events, "swapped"):
            return i, before
    raise AssertionError("the prepared summary was never swapped in")


def of(events: list[Any], state: str) -> list[BackgroundSummary]:
    return [e for e in events if isinstance(e, BackgroundSummary) and e.state == state]


def test_same_message_tolerates_only_a_shortened_tool_result() -> None:
    long = Message.tool("c1", "x" * 100, name="t")
    short = Message.tool("c1", "x" * 10, name="t")
    other = Message.tool("c2", "x" * 10, name="t")
    assert same_message(long, short)
    assert not same_message(short, long)
    assert not same_message(long, other)
    assert not same_message(Message.user("a"), Message.user("b"))
    base = (Message.user("a"), long)
    assert starts_with(base + (Message.assistant("z"),), (Message.user("a"), long))
    assert starts_with((Message.user("a"), short, Message.user("n")), base)
    assert not starts_with((Message.user("b"), short), base)
    assert not starts_with(base[:1], base)
    assert isinstance(long.tool_result, ToolResult)


def test_the_swap_keeps_what_was_appended_and_the_turn_does_not_summarize(
        emulator: Any) -> None:
    session, events, _ = chat(emulator)
    n = turns_until_ready(session)
    ready = of(events, "ready") + [None]     # told at the next turn
    i, before_swap = send_until_swapped(session, events, n)
    swapped = of(events, "swapped")[0]
    assert ready and swapped.covered_messages > 0
    # The turn that swapped asked for no summary of its own.
    assert not [e for e in events if isinstance(e, CompactionPhase) and e.phase == "summarize"]
    history = session.history
    summaries = [m for m in history if m.tag == TAG_SUMMARY]
    assert len(summaries) == 1
    # Everything after the summary is what the history held after the snapshot, in order,
    # then this turn's request and answer.
    at = history.index(summaries[0])
    # (what the compaction itself writes after the summary, the user's own words kept
    # verbatim, is tagged; the conversation's messages are not)
    kept = tuple(m for m in history[at + 1:] if m.tag is None)
    assert kept[-2].role is Role.USER and kept[-2].text == words(i)
    assert all(m in before_swap for m in kept[:-2]), "a kept message is not the one appended"
    assert kept[:-2] == before_swap[len(before_swap) - len(kept[:-2]):]
    session.close()


def test_undo_compact_restores_what_the_swap_replaced(emulator: Any) -> None:
    session, events, _ = chat(emulator)
    n = turns_until_ready(session)
    _, before = send_until_swapped(session, events, n)
    after = session.history
    session.undo_compact()
    restored = session.history
    assert restored[:len(before)] == before
    assert restored[len(before):] == after[-2:]
    assert not [m for m in restored if m.tag == TAG_SUMMARY]
    session.close()


def test_a_reset_discards_the_prepared_summary(emulator: Any) -> None:
    session, events, _ = chat(emulator)
    turns_until_ready(session)
    session.reset()
    assert session.background == "idle"
    events.clear()
    for i in range(3):
        session.send(words(100 + i), stream=False, max_tokens=50)
    assert not of(events, "swapped")
    assert not [m for m in session.history if m.tag == TAG_SUMMARY]
    session.close()


def test_a_changed_covered_range_discards_the_summary(emulator: Any) -> None:
    session, events, _ = chat(emulator)
    n = turns_until_ready(session)
    # Another history that does not start with the snapshot (an edit, a recovery's cut).
    session._history = session.history[:1] + session.history[3:]  # noqa: SLF001 - the edit
    events.clear()
    for i in range(n, n + 30):
        session.send(words(i), stream=False, max_tokens=50)
        if of(events, "discarded") or of(events, "swapped"):
            break
    assert of(events, "discarded") and not of(events, "swapped")
    assert "changed" in (of(events, "discarded")[0].reason or "")
    session.close()


def test_off_by_the_setting_summarizes_in_the_turn(emulator: Any) -> None:
    session, events, _ = chat(emulator, background_compaction=False)
    for i in range(25):
        session.send(words(i), stream=False, max_tokens=50)
    assert session.background == "idle"
    assert not [e for e in events if isinstance(e, BackgroundSummary)]
    assert [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"
            and e.outcome == "summary"]
    session.close()


def test_the_summary_is_never_sent_alongside_a_turn(emulator: Any) -> None:
    emu = emulator(context_window=WINDOW, latency=0.15)
    lock = threading.Lock()
    flight = {"now": 0, "most": 0}

    def sent(_request: Any) -> None:
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])

    def done(_response: Any) -> None:
        with lock:
            flight["now"] -= 1

    client = openai.OpenAI(base_url=emu.openai_base_url, api_key="sk-local",
                           default_headers=emu.token_headers,
                           http_client=openai.DefaultHttpxClient(
                               event_hooks={"request": [sent], "response": [done]}))
    session = ChatSession("openai:emulator", client=client,
                          settings=Settings(context_window=WINDOW))
    events: list[Any] = []
    session.subscribe(events.append)
    for i in range(30):     # no think time: each turn starts while a summary may be in flight
        session.send(words(i), stream=False, max_tokens=50)
    assert of(events, "ready"), "no summary was prepared in the background"
    assert flight["most"] == 1
    session.close()


def test_an_interrupt_while_waiting_cancels_the_summary_with_the_history_as_it_was(
        emulator: Any) -> None:
    session, events, emu = chat(emulator, latency=0.6)   # a summary takes 0.6 s
    for i in range(40):
        session.send(words(i), stream=False, max_tokens=50)
        if session.background == "preparing":
            break
    else:
        raise AssertionError("no background summary was started")
    history = session.history
    def interrupt() -> None:    # a real SIGINT, as a kernel interrupt sends
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    timer = threading.Timer(0.15, interrupt)   # while the turn waits for the summary
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            session.send("the next question", stream=False, max_tokens=50)
    finally:
        timer.cancel()
    assert session.history == history
    assert session.background in ("idle", "failed")
    # The interrupt came while the turn waited: its own request was never sent.
    assert not any("the next question" in (r.raw or b"").decode("utf-8", "replace")
                   for r in emu.requests)
    events.clear()
    session.send("the next question", stream=False, max_tokens=50)
    assert not of(events, "ready") and not of(events, "swapped")
    session.close()


class _RefusesSummaries(FakeProvider):
    """Answers every turn; refuses every summary request (a server error)."""

    def send(self, request: Request, on_text: Any = None) -> Response:
        if any(m.role is Role.SYSTEM and "STRUCTURED SUMMARY" in m.text
               for m in request.messages):
            self.requests.append(request)
            raise failure(FailureKind.OTHER, "the summarizer is down")
        return super().send(request, on_text)


def turns_until(session: ChatSession, events: list[Any], state: str) -> None:
    """Turns (at most 40), each after the worker has finished, until a background summary
    event of ``state`` was told."""
    for i in range(40):
        session.send(words(i), stream=False, max_tokens=50)
        if of(events, state):
            return
        session._background.wait()      # noqa: SLF001 - let the worker finish first


def test_a_failed_background_summary_is_one_line_and_the_turn_goes_on() -> None:
    provider = _RefusesSummaries(window=WINDOW)
    session = ChatSession("fake", provider=provider, settings=Settings(context_window=WINDOW))
    events: list[Any] = []
    session.subscribe(events.append)
    turns_until(session, events, "failed")
    failed = of(events, "failed")
    assert failed, "no background summary was tried"
    line = describe(failed[0])
    assert "\n" not in line and "compacts as usual" in line and "summarizer is down" in line
    # Every turn was answered; the history is whole.
    assert session.history[-1].role is Role.ASSISTANT
    # Not asked again on the very next turns (it failed on nearly this history).
    tried = len(of(events, "preparing"))
    session.send(words(100), stream=False, max_tokens=50)
    session._background.wait()      # noqa: SLF001
    session.send(words(101), stream=False, max_tokens=50)
    assert len(of(events, "preparing")) == tried
    session.close()


class _CachedSummaries(FakeProvider):
    """Answers as FakeProvider; a summary request reports half its input read from the
    cache and a tenth written to it (half of that for an hour)."""

    def send(self, request: Request, on_text: Any = None) -> Response:
        if not any(m.role is Role.SYSTEM and "STRUCTURED SUMMARY" in m.text
                   for m in request.messages):
            return super().send(request, on_text)
        self.script.append("## Conversation so far\n- " + "\n- ".join(
            words(i)[:120] for i in range(12)))
        reply = super().send(request, on_text)
        prompt = reply.usage.prompt_tokens or 0
        usage = dataclasses.replace(reply.usage, cached_tokens=prompt // 2,
                                    cache_write_tokens=prompt // 10,
                                    cache_write_1h_tokens=prompt // 20)
        return dataclasses.replace(reply, usage=usage)


def test_a_background_summarys_cache_reads_and_writes_are_counted() -> None:
    # Its input tokens were counted, its cache reads and writes were not: %chat usage then
    # billed the reads as uncached input.
    session = ChatSession("fake", provider=_CachedSummaries(window=WINDOW),
                          settings=Settings(context_window=WINDOW))
    events: list[Any] = []
    session.subscribe(events.append)
    turns_until(session, events, "ready")
    (ready,) = of(events, "ready")
    # (Its requests' halves and tenths, summed: it may take more than one request.)
    assert 0 < ready.cached_tokens <= ready.prompt_tokens // 2
    assert 0 < ready.cache_write_tokens <= ready.prompt_tokens // 10
    assert 0 < ready.cache_write_1h_tokens < ready.cache_write_tokens
    status = session.status()
    assert (status.cached_tokens, status.cache_write_tokens, status.cache_write_1h_tokens) \
        == (ready.cached_tokens, ready.cache_write_tokens, ready.cache_write_1h_tokens)
    session.close()


def test_the_panel_and_status_show_the_background_work_between_cells(emulator: Any) -> None:
    from ipy_ctxrecovery.notebook.panel import ContextPanel

    session, _, _ = chat(emulator, latency=0.2)    # the summary takes its time
    panel = ContextPanel(title="default")
    panel.attach(session)
    shown: list[str] = []
    panel.show = lambda **_: None    # type: ignore[method-assign]
    for i in range(40):
        session.send(words(i), stream=False, max_tokens=50)
        panel.end_turn()
        if session.background == "preparing":
            shown.append(panel.text())
            break
    assert any("background summary: being prepared" in t for t in shown), shown
    until(session, "ready")
    # No turn ran: the worker's end re-rendered the panel by itself.
    assert "background summary: ready (swapped in when the history needs room)" in panel.text()
    assert "background summary: ready" in str(session.status())
    panel.close()
    session.close()


def test_the_swapping_turns_card_says_what_was_swapped_in(emulator: Any) -> None:
    from ipy_ctxrecovery.notebook.turn_card import TurnCard, TurnRecord

    session, _, _ = chat(emulator)
    n = turns_until_ready(session)
    for i in range(n, n + 30):
        record = TurnRecord()
        stop = session.subscribe(record.feed)
        session.send(words(i), stream=False, max_tokens=50)
        stop()
        if any(isinstance(e, BackgroundSummary) and e.state == "swapped"
               for step in record.steps for e in step.events):
            break
    else:
        raise AssertionError("nothing was swapped in")
    record.finish(elapsed=1.0)
    row = next(line for line in TurnCard(record).text().splitlines()
               if "background summary" in line and "swapped in" in line)
    assert "no wait" in row and "messages replaced" in row
    assert record.something_happened
    session.close()
