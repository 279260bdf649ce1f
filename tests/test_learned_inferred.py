"""A WAF 403 or a dropped connection on a body no bigger than one that already went through
on the same path teaches no payload cap (it was not about size); a 413 always does."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from ipy_ctxrecovery import ChatError, ChatSession, Failure, FailureKind, Settings, describe
from ipy_ctxrecovery.session.learned import LearnedLimits, PathRegistry

KB = 1024


def _limits_after_success(size: int) -> LearnedLimits:
    limits = LearnedLimits.fresh(Settings())
    limits.on_success(size, None)
    return limits


@pytest.mark.parametrize("kind", [FailureKind.WAF_REJECTION, FailureKind.LIKELY_PAYLOAD])
def test_an_inferred_rejection_below_a_success_teaches_nothing(kind: FailureKind) -> None:
    limits = _limits_after_success(100 * KB)
    assert limits.learn_from_failure(Failure(kind, "blocked", status=403), 12 * KB,
                                     window=128_000) == []
    assert (limits.caps.effective(), limits.caps.smallest_rejected) == (None, None)


def test_an_inferred_rejection_above_every_success_still_teaches_a_cap() -> None:
    limits = _limits_after_success(100 * KB)
    events = limits.learn_from_failure(
        Failure(FailureKind.WAF_REJECTION, "blocked", status=403), 200 * KB, window=128_000)
    assert [e.cap for e in events] == [150 * KB]                 # ¾ of the rejected size
    assert limits.caps.smallest_rejected == 200 * KB


def test_a_413_below_a_success_is_believed() -> None:
    # The proxy said "too large" in so many words: its limit may have been lowered since.
    limits = _limits_after_success(100 * KB)
    limits.learn_from_failure(Failure(FailureKind.PAYLOAD_TOO_LARGE, "413", status=413),
                              12 * KB, window=128_000)
    assert limits.caps.smallest_rejected == 12 * KB
    assert limits.caps.effective() == 12 * KB - 1


def test_one_waf_block_of_a_small_message_leaves_the_paths_cap_alone(emulator: Any) -> None:
    emu = emulator(context_window=128_000)
    paths = PathRegistry()
    big = ChatSession("emulator", emulator=emu, name="big", paths=paths)
    other = ChatSession("emulator", emulator=emu, name="other", paths=paths)
    try:
        big.send("x" * 100 * KB)                 # 100 KB passes on this path
        emu.script("waf")                        # one block by a content rule
        with contextlib.suppress(ChatError):     # this turn itself may still give up
            other.send("hello " * 2000)          # a 12 KB message
        assert [r.status for r in emu.requests][:2] == [200, 403]
        assert big.caps.effective() is None and other.caps.smallest_rejected is None
        big.send("y" * 20 * KB)                  # still sendable: nothing was learned
        assert [r.status for r in emu.requests][-1] == 200
    finally:
        big.close()
        other.close()


def test_a_block_not_about_size_gives_up_at_once_with_the_history_untouched(emulator: Any
                                                                              ) -> None:
    emu = emulator(context_window=128_000)
    paths = PathRegistry()
    with ChatSession("emulator", emulator=emu, name="big", paths=paths) as big, \
            ChatSession("emulator", emulator=emu, name="s", paths=paths) as s:
        big.send("x" * 100 * KB)                 # 100 KB passes on this path
        s.send("a first question")
        before = s.history
        emu.script("waf")                        # a content rule blocks the next message
        with pytest.raises(ChatError) as caught:
            s.send("hello " * 2000)              # 12 KB
        said = str(caught.value)
        assert "firewall blocked" in said and "not about size" in said
        assert "(101 KB) went through" in said and "latest message" in said
        assert [r.status for r in emu.requests] == [200, 200, 403]    # no compacted resend
        assert s.history == before and s.status().compactions == 0
        s.send("something else")                 # and the conversation goes on
        assert [r.status for r in emu.requests][-1] == 200


def test_a_drop_on_a_size_this_path_carried_is_retried_once_as_it_is(emulator: Any) -> None:
    emu = emulator(context_window=1_000_000)
    paths = PathRegistry()
    with ChatSession("emulator", emulator=emu, name="big", paths=paths) as big, \
            ChatSession("emulator", emulator=emu, name="s", paths=paths) as s:
        big.send("x" * 900 * KB)                 # 900 KB passes on this path
        lines: list[str] = []
        s.subscribe(lambda e: lines.append(describe(e)))
        emu.script("drop")
        s.send("y" * 600 * KB)                   # dropped once, then carried
        sizes = [r.body_bytes for r in emu.requests]
        assert [r.status for r in emu.requests] == [200, None, 200]
        assert sizes[1] == sizes[2]              # the same body again, not a compacted one
        assert s.caps.smallest_rejected is None and s.status().compactions == 0
        assert any("retrying once as it is" in line for line in lines)
