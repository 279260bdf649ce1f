"""Failure classification and the package's one exception tree.

Exception tree::

    CtxRecoveryError                 every error this package raises on purpose
    ├── ConfigError (ValueError)     a bad setting: names the variable, the value, the accepted forms
    ├── ChatError                    a request failed for good; ``.failure`` says why and how
    └── ToolError                    raised inside a tool: reported to the model as an error result

Provider adapters catch their SDK's exceptions at the boundary, call :func:`classify`
with the request size attached and raise :class:`ChatError` from them; nothing above the
providers ever sees an SDK exception type.

This module is part of the recovery core: it imports no SDK, no IPython. It reads SDK
exceptions by duck typing (``status_code``, ``body``, ``response.headers``, ``message``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ChatError",
    "ConfigError",
    "CtxRecoveryError",
    "Failure",
    "FailureKind",
    "ToolError",
    "classify",
    "redact",
]


class FailureKind(StrEnum):
    """What went wrong with a request, decided once per failure (SPEC §1)."""

    CONTEXT_OVERFLOW = "context_overflow"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    WAF_REJECTION = "waf_rejection"
    LIKELY_PAYLOAD = "likely_payload"
    OUTPUT_LIMIT = "output_limit"
    AUTH = "auth"
    TRANSIENT = "transient"
    OTHER = "other"


RECOVERABLE_KINDS = frozenset(
    {
        FailureKind.CONTEXT_OVERFLOW,
        FailureKind.PAYLOAD_TOO_LARGE,
        FailureKind.WAF_REJECTION,
        FailureKind.LIKELY_PAYLOAD,
    }
)
PAYLOAD_KINDS = frozenset(
    {FailureKind.PAYLOAD_TOO_LARGE, FailureKind.WAF_REJECTION, FailureKind.LIKELY_PAYLOAD}
)

#: Human labels used in the user-facing lines of SPEC §3.
KIND_LABELS: Mapping[FailureKind, str] = {
    FailureKind.CONTEXT_OVERFLOW: "context window exceeded",
    FailureKind.PAYLOAD_TOO_LARGE: "payload too large (413)",
    FailureKind.WAF_REJECTION: "proxy/WAF rejection (403 + security signals)",
    FailureKind.LIKELY_PAYLOAD: "connection dropped on a large request (likely payload limit)",
    FailureKind.OUTPUT_LIMIT: "max_tokens above the model's output limit",
    FailureKind.AUTH: "authentication failed",
    FailureKind.TRANSIENT: "transient network/server error",
    FailureKind.OTHER: "request failed",
}


@dataclass(frozen=True, slots=True)
class Failure:
    """One classified failure, with whatever numbers the provider reported.

    ``prompt_tokens``/``limit_tokens`` come from messages such as
    "219898 tokens > 200000 maximum"; for "143653 + 64000 > 200000" the middle number is
    ``output_tokens`` (the requested ``max_tokens``). ``request_bytes`` is the size of the
    serialized body that failed, when known.
    """

    kind: FailureKind
    reason: str
    status: int | None = None
    prompt_tokens: int | None = None
    limit_tokens: int | None = None
    output_tokens: int | None = None
    request_bytes: int | None = None
    retry_after: float | None = None

    @property
    def recoverable(self) -> bool:
        return self.kind in RECOVERABLE_KINDS

    @property
    def payload_related(self) -> bool:
        return self.kind in PAYLOAD_KINDS

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]


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


def redact(text: str) -> str:
    """Mask API keys, Authorization values and other well-known secret formats in ``text``.

    The formats and how they are found: :mod:`ipy_ctxrecovery.redaction`. A session also
    masks the exact credentials its own client sends (``Redactor``).
    """
    from .redaction import mask_secrets

    return mask_secrets(text)


def classify(
    error: BaseException | None = None,
    *,
    status: int | None = None,
    body: str | bytes | None = None,
    headers: Mapping[str, str] | None = None,
    request_bytes: int | None = None,
) -> Failure:
    """Classify a failed request into exactly one :class:`FailureKind` (SPEC §1).

    Accepts the real exceptions of the openai/anthropic SDKs, httpx/httpx2 and OS
    connection errors, or a bare status/body/headers triple. Decides from the status code
    and the structured error body first, text second.
    """
    from ._classify import classify_failure

    return classify_failure(
        error, status=status, body=body, headers=headers, request_bytes=request_bytes
    )
