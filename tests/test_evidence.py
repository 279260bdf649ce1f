"""core.recovery.evidence: limits inferred from what a network path showed, per signature;
and, end to end, what a session learns (and does not) from a refusal."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipy_ctxrecovery import ChatError, ChatSession, describe
from ipy_ctxrecovery.core.recovery.evidence import Caps, Finding, PathEvidence
from ipy_ctxrecovery.failures import Signature
from ipy_ctxrecovery.session.learned import PathRegistry

KB = 1024
INFERRED = [Signature.BLOCK, Signature.DROP, Signature.BARE_5XX, Signature.BAD_BODY]


def passed(size: int) -> PathEvidence:
    path = PathEvidence()
    path.passed(size)
    return path


def test_a_413_above_what_passed_is_a_limit_at_once() -> None:
    path = passed(40 * KB)
    seen = path.observe(Signature.SIZE, 64 * KB)
    assert seen.finding is Finding.LIMIT and path.smallest_rejected == 64 * KB


@pytest.mark.parametrize("signature", INFERRED)
def test_an_inferred_refusal_is_a_suspect_until_it_repeats(signature: Signature) -> None:
    path = passed(40 * KB)
    assert path.observe(signature, 64 * KB).finding is Finding.SUSPECT
    assert path.smallest_rejected is None            # no cap in force from one refusal
    seen = path.observe(signature, 70 * KB)          # again, above what passed
    assert seen.finding is Finding.LIMIT and path.smallest_rejected == 64 * KB


@pytest.mark.parametrize("signature", INFERRED)
def test_a_refusal_no_bigger_than_what_passed_is_not_about_size(signature: Signature) -> None:
    path = passed(100 * KB)
    assert path.observe(signature, 12 * KB).finding is Finding.NOT_SIZE
    assert (path.smallest_rejected, path.suspect(signature)) == (None, None)


def test_a_smaller_refusal_of_the_same_kind_withdraws_its_limit() -> None:
    # A block page at 64 KB twice (a limit), then a block of 30 KB though 40 KB passed:
    # content, not size, so the block's limit goes.
    path = passed(40 * KB)
    path.observe(Signature.BLOCK, 64 * KB)
    path.observe(Signature.BLOCK, 64 * KB)
    assert path.smallest_rejected == 64 * KB
    seen = path.observe(Signature.BLOCK, 30 * KB)
    assert seen.finding is Finding.NOT_SIZE and seen.withdrawn == 64 * KB
    assert path.smallest_rejected is None


def test_the_withdrawal_keeps_the_limits_of_other_signatures() -> None:
    path = passed(40 * KB)
    path.observe(Signature.SIZE, 60 * KB)             # ModSecurity's body limit: a 413
    path.observe(Signature.BLOCK, 20 * KB)            # its content rules: a 403
    assert path.smallest_rejected == 60 * KB


def test_a_bigger_body_that_passes_withdraws_the_limit_and_the_suspect() -> None:
    path = passed(10 * KB)
    path.observe(Signature.SIZE, 30 * KB)
    path.observe(Signature.DROP, 50 * KB)
    assert path.passed(60 * KB) == 30 * KB
    assert (path.smallest_rejected, path.suspect(Signature.DROP)) == (None, None)


@given(st.lists(st.tuples(st.sampled_from([None, *Signature]), st.integers(1, 10**6),
                          st.booleans()), max_size=40))
def test_the_cap_is_never_below_the_largest_body_that_passed(
        events: list[tuple[Signature | None, int, bool]]) -> None:
    caps = Caps()
    for signature, size, ok in events:
        if ok:
            caps.record_success(size)
        else:
            caps.observe(signature, size)
        cap, rejected = caps.learned, caps.smallest_rejected
        if cap is not None and rejected is not None and rejected > caps.largest_ok:
            assert caps.largest_ok <= cap < rejected


# -- end to end: a session behind the emulator -----------------------------------------------

def test_one_waf_block_of_a_small_message_leaves_the_paths_cap_alone(emulator: Any) -> None:
    emu = emulator(context_window=128_000)
    paths = PathRegistry()
    with ChatSession("emulator", emulator=emu, name="big", paths=paths) as big, \
            ChatSession("emulator", emulator=emu, name="other", paths=paths) as other:
        big.send("x" * 100 * KB)                 # 100 KB passes on this path
        emu.script("waf")                        # one block by a content rule
        with contextlib.suppress(ChatError):     # this turn itself may still give up
            other.send("hello " * 2000)          # a 12 KB message
        assert [r.status for r in emu.requests][:2] == [200, 403]
        assert big.caps.effective() is None and other.caps.smallest_rejected is None
        big.send("y" * 20 * KB)                  # still sendable: nothing was learned
        assert [r.status for r in emu.requests][-1] == 200


def test_a_block_not_about_size_gives_up_at_once_with_the_history_untouched(emulator: Any
                                                                              ) -> None:
    emu = emulator(context_window=128_000)
    paths = PathRegistry()
    with ChatSession("emulator", emulator=emu, name="big", paths=paths) as big, \
            ChatSession("emulator", emulator=emu, name="s", paths=paths) as s:
        big.send("x" * 100 * KB)
        s.send("a first question")
        before = s.history
        emu.script("waf")
        with pytest.raises(ChatError) as caught:
            s.send("hello " * 2000)              # 12 KB
        said = str(caught.value)
        assert "firewall blocked" in said and "not about size" in said
        assert "(101 KB) went through" in said and "latest message" in said
        assert [r.status for r in emu.requests] == [200, 200, 403]    # no compacted resend
        assert s.history == before and s.status().compactions == 0
        s.send("something else")
        assert [r.status for r in emu.requests][-1] == 200


def test_a_drop_on_a_size_this_path_carried_is_retried_once_as_it_is(emulator: Any) -> None:
    emu = emulator(context_window=1_000_000)
    paths = PathRegistry()
    with ChatSession("emulator", emulator=emu, name="big", paths=paths) as big, \
            ChatSession("emulator", emulator=emu, name="s", paths=paths) as s:
        big.send("x" * 900 * KB)
        lines: list[str] = []
        s.subscribe(lambda e: lines.append(describe(e)))
        emu.script("drop")
        s.send("y" * 600 * KB)                   # dropped once, then carried
        sizes = [r.body_bytes for r in emu.requests]
        assert [r.status for r in emu.requests] == [200, None, 200]
        assert sizes[1] == sizes[2]              # the same body again, not a compacted one
        assert s.caps.smallest_rejected is None and s.status().compactions == 0
        assert any("retrying once as it is" in line for line in lines)


def test_a_silent_drop_limit_is_learned_from_two_refusals_and_never_sent_again(
        emulator: Any) -> None:
    # A proxy dropping bodies over 40 KB (nginx's `return 444`), well under the 500 KB the
    # classifier needs to call a drop a payload problem: the evidence decides, not the size.
    emu = emulator(context_window=1_000_000, drop_over=40 * KB)
    lines: list[str] = []
    with ChatSession("emulator", emulator=emu) as s:
        s.subscribe(lambda e: lines.append(describe(e)))
        for turn in range(12):
            s.send(f"turn {turn}: " + "words and numbers 12345 " * 250)   # ~6 KB a turn
        statuses = [r.status for r in emu.requests]
        assert statuses.count(None) == 2, statuses       # two drops: suspect, then a limit
        assert len(s.transcript) >= 24                   # every turn answered and kept
        rejected = s.caps.smallest_rejected
        assert rejected is not None and s.caps.learned is not None
        assert s.caps.learned >= s.caps.largest_ok
        later = emu.requests[statuses.index(None) + 3:]
        assert all(r.body_bytes < rejected for r in later)
        assert any("a second refusal means a size limit" in line for line in lines)
        assert any("Learned a payload limit" in line and "dropped" in line for line in lines)


def test_a_block_that_comes_back_once_smaller_is_content_and_teaches_nothing(
        emulator: Any) -> None:
    # A WAF's content rule on the latest message, which is the largest request so far: the
    # first block looks like a size limit; the same request made smaller is blocked again,
    # so it is content. One smaller retry, then the turn stops with the history as it was.
    emu = emulator(context_window=128_000)
    lines: list[str] = []
    with ChatSession("emulator", emulator=emu) as s:
        s.subscribe(lambda e: lines.append(describe(e)))
        for turn in range(4):
            s.send(f"turn {turn}: " + "plain words about the quarter " * 200, stream=False)
        before = s.history
        emu.script("waf", "waf")
        start = len(emu.requests)
        with pytest.raises(ChatError) as caught:
            s.send("the message a rule blocks " + "x" * 9_000, stream=False)
        blocked = [r for r in emu.requests[start:] if r.status == 403]
        assert len(blocked) == 2 and blocked[1].body_bytes < blocked[0].body_bytes
        assert len(emu.requests[start:]) == 2 + sum(1 for r in emu.requests[start:]
                                                     if r.status == 200)   # summaries only
        assert "blocked it again when it was made smaller" in str(caught.value)
        assert s.history == before
        assert s.caps.learned is None and s.caps.smallest_rejected is None
        assert any("fitting it under about" in line for line in lines)
        assert any("Withdrew the payload limit" in line and "its content" in line
                   for line in lines)
        s.send("and the conversation goes on", stream=False)
