"""A dry run of the preparation pipeline: what the next request would be, sending nothing.

:func:`trace` builds a :class:`~.pipeline.Preparer` of its own around copies of what a
session knows — its endpoint (only to measure; nothing is sent), a copy of its learned
limits, a result store that keeps previews in memory — with the LLM summary replaced by a
size model of it (:func:`estimated_summary`, labelled as an estimate). It records the
history after each step (microcompact, budget, compaction, fit), the compaction trigger and
target pre-flight chose and what the summarizer would have been given, and returns them
with the :class:`~.pipeline.Prepared` request (:class:`DryTrace`); :func:`dry_run` returns
just the request. The session, its files and its learned limits are untouched.

A dry run measures the body (``provider.measure``, exact for the built-in adapters) where
a send encodes it: the bytes are never sent, and encoding through the SDK costs a hundred
times more, which a what-if recomputed on every slider move cannot afford.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.budget import ResultStore
from ..core.compactor import ChatBudget, CompactionReport
from ..core.facts import extract
from ..core.history import History
from ..core.prompts import SUMMARY_CODE_SECTIONS, SUMMARY_SECTIONS, summary_header
from ..emulator.replies import summary_answer
from ..errors import ChatError
from ..providers import is_emulator_model
from ..providers.base import Measurable, Request
from ..settings import Settings
from .compaction import SessionCompactor
from .endpoint import Endpoint
from .learned import LearnedLimits
from .pipeline import Prepared, Preparer
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, TurnLog
from .turns import ToolBox

__all__ = ["ESTIMATE_MARK", "DryTrace", "MemoryStore", "dry_run", "estimated_summary",
           "summarizer_for", "trace"]

ESTIMATE_MARK = "(estimated summary: a dry run asks no model)"
"""The first line of a summary the dry run made up; its size is the estimate."""

_SECTIONS = (*SUMMARY_SECTIONS, *SUMMARY_CODE_SECTIONS)
SUMMARY_SHARE = 0.1
"""A summary is estimated at a tenth of its input, within the summarizer's bounds."""


class MemoryStore(ResultStore):
    """A result store that writes nothing: previews name the path a real run would use."""

    def __init__(self, real: ResultStore) -> None:
        super().__init__(real.directory)
        self._real = real
        self._kept: dict[Path, str] = {}

    def persist(self, content: str) -> Path:
        path = self.path_for(content)
        self._kept[path] = content
        return path

    def load(self, path: Path | str) -> str | None:
        kept = self._kept.get(Path(path))
        return kept if kept is not None else self._real.load(path)


def estimated_summary(text: str, max_tokens: int, *, bytes_per_token: float = 4.0) -> str:
    """A stand-in summary of ``text`` with the size a real one is expected to have."""
    budget = int(max(200, min(len(text) * SUMMARY_SHARE, max_tokens * bytes_per_token)))
    body = "\n".join(f"## {name}\n- …" for name in _SECTIONS)
    filler = max(0, budget - len(body) - len(ESTIMATE_MARK) - 2)
    # The filler quotes the input's latest facts, as a real summary keeps some (one that
    # keeps none is refused: core/summary_check.py).
    kept = "".join(f"{f.text} " for f in reversed(extract(text)))[:filler]
    return f"{summary_header(0)}\n{ESTIMATE_MARK}\n{body}\n{kept}" + "x" * (filler - len(kept))


def summarizer_for(endpoint: Endpoint, limits: LearnedLimits) -> Callable[[str, int], str]:
    """The summary a dry run or a what-if plans with: on the emulator, the one it will
    really write (it is deterministic); else a stand-in of the expected size."""
    emulator = endpoint.emulator if endpoint.emulator is not None \
        else getattr(endpoint.provider, "emulator", None)
    if emulator is not None and is_emulator_model(endpoint.provider.model):
        return summary_answer
    return lambda text, tokens: estimated_summary(
        text, tokens, bytes_per_token=limits.tokens.bytes_per_token)


# -- the traced pipeline -------------------------------------------------------------------

@dataclass
class DryTrace:
    """What a dry run saw, step by step (see the module docstring).

    ``stages``: (step name, history after it), starting with ``("input", history)``; a
    step that changed nothing still appears, with the same tuple. ``refused``: the
    sentence pre-flight refused the request with (then ``prepared`` is None).
    ``trigger``/``target``: the compaction trigger pre-flight compared the body with and
    the target compaction aimed at (None when it did not compact); ``budget``: that trigger
    with what it is a share of, and ``budget_ratio`` the window share pre-flight asked for
    (None: ``chat_budget_ratio``, a chat's own). ``summary_input``:
    characters the summarizer would have been sent, over all its requests (None: no summary
    was asked for; ``compaction`` says how many requests and chunks).
    """

    spec: RequestSpec
    sizer: RequestSizer
    limits: LearnedLimits
    store: MemoryStore
    stages: list[tuple[str, History]] = field(default_factory=list)
    prepared: Prepared | None = None
    refused: ChatError | None = None
    trigger: int | None = None
    target: int | None = None
    budget: ChatBudget | None = None
    budget_ratio: float | None = None
    compaction: CompactionReport | None = None
    summary_input: int | None = None
    summary_chars: int | None = None

    def stage(self, name: str) -> History | None:
        """The history after step ``name`` (None when that step did not run)."""
        for step, history in self.stages:
            if step == name:
                return history
        return None


