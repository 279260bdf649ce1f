"""ipy_ctxrecovery — keeps long LLM conversations in Jupyter notebooks alive.

``%load_ext ipy_ctxrecovery`` registers the ``%%chat`` and ``%chat`` magics. The recovery
core (settings, classification, compaction, the recovery ladder) is plain Python and can
be used from a script through :class:`ChatSession`.

Public names are imported lazily, so importing the package does not import IPython,
ipywidgets or an SDK until they are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ChatError": "errors",
    "ConfigError": "errors",
    "CtxRecoveryError": "errors",
    "Failure": "failures",
    "FailureKind": "failures",
    "classify": "core.classify",
    "Settings": "settings",
    "parse_size": "settings",
    "Message": "core.history",
    "ChatSession": "session",
    "Reply": "session",
    "chat_tool": "session.tools",
    "Emulator": "emulator",
    "describe": "core.wording",
    "replay": "session.replay",
}

__all__ = [
    "ChatError",
    "ChatSession",
    "ConfigError",
    "CtxRecoveryError",
    "Emulator",
    "Failure",
    "FailureKind",
    "Message",
    "Reply",
    "Settings",
    "__version__",
    "chat_tool",
    "classify",
    "describe",
    "load_ipython_extension",
    "parse_size",
    "replay",
    "unload_ipython_extension",
]

if TYPE_CHECKING:
    from .core.classify import classify
    from .core.history import Message
    from .core.wording import describe
    from .emulator import Emulator
    from .errors import ChatError, ConfigError, CtxRecoveryError
    from .failures import Failure, FailureKind
    from .session import ChatSession, Reply
    from .session.replay import replay
    from .session.tools import chat_tool
    from .settings import Settings, parse_size


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ipy_ctxrecovery' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext ipy_ctxrecovery``: register the magics."""
    from .notebook import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext ipy_ctxrecovery``: unregister the magics and stop the embedded emulator."""
    from .notebook import unload

    unload(ipython)
