"""wording: every line rendered from event fields — normal, debug and quiet; marks that exist
in common fonts; plain plurals; the sentences the notebook prints."""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import pytest

from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core import prices
from ipy_ctxrecovery.core.ladder.decide import Decision, LadderState, Level
from ipy_ctxrecovery.core.wording import (
    MARKS,
    cost_words,
    describe,
    describe_debug,
    endpoint_text,
    first_line,
    fit_detail,
    plural,
    printed_at,
    shown_at,
    status_text,
    truncated_line,
)
from ipy_ctxrecovery.failures import Failure, FailureKind

KB = 1024
FAILURE = Failure(FailureKind.PAYLOAD_TOO_LARGE, "413", status=413, request_bytes=40 * KB)
DECISION = Decision(Level.EXACT_FIT, 1, LadderState(attempt=1), failure=FAILURE,
                    target_bytes=20 * KB, rejected_bytes=40 * KB)

#: One of every event, as a turn would emit them.
SAMPLES: list[ev.Event] = [
    ev.Preflight(body_bytes=9 * KB, est_tokens=2300, cap=None, window=8192, action="ok"),
    ev.Preflight(body_bytes=30 * KB, est_tokens=7000, cap=32 * KB, cap_source="learned",
                 window=8192, action="compact", reasons=("cap",)),
    ev.MaxTokensLowered(requested=9000, sent=4000, reason="window", est_tokens=3000,
                        window=8192),
    ev.FitBeforeSend(body_bytes=30 * KB, goal_bytes=20 * KB, over="cap", cap=24 * KB,
                     cap_source="learned", est_tokens=7000, reserved_tokens=0, window=8192,
                     notes=("3 messages dropped",)),
    ev.MicrocompactApplied(truncated=1, summarized=0, bytes_freed=2 * KB),
    ev.BudgetApplied(replaced=1, persisted=("/tmp/r.txt",)),
    ev.CompactionPhase(phase="start", before_messages=9, before_bytes=30 * KB,
                       target_bytes=12 * KB),
    ev.CompactionPhase(phase="trim", before_messages=9, before_bytes=30 * KB),
    ev.CompactionPhase(phase="summarize", before_messages=9, before_bytes=30 * KB,
                       target_bytes=12 * KB),
    ev.CompactionPhase(phase="applied", before_messages=9, after_messages=3,
                       before_bytes=30 * KB, after_bytes=10 * KB, outcome="summary"),
    ev.LadderStep(decision=DECISION, failure=FAILURE, before_messages=9, after_messages=9),
    ev.CapChanged(cap=30 * KB, source="learned", rejected_bytes=40 * KB),
    ev.LadderStep(decision=DECISION, failure=FAILURE, before_messages=9, after_messages=5,
                  notes=("4 messages dropped to fit 20 KB",)),
    ev.NoticeInjected(notice="payload"),
    ev.Escalation(attempt=1, max_tokens=200, previous=100, of=2),
    ev.Truncated(max_tokens=400, escalations=2),
    ev.WindowLearned(window=4096, previous=8192),
    ev.Retrying(attempt=1, wait=1.0, failure_kind=FailureKind.TRANSIENT,
                failure=Failure(FailureKind.TRANSIENT, "Server error 503.\nretry")),
    ev.ToolRun(name="fetch", ok=True, chars=1200),
    ev.Recovered(attempts=1),
    ev.TurnFinished(history_bytes=10 * KB, est_tokens=2600, window=8192, cap=30 * KB),
    ev.StreamUsageMissing(),
    ev.ThinkingFitted(requested=2048, sent=1000, max_tokens=2000),
]


def test_every_event_has_an_expert_line_and_normal_lines_only_where_they_are_printed() -> None:
    for event in SAMPLES:
        assert describe_debug(event), event
        normal = describe(event)
        assert bool(normal) == printed_at(event, "normal"), event


def test_normal_lines_of_a_turn_in_plain_words() -> None:
    lines = [describe(e) for e in SAMPLES if printed_at(e, "normal")]
    text = "\n".join(lines)
    for jargon in ("exact fit", "exact_fit", "after the cut", "may take", "(no LLM)",
                   "result(s)", "msgs"):
        assert jargon not in text, jargon
    assert lines[lines.index("⚠ Recoverable failure (payload too large (413)) — compacting "
                             "and retrying") + 1] == (
        "ℹ Learned a payload limit of about 30 KB (a 40 KB request was rejected)")
    assert "  ↳ oldest messages dropped to fit (9 → 5 messages)" in lines


