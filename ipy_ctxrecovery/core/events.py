"""Typed events: what the session and the core report as a turn goes on.

Every event is a frozen dataclass of facts (sizes, counts, the :class:`~.failures.FailureKind`,
the ladder :class:`~._decide.Level`); none carries prose. What a person reads is rendered
from these fields by :mod:`.wording` (``describe(event)``), so the plain-text printer, the
panel, the turn card and ``Reply.actions`` all say the same thing, and nothing parses a
line back. The core emits events through a callback it is given; it never calls a UI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..failures import Failure, FailureKind

if TYPE_CHECKING:
    from .ladder.decide import Decision, Level

__all__ = [
    "BudgetApplied",
    "CapChanged",
    "CapSource",
    "CompactionPhase",
    "Escalation",
    "Event",
    "EventCallback",
    "Failed",
    "FitBeforeSend",
    "LadderStep",
    "MaxTokensLowered",
    "MicrocompactApplied",
    "NoticeInjected",
    "Preflight",
    "Recovered",
    "Retrying",
    "Sending",
    "ServerCompacted",
    "ServerCompactionNote",
    "StreamUsageMissing",
    "ThinkingFitted",
    "ToolRun",
    "Truncated",
    "TurnFinished",
    "WindowLearned",
]

CapSource = Literal["configured", "assumed", "learned"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Preflight(Event):
    """The pre-flight check of one request (SPEC §2).

    ``reasons``: what it found — ``"cap"`` (over the pre-flight share of the cap),
    ``"window"`` (prompt + max_tokens over the window), ``"budget"`` (within both, but
    over the chat budget: ``budget_bytes``, ``budget_share`` of the window or of the cap,
    as ``budget_of`` says), ``"no_cap"`` (the one-shot large-history warning with no cap);
    empty for a routine check (``action == "ok"``).
    """

    body_bytes: int
    est_tokens: int
    cap: int | None
    cap_source: CapSource | None = None
    window: int
    max_tokens: int | None = None
    action: Literal["ok", "compact", "warn"]
    reasons: tuple[Literal["cap", "window", "budget", "no_cap"], ...] = ()
    budget_bytes: int | None = None
    budget_of: Literal["window", "cap"] | None = None
    budget_share: float | None = None
    counted_tokens: int | None = None
    """The input tokens as the provider counted them (exact pre-flight,
    ``core/exact_count.py``; then ``est_tokens`` is this count); None: estimated."""
    server_compacts: bool = False
    """The provider compacts on its server (``docs/server-compaction.md``): over the chat
    budget it is the server that compacts; only a hard limit is fitted here."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MaxTokensLowered(Event):
    """Before sending, ``max_tokens`` was lowered: above a learned output limit, or the
    prompt plus the answer could not fit the window."""

    requested: int
    sent: int
    reason: Literal["output_limit", "window"]
    est_tokens: int
    window: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ThinkingFitted(Event):
    """The max_tokens sent left no room for extended thinking's budget as asked: the
    budget went lowered to its share (``sent``), or thinking off for the request (``sent``
    None; ``core/thinking.py``)."""

    requested: int
    sent: int | None
    max_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FitBeforeSend(Event):
    """The body was over a known limit (after compaction, or with none run): fitted before
    sending."""

    body_bytes: int
    goal_bytes: int
    over: Literal["cap", "window"]
    cap: int | None
    cap_source: CapSource | None
    est_tokens: int
    reserved_tokens: int
    window: int
    notes: tuple[str, ...] = ()
    after_compaction: bool = True
    """The package compacted the history first (False: the fit alone — while the server
    compacts, or for a body at a size already rejected)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MicrocompactApplied(Event):
    truncated: int
    summarized: int
    bytes_freed: int
    on_server: bool = False
    """The provider's context editing cleared old tool uses on its server (Anthropic's
    ``clear_tool_uses``): ``summarized`` tool uses cleared, ``cleared_tokens`` tokens the
    model did not read; the body sent was not smaller (``bytes_freed`` 0)."""
    cleared_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetApplied(Event):
    replaced: int
    persisted: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionPhase(Event):
    """One phase of a compaction (SPEC §7).

    ``outcome`` says what an ``applied`` phase applied (``"summary"``, ``"trim"``, or
    ``"nothing"`` when the history was already within the target); ``reason`` why a
    ``rejected`` one was rejected.
    """

    phase: Literal["start", "trim", "summarize", "applied", "rejected", "cancelled"]
    before_messages: int
    after_messages: int | None = None
    before_bytes: int = 0
    after_bytes: int | None = None
    target_bytes: int | None = None
    outcome: Literal["summary", "trim", "nothing"] | None = None
    reason: str | None = None
    chunks: int = 0
    """Chunks the summary reads its messages in (told from ``summarize`` on; 0: none)."""
    summary_requests: int = 0
    """Summary requests sent so far (the chunks, and a retry of a reply cut short)."""
    summary_input_tokens: int | None = None
    summary_output_tokens: int | None = None
    """Tokens those requests used, when the provider said."""
    dropped_unread: int = 0
    """Messages removed unread: past the summary-request bound (never silently)."""
    summary_request_bound: int | None = None
    """``settings.summary_max_requests`` when the summary was planned."""
    read_messages: int = 0
    """Messages the summary reads (all it replaces but the ``dropped_unread``)."""
    pinned_rules: int = 0
    """An applied summary: the user's rules pinned verbatim after it (``core/pins.py``)."""
    new_rules: int = 0
    """Of them, pinned by this compaction."""
    unpinned_rules: int = 0
    """Rules past ``pinned_rules_max_chars``, summarized like the rest."""
    kept_user_messages: int = 0
    """The user's messages kept verbatim after the summary."""
    facts_kept: int | None = None
    facts_added: int | None = None
    facts_total: int | None = None
    """An applied summary's fact check (``core/facts.py``): the facts of the replaced
    messages it kept, those added back verbatim, and how many there were."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LadderStep(Event):
    """One step of the recovery ladder for a failed request (SPEC §3).

    ``decision`` is the pure decision (its level, target and numbers); ``summarizing``
    tells an exact fit that first tries an LLM summary; ``summary_not_used`` why a tried
    summary was not used (the step then drops the oldest messages); ``notes`` what the
    applied step did.
    """

    decision: Decision
    failure: Failure
    before_messages: int
    after_messages: int
    notes: tuple[str, ...] = ()
    summarizing: bool = False
    summary_not_used: str | None = None
    server_compacts: bool = False
    """The provider compacts on its server: the step drops instead of summarizing
    (``docs/server-compaction.md``)."""

    @property
    def level(self) -> Level:
        return self.decision.level

    @property
    def attempt(self) -> int:
        return self.decision.attempt

    @property
    def failure_kind(self) -> FailureKind:
        return self.failure.kind


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeInjected(Event):
    notice: Literal["payload", "compaction"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapChanged(Event):
    """The payload cap in force changed: learned (or lowered) from a refused request of
    ``rejected_bytes``, withdrawn when the evidence for it was contradicted, or assumed
    (SPEC §3 auto-cap). ``signature`` (a ``failures.Signature`` value) says how the path
    refused; ``change`` what happened to the cap ("suspected": held for one request, to
    tell a size limit from a content rule); ``withdrawn_because`` why it went:
    "bigger_passed" (a bigger body went through), "not_size" (a body no bigger than one
    that passed was refused the same way) or "blocked_again" (the same request, smaller,
    was blocked too)."""

    cap: int | None
    source: CapSource
    rejected_bytes: int | None = None
    dropped: bool = False
    change: Literal["learned", "lowered", "withdrawn", "assumed", "suspected"] = "learned"
    signature: str | None = None
    withdrawn_because: Literal["bigger_passed", "not_size", "blocked_again"] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Escalation(Event):
    attempt: int
    max_tokens: int
    previous: int
    of: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncated(Event):
    """The answer was still cut by max_tokens when the escalations ran out (it is kept as is).

    ``failed``: why it could not be continued at all, when that is what happened — the
    continuation request failed, the model refused, or all it wrote was dropped at the
    join (a restart, a meta opener, the prompt echoed); the answer is kept as it is, cut."""

    max_tokens: int
    escalations: int
    failed: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowLearned(Event):
    """A context overflow reported a window below the session's: used from now on.

    ``bound``: the error named no window (the Responses API's "Your input exceeds the
    context window of this model."), so ``window`` is the rejected request's tokens — the
    real window is below it, and the session keeps under it from now on."""

    window: int
    previous: int
    bound: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrying(Event):
    """A retry of the same request: ``auth`` (credentials re-read once), ``transient``, or
    the same body once more after a refusal that may be a blip (``resend``: "suspect", the
    first above what the path carried, or "carried", on a size it carried), or the same
    request unstreamed after an empty event stream ("unstreamed")."""

    attempt: int
    wait: float
    failure_kind: FailureKind
    failure: Failure
    of: int = 1
    resend: Literal["suspect", "carried", "unstreamed"] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Sending(Event):
    """A request is leaving (``attempt`` 1 for the first try of this request, more for a
    resend after a retry or a recovery step): routine, told by the live panel and the
    turn card, not as a line of its own."""

    body_bytes: int
    attempt: int = 1
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamUsageMissing(Event):
    """The provider's streamed replies carry no usage (llama-cpp-python's server, servers
    that ignore ``stream_options.include_usage``): token counts then come from its
    unstreamed replies only. Told once per provider a session talks to."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRun(Event):
    """A tool call ran (``limit_reached``: the turn's tool-round limit; nothing ran).
    ``detail``: a failed call's error text (masked like every event text)."""

    name: str
    ok: bool
    chars: int = 0
    limit_reached: bool = False
    max_rounds: int = 0
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered(Event):
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed(Event):
    failure_kind: FailureKind
    sentence: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished(Event):
    history_bytes: int
    est_tokens: int
    window: int
    cap: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackgroundSummary(Event):
    """The summary prepared ahead of need (``session/background.py``).

    ``state``: ``preparing`` (a worker started it after a turn), ``ready``, ``failed`` (one
    line, never a failed cell; ``reason`` says why), ``swapped`` (a turn that needed room
    used it: ``covered_messages`` replaced, sizes before and after), ``discarded`` (the
    messages it covered changed, or the history did by other means).
    """

    state: Literal["preparing", "ready", "failed", "swapped", "discarded"]
    covered_messages: int = 0
    before_messages: int = 0
    after_messages: int | None = None
    before_bytes: int = 0
    after_bytes: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    """What the summary's requests were billed (``ready``, ``failed``): its input (of which
    cache reads and writes) and output tokens, paid for in the turn that tells it."""
    cache_write_1h_tokens: int = 0
    """Of ``cache_write_tokens``, those written with a one-hour TTL."""
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCompacted(Event):
    """The provider compacted the conversation on its server (``docs/server-compaction.md``):
    its compaction message replaced ``replaced_messages`` messages of the working history
    (the transcript keeps them), which went from ``before_bytes`` to ``after_bytes``
    (request bytes, as the history is measured). ``summary_chars``: the length of the
    server's readable summary, None for an opaque one (OpenAI's encrypted item);
    ``trigger_tokens`` the trigger the request carried."""

    wire: str
    replaced_messages: int
    before_bytes: int
    after_bytes: int
    summary_chars: int | None = None
    trigger_tokens: int | None = None
    prompt_tokens: int | None = None
    """The compaction's own usage, as the reply reported it apart from the answer's
    (None: not reported): its input, of which ``cached_tokens`` read from the cache and
    ``cache_write_tokens`` written, and its output (the summary)."""
    completion_tokens: int | None = None
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    """Of ``cache_write_tokens``, those written with a one-hour TTL."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCompactionNote(Event):
    """Told once a session about the ``server_compaction`` setting in force:
    ``unsupported_model`` ("on", a model not known to compact on its server: asked all the
    same), ``unsupported_api`` ("on", an API that cannot carry it: the package compacts as
    before), ``clamped`` (the budget's trigger, ``derived_tokens`` set by ``of``, is below
    the server's lowest, ``trigger_tokens``: the package keeps the body within it),
    ``not_compacting`` (a reply to ``derived_tokens`` input tokens, past the trigger, came
    without a compaction: the package compacts itself from then on)."""

    note: Literal["unsupported_model", "unsupported_api", "clamped", "not_compacting"]
    model: str = ""
    trigger_tokens: int = 0
    derived_tokens: int = 0
    of: Literal["window", "cap"] | None = None


EventCallback = Callable[[Event], None]
