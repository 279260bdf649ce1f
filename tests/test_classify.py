"""``core/classify.py``'s failure fingerprint: the same error on the same body is told apart
from another, whatever changes from one answer to the next (ids, timestamps, waits).

The kinds and numbers ``classify`` reads are held by the real-error corpus in
``tests/test_errors.py``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

from ipy_ctxrecovery.core.classify import classify, fingerprint
from ipy_ctxrecovery.emulator import faults

CORPUS = [json.loads(p.read_text(encoding="utf-8"))
          for p in sorted((Path(__file__).parent / "corpus").glob("*.json"))]


def openai_500(request_id: str, when: str) -> str:
    return json.dumps({"error": {
        "message": "The server had an error processing your request. Sorry about that! You can "
                   "retry your request, or contact us through our help center at "
                   f"help.openai.com if you keep seeing this error. (Please include the request "
                   f"ID {request_id} in your email.) at {when}", "type": "server_error",
        "param": None, "code": None}})


def test_ids_and_timestamps_do_not_make_two_errors_different() -> None:
    one = classify(status=500, body=openai_500("req_4f1c2b9a7d3e8f60a1b2c3d4",
                                               "2026-03-04T05:06:07.891Z"))
    two = classify(status=500, body=openai_500(f"req_{uuid.uuid4().hex}",
                                               "2026-03-04T05:09:59Z"))
    assert one.fingerprint == two.fingerprint and one.fingerprint is not None
    three = classify(status=500, body=openai_500(str(uuid.uuid4()), "Tue, 01 Dec 2026 20:27:35 GMT"))
    assert three.fingerprint == one.fingerprint


def test_a_block_page_is_the_same_error_whatever_its_ray_id() -> None:
    # The emulator's Cloudflare page carries a fresh ray id each time, as Cloudflare's does.
    pages = [faults.waf_answer("cloudflare") for _ in range(3)]
    assert len({dict(p.headers)["CF-RAY"] for p in pages}) == 3
    prints = {classify(status=403, body=p.body, headers=dict(p.headers)).fingerprint for p in pages}
    assert len(prints) == 1 and None not in prints


def test_numbers_of_the_request_still_count() -> None:
    def overflow(prompt: int) -> str:
        return json.dumps({"error": {"message": f"This model's maximum context length is 8192 "
                                                f"tokens. However, your messages resulted in "
                                                f"{prompt} tokens.", "code": "context_length_exceeded"}})
    assert classify(status=400, body=overflow(9000)).fingerprint \
        != classify(status=400, body=overflow(9001)).fingerprint
    # A wait is not the request's: "try again in 1.5s" and "in 20s" are the same limit.
    waits = {fingerprint(f"Rate limit reached. Please try again in {w}.") for w in ("1.5s", "20s",
                                                                                      "350ms")}
    assert len(waits) == 1


def test_every_corpus_case_has_its_own_fingerprint() -> None:
    seen: dict[tuple[int, str | None], str] = {}
    for case in CORPUS:
        failure = classify(status=case["status"], body=case["body"], headers=case["headers"])
        key = (case["status"], failure.fingerprint)
        assert key not in seen, (case["id"], seen.get(key))
        seen[key] = case["id"]


def dropped() -> BaseException:
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    return httpx2.RemoteProtocolError("Server disconnected without sending a response.",
                                      request=request)


@pytest.mark.parametrize("make", [dropped])
def test_a_connection_error_has_a_fingerprint_of_its_own(make: Any) -> None:
    one, two = classify(make(), request_bytes=1000), classify(make(), request_bytes=1000)
    assert one.fingerprint == two.fingerprint is not None
    timeout = classify(httpx2.ReadTimeout("timed out"), request_bytes=1000)
    assert timeout.fingerprint != one.fingerprint


def test_a_body_less_answer_is_the_same_error_each_time() -> None:
    # Caddy's empty 502, a bare 431: nothing said is the same thing said.
    assert fingerprint("") == fingerprint(" \n ") == classify(status=502, body="").fingerprint
    assert classify(status=502, body="").fingerprint != classify(status=502, body="x").fingerprint
    assert len(fingerprint("x")) == 16
