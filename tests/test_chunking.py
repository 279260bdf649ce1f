"""Tests for the summarizer-input planner (core/chunking.py): every message whole, each
request within its bound, labelled parts at clean cuts, the request bound's drops."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ipy_ctxrecovery.core import chunking, markers
from ipy_ctxrecovery.core.history import TAG_SUMMARY, Message, ToolCall
from ipy_ctxrecovery.core.prompts import summary_header


def conversation(n: int, size: int) -> list[Message]:
    out: list[Message] = []
    for t in range(n):
        out += [Message.user(f"question {t}: what is in part {t}?"),
                Message.assistant(f"reading {t}", [ToolCall(f"c{t}", "read_file", '{"p":1}')]),
                Message.tool(f"c{t}", "\n".join(f"line {t}.{i} " + "v" * 40
                                                for i in range(size // 50)), name="read_file"),
                Message.assistant(f"answer {t}: fact-{t} is 4{t}.5 ms")]
    return out


def sent_texts(plan: chunking.ChunkPlan, instructions: str | None = None) -> list[str]:
    """Every request's text, with a stand-in summary so far of the full room."""
    so_far = "x" * (plan.summary_room - 200)
    return [chunking.request_text(plan, k, so_far if k else None, instructions)
            for k in range(plan.requests)]


def test_messages_that_fit_one_request_are_one_request_as_before() -> None:
    msgs = conversation(2, 500)
    plan = chunking.plan(msgs, bound=120_000, summary_max_chars=16_000, max_requests=8)
    assert plan.requests == 1 and plan.dropped == () and plan.read == tuple(msgs)
    (text,) = sent_texts(plan)
    assert text.startswith(markers.preamble(8) + "\n\n")
    assert "requests" not in text.split("\n\n")[0]       # no word of chunks for one request
    for i, m in enumerate(msgs, start=1):
        assert f"Message {i} of 8, " in text and chunking.body_of(m) in text


@pytest.mark.parametrize("bound", [3_000, 7_000, 20_000])
def test_every_request_fits_its_bound_and_every_message_is_read_whole_or_in_parts(
        bound: int) -> None:
    msgs = conversation(6, 9_000)
    plan = chunking.plan(msgs, bound=bound, summary_max_chars=16_000, max_requests=1_000,
                         instructions="keep the numbers")
    assert plan.dropped == () and plan.requests > 1
    texts = sent_texts(plan, "keep the numbers")
    assert all(len(t) <= bound for t in texts)
    # Each message's body, whole in one piece or its parts in order, never cut down.
    for i, m in enumerate(msgs, start=1):
        pieces = [p for c in plan.chunks for p in c.pieces if p.message == i]
        assert [p.part for p in pieces] == list(range(1, len(pieces) + 1))
        assert all(p.parts == len(pieces) for p in pieces)
        body = chunking.body_of(m)
        if len(pieces) == 1:
            assert pieces[0].body == body
        else:
            assert "\n".join(p.body for p in pieces) == body      # cut at line ends only here
            assert all(f"Message {i} of {len(msgs)}, part {p.part} of {p.parts}, " in p.text
                       for p in pieces)
        for p in pieces:
            assert any(p.text in t for t in texts)
    assert "The summary so far: " in texts[1] and "The summary so far" not in texts[0]
    assert all("chars omitted" not in t for t in texts)


def test_a_message_with_no_line_breaks_is_split_at_word_ends() -> None:
    words = " ".join(f"word{i}" for i in range(3_000))
    plan = chunking.plan([Message.user(words), Message.assistant("ok")], bound=4_000,
                         summary_max_chars=16_000, max_requests=100)
    parts = [p.body for c in plan.chunks for p in c.pieces if p.message == 1]
    assert len(parts) > 3 and " ".join(parts) == words
    assert all(re.fullmatch(r"word\d+( word\d+)*", p) for p in parts)


@hsettings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab \n\té🇫🇷"), min_size=0, max_size=3_000),
       cap=st.integers(min_value=1, max_value=700))
def test_split_body_keeps_every_char_but_the_whitespace_at_each_cut(text: str, cap: int) -> None:
    parts = chunking.split_body(text, cap)
    assert all(len(p) <= cap for p in parts)
    rebuilt = parts[0]
    at = len(parts[0])
    for part in parts[1:]:
        gap = text[at:text.index(part, at) if part else at]
        assert gap == "" or gap.isspace()           # only the newline(s) or space at a cut
        rebuilt += part
        at += len(gap) + len(part)
    assert text[at:] == "" or text[at:].isspace()  # at most a cut's space at the end
    assert rebuilt == "".join(parts)


def test_past_the_request_bound_the_oldest_are_dropped_and_an_earlier_summary_kept() -> None:
    earlier = Message.user(summary_header(9) + "\n## Key decisions\n- keep 0.5 threshold",
                           tag=TAG_SUMMARY)
    msgs = [earlier, *conversation(8, 6_000)]
    full = chunking.plan(msgs, bound=8_000, summary_max_chars=16_000, max_requests=1_000)
    assert full.requests > 3
    plan = chunking.plan(msgs, bound=8_000, summary_max_chars=16_000, max_requests=3)
    assert 1 <= plan.requests <= 3
    assert plan.read[0] is earlier                  # pinned: it carries most per char
    assert plan.read[1:] == tuple(msgs[len(msgs) - len(plan.read) + 1:])   # the newest
    assert len(plan.read) + len(plan.dropped) == len(msgs)
    assert plan.dropped == tuple(msgs[1:1 + len(plan.dropped)])           # the oldest
    assert plan.read[1].role.value != "tool"        # never a result without its call
    # The fewest were dropped: one more message read would need a fourth request.
    more = chunking.plan([earlier, *msgs[len(msgs) - len(plan.read):]], bound=8_000,
                         summary_max_chars=16_000, max_requests=1_000)
    assert more.requests > 3 or plan.read[1] is msgs[1]


def test_the_summary_so_far_has_room_in_every_later_request() -> None:
    msgs = conversation(5, 5_000)
    plan = chunking.plan(msgs, bound=9_000, summary_max_chars=16_000, max_requests=100)
    assert plan.summary_room == 3_000               # a third of the bound
    for k in range(1, plan.requests):
        text = chunking.request_text(plan, k, "s" * plan.summary_room)
        assert len(text) <= 9_000


def test_the_framing_is_taken_off_by_unframe_line() -> None:
    label = markers.label(3, 12, markers.SummaryLabel("user"), part=2, parts=4)
    line = f"{label} the middle of it {markers.end_mark(3, part=2, parts=4)}"
    assert markers.unframe_line(line) == (["the middle of it"], True)
    rolling = f"{markers.rolling_label()} - fact-1 is 41.5 ms {markers.ROLLING_END}"
    assert markers.unframe_line(rolling) == (["- fact-1 is 41.5 ms"], True)
