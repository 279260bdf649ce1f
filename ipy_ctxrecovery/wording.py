"""What the product says to a person: every status line, rendered from typed events.

:func:`describe` turns one :mod:`event <.events>` into its line(s) of plain text, and
:func:`decision_lines` a ladder :class:`~._decide.Decision`. The printer, the panel,
``Reply.actions`` and the tests all read these, so a wording changes in one place and
nothing ever parses a line back. Pure functions; no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import singledispatch

from . import events as ev
from ._decide import Decision, Level
from .config import format_size
from .failures import Failure, FailureKind

__all__ = ["assumed_cap_line", "decision_lines", "describe", "no_cap_warning", "plural"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 message``, ``2 messages`` (``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def no_cap_warning(body_bytes: int) -> str:
    """SPEC §2's one-shot warning when no cap is configured."""
    return (f"ℹ history {format_size(body_bytes)} — if your network has a proxy/gateway, "
            "export CHATCLI_MAX_PAYLOAD=5MB (set it to the proxy's limit)")


def assumed_cap_line(cap: int) -> str:
    """SPEC §3's auto-cap line."""
    return (f"ℹ Assuming a {format_size(cap)}/payload limit — export CHATCLI_MAX_PAYLOAD "
            "(e.g. 5MB, 512KB) to adjust")


def decision_lines(decision: Decision, *, assumption: bool = True,
                   summarizing: bool = False) -> list[str]:
    """The lines a ladder decision is told with (SPEC §3).

    ``assumption``: include the auto-cap line (the session tells it as its own event);
    ``summarizing``: an exact fit that first tries an LLM summary.
    """
    failure = decision.failure
    if decision.level is Level.GIVE_UP or failure is None:
        return [decision.reason] if decision.reason else []
    label = failure.label
    if decision.level is Level.LOWER_MAX_TOKENS:
        new = decision.max_tokens or 0
        requested = decision.requested_max_tokens
        if failure.kind is FailureKind.OUTPUT_LIMIT:
            shown = f"{requested:,}" if requested is not None else "requested"
            return [f"⚠ Recoverable failure ({label}) — retrying with max_tokens {new:,} "
                    f"instead of {shown}"]
        return [f"⚠ Recoverable failure ({label}) — {failure.prompt_tokens or 0:,} + "
                f"{requested or 0:,} > {failure.limit_tokens or 0:,} tokens: retrying with "
                f"max_tokens {new:,} (history untouched)"]
    lines = [f"⚠ Recoverable failure ({label}) — compacting and retrying"]
    if assumption and decision.assume_cap is not None:
        lines.append(assumed_cap_line(decision.assume_cap))
    if decision.level is Level.EXACT_FIT and decision.target_bytes is not None:
        verb = "summarizing" if summarizing else "cutting"
        lines.append(f"ℹ exact fit: {_fit_reason(decision)} — {verb} history to "
                     f"{format_size(decision.target_bytes)}")
    return lines


def _fit_reason(decision: Decision) -> str:
    failure = decision.failure
    assert failure is not None
    if decision.rejected_bytes is not None:
        verb = "dropped" if failure.kind is FailureKind.LIKELY_PAYLOAD else "rejected"
        return f"a {format_size(decision.rejected_bytes)} request was {verb}"
    requested = decision.requested_max_tokens
    room = f" (room kept for max_tokens {requested:,})" if requested else ""
    return (f"the provider reported {failure.prompt_tokens or 0:,} tokens > "
            f"{failure.limit_tokens or 0:,}{room}")


@singledispatch
def describe(event: ev.Event) -> str:
    """The line(s) a person reads for ``event`` ('' for an event with nothing to say)."""
    return ""


@describe.register
def _(e: ev.Preflight) -> str:
    lines = []
    if "cap" in e.reasons and e.cap:
        lines.append(f"ℹ pre-flight: history {format_size(e.body_bytes)} ≈ "
                     f"{round(100 * e.body_bytes / e.cap)}% of {e.cap_source} cap "
                     f"({format_size(e.cap)}) — compacting")
    if "window" in e.reasons:
        what = f"≈{e.est_tokens:,} tokens" + (f" + max_tokens {e.max_tokens:,}"
                                              if e.max_tokens else "")
        lines.append(f"ℹ pre-flight: {what} > context window {e.window:,} tokens — compacting")
    if "no_cap" in e.reasons:
        lines.append(no_cap_warning(e.body_bytes))
    return "\n".join(lines)


