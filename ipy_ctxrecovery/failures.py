"""What can go wrong with a request: :class:`FailureKind` and the classified :class:`Failure`.

Data only: the kinds (SPEC §1), which of them the recovery ladder handles, their labels for
the user, and the one size threshold the classifier and the providers share. The rules
that decide a kind live in ``_classify``; the exceptions that carry a failure in ``errors``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "KIND_LABELS",
    "LIKELY_PAYLOAD_MIN_BYTES",
    "PAYLOAD_KINDS",
    "RECOVERABLE_KINDS",
    "Failure",
    "FailureKind",
    "Signature",
]

LIKELY_PAYLOAD_MIN_BYTES = 500 * 1024
"""A dropped connection on a body larger than this is ``likely_payload``, smaller is
``transient`` (equals ``Settings().likely_payload_min_bytes``; classify takes no settings)."""


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


class Signature(StrEnum):
    """How a network path said no to a body, whatever kind the failure was classified as.

    Limits are learned per signature from evidence (``core.recovery.evidence``): only
    ``SIZE`` names a size outright; the others may be a size limit or something else (a
    content rule, a blip) until the evidence on the path tells which.
    """

    SIZE = "size"            # a 413/431, or a body named too large in the text
    BLOCK = "block"          # a 403 block page or a WAF's words
    DROP = "drop"            # the connection dropped or was reset while sending
    BARE_5XX = "bare_5xx"    # a 5xx with an empty or HTML body: a proxy's, not the API's
    BAD_BODY = "bad_body"    # a 400 saying the JSON body could not be parsed (cut upstream)


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

    ``empty_stream``: the server accepted a streamed request (HTTP 200, an event stream)
    and the stream ended — cleanly, or cut off — before any of an answer arrived: no
    text, reasoning, tool call, stop reason or usage. It is what llama-cpp-python's server
    sends when the request fails after the stream has started (over the window, a chat
    template that cannot render the messages), where the same body unstreamed gets the
    server's own error. The kind stays ``transient``; ``request_bytes`` is the body's size.

    ``fingerprint``: what the server said (the body — an empty one too —, else the message
    or the connection error), with what changes from one identical error to the next taken
    out — request and trace ids, timestamps, waits — then hashed (16 hex digits; no text is
    kept, so no secret either). Two failures with the same ``status`` and ``fingerprint``
    are the same error (:meth:`repeats`). ``classify`` always sets it; None only on a
    Failure built by hand.
    """

    kind: FailureKind
    reason: str
    status: int | None = None
    prompt_tokens: int | None = None
    limit_tokens: int | None = None
    output_tokens: int | None = None
    request_bytes: int | None = None
    retry_after: float | None = None
    signature: Signature | None = None
    """How the path said no (None: not a refusal of the body, e.g. auth, a rate limit)."""
    empty_stream: bool = False
    fingerprint: str | None = None

    def repeats(self, other: Failure) -> bool:
        """Whether this is ``other`` again: the same status and fingerprint on a body of the
        same size (each known). A fact for a retry policy; it decides nothing itself."""
        return (self.fingerprint is not None and self.fingerprint == other.fingerprint
                and self.status == other.status and self.empty_stream == other.empty_stream
                and self.request_bytes is not None
                and self.request_bytes == other.request_bytes)

    @property
    def recoverable(self) -> bool:
        return self.kind in RECOVERABLE_KINDS

    @property
    def payload_related(self) -> bool:
        return self.kind in PAYLOAD_KINDS

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]
