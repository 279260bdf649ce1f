"""What the product says to a person: every status line, rendered from typed events.

:func:`describe` turns one :mod:`event <.events>` into its line(s) of plain text, and
:func:`decision_lines` a ladder :class:`~._decide.Decision`. The printer, the panel,
``Reply.actions`` and the tests all read these, so a wording changes in one place and
nothing ever parses a line back. Pure functions; no I/O.
"""

from __future__ import annotations

from functools import singledispatch

from ..failures import FailureKind
from ..settings import format_size
from . import events as ev
from .ladder.decide import Decision, Level

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
