"""The context panel: events set widget traits; the tree is built once; text fallback."""

from __future__ import annotations

import threading
from typing import Any

import ipywidgets as widgets

from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.ladder.decide import Decision, LadderState, Level
from ipy_ctxrecovery.failures import Failure, FailureKind
from ipy_ctxrecovery.notebook.panel import LADDER_LEVELS, ContextPanel
from ipy_ctxrecovery.settings import Settings

KB = 1024


def preflight(body: int, *, cap: int | None = 64 * KB, tokens: int = 1000,
              window: int = 8192, action: str = "ok",
              reasons: tuple[str, ...] = ()) -> ev.Preflight:
    return ev.Preflight(body_bytes=body, est_tokens=tokens, cap=cap,
                        cap_source="configured" if cap else None, window=window,
                        action=action, reasons=reasons)  # type: ignore[arg-type]


def step(level: str, attempt: int, before: int, after: int,
         kind: str = "payload_too_large") -> ev.LadderStep:
    failure = Failure(FailureKind(kind), "scripted")
    decision = Decision(Level(level), attempt, LadderState(attempt=attempt), failure=failure)
    return ev.LadderStep(decision=decision, failure=failure, before_messages=before,
                         after_messages=after)


def test_widget_tree_is_built_once_and_events_only_change_values() -> None:
    panel = ContextPanel(title="s")
    children = panel.widget.children
    bars = (panel.size_bar, panel.token_bar, panel.ladder_bar)
    panel.handle(preflight(32 * KB))
    panel.handle(step("emergency_truncate", 2, 30, 11, "payload_too_large"))
    assert panel.widget.children == children
    assert (panel.size_bar, panel.token_bar, panel.ladder_bar) == bars
    assert isinstance(panel.widget, widgets.VBox)


def test_sizes_against_cap_and_window() -> None:
    panel = ContextPanel(settings=Settings(max_payload=64 * KB))
    panel.handle(preflight(56 * KB, cap=64 * KB, tokens=4096, window=8192))
    assert panel.size_bar.value == 56 / 64
    assert panel.size_bar.bar_style == "warning"  # above the 85% pre-flight fraction
    assert panel.size_label.value == "56 KB of 64 KB cap (configured)"
    assert panel.token_bar.value == 0.5
    assert panel.token_bar.bar_style == "success"
    assert panel.token_label.value == "≈4,096 of 8,192 tokens"