class _DrySizer(RequestSizer):
    """A sizer that measures instead of encoding (nothing is sent) and notes the
    compaction trigger and target pre-flight asks for."""

    record: DryTrace | None = None

    def encode(self, request: Request) -> tuple[Request, bytes]:
        # Only the length of a dry run's body is ever read: a zeroed stand-in of that size.
        provider = self.endpoint.provider
        size = provider.measure(request) if isinstance(provider, Measurable) \
            else len(provider.encode(request))
        return request, bytes(int(size))

    def compaction_trigger(self, ratio: float | None = None, *,
                           bytes_per_token: float | None = None) -> int:
        budget = self.chat_budget(ratio, bytes_per_token=bytes_per_token)
        if self.record is not None and self.record.trigger is None:
            self.record.trigger = budget.bytes
            self.record.budget, self.record.budget_ratio = budget, ratio
        return budget.bytes

    def compaction_target(self, ratio: float | None = None) -> int:
        value = super().compaction_target(ratio)
        if self.record is not None and self.record.target is None:
            self.record.target = value
        return value


class _TracingCompactor(SessionCompactor):
    record: DryTrace

    def run(self, history: History, target: int, spec: RequestSpec, log: TurnLog | None,
            **options: Any) -> tuple[History, CompactionReport]:
        compacted, report = super().run(history, target, spec, log, **options)
        self.record.compaction = report
        self.record.stages.append(("compaction", compacted))
        return compacted, report


class _TracingPreparer(Preparer):
    record: DryTrace

    def microcompact(self, history: History, log: TurnLog) -> History:
        out = super().microcompact(history, log)
        self.record.stages.append(("microcompact", out))
        return out

    def budget(self, history: History, log: TurnLog) -> History:
        out = super().budget(history, log)
        self.record.stages.append(("budget", out))
        return out

    def fit_known_limits(self, history: History, body: int, reserve: int | None,
                         spec: RequestSpec, target: int, log: TurnLog, *,
                         after_compaction: bool) -> History:
        out = super().fit_known_limits(history, body, reserve, spec, target, log,
                                       after_compaction=after_compaction)
        self.record.stages.append(("fit", out))
        return out


def trace(history: History, spec: RequestSpec, *, endpoint: Endpoint, limits: LearnedLimits,
          tools: ToolBox, store: ResultStore, settings: Settings,
          current: Settings | None = None, after: Preparer | None = None) -> DryTrace:
    """Run the preparation pipeline on ``history`` without sending or changing anything,
    recording every step (:class:`DryTrace`).

    ``after``: the session's preparer, whose previous request this one follows (batched
    rewrites wait or not as they will when the request is sent); None: a first request.

    ``settings`` are the ones to try; ``current`` the ones ``limits`` were learned under
    (when they differ, the configured cap and window follow ``settings``). A request
    pre-flight refuses (it cannot fit even alone) is reported in ``refused``, not raised.
    """
    own_limits = copy.deepcopy(limits)    # its path limits too: a dry run learns nothing
    if current is not None and current != settings:
        own_limits.configure(current, settings)
    bus = EventBus()
    memory = MemoryStore(store)
    sizer = _DrySizer(endpoint, own_limits, settings, tools.specs)
    record = DryTrace(spec=spec, sizer=sizer, limits=own_limits, store=memory,
                      stages=[("input", history)])
    sizer.record = record

    planned = summarizer_for(endpoint, own_limits)

    def summarize(text: str, tokens: int, _log: TurnLog | None = None) -> str:
        # A chunked summary sends several requests: all they carry.
        record.summary_input = (record.summary_input or 0) + len(text)
        summary = planned(text, tokens)
        record.summary_chars = len(summary)
        return summary

    compactor = _TracingCompactor(sizer, bus, settings, summarize=summarize)
    compactor.record = record
    preparer = _TracingPreparer(sizer, compactor, memory, bus, settings)
    preparer.record = record
    if after is not None:
        preparer.follow(after)
    try:
        record.prepared = preparer.prepare(history, spec, TurnLog())
    except ChatError as e:
        record.refused = e
    return record


def dry_run(history: History, spec: RequestSpec, *, endpoint: Endpoint,
            limits: LearnedLimits, tools: ToolBox, store: ResultStore,
            settings: Settings, current: Settings | None = None,
            after: Preparer | None = None) -> Prepared:
    """Run the preparation pipeline on ``history`` without sending or changing anything.

    ``settings`` are the ones to try; ``current`` the ones ``limits`` were learned under
    (when they differ, the configured cap and window follow ``settings``). Raises the
    :class:`ChatError` a send would raise before sending (a message that cannot fit).
    """
    result = trace(history, spec, endpoint=endpoint, limits=limits, tools=tools, store=store,
                   settings=settings, current=current, after=after)
    if result.refused is not None:
        raise result.refused
    assert result.prepared is not None
    return result.prepared
