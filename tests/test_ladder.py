"""ladder: decide (exact fit first, levels 1-3, give up) and apply (every level's guarantees)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import histories, valid_histories

from ipy_ctxrecovery.core import history as hm
from ipy_ctxrecovery.core.budget import ResultStore
from ipy_ctxrecovery.core.cuts import is_boundary
from ipy_ctxrecovery.core.history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    History,
    Message,
    Role,
    ToolCall,
    latest_user_index,
    problems,
    to_openai,
)
from ipy_ctxrecovery.core.ladder import (
    Decision,
    LadderResult,
    LadderState,
    Level,
    apply,
    decide,
    drop_oldest,
    preflight_fit,
    truncate_text,
)
from ipy_ctxrecovery.core.markers import LONG_MESSAGE_RE
from ipy_ctxrecovery.core.pairing import repair_pairing
from ipy_ctxrecovery.core.prompts import (
    COMPACTION_NOTICE,
    PAYLOAD_NOTICE,
    compaction_notice,
    with_recall_hint,
)
from ipy_ctxrecovery.core.wording import decision_lines
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.settings import KiB, MiB, Settings, format_size

PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
S = Settings()
NOTICE_TAGS = (TAG_COMPACTION_NOTICE, TAG_PAYLOAD_NOTICE)


def told(decision: Decision) -> str:
    """What a decision is told with (the session renders it the same way)."""
    return "\n".join(decision_lines(decision))


def measure(hist: History) -> int:
    """Request-body bytes of an OpenAI-style body holding ``hist`` (what a provider encodes)."""
    return len(json.dumps({"model": "m", "messages": to_openai(hist)},
                          ensure_ascii=False).encode("utf-8"))


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    return ResultStore(tmp_path / "results")


def overflow(prompt: int | None = None, limit: int | None = None,
             output: int | None = None) -> Failure:
    return Failure(FailureKind.CONTEXT_OVERFLOW, "context length exceeded", status=400,
                   prompt_tokens=prompt, limit_tokens=limit, output_tokens=output)


def waf(request_bytes: int | None = None) -> Failure:
    return Failure(FailureKind.WAF_REJECTION, "403 blocked by security policy", status=403,
                   request_bytes=request_bytes)


def run(decision: Decision, hist: History, store: ResultStore,
        settings_: Settings = S) -> LadderResult:
    return apply(decision, hist, settings=settings_, store=store, measure=measure)


def level_decision(level: Level, *, payload: bool = False, target: int | None = None
                   ) -> Decision:
    return Decision(level, 1, LadderState(), inject_payload_notice=payload,
                    target_bytes=target, payload_related=payload)


def conversation(turns: int, *, size: int = 1_000, system: str = "You are helpful.") -> History:
    msgs: list[Message] = [Message.system(system)]
    for t in range(turns):
        msgs.append(Message.user(f"question {t} " + "q" * size))
        msgs.append(Message.assistant(f"answer {t} " + "a" * size))
    msgs.append(Message.user("the latest request: summarise the above"))
    return tuple(msgs)


def tool_loop(rounds: int, *, result_chars: int = 2_000) -> History:
    """A user request followed by a long tool loop: the last N messages hold no user message."""
    msgs: list[Message] = [Message.system("sys"), Message.user("old question"),
                           Message.assistant("old answer"), Message.user("do task X")]
    for r in range(rounds):
        msgs.append(Message.assistant("", [ToolCall("call_0", "read_file", f'{{"n": {r}}}')]))
        msgs.append(Message.tool("call_0", f"result {r} " + "r" * result_chars))
    return tuple(msgs)


# -- decide ---------------------------------------------------------------------------------------

def test_payload_failure_first_decision_has_the_spec_lines_notice_and_auto_cap() -> None:
    d = decide(S, LadderState(), waf(), history_bytes=3 * MiB, max_tokens=None, cap=None,
               cap_configured=False)
    lines = told(d).splitlines()
    assert lines[0] == ("⚠ Recoverable failure (proxy/WAF rejection (403 + security signals)) "
                        "— compacting and retrying")
    assert lines[1] == ("ℹ Assuming a 4 MB payload limit — set the real one with "
                        "%chat config CHATCLI_MAX_PAYLOAD=SIZE (e.g. 5MB, 512KB)")
    assert d.inject_payload_notice
    assert d.assume_cap == 4 * MiB == S.assumed_cap_bytes
    assert d.state.payload_notice_sent
    # The rejected size is known: exact fit first, at ¾ of it.
    assert d.level is Level.EXACT_FIT
    assert d.target_bytes == int(3 * MiB * 0.75)
    again = decide(S, d.state, waf(), history_bytes=2 * MiB, max_tokens=None, cap=4 * MiB,
                   cap_configured=False)
    assert not again.inject_payload_notice
    assert again.assume_cap is None
    assert "Assuming" not in told(again)


def test_configured_cap_is_never_replaced_by_an_assumption() -> None:
    d = decide(S, LadderState(), waf(), history_bytes=3 * MiB, max_tokens=None,
               cap=5 * MiB, cap_configured=True)
    assert d.assume_cap is None
    assert told(d).splitlines() == [
        "⚠ Recoverable failure (proxy/WAF rejection (403 + security signals)) — compacting "
        "and retrying", told(d).splitlines()[1]]
    assert told(d).splitlines()[1].startswith("ℹ exact fit:")


def test_payload_target_uses_a_smaller_known_cap() -> None:
    d = decide(S, LadderState(), waf(200 * KiB), history_bytes=200 * KiB, max_tokens=None,
               cap=120 * KiB, cap_configured=False)
    assert d.target_bytes == 120 * KiB
    assert d.limit_bytes == 200 * KiB - 1
    # No cap configured: the SPEC auto-cap is offered even when a learned cap exists.
    assert d.assume_cap == S.assumed_cap_bytes
    assert "ℹ Assuming a 4 MB payload limit" in told(d)


def test_blind_ladder_without_numbers() -> None:
    state = LadderState()
    seen = []
    for _ in range(4):
        d = decide(S, state, overflow(), history_bytes=1000, max_tokens=None, cap=None,
                   cap_configured=False)
        seen.append((d.level, d.attempt))
        state = d.state
    assert seen == [(Level.AGGRESSIVE, 1), (Level.EMERGENCY, 2), (Level.NUCLEAR, 3),
                    (Level.GIVE_UP, 3)]
    assert told(d) == ("The request still failed after 3 recovery attempts (context window "
                         "exceeded); shorten the conversation or the latest message and try "
                         "again.")
    assert not d.inject_payload_notice


def test_more_attempts_repeat_the_last_level_and_fewer_stop_early() -> None:
    state = LadderState()
    levels = []
    for _ in range(6):
        d = decide(S.replace(max_recovery_attempts=5), state, overflow(), history_bytes=1000,
                   max_tokens=None, cap=None, cap_configured=False)
        levels.append(d.level)
        state = d.state
    assert levels == [Level.AGGRESSIVE, Level.EMERGENCY, Level.NUCLEAR, Level.NUCLEAR,
                      Level.NUCLEAR, Level.GIVE_UP]
    one = S.replace(max_recovery_attempts=1)
    d1 = decide(one, LadderState(), overflow(), history_bytes=1, max_tokens=None, cap=None,
                cap_configured=False)
    d2 = decide(one, d1.state, overflow(), history_bytes=1, max_tokens=None, cap=None,
                cap_configured=False)
    assert (d1.level, d2.level) == (Level.AGGRESSIVE, Level.GIVE_UP)


def test_exact_fit_first_from_reported_tokens_then_levels_2_and_3() -> None:
    # ANCHORS 1: "210000 tokens > 200000 maximum" — use the numbers.
    body = 840_000
    d = decide(S, LadderState(), overflow(210_000, 200_000), history_bytes=body,
               max_tokens=None, cap=None, cap_configured=False)
    assert d.level is Level.EXACT_FIT and d.attempt == 1
    assert d.target_bytes == int(body * 200_000 / 210_000 * (1 - S.exact_fit_margin))
    assert d.limit_bytes == int(body * 200_000 / 210_000)
    assert told(d).splitlines()[0] == ("⚠ Recoverable failure (context window exceeded) — "
                                         "compacting and retrying")
    assert "210,000 tokens > 200,000" in told(d)
    nxt = decide(S, d.state, overflow(205_000, 200_000), history_bytes=body, max_tokens=None,
                 cap=None, cap_configured=False)
    assert (nxt.level, nxt.attempt) == (Level.EMERGENCY, 2)      # exact fit is tried once
    last = decide(S, nxt.state, overflow(), history_bytes=body, max_tokens=None, cap=None,
                  cap_configured=False)
    assert last.level is Level.NUCLEAR
    assert decide(S, last.state, overflow(), history_bytes=1, max_tokens=None, cap=None,
                  cap_configured=False).level is Level.GIVE_UP


def test_exact_fit_leaves_room_for_max_tokens() -> None:
    d = decide(S, LadderState(), overflow(250_000, 200_000), history_bytes=1_000_000,
               max_tokens=50_000, cap=None, cap_configured=False)
    assert d.level is Level.EXACT_FIT
    assert d.target_bytes == int(1_000_000 * 150_000 / 250_000 * (1 - S.exact_fit_margin))


def test_input_fits_so_max_tokens_is_lowered_and_history_untouched(store: ResultStore) -> None:
    # "143653 + 64000 > 200000": the input fits, the requested output does not.
    f = overflow(143_653, 200_000, 64_000)
    d = decide(S, LadderState(), f, history_bytes=500_000, max_tokens=64_000, cap=None,
               cap_configured=False)
    room = 200_000 - 143_653
    assert d.level is Level.LOWER_MAX_TOKENS
    assert d.max_tokens == room - -(-room * S.exact_fit_margin // 1) == 50_712
    assert 143_653 + d.max_tokens < 200_000
    assert d.attempt == 0 and d.state.max_tokens_lowered
    hist = conversation(3)
    result = run(d, hist, store)
    assert result.history is hist or result.history == hist
    assert result.removed_messages == 0
    # Lowered once per turn; a second overflow goes to exact fit.
    again = decide(S, d.state, f, history_bytes=500_000, max_tokens=d.max_tokens, cap=None,
                   cap_configured=False)
    assert again.level is Level.EXACT_FIT


def test_output_limit_lowers_max_tokens_to_the_reported_limit_once() -> None:
    f = Failure(FailureKind.OUTPUT_LIMIT, "max_tokens: 200000 > 64000", status=400,
                limit_tokens=64_000)
    d = decide(S, LadderState(), f, history_bytes=1, max_tokens=200_000, cap=None,
               cap_configured=False)
    assert (d.level, d.max_tokens) == (Level.LOWER_MAX_TOKENS, 64_000)
    assert decide(S, d.state, f, history_bytes=1, max_tokens=64_000, cap=None,
                  cap_configured=False).level is Level.GIVE_UP


def test_not_recoverable_gives_up_with_a_sentence() -> None:
    d = decide(S, LadderState(), Failure(FailureKind.AUTH, "401"), history_bytes=1,
               max_tokens=None, cap=None, cap_configured=False)
    assert d.level is Level.GIVE_UP
    assert told(d).endswith(".")


def test_decide_is_pure_and_global_state_free() -> None:
    # ANCHORS 4: nothing global — Settings untouched, os.environ untouched, two runs equal.
    env = dict(os.environ)
    s1, s2 = Settings(), Settings(max_payload=5 * MiB)
    a = decide(s1, LadderState(), waf(), history_bytes=MiB, max_tokens=None, cap=None,
               cap_configured=False)
    b = decide(s2, LadderState(), waf(), history_bytes=MiB, max_tokens=None, cap=5 * MiB,
               cap_configured=True)
    assert a.assume_cap == 4 * MiB and b.assume_cap is None
    assert decide(s1, LadderState(), waf(), history_bytes=MiB, max_tokens=None, cap=None,
                  cap_configured=False) == a
    assert s1 == Settings() and s2 == Settings(max_payload=5 * MiB)
    assert dict(os.environ) == env


# -- apply: the SPEC's levels --------------------------------------------------------------------

def test_aggressive_halves_the_limits_without_changing_settings(store: ResultStore) -> None:
    hist = (Message.system("sys"), Message.user("read them"),
            Message.assistant("", [ToolCall("c1", "read_file", "{}"),
                                   ToolCall("c2", "read_file", "{}")]),
            Message.tool("c1", "x" * 12_000), Message.tool("c2", "y" * 9_000),
            Message.assistant("b" * 6_000), Message.assistant("short " * 600))
    before = copy.deepcopy(hist)
    result = run(level_decision(Level.AGGRESSIVE), hist, store)
    assert hist == before
    assert S.per_result_max_chars == 20_000 and S.turn_budget_chars == 200_000
    out = result.history
    assert len(out[3].text) <= 10_000 < 12_000           # 20,000 → 10,000
    assert out[3].text != hist[3].text
    assert str(store.directory) in out[3].text             # the preview names the full copy
    assert out[4].text == hist[4].text                     # 9,000 ≤ 10,000: untouched
    assert len(out[5].text) <= 5_000                        # long assistant message truncated
    assert out[5].text.startswith("b" * 3_000) and out[5].text.endswith("b" * 500)
    assert out[6].text == hist[6].text                      # 3,600 chars: untouched
    assert result.removed_messages == 0 and not result.compaction_notice_added
    assert problems(out) == []


def test_aggressive_halves_the_turn_budget(store: ResultStore) -> None:
    calls = [ToolCall(f"c{i}", "read_file", "{}") for i in range(12)]
    hist = (Message.user("read twelve files"), Message.assistant("", calls),
            *[Message.tool(c.id, f"{i}" + "d" * 8_999) for i, c in enumerate(calls)])
    total = sum(len(m.text) for m in hist[2:])
    assert 100_000 < total <= 200_000                    # fits 200,000, not 100,000
    out = run(level_decision(Level.AGGRESSIVE), hist, store).history
    assert sum(len(m.text) for m in out[2:]) <= 100_000
    assert problems(out) == []


def test_emergency_keeps_exactly_the_last_ten_when_they_start_with_a_user(
        store: ResultStore) -> None:
    hist = conversation(20)[:-1]                          # ends with an answer
    out = run(level_decision(Level.EMERGENCY), hist, store).history
    kept = [m for m in out if m.role is not Role.SYSTEM and m.tag is None]
    assert S.emergency_keep_messages == 10
    assert kept == list(hist[-10:])
    out4 = run(level_decision(Level.NUCLEAR), hist, store).history
    assert S.nuclear_keep_messages == 4
    assert [m for m in out4 if m.role is not Role.SYSTEM and m.tag is None] == list(hist[-4:])
    custom = S.replace(emergency_keep_messages=6)
    out6 = run(level_decision(Level.EMERGENCY), hist, store, custom).history
    assert [m for m in out6 if m.role is not Role.SYSTEM and m.tag is None] == list(hist[-6:])


def test_aggressive_shrinks_old_turns_too(store: ResultStore) -> None:
    hist = (Message.user("first"), Message.assistant("", [ToolCall("c", "grep", "{}")]),
            Message.tool("c", "z" * 15_000), Message.assistant("done"), Message.user("now"))
    out = run(level_decision(Level.AGGRESSIVE), hist, store).history
    assert len(out[2].text) <= 10_000


def test_emergency_keeps_systems_and_the_last_ten(store: ResultStore) -> None:
    hist = conversation(20)
    hist = (*hist[:5], Message.system("a mid-history system note"), *hist[5:])
    result = run(level_decision(Level.EMERGENCY), hist, store)
    out = result.history
    systems = [m for m in out if m.role is Role.SYSTEM]
    assert systems == [m for m in hist if m.role is Role.SYSTEM]
    kept = [m for m in out if m.role is not Role.SYSTEM and m.tag is None]
    assert kept == [m for m in hist if m.role is not Role.SYSTEM][-9:]   # starts at a user
    assert kept[0].role is Role.USER
    assert result.removed_messages == 41 - 9
    notice = next(m for m in out if m.tag == TAG_COMPACTION_NOTICE)
    assert notice.text == with_recall_hint(compaction_notice(32, summarized=False))
    assert "32 earlier messages were dropped (not summarized)" in notice.text
    assert problems(out) == []


def test_nuclear_keeps_the_last_four_and_adds_the_notice(store: ResultStore) -> None:
    hist = conversation(10)
    result = run(level_decision(Level.NUCLEAR), hist, store)
    kept = [m for m in result.history if m.role is not Role.SYSTEM and m.tag is None]
    assert kept == list(hist[-3:])       # the last 4 begin with an assistant: start at a user
    assert result.compaction_notice_added
    assert [m.tag for m in result.history].count(TAG_COMPACTION_NOTICE) == 1


def test_spec_notice_wording_only_when_summarized() -> None:
    assert compaction_notice(0, summarized=True) == COMPACTION_NOTICE == (
        "[Context was automatically compacted due to size limits. Previous conversation "
        "history has been summarized. Continue from where you left off.]")
    assert compaction_notice(1, summarized=False) == (
        "[Context was automatically compacted due to size limits: 1 earlier message was "
        "dropped (not summarized). Their full text is kept in the session transcript. "
        "Continue from where you left off.]")
    both = compaction_notice(7, summarized=True)
    assert "has been summarized" in both and "7 earlier messages were dropped" in both


def test_nuclear_with_a_summary_keeps_it_and_says_so(store: ResultStore) -> None:
    summary = Message.user("[STRUCTURED SUMMARY — covering 12 earlier messages]\nfacts",
                           tag=TAG_SUMMARY)
    base = conversation(6)
    hist = (base[0], summary, Message.assistant("Understood."), *base[1:])
    out = run(level_decision(Level.NUCLEAR), hist, store).history
    assert summary in out
    notice = next(m for m in out if m.tag == TAG_COMPACTION_NOTICE)
    assert out.index(summary) < out.index(notice)
    assert "has been summarized" in notice.text and "dropped (not summarized)" in notice.text


# -- ANCHORS 2: the task survives, the notice is true ---------------------------------------------

@pytest.mark.parametrize("level", [Level.EMERGENCY, Level.NUCLEAR])
def test_latest_user_request_survives_a_long_tool_loop(level: Level,
                                                       store: ResultStore) -> None:
    hist = tool_loop(8)                   # the last 10 (and 4) messages hold no user message
    task = hist[3]
    assert all(m.role is not Role.USER for m in hist[-10:])
    result = run(level_decision(level), hist, store)
    out = result.history
    assert task in out
    assert latest_user_index(out) is not None and out[latest_user_index(out)] == task
    assert out[out.index(task):] == hist[3:]          # the request and everything after it
    notice = next(m for m in out if m.tag == TAG_COMPACTION_NOTICE)
    assert notice.text == with_recall_hint(compaction_notice(2, summarized=False))
    assert "summarized." not in notice.text
    assert problems(out) == []


# -- payload notice --------------------------------------------------------------------------------

def test_payload_notice_once_before_the_latest_request(store: ResultStore) -> None:
    hist = conversation(3)
    first = run(level_decision(Level.AGGRESSIVE, payload=True), hist, store)
    out = first.history
    assert first.payload_notice_added
    notices = [m for m in out if m.tag == TAG_PAYLOAD_NOTICE]
    assert len(notices) == 1 and notices[0].text == PAYLOAD_NOTICE
    assert notices[0].role is Role.USER
    assert out[-1] == hist[-1] and out[-2].tag == TAG_PAYLOAD_NOTICE
    # Asked again (a later decision, or another session state): never stacked.
    for level in (Level.AGGRESSIVE, Level.EMERGENCY, Level.NUCLEAR):
        again = run(level_decision(level, payload=True), out, store)
        assert [m.tag for m in again.history].count(TAG_PAYLOAD_NOTICE) == 1
        assert not again.payload_notice_added
        out = again.history


def test_payload_notice_text_is_the_specs() -> None:
    assert PAYLOAD_NOTICE.startswith("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] A proxy/gateway "
                                     "rejected the previous\nrequest due to body size.")
    assert PAYLOAD_NOTICE.endswith("(4) Summarize findings incrementally rather than "
                                   "accumulating raw tool output.")


def test_compaction_notice_is_replaced_not_stacked(store: ResultStore) -> None:
    hist = conversation(30)
    once = run(level_decision(Level.EMERGENCY), hist, store)
    twice = run(level_decision(Level.NUCLEAR), once.history, store)
    notices = [m for m in twice.history if m.tag == TAG_COMPACTION_NOTICE]
    assert len(notices) == 1
    total = once.removed_messages + twice.removed_messages
    assert f"{total} earlier messages were dropped" in notices[0].text


# -- exact fit (ANCHORS 1) ---------------------------------------------------------------------------

def _units_for(hist: History, result: History) -> int:
    for u in range(len(hist) + 1):
        if drop_oldest(hist, u)[0] == result:
            return u
    raise AssertionError("result is not a drop of oldest units")


def test_exact_fit_removes_just_enough(store: ResultStore) -> None:
    hist = conversation(40, size=2_000)
    body = measure(hist)
    d = decide(S, LadderState(), overflow(210_000, 200_000), history_bytes=body,
               max_tokens=None, cap=None, cap_configured=False)
    result = run(d, hist, store)
    assert d.target_bytes is not None
    assert measure(result.history) <= d.target_bytes
    u = _units_for(hist, result.history)
    assert u > 0
    assert measure(drop_oldest(hist, u - 1)[0]) > d.target_bytes     # one fewer: too big
    # Much less removed than a blind level would: 40 turns → just ~a seventh dropped.
    assert result.removed_messages < 20
    assert hist[-1] == result.history[-1]


def test_exact_fit_with_tool_groups_never_splits_them(store: ResultStore) -> None:
    hist = tool_loop(2)
    hist = (*hist[:1], *[m for t in range(10) for m in (
        Message.user(f"q{t}"), Message.assistant("", [ToolCall("call_0", "grep", "{}")]),
        Message.tool("call_0", "g" * 3_000), Message.assistant("ok"))], *hist[1:])
    target = measure(hist) // 2
    result = run(level_decision(Level.EXACT_FIT, target=target), hist, store)
    assert measure(result.history) <= target
    assert problems(result.history) == []
    u = _units_for(hist, result.history)
    assert measure(drop_oldest(hist, u - 1)[0]) > target


def test_exact_fit_shrinks_kept_tool_results_when_dropping_is_not_enough(
        store: ResultStore) -> None:
    hist = tool_loop(3, result_chars=40_000)
    target = 60_000
    result = run(level_decision(Level.EXACT_FIT, target=target), hist, store)
    out = result.history
    assert measure(out) <= target
    assert hist[3] in out                       # the task stays
    assert problems(out) == []
    assert any(str(store.directory) in m.text for m in out if m.role is Role.TOOL)


def test_payload_exact_fit_that_cannot_fit_gives_up_at_once(store: ResultStore) -> None:
    hist = (Message.system("s"), Message.user("old"), Message.assistant("a"),
            Message.user("read it"), Message.assistant("", [ToolCall("c", "read_file", "{}")]),
            Message.tool("c", "t" * 60_000), Message.assistant("", [ToolCall("c", "grep", "{}")]),
            Message.tool("c", "u" * 300), Message.assistant("", [ToolCall("d", "grep", "{}")]),
            Message.tool("d", "v" * 300))
    d = decide(S, LadderState(), waf(1_500), history_bytes=measure(hist), max_tokens=None,
               cap=None, cap_configured=False)
    result = run(d, hist, store)
    assert result.level is Level.GIVE_UP
    assert result.history == hist
    assert (result.give_up_reason or "").startswith(
        "Even with all earlier history removed and tool results shortened")


def test_payload_exact_fit_learns_three_quarters(store: ResultStore) -> None:
    hist = conversation(30, size=3_000)
    body = measure(hist)
    d = decide(S, LadderState(), waf(body), history_bytes=body, max_tokens=None, cap=None,
               cap_configured=False)
    result = run(d, hist, store)
    assert measure(result.history) <= int(body * 0.75)
    assert result.payload_notice_added
    assert result.history[-1] == hist[-1]


def test_system_prompt_bigger_than_the_rejected_size_fails_fast(store: ResultStore) -> None:
    hist = (Message.system("s" * 300_000), Message.user("hi"))
    d = decide(S, LadderState(), waf(200 * KiB), history_bytes=measure(hist), max_tokens=None,
               cap=None, cap_configured=False)
    result = run(d, hist, store)
    assert result.level is Level.GIVE_UP
    assert result.history == hist
    # The size the proxy rejected and the learned estimate, as the status line said them;
    # never the rejected size called what the path "can carry".
    assert result.give_up_reason == (
        f"The system prompt alone is {format_size(measure((hist[0],)))}, no smaller than the "
        f"{format_size(200 * KiB)} request the proxy/gateway already rejected (its limit "
        f"looks to be about {format_size(150 * KiB)}); shorten the system prompt or raise "
        "the proxy/gateway limit (CHATCLI_MAX_PAYLOAD).")


def test_latest_message_bigger_than_the_limit_fails_fast(store: ResultStore) -> None:
    hist = (Message.system("s"), Message.user("old"), Message.assistant("a"),
            Message.user("p" * 400_000))
    d = decide(S, LadderState(), overflow(120_000, 100_000), history_bytes=measure(hist),
               max_tokens=None, cap=None, cap_configured=False)
    result = run(d, hist, store)
    assert result.level is Level.GIVE_UP
    assert result.give_up_reason is not None
    assert result.give_up_reason.startswith("Your latest message makes the request")


# -- ANCHORS 10: whole characters ------------------------------------------------------------------

def _cuts_are_whole(text: str, out: str) -> None:
    out.encode("utf-8")
    if out == text:
        return
    marker = LONG_MESSAGE_RE.search(out)
    if marker is None:                            # head only
        assert text.startswith(out) and is_boundary(text, len(out))
        return
    head, tail = out[:marker.start()], out[marker.end():]
    assert text.startswith(head) and text.endswith(tail)
    assert is_boundary(text, len(head)) and is_boundary(text, len(text) - len(tail))


def test_truncate_text_never_splits_a_character_or_cluster() -> None:
    text = "👨\u200d👩\u200d👧e\u0301🇧🇷中文" * 800
    for limit in (5_000, 4_999, 4_998, 4_997, 4_996):
        out = truncate_text(text, limit)
        assert len(out) <= limit
        _cuts_are_whole(text, out)
    assert truncate_text("abc", 10) == "abc"
    assert len(truncate_text("x" * 100, 10)) <= 10


@PROPS
@given(st.lists(st.sampled_from(["a", "é", "中", "😀", "👍🏽", "e\u0301", "👨\u200d👩", "🇧🇷"]),
                min_size=0, max_size=400).map("".join), st.integers(1, 300))
def test_truncate_text_property(text: str, limit: int) -> None:
    out = truncate_text(text, limit)
    assert len(out) <= limit or out == text
    _cuts_are_whole(text, out)


# -- properties over generated histories, every level ---------------------------------------------

LEVELS = [Level.AGGRESSIVE, Level.EMERGENCY, Level.NUCLEAR, Level.EXACT_FIT]


def _conversation_count(hist: History) -> int:
    return sum(1 for m in hist if m.role is not Role.SYSTEM
               and m.tag not in (TAG_COMPACTION_NOTICE, TAG_PAYLOAD_NOTICE, TAG_SUMMARY))


def check_guarantees(before: History, result: LadderResult) -> None:
    out = result.history
    repaired, _ = repair_pairing(before)
    # Tool pairing valid, and the first non-system message is a user message.
    assert problems(out) == []
    # Every system message kept, in order.
    assert [m for m in out if m.role is Role.SYSTEM] == \
        [m for m in before if m.role is Role.SYSTEM]
    # The latest real user request is present, and is still the latest one.
    latest = latest_user_index(repaired)
    if latest is not None:
        assert out[latest_user_index(out)] == repaired[latest]
        # ... with everything after it (only results may be shrunk, notices added).
        after_before = [m for m in repaired[latest + 1:] if m.tag not in NOTICE_TAGS]
        after_out = [m for m in out[latest_user_index(out) + 1:] if m.tag not in NOTICE_TAGS]
        assert len(after_out) == len(after_before)
    # Summaries kept.
    assert [m for m in out if m.tag == TAG_SUMMARY] == \
        [m for m in repaired if m.tag == TAG_SUMMARY]
    # Whole characters everywhere.
    for m in out:
        for b in m.blocks:
            for f in dataclasses.fields(b):
                value = getattr(b, f.name)
                if isinstance(value, str):
                    value.encode("utf-8")      # raises on a split (lone surrogate) char
    # Size only grows by the notices.
    assert hm.char_size([m for m in out if m.tag not in NOTICE_TAGS]) <= hm.char_size(repaired)
    assert len([m for m in out if m.tag == TAG_PAYLOAD_NOTICE]) <= 1
    assert len([m for m in out if m.tag == TAG_COMPACTION_NOTICE]) <= 1 + sum(
        1 for m in before if m.tag == TAG_COMPACTION_NOTICE)
    # The notice is true: it is there when messages were dropped, with the right count.
    dropped = _conversation_count(repaired) - _conversation_count(out)
    assert dropped == result.removed_messages
    if dropped:
        notice = [m for m in out if m.tag == TAG_COMPACTION_NOTICE]
        assert len(notice) == 1
        assert f"{dropped} earlier message" in notice[0].text
        summarized = any(m.tag == TAG_SUMMARY for m in out[:out.index(notice[0])])
        assert ("has been summarized" in notice[0].text) == summarized


@settings(PROPS, max_examples=300)
@given(hist=histories(user_first=None), level=st.sampled_from(LEVELS),
       payload=st.booleans(), fraction=st.floats(0.05, 1.2))
def test_every_level_keeps_its_guarantees(hist: History, level: Level, payload: bool,
                                          fraction: float, tmp_path_factory) -> None:
    store = ResultStore(tmp_path_factory.mktemp("r"))
    target = int(measure(hist) * fraction) if level is Level.EXACT_FIT else None
    before = copy.deepcopy(hist)
    result = run(level_decision(level, payload=payload, target=target), hist, store)
    assert hist == before                       # the input is never edited
    assert result.level in (level, Level.GIVE_UP)
    if result.level is Level.GIVE_UP:
        return
    check_guarantees(hist, result)
    if payload:
        assert [m.tag for m in result.history].count(TAG_PAYLOAD_NOTICE) == 1
        latest = latest_user_index(result.history)
        if latest is not None:
            assert result.history[latest - 1].tag == TAG_PAYLOAD_NOTICE or any(
                m.tag == TAG_PAYLOAD_NOTICE for m in hist)


@PROPS
@given(hist=valid_histories(), level=st.sampled_from(LEVELS[:3]))
def test_levels_on_valid_histories_never_grow_the_body(hist: History, level: Level,
                                                      tmp_path_factory) -> None:
    store = ResultStore(tmp_path_factory.mktemp("r"))
    result = run(level_decision(level), hist, store)
    notices = [m for m in result.history if m.tag == TAG_COMPACTION_NOTICE]
    assert measure(result.history) <= measure(hist) + sum(
        len(m.text.encode()) + 64 for m in notices)
    if level is not Level.AGGRESSIVE:
        kept = _conversation_count(result.history)
        keep = S.emergency_keep_messages if level is Level.EMERGENCY else S.nuclear_keep_messages
        latest = latest_user_index(hist)
        assert latest is not None
        tail_from_latest = _conversation_count(hist[latest:])
        assert kept <= max(keep, tail_from_latest)


@PROPS
@given(hist=valid_histories(max_turns=8), fraction=st.floats(0.2, 0.95))
def test_exact_fit_is_minimal_on_generated_histories(hist: History, fraction: float,
                                                     tmp_path_factory) -> None:
    store = ResultStore(tmp_path_factory.mktemp("r"))
    target = int(measure(hist) * fraction)
    result = run(level_decision(Level.EXACT_FIT, target=target), hist, store)
    if result.level is Level.GIVE_UP:
        return
    check_guarantees(hist, result)
    shrunk = any("previewed to fit" in note for note in result.notes)
    if measure(result.history) <= target and not shrunk:
        u = _units_for(hist, result.history)
        if u > 0:
            assert measure(drop_oldest(hist, u - 1)[0]) > target


@PROPS
@given(hist=histories(user_first=None), level=st.sampled_from(LEVELS[:3]))
def test_applying_a_level_twice_is_stable(hist: History, level: Level,
                                          tmp_path_factory) -> None:
    store = ResultStore(tmp_path_factory.mktemp("r"))
    once = run(level_decision(level), hist, store)
    twice = run(level_decision(level), once.history, store)
    assert twice.history == once.history
    assert twice.removed_messages == 0
    assert not twice.changed
    assert once.changed == (once.history != hist)


def test_exact_fit_never_aims_above_the_ceiling() -> None:
    free = decide(S, LadderState(), overflow(5000, 4096), history_bytes=20_000,
                  max_tokens=None, cap=None, cap_configured=False)
    capped = decide(S, LadderState(), overflow(5000, 4096), history_bytes=20_000,
                    max_tokens=None, cap=None, cap_configured=False, target_ceiling=7_000)
    assert free.target_bytes is not None and free.target_bytes > 7_000
    assert capped.level is Level.EXACT_FIT and capped.target_bytes == 7_000
    assert "7 KB" in told(capped) or "6.8 KB" in told(capped)


def test_preflight_fit_previews_tool_results_before_dropping_anything(
        store: ResultStore) -> None:
    calls = [ToolCall(f"c{k}", "fetch", "{}") for k in range(3)]
    h: History = (Message.system("sys"), Message.user("old question"),
                  Message.assistant("old answer"), Message.user("fetch three"),
                  Message.assistant("", calls),
                  *(Message.tool(c.id, f"{k} " + "log line\n" * 3000, name="fetch")
                    for k, c in enumerate(calls)))
    target = measure(h) // 4
    result = preflight_fit(h, target_bytes=target, limit_bytes=measure(h) // 2,
                           payload_related=True, settings=S, store=store, measure=measure)
    assert result.level is Level.EXACT_FIT and result.changed
    assert measure(result.history) <= target
    assert result.removed_messages == 0
    assert [m.text for m in result.history[:4]] == [m.text for m in h[:4]]
    previews = [m.text for m in result.history if m.role is Role.TOOL]
    assert len(previews) == 3 and sum(map(len, previews)) < target
    assert problems(result.history) == [] and h[-1].text.startswith("2 log line")


def test_preflight_fit_gives_up_when_the_request_alone_is_over_the_limit(
        store: ResultStore) -> None:
    h: History = (Message.system("sys"), Message.user("x" * 5000))
    result = preflight_fit(h, target_bytes=1000, limit_bytes=2000, payload_related=True,
                           settings=S, store=store, measure=measure)
    assert result.level is Level.GIVE_UP and result.history == h
    assert result.give_up_reason and "shorter message" in result.give_up_reason


def test_fit_notes_count_in_words_that_agree_with_the_number(store: ResultStore) -> None:
    h: History = (Message.system("s"), Message.user("q1 " + "a" * 3000),
                  Message.assistant("a1 " + "b" * 3000), Message.user("q2 " + "c" * 3000),
                  Message.assistant("a2"), Message.user("latest"))
    one = run(level_decision(Level.EXACT_FIT, target=int(measure(h) * 0.9)), h, store)
    two = run(level_decision(Level.EXACT_FIT, target=int(measure(h) * 0.5)), h, store)
    assert one.notes[0].startswith("1 message dropped to fit ")
    assert two.notes[0].startswith("2 messages dropped to fit ")
