"""preflight: Caps (configured/learned/assumed), the calibrated estimate, and check()."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipy_ctxrecovery.core.compactor import ChatBudget, chat_budget
from ipy_ctxrecovery.core.preflight import (
    MAX_BYTES_PER_TOKEN,
    MIN_BYTES_PER_TOKEN,
    TokenEstimator,
    check,
)
from ipy_ctxrecovery.core.recovery.evidence import Caps, PathEvidence
from ipy_ctxrecovery.failures import Signature
from ipy_ctxrecovery.settings import KiB, MiB, Settings, format_size

PROPS = settings(max_examples=300, deadline=None)
S = Settings()


def run_check(body: int, caps: Caps | None = None, est: TokenEstimator | None = None, *,
              window: int = 10_000_000, max_tokens: int | None = None, warned: bool = False,
              settings_: Settings = S, budget: ChatBudget | None = None):
    return check(body, settings=settings_, caps=caps or Caps(),
                 estimator=est or TokenEstimator(), window_tokens=window,
                 max_tokens=max_tokens, warned=warned, chat_budget=budget)


# -- Caps ---------------------------------------------------------------------------------------

def test_no_cap_at_all() -> None:
    caps = Caps()
    assert caps.effective() is None
    assert caps.source is None


def test_configured_cap_from_settings() -> None:
    caps = Caps.from_settings(Settings(max_payload=5 * MiB))
    assert caps.effective() == 5 * MiB
    assert caps.source == "configured"


def test_assumed_cap_is_used_only_without_anything_better() -> None:
    caps = Caps(assumed=4 * MiB)
    assert (caps.effective(), caps.source) == (4 * MiB, "assumed")
    caps.record_rejection(1 * MiB)
    assert caps.effective() < 1 * MiB
    assert caps.source == "learned"


def test_learned_cap_lies_between_largest_ok_and_smallest_rejected() -> None:
    caps = Caps()
    caps.record_success(100 * KiB)
    learned = caps.record_rejection(200 * KiB)
    assert learned == 150 * KiB                      # ¾ of the rejected size
    assert caps.effective() == 150 * KiB and caps.source == "learned"
    caps.record_success(180 * KiB)                   # a bigger body went through
    assert caps.effective() == 180 * KiB             # max(largest ok, ¾ × rejected)
    caps.record_rejection(190 * KiB)
    assert 180 * KiB <= caps.effective() < 190 * KiB


def test_learned_cap_is_strictly_below_the_smallest_rejection() -> None:
    caps = Caps()
    caps.record_success(1000)
    caps.record_rejection(1001)
    assert caps.effective() == 1000
    caps.record_rejection(1000)       # contradicts the success: still strictly below
    assert caps.effective() == 999


def test_a_success_above_a_rejection_forgets_that_rejection() -> None:
    caps = Caps()
    caps.record_rejection(100 * KiB)          # e.g. a flaky connection, not the size
    caps.record_success(300 * KiB)
    assert caps.smallest_rejected is None
    assert caps.effective() is None


def test_rejection_of_unknown_size_learns_nothing() -> None:
    caps = Caps()
    assert caps.record_rejection(None) is None
    assert caps.effective() is None


def test_a_rejection_below_the_configured_cap_wins() -> None:
    caps = Caps(configured=5 * MiB)
    caps.record_rejection(2 * MiB)
    assert caps.effective() == int(1.5 * MiB)
    assert caps.source == "learned"


def _simulate(caps: Caps, bodies: list[int], proxy_limit: int) -> tuple[int, list[int]]:
    """Send each body (pre-flight cuts it to the cap); return (rejections, sizes sent)."""
    rejections = 0
    sent = []
    for wanted in bodies:
        body = wanted
        while True:
            cap = caps.effective()
            if cap is not None:
                body = min(body, cap)
            sent.append(body)
            if body > proxy_limit:
                rejections += 1
                caps.record_rejection(body)
                continue
            caps.record_success(body)
            break
    return rejections, sent


def test_learns_a_128_kb_proxy_within_two_rejections_on_a_growing_conversation() -> None:
    limit = 128 * KiB
    growth = [k * 20 * KiB for k in range(1, 30)]          # 20 KB more every turn
    rejections, sent = _simulate(Caps(), growth, limit)
    assert rejections <= 2
    assert max(sent[-10:]) <= limit


def test_learns_a_128_kb_proxy_within_two_rejections_after_a_jump() -> None:
    limit = 128 * KiB
    bodies = [40 * KiB, 90 * KiB, 220 * KiB, 230 * KiB, 240 * KiB]    # a big tool result lands
    rejections, sent = _simulate(Caps(), bodies, limit)
    assert rejections <= 2
    assert all(s <= limit for s in sent[-3:])


def test_two_caps_are_independent_and_the_environment_is_untouched() -> None:
    # ANCHORS 4: learned state belongs to one session object, never to globals or os.environ.
    env_before = dict(os.environ)
    a, b = Caps(), Caps()
    a.record_rejection(200 * KiB)
    assert b.effective() is None
    assert dict(os.environ) == env_before
    ea, eb = TokenEstimator(), TokenEstimator()
    ea.calibrate(3_000, 1_000)
    assert eb.bytes_per_token == 4.0


# -- TokenEstimator ------------------------------------------------------------------------------

def test_estimate_starts_from_the_settings_heuristic_and_rounds_up() -> None:
    est = TokenEstimator.from_settings(Settings(chars_per_token=4.0))
    assert est.estimate(4_000) == 1_000
    assert est.estimate(4_001) == 1_001
    assert est.estimate(0) == 0
    assert est.bytes_for(1_000) == 4_000
    assert TokenEstimator.from_settings(Settings(chars_per_token=3.5)).bytes_per_token == 3.5


def test_first_usage_sample_replaces_the_heuristic() -> None:
    est = TokenEstimator()
    est.calibrate(30_000, 10_000)
    assert est.bytes_per_token == pytest.approx(3.0)
    assert est.samples == 1


def test_recent_samples_weigh_more() -> None:
    est = TokenEstimator()
    for _ in range(10):
        est.calibrate(30_000, 10_000)         # 3 bytes/token for a while
    for _ in range(3):
        est.calibrate(50_000, 10_000)         # then the content changes: 5 bytes/token
    plain_mean = (10 * 3.0 + 3 * 5.0) / 13
    assert est.bytes_per_token > plain_mean
    assert est.bytes_per_token < 5.0


def test_calibration_is_clamped_and_ignores_empty_samples() -> None:
    est = TokenEstimator()
    est.calibrate(100, 1_000)                 # 0.1 bytes/token: clamped
    assert est.bytes_per_token == MIN_BYTES_PER_TOKEN
    est = TokenEstimator()
    est.calibrate(1_000_000, 10)              # 100,000 bytes/token: clamped
    assert est.bytes_per_token == MAX_BYTES_PER_TOKEN
    est = TokenEstimator()
    est.calibrate(1_000, 0)
    est.calibrate(0, 10)
    assert (est.bytes_per_token, est.samples) == (4.0, 0)


@PROPS
@given(st.lists(st.tuples(st.integers(1, 10**8), st.integers(1, 10**7)), max_size=30))
def test_estimator_stays_in_range(samples: list[tuple[int, int]]) -> None:
    est = TokenEstimator()
    for body, tokens in samples:
        est.calibrate(body, tokens)
        assert MIN_BYTES_PER_TOKEN <= est.bytes_per_token <= MAX_BYTES_PER_TOKEN
        assert est.estimate(body) * est.bytes_per_token >= body - 1e-6


def test_calibration_lets_preflight_catch_an_overflow_the_heuristic_misses() -> None:
    body, window = 30_000, 8_192
    est = TokenEstimator()
    assert run_check(body, est=est, window=window).action == "ok"     # 7,500 tokens by 4 b/t
    est.calibrate(24_000, 8_000)        # the provider counted 3 bytes per token
    result = run_check(body, est=est, window=window)
    assert result.est_tokens == 10_000
    assert result.action == "compact"


# -- check ------------------------------------------------------------------------------------------

def test_configured_cap_hit_compacts_at_040_with_the_spec_line() -> None:
    caps = Caps(configured=5 * MiB)
    body = int(4.3 * MiB)
    result = run_check(body, caps)
    assert result.action == "compact"
    assert result.budget_ratio == 0.40
    assert result.cap == 5 * MiB
    assert result.message == (f"ℹ pre-flight: history {format_size(body)} ≈ 86% of "
                              f"configured cap ({format_size(5 * MiB)}) — compacting")
    assert result.message == "ℹ pre-flight: history 4.3 MB ≈ 86% of configured cap (5 MB) — compacting"


def test_just_under_85_percent_is_ok() -> None:
    caps = Caps(configured=5 * MiB)
    result = run_check(int(0.85 * 5 * MiB), caps)
    assert (result.action, result.message, result.budget_ratio) == ("ok", None, None)


@pytest.mark.parametrize("caps, source", [
    (Caps(assumed=4 * MiB), "assumed"),
    (Caps(path=PathEvidence(largest_ok=10 * KiB, refused={Signature.SIZE: 160 * KiB})),
     "learned"),
])
def test_message_names_the_cap_source(caps: Caps, source: str) -> None:
    cap = caps.effective()
    assert cap is not None
    result = run_check(cap, caps)
    assert result.action == "compact"
    assert f"≈ 100% of {source} cap ({format_size(cap)})" in (result.message or "")


def test_no_cap_warning_once_with_the_spec_line() -> None:
    body = int(2.8 * MiB)
    result = run_check(body)
    assert result.action == "warn"
    assert result.warned
    assert result.message == ("ℹ history 2.8 MB — if your network has a proxy/gateway, set "
                              "its limit with %chat config CHATCLI_MAX_PAYLOAD=5MB (or the "
                              "environment variable CHATCLI_MAX_PAYLOAD)")
    again = run_check(body, warned=True)
    assert (again.action, again.message, again.warned) == ("ok", None, False)


def test_no_warning_under_2_5_mb_or_with_a_cap() -> None:
    assert run_check(int(2.5 * MiB)).action == "ok"
    assert run_check(int(2.8 * MiB), Caps(configured=10 * MiB)).action == "ok"


def test_window_check_counts_max_tokens() -> None:
    est = TokenEstimator()
    result = run_check(20_000, est=est, window=8_192, max_tokens=4_096)   # 5,000 + 4,096
    assert result.action == "compact"
    assert result.message == ("ℹ pre-flight: ≈5,000 tokens + max_tokens 4,096 > context "
                              "window 8,192 tokens — compacting")
    # The budget leaves room for the answer: (8192 - 4096) / 8192 = 0.5 < 0.75.
    assert result.budget_ratio == pytest.approx(0.5)
    assert run_check(20_000, est=est, window=8_192, max_tokens=1_000).action == "ok"


def test_cap_and_window_both_hit_report_both_and_take_the_smaller_ratio() -> None:
    caps = Caps(configured=100 * KiB)
    result = run_check(99 * KiB, caps, window=20_000, max_tokens=4_000)
    assert result.action == "compact"
    assert result.budget_ratio == 0.40
    assert result.message is not None and len(result.message.splitlines()) == 2


def test_window_hit_with_warning_keeps_both_lines() -> None:
    result = run_check(3 * MiB, window=100_000)
    assert result.action == "compact"
    assert result.warned
    assert "CHATCLI_MAX_PAYLOAD=5MB" in (result.message or "")


def test_over_the_chat_budget_of_the_window_compacts_and_says_why() -> None:
    # 16,384-token window at 4 bytes a token: the chat budget is 75 % of it, 48 KiB.
    budget = chat_budget(S, window_tokens=16_384, bytes_per_token=4.0, cap=None,
                         ratio=S.chat_budget_ratio)
    assert budget == ChatBudget(48 * KiB, "window", 0.75)
    result = run_check(50 * KiB, window=16_384, max_tokens=1_000, budget=budget)
    assert (result.action, result.reasons, result.budget_ratio) == ("compact", ("budget",), None)
    assert result.message == ("ℹ pre-flight: history 50 KB is over the chat budget, 48 KB (75% "
                              "of the 16,384-token window: chat_budget_ratio) — compacting")
    within = run_check(48 * KiB, window=16_384, max_tokens=1_000, budget=budget)
    assert (within.action, within.message) == ("ok", None)


def test_over_the_chat_budget_of_the_cap_names_the_cap_and_its_setting() -> None:
    caps = Caps(configured=100 * KiB)
    budget = chat_budget(S, window_tokens=1_000_000, bytes_per_token=4.0, cap=100 * KiB,
                         ratio=S.chat_budget_ratio)
    assert budget == ChatBudget(70 * KiB, "cap", 0.70)
    result = run_check(80 * KiB, caps, budget=budget)      # 80 %: under the 85 % hit
    assert result.action == "compact" and result.reasons == ("budget",)
    assert result.message == ("ℹ pre-flight: history 80 KB is over the chat budget, 70 KB (70% "
                              "of the configured cap 100 KB: cap_budget_fraction) — compacting")
    assert result.event().budget_bytes == 70 * KiB


def test_a_cap_or_window_hit_is_not_also_called_over_the_budget() -> None:
    caps = Caps(configured=100_000)
    budget = ChatBudget(70_000, "cap", 0.70)
    result = run_check(90_000, caps, budget=budget)
    assert result.reasons == ("cap",) and result.event().budget_bytes is None


def test_no_known_window_or_cap_is_no_budget() -> None:
    budget = chat_budget(S, window_tokens=None, bytes_per_token=4.0, cap=None, ratio=0.75)
    assert budget.of is None
    assert run_check(10 * MiB, budget=budget, warned=True).action == "ok"
