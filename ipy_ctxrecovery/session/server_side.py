"""ServerSide: the session's use of the provider's own context management — server
compaction and context editing (``docs/server-compaction.md``).

The decisions are the core's (``core/server_compaction.py``); this part reads what they
need from the session (the setting, the model, the provider's API, the chat budget with
what was learned), builds each request's :class:`~..providers.base.ContextManagement`,
tells the setting's notes once a session, and turns a reply that carries a server
compaction into the history it leaves.

Which APIs can carry it: Anthropic's Messages (``wire == "anthropic"``) and OpenAI's
Responses API. A provider says so itself with a ``server_compaction`` attribute (True or
False) when it has one; otherwise an OpenAI provider is taken to carry it only when its
``api`` is ``"responses"`` (Chat Completions has no server compaction).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import compactor, wording
from ..core import server_compaction as sc
from ..core.events import Event, MicrocompactApplied, ServerCompacted, ServerCompactionNote
from ..core.history import History, Message
from ..providers.base import ClearToolUses, ContextManagement, Response

if TYPE_CHECKING:
    from .sizing import RequestSizer

__all__ = ["KEEP_TOOL_USES", "ServerSide", "api_supports"]

KEEP_TOOL_USES = 3
"""The latest tool uses a ``clear_tool_uses`` edit keeps (Anthropic's default)."""


def api_supports(provider: object) -> bool:
    """Whether ``provider``'s API can carry a server compaction (see the module docstring)."""
    said = getattr(provider, "server_compaction", None)
    if isinstance(said, bool):
        return said
    wire = getattr(provider, "wire", None)
    if wire == "anthropic":
        return True
    return wire == "openai" and getattr(provider, "api", None) == "responses"


class ServerSide:
    """One session's server compaction: asked or not, its trigger, its notes, its replies."""

    def __init__(self, sizer: RequestSizer) -> None:
        self.sizer = sizer
        self._told: set[str] = set()
        self._last_clearable: tuple[History, float, int] | None = None

    # -- the decision ----------------------------------------------------------------------
    def decision(self) -> sc.Use:
        sizer = self.sizer
        return sc.use(sizer.settings.server_compaction,
                      model_supports=sizer.endpoint.info.server_compaction,
                      api_supports=api_supports(sizer.endpoint.provider))

    def trigger(self) -> sc.Trigger:
        """The trigger from the chat budget (the window in force — a guessed one too, as
        the server needs a number — and the payload cap, at the calibrated bytes/token),
        clamped up to the server's lowest."""
        sizer = self.sizer
        bpt = sizer.limits.tokens.bytes_per_token
        budget = compactor.chat_budget(sizer.settings, window_tokens=sizer.window,
                                       bytes_per_token=bpt, cap=sizer.limits.caps.effective(),
                                       ratio=sizer.settings.chat_budget_ratio)
        return sc.trigger(budget, bytes_per_token=bpt,
                          min_trigger=sizer.endpoint.info.min_compact_trigger)

    def compacts(self) -> bool:
        """Whether the server keeps the window now (then no client LLM summary for it):
        asked, carried, not clamped — and not shown to ignore the ask."""
        decision = self.decision()
        if not decision.asked or self.sizer.limits.server_did_not_compact:
            return False
        return sc.server_compacts(decision, self.trigger())

    def status_words(self) -> str | None:
        """What ``%chat status`` says of it (None: not asked)."""
        decision = self.decision()
        if not decision.asked:
            return None
        when = self.trigger()
        return wording.server_status(carried=decision.carried, compacts=self.compacts(),
                                     trigger_tokens=when.tokens,
                                     ignored=self.sizer.limits.server_did_not_compact)

    # -- the request -----------------------------------------------------------------------
    def context(self, history: History) -> ContextManagement | None:
        """What a request of ``history`` asks of the provider's context management (None:
        nothing). Context editing (``clear_tool_uses``) is asked on the Anthropic wire while
        the server compacts and the old tool results weigh ``microcompact_clear_at_least``
        tokens or more; it clears from where a compaction would leave the history."""
        decision = self.decision()
        if not decision.asked:
            return None
        when = self.trigger()
        clear = None
        settings = self.sizer.settings
        anthropic = getattr(self.sizer.endpoint.provider, "wire", None) == "anthropic"
        if anthropic and sc.server_compacts(decision, when) \
                and self._clearable(history) >= settings.microcompact_clear_at_least:
            clear = ClearToolUses(
                trigger=max(1, int(when.tokens * settings.compaction_target_fraction)),
                keep=KEEP_TOOL_USES, clear_at_least=settings.microcompact_clear_at_least)
        return ContextManagement(compact_trigger=when.tokens, clear_tool_uses=clear)

    def _did_not_compact(self, response: Response) -> list[Event]:
        """A reply without a compaction to a request past the trigger (by the server's own
        count, with a tenth to spare): this server does not compact — learned, told once,
        and the package compacts itself from then on (a model "on" asked that lacks it)."""
        prompt = response.usage.prompt_tokens
        if prompt is None or not self.compacts():
            return []
        when = self.trigger()
        if prompt <= when.tokens * 1.1:
            return []
        self.sizer.limits.server_did_not_compact = True
        return [ServerCompactionNote(note="not_compacting", trigger_tokens=when.tokens,
                                     derived_tokens=prompt)]

    def _clearable(self, history: History) -> int:
        """``clearable_tool_tokens`` of ``history``, once per history (a fit measures the
        same candidate several times, each measure building its request)."""
        bpt = self.sizer.limits.tokens.bytes_per_token
        last = self._last_clearable
        if last is not None and last[0] is history and last[1] == bpt:
            return last[2]
        tokens = sc.clearable_tool_tokens(history, keep=KEEP_TOOL_USES, bytes_per_token=bpt)
        self._last_clearable = (history, bpt, tokens)
        return tokens

    def notes(self) -> list[Event]:
        """The setting's notes not told yet this session (each once)."""
        decision = self.decision()
        found: list[Event] = []
        if decision.note is not None and decision.note not in self._told:
            self._told.add(decision.note)
            found.append(ServerCompactionNote(note=decision.note,
                                              model=self.sizer.endpoint.model))
        if decision.asked and decision.carried:
            when = self.trigger()
            if when.clamped and "clamped" not in self._told:
                self._told.add("clamped")
                found.append(ServerCompactionNote(note="clamped", trigger_tokens=when.tokens,
                                                  derived_tokens=when.derived, of=when.of))
        return found

    # -- the reply -------------------------------------------------------------------------
    def take(self, history: History, response: Response, measure: Callable[[History], int],
             ) -> tuple[History, Message, list[Event]]:
        """``history`` (what was sent) and the reply's message as the reply leaves them:
        with a server compaction, the history it leaves (``core.server_compaction``) and
        the answer after it (sizes by ``measure``); and the events to tell — the compaction and the context
        edits the server applied (in microcompact's event)."""
        events: list[Event] = []
        cleared = [e for e in response.edits if e.kind == "clear_tool_uses"]
        if cleared:
            events.append(MicrocompactApplied(
                truncated=0, summarized=sum(e.cleared_items for e in cleared), bytes_freed=0,
                on_server=True, cleared_tokens=sum(e.cleared_tokens for e in cleared)))
        compaction, message = sc.split_reply(response.message)
        if compaction is None:
            events.extend(self._did_not_compact(response))
            return history, message, events
        block = sc.compaction_of(compaction)
        assert block is not None
        new = sc.replace_before(history, compaction, settings=self.sizer.settings)
        kept = sum(1 for m in new if m is not compaction)
        own = response.usage.compaction
        events.append(ServerCompacted(
            wire=block.wire, replaced_messages=len(history) - kept,
            before_bytes=measure(history), after_bytes=measure(new),
            summary_chars=None if block.summary is None else len(block.summary),
            trigger_tokens=self.trigger().tokens,
            # Its own usage (reported apart from the answer's): what the card prices.
            prompt_tokens=None if own is None else own.prompt_tokens,
            completion_tokens=None if own is None else own.completion_tokens,
            cached_tokens=0 if own is None else own.cached_tokens,
            cache_write_tokens=0 if own is None else own.cache_write_tokens,
            cache_write_1h_tokens=0 if own is None else own.cache_write_1h_tokens))
        return new, message, events
