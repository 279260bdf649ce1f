"""What the product says to a person: every status line, rendered from typed events.

:func:`describe` turns one :mod:`event <.events>` into its line(s) of plain text at the
``normal`` verbosity — one line per thing that actually happened, in plain words — and
:func:`describe_debug` into what an expert reads (the ladder's numbers, every compaction
phase, the routine checks). :func:`shown_at` says from which verbosity (``quiet``,
``normal``, ``debug``) an event is printed at all. :func:`decision_lines` renders a ladder
:class:`~._decide.Decision`. The printer, the panel, ``Reply.actions`` and the tests all
read these, so a wording changes in one place and nothing ever parses a line back. Pure
functions; no I/O.

Every line starts with one of :data:`MARKS`, all present in DejaVu Sans (the fallback
font of most Linux desktops and of Jupyter's default font stacks), so none renders as a
missing-glyph box.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import singledispatch
from typing import Any, Literal

from ..failures import Failure, FailureKind, Signature
from ..settings import format_size
from . import events as ev
from .catalogue import bare
from .ladder.decide import Decision, Level
from .thinking import MIN_BUDGET as MIN_THINKING_BUDGET

__all__ = [
    "MARKS",
    "cost_words",
    "PROMPT_CACHING_OFF",
    "prices_dropped",
    "prices_miss",
    "cache_said",
    "cache_note",
    "cache_split",
    "compaction_cost",
    "money",
    "VERBOSITIES",
    "Verbosity",
    "assumed_cap_line",
    "decision_lines",
    "describe",
    "describe_debug",
    "empty_stream",
    "emulator_quirk",
    "endpoint_text",
    "first_line",
    "forgotten_limits",
    "local_work_over",
    "max_tokens_above_limit_line",
    "no_answer_in_reply",
    "no_cap_warning",
    "not_json_reply",
    "plural",
    "reply_too_large",
    "shown_at",
    "status_text",
    "stream_ended_early",
    "truncated_line",
    "escalated_line",
    "chat_budget_term",
    "summary_not_size",
    "pinned_rules",
]

Verbosity = Literal["quiet", "normal", "debug"]
VERBOSITIES: tuple[Verbosity, ...] = ("quiet", "normal", "debug")

INFO, WARN, DONE, FAIL, RETRY, UP, CUT, TOOL, SHRINK, SUB, DETAIL = (
    "ℹ", "⚠", "✓", "✗", "↻", "↗", "✂", "⚙", "⇣", "↳", "·")
#: The marks lines start with (each in DejaVu Sans; tests/test_wording.py checks).
MARKS = (INFO, WARN, DONE, FAIL, RETRY, UP, CUT, TOOL, SHRINK, SUB, DETAIL)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 message``, ``2 messages`` (``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def forgotten_limits(cap: int | None, window: int | None, configured: int | None) -> str:
    """What ``%chat forget-limits`` did, in one line."""
    parts = ([f"the learned payload cap ({format_size(cap)}) for every session on this "
              "network path"] if cap is not None else [])
    parts += [f"the learned context window ({window:,} tokens)"] if window is not None else []
    said = "forgot " + " and ".join(parts) if parts else "nothing was learned to forget"
    kept = (f"; the configured cap {format_size(configured)} stays"
            if configured is not None else "")
    return f"{said}{kept} — a limit that still holds is learned again from its next rejection"


def first_line(text: str, limit: int = 160) -> str:
    """``text`` on one line (whitespace collapsed), cut at ``limit`` characters with ``…``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def no_cap_warning(body_bytes: int) -> str:
    """SPEC §2's one-shot warning when no cap is configured (said the notebook way)."""
    return (f"{INFO} history {format_size(body_bytes)} — if your network has a proxy/gateway, "
            "set its limit with %chat config CHATCLI_MAX_PAYLOAD=5MB (or the environment "
            "variable CHATCLI_MAX_PAYLOAD)")


def assumed_cap_line(cap: int) -> str:
    """SPEC §3's auto-cap line."""
    return (f"{INFO} Assuming a {format_size(cap)} payload limit — set the real one with "
            "%chat config CHATCLI_MAX_PAYLOAD=SIZE (e.g. 5MB, 512KB)")


def endpoint_text(url: str | None, proxy: str | None = None, *,
                  proxy_var: str | None = None, own_http_client: bool = False) -> str:
    """Where requests go: ``https://api.openai.com/v1 (no proxy)``, or ``… via proxy URL
    (HTTPS_PROXY)``; with ``own_http_client`` the user's HTTP client decides the proxy
    (the environment's may not apply). URLs must already have their credentials masked."""
    where = url or "the SDK's default endpoint"
    if own_http_client:
        return f"{where} (proxy and TLS as your own http_client sets them)"
    if not proxy:
        return f"{where} (no proxy)"
    return f"{where} via proxy {proxy}" + (f" ({proxy_var})" if proxy_var else "")


def stream_ended_early(api: str, detail: str) -> str:
    """A streamed reply that stopped before the API said why the model stopped."""
    return (f"The {api} reply stream ended early ({detail}); retry, and if it repeats "
            "check the server or any proxy in between.")


def not_json_reply(api: str, content_type: str | None, excerpt: str, url: str | None, *,
                   redirected: bool = False, streamed: bool = False,
                   page: bool = False) -> str:
    """An HTTP 200 whose body is not the JSON (or event stream) the API sends: an HTML
    ``page``, a plain text. ``content_type``: None when not known. ``excerpt``: its first
    words, masked and shortened; ``url``: where the answer came from (credentials masked),
    ``redirected``: after a redirect."""
    what = "an HTML page" if page else "a body that is not " + (
        "an event stream" if streamed else "JSON")
    ctype = "" if content_type is None else (
        f" (content type {content_type})" if content_type else " (no content type)")
    words = f': "{excerpt}"' if excerpt else ""
    where = (f" after a redirect to {url}" if redirected else f" from {url}") if url else ""
    return (f"The {api} endpoint answered HTTP 200{where} with {what}{ctype}{words} — "
            "something other than the API is answering for it, most often a proxy or a "
            "captive portal (a Wi-Fi or VPN login page); check the base URL and that this "
            "network lets the request through.")


def no_answer_in_reply(api: str, what: str) -> str:
    """An HTTP 200 that is the API's shape but holds no answer at all: ``what`` is the
    empty part (``an empty choices list``, ``an empty content list``)."""
    return (f"The {api} server answered HTTP 200 with {what}, so there is no answer to "
            "keep; retry, and if it repeats check the server or any gateway in between "
            "(one that drops the model's output).")
def reply_too_large(api: str, limit: int, *, status: int | None = None,
                    length: int | None = None, stream: bool = False) -> str:
    """A reply refused unread for its size (``max_reply``): an answer, an event stream, or
    an error body (``status``: the HTTP status of an error)."""
    what = (f"HTTP {status} error body" if status is not None and status >= 400
            else "event stream" if stream else "reply")
    size = f" ({format_size(length)})" if length is not None else ""
    return (f"The {api} server's {what}{size} is larger than max_reply ({format_size(limit)}), "
            f"so it was refused before being read further; raise max_reply with %chat "
            f"config (e.g. max_reply={_above(limit, length)}) if answers "
            "here are that large.")


def _above(limit: int, length: int | None) -> str:
    """A bound to suggest: the next power of two in MB over the reply, or four times the
    bound in force."""
    mb = 1024 * 1024
    want = max(limit * 4, length or 0)
    size = mb
    while size < want:
        size *= 2
    return f"{size // mb}MB"


