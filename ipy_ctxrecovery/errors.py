"""The package's one exception tree, and ``redact`` for what errors may show.

Exception tree::

    CtxRecoveryError                 every error this package raises on purpose
    ├── ConfigError (ValueError)     a bad setting: names the variable, the value, the accepted forms
    ├── ChatError                    a request failed for good; ``.failure`` says why and how
    └── ToolError                    raised inside a tool: reported to the model as an error result

Provider adapters catch their SDK's exceptions at the boundary, classify them
(``_classify.classify``) with the request size attached and raise :class:`ChatError` from them; nothing above the
providers ever sees an SDK exception type.

This module imports no SDK and no IPython; it is imported by every layer.
"""

from __future__ import annotations

import re

from .failures import Failure

__all__ = [
    "ChatError",
    "ConfigError",
    "CtxRecoveryError",
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


class ToolError(CtxRecoveryError):
    """Raised inside a tool to report a problem to the model as an error result."""


_SECRET_PATTERNS = [
    # Authorization headers first, so the whole credential goes whatever its shape.
    re.compile(r"(?i)\b(authorization|x-api-key|api[_-]?key|proxy-authorization)(\"?\s*[:=]\s*\"?)([^\s\"',;]+(?:\s+[^\s\"',;]+)?)"),
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-ant-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{20,}"),
]


def redact(text: str) -> str:
    """Mask API keys and Authorization values in ``text`` (keeps the first 4 chars of keys)."""

    def _mask(match: re.Match[str]) -> str:
        if match.re is _SECRET_PATTERNS[0]:
            return f"{match.group(1)}{match.group(2)}[REDACTED]"
        value = match.group(0)
        if value.lower().startswith("bearer"):
            return "Bearer [REDACTED]"
        return value[:4] + "…[REDACTED]"

    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(_mask, text)
    return text

