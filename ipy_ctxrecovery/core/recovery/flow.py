"""The recovery of one request, sans I/O: :func:`recover`, a generator in the manner of
httpx's ``Auth.auth_flow``.

It yields the effects it wants and receives their results; the caller does the I/O. The
session's ``RecoveryLoop`` drives it with real effects (the provider under the turn's
deadline, the ladder with the model as summarizer, ``sleep``); a what-if drives the same
loop with a provider that rejects and an estimated summary, so a plan is the recovery that
runs. Effects:

- :class:`Send`: send the request as it now stands (fitted under every known limit); the
  driver answers with :class:`Answered` or :class:`Refused`;
- :class:`Tell`: events for the user (a cap learned, lowered or withdrawn);
- :class:`Refresh`: re-read the credentials; :class:`Wait`: sleep, then the next
  :class:`Send`; :class:`Resend`: the same body once more (a refusal that may be a blip);
  :class:`Unstream`: the same request once unstreamed (its stream came back empty);
- :class:`Climb`: one step of the ladder for ``failure`` (the exact fit first, by summary
  where it can), then the next :class:`Send`. The driver raises to end the request when
  the ladder gives up; closing the generator then takes back a limit only adopted for it.

It returns :class:`GaveUp` (with the sentence for the user) or :class:`Done`.

What it knows about the path is ``caps`` (its :class:`~.evidence.PathEvidence`), updated
in place as the evidence comes in: it is shared by the sessions on that path.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Literal

from ...failures import Failure, FailureKind, Signature
from ...settings import Settings
from ..events import CapChanged, Event
from . import policy
from .evidence import Caps, Finding, Observation, signature_of

__all__ = ["Answered", "Climb", "Done", "Effect", "GaveUp", "Refresh", "Refused", "Resend",
           "Send", "Tell", "Unstream", "Wait", "recover", "sdk_may_retry"]


@dataclass(frozen=True, slots=True)
class Send:
    attempt: int                      # 1 for the first send of this request


@dataclass(frozen=True, slots=True)
class Tell:
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class Refresh:
    failure: Failure


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float
    attempt: int
    failure: Failure


@dataclass(frozen=True, slots=True)
class Resend:
    failure: Failure
    suspect: bool                     # above what passed (else: on a size it carried)


@dataclass(frozen=True, slots=True)
class Unstream:
    """Send the same request once unstreamed: its stream came back empty."""

    failure: Failure


@dataclass(frozen=True, slots=True)
class Climb:
    failure: Failure                  # as the ladder should see it
    body: int
    learned: tuple[Event, ...] = ()   # what the refusal taught, told with the step


Effect = Send | Tell | Refresh | Wait | Resend | Unstream | Climb


@dataclass(frozen=True, slots=True)
class Answered:
    body: int


@dataclass(frozen=True, slots=True)
class Refused:
    failure: Failure
    body: int
    remaining: float | None = None    # seconds left of the turn's deadline
    now: float = 0.0                  # the clock, for a "try again after" time


@dataclass(frozen=True, slots=True)
class Done:
    events: tuple[Event, ...] = ()


@dataclass(frozen=True, slots=True)
class GaveUp:
    failure: Failure
    reason: str
    events: tuple[Event, ...] = field(default=())
    not_size: bool = False            # the refusal was not about size (content, a blip)


def sdk_may_retry(caps: Caps, body: int) -> bool:
    """Whether the SDK may resend a ``body``-byte request on its own: only a body no bigger
    than one the path carried (a bigger one may be refused for its size, and then only the
    flow decides a resend: one refusal each, never a doomed body three times)."""
    return body <= caps.largest_ok


Withdrawn = Literal["bigger_passed", "not_size", "blocked_again"]


def _withdrawn(caps: Caps, refused: int, because: Withdrawn,
               signature: Signature | None = None) -> CapChanged:
    """The event for a limit taken back (``CapChanged.withdrawn_because``), with the cap now
    in force."""
    return CapChanged(cap=caps.effective(), source=caps.source or "learned",
                      rejected_bytes=refused, change="withdrawn",
                      signature=str(signature) if signature is not None else None,
                      withdrawn_because=because)


def observe(caps: Caps, failure: Failure, size: int) -> tuple[Observation, list[Event]]:
    """Record what ``failure`` of a ``size``-byte request shows on the path; the events for
    a cap learned, lowered or withdrawn by it."""
    before, source = caps.effective(), caps.source
    observation = caps.observe(signature_of(failure), size)
    after = caps.effective()
    events: list[Event] = []
    if observation.withdrawn is not None:
        events.append(_withdrawn(caps, observation.withdrawn, "not_size",
                                 observation.signature))
    elif observation.finding is Finding.LIMIT and after is not None and after != before:
        lowered = source == "learned" and before is not None
        events.append(CapChanged(cap=after, source="learned", rejected_bytes=size,
                                 dropped=failure.kind is FailureKind.LIKELY_PAYLOAD,
                                 change="lowered" if lowered else "learned",
                                 signature=str(observation.signature)))
    return observation, events


def passed(caps: Caps, body: int) -> list[Event]:
    """A ``body``-byte request went through; the event for a cap it withdrew."""
    before = caps.learned
    withdrawn = caps.record_success(body)
    if withdrawn is None or before is None:
        return []
    return [_withdrawn(caps, withdrawn, "bigger_passed")]


def adopt(caps: Caps, observation: Observation) -> list[Event]:
    """Fit one request under the limit a suspected refusal implies; the event for the cap
    now in force, told as learned from that refusal."""
    signature = observation.signature
    before = caps.effective()
    if signature is None or caps.path.adopt(signature) is None:
        return []
    after = caps.effective()
    if after is None or after == before:
        return []
    return [CapChanged(cap=after, source="learned", rejected_bytes=observation.size,
                       signature=str(signature), change="suspected")]


def recover(caps: Caps, settings: Settings) -> Generator[Effect, object, Done | GaveUp]:
    """The recovery of one request (the module docstring): send, and respond to each
    refusal (``policy.respond``) until it is answered or recovery gives up."""
    attempts = policy.Attempts()
    tentative: dict[Signature, int] = {}      # suspects this request is fitted under
    sends = 0
    try:
        while True:
            sends += 1
            result = yield Send(sends)
            if isinstance(result, Answered):
                # A smaller body fitted from it passed: the suspects were about size.
                confirmed = [CapChanged(cap=caps.effective(), source="learned",
                                        rejected_bytes=size, signature=str(signature))
                             for signature, size in tentative.items()]
                tentative.clear()
                return Done((*passed(caps, result.body), *confirmed))
            assert isinstance(result, Refused), result
            failure, body = result.failure, result.body
            largest_ok = caps.largest_ok
            signature = signature_of(failure)
            if signature is Signature.BLOCK and signature in tentative:
                # Blocked again once made smaller: the firewall's content rule, not its size
                # limit. The limit adopted for this request goes; nothing is learned.
                first = tentative.pop(signature)
                caps.path.withdraw(signature)
                return GaveUp(failure, policy.blocked_again(first, body),
                              (_withdrawn(caps, first, "blocked_again", signature),),
                              not_size=True)
            observation, learned = observe(caps, failure, body)
            answer = policy.respond(failure, observation, attempts, body=body,
                                    largest_ok=largest_ok, settings=settings,
                                    remaining=result.remaining, now=result.now)
            attempts, failure = answer.attempts, answer.failure
            if answer.action is policy.Action.GIVE_UP:
                return GaveUp(failure, answer.reason, tuple(learned), answer.not_size)
            if answer.action is policy.Action.CLIMB:
                signature = observation.signature
                if observation.finding is Finding.SUSPECT and signature is not None:
                    # Fitted under the limit it would imply; kept if the fit passes.
                    learned += adopt(caps, observation)
                    tentative[signature] = observation.size
                elif signature in tentative:
                    del tentative[signature]  # refused twice above what passed: a limit
                yield Climb(failure, body, tuple(learned))
                continue
            if learned:
                yield Tell(tuple(learned))
            if answer.action is policy.Action.REFRESH:
                yield Refresh(failure)
            elif answer.action is policy.Action.RESEND:
                yield Resend(failure, suspect=observation.about_size)
            elif answer.action is policy.Action.UNSTREAM:
                yield Unstream(failure)
            else:
                yield Wait(answer.wait, attempts.transient, failure)
    finally:
        for signature, size in tentative.items():
            # Nothing smaller went through (or was sent): a suspect again, not a limit.
            caps.path.unadopt(signature, size)
