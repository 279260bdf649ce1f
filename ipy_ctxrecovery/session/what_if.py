"""What-if: the next request under other settings, planned without sending anything.

:func:`plan` runs the session's own preparation pipeline as a dry run
(:func:`~.dry_run.trace`: microcompact → tool-result budget → pre-flight → compaction → fit,
the LLM summary replaced by an estimate of its size) on a copy of the history in which
every message carries its index in ``meta`` (:data:`TRACK`). Each step keeps the message
objects it leaves alone and derives the ones it changes from them (``meta`` travels with
them), so a message's **fate** is read from where its index went, step by step — never
guessed from sizes:

- gone after compaction: folded into the summary (or dropped by the trim, when the same
  pure trim on the same input removes it); gone after the fit: dropped;
- changed by microcompact: previewed, or one-lined (``budget.compaction_info`` level);
  by the budget or the fit: a budget preview; by the trim: trimmed;
- otherwise kept — pinned when it is a system message, the SYSTEM NOTICE or the latest
  request (which must survive: :attr:`Plan.request_survives`).

The plan also says what the recovery ladder would do if the provider rejected the planned
request anyway (``ladder.decide``/``ladder.apply``, pure): as too large (HTTP 413), or as
over the context window. :class:`Plan` renders as text and HTML.

Settings to try are any :class:`~..config.Settings` field, plus ``cap`` (the configured
payload cap, ``max_payload``) and ``window`` (the configured ``context_window``); a name
or value that is wrong is one :class:`~..errors.ConfigError` sentence, and nothing runs.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import html
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..core import compactor, ladder, theme
from ..core.budget import ResultStore, compaction_info
from ..core.events import CompactionPhase, LadderStep, Preflight
from ..core.history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_PINNED_RULES,
    TAG_SUMMARY,
    TAG_SYNTHETIC_RESULT,
    TAG_USER_WORDS,
    History,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    ToolResult,
    latest_user_index,
)
from ..core.wording import INFO, chat_budget_term, describe, plural, server_plan_line
from ..errors import ChatError, ConfigError, CtxRecoveryError
from ..failures import Failure, FailureKind
from ..providers.base import Request
from ..settings import ENV_VARS, Settings, format_size
from .compaction import SessionCompactor
from .dry_run import DryTrace, summarizer_for, trace
from .endpoint import Endpoint
from .learned import LearnedLimits
from .pipeline import Prepared, Preparer
from .recovery import RecoveryLoop
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, TurnLog
from .turns import ToolBox

__all__ = [
    "ALIASES",
    "FATE_COLOURS",
    "FATE_WORDS",
    "TRACK",
    "Fate",
    "LadderWhatIf",
    "MessagePlan",
    "Plan",
    "Rung",
    "fate_strip_html",
    "plan",
    "resolve_settings",
]

TRACK = "what_if_index"
"""``Message.meta`` key holding a message's index in the planned history."""

ALIASES: Mapping[str, str] = {"cap": "max_payload", "window": "context_window"}
"""Short names a what-if accepts besides the Settings fields."""


class Fate(StrEnum):
    """What the next request does to one message."""

    KEPT = "kept"
    PINNED_SYSTEM = "pinned_system"
    PINNED_NOTICE = "pinned_notice"
    PINNED_REQUEST = "pinned_request"
    PREVIEWED = "previewed"
    ONE_LINED = "one_lined"
    BUDGET_PREVIEW = "budget_preview"
    TRIMMED = "trimmed"
    SUMMARIZED = "summarized"
    DROPPED = "dropped"


FATE_WORDS: Mapping[Fate, str] = {
    Fate.KEPT: "kept",
    Fate.PINNED_SYSTEM: "pinned (system)",
    Fate.PINNED_NOTICE: "pinned (SYSTEM NOTICE)",
    Fate.PINNED_REQUEST: "pinned (latest request)",
    Fate.PREVIEWED: "tool result previewed (microcompact)",
    Fate.ONE_LINED: "tool result one-lined (microcompact)",
    Fate.BUDGET_PREVIEW: "tool result previewed (budget)",
    Fate.TRIMMED: "trimmed (reasoning or duplicate removed)",
    Fate.SUMMARIZED: "folded into the summary",
    Fate.DROPPED: "dropped",
}
FATE_COLOURS: Mapping[Fate, str] = {
    # Data colours, the same in every theme: mid-luminance shades, each at least 3:1
    # against a white and a near-black page, told apart by hue (tests/test_what_if.py).
    Fate.KEPT: "#78909c",
    Fate.PINNED_SYSTEM: "#1e88e5",
    Fate.PINNED_NOTICE: "#1e88e5",
    Fate.PINNED_REQUEST: "#1565c0",
    Fate.PREVIEWED: "#b38600",
    Fate.ONE_LINED: "#ef6c00",
    Fate.BUDGET_PREVIEW: "#ab47bc",
    Fate.TRIMMED: "#8d6e63",
    Fate.SUMMARIZED: "#2e7d32",
    Fate.DROPPED: "#e53935",
}
_GONE = frozenset({Fate.SUMMARIZED, Fate.DROPPED})
_FIRST_WORDS = 8
_FIRST_CHARS = 60