@describe.register
def _(e: ev.MaxTokensLowered) -> str:
    if e.reason == "output_limit":
        return (f"ℹ pre-flight: max_tokens {e.requested:,} is above the model's output limit "
                f"({e.sent:,}, learned from an earlier rejection) — sending max_tokens "
                f"{e.sent:,}")
    return (f"ℹ pre-flight: ≈{e.est_tokens:,} prompt tokens + max_tokens {e.requested:,} > "
            f"context window {e.window:,} — sending max_tokens {e.sent:,}")


@describe.register
def _(e: ev.FitBeforeSend) -> str:
    if e.over == "cap" and e.cap is not None:
        what = f"over the {format_size(e.cap)} {e.cap_source} cap"
    else:
        what = (f"≈{e.est_tokens:,} tokens"
                + (f" + max_tokens {e.reserved_tokens:,}" if e.reserved_tokens else "")
                + f" over the {e.window:,}-token window")
    line = (f"ℹ pre-flight: still {format_size(e.body_bytes)} after compaction, {what} — "
            f"fitting to {format_size(e.goal_bytes)} before sending")
    return line + (f"\n  ↳ {'; '.join(e.notes)}" if e.notes else "")


@describe.register
def _(e: ev.MicrocompactApplied) -> str:
    return (f"🗜 microcompact: {e.truncated} truncated, {e.summarized} summarized, "
            f"{format_size(e.bytes_freed)} freed")


@describe.register
def _(e: ev.BudgetApplied) -> str:
    return (f"✂ tool-result budget: {e.replaced} result(s) replaced by previews; full content "
            f"saved ({', '.join(e.persisted) or 'already saved'})")


@describe.register
def _(e: ev.CompactionPhase) -> str:
    n0, b0 = e.before_messages, format_size(e.before_bytes)
    n1 = e.after_messages if e.after_messages is not None else n0
    b1 = format_size(e.after_bytes if e.after_bytes is not None else e.before_bytes)
    if e.phase == "start":
        return (f"📦 Compacting history ({n0} msgs, {b0} → target "
                f"{format_size(e.target_bytes or 0)})")
    if e.phase == "trim":
        return "🧹 Trim: removing reasoning/dedup (no LLM)…"
    if e.phase == "summarize":
        return "🧠 Summarizing old messages via LLM (may take 30-90s — interrupt cancels)…"
    if e.phase == "rejected":
        return f"✗ Compaction rejected: {e.reason} — history kept as it was"
    if e.phase == "cancelled":
        return "✗ Compaction cancelled — history left exactly as it was"
    if e.outcome == "nothing":
        return f"✓ History already within target ({n0} msgs, {b0}) — nothing to compact"
    if e.outcome == "trim":
        return f"✓ Trim applied, no LLM needed ({n0} → {n1} msgs, {b0} → {b1})"
    return f"✓ Summary applied ({n0} → {n1} msgs, {b0} → {b1})"


@describe.register
def _(e: ev.LadderStep) -> str:
    if e.summary_not_used is not None:
        text = f"  ↳ summary not used ({e.summary_not_used}) — dropping the oldest messages"
    else:
        text = "\n".join(decision_lines(e.decision, assumption=False,
                                        summarizing=e.summarizing))
    if e.notes:
        text += f"\n  ↳ {e.level.value}: " + "; ".join(e.notes)
    return text or f"⚠ recovery: {e.level.value}"


@describe.register
def _(e: ev.NoticeInjected) -> str:
    if e.notice == "payload":
        return "ℹ SYSTEM NOTICE (payload limit hit) given to the model"
    return "ℹ the model was told that earlier context was compacted"