def test_debug_keeps_the_numbers() -> None:
    step, outcome = SAMPLES[10], SAMPLES[12]
    assert describe_debug(step).splitlines() == [
        "⚠ Recoverable failure (payload too large (413)) — compacting and retrying",
        "ℹ exact fit: a 40 KB request was rejected — cutting history to 20 KB"]
    assert describe_debug(outcome).splitlines()[1] == (
        "  ↳ exact_fit: 4 messages dropped to fit 20 KB")
    assert describe_debug(SAMPLES[0]) == ("· pre-flight: request 9 KB ≈ 2,300 tokens; "
                                          "8,192-token window, no cap — ok")
    assert describe_debug(SAMPLES[6]) == ("⇣ Compacting history (9 messages, 30 KB → target "
                                          "12 KB)")


def test_quiet_keeps_what_changed_the_answer_or_lost_context() -> None:
    quiet = [type(e).__name__ for e in SAMPLES if shown_at(e) == "quiet"]
    # A summary applied replaced messages (README: quiet keeps what dropped context).
    assert sorted(set(quiet)) == ["CompactionPhase", "FitBeforeSend", "LadderStep", "Truncated"]
    applied = [e for e in SAMPLES if type(e).__name__ == "CompactionPhase"
               and shown_at(e) == "quiet"]
    assert applied and all(e.phase == "applied" for e in applied)


def test_every_line_starts_with_a_mark() -> None:
    for event in SAMPLES:
        for line in describe_debug(event).splitlines():
            assert line.lstrip()[0] in MARKS, line


@pytest.mark.skipif(shutil.which("fc-list") is None, reason="fontconfig is not installed")
def test_the_marks_exist_in_dejavu_sans() -> None:
    families = subprocess.run(["fc-list", ":family=DejaVu Sans", "family"], check=False,
                              capture_output=True, text=True).stdout
    if "DejaVu Sans" not in families:
        pytest.skip("fonts-dejavu-core is not installed")
    for mark in MARKS:
        found = subprocess.run(["fc-list", f":family=DejaVu Sans:charset={ord(mark):x}",
                                "family"], check=True, capture_output=True, text=True).stdout
        assert "DejaVu Sans" in found, f"{mark} (U+{ord(mark):04X}) is not in DejaVu Sans"


def test_plural_and_first_line() -> None:
    assert plural(1, "message") == "1 message"
    assert plural(2, "message") == "2 messages"
    assert plural(1_000, "entry", "entries") == "1,000 entries"
    assert first_line("a\n  b\tc") == "a b c"
    assert first_line("x" * 10, 5) == "xxxx…"


def test_a_cut_answer_names_the_limit_that_cut_it() -> None:
    cut = ev.Truncated(max_tokens=10, escalations=0)
    assert truncated_line(cut) == ("⚠ answer still cut at max_tokens=10 — raise --max-tokens "
                                   "or CHATCLI_MAX_TOKEN_ESCALATIONS, or ask for a shorter "
                                   "answer")
    assert truncated_line(cut, 10, "openai:gpt-4o").startswith(
        "⚠ answer cut at 10 tokens: that is the most openai:gpt-4o writes in one answer")


def test_failed_tool_line_is_one_line() -> None:
    failed = ev.ToolRun(name="db", ok=False, chars=40, detail="Error: db raised X:\n  boom\n")
    assert describe(failed) == "⚙ db failed: Error: db raised X: boom"
    assert describe(ev.ToolRun(name="db", ok=True, chars=1)) == "⚙ db: ok (1 char)"


def test_endpoint_and_status_text() -> None:
    assert endpoint_text("https://api.openai.com/v1") == "https://api.openai.com/v1 (no proxy)"
    assert endpoint_text("https://x/v1", "http://p:3128", proxy_var="HTTPS_PROXY") == (
        "https://x/v1 via proxy http://p:3128 (HTTPS_PROXY)")
    status = SimpleNamespace(name="s", model="emulator", history_bytes=651, est_tokens=163,
                             window=8192, window_guessed=False, window_learned=False, cap=None,
                             cap_source=None, messages=0, transcript_messages=1,
                             prompt_tokens=0, completion_tokens=0, compactions=0,
                             recoveries=0, cap_note=None)
    assert status_text(status, name="default").splitlines()[:4] == [
        "session default · model emulator",
        "history: empty (the 8,192-token window)",
        "payload cap: no payload cap configured",
        "transcript: 1 message"]


