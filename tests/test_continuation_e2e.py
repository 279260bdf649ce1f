"""Answers cut at max_tokens, continued and joined, through the real SDKs against the emulator.

Every place a cut can fall — a word boundary, mid-word, mid-line, inside a code block, CJK
text — with every way the emulator can answer the continuation prompt (leading space kept
or not, a repeat of 30 characters, a restarted line, a re-opened fence), on the OpenAI
wire, on the Anthropic wire for a model that rejects a prefill, and on the Anthropic wire
by prefill. The cuts fall in different places because ``max_tokens`` differs per send and
doubles at each escalation.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.api import NO_PREFILL, PREFILL_WHITESPACE
from ipy_ctxrecovery.emulator.replies import META_OPENERS
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.providers import make_provider


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(1, n + 1))


def _cjk(start: int, count: int) -> str:
    # Distinct ideographs, a comma every 9 and a full stop every 23: no accidental repeats.
    out = []
    for i in range(count):
        out.append(chr(0x4E00 + start + i))
        out.append("。" if i % 23 == 22 else "、" if i % 9 == 8 else "")
    return "".join(out)


CODE = ("Here is the loop:\n\n```python\ndef run(values):\n"
        + "\n".join(f"    total{i} = compute{i}(values[{i}])" for i in range(8))
        + "\n    return total7\n```\n\nThat is all.")
TEXTS = {
    "words": words(70),
    "lines": "\n".join(f"{i}. check item{i} against limit{i}" for i in range(1, 13)),
    "code": CODE,
    "cjk": _cjk(0, 110) + "\n\n" + _cjk(200, 90),
}
STYLES: dict[str, dict[str, Any]] = {
    "exact": {},
    "no leading space": {"continuation_leading_space": False},
    "repeats 30 chars": {"continuation_repeat": 30},
    "restarts the line": {"continuation_repeat": "line", "continuation_leading_space": False},
    "reopens the fence": {"continuation_repeat": "fence", "continuation_leading_space": False},
    # What SmolLM2-135M does: restarts the answer (its opening in bold), writes a meta
    # opener first, echoes the continuation prompt.
    "restarts the answer": {"continuation_repeat": "restart"},
    "meta opener": {"continuation_opener": "meta"},
    "echoes the prompt": {"continuation_opener": "echo", "continuation_leading_space": False},
    "meta opener and restart": {"continuation_opener": "meta", "continuation_repeat": "restart"},
}
LIMITS = (5, 9)
SETTINGS = Settings(max_token_escalations=8)


def request_of(text: str) -> str:
    return "[[words 70]]" if text == TEXTS["words"] else "[[echo]]" + text


def last_messages(record: Any) -> list[dict[str, Any]]:
    return list(record.body["messages"])


def run_all(session: ChatSession, emu: Emulator) -> None:
    for name, text in TEXTS.items():
        for limit in LIMITS:
            start = len(emu.requests)
            streamed: list[str] = []
            stream = limit == LIMITS[0]
            reply = session.send(request_of(text), max_tokens=limit, record=False,
                                 stream=stream, on_text=streamed.append if stream else None)
            assert reply.text == text, (name, limit, reply.text)
            if stream:
                # What was streamed reads as the stitched answer: no repeat shown twice.
                assert "".join(streamed) == text, (name, limit, streamed)
            assert reply.finish_reason == "end"
            sent = emu.requests[start:]
            assert len(sent) > 2, (name, limit)                # cut, and cut again
            assert [r.status for r in sent] == [200] * len(sent)


@pytest.mark.parametrize("style", STYLES)
def test_openai_wire_joins_every_cut_for_every_way_of_resuming(emulator: Any, style: str) -> None:
    emu = emulator(**STYLES[style])
    session = ChatSession("emulator", emulator=emu, settings=SETTINGS,
                          name=f"join-o-{list(STYLES).index(style)}")
    run_all(session, emu)
    # Every continuation request sent the partial answer up to a word start, then the prompt.
    continued = [r for r in emu.requests if last_messages(r)[-1]["content"] == CONTINUATION_PROMPT]
    assert continued
    for record in continued:
        partial = last_messages(record)[-2]
        assert partial["role"] == "assistant"
        assert any(text.startswith(partial["content"]) for text in TEXTS.values())
    session.close()


def test_the_emulator_plays_small_model_continuations_over_http(emulator: Any) -> None:
    emu = emulator(continuation_repeat="restart")
    request, partial = "[[words 12]]", "w1 w2 w3 w4 w5 w6 w7 "
    assert _continue(emu, request, partial) == "**w1 w2 w3 w4 w5 w6** w7 w8 w9 w10 w11 w12"
    # The bold opening only where it ends before the resume point.
    assert _continue(emu, request, "w1 w2 ") == "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12"
    emu.configure(continuation_repeat=0, continuation_opener="meta")
    assert _continue(emu, request, partial) == (
        META_OPENERS[len(partial) % len(META_OPENERS)] + "\n\nw8 w9 w10 w11 w12")
    emu.configure(continuation_opener="echo")
    assert _continue(emu, request, partial) == CONTINUATION_PROMPT + "\n\nw8 w9 w10 w11 w12"
    with pytest.raises(ConfigError, match="continuation_opener"):
        emu.configure(continuation_opener="chatty")
    with pytest.raises(ConfigError, match="continuation_repeat"):
        emu.configure(continuation_repeat="rewrite")


@pytest.mark.parametrize("style", ["meta opener", "echoes the prompt"])
def test_no_meta_text_or_prompt_reaches_the_history_or_the_transcript(emulator: Any,
                                                                      style: str) -> None:
    emu = emulator(**STYLES[style])
    session = ChatSession("emulator", emulator=emu, settings=SETTINGS,
                          name=f"join-kept-{list(STYLES).index(style)}")
    for limit in LIMITS:
        assert session.send(request_of(TEXTS["lines"]), max_tokens=limit).text == TEXTS["lines"]
    kept = [m.text for m in session.history if m.role.value == "assistant"]
    assert kept == [TEXTS["lines"]] * len(LIMITS)
    said = [m.text for m in session.transcript if m.role.value == "assistant"]
    assert said == kept
    assert not any(CONTINUATION_PROMPT.split("\n")[0] in t or "continu" in t.lower()
                   for t in said)
    session.close()


@pytest.mark.parametrize("style", STYLES)
def test_anthropic_wire_without_prefill_joins_every_cut(emulator: Any, style: str) -> None:
    # Claude 4.6 and later reject a prefill: the emulator rejects it too, so any prefill
    # would fail the turn; the prompt is used, and joined by the same rule.
    emu = emulator(prefill="reject", **STYLES[style])
    provider = make_provider("anthropic:claude-opus-4-6", client=emu.anthropic_client(max_retries=0))
    session = ChatSession(provider=provider, settings=SETTINGS,
                          name=f"join-a-{list(STYLES).index(style)}")
    run_all(session, emu)
    assert all(r.fault != "prefill" for r in emu.requests)
    assert any(CONTINUATION_PROMPT in json.dumps(r.body, ensure_ascii=False).replace("\\n", "\n")
               for r in emu.requests)
    session.close()


def test_anthropic_wire_continues_by_prefill_where_the_model_allows_it(emulator: Any) -> None:
    # The emulator's way of answering the prompt would lose spaces; a prefill is continued
    # exactly, so that never matters.
    emu = emulator(continuation_leading_space=False, continuation_repeat="line")
    session = ChatSession("emulator:anthropic", emulator=emu, settings=SETTINGS, name="join-prefill")
    run_all(session, emu)
    prefilled = [r for r in emu.requests if last_messages(r)[-1]["role"] == "assistant"]
    assert len(prefilled) >= 2 * len(TEXTS) * len(LIMITS)
    for record in prefilled:
        text = last_messages(record)[-1]["content"][-1]["text"]
        assert text == text.rstrip() and any(t.startswith(text) for t in TEXTS.values())
    assert not any(CONTINUATION_PROMPT in json.dumps(r.body, ensure_ascii=False)
                   .replace("\\n", "\n") for r in emu.requests)
    session.close()


def test_extended_thinking_turns_the_prefill_off(emulator: Any) -> None:
    emu = emulator(prefill="reject")
    session = ChatSession("emulator:anthropic", emulator=emu, settings=SETTINGS, name="join-think")
    # max_tokens above the budget, as the API wants (else the budget would be fitted).
    reply = session.send("[[words 1200]]", max_tokens=1100,
                         options={"thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert reply.text == words(1200)
    assert [r.fault for r in emu.requests] == [None] * len(emu.requests)
    assert len(emu.requests) >= 2
    assert all(r.body["thinking"]["budget_tokens"] == 1024 for r in emu.requests)
    assert CONTINUATION_PROMPT.splitlines()[0] in json.dumps(emu.requests[-1].body)
    session.close()


# -- the emulator's own behaviour, through the SDKs -------------------------------------------------

def _openai_text(emu: Emulator, messages: list[dict[str, Any]], **kw: Any) -> str:
    client = emu.openai_client(max_retries=0)
    try:
        out = client.chat.completions.create(model="emulator", messages=messages, **kw)
        return out.choices[0].message.content or ""
    finally:
        client.close()


def _continue(emu: Emulator, request: str, partial: str) -> str:
    return _openai_text(emu, [{"role": "user", "content": request},
                              {"role": "assistant", "content": partial},
                              {"role": "user", "content": CONTINUATION_PROMPT}])


def test_emulator_continuation_styles(emulator: Any) -> None:
    emu = emulator()
    assert _continue(emu, "[[words 12]]", "w1 w2 w3") == " w4 w5 w6 w7 w8 w9 w10 w11 w12"
    emu.configure(continuation_leading_space=False)
    assert _continue(emu, "[[words 12]]", "w1 w2 w3") == "w4 w5 w6 w7 w8 w9 w10 w11 w12"
    assert _continue(emu, "[[words 12]]", "w1 w2 w") == "3 w4 w5 w6 w7 w8 w9 w10 w11 w12"
    emu.configure(continuation_leading_space=True, continuation_repeat=5)
    assert _continue(emu, "[[words 12]]", "w1 w2 w3 ") == "2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12"
    emu.configure(continuation_repeat="line")
    assert _continue(emu, "[[echo]]\na b\nc d e", "a b\nc d") == "c d e"
    emu.configure(continuation_repeat="fence")
    assert _continue(emu, "[[echo]]```py\nx = 1\n```", "```py\nx =") == "```py\n 1\n```"
    assert _continue(emu, "[[echo]]no code here", "no code") == " here"
    with pytest.raises(ConfigError, match="continuation_repeat"):
        emu.configure(continuation_repeat="word")
    with pytest.raises(ConfigError, match="continuation_leading_space"):
        emu.configure(continuation_leading_space="no")
    with pytest.raises(ConfigError, match="prefill"):
        emu.configure(prefill="sometimes")


@pytest.mark.parametrize("stream", [False, True])
def test_emulator_prefill_is_continued_or_rejected_like_the_api(emulator: Any, stream: bool) -> None:
    emu = emulator()
    client = emu.anthropic_client(max_retries=0)

    def ask(partial: str) -> str:
        messages = [{"role": "user", "content": "[[words 12]]"},
                    {"role": "assistant", "content": partial}]
        if stream:
            with client.messages.stream(model="emulator", max_tokens=100,
                                        messages=messages) as s:
                return s.get_final_text()
        got = client.messages.create(model="emulator", max_tokens=100, messages=messages)
        return "".join(b.text for b in got.content if b.type == "text")

    assert ask("w1 w2 w") == "3 w4 w5 w6 w7 w8 w9 w10 w11 w12"
    with pytest.raises(anthropic.BadRequestError) as trailing:
        ask("w1 w2 ")
    assert trailing.value.status_code == 400 and PREFILL_WHITESPACE in str(trailing.value)
    emu.configure(prefill="reject")
    with pytest.raises(anthropic.BadRequestError) as rejected:
        ask("w1 w2")
    assert rejected.value.status_code == 400 and NO_PREFILL in str(rejected.value)
    assert [r.fault for r in emu.requests] == [None, "prefill", "prefill"]
    # The OpenAI path has no prefill: a final assistant message is not a continuation.
    assert _openai_text(emu, [{"role": "user", "content": "[[words 3]]"},
                              {"role": "assistant", "content": "w1"}]) == "w1 w2 w3"
    client.close()


def test_the_sdk_sees_the_prefill_rejection_as_a_bad_request_not_a_limit(emulator: Any) -> None:
    # Were a prefill ever sent to a model that rejects it, the continuation fails with the
    # API's own sentence — it is not taken for a context or payload limit (nothing is
    # compacted or cut) — and the answer so far is kept, cut, and said to be.
    from ipy_ctxrecovery.core.continuation import INCOMPLETE
    from ipy_ctxrecovery.core.events import Truncated

    emu = emulator(prefill="reject")
    provider = make_provider("anthropic:claude-haiku-4-5", client=emu.anthropic_client(max_retries=0))
    session = ChatSession(provider=provider, settings=SETTINGS, name="join-wrong")
    events: list[Any] = []
    session.subscribe(events.append)
    reply = session.send("[[words 70]]", max_tokens=9)
    assert reply.finish_reason == "length" and words(70).startswith(reply.text)
    (cut,) = [e for e in events if isinstance(e, Truncated)]
    assert "prefill" in cut.failed and cut.max_tokens == 9
    assert [r.fault for r in emu.requests] == [None, "prefill"]   # not retried as a limit
    user, answer = session.history
    assert answer.text == reply.text and "prefill" in answer.meta[INCOMPLETE]
    session.close()