def local_work_over(timeout: str, work: str) -> str:
    """A turn whose time ran out in its own work (``work``), not waiting for the server."""
    return (f"turn_timeout ({timeout}) ran out during {work}, not while waiting for the "
            "server; nothing of this turn was kept — ask for less (a smaller range, a "
            "shorter answer) or raise turn_timeout with %chat config.")


def empty_stream(api: str, *, cut: bool) -> str:
    """A streamed request the server accepted (HTTP 200) whose stream ended, or was cut
    off (``cut``), with nothing of an answer in it (``Failure.empty_stream``)."""
    how = "was cut off" if cut else "ended"
    return (f"The {api} server accepted the streamed request (HTTP 200), but its event stream "
            f"{how} before any answer or usage arrived; some servers answer an error this "
            "way once a stream has started (llama-cpp-python for a prompt over its window), "
            "and the same request unstreamed shows the server's own error.")


_EMULATOR_QUIRKS = {
    "string_content_only": "HTTP 500 for content sent as a list of parts",
    "empty_stream_on_error": "an empty HTTP 200 stream when it refuses a streamed request",
    "stream_usage": "no usage in streamed replies",
}


def emulator_quirk(name: str) -> str:
    """How a quirk the emulator plays (``emulator.quirks.QUIRKS``, turned on) reads in its
    status line."""
    return _EMULATOR_QUIRKS.get(name, name.replace("_", " "))


def max_tokens_above_limit_line(requested: int, limit: int, model: str) -> str:
    """``--max-tokens`` above what the model can write: said, and the limit used instead."""
    return (f"{INFO} --max-tokens {requested:,} is above {model}'s output limit of "
            f"{plural(limit, 'token')} — asking for {limit:,}")


def truncated_line(e: ev.Truncated, model_limit: int | None = None,
                   model: str | None = None) -> str:
    """The answer was still cut when the escalations ran out. When the cut was the model's
    own output limit, raising max_tokens cannot help: that limit is named instead."""
    if e.failed:
        return (f"{WARN} the answer above was cut at max_tokens={e.max_tokens:,} and could not "
                f"be continued ({e.failed}) — it is kept as it is, incomplete")
    tried = (f" after {plural(e.escalations, 'escalation')}" if e.escalations else "")
    if model_limit is not None and e.max_tokens >= model_limit:
        who = model or "the model"
        return (f"{WARN} answer cut at {plural(e.max_tokens, 'token')}{tried}: that is the most "
                f"{who} writes in one answer — ask for a shorter answer, or for the rest "
                "in the next cell")
    return (f"{WARN} answer still cut at max_tokens={e.max_tokens:,}{tried} — raise "
            "--max-tokens or CHATCLI_MAX_TOKEN_ESCALATIONS, or ask for a shorter answer")


def decision_lines(decision: Decision, *, assumption: bool = True,
                   summarizing: bool = False) -> list[str]:
    """The lines a ladder decision is told with (SPEC §3), in full (``debug``).

    ``assumption``: include the auto-cap line (the session tells it as its own event);
    ``summarizing``: an exact fit that first tries an LLM summary.
    """
    failure = decision.failure
    if decision.level is Level.GIVE_UP or failure is None:
        return [decision.reason] if decision.reason else []
    lines = [_failure_line(decision)]
    if decision.level is Level.LOWER_MAX_TOKENS:
        return lines
    if assumption and decision.assume_cap is not None:
        lines.append(assumed_cap_line(decision.assume_cap))
    if decision.level is Level.EXACT_FIT and decision.target_bytes is not None:
        verb = "summarizing" if summarizing else "cutting"
        lines.append(f"{INFO} exact fit: {_fit_reason(decision)} — {verb} history to "
                     f"{format_size(decision.target_bytes)}")
    return lines


def _failure_line(decision: Decision) -> str:
    """The ⚠ line of a ladder decision: what failed and what is done about it."""
    failure = decision.failure
    assert failure is not None
    label = failure.label
    if decision.level is Level.LOWER_MAX_TOKENS:
        new = decision.max_tokens or 0
        requested = decision.requested_max_tokens
        if failure.kind is FailureKind.OUTPUT_LIMIT:
            shown = f"{requested:,}" if requested is not None else "requested"
            return (f"{WARN} Recoverable failure ({label}) — retrying with max_tokens {new:,} "
                    f"instead of {shown}")
        return (f"{WARN} Recoverable failure ({label}) — {failure.prompt_tokens or 0:,} + "
                f"{requested or 0:,} > {failure.limit_tokens or 0:,} tokens: retrying with "
                f"max_tokens {new:,} (history untouched)")
    return f"{WARN} Recoverable failure ({label}) — compacting and retrying"


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


def status_text(status: Any, *, name: str | None = None, endpoint: str | None = None) -> str:
    """Where a session stands (``%chat status``, ``str(SessionStatus)``), one fact a line.

    An empty session says so, rather than showing the request's fixed overhead (tool
    definitions, framing) as if it were history.
    """
    window = f"{status.window:,}-token window" + (
        " (learned from the provider)" if status.window_learned else
        " (guessed — set CHATCLI_CONTEXT_WINDOW)" if status.window_guessed else "")
    if status.messages:
        share = f"{100 * status.est_tokens / status.window:.0f}%" if status.window else "?"
        history = (f"history: {plural(status.messages, 'message')}, "
                   f"{format_size(status.history_bytes)} ≈ {status.est_tokens:,} tokens "
                   f"({share} of the {window})")
    else:
        history = f"history: empty (the {window})"
    if status.cap is None:
        cap = "no payload cap configured"
    elif status.messages:
        cap = (f"{format_size(status.cap)} ({status.cap_source}); history is "
               f"{100 * status.history_bytes / status.cap:.0f}% of it")
    else:
        cap = f"{format_size(status.cap)} ({status.cap_source})"
    if status.cap_note:
        cap += f" — {status.cap_note}"
    cached, written = getattr(status, "cached_tokens", 0), getattr(status, "cache_write_tokens", 0)
    usd = getattr(status, "cost", None)
    long = getattr(status, "cache_write_1h_tokens", 0)
    cache = [f"cache: {cache_split(status.prompt_tokens, cached, written, long)}",
             f"cost: {cost_words(usd, price_name=bare(str(status.model)))}"] \
        if cache_said(cached, written, usd) else []
    lines = [f"session {name or status.name} · model {status.model}"]
    if endpoint:
        lines.append(f"endpoint: {endpoint}")
    lines += [
        history,
        f"payload cap: {cap}",
        f"transcript: {plural(status.transcript_messages, 'message')}",
        f"usage: {status.prompt_tokens:,} prompt + {status.completion_tokens:,} completion "
        "tokens",
        *cache,
        f"compactions: {status.compactions} · recoveries: {status.recoveries}",
    ]
    counted = getattr(status, "counted_tokens", None)
    if counted is not None:
        lines.append(f"pre-flight: {counted_exactly(counted)} (the latest request)")
    background = getattr(status, "background", "idle")
    if background != "idle":
        lines.append(f"background summary: {BACKGROUND_WORDS.get(background, background)}")
    server = getattr(status, "server_compaction", None)
    if server:
        lines.append(f"server compaction: {server}")
    note = getattr(status, "cache_note", None)
    if note:
        lines.append(f"prompt cache: {note}")
    return "\n".join(lines)


