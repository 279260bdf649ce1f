"""``session/turns.py``: a server that leaves usage out of its streamed replies is said once,
and the session's token estimate is calibrated from its unstreamed replies only; a
continuation that fails, is refused, or only restarts / opens / echoes keeps the answer cut,
says so after it on screen, and marks it incomplete in the history."""

from __future__ import annotations

from typing import Any

from ipy_ctxrecovery import ChatSession
from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT as CONTINUATION_PROMPT_TEXT
from ipy_ctxrecovery.core.wording import continuation_detail, describe
from ipy_ctxrecovery.providers import make_provider


def test_no_usage_in_streams_is_said_once_and_calibrates_from_unstreamed_replies(
        emulator: Any) -> None:
    emu = emulator(stream_usage=False)
    session = ChatSession("emulator", emulator=emu, name="no-stream-usage")
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    start = session.estimator.bytes_per_token
    for i in range(3):
        assert session.send(f"question {i}: " + "context " * 50).text
    told = [e for e in seen if isinstance(e, ev.StreamUsageMissing)]
    assert len(told) == 1
    assert describe(told[0]).startswith("ℹ this server sends no token usage with streamed")
    # Streamed answers said nothing of tokens: the estimate is still the heuristic.
    assert session.estimator.samples == 0 and session.estimator.bytes_per_token == start
    assert session.send("and unstreamed?", stream=False).text
    assert session.estimator.samples == 1 and session.estimator.bytes_per_token != start
    assert len([e for e in seen if isinstance(e, ev.StreamUsageMissing)]) == 1
    session.close()


def test_a_server_with_usage_in_streams_says_nothing_of_it(emulator: Any) -> None:
    session = ChatSession("emulator", emulator=emulator(), name="stream-usage")
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    session.send("hello")
    assert not any(isinstance(e, ev.StreamUsageMissing) for e in seen)
    assert session.estimator.samples == 1
    session.close()


def test_it_is_said_again_for_another_provider(emulator: Any) -> None:
    first, second = emulator(stream_usage=False), emulator(stream_usage=False)
    session = ChatSession("emulator", emulator=first, name="two-servers")
    seen: list[ev.Event] = []
    session.subscribe(seen.append)
    session.send("one")
    session.send("two")
    provider = make_provider("emulator", emulator=second)
    session.update(provider=provider)
    session.send("three")
    assert len([e for e in seen if isinstance(e, ev.StreamUsageMissing)]) == 2
    session.close()
    provider.close()


# -- a continuation that fails: the answer is kept, cut, and said to be -----------------------

def _cut_then(emu: Any, fail: Any) -> Any:
    """``on_text`` that queues ``fail`` on the emulator at the first delta: the request in
    flight gets through, the continuation that follows meets it."""
    queued: list[bool] = []

    def on_text(delta: str) -> None:
        if not queued:
            queued.append(True)
            fail(emu)
    return on_text


def test_a_failed_continuation_keeps_the_answer_cut_and_marks_it_on_screen(emulator: Any) -> None:
    import io

    from ipy_ctxrecovery.core.continuation import INCOMPLETE
    from ipy_ctxrecovery.notebook.display import EventPrinter, Streamer

    emu = emulator()
    session = ChatSession("emulator", emulator=emu, name="cont-fails")
    out = io.StringIO()
    streamer = Streamer(mode="print", fmt="text", interval=0, out=out)
    printer = EventPrinter(out, before_line=streamer.break_line)
    session.subscribe(printer)
    shown = _cut_then(emu, lambda e: e.fail_next(400, message="the model is not available"))

    def on_text(delta: str) -> None:
        shown(delta)
        streamer(delta)

    reply = session.send("[[words 60]]", max_tokens=9, on_text=on_text)
    streamer.finish()
    assert reply.finish_reason == "length"
    assert reply.text == "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w"[:len(reply.text)]
    # The screen: the partial answer, then one line saying it was not continued.
    screen = out.getvalue().splitlines()
    assert screen[0] == reply.text
    assert screen[1].startswith("↗ answer cut at max_tokens=9 — continuing")
    assert len(screen) == 3
    assert screen[2].startswith("⚠ the answer above was cut at max_tokens=9 and could not be "
                                "continued (the continuation request failed:")
    assert "not available" in screen[2] and screen[2].endswith("kept as it is, incomplete")
    # The history keeps the user's message and the partial answer, marked incomplete.
    user, answer = session.history
    assert user.text == "[[words 60]]" and answer.text == reply.text
    assert "not continued" in answer.meta[INCOMPLETE]
    assert [m.text for m in session.transcript][-1] == reply.text
    # The next turn goes on from a consistent history.
    assert session.send("[[words 3]]").text == "w1 w2 w3"
    session.close()


def test_a_continuation_that_only_restarts_or_opens_is_not_joined_and_said(emulator: Any) -> None:
    from fakes import FakeProvider, cut_reply

    from ipy_ctxrecovery.core.continuation import INCOMPLETE
    from ipy_ctxrecovery.core.history import Message
    from ipy_ctxrecovery.providers.base import Response, StopReason, Usage

    partial = "A household refrigerator is a versatile appliance. It keeps food cold. Also"
    for continuation, why in [
            ("Here's the continuation:", "a meta opener"),
            ("**A household refrigerator is a versatile appliance.** It hums.",
             "a restart of the answer"),
            (CONTINUATION_PROMPT_TEXT, "an echo of the continuation prompt")]:
        fake = FakeProvider([cut_reply(partial), continuation])
        session = ChatSession(provider=fake, name="cont-restarts")
        seen: list[ev.Event] = []
        session.subscribe(seen.append)
        reply = session.send("fridge?", max_tokens=20)
        assert reply.text == partial and reply.finish_reason == "length"
        (cut,) = [e for e in seen if isinstance(e, ev.Truncated)]
        assert cut.failed == f"all the model wrote was {why}" and cut.max_tokens == 20
        assert continuation_detail(cut) == (f"answer cut at max_tokens 20, not continued: "
                                            f"{cut.failed} · kept as it is, incomplete")
        assert session.history[-1].meta[INCOMPLETE].endswith(cut.failed)
        session.close()
    # A refusal is not joined either.
    refused = Response(Message.assistant("I can't help with that."), StopReason.FILTERED,
                       Usage(10, 5), 0)
    session = ChatSession(provider=FakeProvider([cut_reply(partial), refused]), name="cont-no")
    seen = []
    session.subscribe(seen.append)
    assert session.send("fridge?", max_tokens=20).text == partial
    assert [e.failed for e in seen if isinstance(e, ev.Truncated)] == [
        "the model refused to continue"]
    session.close()


def test_an_answer_still_cut_when_the_escalations_run_out_is_marked_incomplete(
        emulator: Any) -> None:
    from ipy_ctxrecovery import Settings
    from ipy_ctxrecovery.core.continuation import INCOMPLETE

    session = ChatSession("emulator", emulator=emulator(), name="cont-out",
                          settings=Settings(max_token_escalations=1))
    reply = session.send("[[words 200]]", max_tokens=5)
    assert reply.finish_reason == "length"
    assert session.history[-1].meta[INCOMPLETE] == "still cut at max_tokens=10 after 1 escalations"
    session.close()
