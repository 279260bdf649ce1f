"""The stateful conversation: :class:`ChatSession` and the values it hands back.

Built by composition (see ``session.py``): an endpoint, learned limits, a request sizer,
the preparation pipeline, the recovery loop and the turn runner, each owning its state.
"""

from __future__ import annotations

from .session import ChatSession
from .values import KEEP, Reply, SessionStatus

__all__ = ["KEEP", "ChatSession", "Reply", "SessionStatus"]