@describe.register
def _(e: ev.CapChanged) -> str:
    if e.source == "assumed" and e.cap is not None:
        return assumed_cap_line(e.cap)
    if e.source == "learned" and e.cap is not None:
        verb = "dropped" if e.dropped else "rejected"
        return (f"ℹ Learned a payload limit of about {format_size(e.cap)} (a "
                f"{format_size(e.rejected_bytes or 0)} request was {verb})")
    return (f"ℹ payload cap {format_size(e.cap)} ({e.source})" if e.cap is not None
            else "ℹ no payload cap")


@describe.register
def _(e: ev.Escalation) -> str:
    return (f"↗ answer cut at max_tokens={e.previous:,} — continuing with "
            f"max_tokens={e.max_tokens:,} (escalation {e.attempt}/{e.of})")


@describe.register
def _(e: ev.Truncated) -> str:
    return (f"⚠ answer still cut at max_tokens={e.max_tokens:,} after "
            f"{e.escalations} escalation{'s' if e.escalations != 1 else ''} — "
            "raise max_tokens or CHATCLI_MAX_TOKEN_ESCALATIONS")


@describe.register
def _(e: ev.WindowLearned) -> str:
    return (f"ℹ Learned a context window of {e.window:,} tokens from the provider (this "
            f"session assumed {e.previous:,}) — using it from now on; set "
            f"CHATCLI_CONTEXT_WINDOW={e.window} to start with it")


@describe.register
def _(e: ev.Retrying) -> str:
    if e.failure_kind is FailureKind.AUTH:
        return "↻ authentication failed — re-reading the credentials and retrying once"
    return f"↻ {e.failure.label} — retrying in {e.wait:.1f}s ({e.attempt}/{e.of})"


@describe.register
def _(e: ev.ToolRun) -> str:
    if e.limit_reached:
        return (f"🔧 tool round limit ({e.max_rounds}) reached — asking the model to answer "
                "with what it has")
    return f"🔧 {e.name}: {'ok' if e.ok else 'error'} ({e.chars:,} chars)"


@describe.register
def _(e: ev.Recovered) -> str:
    return f"✓ Recovered after {e.attempts} recovery step{'s' if e.attempts > 1 else ''}"


@describe.register
def _(e: ev.Failed) -> str:
    return f"✗ {e.sentence}"


@describe.register
def _(e: ev.TurnFinished) -> str:
    share = f"{100 * e.est_tokens / e.window:.0f}%" if e.window else "?"
    return (f"history {format_size(e.history_bytes)} ≈ {e.est_tokens:,} tokens ({share} of "
            f"the {e.window:,}-token window)")


# == The turn card and the live panel ======================================================
# Short phrases over events, for the two views of a turn: the static card written under a
# %%chat cell when its turn ends (notebook/turn_card.py) and the live panel's step tracker
# (notebook/panel.py). Each names one step of the turn and says what it did, before →
# after, in plain words. Only glyphs that common fonts have (DejaVu Sans, Liberation,
# Segoe UI, Helvetica): ``CARD_GLYPHS`` lists every non-ASCII character used here.

CARD_GLYPHS = frozenset("≈→·…✓✗–○●▸■")
"""Non-ASCII characters the card and the panel may show (all in DejaVu Sans); the tests
check every rendered label against this set."""

STATUS_GLYPHS: dict[str, str] = {
    "pending": "○", "running": "●", "done": "✓", "failed": "✗", "cancelled": "✗",
    "skipped": "–", "info": "·",
}
"""A step's status as one glyph (the card's and the tracker's first column)."""

LEVEL_NAMES: dict[Level, str] = {
    Level.LOWER_MAX_TOKENS: "shorter answer",
    Level.EXACT_FIT: "cut to fit",
    Level.AGGRESSIVE: "shrink tool results",
    Level.EMERGENCY: "drop older messages",
    Level.NUCLEAR: "keep only the latest",
    Level.GIVE_UP: "gave up",
}
"""Each recovery level in plain words (the tracker's level chips and the card)."""