# -- values ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MessagePlan:
    """One message of the history and its fate. ``bytes``: UTF-8 bytes of its content
    (the body adds JSON framing); ``bytes_after``: of what is sent in its place (0 when
    it is gone); ``steps``: (step, fate) for every step that changed it, in order."""

    index: int
    role: str
    tag: str | None
    bytes: int
    tokens: int
    first_words: str
    fate: Fate
    bytes_after: int
    steps: tuple[tuple[str, Fate], ...] = ()


@dataclass(frozen=True, slots=True)
class AddedMessage:
    """A message the request carries that the history did not: a summary (its size
    estimated), a notice, a placeholder tool result."""

    position: int
    role: str
    kind: str
    bytes: int


@dataclass(frozen=True, slots=True)
class Rung:
    """One step of the ladder on a rejection: the level, what the resend would carry."""

    level: ladder.Level
    messages: int
    bytes: int
    request_kept: bool
    notes: tuple[str, ...] = ()
    summarized: bool = False
    """The oldest messages were summarized to fit (an exact fit's first choice)."""
    summary_requests: int = 0
    """The summary requests that step sends (a long history is summarized in chunks)."""


@dataclass(frozen=True, slots=True)
class LadderWhatIf:
    """The ladder's climb if the planned request were rejected ``as_`` payload or window
    (each resend rejected again), and the sentence it gives up with."""

    rejection: str          # "payload" | "window"
    failure: Failure
    rungs: tuple[Rung, ...]
    give_up: str | None

    @property
    def title(self) -> str:
        if self.rejection == "payload":
            return "rejected as too large (HTTP 413)"
        numbers = self.failure.prompt_tokens is not None
        return ("rejected as over the context window"
                + ("" if numbers else " (no token numbers reported)"))