def cache_note(*, caching: bool, choice: str, retention: str, wire: str | None) -> str | None:
    """What ``%chat status`` says of the prompt cache where it is not the default: off,
    or a retention set or chosen (``cache_retention``, docs/caching.md); None: the
    default ("auto", nothing longer chosen yet)."""
    if not caching:
        extra = "; OpenAI still caches a repeated prefix by itself" if wire == "openai" else ""
        return f"off (prompt_caching=off: no breakpoint, key or retention is sent{extra})"
    if choice == "auto":
        if retention == "long":
            return "1-hour entries (cache_retention=auto: the session's pauses make them pay)"
        return None
    long = {"anthropic": "1-hour entries", "openai": "24-hour retention where the model takes it"}
    short = {"anthropic": "5-minute entries", "openai": "in-memory retention"}
    words = (long if choice == "long" else short).get(wire or "", choice)
    return f"{words} (cache_retention={choice})"


BACKGROUND_WORDS = {
    "preparing": "being prepared (no turn waits for it)",
    "ready": "ready (swapped in when the history needs room)",
    "failed": "not made (a turn that needs room compacts as usual)",
}
"""How ``%chat status`` and the panel name the background summary's state."""


# -- events ---------------------------------------------------------------------------------

_RANK: Mapping[str, int] = {"quiet": 0, "normal": 1, "debug": 2}


def printed_at(event: ev.Event, verbosity: str) -> bool:
    """True when ``event`` has a line at ``verbosity`` (see :func:`shown_at`)."""
    return _RANK[shown_at(event)] <= _RANK.get(verbosity, 1)


@singledispatch
def shown_at(event: ev.Event) -> Verbosity:
    """The lowest verbosity that prints ``event``: ``quiet`` for what changed the answer or
    lost context, ``normal`` for what happened, ``debug`` for bookkeeping."""
    return "normal"


# Events shown at one verbosity whatever their fields: bookkeeping, or what lost context.
_FIXED: dict[type[ev.Event], Verbosity] = {
    ev.TurnFinished: "debug", ev.NoticeInjected: "debug",
    ev.FitBeforeSend: "quiet", ev.Truncated: "quiet",
}
for _type, _verbosity in _FIXED.items():
    shown_at.register(_type, lambda e, v=_verbosity: v)


@shown_at.register
def _(e: ev.Preflight) -> Verbosity:
    return "debug" if e.action == "ok" else "normal"


@shown_at.register
def _(e: ev.CompactionPhase) -> Verbosity:
    if e.phase in ("start", "trim") or (e.phase == "applied" and e.outcome == "nothing"):
        return "debug"
    if e.phase == "applied":
        return "quiet"          # messages were replaced by a summary: context changed
    return "normal"


def background_detail(e: ev.BackgroundSummary) -> str:
    """The card's line for the summary prepared in the background (what was swapped in)."""
    if e.state == "swapped":
        n1 = e.after_messages if e.after_messages is not None else e.before_messages
        return (f"swapped in, no wait: {plural(e.covered_messages, 'message')} replaced "
                f"({e.before_messages} → {plural(n1, 'message')}, "
                f"{format_size(e.before_bytes)} → {format_size(e.after_bytes or 0)})")
    if e.state == "ready":
        return f"ready: {plural(e.covered_messages, 'message')} → 1, swapped in when needed"
    if e.state == "preparing":
        return f"being prepared ({format_size(e.before_bytes)} of history)"
    return f"{e.state}: {e.reason}"


@shown_at.register
def _(e: ev.BackgroundSummary) -> Verbosity:
    if e.state in ("preparing", "discarded"):
        return "debug"
    return "quiet" if e.state == "swapped" else "normal"


@shown_at.register
def _(e: ev.CapChanged) -> Verbosity:
    if e.change in ("withdrawn", "suspected"):
        return "normal"
    return "normal" if e.source in ("learned", "assumed") and e.cap is not None else "debug"


@shown_at.register
def _(e: ev.LadderStep) -> Verbosity:
    return "quiet" if _dropped(e) else "normal"


@shown_at.register
def _(e: ev.ToolRun) -> Verbosity:
    return "quiet" if e.limit_reached else "normal"


def _dropped(e: ev.LadderStep) -> bool:
    return e.after_messages < e.before_messages


def _no_summary(e: ev.LadderStep, sep: str) -> str:
    """Why a step that dropped messages did not summarize them, when it is the server's
    compaction (the same 413 without it is answered by a summary), after ``sep``."""
    return f"{sep}no summary: the server compacts" if e.server_compacts and _dropped(e) \
        else ""


def _announces(e: ev.LadderStep) -> bool:
    """A step announced before it is applied (its ⚠ line), not its outcome."""
    return not e.notes and e.summary_not_used is None and e.after_messages == e.before_messages


@singledispatch
def describe(event: ev.Event) -> str:
    """The line(s) a person reads for ``event`` at the normal verbosity ('' for nothing)."""
    return ""


@singledispatch
def describe_debug(event: ev.Event) -> str:
    """The line(s) an expert reads for ``event`` (``verbosity = "debug"``)."""
    return describe(event)


@describe.register
def _(e: ev.Preflight) -> str:
    lines = []
    if "cap" in e.reasons and e.cap:
        lines.append(f"{INFO} pre-flight: history {format_size(e.body_bytes)} ≈ "
                     f"{round(100 * e.body_bytes / e.cap)}% of {e.cap_source} cap "
                     f"({format_size(e.cap)}) — {_acting(e, hard=e.body_bytes > e.cap)}")
    if "window" in e.reasons:
        what = _input_tokens(e) + (f" + max_tokens {e.max_tokens:,}" if e.max_tokens else "")
        lines.append(f"{INFO} pre-flight: {what} > context window {e.window:,} tokens — "
                     f"{_acting(e, hard=True)}")
    if "budget" in e.reasons and e.budget_bytes is not None:
        lines.append(f"{INFO} pre-flight: history {format_size(e.body_bytes)} is over the chat "
                     f"budget, {format_size(e.budget_bytes)} ({_budget_term(e)}) — "
                     f"{_acting(e)}")
    if "no_cap" in e.reasons:
        lines.append(no_cap_warning(e.body_bytes))
    return "\n".join(lines)


def _acting(e: ev.Preflight, *, hard: bool = False) -> str:
    """What pre-flight does about what it found: compacting, or — while the provider
    compacts on its server — leaving that to the server (a hard limit is fitted)."""
    if not e.server_compacts:
        return "compacting"
    return "fitting (no summary: the server compacts)" if hard else \
        "the provider compacts on its server"


def chat_budget_term(*, share: float | None, of: str | None, window: int, cap: int | None,
                     cap_source: str | None, setting: str | None) -> str:
    """What a chat budget is a share of, and the setting that sets the share (None: the
    share pre-flight left for the answer) — as the pre-flight line and a plan say it."""
    pct = f"{share:.0%}" if share is not None else "a share"
    if of == "cap" and cap:
        term = f"{pct} of the {cap_source} cap {format_size(cap)}"
    else:
        term = f"{pct} of the {window:,}-token window"
    return f"{term}: {setting}" if setting else f"{term}, room left for the answer"


def _budget_term(e: ev.Preflight) -> str:
    # A chat's own budget: the "budget" reason is checked at chat_budget_ratio.
    return chat_budget_term(share=e.budget_share, of=e.budget_of, window=e.window, cap=e.cap,
                            cap_source=e.cap_source,
                            setting="cap_budget_fraction" if e.budget_of == "cap"
                            else "chat_budget_ratio")


