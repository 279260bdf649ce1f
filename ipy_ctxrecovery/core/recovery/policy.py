"""What to do about one failed request: :func:`respond`, pure predicates in the manner of
the anthropic SDK's ``_should_retry``/``_calculate_retry_timeout``.

The caller observed the failure on its network path first (:mod:`.evidence`) and hands
over the finding; :func:`respond` returns one :class:`Response`:

- ``REFRESH``: credentials were refused: refresh them once and resend;
- ``WAIT``: a transient failure: resend after ``wait`` seconds (a budget per request; a
  500 that repeats identically on the same body is not retried a third time);
- ``RESEND``: the first refusal of its kind above what passed, of a kind a blip can cause
  (a drop of a body under ``likely_payload_min_bytes``, a proxy's bare 5xx, a cut body): the
  same body once more, without the SDK's own retries; a second refusal confirms a limit;
- ``UNSTREAM``: a streamed request that got an event stream with nothing in it (a server
  such as llama.cpp's answers an overflow so): the same request once unstreamed, which
  gets the server's own error (or the answer);
- ``CLIMB``: a size limit (learned, suspected from a block page) or a context overflow:
  fit the history (the ladder) and resend. ``failure`` is then the failure as the ladder
  should see it: a limit the evidence showed is a payload failure, whatever its kind;
- ``GIVE_UP``: nothing a resend can fix; ``reason`` is the sentence for the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from ...failures import Failure, FailureKind, Signature
from ...settings import Settings, format_size
from ..retry import retry_wait, too_long_sentence
from .evidence import Finding, Observation

__all__ = ["Action", "Attempts", "Response", "respond"]


class Action(StrEnum):
    REFRESH = "refresh"
    WAIT = "wait"
    RESEND = "resend"
    UNSTREAM = "unstream"
    CLIMB = "climb"
    GIVE_UP = "give_up"


@dataclass(frozen=True, slots=True)
class Attempts:
    """What one request already spent on retries (a fresh value per request)."""

    auth: int = 0
    transient: int = 0
    suspect_resent: int = 0
    unstreamed: int = 0
    last_error: Failure | None = None
    """The last transient failure, to see it repeat (``Failure.repeats``)."""


@dataclass(frozen=True, slots=True)
class Response:
    action: Action
    attempts: Attempts
    failure: Failure
    wait: float = 0.0
    reason: str = ""
    not_size: bool = False
    """GIVE_UP because the refusal was not about size (a content rule, a blip)."""


_BLIP_SIGNATURES = frozenset({Signature.DROP, Signature.BARE_5XX, Signature.BAD_BODY})

_WHAT = {
    Signature.BLOCK: "the proxy's firewall blocked the request",
    Signature.DROP: "the connection dropped again",
    Signature.BARE_5XX: "the proxy answered with an empty server error again",
    Signature.BAD_BODY: "the server could not read the request body again",
    Signature.SIZE: "the request was refused as too large",
}


def not_about_size(signature: Signature, body: int, largest_ok: int) -> str:
    """The sentence for a refusal of a body no bigger than one this path carried."""
    what = _WHAT.get(signature, "the request was refused")
    content = (" — if it is a firewall, something in the latest message may be what it "
               "blocks (rephrase it, or ask the network team); else try again."
               if signature is Signature.BLOCK else "; try again.")
    return (f"{what[0].upper()}{what[1:]} ({format_size(body)}), though a bigger one "
            f"({format_size(largest_ok)}) went through on this network path: it is not about "
            f"size, so the history was left as it was{content}")


def blocked_again(first: int, smaller: int) -> str:
    """The sentence for a block page that came back when the same request was made smaller:
    a content rule, not a size limit."""
    return (f"The proxy's firewall blocked the request ({format_size(first)}), and blocked it "
            f"again when it was made smaller ({format_size(smaller)}): it is not about size, so "
            "the history was left as it was — something in the latest message may be what it "
            "blocks (rephrase it, or ask the network team).")


def as_payload(failure: Failure, observation: Observation) -> Failure:
    """A failure the evidence showed to be a size limit, as the ladder handles one."""
    if failure.payload_related:
        return failure
    what = _WHAT.get(observation.signature or Signature.SIZE, "the request was refused")
    reason = (f"{what[0].upper()}{what[1:]} at {format_size(observation.size)} while smaller "
              "requests passed on this network path: a proxy's body-size limit.")
    return replace(failure, kind=FailureKind.LIKELY_PAYLOAD, reason=reason)


def sentence(failure: Failure) -> str:
    reason = failure.reason.strip().rstrip(".")
    return f"{reason}." if reason else f"The request failed: {failure.label}."


def respond(failure: Failure, observation: Observation, attempts: Attempts, *,
            body: int, largest_ok: int, settings: Settings,
            remaining: float | None = None, now: float = 0.0) -> Response:
    """The response to ``failure`` of a ``body``-byte request (module docstring).

    ``observation``: what the failure showed on the path (already recorded there).
    ``largest_ok``: the largest body that passed on the path before this failure.
    ``remaining``: seconds left of the turn's deadline (None: no deadline).
    """
    kind = failure.kind
    if kind is FailureKind.AUTH:
        if attempts.auth:
            return Response(Action.GIVE_UP, attempts, failure, reason=sentence(failure))
        return Response(Action.REFRESH, replace(attempts, auth=attempts.auth + 1), failure)
    if failure.empty_stream and not attempts.unstreamed:
        return Response(Action.UNSTREAM, replace(attempts, unstreamed=1), failure)
    finding, signature = observation.finding, observation.signature
    if finding is Finding.LIMIT:
        return Response(Action.CLIMB, attempts, as_payload(failure, observation))
    # A drop of a body over ``likely_payload_min_bytes`` is most likely a size limit (SPEC
    # §1): fitted at once like a block page; a smaller one may well be a blip.
    large = signature is Signature.DROP and body > settings.likely_payload_min_bytes
    blip = signature in _BLIP_SIGNATURES and not attempts.suspect_resent
    if blip and ((finding is Finding.SUSPECT and not large)
                 or (finding is Finding.NOT_SIZE and kind is not FailureKind.TRANSIENT)):
        # A drop or a proxy's bare 5xx may be a blip: the same body once more, at once
        # (a second refusal above what passed confirms a limit).
        return Response(Action.RESEND,
                        replace(attempts, suspect_resent=attempts.suspect_resent + 1), failure)
    if finding is Finding.SUSPECT:
        # A block page (or a large drop) above what passed: a smaller body fitted from the
        # same request tells size from content; it confirms the limit when it passes.
        return Response(Action.CLIMB, attempts, as_payload(failure, observation))
    if finding is Finding.NOT_SIZE and signature is Signature.BLOCK:
        return Response(Action.GIVE_UP, attempts, failure,
                        reason=not_about_size(signature, body, largest_ok), not_size=True)
    if kind is FailureKind.TRANSIENT or finding is Finding.NOT_SIZE:
        response = _transient(failure, attempts, body=body, settings=settings,
                              remaining=remaining, now=now)
        if response.action is Action.GIVE_UP and finding is Finding.NOT_SIZE \
                and signature is not None and kind is not FailureKind.TRANSIENT:
            return replace(response, reason=not_about_size(signature, body, largest_ok),
                           not_size=True)
        return response
    if failure.recoverable or kind is FailureKind.OUTPUT_LIMIT:
        return Response(Action.CLIMB, attempts, failure)
    return Response(Action.GIVE_UP, attempts, failure, reason=sentence(failure))


#: Server errors that say nothing about load (unlike 502, 503, 504, 529): the same one twice
#: on the same body is the server's answer to that body (llama.cpp's 500 for a chat
#: template it cannot render), not worth a third send.
_DETERMINISTIC = frozenset({500, 501})


def _transient(failure: Failure, attempts: Attempts, *, body: int, settings: Settings,
               remaining: float | None, now: float) -> Response:
    if attempts.transient >= settings.transient_retries:
        return Response(Action.GIVE_UP, attempts, failure, reason=sentence(failure))
    last = attempts.last_error
    if last is not None and failure.status in _DETERMINISTIC and _same(failure, last, body):
        return Response(Action.GIVE_UP, attempts, failure, reason=(
            f"{sentence(failure).rstrip('.')} — the same error twice on the same request, "
            "so it was not sent a third time."))
    count = attempts.transient + 1
    plan = retry_wait(count, failure.retry_after, max_wait=settings.max_retry_wait,
                      remaining=remaining)
    if plan.seconds is None:
        what = f"HTTP {failure.status}" if failure.status else failure.label
        return Response(Action.GIVE_UP, attempts, failure,
                        reason=too_long_sentence(plan, what, now=now))
    return Response(Action.WAIT, replace(attempts, transient=count,
                                         last_error=replace(failure, request_bytes=body)),
                    failure, wait=plan.seconds)


def _same(failure: Failure, last: Failure, body: int) -> bool:
    """The same error again on the same body (by fingerprint where the classifier gave one,
    else by status and words)."""
    now = replace(failure, request_bytes=body)
    if now.fingerprint is not None and last.fingerprint is not None:
        return now.repeats(last)
    return (now.status, now.reason, body) == (last.status, last.reason, last.request_bytes)
