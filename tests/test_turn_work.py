"""The turn's own work after a reply is inside turn_timeout: an answer under max_reply whose
masking takes minutes ends the turn at its deadline with one sentence that names that
work, and nothing of the turn is kept (a hostile server on 127.0.0.1, the real SDKs)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hostile_server import hostile_server
from test_guard import session

from ipy_ctxrecovery.errors import ChatError


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with hostile_server() as p:
        yield p


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_masking_a_huge_answer_stops_at_the_deadline(port: int, wire: str) -> None:
    # 4 MB of secret-like lines: masking it for the transcript and the history took
    # ~90 s here before; the turn has 3 s.
    s = session(wire, port, "dense-4", turn_timeout=3.0)
    started = time.monotonic()
    with pytest.raises(ChatError) as caught:
        s.send("hello", stream=False)
    took = time.monotonic() - started
    sentence = str(caught.value)
    assert "turn_timeout (3 seconds) ran out during masking and saving" in sentence
    assert "not while waiting for the server" in sentence and "\n" not in sentence
    assert took < 30, f"the turn took {took:.0f} s"     # a wide margin: ~3-4 s here
    # Nothing of the turn was kept but the user's message.
    assert s.history == ()
    assert [m.role.value for m in s.transcript] == ["user"]
    s.close()