@describe_debug.register
def _(e: ev.Preflight) -> str:
    if e.action != "ok":
        return describe(e)
    cap = (f"{format_size(e.cap)} {e.cap_source} cap" if e.cap else "no cap")
    reserve = f" + max_tokens {e.max_tokens:,}" if e.max_tokens else ""
    tokens = (f", {counted_exactly(e.counted_tokens)}" if e.counted_tokens is not None
              else f" ≈ {e.est_tokens:,} tokens")
    return (f"{DETAIL} pre-flight: request {format_size(e.body_bytes)}{tokens}"
            f"{reserve}; {e.window:,}-token window, {cap} — ok")


def counted_exactly(tokens: int) -> str:
    """Exact pre-flight's words for a request the provider counted (``core/exact_count``)."""
    return f"input counted exactly: {tokens:,} tokens"


def _input_tokens(e: ev.Preflight) -> str:
    """The request's input tokens as pre-flight decided on them: counted or estimated."""
    if e.counted_tokens is not None:
        return f"{e.counted_tokens:,} tokens (counted exactly)"
    return f"≈{e.est_tokens:,} tokens"


@describe.register
def _(e: ev.MaxTokensLowered) -> str:
    if e.reason == "output_limit":
        return (f"{INFO} pre-flight: max_tokens {e.requested:,} is above the model's output "
                f"limit ({e.sent:,}, learned from an earlier rejection) — sending max_tokens "
                f"{e.sent:,}")
    return (f"{INFO} pre-flight: ≈{e.est_tokens:,} prompt tokens + max_tokens {e.requested:,} > "
            f"context window {e.window:,} — sending max_tokens {e.sent:,}")


@describe.register
def _(e: ev.ThinkingFitted) -> str:
    if e.sent is None:
        return (f"{INFO} pre-flight: max_tokens {e.max_tokens:,} leaves too little for extended "
                f"thinking (budget {e.requested:,}; the API's least is {MIN_THINKING_BUDGET:,}) "
                "— sending this request without thinking")
    return (f"{INFO} pre-flight: max_tokens {e.max_tokens:,} is not above the thinking budget "
            f"{e.requested:,} as asked — sending thinking budget {e.sent:,} (its share of the "
            "answer)")


@describe.register
def _(e: ev.FitBeforeSend) -> str:
    if e.over == "cap" and e.cap is not None:
        what = f"over the {format_size(e.cap)} {e.cap_source} cap"
    else:
        what = (f"≈{e.est_tokens:,} tokens"
                + (f" + max_tokens {e.reserved_tokens:,}" if e.reserved_tokens else "")
                + f" over the {e.window:,}-token window")
    size = (f"still {format_size(e.body_bytes)} after compaction" if e.after_compaction
            else format_size(e.body_bytes))
    return f"{CUT} pre-flight: {size}, {what} — fitting to {format_size(e.goal_bytes)} before sending"


@describe_debug.register
def _(e: ev.FitBeforeSend) -> str:
    return describe(e) + (f"\n  {SUB} {'; '.join(e.notes)}" if e.notes else "")


@describe.register
def _(e: ev.MicrocompactApplied) -> str:
    if e.on_server:
        return server_clearing_line(e)
    return (f"{CUT} microcompact: {e.truncated} truncated, {e.summarized} summarized, "
            f"{format_size(e.bytes_freed)} freed")


@describe.register
def _(e: ev.BudgetApplied) -> str:
    saved = ", ".join(e.persisted) or "already saved"
    return (f"{CUT} {plural(e.replaced, 'large tool result')} replaced by "
            f"{'a preview' if e.replaced == 1 else 'previews'}; full content saved ({saved})")


@describe.register
def _(e: ev.CompactionPhase) -> str:
    n0, b0 = e.before_messages, format_size(e.before_bytes)
    n1 = e.after_messages if e.after_messages is not None else n0
    b1 = format_size(e.after_bytes if e.after_bytes is not None else e.before_bytes)
    target = format_size(e.target_bytes or 0)
    if e.phase in ("start", "trim"):
        return ""
    if e.phase == "summarize":
        return (f"{SHRINK} Summarizing older messages with the model ({plural(n0, 'message')}, "
                f"{b0} → target {target})…")
    if e.phase == "rejected":
        return f"{FAIL} Compaction rejected: {e.reason} — history kept as it was"
    if e.phase == "cancelled":
        return f"{FAIL} Compaction cancelled — history left exactly as it was"
    if e.outcome == "nothing":
        return ""
    if e.outcome == "trim":
        return (f"{DONE} Trimmed reasoning and duplicate tool results, no summary needed "
                f"({n0} → {plural(n1, 'message')}, {b0} → {b1})")
    unread = f"; {dropped_unread(e)}" if e.dropped_unread else ""
    return (f"{DONE} Summary applied ({n0} → {plural(n1, 'message')}, {b0} → {b1}{unread})"
            f"{pinned_rules(e)}")


@describe_debug.register
def _(e: ev.CompactionPhase) -> str:
    n0, b0 = e.before_messages, format_size(e.before_bytes)
    if e.phase == "start":
        return (f"{SHRINK} Compacting history ({plural(n0, 'message')}, {b0} → target "
                f"{format_size(e.target_bytes or 0)})")
    if e.phase == "trim":
        return f"{DETAIL} trim: removing reasoning and duplicate tool results (no LLM)"
    if e.phase == "applied" and e.outcome == "nothing":
        return (f"{DONE} History already within target ({plural(n0, 'message')}, {b0}) — "
                "nothing to compact")
    return describe(e)


@describe.register
def _(e: ev.BackgroundSummary) -> str:
    if e.state == "preparing":
        return (f"{SHRINK} Preparing a summary in the background ({plural(e.before_messages, 'message')}, "
                f"{format_size(e.before_bytes)}): the next turns do not wait for it")
    if e.state == "ready":
        return (f"{DONE} Summary ready (prepared in the background: "
                f"{plural(e.covered_messages, 'message')} → 1); it is swapped in when the "
                "history needs room")
    if e.state == "failed":
        return (f"{WARN} The background summary was not made ({e.reason}); a turn that "
                "needs room compacts as usual")
    if e.state == "swapped":
        n1 = e.after_messages if e.after_messages is not None else e.before_messages
        return (f"{DONE} Summary prepared in the background swapped in: "
                f"{plural(e.covered_messages, 'message')} replaced, no wait "
                f"({e.before_messages} → {plural(n1, 'message')}, "
                f"{format_size(e.before_bytes)} → {format_size(e.after_bytes or 0)})")
    return f"{DETAIL} background summary discarded: {e.reason}"


@describe.register
def _(e: ev.LadderStep) -> str:
    if _announces(e):
        return _failure_line(e.decision) if e.decision.failure is not None else \
            f"{WARN} recovery: {e.level.value}"
    done: list[str] = []
    if e.summary_not_used is not None:
        done.append(f"summary not used ({e.summary_not_used})")
    if _dropped(e):
        done.append(f"oldest messages dropped to fit ({e.before_messages} → "
                    f"{plural(e.after_messages, 'message')}{_no_summary(e, '; ')})")
    elif e.level is Level.AGGRESSIVE:
        done.append("tool results shortened (budget halved)")
    else:
        done.append("history fitted without dropping messages")
    return f"  {SUB} " + "; ".join(done)


@describe_debug.register
def _(e: ev.LadderStep) -> str:
    if _announces(e):
        lines = decision_lines(e.decision, assumption=False, summarizing=e.summarizing)
        return "\n".join(lines) or f"{WARN} recovery: {e.level.value}"
    text = describe(e)
    if e.notes:
        text += f"\n  {SUB} {e.level.value}: " + "; ".join(e.notes)
    return text


@describe_debug.register
def _(e: ev.NoticeInjected) -> str:
    if e.notice == "payload":
        return f"{INFO} SYSTEM NOTICE (payload limit hit) given to the model"
    return f"{INFO} the model was told that earlier context was compacted"