@dataclass(frozen=True, repr=False)
class Plan:
    """What the next request would be under ``settings`` (module docstring)."""

    settings: Settings
    changes: Mapping[str, tuple[Any, Any]]
    messages: tuple[MessagePlan, ...]
    added: tuple[AddedMessage, ...]
    before_bytes: int
    after_bytes: int
    before_tokens: int
    after_tokens: int
    before_messages: int
    after_messages: int
    cap: int | None
    cap_source: str | None
    window: int
    window_known: bool
    preflight_action: str
    preflight_line: str
    trigger: int | None
    target: int | None
    compacted: bool
    summary: bool
    summary_input_chars: int | None
    summary_chars: int | None
    request_survives: bool
    refused: str | None = None
    budget_of: str | None = None
    """What the chat budget (``trigger``) is a share of: "window", "cap", or None (neither
    is known: no budget)."""
    budget_share: float | None = None
    budget_setting: str | None = None
    """The setting that sets ``budget_share`` (None: pre-flight's room for the answer)."""
    lines: tuple[str, ...] = ()
    fates: Mapping[Fate, int] = field(default_factory=dict)
    planned: History = ()
    next_message: str = ""
    """How the next message planned for was chosen (``next_message``)."""
    history_size: tuple[int, int] | None = None
    """(bytes, tokens) of the history as it is, without the next message: the session's
    one measure (``ChatSession.history_size``, what ``%chat status`` says)."""
    history_messages: int = 0
    prepare_at: int | None = None
    """Where a summary starts being prepared in the background (``prepare_summary_ratio``
    of the chat budget); None: background compaction off, or no budget."""
    climb: Callable[[], tuple[LadderWhatIf, ...]] | None = field(default=None, repr=False,
                                                                   compare=False)
    summary_requests: int = 0
    """The requests the summary would send (its chunks; 0: no summary)."""
    server_line: str | None = None
    """What the provider's server compaction would do (None: not asked)."""

    @functools.cached_property
    def ladder(self) -> tuple[LadderWhatIf, ...]:
        """What the ladder would do if the provider rejected the planned request (computed
        on first use: it searches, and a slider's plan rarely needs it)."""
        return self.climb() if self.climb is not None else ()

    @property
    def history(self) -> History:
        """The messages the planned request would carry (a summary's text is the estimate)."""
        return tuple(Message(m.role, m.blocks, m.tag,
                             {k: v for k, v in m.meta.items() if k != TRACK})
                     for m in self.planned)

    def fate_of(self, index: int) -> Fate:
        return self.messages[index].fate

    # -- rendering ------------------------------------------------------------------------
    def summary_lines(self) -> list[str]:
        """The headline facts, one per line (the text and HTML forms share them)."""
        cap = (f"cap {format_size(self.cap)} ({self.cap_source})" if self.cap is not None
               else "no payload cap")
        window = f"{self.window:,} tokens" + ("" if self.window_known else " (guessed)")
        out = [f"{cap} · window {window}"]
        if self.next_message:
            out.append(f"next message: {self.next_message}")
        if self.changes:
            out.append("changed: " + ", ".join(f"{k} {_shown(k, a)} → {_shown(k, b)}"
                                               for k, (a, b) in self.changes.items()))
        if self.history_size is not None:
            size, tokens = self.history_size
            out.append(f"history: {plural(self.history_messages, 'message')}, "
                       f"{format_size(size)} ≈ {tokens:,} tokens (as %chat status says)")
        out.append(f"before: {plural(self.before_messages, 'message')}, "
                   f"{format_size(self.before_bytes)} ≈ {self.before_tokens:,} tokens"
                   + (" (the next request: the history and the next message)"
                      if self.history_size is not None and self.next_message else ""))
        if self.refused is not None:
            out.append(f"refused before sending: {self.refused}")
            return out
        out.append(f"after:  {plural(self.after_messages, 'message')}, "
                   f"{format_size(self.after_bytes)} ≈ {self.after_tokens:,} tokens")
        said = "; ".join(line.removeprefix(f"{INFO} pre-flight: ")
                         for line in self.preflight_line.splitlines())
        out.append(f"pre-flight: {self.preflight_action}" + (f" — {said}" if said else ""))
        if self.trigger is not None:
            # Named as the pre-flight line names it, so the two read as the same number.
            if self.budget_of is None:
                budget = "chat budget: none (no payload cap and no known window)"
            else:
                budget = f"chat budget {format_size(self.trigger)} ({self._budget_term()})"
            if not self.compacted:
                budget += " — not reached"
            elif self.target is not None:
                budget += f" — compacting to {format_size(self.target)}"
            out.append(budget)
            if self.prepare_at is not None:
                ratio = self.settings.prepare_summary_ratio
                line = (f"background summary: prepared once the history passes "
                        f"{format_size(self.prepare_at)} ({ratio:.0%} of the chat budget: "
                        "prepare_summary_ratio), swapped in at the turn over the budget")
                if self.compacted:
                    line += " — this request is over it: a ready summary is swapped in"
                elif self.before_bytes >= self.prepare_at:
                    line += " — past it: one is prepared after this turn"
                out.append(line)
            elif self.budget_of is not None and not self.settings.background_compaction:
                out.append("background summary: off (background_compaction)")
        if self.server_line is not None:
            out.append(self.server_line)
        if self.summary:
            sent = f" in {self.summary_requests} requests" if self.summary_requests > 1 else ""
            out.append(f"LLM summary would run: input {self.summary_input_chars or 0:,} chars"
                       f"{sent} → ≈{self.summary_chars or 0:,} chars (estimated)")
        out.append("latest request: " + ("kept" if self.request_survives else "LOST"))
        counts = ", ".join(f"{n} {FATE_WORDS[f]}" for f, n in self.fates.items())
        out.append(f"fates: {counts}")
        return out

    def _budget_term(self) -> str:
        return chat_budget_term(share=self.budget_share, of=self.budget_of, window=self.window,
                                cap=self.cap, cap_source=self.cap_source,
                                setting=self.budget_setting)

    def ladder_lines(self) -> list[str]:
        out = []
        for climb in self.ladder:
            steps = [f"{r.level.value}{' (summary)' if r.summarized else ''} → "
                     f"{plural(r.messages, 'msg')}, {format_size(r.bytes)}"
                     + ("" if r.request_kept else " (request LOST)") for r in climb.rungs]
            end = f"then gives up: {climb.give_up}" if climb.give_up else "then gives up"
            out.append(f"if {climb.title}: " + "; ".join([*steps, end]))
        return out

    def rows(self, *, limit: int = 60) -> list[MessagePlan | tuple[int, int]]:
        """Messages to show: every one whose fate is not plain "kept"; runs of kept ones
        as (first, last) ranges; at most ``limit`` entries."""
        out: list[MessagePlan | tuple[int, int]] = []
        run: list[int] = []
        for m in self.messages:
            if m.fate is Fate.KEPT:
                run.append(m.index)
                continue
            if run:
                out.append((run[0], run[-1]))
                run = []
            out.append(m)
        if run:
            out.append((run[0], run[-1]))
        return out[:limit]

    def text(self) -> str:
        lines = ["what-if: " + self.summary_lines()[0], *self.summary_lines()[1:]]
        lines += ["", f"{'#':>5} {'role':<9} {'bytes':>9} {'tokens':>7}  {'fate':<38} first words"]
        shown = self.rows()
        for row in shown:
            if isinstance(row, tuple):
                first, last = row
                n = last - first + 1
                lines.append(f"{'':>5} … {plural(n, 'message')} kept (#{first}–#{last})")
                continue
            lines.append(f"{row.index:>5} {row.role:<9} {row.bytes:>9,} {row.tokens:>7,}  "
                         f"{FATE_WORDS[row.fate]:<38} {row.first_words}")
        hidden = len(self.rows(limit=len(self.messages) + 1)) - len(shown)
        if hidden > 0:
            lines.append(f"{'':>5} … {hidden} more rows (Plan.messages has them all)")
        for added in self.added:
            lines.append(f"{'+':>5} {added.role:<9} {added.bytes:>9,} {'':>7}  "
                         f"{'added: ' + added.kind:<38}")
        ladder_lines = self.ladder_lines()
        if ladder_lines:
            lines += ["", *ladder_lines]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        fates = ", ".join(f"{n} {f.value}" for f, n in self.fates.items())
        return (f"<Plan {self.before_messages} → {self.after_messages} messages, "
                f"{format_size(self.before_bytes)} → {format_size(self.after_bytes)}; {fates}>")

    def html(self) -> str:
        facts = "".join(f"<div>{html.escape(line)}</div>" for line in self.summary_lines())
        rows = []
        for row in self.rows(limit=300):
            if isinstance(row, tuple):
                first, last = row
                rows.append(f"<tr><td></td><td colspan=5 style='color:{theme.TEXT_DIM}'>… "
                            f"{plural(last - first + 1, 'message')} kept (#{first}–#{last})"
                            "</td></tr>")
                continue
            colour = FATE_COLOURS[row.fate]
            rows.append(
                f"<tr><td style='text-align:right'>{row.index}</td><td>{row.role}</td>"
                f"<td style='text-align:right'>{row.bytes:,}</td>"
                f"<td style='text-align:right'>{row.tokens:,}</td>"
                f"<td><span style='display:inline-block;width:10px;height:10px;"
                f"background:{colour};margin-right:4px'></span>{FATE_WORDS[row.fate]}</td>"
                f"<td>{html.escape(row.first_words)}</td></tr>")
        for added in self.added:
            rows.append(f"<tr><td>+</td><td>{added.role}</td>"
                        f"<td style='text-align:right'>{added.bytes:,}</td><td></td>"
                        f"<td colspan=2>added: {html.escape(added.kind)}</td></tr>")
        table = ("<div style='max-height:320px;overflow:auto'><table>"
                 "<tr><th>#</th><th>role</th><th>bytes</th><th>tokens</th><th>fate</th>"
                 f"<th>first words</th></tr>{''.join(rows)}</table></div>")
        ladder_html = "".join(f"<div>{html.escape(line)}</div>" for line in self.ladder_lines())
        return (f"<div><b>what-if</b>{facts}{fate_strip_html(self)}{table}"
                f"{ladder_html}</div>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


def _shown(name: str, value: Any) -> str:
    if name == "max_payload":
        return format_size(value) if value else "none"
    if value is None:
        return "auto" if name == "context_window" else "none"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def fate_strip_html(plan: Plan, *, max_cells: int = 1500) -> str:
    """One coloured cell per message (hover: index, role, size, first words); histories
    longer than ``max_cells`` get one cell per group, coloured by its most drastic fate."""
    messages = plan.messages
    if not messages:
        return ""
    size = max(1, -(-len(messages) // max_cells))
    order = list(Fate)
    cells = []
    width = max(3, min(14, 720 // max(1, -(-len(messages) // size))))
    for start in range(0, len(messages), size):
        group = messages[start:start + size]
        worst = max(group, key=lambda m: order.index(m.fate))
        if len(group) == 1:
            m = group[0]
            hover = (f"#{m.index} {m.role} · {format_size(m.bytes)} · {FATE_WORDS[m.fate]}"
                     f" · {m.first_words}")
        else:
            hover = (f"#{group[0].index}–#{group[-1].index} · "
                     + ", ".join(f"{n} {FATE_WORDS[f]}" for f, n in
                                 Counter(m.fate for m in group).items()))
        cells.append(f"<span title='{html.escape(hover, quote=True)}' style='display:"
                     f"inline-block;width:{width}px;height:18px;margin-right:1px;"
                     f"background:{FATE_COLOURS[worst.fate]}'></span>")
    return ("<div style='display:flex;flex-wrap:wrap;margin:4px 0;line-height:0'>"
            + "".join(cells) + "</div>")


# -- settings -------------------------------------------------------------------------------

def resolve_settings(current: Settings, settings: Settings | None = None,
                     overrides: Mapping[str, Any] | None = None) -> Settings:
    """``settings`` (or ``current``) with ``overrides`` applied and validated.

    Override names: Settings fields, their CHATCLI_* variables, ``cap`` and ``window``.
    Values as Python values or text (``cap="256KB"``). Raises one :class:`ConfigError`
    sentence for an unknown name or a bad value.
    """
    if settings is not None and not isinstance(settings, Settings):
        raise ConfigError(f"settings={settings!r} is not a Settings object; pass "
                          "Settings(...) or the fields themselves (cap=..., window=...).")
    base = settings if settings is not None else current
    base.validate()
    names = {f.name for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        name = ALIASES.get(key) or ENV_VARS.get(key.upper()) or key
        if name not in names:
            close = difflib.get_close_matches(key, [*ALIASES, *sorted(names)], n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{key} is not a setting{hint}; use cap=, window= or a "
                              "Settings field name such as emergency_keep_messages.")
        values[name] = value
    if not values:
        return base
    return base.updated(values, source="setting")


def _changes(old: Settings, new: Settings) -> dict[str, tuple[Any, Any]]:
    return {f.name: (getattr(old, f.name), getattr(new, f.name))
            for f in dataclasses.fields(Settings)
            if getattr(old, f.name) != getattr(new, f.name)}


# -- following messages through the steps ---------------------------------------------------

def _tracked(history: History) -> History:
    return tuple(Message(m.role, m.blocks, m.tag, {**m.meta, TRACK: i})
                 for i, m in enumerate(history))


def _ids(history: History) -> dict[int, Message]:
    out = {}
    for m in history:
        i = m.meta.get(TRACK) if m.meta else None
        if isinstance(i, int):
            out[i] = m
    return out


def _level(m: Message) -> int:
    info = compaction_info(m) if m.role is Role.TOOL else None
    return info.level if info is not None else 0


def follow(stages: Sequence[tuple[str, History]]) -> dict[int, list[tuple[str, Fate]]]:
    """For each tracked message, every (step, fate) that befell it, in order."""
    first = _ids(stages[0][1])
    paths: dict[int, list[tuple[str, Fate]]] = {i: [] for i in first}
    prev, prev_history = first, stages[0][1]
    for name, history in stages[1:]:
        if history is prev_history:
            continue
        cur = _ids(history)
        trimmed_away: set[int] = set()
        if name == "compaction":
            # The compactor trims before it summarizes; the same pure trim on the same
            # input says which messages the trim itself removed.
            trimmed, _ = compactor.trim(prev_history)
            trimmed_away = set(prev) - set(_ids(trimmed))
        for i, m in prev.items():
            n = cur.get(i)
            if n is m:
                continue
            if n is None:
                fate = Fate.SUMMARIZED if name == "compaction" and i not in trimmed_away \
                    else Fate.DROPPED
            elif name == "microcompact":
                fate = Fate.ONE_LINED if _level(n) >= 3 else Fate.PREVIEWED
            elif name == "compaction":
                fate = Fate.TRIMMED
            elif m.role is Role.TOOL and _level(n) != _level(m):
                fate = Fate.BUDGET_PREVIEW
            else:
                fate = Fate.TRIMMED
            paths[i].append((name, fate))
        prev, prev_history = cur, history
    return paths


def _content_bytes(m: Message) -> int:
    total = 0
    for b in m.blocks:
        if isinstance(b, Text | Reasoning):
            total += _utf8(b.text)
        elif isinstance(b, ToolCall):
            total += _utf8(b.name) + _utf8(b.arguments)
        elif isinstance(b, ToolResult):
            total += _utf8(b.content)
    return total


def _utf8(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", errors="surrogatepass"))


def _first_words(m: Message) -> str:
    text = ""
    for b in m.blocks:     # the first visible text only: a result may be megabytes
        if isinstance(b, Text):
            text = b.text[:400]
            break
        if isinstance(b, ToolResult):
            text = b.content[:400]
            break
    if not text.strip() and m.tool_calls:
        text = "calls " + ", ".join(f"{c.name}({c.arguments[:40]})" for c in m.tool_calls)
    words = " ".join(text.split()[:_FIRST_WORDS])
    return words if len(words) <= _FIRST_CHARS else words[:_FIRST_CHARS - 1] + "…"


def _added_kind(m: Message) -> str:
    if m.tag == TAG_SUMMARY:
        return "summary (size estimated)"
    if m.tag == TAG_COMPACTION_NOTICE:
        return "compaction notice"
    if m.tag == TAG_PAYLOAD_NOTICE:
        return "SYSTEM NOTICE (payload limit)"
    if m.tag == TAG_SYNTHETIC_RESULT:
        return "placeholder tool result"
    if m.tag == TAG_PINNED_RULES:
        return "the user's rules, pinned verbatim"
    if m.tag == TAG_USER_WORDS:
        return "the user's earlier messages, verbatim"
    return m.tag or m.role.value


# -- the ladder, if the planned request were rejected ----------------------------------------

class _Rejecting:
    """The provider a what-if climb sends through: it measures like the session's and
    rejects every request with the planned failure, so the climb is the session's own
    recovery (``RecoveryLoop``: the evidence, the policy, the summary to fit, the ladder),
    with the summary estimated and nothing sent."""

    def __init__(self, measure: Callable[[Request], int],
                 failure_for: Callable[[int], Failure]) -> None:
        self.measure = measure
        self.failure_for = failure_for
        self.sent: list[tuple[History, int]] = []

    def send(self, request: Request, on_text: Any = None) -> Any:
        size = self.measure(request)
        self.sent.append((request.messages, size))
        raise ChatError(self.failure_for(size))


class _StandIn:
    """The endpoint of a what-if climb: the rejecting provider; credentials never refresh."""

    def __init__(self, provider: _Rejecting) -> None:
        self.provider = provider

    def refresh(self) -> None:
        return None


class _AsPrepared:
    """The preparer of a what-if climb: the request is the one already planned (prepared
    once); a fit to a known limit is the session's own."""

    def __init__(self, real: Preparer, body: int, spec: RequestSpec) -> None:
        self.real, self.body, self.spec = real, body, spec

    def prepare(self, history: History, spec: RequestSpec, log: TurnLog) -> Prepared:
        return Prepared(history, spec, self.body, ())

    def fit_known_limits(self, *args: Any, **kwargs: Any) -> History:
        return self.real.fit_known_limits(*args, **kwargs)


def ladder_what_if(history: History, body: int, record: DryTrace, settings: Settings,
                   store: ResultStore) -> tuple[LadderWhatIf, ...]:
    """The session's recovery of ``history`` (``body`` bytes) for a 413 and for a window
    rejection, each resend assumed rejected again, as far as recovery goes: the same
    ``RecoveryLoop`` a turn runs, driven with a provider that rejects and an estimated
    summary (so the plan is the recovery that runs)."""
    assert record.prepared is not None
    return tuple(_climb(rejection, history, body, record, settings, store)
                 for rejection in ("payload", "window"))


def _climb(rejection: str, history: History, body: int, record: DryTrace, settings: Settings,
           store: ResultStore) -> LadderWhatIf:
    assert record.prepared is not None
    spec = record.prepared.spec
    limits = copy.deepcopy(record.limits)
    limits.asked_server = True              # a plan asks no server
    own = record.sizer.with_limits(limits)
    own.forget_encoding()
    window = own.window
    over = own.estimate(body) + (own.reserved_tokens(spec) or 0) > window
    bus = EventBus()

    planned = summarizer_for(own.endpoint, limits)

    def summarize(text: str, tokens: int, _log: TurnLog | None = None) -> str:
        return planned(text, tokens)

    def failure_for(size: int) -> Failure:
        return _failure(rejection, size, own.estimate(size), window, over)

    compactor = SessionCompactor(own, bus, settings, summarize=summarize,
                                 sleep=lambda _seconds: None)
    preparer = Preparer(own, compactor, store, bus, settings)
    provider = _Rejecting(own.measure_request, failure_for)
    loop = RecoveryLoop(_StandIn(provider), own,  # type: ignore[arg-type]
                        _AsPrepared(preparer, body, spec),  # type: ignore[arg-type]
                        compactor, store, bus, settings, sleep=lambda _seconds: None)
    steps: list[LadderStep] = []
    bus.subscribe(lambda e: steps.append(e) if isinstance(e, LadderStep) else None)
    ended: list[CompactionPhase] = []          # one per summary tried, in order
    bus.subscribe(lambda e: ended.append(e) if isinstance(e, CompactionPhase)
                  and e.phase in ("applied", "rejected") else None)
    give_up: str | None = None
    try:
        loop.send(history, spec, TurnLog(), None)
    except ChatError as e:
        give_up = str(e)
    decided = [e for e in steps if _announces_step(e)]
    outcomes = [e for e in steps if not _announces_step(e)]
    rungs = []
    summaries = iter(ended)
    for n, (sent, size) in enumerate(provider.sent[1:]):
        step = decided[n] if n < len(decided) else None
        level = step.decision.level if step is not None else ladder.Level.GIVE_UP
        notes = next((o.notes for o in outcomes
                      if step is not None and o.decision is step.decision and o.notes), ())
        summarized = bool(step is not None and step.summarizing
                          and any(m.tag == TAG_SUMMARY for m in sent))
        tried = next(summaries, None) if step is not None and step.summarizing else None
        rungs.append(Rung(level, len(sent), size, latest_user_index(sent) is not None,
                          tuple(notes), summarized=summarized,
                          summary_requests=tried.summary_requests if tried else 0))
    return LadderWhatIf(rejection, failure_for(body), tuple(rungs), give_up)


def _announces_step(e: LadderStep) -> bool:
    """A ladder step told before it is applied (one per resend), not its outcome."""
    return not e.notes and e.summary_not_used is None and e.after_messages == e.before_messages


def _failure(rejection: str, size: int, est: int, window: int, over: bool) -> Failure:
    if rejection == "payload":
        return Failure(FailureKind.PAYLOAD_TOO_LARGE, "what-if: rejected as too large",
                       status=413, request_bytes=size)
    if over:
        return Failure(FailureKind.CONTEXT_OVERFLOW, "what-if: over the context window",
                       status=400, prompt_tokens=est, limit_tokens=window)
    return Failure(FailureKind.CONTEXT_OVERFLOW, "what-if: over the context window",
                   status=400)


# -- the plan -------------------------------------------------------------------------------

def _budget(record: DryTrace, settings: Settings) -> dict[str, Any]:
    """The chat budget pre-flight compared the body with: what it is a share of, and the
    setting that sets the share."""
    budget, ratio = record.budget, record.budget_ratio
    if budget is None or budget.of is None:
        return {}
    if budget.of == "cap":
        setting: str | None = "cap_budget_fraction"
    elif ratio is None or ratio == settings.chat_budget_ratio:
        setting = "chat_budget_ratio"
    elif ratio == settings.preflight_budget_ratio:
        setting = "preflight_budget_ratio"
    else:
        setting = None          # pre-flight's share leaving room for max_tokens
    return {"budget_of": budget.of, "budget_share": budget.share, "budget_setting": setting}


def next_message(history: History, text: str | None, size: int | None) -> tuple[str, str]:
    """The next user message a plan is for, and how it was chosen: ``text`` as given, a
    ``size`` in bytes, or (neither) one the size of the last message the user sent — a plan
    is always for a request still to be sent, never for one already answered. A history
    that does not end with an answer is a turn under way: its request is planned as is."""
    if text is not None and size is not None:
        raise CtxRecoveryError("what_if takes the next message as text= or its size as size=, "
                               "not both.")
    if text is not None:
        return text, "as given (text=)"
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise CtxRecoveryError(f"size={size!r} is not a whole number of bytes ≥ 1: give the "
                                   "next message's size, e.g. size=4096.")
        return _filler(size), f"{format_size(size)}, as given"
    if history and history[-1].role is not Role.ASSISTANT:
        # A turn under way (a tool result, a message not yet answered): its next request.
        return "", "the pending request (the history as it is)"
    last = next((m for m in reversed(history) if m.role is Role.USER and m.tag is None
                 and m.text), None)
    if last is None:
        return "", ""
    size = max(1, len(last.text.encode("utf-8")))
    return _filler(size), f"assumed {format_size(size)}, the size of the last one you sent"


def _filler(size: int) -> str:
    """Plain words of exactly ``size`` bytes: a message of that size to plan with."""
    return ("the next message " * (size // 17 + 1))[:size]


def plan(history: History, text: str | None, spec: RequestSpec, *, endpoint: Endpoint,
         limits: LearnedLimits, tools: ToolBox, store: ResultStore, current: Settings,
         settings: Settings | None = None, overrides: Mapping[str, Any] | None = None,
         name: str = "this session", size: int | None = None,
         history_size: tuple[int, int] | None = None, after: Preparer | None = None) -> Plan:
    """The plan of the next request on ``history`` plus the next user message
    (:func:`next_message`: ``text``, ``size`` bytes, or one like the last) under
    ``settings``/``overrides`` (see the module docstring). ``history_size``: the
    history's own measure, shown beside the request's (``Plan.history_size``). ``after``:
    the session's preparer, whose previous request the planned one follows (batched
    rewrites are planned as the run will batch them)."""
    chosen = resolve_settings(current, settings, overrides)
    if not any(m.role is not Role.SYSTEM for m in history) and text is None and size is None:
        raise CtxRecoveryError(f"{name} has no history yet: send a message first, or give "
                               "text= (the next message) or size= to plan it.")
    text, how = next_message(history, text, size)
    full = history + ((Message.user(text),) if text else ())
    tracked = _tracked(full)
    record = trace(tracked, spec, endpoint=endpoint, limits=limits, tools=tools, store=store,
                   settings=chosen, current=current, after=after)
    sizer = record.sizer
    before = sizer.measure(tracked, spec)
    latest = latest_user_index(tracked)
    prepared = record.prepared
    paths: dict[int, list[tuple[str, Fate]]] = (
        follow(record.stages) if prepared is not None else {i: [] for i in range(len(full))})
    final = _ids(prepared.history) if prepared is not None else _ids(tracked)
    messages = []
    for i, m in enumerate(tracked):
        path = paths[i]
        size = _content_bytes(m)
        if path:
            fate = path[-1][1]
        elif m.role is Role.SYSTEM:
            fate = Fate.PINNED_SYSTEM
        elif m.tag == TAG_PAYLOAD_NOTICE:
            fate = Fate.PINNED_NOTICE
        elif i == latest:
            fate = Fate.PINNED_REQUEST
        else:
            fate = Fate.KEPT
        now = final.get(i)
        messages.append(MessagePlan(
            index=i, role=m.role.value, tag=m.tag, bytes=size,
            tokens=limits.tokens.estimate(size), first_words=_first_words(m), fate=fate,
            bytes_after=_content_bytes(now) if now is not None and fate not in _GONE else 0,
            steps=tuple(path)))
    counts = Counter(m.fate for m in messages)
    fates = {f: counts[f] for f in Fate if counts[f]}
    caps = record.limits.caps
    common: dict[str, Any] = dict(
        next_message=how, history_size=history_size, history_messages=len(history),
        settings=chosen, changes=_changes(current, chosen), messages=tuple(messages),
        before_bytes=before, before_tokens=sizer.estimate(before), before_messages=len(full),
        cap=caps.effective(), cap_source=caps.source, window=sizer.window,
        window_known=sizer.window_known, fates=fates,
        prepare_at=_prepare_at(record.trigger, chosen),
        server_line=_server_line(sizer, prepared.body_bytes if prepared is not None
                                 else before))
    if prepared is None:
        refused = str(record.refused)
        return Plan(**common, added=(), after_bytes=before, planned=full, after_tokens=sizer.estimate(before),
                    after_messages=len(full), preflight_action="refused", preflight_line="",
                    trigger=None, target=None, compacted=False, summary=False,
                    summary_input_chars=None, summary_chars=None,
                    request_survives=True, refused=refused, lines=(refused,))
    added = tuple(AddedMessage(pos, m.role.value, _added_kind(m), _content_bytes(m))
                  for pos, m in enumerate(prepared.history)
                  if not isinstance((m.meta or {}).get(TRACK), int))
    pf = next((e for e in prepared.steps if isinstance(e, Preflight)), None)
    report = record.compaction
    summarized = bool(report is not None and report.applied and report.summarized_messages)
    return Plan(
        **common, added=added, after_bytes=prepared.body_bytes, planned=prepared.history,
        after_tokens=sizer.estimate(prepared.body_bytes),
        after_messages=len(prepared.history),
        preflight_action=pf.action if pf is not None else "ok",
        preflight_line=describe(pf) if pf is not None else "",
        trigger=record.trigger, target=record.target, compacted=report is not None,
        **_budget(record, chosen),
        summary=summarized, summary_input_chars=record.summary_input if summarized else None,
        summary_chars=record.summary_chars if summarized else None,
        summary_requests=report.summary_requests if summarized and report is not None else 0,
        request_survives=latest is None or latest in final,
        lines=tuple(line for line in (describe(e) for e in prepared.steps) if line),
        climb=functools.partial(ladder_what_if, prepared.history, prepared.body_bytes, record,
                                chosen, record.store))


def _server_line(sizer: RequestSizer, sent: int) -> str | None:
    """The plan's line for the provider's server compaction (None: not asked): a plan
    cannot know the server's summary, so it predicts none of the package's where the
    server would compact — it says so, judged on ``sent``, the body pre-flight would
    send (a fit can bring it under the trigger)."""
    server = sizer.server
    decision = server.decision()
    if not decision.asked:
        return None
    when = server.trigger()
    return server_plan_line(carried=decision.carried, compacts=server.compacts(),
                            trigger_tokens=when.tokens, derived_tokens=when.derived,
                            request_tokens=sizer.estimate(sent), of=when.of,
                            ignored=sizer.limits.server_did_not_compact)


def _prepare_at(trigger: int | None, settings: Settings) -> int | None:
    """Where the background summary starts (``background.py``'s threshold) for a plan."""
    if trigger is None or not settings.background_compaction or trigger >= 2 ** 61:
        return None
    return int(trigger * settings.prepare_summary_ratio)