def test_an_unknown_price_says_how_to_set_it_by_the_name_a_price_takes() -> None:
    # %chat status (and %chat usage) said "price unknown" and nothing else: the name a
    # price takes is the model's id without its provider and router prefixes.
    status = SimpleNamespace(name="s", model="openai:Qwen/Qwen2.5-7B-Instruct",
                             history_bytes=651, est_tokens=163, window=8192,
                             window_guessed=False, window_learned=False, cap=None,
                             cap_source=None, messages=2, transcript_messages=2,
                             prompt_tokens=1_000, completion_tokens=10, compactions=0,
                             recoveries=0, cap_note=None, cached_tokens=0,
                             cache_write_tokens=0, cost=None)
    lines = status_text(status).splitlines()
    (cache,) = [ln for ln in lines if ln.startswith("cache:")]
    assert cache == "cache: 0 cached reads + 0 cache writes + 1,000 uncached input tokens"
    # The cost on a line of its own, after it (beside the split it ran past 80 columns).
    assert lines[lines.index(cache) + 1] == (
        "cost: price unknown (set it with %chat config "
        "prices=qwen2.5-7b-instruct=IN/CACHED/WRITE/OUT, USD per million tokens)")
    assert prices.price_for(status.model, "qwen2.5-7b-instruct=1/0.1/0/2") is not None
    # The card keeps it short; a known price says nothing of it.
    assert cost_words(None) == "price unknown"
    assert cost_words(0.5, price_name="gpt-4o") == "≈ $0.5000 (estimated; input and answer)"


def test_a_fit_that_stays_above_its_goal_is_not_told_as_reaching_it() -> None:
    # The latest message alone can be bigger than the goal: the card must not say the body
    # was "fitted to" a size it never reached; the note says where it ended.
    fit = ev.FitBeforeSend(body_bytes=25 * KB, goal_bytes=10 * KB, over="cap", cap=24 * KB,
                           cap_source="configured", est_tokens=6000, reserved_tokens=0,
                           window=128_000, notes=("8 messages dropped to fit 10 KB",
                                                  "still 19 KB after the cut (target 10 KB)"))
    detail = fit_detail(fit)
    assert "fitted to 10 KB" not in detail
    assert detail.startswith("25 KB over the 24 KB cap (configured) → cut, aiming at 10 KB (")
    assert detail.endswith("still 19 KB after the cut (target 10 KB))")


def test_the_card_says_what_the_chat_budget_is_and_which_setting_sets_it() -> None:
    from ipy_ctxrecovery.core.wording import preflight_verdict

    event = ev.Preflight(body_bytes=50 * KB, est_tokens=12_800, cap=None, window=16_384,
                         action="compact", reasons=("budget",), budget_bytes=48 * KB,
                         budget_of="window", budget_share=0.75)
    assert preflight_verdict(event) == ("over the chat budget, 48 KB (75% of the 16,384-token "
                                        "window: chat_budget_ratio) → compacting")


def test_a_reply_that_is_not_json_says_what_came_and_what_to_check() -> None:
    from ipy_ctxrecovery.core.wording import not_json_reply

    page = not_json_reply("OpenAI", "text/html", "Log in", "http://p/login", redirected=True,
                          page=True)
    assert page.startswith('The OpenAI endpoint answered HTTP 200 after a redirect to '
                           'http://p/login with an HTML page (content type text/html): '
                           '"Log in" — ')
    assert "captive portal" in page and "check the base URL" in page
    # A content type not known (the SDK's method kept it) is not told; none sent is.
    assert not_json_reply("Anthropic", None, "hi", None).startswith(
        'The Anthropic endpoint answered HTTP 200 with a body that is not JSON: "hi" — ')
    assert "with a body that is not an event stream (no content type) — " in not_json_reply(
        "OpenAI", "", "", "http://h/v1", streamed=True)
