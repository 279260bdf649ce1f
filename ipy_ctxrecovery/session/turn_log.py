"""What one turn reports: :class:`EventBus` (who hears the events), :class:`TurnLog`
(what this turn did, for its :class:`~.values.Reply`) and :class:`Shrink` (one undoable
shrink of the working history).

The bus belongs to a session; a log to one ``send`` (or one manual compaction), never
shared between turns. A subscriber that raises does not end the turn: it is reported as
one warning (redacted), and the turn goes on.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.events import Event, EventCallback, TurnFinished
from ..core.history import History
from ..core.wording import describe
from ..errors import redact
from ..failures import Failure

__all__ = ["EventBus", "Shrink", "TurnLog"]


@dataclass(frozen=True, slots=True)
class Shrink:
    """One shrink of the working history the product made: undoable (``before`` is the
    history it replaced, ``after_len`` the length of what replaced it)."""

    kind: Literal["compaction", "fit", "ladder"]
    before: History
    after_len: int


@dataclass
class TurnLog:
    """Mutable record of one turn: its events, token usage and what shrank the history."""

    events: list[Event] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens read from the provider's cache, summed."""
    cache_write_tokens: int = 0
    """Prompt tokens written to the provider's cache, summed."""
    cache_write_1h_tokens: int = 0
    """Of those, written with a one-hour TTL."""
    shrinks: list[Shrink] = field(default_factory=list)
    """Every shrink this turn applied, oldest first."""
    deadline: float | None = None
    """``time.monotonic()`` by which the turn must end (``turn_timeout``); None: no bound."""

    def left(self) -> float | None:
        """Seconds left before the deadline (None: no bound)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def record(self, event: Event) -> None:
        if not isinstance(event, TurnFinished):
            self.events.append(event)

    @property
    def actions(self) -> tuple[str, ...]:
        """What happened, one rendered line (or block) per event that has something to say."""
        return tuple(line for line in (describe(e) for e in self.events) if line)

    def add_usage(self, prompt: int | None, completion: int | None, *,
                  cached: int | None = 0, cache_write: int | None = 0,
                  cache_write_1h: int | None = 0) -> None:
        self.prompt_tokens += prompt or 0
        self.completion_tokens += completion or 0
        self.cached_tokens += cached or 0
        self.cache_write_tokens += cache_write or 0
        self.cache_write_1h_tokens += cache_write_1h or 0


class EventBus:
    """Delivers a session's events to its subscribers, in order.

    ``mask`` is applied to the text an event carries (a failure's reason, a sentence): a
    gateway may echo the session's own key in an error body.
    """

    def __init__(self, mask: Callable[[str], str] | None = None) -> None:
        self._subscribers: list[EventCallback] = []
        self._mask = mask

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def emit(self, event: Event, log: TurnLog | None = None) -> None:
        if self._mask is not None:
            event = masked(event, self._mask)
        if log is not None:
            log.record(event)
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception as e:  # a display bug must not end the turn, nor go unnoticed
                warnings.warn(redact(f"event subscriber {callback!r} raised "
                                     f"{type(e).__name__}: {e}"),
                              RuntimeWarning, stacklevel=3)


def masked(event: Event, mask: Callable[[str], str]) -> Event:
    """``event`` with ``mask`` applied to its text fields and to its failure's reason."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        shown: object
        if isinstance(value, str):
            shown = mask(value)
        elif isinstance(value, Failure):
            reason = mask(value.reason)
            shown = dataclasses.replace(value, reason=reason) if reason != value.reason \
                else value
        else:
            continue
        if shown is not value and shown != value:
            changes[f.name] = shown
    return dataclasses.replace(event, **changes) if changes else event
