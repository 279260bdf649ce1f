"""classify's ``Failure.signature``: how a path refused the body, apart from the kind —
over the real-error corpus (tests/corpus) and the transport failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ipy_ctxrecovery import classify
from ipy_ctxrecovery.failures import FailureKind, Signature

CASES = [json.loads(p.read_text()) for p in sorted((Path(__file__).parent / "corpus")
                                                     .glob("*.json"))]


def _json_error(body: Any) -> bool:
    try:
        parsed = json.loads(body) if isinstance(body, str) else body
    except ValueError:
        return False
    return isinstance(parsed, dict) and bool(parsed)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_every_real_error_has_the_signature_its_kind_and_body_imply(case: dict[str, Any]
                                                                    ) -> None:
    failure = classify(status=case["status"], body=case["body"],
                       headers=case.get("headers") or {})
    status = case["status"]
    if failure.kind is FailureKind.PAYLOAD_TOO_LARGE:
        assert failure.signature is Signature.SIZE
    elif failure.kind is FailureKind.WAF_REJECTION:
        assert failure.signature is Signature.BLOCK
    elif status is not None and 500 <= status <= 599 and failure.signature is not None:
        # Only a middlebox's page (no JSON error object) is a bare 5xx.
        assert failure.signature is Signature.BARE_5XX and not _json_error(case["body"])
    elif status is not None and 500 <= status <= 599 and not _json_error(case["body"]):
        pytest.fail(f"{case['id']}: a non-JSON {status} without the bare-5xx signature")
    else:
        assert failure.signature is None, (case["id"], failure)


def test_a_proxy_page_502_is_bare_and_an_api_500_is_not() -> None:
    nginx = classify(status=502, body="<html><head><title>502 Bad Gateway</title></head></html>")
    empty = classify(status=502, body="")
    api = classify(status=500, body='{"type":"error","error":{"type":"api_error",'
                                    '"message":"Internal server error"}}')
    assert (nginx.signature, empty.signature, api.signature) == (
        Signature.BARE_5XX, Signature.BARE_5XX, None)
    assert nginx.kind is empty.kind is api.kind is FailureKind.TRANSIENT


@pytest.mark.parametrize("body", [
    '{"error":{"message":"We could not parse the JSON body of your request. (HINT: This '
    'likely means you aren\'t using your HTTP library correctly.)","type":"invalid_request_'
    'error","param":null,"code":null}}',
    '{"type":"error","error":{"type":"invalid_request_error","message":"Unexpected end of '
    'JSON input"}}',
])
def test_a_400_about_an_unreadable_body_is_bad_body(body: str) -> None:
    assert classify(status=400, body=body).signature is Signature.BAD_BODY


def test_a_dropped_connection_is_a_drop_at_any_size() -> None:
    small = classify(ConnectionResetError(104, "Connection reset by peer"), request_bytes=30_000)
    large = classify(ConnectionResetError(104, "Connection reset by peer"),
                     request_bytes=900_000)
    assert (small.kind, large.kind) == (FailureKind.TRANSIENT, FailureKind.LIKELY_PAYLOAD)
    assert small.signature is large.signature is Signature.DROP


def test_a_timeout_or_a_refused_connection_is_no_refusal_of_the_body() -> None:
    assert classify(TimeoutError("timed out"), request_bytes=30_000).signature is None
    assert classify(ConnectionRefusedError(111, "refused"), request_bytes=30_000).signature \
        is None
