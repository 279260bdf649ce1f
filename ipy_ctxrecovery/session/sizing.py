"""The shape and size of one request: :class:`RequestSpec` and :class:`RequestSizer`.

A :class:`RequestSpec` is what a caller asked for besides the messages (``max_tokens``,
model options, streaming); it travels through the pipeline as one value. The
:class:`RequestSizer` knows the limits in force (the window and output cap, with what was
learned), builds requests and sizes them: the provider's fast ``measure`` when it has one
(exact for the built-in adapters, from memoized per-message sizes), else ``len(encode())``.
Nothing here encodes the body that is sent: the provider does, once, when it sends.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..core import compactor
from ..core.catalogue import lookup
from ..core.history import History, Message, Role, latest_user_index
from ..core.thinking import ThinkingFit, fit_thinking
from ..providers.base import (
    AdvertisesWindow,
    Caching,
    Prepared,
    Request,
    ToolSpec,
    prepare,
)
from ..settings import Settings
from .endpoint import Endpoint
from .learned import LearnedLimits
from .server_side import ServerSide

__all__ = ["RequestSizer", "RequestSpec"]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """Everything about a request but its messages."""

    max_tokens: int | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    stream: bool = False
    first_max_tokens: tuple[int | None, ...] = field(default=(), repr=False)
    """The max_tokens this spec was made with, once :meth:`with_max_tokens` changed it."""

    def with_max_tokens(self, max_tokens: int | None) -> RequestSpec:
        return dataclasses.replace(self, max_tokens=max_tokens,
                                   first_max_tokens=self.first_max_tokens or (self.max_tokens,))

    @property
    def asked_max_tokens(self) -> int | None:
        """The max_tokens asked for, before pre-flight, the ladder or an escalation changed
        it (None: the provider's default)."""
        return self.first_max_tokens[0] if self.first_max_tokens else self.max_tokens


class RequestSizer:
    """Limits in force, and the bytes of a request (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, limits: LearnedLimits, settings: Settings,
                 tools: Callable[[], tuple[ToolSpec, ...]]) -> None:
        self.endpoint = endpoint
        self.limits = limits
        self.settings = settings
        self._tools = tools
        self._prepared: Prepared | None = None
        # The system messages (with their places) of the last history asked about, so a
        # history extending it is scanned only past it; and the last request-alone size.
        self._systems: tuple[History, tuple[tuple[int, Message], ...]] = ((), ())
        self._alone: tuple[Any, Request, int] | None = None
        self.server = ServerSide(self)
        """The provider's server compaction and context editing (``server_side.py``)."""

    def with_limits(self, limits: LearnedLimits) -> RequestSizer:
        """A copy of this sizer under ``limits`` (a plan's own), whose server side reads
        them too: a trigger derived from a cap the plan learns is the one the run sends."""
        own = copy.copy(self)
        own.limits = limits
        own.server = ServerSide(own)
        return own

    # -- limits in force -------------------------------------------------------------------
    @property
    def window_known(self) -> bool:
        """The window is a fact — configured, in the catalogue, or reported by the provider —
        not the default guess for a model the catalogue does not know."""
        return (self.settings.context_window is not None or not self.endpoint.info.guessed
                or self.limits.window is not None or self.limits.server_window is not None)

    @property
    def window(self) -> int:
        """The window in tokens: configured or the model's, or a smaller one learned. A
        guessed window is at least what a reply has shown the model can hold."""
        base = self.settings.context_window or self.limits.server_window \
            or self.endpoint.info.context_window
        if not self.window_known:
            return max(base, self.limits.seen_tokens)
        return self.limits.window_for(base)

    @property
    def window_source(self) -> str:
        """Where :attr:`window` comes from, in the words the panel shows it with."""
        if self.limits.window is not None:
            return "learned from the provider"
        if not self.window_known:
            return "guessed"
        if self.settings.context_window is not None:
            return "configured"
        if self.limits.server_window is not None:
            return "reported by the server"
        # An emulator reports its own window; one other than the catalogue's was set on it
        # (``%chat emulator --context-window``, ``Emulator(context_window=...)``).
        if self.endpoint.on_emulator and \
                self.endpoint.info.context_window != lookup(self.endpoint.model).context_window:
            return "set on the emulator"
        return "model catalogue"

    def ask_server_window(self) -> None:
        """A guessed window: ask the server once (when it can say and the settings allow)."""
        limits, provider = self.limits, self.endpoint.provider
        if self.window_known or limits.asked_server or not self.settings.ask_server_window \
                or not isinstance(provider, AdvertisesWindow):
            return
        limits.asked_server = True
        limits.server_window = provider.advertised_window()

    @property
    def enforced_window(self) -> int | None:
        """The window pre-flight fits to: None while it is only a guess (then only a real
        limit — an overflow's numbers, the payload cap — makes the history shrink)."""
        return self.window if self.window_known else None

    @property
    def output_cap(self) -> int:
        """The most max_tokens may be: the model's output limit, or a lower learned one."""
        return self.limits.output_cap_for(self.endpoint.info.max_output_tokens)

    def default_max_tokens(self, spec: RequestSpec) -> int | None:
        """The max_tokens a request of ``spec`` carries when it sets none itself: one given
        as a model option, else the provider's own default (Anthropic always sends one);
        None when the body carries none."""
        for name in ("max_tokens", "max_completion_tokens"):
            value = spec.options.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        # ``isinstance(provider, DefaultsMaxTokens)`` is this hasattr, at ten times the cost
        # (asked several times a request).
        default: int | None = getattr(self.endpoint.provider, "default_max_tokens", None)
        return default

    def reserved_tokens(self, spec: RequestSpec) -> int | None:
        """The answer's reservation the request carries: asked for, or the default."""
        return spec.max_tokens if spec.max_tokens is not None else self.default_max_tokens(spec)

    def request_alone(self, history: History, spec: RequestSpec) -> tuple[int, int]:
        """(bytes, estimated tokens) of the request with every earlier message removed:
        the system messages and the latest user message — what no cut can shrink."""
        latest = latest_user_index(history)
        systems = self._system_messages(history)
        if latest is None:
            kept = tuple(m for _, m in systems)
        else:       # in history order: the latest request among the system messages
            at = bisect.bisect_left(systems, latest, key=lambda s: s[0])
            kept = (*(m for _, m in systems[:at]), history[latest],
                    *(m for _, m in systems[at:]))
        request = self.request(kept, spec.with_max_tokens(None))
        provider = self.endpoint.provider
        alone = self._alone
        if alone is not None and alone[0] is provider and alone[1] == request:
            size = alone[2]     # pre-flight asks twice a request (fits? room for the answer?)
        else:
            size = self.measure_request(request)
            self._alone = (provider, request, size)
        return size, self.estimate(size)

    def _system_messages(self, history: History) -> tuple[tuple[int, Message], ...]:
        """``history``'s system messages with their indices; only the messages after the
        last history asked about are looked at when ``history`` extends it (each turn's
        request extends the last one: O(new messages), the prefix compared at C speed)."""
        old, systems = self._systems
        start = len(old)
        if not (start <= len(history) and (history is old or history[:start] == old)):
            start, systems = 0, ()
        new = tuple((i, m) for i, m in enumerate(history[start:], start)
                    if m.role is Role.SYSTEM)
        if new:
            systems += new
        self._systems = (history, systems)
        return systems

    def answer_room(self, history: History, spec: RequestSpec,
                    window: int | None = None) -> int | None:
        """The most the answer may reserve so the request itself still fits ``window``
        (the enforced one by default): never below ``min_answer_tokens``; None when no
        window is enforced."""
        window = window if window is not None else self.enforced_window
        if window is None:
            return None
        _, request = self.request_alone(history, spec)
        room = window - request
        room -= math.ceil(max(room, 0) * self.settings.exact_fit_margin)
        return max(self.settings.min_answer_tokens, room)

    def chat_budget(self, ratio: float | None = None, *,
                    bytes_per_token: float | None = None) -> compactor.ChatBudget:
        """The compaction trigger (``chat_budget_ratio`` of the window by default) and what
        sets it, with the cap and calibration known now. ``bytes_per_token``: the exact
        ratio of a body the provider counted (exact pre-flight), for the trigger of that
        body alone."""
        return compactor.chat_budget(
            self.settings, window_tokens=self.enforced_window,
            bytes_per_token=bytes_per_token or self.limits.tokens.bytes_per_token,
            cap=self.limits.caps.effective(),
            ratio=ratio if ratio is not None else self.settings.chat_budget_ratio)

    def compaction_trigger(self, ratio: float | None = None, *,
                           bytes_per_token: float | None = None) -> int:
        return self.chat_budget(ratio, bytes_per_token=bytes_per_token).bytes

    def compaction_target(self, ratio: float | None = None) -> int:
        """Where compaction aims (hysteresis below the trigger), with the cap known now."""
        return compactor.compaction_target(self.compaction_trigger(ratio), self.settings)

    # -- bytes -------------------------------------------------------------------------------
    def request(self, history: History, spec: RequestSpec) -> Request:
        caching = self.caching
        keep = self.keep
        if caching is not None and keep is not None:
            kept = keep(history)
            if kept is not None:
                caching = dataclasses.replace(caching, keep=kept)
        fit = self.thinking_fit(spec)
        options = spec.options if fit is None else fit.options
        return Request(messages=history, max_tokens=spec.max_tokens, tools=self._tools(),
                       options=dict(options), stream=spec.stream, caching=caching,
                       context=self.server.context(history))

    def thinking_fit(self, spec: RequestSpec) -> ThinkingFit | None:
        """How a request of ``spec`` fits extended thinking's budget to the max_tokens it
        sends (``core/thinking.py``: its share of the max_tokens asked, or thinking off for
        the request), or None when the budget goes as asked."""
        first = spec.asked_max_tokens
        asked = first if first is not None else self.default_max_tokens(spec)
        return fit_thinking(spec.options, self.reserved_tokens(spec), asked)

    retention: Callable[[], str] | None = None
    """The cache retention the request asks for (``Caching.retention``; the preparer's
    :meth:`~.pipeline.Preparer.retention`); None: the provider's default."""

    keep: Callable[[History], int | None] | None = None
    """The leading messages of a history expected to be sent unchanged for a while
    (``Caching.keep``; the preparer's :meth:`~.pipeline.Preparer.keep`); None: no such
    breakpoint."""

    @property
    def caching(self) -> Caching | None:
        """The cache breakpoints a request asks for (``prompt_caching``); None when off.

        Placed at the fixed ``chars_per_token``, not the calibrated estimate: the body must
        not depend on what a summary request happened to calibrate, or a plan (``what_if``,
        which calibrates nothing) would measure other bytes than the request that runs. A
        breakpoint a little below the model's minimum is ignored by the API, not refused."""
        if not self.settings.prompt_caching:
            return None
        own = self.endpoint.on_own_service
        retention = self.retention() if self.retention is not None else "auto"
        return Caching(self.settings.chars_per_token, retention=retention,
                       key=self.endpoint.cache_key if own else None)

    def prepare(self, request: Request) -> Prepared:
        """Pre-flight's view of ``request``: its exact body size and the max_tokens the body
        carries, once per request (an equal request built again returns the same object).
        No body is kept: the provider encodes it once, when it sends."""
        if self._prepared is not None and self._prepared.request == request:
            return self._prepared
        self._prepared = prepare(self.endpoint.provider, request)
        return self._prepared

    def forget_encoding(self) -> None:
        """Drop what was prepared (after a send, or when the provider or tools changed)."""
        self._prepared = None

    @property
    def part_size(self) -> Callable[[Message], int] | None:
        """What one message adds to a body (the adapters' memoized ``message_size``), for
        fitting without re-measuring the history; None when the provider cannot tell."""
        part = getattr(self.endpoint.provider, "message_size", None)
        return part if callable(part) else None

    def measure(self, history: History, spec: RequestSpec) -> int:
        """A history's exact body size (the provider's fast ``measure``, from memoized
        message sizes; else ``len(encode())``), for searches, reports and pre-flight."""
        return self.measure_request(self.request(history, spec))

    def measure_request(self, request: Request) -> int:
        """A request's exact body size (see :meth:`measure`)."""
        provider = self.endpoint.provider
        # ``isinstance(provider, Measurable)`` is this check at ten times the cost.
        measure = getattr(provider, "measure", None)
        if measure is not None:
            return int(measure(request))
        return len(provider.encode(request))

    def measurer(self, spec: RequestSpec) -> Callable[[History], int]:
        """``measure`` bound to ``spec``: what the compactor and the ladder search with."""
        return lambda history: self.measure(history, spec)

    def estimate(self, body_bytes: int) -> int:
        return self.limits.tokens.estimate(body_bytes)
