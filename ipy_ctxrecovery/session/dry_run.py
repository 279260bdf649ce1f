"""A dry run of the preparation pipeline: what the next request would be, sending nothing.

:func:`dry_run` builds a :class:`~.pipeline.Preparer` of its own around copies of what a
session knows — its endpoint (only to measure and encode; nothing is sent), a copy of its
learned limits, a result store that keeps previews in memory — with the LLM summary
replaced by a size model of it (:func:`estimated_summary`, labelled as an estimate). It
returns the :class:`~.pipeline.Prepared` request and every step it took; the session, its
files and its learned limits are untouched.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ..core.budget import ResultStore
from ..core.history import History
from ..core.prompts import summary_header
from ..settings import Settings
from .compaction import SessionCompactor
from .endpoint import Endpoint
from .learned import LearnedLimits
from .pipeline import Prepared, Preparer
from .sizing import RequestSizer, RequestSpec
from .turn_log import EventBus, TurnLog
from .turns import ToolBox

__all__ = ["ESTIMATE_MARK", "MemoryStore", "dry_run", "estimated_summary"]

ESTIMATE_MARK = "(estimated summary: a dry run asks no model)"
"""The first line of a summary the dry run made up; its size is the estimate."""

_SECTIONS = ("Files read", "Files modified", "Commands run", "Key decisions",
             "Errors and resolutions", "Current task state")
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
    return f"{summary_header(0)}\n{ESTIMATE_MARK}\n{body}\n" + "x" * filler


def dry_run(history: History, spec: RequestSpec, *, endpoint: Endpoint,
            limits: LearnedLimits, tools: ToolBox, store: ResultStore,
            settings: Settings, current: Settings | None = None) -> Prepared:
    """Run the preparation pipeline on ``history`` without sending or changing anything.

    ``settings`` are the ones to try; ``current`` the ones ``limits`` were learned under
    (when they differ, the configured cap and window follow ``settings``).
    """
    own_limits = copy.deepcopy(limits)    # its path limits too: a dry run learns nothing
    if current is not None and current != settings:
        own_limits.configure(current, settings)
    bus = EventBus()
    sizer = RequestSizer(endpoint, own_limits, settings, tools.specs)
    compactor = SessionCompactor(
        sizer, bus, settings,
        summarize=lambda text, tokens, _deadline: estimated_summary(
            text, tokens, bytes_per_token=own_limits.tokens.bytes_per_token))
    preparer = Preparer(sizer, compactor, MemoryStore(store), bus, settings)
    return preparer.prepare(history, spec, TurnLog())