@describe.register
def _(e: ev.CapChanged) -> str:
    if e.source == "assumed" and e.cap is not None and e.change in ("learned", "assumed"):
        return assumed_cap_line(e.cap)
    if e.change == "suspected" and e.cap is not None:
        return (f"{INFO} A {format_size(e.rejected_bytes or 0)} request was "
                f"{_REFUSED_VERB.get(e.signature or '', 'refused')}: fitting it under about "
                f"{format_size(e.cap)} tells a size limit from a content rule")
    if e.change == "withdrawn":
        why = {"bigger_passed": "a bigger request went through since",
               "blocked_again": "the same request was blocked again once smaller, so it is "
                                "its content, not its size"}.get(
            e.withdrawn_because or "", "a request no bigger than one that passed was refused "
                                       "the same way, so it is not about size")
        return (f"{INFO} Withdrew the payload limit learned from a "
                f"{format_size(e.rejected_bytes or 0)} refusal: {why}"
                + (f" (now {format_size(e.cap)}, {e.source})" if e.cap is not None else ""))
    if e.source == "learned" and e.cap is not None:
        verb = _REFUSED_VERB.get(e.signature or "", "dropped" if e.dropped else "rejected")
        what = "Lowered the payload limit to" if e.change == "lowered" \
            else "Learned a payload limit of"
        return (f"{INFO} {what} about {format_size(e.cap)} (a "
                f"{format_size(e.rejected_bytes or 0)} request was {verb})")
    return ""


_REFUSED_VERB = {"size": "rejected", "block": "blocked", "drop": "dropped",
                 "bare_5xx": "answered with an empty server error",
                 "bad_body": "cut before it reached the server"}


@describe_debug.register
def _(e: ev.CapChanged) -> str:
    if shown_at(e) == "normal":
        return describe(e)
    return (f"{INFO} payload cap {format_size(e.cap)} ({e.source})" if e.cap is not None
            else f"{INFO} no payload cap")


@describe.register
def _(e: ev.Escalation) -> str:
    return (f"{UP} answer cut at max_tokens={e.previous:,} — continuing with "
            f"max_tokens={e.max_tokens:,} (escalation {e.attempt}/{e.of})")


def escalated_line(e: ev.Escalation) -> str:
    """An escalation told after the answer it continued was printed (a terminal)."""
    return (f"{UP} answer cut at max_tokens={e.previous:,} — continued with "
            f"max_tokens={e.max_tokens:,} (escalation {e.attempt}/{e.of})")


@describe.register
def _(e: ev.Truncated) -> str:
    return truncated_line(e)


@describe.register
def _(e: ev.WindowLearned) -> str:
    if e.bound:
        return (f"{INFO} A request of ≈{e.window:,} tokens was over the provider's context "
                f"window, which its error did not name (this session assumed "
                f"{e.previous:,}) — keeping under {e.window:,} tokens from now on; "
                "%chat config CHATCLI_CONTEXT_WINDOW=N sets the real one")
    return (f"{INFO} Learned a context window of {e.window:,} tokens from the provider (this "
            f"session assumed {e.previous:,}) — using it from now on; "
            f"%chat config CHATCLI_CONTEXT_WINDOW={e.window} starts with it")


@describe.register
def _(e: ev.Retrying) -> str:
    if e.failure_kind is FailureKind.AUTH:
        return f"{RETRY} authentication failed — re-reading the credentials and retrying once"
    if e.resend == "unstreamed":
        return (f"{RETRY} the server's reply stream was empty — asking again without "
                "streaming, to get its answer or its own error")
    if e.resend == "suspect":
        return (f"{RETRY} {_refusal(e.failure)} on a {format_size(e.failure.request_bytes or 0)} "
                "request, larger than any this network path has carried — sending it once "
                "more: a second refusal means a size limit")
    if e.resend == "carried" or e.failure_kind is FailureKind.LIKELY_PAYLOAD:
        return (f"{RETRY} {_refusal(e.failure)}, on a body no bigger than this network path "
                "has carried — retrying once as it is")
    return f"{RETRY} {e.failure.label} — retrying in {e.wait:.1f}s ({e.attempt}/{e.of})"


def _refusal(failure: Failure) -> str:
    """How a refusal that may be a blip looked: 'connection dropped', 'empty HTTP 502'."""
    if failure.signature is Signature.BARE_5XX:
        return f"empty HTTP {failure.status} from a proxy"
    if failure.signature is Signature.BAD_BODY:
        return "the server could not read the request body"
    return "connection dropped"


@describe_debug.register
def _(e: ev.Retrying) -> str:
    return describe(e) + f"\n  {SUB} {first_line(e.failure.reason)}"


@describe.register
def _(e: ev.ToolRun) -> str:
    if e.limit_reached:
        return (f"{TOOL} tool round limit ({e.max_rounds}) reached — asking the model to answer "
                "with what it has")
    if e.ok:
        return f"{TOOL} {e.name}: ok ({plural(e.chars, 'char')})"
    detail = first_line(e.detail, 120)
    return f"{TOOL} {e.name} failed" + (f": {detail}" if detail else f" ({plural(e.chars, 'char')})")


@describe.register
def _(e: ev.StreamUsageMissing) -> str:
    return (f"{INFO} this server sends no token usage with streamed answers — token counts "
            "are estimated, calibrated only from answers it sends unstreamed")


@describe.register
def _(e: ev.Recovered) -> str:
    return f"{DONE} Recovered after {plural(e.attempts, 'recovery step')}"


@describe.register
def _(e: ev.Failed) -> str:
    return f"{FAIL} {e.sentence}"


@describe_debug.register
def _(e: ev.TurnFinished) -> str:
    share = f"{100 * e.est_tokens / e.window:.0f}%" if e.window else "?"
    return (f"{DETAIL} history {format_size(e.history_bytes)} ≈ {e.est_tokens:,} tokens "
            f"({share} of the {e.window:,}-token window)")


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
    "background": "background summary",
    "server_compaction": "server compaction",
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
    """The turn's first request, as pre-flight measured it (its tokens counted exactly
    when the provider counted them: exact pre-flight)."""
    tokens = tokens_against_window(e.est_tokens, e.window)
    if e.counted_tokens is not None and e.window:
        tokens = f"{e.counted_tokens:,} of {e.window:,} tokens (counted exactly)"
    return f"request {size_against_cap(e.body_bytes, e.cap, e.cap_source)} · {tokens}"


def sizes_after(e: ev.TurnFinished, cap_source: str | None) -> str:
    """The history the turn left, against the cap and window in force at its end."""
    return (f"history {size_against_cap(e.history_bytes, e.cap, cap_source)} · "
            f"{tokens_against_window(e.est_tokens, e.window)}")


def preflight_verdict(e: ev.Preflight) -> str:
    """What pre-flight made of the request (its sizes have their own lines)."""
    parts = []
    acting: dict[str, tuple[str, str]] = {}
    if "cap" in e.reasons:
        over = e.cap is not None and e.body_bytes > e.cap
        acting["cap"] = (f"{'over' if over else 'near'} the cap", _acting(e, hard=over))
    if "window" in e.reasons:
        acting["window"] = ("prompt + answer over the window", _acting(e, hard=True))
    if len({did for _, did in acting.values()}) == 1:      # said once for both
        found = " and ".join(what for what, _ in acting.values())
        parts.append(f"{found} → {next(iter(acting.values()))[1]}")
    else:
        parts.extend(f"{what} → {did}" for what, did in acting.values())
    if "budget" in e.reasons and e.budget_bytes is not None:
        parts.append(f"over the chat budget, {format_size(e.budget_bytes)} "
                     f"({_budget_term(e)}) → {_acting(e)}")
    if "no_cap" in e.reasons:
        parts.append("large, with no cap set: if a proxy limits requests, "
                     "%chat config CHATCLI_MAX_PAYLOAD=SIZE")
    if e.counted_tokens is not None:
        parts.append(counted_exactly(e.counted_tokens))
        if e.action == "ok":
            parts.append("within the window")
    return " · ".join(parts) or ("within the window and the cap" if e.cap
                                 else "within the window")