def test_no_cap_measures_against_the_warning_threshold() -> None:
    settings = Settings()
    panel = ContextPanel(settings=settings)
    panel.handle(preflight(settings.no_cap_warn_bytes // 2, cap=None))
    assert panel.size_bar.value == 0.5
    assert panel.size_label.value == "1.2 MB (no payload cap)"
    assert panel.text().startswith("history  1.2 MB (no payload cap)\n")


def test_ladder_rungs_and_recovery() -> None:
    panel = ContextPanel()
    panel.handle(preflight(10 * KB, action="compact", reasons=("cap",)))
    assert panel.ladder_bar.value == 0
    assert panel.action_label.value == ("last: ℹ pre-flight: history 10 KB ≈ 16% of configured "
                                        "cap (64 KB) — compacting")
    for attempt, level in enumerate(("aggressive_budget", "emergency_truncate"), start=1):
        panel.handle(step(level, attempt, 20, 12, "payload_too_large"))
        assert panel.ladder_bar.value == LADDER_LEVELS[Level(level)] == attempt
    assert panel.ladder_bar.bar_style == "warning"
    assert panel.ladder_label.value == "this turn: step 2: dropped older messages (20 → 12 msgs)"
    panel.handle(ev.Recovered(attempts=2))
    panel.handle(ev.TurnFinished(history_bytes=9 * KB, est_tokens=900,
                                 window=8192, cap=None))
    assert panel.ladder_label.value == "last turn: recovered in 2 steps"
    assert panel.ladder_bar.value == 2  # the turn's highest step stays visible
    panel.handle(preflight(10 * KB))  # the next turn starts at the bottom again
    assert panel.ladder_bar.value == 0
    assert panel.action_label.value == "last: ✓ Recovered after 2 recovery steps"  # not routine


def test_a_turn_without_recovery_after_one_with_shows_none_needed() -> None:
    # A turn may emit nothing before TurnFinished (no pre-flight message): it still resets.
    panel = ContextPanel()
    panel.handle(step("exact_fit", 1, 9, 5, "context_overflow"))
    panel.handle(ev.Recovered(attempts=1))
    panel.handle(ev.TurnFinished(history_bytes=KB, est_tokens=256, window=8192,
                                 cap=None))
    assert "recovered in 1 step" in panel.text()
    panel.handle(ev.TurnFinished(history_bytes=2 * KB, est_tokens=512,
                                 window=8192, cap=None))
    assert panel.ladder_label.value == "last turn: none needed"
    assert panel.text().splitlines()[2] == "recovery last turn: none needed"


def test_nuclear_level_is_danger() -> None:
    panel = ContextPanel()
    panel.handle(step("nuclear_truncate", 3, 9, 5, "context_overflow"))
    assert panel.ladder_bar.value == 3
    assert panel.ladder_bar.bar_style == "danger"


def test_summarization_status_and_cap_changes() -> None:
    panel = ContextPanel()
    panel.handle(ev.CompactionPhase(phase="summarize", before_messages=23))
    assert panel.summary_label.value.startswith("⇣ Summarizing older messages with the model")
    panel.handle(ev.CompactionPhase(phase="applied", before_messages=23, after_messages=9,
                                    before_bytes=40 * KB, after_bytes=9 * KB,
                                    outcome="summary"))
    assert panel.summary_label.value == "✓ Summary applied (23 → 9 messages, 40 KB → 9 KB)"
    panel.handle(ev.CapChanged(cap=4 * 1024 * KB, source="assumed"))
    panel.handle(preflight(1024 * KB, cap=4 * 1024 * KB))
    assert panel.size_label.value == "1 MB of 4 MB cap (assumed)"
    panel.handle(ev.Failed(failure_kind=FailureKind.PAYLOAD_TOO_LARGE, sentence="gave up"))
    assert panel.ladder_label.value == "last turn: failed (payload too large)"
    assert panel.action_label.value == "last: ✗ gave up"


def test_turn_finished_updates_sizes_without_touching_the_last_action() -> None:
    panel = ContextPanel()
    panel.handle(ev.MicrocompactApplied(truncated=3, summarized=0, bytes_freed=9000))
    panel.handle(ev.TurnFinished(history_bytes=2048, est_tokens=512, window=4096,
                                 cap=None))
    assert panel.history_bytes == 2048
    assert panel.token_bar.value == 512 / 4096
    assert panel.action_label.value == ("last: ✂ microcompact: 3 truncated, 0 summarized, "
                                        "8.8 KB freed")


def test_plain_text_fallback_in_the_mimebundle() -> None:
    panel = ContextPanel(title="default", settings=Settings(max_payload=64 * KB))
    panel.handle(preflight(16 * KB, cap=64 * KB))
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    text = bundle["text/plain"]
    assert text == panel.text()
    assert text.splitlines()[:3] == ["history  16 KB of 64 KB cap (configured)",
                                     "tokens   ≈1,000 of 8,192 tokens",
                                     "recovery this turn: none needed"]
    for jargon in ("ladder", "rung", "exact_fit", "no cap configured"):
        assert jargon not in text


def test_events_from_another_thread_wait_for_the_owning_thread() -> None:
    panel = ContextPanel()
    worker = threading.Thread(target=panel.handle, args=(preflight(48 * KB),))
    worker.start()
    worker.join()
    assert panel.history_bytes == 0  # not applied off the kernel thread
    panel.handle(ev.Recovered(attempts=1))
    assert panel.history_bytes == 48 * KB
    assert panel.action_label.value == "last: ✓ Recovered after 1 recovery step"


def test_attach_follows_a_real_session(emulator: Any) -> None:
    from ipy_ctxrecovery.session import ChatSession

    emu = emulator(context_window=4096)
    session = ChatSession("emulator", emulator=emu, settings=Settings(max_payload=64 * KB),
                          system="be brief")
    panel = ContextPanel(settings=session.settings)
    panel.attach(session)
    status = session.status()
    assert panel.history_bytes == status.history_bytes > 0
    assert panel.window == 4096
    assert panel.size_label.value.endswith("(configured)")
    session.send("hello " * 200)
    grown = session.status()
    assert grown.history_bytes > status.history_bytes
    assert panel.history_bytes == grown.history_bytes  # from the session's status
    assert panel.est_tokens == grown.est_tokens
    session.send("a short one", max_tokens=7)  # measured differently by the turn itself
    assert panel.est_tokens == session.status().est_tokens
    assert panel.history_bytes == session.status().history_bytes
    assert panel.text().splitlines()[2] == ("recovery last turn: none needed · 0 recoveries, "
                                            "0 compactions so far")
    followed = panel.history_bytes
    panel.detach()
    session.send("again")
    assert panel.history_bytes == followed  # no longer following
    session.close()
