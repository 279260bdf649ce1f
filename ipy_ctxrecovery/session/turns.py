"""TurnRunner: one user turn as round trips — tool rounds and ``max_tokens`` continuation.

    answer = send (with recovery); while it was cut at max_tokens: escalate, continue,
    stitch (SPEC §4); while it asks for tools: run them, append their results, go round
    again (at most ``settings.max_tool_rounds``).

:class:`ToolBox` holds the tools a session offers (the built-in ``read_file`` and the
user's). What the transcript records is decided here through the ``record`` callback:
the user's message, each assistant answer as the user sees it (one stitched message for
a continued answer), tool calls and their full results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..core import continuation as escalation
from ..core.events import Escalation, StreamUsageMissing, ToolRun, Truncated
from ..core.history import (
    TAG_CONTINUATION,
    History,
    Message,
    ToolCall,
    is_server_compaction,
    storable,
    unstorable_at,
)
from ..errors import ChatError
from ..providers.base import Response, StopReason, TextCallback, ToolSpec
from ..settings import Settings
from .deadline import Check, checker
from .recovery import RecoveryLoop
from .sizing import RequestSpec
from .tools import Tool
from .turn_log import EventBus, Shrink, TurnLog

__all__ = ["ToolBox", "TurnResult", "TurnRunner"]

_tag = operator.attrgetter("tag")

TOOL_LIMIT_RESULT = (
    "[Tool call not run: this turn reached its limit of {n} tool rounds. "
    "Answer with what you have so far.]"
)


def _never() -> bool:
    return False


def _ignore(_history: History) -> None:
    return None


class ToolBox:
    """The tools a session offers: built-in ones (``read_file``) and the user's."""

    def __init__(self, builtin: Iterable[Tool] = (), user: Iterable[Tool] = ()) -> None:
        self._builtin = {t.name: t for t in builtin}
        self._user = {t.name: t for t in user}
        self._builtin_off = False
        self._later: dict[str, Tool] = {}
        self._offer_later: Callable[[], bool] = _never
        self._note: Callable[[History], None] = _ignore

    def offer_after_compaction(self, tools: Iterable[Tool], when: Callable[[], bool],
                               note: Callable[[History], None]) -> None:
        """Offer ``tools`` (the built-in recall) while ``when()`` says the session has
        compacted, never before: a session that never compacts sends the same tools as
        without them (its prompt cache stays). ``note`` sees the history each round of a
        turn starts from (:meth:`round_starts`), so a compaction made while a request was
        being recovered offers them from the next round on — never inside the recovery,
        whose fit measured the request with the tools it had. ``offering(builtin=False)``
        (a cell's ``--no-read-file``) does not hide them. They run when called."""
        self._later = {t.name: t for t in tools}
        self._offer_later = when
        self._note = note

    def round_starts(self, history: History) -> None:
        """A round of a turn is about to be sent with ``history``."""
        self._note(history)

    @property
    def after_compaction(self) -> tuple[Tool, ...]:
        """The tools offered only after a compaction (``%chat tools`` lists them)."""
        return tuple(self._later.values())

    def _offered_later(self) -> dict[str, Tool]:
        return self._later if self._later and self._offer_later() else {}

    def replace(self, user: Iterable[Tool]) -> None:
        """Offer ``user`` tools from now on, beside the built-in ones."""
        self._user = {t.name: t for t in user}

    def replace_builtin(self, builtin: Iterable[Tool]) -> None:
        self._builtin = {t.name: t for t in builtin}

    @property
    def _tools(self) -> dict[str, Tool]:
        builtin = {} if self._builtin_off else self._builtin
        return {**builtin, **self._user}

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools offered now (those offered after a compaction once the session has
        compacted)."""
        return tuple({**self._tools, **self._offered_later()}.values())

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for t in {**self._tools, **self._offered_later()}.values())

    def default_specs(self) -> tuple[ToolSpec, ...]:
        """The tools offered outside any :meth:`offering` block (the session's own set)."""
        return tuple(t.spec for t in {**self._builtin, **self._user,
                                      **self._offered_later()}.values())

    @contextlib.contextmanager
    def offering(self, *, builtin: bool = True) -> Iterator[None]:
        """Within the block, offer the built-in tools only if ``builtin``."""
        before, self._builtin_off = self._builtin_off, self._builtin_off or not builtin
        try:
            yield
        finally:
            self._builtin_off = before

    def run(self, call: ToolCall, check: Check | None = None) -> tuple[str, bool]:
        """(content, is_error) for one call; an unknown tool is an error result.
        ``check``: the turn's deadline, for a tool that takes one (``Tool.checked``)."""
        tool = self._tools.get(call.name) or self._later.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return f"Error: there is no tool named {call.name!r} (tools: {known}).", True
        return tool.run(call.arguments, check)


@dataclass(frozen=True, slots=True)
class TurnResult:
    history: History          # the history sent, plus the answer and tool rounds
    answer: Message           # the final assistant message (stitched when continued)
    stop: StopReason
    spec: RequestSpec         # the spec in force at the end (max_tokens may have changed)


class _Shown:
    """``on_text`` for one answer: the deltas go through as they come, a continuation's
    through :class:`~..core.continuation.StreamedJoin`, so the screen reads as the
    stitched answer (the repeat the join drops is not shown twice)."""

    def __init__(self, on_text: TextCallback) -> None:
        self._on_text = on_text
        self._pieces: list[str] = []
        self._join: escalation.StreamedJoin | None = None

    def start(self, resume: escalation.Resume, parts: list[str]) -> None:
        """A request for the answer begins (a continuation when ``parts`` is not empty)."""
        self._join = None
        if parts:
            self._join = escalation.StreamedJoin(resume, parts, "".join(self._pieces))

    def __call__(self, delta: str) -> None:
        if self._join is not None:
            delta = self._join.feed(delta)
            if not delta:
                return
        self._pieces.append(delta)
        self._on_text(delta)

    def finish(self) -> None:
        """The request ended: show what a continuation still held back."""
        if self._join is not None:
            rest = self._join.flush()
            self._join = None
            if rest:
                self._pieces.append(rest)
                self._on_text(rest)


class TurnRunner:
    """Runs one turn to its final answer (see the module docstring)."""

    def __init__(self, recovery: RecoveryLoop, tools: ToolBox, bus: EventBus,
                 settings: Settings, mask: Callable[[str], str] = str) -> None:
        self.recovery = recovery
        self.tools = tools
        self.bus = bus
        self.settings = settings
        self._mask = mask     # a tool result is persisted and sent: the session's key goes
        self._told_no_stream_usage: object = None     # the provider it was said of
        self._record_compaction: Callable[[Message], None] | None = None
        """The turn's ``record``: a server compaction is kept in the transcript too."""

    def run(self, history: History, spec: RequestSpec, log: TurnLog,
            on_text: TextCallback | None,
            record: Callable[[Message], None] | None) -> TurnResult:
        """Round trips until the model answers without tool calls (or a bound is reached)."""
        rounds = 0
        limit_told = False
        max_rounds = self.settings.max_tool_rounds
        self._record_compaction = record
        while True:
            self.tools.round_starts(history)
            history, answer, stop, spec = self._answer(history, spec, log, on_text)
            answer = storable(answer)     # what is kept in memory is what can be saved
            if record is not None:
                record(answer)
            history = history + (answer,)
            if not answer.tool_calls:
                return TurnResult(history, answer, stop, spec)
            rounds += 1
            over = rounds > max_rounds
            results = []
            for call in answer.tool_calls:
                if over:
                    # Every call gets an answer, so the history stays valid.
                    result = Message.tool(call.id, TOOL_LIMIT_RESULT.format(n=max_rounds),
                                          is_error=True, name=call.name)
                else:
                    result = self._run_tool(call, log)
                if record is not None:
                    record(result)
                results.append(result)
            history = history + tuple(results)
            if over:
                if limit_told:
                    return TurnResult(history, answer, StopReason.TOOL_CALLS, spec)
                limit_told = True
                self.bus.emit(ToolRun(name=answer.tool_calls[0].name, ok=False,
                                      limit_reached=True, max_rounds=max_rounds), log)

    def _run_tool(self, call: ToolCall, log: TurnLog) -> Message:
        content, is_error = self.tools.run(call, checker(
            log.deadline, self.settings.turn_timeout or 0, f"the tool {call.name}"))
        content = self._mask(content)
        if unstorable_at(content) is not None:
            content = storable(Message.tool(call.id, content)).text
        self.bus.emit(ToolRun(name=call.name, ok=not is_error, chars=len(content),
                              detail=content[:500] if is_error else ""), log)
        return Message.tool(call.id, content, is_error=is_error, name=call.name)

    def _note_stream_usage(self, response: Response, log: TurnLog) -> None:
        """Say once per provider that its streamed replies carry no usage: the session's
        token calibration (``LearnedLimits.on_success``) takes usage only where a reply
        reports it, so such a server calibrates from its unstreamed replies alone."""
        if not response.streamed or response.usage.reported:
            return
        provider = self.recovery.endpoint.provider
        if self._told_no_stream_usage is provider:
            return
        self._told_no_stream_usage = provider
        self.bus.emit(StreamUsageMissing(), log)

    def _answer(self, history: History, spec: RequestSpec, log: TurnLog,
                on_text: TextCallback | None,
                ) -> tuple[History, Message, StopReason, RequestSpec]:
        """One answer from the model, continued past ``max_tokens`` stops and stitched.

        Returns the history that was sent (compacted as needed, without the partial answers
        and continuation prompts), the stitched assistant message, its stop reason and the
        spec in force afterwards.
        """
        parts: list[str] = []
        escalations = 0
        cut_at = 0                      # the max_tokens the last partial answer was cut at
        incomplete = ""                 # why the answer is kept cut ("" while it is not)
        resume = escalation.resume_for(self.recovery.endpoint.provider, spec.options)
        shown = _Shown(on_text) if on_text is not None else None
        while True:
            request_history = history + resume.messages(parts)
            if shown is not None:
                shown.start(resume, parts)
            failure: ChatError | None = None
            try:
                sent = self.recovery.send(request_history, spec, log, shown)
            except ChatError as e:
                if not parts:
                    raise
                failure = e             # a continuation failed: the answer so far stays
            finally:
                if shown is not None:
                    shown.finish()
            if failure is not None:
                incomplete = self._not_continued(
                    f"the continuation request failed: {str(failure).rstrip('.')}", cut_at,
                    escalations, log)
                message, stop = Message.assistant(), StopReason.LENGTH
                break
            spec = sent.spec
            response = sent.response
            history = sent.history
            self._note_stream_usage(response, log)
            if TAG_CONTINUATION in map(_tag, history):   # rarely: looked for at C speed
                history = tuple(m for m in history if m.tag != TAG_CONTINUATION)
            history, message = self._server_side(history, response, spec, log)
            stop = response.stop
            if parts and not message.tool_calls and stop is not StopReason.LENGTH:
                why = _unjoinable(resume.join_report(parts, message.text), stop)
                if why:
                    incomplete = self._not_continued(why, cut_at, escalations, log)
                    message, stop = Message.assistant(), StopReason.LENGTH
                    break
            if stop is not StopReason.LENGTH:
                break
            # With no explicit max_tokens, where the answer was cut is the limit in force.
            current = spec.max_tokens or response.usage.completion_tokens \
                or self.recovery.sizer.output_cap
            nxt = escalation.next_max_tokens(
                current, escalations, model_cap=self.recovery.sizer.output_cap,
                max_escalations=self.settings.max_token_escalations)
            if nxt is None:
                # Out of escalations: the answer is kept as it is, cut — say so.
                self.bus.emit(Truncated(max_tokens=current, escalations=escalations), log)
                incomplete = (f"still cut at max_tokens={current} after "
                              f"{escalations} escalations")
                break
            escalations += 1
            self.bus.emit(Escalation(attempt=escalations, max_tokens=nxt, previous=current,
                                     of=self.settings.max_token_escalations), log)
            spec = spec.with_max_tokens(nxt)
            if message.tool_calls:
                continue        # a cut tool call cannot be continued: ask again, larger
            parts.append(message.text)
            cut_at = current
        if parts:
            # (A continuation that could not be joined left an empty message: the parts.)
            text = resume.join([*parts, message.text])
            message = Message.assistant(text, message.tool_calls)
        if incomplete and not message.tool_calls:
            # The history keeps the answer as it is, and says it is incomplete.
            message = dataclasses.replace(message, meta={**message.meta,
                                                         escalation.INCOMPLETE: incomplete})
        return history, message, stop, spec

    def _server_side(self, history: History, response: Response, spec: RequestSpec,
                     log: TurnLog) -> tuple[History, Message]:
        """The reply as the provider's own context management leaves it: the edits it
        applied told, and a server compaction split off the answer — its message replaces
        every message before it (``server_side.py``), undoably; the transcript keeps them
        and gets the compaction too."""
        sizer = self.recovery.sizer
        new, message, events = sizer.server.take(history, response, sizer.measurer(spec))
        if new is not history:
            log.shrinks.append(Shrink("compaction", history, len(new)))
            if self._record_compaction is not None:
                compaction = next(m for m in new if is_server_compaction(m))
                self._record_compaction(compaction)
        for event in events:
            self.bus.emit(event, log)
        return new, message

    def _not_continued(self, why: str, cut_at: int, escalations: int, log: TurnLog) -> str:
        """Say that the answer cut at ``cut_at`` could not be continued, and why."""
        self.bus.emit(Truncated(max_tokens=cut_at, escalations=escalations, failed=why), log)
        return f"cut at max_tokens={cut_at} and not continued: {why}"


def _unjoinable(joined: escalation.Joined, stop: StopReason) -> str:
    """Why a continuation that ended (not cut again) could not be joined ('' when it was):
    the model refused, or everything it wrote was dropped at the join."""
    if stop is StopReason.FILTERED:
        return "the model refused to continue"
    if joined.failed:
        return "all the model wrote was " + " and ".join(joined.dropped)
    return ""