def answer_size_detail(e: ev.MaxTokensLowered | ev.ThinkingFitted) -> str:
    if isinstance(e, ev.ThinkingFitted):
        sent = "off" if e.sent is None else f"{e.sent:,}"
        return f"thinking budget {e.requested:,} → {sent} (max_tokens {e.max_tokens:,})"
    why = ("the output limit learned earlier" if e.reason == "output_limit"
           else "room left in the window")
    return f"max_tokens {e.requested:,} → {e.sent:,} ({why})"


def microcompact_detail(e: ev.MicrocompactApplied) -> str:
    if e.on_server:
        return server_clearing_detail(e)
    return (f"old tool results: {e.truncated} shortened, {e.summarized} cleared to one line · "
            f"{format_size(e.bytes_freed)} freed")


def budget_detail(e: ev.BudgetApplied) -> str:
    return f"{plural(e.replaced, 'tool result')} → previews (full text saved)"


def compaction_detail(phases: Sequence[ev.CompactionPhase], *, cost: bool = True,
                      tokens: bool = True) -> str:
    """What one compaction did (or is doing), from its phases so far; ``cost``: with what
    its summary read and cost (:func:`summary_lines`); ``tokens``: with the summary's
    tokens in all (the card leaves them to its note, which splits them in and out)."""
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
        parts = f", in {last.chunks} requests" if last.chunks > 1 else ""
        return f"the model is summarizing older messages ({b0} → target {target}{parts})…"
    if last.phase == "rejected":
        return f"not applied ({last.reason}) · history kept as it was"
    if last.phase == "cancelled":
        # What it was compacting: in a turn, the history and the new message.
        return (f"cancelled · history exactly as before (it was compacting "
                f"{plural(n0, 'message')}, {b0})")
    if last.outcome == "nothing":
        return f"already within the {target} target · nothing changed"
    how = "trimmed, no LLM" if last.outcome == "trim" else "summary by the model"
    kept = (f" · {plural(last.kept_user_messages, 'message')} of yours kept verbatim"
            if last.kept_user_messages else "")
    facts = facts_detail(last)
    done = (f"{how}: {n0} → {plural(n1, 'message')}, {b0} → {b1}{pinned_rules(last)}{kept}"
            + (f" · {facts}" if facts else ""))
    if last.outcome == "summary" and cost:
        done += "".join(f" · {line}" for line in summary_lines(last, tokens=tokens))
    return done


def summary_cost(e: ev.CompactionPhase, *, tokens: bool = True) -> str:
    """``summary: 14 messages read in 3 chunks, 3 requests, 9,120 tokens`` ('' when the
    compaction asked for no summary; ``tokens`` False: without the tokens)."""
    if not e.summary_requests:
        return ""
    chunks = f" in {plural(e.chunks, 'chunk')}" if e.chunks > 1 else ""
    known = [t for t in (e.summary_input_tokens, e.summary_output_tokens) if t is not None]
    tokens_said = f", {sum(known):,} tokens" if known and tokens else ""
    return (f"summary: {plural(e.read_messages, 'message')} read{chunks}, "
            f"{plural(e.summary_requests, 'request')}{tokens_said}")


def dropped_unread(e: ev.CompactionPhase) -> str:
    """``2 messages dropped unread (summary-request bound 8)`` ('' when none were)."""
    if not e.dropped_unread:
        return ""
    bound = f" (summary-request bound {e.summary_request_bound})" \
        if e.summary_request_bound is not None else ""
    return f"{plural(e.dropped_unread, 'message')} dropped unread{bound}"


def summary_lines(e: ev.CompactionPhase, *, tokens: bool = True) -> list[str]:
    """What a summary read and cost, and what it dropped unread: the card's and the
    panel's lines (none when no summary was asked for)."""
    return [line for line in (summary_cost(e, tokens=tokens), dropped_unread(e)) if line]


def pinned_rules(e: ev.CompactionPhase) -> str:
    """`` · 3 rules pinned`` (and the rules past the pin's bound, summarized), or ""."""
    out = f" · {plural(e.pinned_rules, 'rule')} pinned" if e.pinned_rules else ""
    if e.unpinned_rules:
        out += (f" · {plural(e.unpinned_rules, 'older rule')} summarized (the pinned rules "
                "are at pinned_rules_max_chars)")
    return out


def facts_detail(e: ev.CompactionPhase) -> str:
    """An applied summary's fact check: ``the summary kept 23 of 27 facts; 4 added back
    verbatim`` ("" when the replaced messages had no facts, or for a trim)."""
    if not e.facts_total or e.facts_kept is None:
        return ""
    text = f"the summary kept {e.facts_kept} of {plural(e.facts_total, 'fact')}"
    if e.facts_added:
        text += f"; {e.facts_added} added back verbatim"
    return text


