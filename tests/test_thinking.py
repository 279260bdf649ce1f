"""Extended thinking's budget against the max_tokens sent (``core/thinking.py``), and a
session near the end of the window with thinking on, against the emulator, which refuses
what the API refuses: a budget not below ``max_tokens``, or under 1024."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ipy_ctxrecovery import ChatSession
from ipy_ctxrecovery.core.events import Event, ThinkingFitted
from ipy_ctxrecovery.core.thinking import INTERLEAVED_BETA, MIN_BUDGET, fit_thinking
from ipy_ctxrecovery.core.wording import describe

THINK = {"thinking": {"type": "enabled", "budget_tokens": 2048}}


def test_a_budget_below_max_tokens_goes_as_asked() -> None:
    assert fit_thinking(THINK, 4096, 4096) is None
    assert fit_thinking(THINK, 2049, None) is None
    assert fit_thinking(THINK, None, None) is None
    assert fit_thinking({}, 100, 4096) is None
    assert fit_thinking({"thinking": {"type": "adaptive"}}, 100, 4096) is None
    assert fit_thinking({"thinking": {"type": "disabled"}}, 100, 4096) is None


def test_lowered_max_tokens_lowers_the_budget_to_its_share() -> None:
    fit = fit_thinking(THINK, 3000, 4096)        # half of the answer was thinking's
    assert fit is not None
    assert (fit.asked, fit.sent, fit.max_tokens) == (2048, 1500, 3000)
    assert fit.options == {"thinking": {"type": "enabled", "budget_tokens": 1500}}
    # Never at or above max_tokens, even when the budget was not below what was asked
    # (a budget above the provider's default max_tokens): then half.
    fit = fit_thinking({"thinking": {"type": "enabled", "budget_tokens": 8000}}, 4096, 4096)
    assert fit is not None and fit.sent == 2048
    # Inside extra_body, the other keys kept.
    given = {"temperature": 1, "extra_body": {"thinking": THINK["thinking"], "top_k": 5}}
    fit = fit_thinking(given, 3000, 4096)
    assert fit is not None and fit.options == {
        "temperature": 1,
        "extra_body": {"thinking": {"type": "enabled", "budget_tokens": 1500}, "top_k": 5}}
    assert given["extra_body"]["thinking"]["budget_tokens"] == 2048       # not changed


def test_under_the_least_budget_the_request_goes_without_thinking() -> None:
    fit = fit_thinking(THINK, 1800, 4096)        # a share of 900 < 1024
    assert fit is not None and fit.sent is None and MIN_BUDGET == 1024
    assert fit.options == {"thinking": {"type": "disabled"}}


def test_interleaved_thinking_may_exceed_max_tokens() -> None:
    assert fit_thinking({**THINK, "betas": [INTERLEAVED_BETA]}, 1500, 4096) is None
    assert fit_thinking({**THINK, "extra_headers": {"anthropic-beta": f"x, {INTERLEAVED_BETA}"}},
                        1500, 4096) is None


def test_what_the_user_reads() -> None:
    assert describe(ThinkingFitted(requested=2048, sent=1500, max_tokens=3000)) == (
        "ℹ pre-flight: max_tokens 3,000 is not above the thinking budget 2,048 as asked — "
        "sending thinking budget 1,500 (its share of the answer)")
    assert describe(ThinkingFitted(requested=2048, sent=None, max_tokens=1800)) == (
        "ℹ pre-flight: max_tokens 1,800 leaves too little for extended thinking (budget "
        "2,048; the API's least is 1,024) — sending this request without thinking")


def fetch(n: int) -> str:
    """Return n characters of log output.

    Args:
        n: how many characters.
    """
    return "".join(f"log line {k}\n" for k in range(n))[:n]


def test_a_long_session_with_thinking_near_the_window_is_never_refused(
        emulator: Any, tmp_path: Path) -> None:
    # The emulator's 8k window: pre-flight lowers max_tokens (4096 by default) as the
    # history grows, below the 2048 budget; sent unchanged, every turn from then on was the
    # API's 400 "`max_tokens` must be greater than `thinking.budget_tokens`".
    emu = emulator(context_window=8192)
    session = ChatSession("emulator:anthropic", emulator=emu, tools=[fetch], name="think",
                          files_root=tmp_path)
    events: list[Event] = []
    session.subscribe(events.append)
    for i in range(24):
        text = (f'Turn {i}: [[tool fetch {{"n": 3000}}]]' if i % 3 == 1
                else f"Turn {i}: keep " + " ".join(f"v{i}-{k}" for k in range(110)))
        assert session.send(text, options=THINK).text
    assert [r.status for r in emu.requests if r.status != 200] == []
    fitted = [e for e in events if isinstance(e, ThinkingFitted)]
    assert fitted, "the session never came near the window"
    answered = [r for r in emu.requests if r.path == "/v1/messages"]
    for record in answered:
        body = record.body
        thinking = body.get("thinking") if body else None
        if thinking and thinking["type"] == "enabled":
            assert MIN_BUDGET <= thinking["budget_tokens"] < body["max_tokens"]
    # Told as it happened: each fit is the budget and max_tokens a request carried.
    sent = {(r.body["max_tokens"], r.body["thinking"].get("budget_tokens"))
            for r in answered if r.body and r.body.get("thinking")}
    assert {(e.max_tokens, e.sent) for e in fitted} <= sent
    session.close()


def test_a_message_that_leaves_little_room_goes_without_thinking(emulator: Any) -> None:
    emu = emulator(context_window=8192)
    session = ChatSession("emulator:anthropic", emulator=emu, name="think-off")
    events: list[Event] = []
    session.subscribe(events.append)
    big = "Read this: " + " ".join(f"word{k}" for k in range(2700))     # ≈ 6,000 tokens
    assert session.send(big, max_tokens=4096, options=THINK).text
    [fit] = [e for e in events if isinstance(e, ThinkingFitted)]
    [record] = [r for r in emu.requests if r.path == "/v1/messages"]
    assert record.status == 200 and record.body["thinking"] == {"type": "disabled"}
    assert (fit.requested, fit.sent, fit.max_tokens) == (2048, None, record.body["max_tokens"])
    assert record.body["max_tokens"] < 2 * MIN_BUDGET
    # The next, short turn after it has room again: thinking as asked.
    assert session.send("thanks", max_tokens=4096, options=THINK).text
    session.close()
