"""core.recovery.policy.respond: one failure, the finding on its path → one action."""

from __future__ import annotations

import pytest

from ipy_ctxrecovery.core.recovery.evidence import Finding, Observation
from ipy_ctxrecovery.core.recovery.policy import Action, Attempts, Response, respond
from ipy_ctxrecovery.failures import Failure, FailureKind, Signature
from ipy_ctxrecovery.settings import Settings

KB = 1024
SETTINGS = Settings()


FRESH = Attempts()


def answer(failure: Failure, finding: Finding, attempts: Attempts = FRESH, *,
           body: int = 64 * KB, largest_ok: int = 40 * KB) -> Response:
    seen = Observation(finding, failure.signature, body)
    return respond(failure, seen, attempts, body=body, largest_ok=largest_ok,
                   settings=SETTINGS)


DROP = Failure(FailureKind.TRANSIENT, "dropped", signature=Signature.DROP)
EMPTY_502 = Failure(FailureKind.TRANSIENT, "HTTP 502", status=502,
                    signature=Signature.BARE_5XX)
BLOCK = Failure(FailureKind.WAF_REJECTION, "blocked", status=403, signature=Signature.BLOCK)


@pytest.mark.parametrize("failure", [DROP, EMPTY_502])
def test_a_first_drop_above_what_passed_is_sent_once_more_without_waiting(
        failure: Failure) -> None:
    first = answer(failure, Finding.SUSPECT)
    assert (first.action, first.wait) == (Action.RESEND, 0.0)
    # The resend is refused too: the path now holds a limit, and the ladder fits under it.
    second = answer(failure, Finding.LIMIT, first.attempts)
    assert second.action is Action.CLIMB and second.failure.payload_related


def test_a_suspect_is_never_resent_twice() -> None:
    once = answer(DROP, Finding.SUSPECT).attempts
    assert answer(DROP, Finding.SUSPECT, once).action is Action.CLIMB


def test_a_block_page_above_what_passed_is_fitted_not_resent() -> None:
    assert answer(BLOCK, Finding.SUSPECT).action is Action.CLIMB


def test_a_block_on_a_size_that_passed_gives_up_saying_it_is_not_about_size() -> None:
    said = answer(BLOCK, Finding.NOT_SIZE, body=12 * KB, largest_ok=100 * KB)
    assert said.action is Action.GIVE_UP and "not about size" in said.reason


def test_a_server_error_that_repeats_on_the_same_body_is_not_sent_a_third_time() -> None:
    error = Failure(FailureKind.TRANSIENT, "HTTP 500: boom", status=500)
    first = answer(error, Finding.NONE)
    assert first.action is Action.WAIT
    second = answer(error, Finding.NONE, first.attempts)
    assert second.action is Action.GIVE_UP and "third time" in second.reason


def test_a_rate_limit_keeps_its_retries() -> None:
    limited = Failure(FailureKind.TRANSIENT, "HTTP 429", status=429, retry_after=0.5)
    first = answer(limited, Finding.NONE)
    second = answer(limited, Finding.NONE, first.attempts)
    assert (first.action, second.action) == (Action.WAIT, Action.WAIT)
    assert second.wait == 0.5
    assert answer(limited, Finding.NONE, second.attempts).action is Action.GIVE_UP


def test_auth_is_refreshed_once() -> None:
    auth = Failure(FailureKind.AUTH, "HTTP 401", status=401)
    first = answer(auth, Finding.NONE)
    assert first.action is Action.REFRESH
    assert answer(auth, Finding.NONE, first.attempts).action is Action.GIVE_UP


def test_an_overflow_climbs_and_an_unknown_error_gives_up() -> None:
    overflow = Failure(FailureKind.CONTEXT_OVERFLOW, "too long", status=400)
    assert answer(overflow, Finding.NONE).action is Action.CLIMB
    other = Failure(FailureKind.OTHER, "HTTP 400: bad tool schema", status=400)
    assert answer(other, Finding.NONE).action is Action.GIVE_UP


def test_a_limit_the_evidence_showed_is_a_payload_failure_whatever_its_kind() -> None:
    cut = Failure(FailureKind.OTHER, "HTTP 400: could not parse the JSON body", status=400,
                  signature=Signature.BAD_BODY)
    climbed = answer(cut, Finding.LIMIT)
    assert climbed.action is Action.CLIMB
    assert climbed.failure.kind is FailureKind.LIKELY_PAYLOAD
