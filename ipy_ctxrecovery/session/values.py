"""The values a session hands back: :class:`Reply`, :class:`SessionStatus` and ``KEEP``.

:class:`Reply` is one answer, :class:`SessionStatus` where a session stands (with its
text formatting), :data:`KEEP` the "argument not given" default of
:meth:`ChatSession.update <ipy_ctxrecovery.session.ChatSession.update>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..providers.base import Usage

__all__ = ["KEEP", "Reply", "SessionStatus"]


class _Keep:
    """The type of :data:`KEEP`: "argument not given", distinct from None."""

    _instance: _Keep | None = None

    def __new__(cls) -> _Keep:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()
"""Default of :meth:`ChatSession.update` arguments where None is a value (``max_tokens``)."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The assistant's answer to one :meth:`ChatSession.send`."""

    text: str
    finish_reason: str
    usage: Usage
    actions: tuple[str, ...] = ()
    model: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class SessionStatus:
    """Where a session stands: sizes against window and cap, counts, totals."""

    name: str
    model: str
    history_bytes: int
    est_tokens: int
    window: int
    window_guessed: bool
    cap: int | None
    cap_source: str | None
    messages: int
    transcript_messages: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    compactions: int = 0
    recoveries: int = 0
    cap_note: str | None = None
    """Why a learned cap is gone (set by :meth:`ChatSession.update` until a new one is learned)."""
    window_learned: bool = False
    """The window is the one a context-overflow error reported (below the configured one)."""
    window_source: str | None = None
    """Where the window comes from: ``configured``, ``model catalogue``, ``set on the
    emulator``, ``learned from the provider``… (``RequestSizer.window_source``)."""
    turns: int = 0
    """Turns answered (``send`` calls that returned a reply), resumes included."""
    cached_tokens: int = 0
    """Of ``prompt_tokens``, those the provider read from its prompt cache."""
    cache_write_tokens: int = 0
    """Of ``prompt_tokens``, those written to the prompt cache."""
    cache_write_1h_tokens: int = 0
    """Of ``cache_write_tokens``, those written with a one-hour TTL (Anthropic)."""
    cost: float | None = None
    """Estimated USD for every token above (``core/prices.py``); None: price unknown."""
    background: str = "idle"
    """The summary prepared in the background: ``idle``, ``preparing``, ``ready`` or
    ``failed`` (``session/background.py``)."""
    counted_tokens: int | None = None
    """The latest request's input tokens as the provider counted them (exact pre-flight,
    ``core/exact_count.py``); None: it was estimated."""
    server_compaction: str | None = None
    """What the provider's server compaction does for this session, in words (None: not
    asked; ``docs/server-compaction.md``)."""
    cache_note: str | None = None
    """The prompt cache where it is not the default, in words (off, or a retention set or
    chosen; ``core.wording.cache_note``); None: the default."""

    def __str__(self) -> str:
        from ..core.wording import status_text

        return status_text(self)