STAGE_NAMES: dict[str, str] = {
    "preflight": "pre-flight", "answer_size": "answer size", "microcompact": "microcompact",
    "budget": "tool-result budget", "compaction": "compaction", "trim": "trim",
    "summarize": "summarize", "apply": "apply", "fit": "fit before sending",
    "send": "send", "recovery": "recovery", "cap": "payload cap",
    "window": "context window", "notice": "note to the model", "retry": "retry",
    "tool": "tool", "continuation": "continuation", "failed": "failed",
}
"""The name of each step of a turn, as the card and the tracker show it."""


def cap_words(cap: int | None, source: str | None) -> str:
    """``"30 KB cap (learned)"``, or ``"no payload cap known"``."""
    if cap is None:
        return "no payload cap known"
    return f"{format_size(cap)} cap ({source or 'configured'})"


def size_against_cap(body: int, cap: int | None, source: str | None) -> str:
    """A request or history size against the cap: ``"40 KB of 30 KB cap (learned), over
    it"``, ``"12 KB of 30 KB cap (learned)"``, ``"40 KB · no payload cap known"``."""
    if cap is None:
        return f"{format_size(body)} · no payload cap known"
    over = ", over it" if body > cap else ""
    return f"{format_size(body)} of {cap_words(cap, source)}{over}"


def tokens_against_window(tokens: int, window: int | None, source: str | None = None) -> str:
    """``"≈2,100 of 8,192 tokens (model catalogue)"``."""
    if not window:
        return f"≈{tokens:,} tokens"
    return f"≈{tokens:,} of {window:,} tokens" + (f" ({source})" if source else "")


def sizes_before(e: ev.Preflight) -> str:
    """The turn's first request, as pre-flight measured it."""
    return (f"request {size_against_cap(e.body_bytes, e.cap, e.cap_source)} · "
            f"{tokens_against_window(e.est_tokens, e.window)}")


def sizes_after(e: ev.TurnFinished, cap_source: str | None) -> str:
    """The history the turn left, against the cap and window in force at its end."""
    return (f"history {size_against_cap(e.history_bytes, e.cap, cap_source)} · "
            f"{tokens_against_window(e.est_tokens, e.window)}")


def preflight_verdict(e: ev.Preflight) -> str:
    """What pre-flight made of the request (its sizes have their own lines)."""
    parts = []
    if "cap" in e.reasons:
        parts.append("near the cap → compacting")
    if "window" in e.reasons:
        parts.append("prompt + answer over the window → compacting")
    if "no_cap" in e.reasons:
        parts.append("large, with no cap set: if a proxy limits requests, "
                     "%chat config max_payload=SIZE")
    return " · ".join(parts) or ("within the window and the cap" if e.cap
                                 else "within the window")


def answer_size_detail(e: ev.MaxTokensLowered) -> str:
    why = ("the output limit learned earlier" if e.reason == "output_limit"
           else "room left in the window")
    return f"max_tokens {e.requested:,} → {e.sent:,} ({why})"


def microcompact_detail(e: ev.MicrocompactApplied) -> str:
    return (f"old tool results: {e.truncated} shortened, {e.summarized} cleared to one line · "
            f"{format_size(e.bytes_freed)} freed")


def budget_detail(e: ev.BudgetApplied) -> str:
    return f"{plural(e.replaced, 'tool result')} → previews (full text saved)"


def compaction_detail(phases: Sequence[ev.CompactionPhase]) -> str:
    """What one compaction did (or is doing), from its phases so far."""
    last = phases[-1]
    n0, b0 = last.before_messages, format_size(last.before_bytes)
    n1 = last.after_messages if last.after_messages is not None else n0
    b1 = format_size(last.after_bytes if last.after_bytes is not None else last.before_bytes)
    target = format_size(last.target_bytes or 0)
    if last.phase == "start":
        return f"{plural(n0, 'message')}, {b0} → target {target}"
    if last.phase == "trim":
        return "trimming reasoning and repeats (no LLM)…"
    if last.phase == "summarize":
        return f"the model is summarizing older messages ({b0} → target {target})…"
    if last.phase == "rejected":
        return f"not applied ({last.reason}) · history kept as it was"
    if last.phase == "cancelled":
        return f"cancelled · history exactly as before ({plural(n0, 'message')}, {b0})"
    if last.outcome == "nothing":
        return f"already within the {target} target · nothing changed"
    how = "trimmed, no LLM" if last.outcome == "trim" else "summary by the model"
    return f"{how}: {n0} → {plural(n1, 'message')}, {b0} → {b1}"