def fit_detail(e: ev.FitBeforeSend) -> str:
    over = (cap_words(e.cap, e.cap_source) if e.over == "cap"
            else f"{e.window:,}-token window")
    # "aiming at": the goal is where the cut aims; when the latest message alone is bigger,
    # the body stays above it (a note says by how much), so the goal is not the result.
    return (f"{format_size(e.body_bytes)} over the {over} → cut, aiming at "
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
    said = "; ".join(e.notes) + _no_summary(e, "; " if e.notes else "")
    return f"{why} → {moved}" + (f" ({said})" if said else "")


def cap_detail(e: ev.CapChanged) -> str:
    if e.source == "learned" and e.cap is not None:
        verb = "dropped" if e.dropped else "rejected"
        return (f"learned ≈{format_size(e.cap)}: a {format_size(e.rejected_bytes or 0)} "
                f"request was {verb} (kept for this network path)")
    if e.source == "assumed" and e.cap is not None:
        return (f"assuming {format_size(e.cap)} until told · %chat config CHATCLI_MAX_PAYLOAD=SIZE "
                "sets the real one")
    return cap_words(e.cap, e.source)


def window_detail(e: ev.WindowLearned) -> str:
    if e.bound:
        return (f"{e.previous:,} → under {e.window:,} tokens (a rejected request's size; "
                "the provider named no window)")
    return f"{e.previous:,} → {e.window:,} tokens (as the provider reported)"


def notice_detail(e: ev.NoticeInjected) -> str:
    if e.notice == "payload":
        return "told the model a size limit was hit (read files in ranges)"
    return "told the model that earlier context was compacted"


def retry_detail(e: ev.Retrying) -> str:
    if e.failure_kind is FailureKind.AUTH:
        return "authentication failed · credentials re-read, retrying once"
    if e.resend == "unstreamed":
        return "empty reply stream · asked again unstreamed"
    if e.resend == "suspect":
        return f"{_refusal(e.failure)} above what this path carried · sent once more"
    if e.resend == "carried" or e.failure_kind is FailureKind.LIKELY_PAYLOAD:
        return f"{_refusal(e.failure)} on a size this path has carried · retrying once as it is"
    return f"{e.failure.label} · retry {e.attempt} of {e.of} after {e.wait:.1f} s"


def tool_detail(e: ev.ToolRun) -> str:
    if e.limit_reached:
        return f"limit of {plural(e.max_rounds, 'tool round')} reached · answering with what it has"
    return f"{e.name}: {'ok' if e.ok else 'error'} ({plural(e.chars, 'char')})"


def continuation_detail(e: ev.Escalation | ev.Truncated) -> str:
    if isinstance(e, ev.Truncated) and e.failed:
        return (f"answer cut at max_tokens {e.max_tokens:,}, not continued: {e.failed} · "
                "kept as it is, incomplete")
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
    """The card's tokens, in the words of ``%chat usage`` and ``%chat status`` (it said
    "answer tokens" where they say "completion tokens")."""
    return f"{prompt:,} prompt + {completion:,} completion tokens"


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


def messages_held(working: int, transcript: int) -> str:
    """A saved session's size as the model will see it: ``"7 messages in the working
    history (16 in the transcript)"``, or ``"7 messages"`` when the two are the same."""
    if working == transcript:
        return plural(working, "message")
    return f"{plural(working, 'message')} in the working history ({transcript} in the transcript)"


def history_as_before(messages: int | None) -> str:
    """A failed or cancelled turn's card: the working history it left, counted as the
    interrupt's own line counts it (``"… (6 messages)"``)."""
    count = f" ({plural(messages, 'message')})" if messages is not None else ""
    return f"history exactly as before this turn{count}"


def panel_title(session: str) -> str:
    return f"live panel · session {session}"


def panel_state(*, running: bool, as_of: float | None) -> str:
    """The panel's state beside its title: ``"turn running"``, ``"idle · as of 14:03:22"``."""
    if running:
        return "turn running"
    if as_of is None:
        return "idle"
    return f"idle · as of {time.strftime('%H:%M:%S', time.localtime(as_of))}"


EXPLORE_SAVE_HINT = ("A saved notebook shows this explorer as a snapshot of its last state once "
                     "a later cell has run or it is closed (.close()); saved while it is live, "
                     "it reads as a widget error without its kernel.")
"""Under the live explorer: what a saved notebook shows of it."""


def explore_snapshot_note(as_of: float, *, closed: bool) -> str:
    """The line over the explorer's snapshot (what a saved notebook shows): that it is one,
    as of when, and how to move the controls again."""
    at = time.strftime('%H:%M:%S', time.localtime(as_of))
    if closed:
        return f"snapshot of the explorer as of {at} · it was closed"
    return (f"snapshot of the explorer as of {at} · a later cell ran; display the explorer "
            "again (or %chat explore) to move its controls")


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


def panel_last_turn(outcome: str, *, cell: int | None = None,
                    ended_at: float | None = None) -> str:
    """``"last turn: ✓ answered · cell [5], ended 14:03:20"``: how it ended, and which
    turn it was (the cell that ran it, when one did, and when it ended)."""
    which = ([f"cell [{cell}]"] if cell is not None else []) + (
        [f"ended {time.strftime('%H:%M:%S', time.localtime(ended_at))}"]
        if ended_at is not None else [])
    return f"last turn: {outcome}" + (f" · {', '.join(which)}" if which else "")


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


_NEAR_TARGET = 1.05
"""A compaction within 5% of its target reached it (a summary's size is not exact)."""


def compact_result(*, applied: bool, before_messages: int, after_messages: int,
                   before_bytes: int, after_bytes: int, summarized: int,
                   target_bytes: int | None, kept: int, pinned: int,
                   reason: str | None) -> str:
    """``%chat compact``'s one line: what it did, and when it changed nothing or missed its
    target (by more than 5%), why and what the user can do. ``kept``: the latest request and the messages
    after it (never summarized); ``pinned``: system messages and notices before it."""
    sizes = f"{format_size(before_bytes)} → {format_size(after_bytes)}"
    held = plural(kept, "message") + (f" and {pinned} pinned" if pinned else "")
    why_kept = (f"the latest request and what came after it ({held}) are kept whole, "
                "beside the summary")
    later = "the next %%chat makes them older and summarizable; %chat reset starts afresh"
    if not applied:
        if reason == "nothing older than the latest request to summarize":
            return (f"nothing to compact: {plural(before_messages, 'message')}, all kept "
                    f"(the latest request, what came after it, and pinned ones); {later}")
        goal = f" (target {format_size(target_bytes)})" if target_bytes else ""
        return (f"history unchanged: {reason or 'nothing to compact'} — still "
                f"{plural(before_messages, 'message')}, {format_size(before_bytes)}{goal}; "
                "%chat compact INSTRUCTIONS asks for another summary, %chat reset starts "
                "afresh (the transcript keeps every message)")
    counts = (f"{plural(summarized, 'message')} summarized into one, "
              f"{before_messages} → {plural(after_messages, 'message')}"
              if before_messages == after_messages
              else f"{before_messages} → {plural(after_messages, 'message')}")
    undo = "(%chat undo-compact restores)"
    if target_bytes is not None and after_bytes > target_bytes * _NEAR_TARGET:
        return (f"✓ compacted: {counts}, {sizes}, still over the {format_size(target_bytes)} "
                f"target: {why_kept}; {later} {undo}")
    return f"✓ compacted: {counts}, {sizes} {undo}"


def cell_summary_ended(phase: str, outcome: str | None, seconds: float) -> str:
    """The plain line that replaces a cell's Cancel button once its summary has ended:
    ``phase`` is the compaction's last phase (``applied``, ``rejected``, ``cancelled``), or
    ``ended`` when the turn ended some other way."""
    took = f"{max(seconds, 0.0):.1f} s"
    if phase == "applied" and outcome == "summary":
        return f"summary of older messages: done in {took}"
    if phase == "cancelled":
        return f"summary of older messages: cancelled after {took} · history exactly as before"
    if phase in ("applied", "rejected"):
        return f"summary of older messages: not used ({took})"
    return f"summary of older messages: stopped after {took}"


def summary_not_size(size: str, label: str) -> str:
    """Why a summary request refused for its content is not used (the turn fits without
    it): what refused it, and that it says nothing about the proxy's size limit."""
    return (f"the {size} summary request was refused ({label}) though bigger requests passed "
            "on this network path, so it is not about size: the history is fitted without a "
            "summary, and no payload limit was learned from it")


# -- prompt caching and cost (core/prices.py, docs/caching.md) --------------------------------

def money(usd: float | None) -> str:
    """``≈ $0.0123`` (four decimals below a dollar), or ``price unknown`` (None)."""
    if usd is None:
        return "price unknown"
    return f"≈ ${usd:,.4f}" if usd < 1 else f"≈ ${usd:,.2f}"


def cache_split(prompt: int, cached: int, written: int, written_1h: int = 0) -> str:
    """The input as the provider reported it: ``8,000 cached reads + 1,200 cache writes +
    300 uncached input tokens``; writes with a one-hour TTL are said: ``1,200 cache writes
    (all for 1 hour)``, ``(200 for 1 hour)``."""
    uncached = max(0, prompt - cached - written)
    long = min(written, written_1h)
    hour = "" if not long else " (all for 1 hour)" if long == written \
        else f" ({long:,} for 1 hour)"
    return (f"{cached:,} cached reads + {written:,} cache writes{hour} + {uncached:,} "
            "uncached input tokens")


def cache_said(cached: int, written: int, usd: float | None) -> bool:
    """Whether the cache and cost lines have something to say: a cache was used, or the tokens have a
    price (known and not nil, or unknown — which is said). The built-in emulator bills
    nothing and, until it reports a cache, has no line."""
    return bool(cached or written) or usd is None or usd > 0


def cost_words(usd: float | None, *, price_name: str | None = None) -> str:
    """The estimated cost of everything counted (input and answer), on a line of its own
    (``cost`` on the card, in ``%chat usage`` and ``%chat status``: beside the input's
    split it ran past 80 columns and read as the cost of the cache). ``price_name``: the
    name a price for the model takes; with it, an unknown price says how to set one (the
    card stays short)."""
    if usd is None:
        return f"price unknown ({unknown_price_fix(price_name)})" if price_name \
            else "price unknown"
    return f"{money(usd)} (estimated; input and answer)"


def prices_dropped(models: Sequence[str]) -> str:
    """``%chat config prices=…`` replaced a setting that priced other models."""
    return (f"ℹ prices replaces the earlier setting: {', '.join(models)} "
            f"{'is' if len(models) == 1 else 'are'} no longer in it (list every model in one "
            "prices=, comma separated)")


def prices_miss(session: str, model: str, price_name: str, *, known: bool) -> str:
    """``%chat config prices=…`` names no entry for the current session's model."""
    keeps = "keeps its list price" if known else "has no price"
    return (f"ℹ prices has no entry for session {session}'s model, {model}, which {keeps} "
            f"(its entry would be {price_name}=IN/CACHED/WRITE/OUT)")


PROMPT_CACHING_OFF = ("ℹ prompt_caching off: no cache breakpoints are sent (the Anthropic "
                      "wire caches nothing then); OpenAI still caches a repeated prefix on "
                      "its own, which no request setting turns off")
"""Said when ``prompt_caching`` is turned off: on the OpenAI wire cached reads go on."""


def unknown_price_fix(price_name: str) -> str:
    """How to give a model with no price one (USD per million tokens)."""
    return (f"set it with %chat config prices={price_name}=IN/CACHED/WRITE/OUT, USD per "
            "million tokens")


def compaction_cost(summary_prompt: int, summary_completion: int, removed_tokens: int | None,
                    paid_usd: float | None, saved_usd: float | None, *,
                    label: str = "summary request") -> str:
    """What a summary cost against what it removes from every later request (``None``:
    it removed nothing, a summary that failed); ``label`` names what was billed (the
    package's summary request, the background one, the server's compaction)."""
    paid = f"{label} {summary_prompt:,} + {summary_completion:,} tokens"
    if paid_usd is not None:
        paid += f" ({money(paid_usd)})"
    if removed_tokens is None:
        return paid
    saved = f"each later request ≈ {removed_tokens:,} input tokens smaller"
    if saved_usd is not None:
        saved += f" ({money(saved_usd)} uncached)"
    return f"{paid}; {saved}"


# -- the provider's server compaction and context editing (docs/server-compaction.md) -------

def server_compaction_words(summary_chars: int | None) -> str:
    """How a server compaction's content is named: its summary's size, or for an encrypted
    one (OpenAI's, opaque) that it cannot be read — in words that sit inside parentheses."""
    if summary_chars is None:
        return "an encrypted summary the package cannot read"
    return f"summary of {plural(summary_chars, 'character')}"


def server_compacted_detail(e: ev.ServerCompacted) -> str:
    """The card's (and the panel's) line for a server compaction."""
    kind = server_compaction_words(e.summary_chars)
    return (f"{e.wire} server: {plural(e.replaced_messages, 'message')} → 1 ({kind}); "
            f"history {format_size(e.before_bytes)} → {format_size(e.after_bytes)}")


@describe.register
def _(e: ev.ServerCompacted) -> str:
    return (f"{DONE} The provider compacted the conversation on its server: "
            f"{plural(e.replaced_messages, 'message')} replaced by its compaction "
            f"({server_compaction_words(e.summary_chars)}; history "
            f"{format_size(e.before_bytes)} → {format_size(e.after_bytes)}); the transcript "
            "keeps them, and %chat undo-compact brings them back")


shown_at.register(ev.ServerCompacted, lambda e: "quiet")   # context changed


def server_note_line(e: ev.ServerCompactionNote) -> str:
    """The one line a ``server_compaction`` note is told in."""
    if e.note == "unsupported_model":
        return (f"{INFO} server_compaction=on: {e.model or 'this model'} is not known to "
                "compact on its server; it is asked all the same, and the package's own "
                "summary waits for the server")
    if e.note == "unsupported_api":
        return (f"{INFO} server_compaction=on: this provider's API cannot compact on its "
                "server (Chat Completions has no such thing); the package compacts as "
                "before")
    if e.note == "not_compacting":
        return (f"{WARN} server compaction: a request of {e.derived_tokens:,} input tokens, "
                f"past the {e.trigger_tokens:,}-token trigger, came back without a "
                "compaction — this server does not compact; the package compacts itself "
                "from now on")
    by = "payload cap" if e.of == "cap" else "context window"
    return (f"{INFO} server compaction: the {by} needs compaction at ≈{e.derived_tokens:,} "
            f"tokens, below the server's lowest trigger ({e.trigger_tokens:,}); the package "
            "keeps the history within it as before (its own summary runs)")


@describe.register
def _(e: ev.ServerCompactionNote) -> str:
    return server_note_line(e)


def server_note_detail(e: ev.ServerCompactionNote) -> str:
    return server_note_line(e).removeprefix(f"{INFO} ").removeprefix(f"{WARN} ")


def server_clearing_line(e: ev.MicrocompactApplied) -> str:
    return (f"{CUT} microcompact on the server: {plural(e.summarized, 'old tool use')} "
            f"cleared by the provider (≈{e.cleared_tokens:,} tokens the model did not "
            "read; the body sent was not smaller)")


def server_clearing_detail(e: ev.MicrocompactApplied) -> str:
    return (f"on the server: {plural(e.summarized, 'tool use')} cleared · "
            f"≈{e.cleared_tokens:,} tokens")


def server_plan_line(*, carried: bool, compacts: bool, trigger_tokens: int,
                     derived_tokens: int, request_tokens: int, of: str | None,
                     ignored: bool = False) -> str:
    """A plan's (``what_if``, ``dry_run``) line for the provider's server compaction."""
    if not carried:
        return ("server compaction: asked, but this provider's API cannot carry it — the "
                "package compacts as before")
    if ignored:
        return ("server compaction: asked, but this server did not compact past its trigger "
                "— the package compacts as before")
    if not compacts:
        by = "payload cap" if of == "cap" else "context window"
        return (f"server compaction: trigger {trigger_tokens:,} tokens is the server's "
                f"lowest, above the ≈{derived_tokens:,} the {by} allows — the package "
                "compacts as before")
    line = (f"server compaction: the provider compacts past {trigger_tokens:,} input tokens "
            "(no LLM summary of the package's)")
    if request_tokens > trigger_tokens:
        line += (f" — this request (≈{request_tokens:,} tokens) is over it: the server "
                 "would compact it (its summary cannot be predicted here)")
    return line


def server_status(*, carried: bool, compacts: bool, trigger_tokens: int,
                  ignored: bool = False) -> str:
    """``%chat status``'s words for the provider's server compaction, when asked."""
    if not carried:
        return "asked, but this provider's API cannot carry it (the package compacts)"
    if ignored:
        return ("asked, but the server did not compact past its trigger (the package "
                "compacts)")
    if not compacts:
        return (f"asked past {trigger_tokens:,} tokens, the server's lowest, too late for "
                "the budget (the package compacts)")
    return f"on, past {trigger_tokens:,} input tokens (no summary of the package's)"
