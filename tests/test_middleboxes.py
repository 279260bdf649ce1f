"""Issue 24: 40-turn conversations through real middleboxes, on both wires.

Each middlebox (tests/middleboxes.py) runs from its Debian package on 127.0.0.1 with a
body limit of ``LIMIT`` in front of an emulator with no limits of its own; the session
talks to it through the real SDK clients with their defaults (retries included). ~6 KB
turns reach the limit at turn 9 and keep pressing on it for 30 turns. What must hold, for
every kind and wire:

- every turn answered (but a turn planted with content the WAF blocks, which may fail
  with one clear sentence);
- at most two rejected requests per distinct limit, counted in the middlebox's own access
  log (so the SDK's retries count): the size limit, and each planted message;
- the learned cap never below the largest body that passed (what the upstream answered);
- every user message in the transcript.

Behind ModSecurity the package's own requests (summaries, previews, the merged run) pass
the Core Rule Set (``core/markers.py``); bench/middleboxes.py prints the whole-run figures.
Locally a missing program skips its kind with one line; under ``CI=true`` it fails.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import middlebox_chat as chat
import pytest
from middleboxes import KINDS, Logged, Middlebox

from ipy_ctxrecovery import Emulator

pytestmark = pytest.mark.middlebox

LIMIT = 56 * 1024
TURNS = 40
PER_LIMIT = 2           # rejections allowed per distinct limit (issue 24)

_names = (f"box-{n:03d}" for n in itertools.count(1))


@pytest.fixture(scope="module")
def box(middlebox: Callable[..., Middlebox], upstream: Emulator) -> Callable[[str], Middlebox]:
    """One middlebox per kind for the module (they keep no state a run could leak)."""
    running: dict[str, Middlebox] = {}

    def get(kind: str) -> Middlebox:
        if kind not in running:
            running[kind] = middlebox(kind, upstream.url, limit=LIMIT)
        return running[kind]

    return get


@dataclass
class Run:
    """What one conversation left: the box's log lines for it, and the session's view."""

    logged: list[Logged]
    answered: list[int]
    failed: dict[int, str]
    user_texts: list[str]


def converse(box: Middlebox, upstream: Emulator, wire: str, texts: list[str],
             *, may_fail: frozenset[int] = frozenset()) -> Run:
    """Run the conversation; stop at the first turn that breaks a per-turn rule (so a
    failing kind fails in seconds, not after 30 doomed turns)."""
    before = len(box.requests())
    answered: list[int] = []
    failed: dict[int, str] = {}
    with chat.new_session(wire, box, upstream, next(_names)) as session:
        for turn in chat.session_turns(session, texts, upstream):
            if turn.answered:
                answered.append(turn.index)
            else:
                failed[turn.index] = turn.error or ""
                assert turn.index in may_fail, \
                    f"turn {turn.index} was not answered. {_context(box, before, turn)}"
            assert turn.learned_cap is None or turn.learned_cap >= turn.largest_passed, (
                f"learned cap {turn.learned_cap:,} B is below a body that passed "
                f"({turn.largest_passed:,} B). {_context(box, before, turn)}")
        return Run(box.requests()[before:], answered, failed, chat.user_texts(session))


def _context(box: Middlebox, before: int, turn: chat.Turn) -> str:
    seen = box.requests()[before:]
    rejected = [(r.status, r.body_bytes) for r in seen if r.status != 200]
    return (f"Error: {turn.error!r}; learned cap {turn.learned_cap}, largest passed "
            f"{turn.largest_passed:,} B; {box.kind} rejected {len(rejected)} of {len(seen)} "
            f"requests so far (status, bytes): {rejected[:12]}")


def rejections(run: Run) -> Counter[int]:
    return Counter(r.status for r in run.logged if r.status != 200)


@pytest.mark.parametrize("wire", chat.WIRES)
@pytest.mark.parametrize("kind", KINDS)
def test_forty_turns_behind_a_real_middlebox(kind: str, wire: str, box: Callable[[str], Middlebox],
                                             upstream: Emulator) -> None:
    texts = chat.script(TURNS)
    run = converse(box(kind), upstream, wire, texts)
    assert len(run.answered) == TURNS
    rejected = rejections(run)
    # The limit really was hit: otherwise this proves nothing about recovery.
    assert rejected, f"{kind} rejected nothing: the conversation never reached {LIMIT:,} B"
    assert sum(rejected.values()) <= PER_LIMIT, (
        f"{kind} rejected {sum(rejected.values())} requests for one limit (by status: "
        f"{dict(rejected)}); at most {PER_LIMIT}")
    assert all(text in run.user_texts for text in texts)


@pytest.mark.parametrize("wire", chat.WIRES)
@pytest.mark.parametrize("at", [
    pytest.param(chat.PLANTED_EARLY, id="early"), pytest.param(chat.PLANTED_LATE, id="late")])
def test_modsecurity_blocks_one_message_for_its_content(at: int, wire: str,
                                                        box: Callable[[str], Middlebox],
                                                        upstream: Emulator) -> None:
    """A message CRS blocks for what it says, early or late in the session: that turn may
    fail with one sentence; every other turn is answered and the cap holds."""
    texts = chat.script(TURNS, planted={at: chat.SQL_INJECTION})
    run = converse(box("modsec"), upstream, wire, texts, may_fail=frozenset({at}))
    assert len(run.answered) >= TURNS - 1
    for sentence in run.failed.values():
        assert sentence and "\n" not in sentence and "Traceback" not in sentence, sentence
    rejected = rejections(run)
    assert rejected[403] >= 1, "CRS let the planted SQL injection through"
    # Two distinct limits: the body size (413) and this one message's content (403).
    assert rejected[403] <= PER_LIMIT and rejected[413] <= PER_LIMIT, dict(rejected)
    assert set(rejected) <= {403, 413}, dict(rejected)
    assert all(text in run.user_texts for text in texts)