def fit_detail(e: ev.FitBeforeSend) -> str:
    over = (cap_words(e.cap, e.cap_source) if e.over == "cap"
            else f"{e.window:,}-token window")
    return (f"{format_size(e.body_bytes)} over the {over} → fitted to "
            f"{format_size(e.goal_bytes)}" + (f" ({'; '.join(e.notes)})" if e.notes else ""))


def send_detail(e: ev.Sending, *, status: str, failure: Failure | None = None,
                streamed_tokens: int = 0) -> str:
    """One request: leaving, streaming, answered or rejected."""
    size = format_size(e.body_bytes)
    again = f" (try {e.attempt})" if e.attempt > 1 else ""
    if status == "failed" and failure is not None:
        return f"{size}{again} · {failure.label}"
    if status == "failed":
        return f"{size}{again} · no answer"
    if status == "cancelled":
        got = f" after ≈{streamed_tokens:,} answer tokens" if streamed_tokens else ""
        return f"{size}{again} · interrupted{got}"
    if status == "done":
        return f"{size}{again} · answered"
    if streamed_tokens:
        return f"{size}{again} · answer arriving: ≈{streamed_tokens:,} tokens"
    return f"{size}{again} · waiting for the answer…"


def ladder_name(e: ev.LadderStep) -> str:
    """``"recovery 1: summarize to fit"``."""
    name = "summarize to fit" if e.summarizing else LEVEL_NAMES[e.level]
    return f"recovery {e.attempt}: {name}"


def ladder_detail(e: ev.LadderStep, *, not_used: ev.LadderStep | None = None,
                  done: bool = False) -> str:
    """What a recovery step did (``done``) or is doing; ``not_used``: the later step saying
    its summary was not used (the oldest messages were dropped instead)."""
    d = e.decision
    if not_used is not None:
        return (f"summary not used ({not_used.summary_not_used}) → dropped the oldest "
                f"messages: {not_used.before_messages} → {not_used.after_messages}")
    if e.level is Level.LOWER_MAX_TOKENS:
        return (f"max_tokens {d.requested_max_tokens or 0:,} → {d.max_tokens or 0:,}, "
                "history untouched")
    why = ""
    if d.rejected_bytes is not None:
        why = f"a {format_size(d.rejected_bytes)} request was rejected"
    elif e.failure.prompt_tokens and e.failure.limit_tokens:
        why = (f"the provider counted {e.failure.prompt_tokens:,} tokens > "
               f"{e.failure.limit_tokens:,}")
    else:
        why = e.failure.label
    if e.summarizing:
        target = format_size(d.target_bytes or 0)
        return (f"{why} → older messages summarized to fit {target}" if done
                else f"{why} → summarizing older messages to {target}")
    moved = f"{e.before_messages} → {plural(e.after_messages, 'message')}"
    return f"{why} → {moved}" + (f" ({'; '.join(e.notes)})" if e.notes else "")


def cap_detail(e: ev.CapChanged) -> str:
    if e.source == "learned" and e.cap is not None:
        verb = "dropped" if e.dropped else "rejected"
        return (f"learned ≈{format_size(e.cap)}: a {format_size(e.rejected_bytes or 0)} "
                f"request was {verb} (kept for this network path)")
    if e.source == "assumed" and e.cap is not None:
        return (f"assuming {format_size(e.cap)} until told · %chat config max_payload=SIZE "
                "sets the real one")
    return cap_words(e.cap, e.source)


def window_detail(e: ev.WindowLearned) -> str:
    return f"{e.previous:,} → {e.window:,} tokens (as the provider reported)"


def notice_detail(e: ev.NoticeInjected) -> str:
    if e.notice == "payload":
        return "told the model a size limit was hit (read files in ranges)"
    return "told the model that earlier context was compacted"


