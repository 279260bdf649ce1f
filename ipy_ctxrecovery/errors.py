"""The package's one exception tree, and ``redact`` for what errors may show.

Exception tree::

    CtxRecoveryError                 every error this package raises on purpose
    ├── ConfigError (ValueError)     a bad setting: names the variable, the value, the accepted forms
    ├── ChatError                    a request failed for good; ``.failure`` says why and how
    ├── SessionInUse                 a saved session is open for writing in another process
    └── ToolError                    raised inside a tool: reported to the model as an error result

Provider adapters catch their SDK's exceptions at the boundary, classify them
(``core.classify.classify``) with the request size attached and raise :class:`ChatError` from them; nothing above the
providers ever sees an SDK exception type.

This module imports no SDK and no IPython; it is imported by every layer.
"""

from __future__ import annotations

from .failures import Failure

__all__ = [
    "ChatError",
    "ConfigError",
    "CtxRecoveryError",
    "SessionInUse",
    "ToolError",
    "redact",
]


class CtxRecoveryError(Exception):
    """Root of every exception this package raises on purpose."""


class ConfigError(CtxRecoveryError, ValueError):
    """A setting has a bad value. The message is one sentence a user can act on."""


class ChatError(CtxRecoveryError):
    """A chat request failed and recovery (if any applied) could not save it."""

    def __init__(self, failure: Failure, message: str | None = None) -> None:
        super().__init__(redact(message or failure.reason))
        self.failure = failure


class SessionInUse(CtxRecoveryError):
    """A saved session is held by another process (one writer per session); the message
    names the holder and the ways out."""


class ToolError(CtxRecoveryError):
    """Raised inside a tool to report a problem to the model as an error result."""


def redact(text: str) -> str:
    """Mask API keys, Authorization values and other well-known secret formats in ``text``.

    The formats and how they are found: :mod:`ipy_ctxrecovery.redaction`. A session also
    masks the exact credentials its own client sends (``Redactor``).
    """
    from .redaction import mask_secrets

    return mask_secrets(text)