def retry_detail(e: ev.Retrying) -> str:
    if e.failure_kind is FailureKind.AUTH:
        return "authentication failed · credentials re-read, retrying once"
    return f"{e.failure.label} · retry {e.attempt} of {e.of} after {e.wait:.1f} s"


def tool_detail(e: ev.ToolRun) -> str:
    if e.limit_reached:
        return f"limit of {plural(e.max_rounds, 'tool round')} reached · answering with what it has"
    return f"{e.name}: {'ok' if e.ok else 'error'} ({plural(e.chars, 'char')})"


def continuation_detail(e: ev.Escalation | ev.Truncated) -> str:
    if isinstance(e, ev.Truncated):
        return (f"answer still cut at max_tokens {e.max_tokens:,} after "
                f"{plural(e.escalations, 'continuation')} · kept as it is")
    return (f"answer cut at max_tokens {e.previous:,} → continuing with {e.max_tokens:,} "
            f"({e.attempt} of {e.of})")


def turn_outcome(*, failed: ev.Failed | None, recovered: int, cancelled: bool,
                 finished: bool) -> str:
    """How a turn ended, in a few words (the card's header, the panel's last-turn line)."""
    if cancelled:
        return "✗ cancelled · history exactly as before"
    if failed is not None:
        return f"✗ failed · {failed.sentence}"
    if not finished:
        return "running…"
    if recovered:
        return f"✓ answered after {plural(recovered, 'recovery step')}"
    return "✓ answered"


def tokens_used(prompt: int, completion: int) -> str:
    return f"{prompt:,} prompt + {completion:,} answer tokens"


def elapsed(seconds: float) -> str:
    """``"2.4 s"``, ``"1 min 05 s"``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s"


def counts_line(recoveries: int, compactions: int) -> str:
    """The session's totals: ``"2 recoveries, 1 compaction"``."""
    return (f"{plural(recoveries, 'recovery', 'recoveries')}, "
            f"{plural(compactions, 'compaction')}")


def panel_title(session: str) -> str:
    return f"live panel · session {session}"


def panel_state(*, running: bool, as_of: float | None) -> str:
    """The panel's state beside its title: ``"turn running"``, ``"idle · as of 14:03:22"``."""
    if running:
        return "turn running"
    if as_of is None:
        return "idle"
    return f"idle · as of {time.strftime('%H:%M:%S', time.localtime(as_of))}"


def panel_counts(recoveries: int, compactions: int,
                 this_turn: tuple[int, int, bool] | None = None) -> str:
    """``"so far: 1 recovery, 2 compactions · this turn: 1 compaction running"``;
    ``this_turn``: (compactions applied, recovery steps, a compaction running)."""
    line = f"so far: {counts_line(recoveries, compactions)}"
    if this_turn is None:
        return line
    applied, steps, running = this_turn
    parts = []
    if applied:
        parts.append(plural(applied, "compaction"))
    if running:
        parts.append("a compaction running")
    if steps:
        parts.append(plural(steps, "recovery step"))
    return line + (f" · this turn: {', '.join(parts)}" if parts else " · this turn: none yet")


def panel_last_turn(outcome: str) -> str:
    return f"last turn: {outcome}"


def activity_words(kind: str, *, streamed: int = 0) -> str:
    """The activity line while a turn runs (the spinner's label)."""
    if kind == "send":
        return f"answer arriving: ≈{streamed:,} tokens" if streamed else "waiting for the answer"
    return {"summarize": "the model is summarizing older messages",
            "compaction": "compacting the history",
            "recovery": "recovering from a rejected request",
            "prepare": "preparing the request"}[kind]


def cancel_texts() -> dict[str, str]:
    """The Cancel button's words (shown by the front end)."""
    return {"cancel": "Cancel", "cancelling": "Cancelling…",
            "cancel_title": ("Interrupt the kernel: the summary stops and the history "
                             "stays exactly as it was"),
            "cancel_failed": ("Could not reach the Jupyter server from here: use the "
                              "notebook's interrupt button (■).")}
