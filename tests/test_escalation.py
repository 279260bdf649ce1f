"""escalation: doubling up to the model's own cap (ANCHORS 11), continuation, stitching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import multibyte_text

from ipy_ctxrecovery.core import catalogue
from ipy_ctxrecovery.core.continuation import (
    CONTINUATION_PROMPT,
    MIN_OVERLAP_CHARS,
    Resume,
    StreamedJoin,
    continuation_message,
    next_max_tokens,
    overlap,
    resume_point,
    stitch,
)
from ipy_ctxrecovery.core.history import TAG_CONTINUATION, Role, latest_user_index
from ipy_ctxrecovery.settings import Settings

PROPS = settings(max_examples=300, deadline=None)


# -- next_max_tokens ---------------------------------------------------------------------------

def test_doubles_twice_then_stops_with_the_spec_default() -> None:
    limit = Settings().max_token_escalations
    assert limit == 2
    cap = 64_000
    assert next_max_tokens(4_096, 0, model_cap=cap, max_escalations=limit) == 8_192
    assert next_max_tokens(8_192, 1, model_cap=cap, max_escalations=limit) == 16_384
    assert next_max_tokens(16_384, 2, model_cap=cap, max_escalations=limit) is None


def test_capped_at_the_models_own_output_limit_from_the_catalogue() -> None:
    # ANCHORS 11: the cap is the catalogue's, not a hard-coded 128,000.
    sonnet35 = catalogue.lookup("claude-3-5-sonnet-20241022").max_output_tokens
    assert sonnet35 == 8_192
    assert next_max_tokens(6_000, 0, model_cap=sonnet35, max_escalations=5) == 8_192
    assert next_max_tokens(8_192, 1, model_cap=sonnet35, max_escalations=5) is None
    o3 = catalogue.lookup("o3").max_output_tokens
    assert next_max_tokens(64_000, 0, model_cap=o3, max_escalations=2) == 100_000
    gpt5 = catalogue.lookup("gpt-5").max_output_tokens
    assert next_max_tokens(100_000, 0, model_cap=gpt5, max_escalations=2) == 128_000


def test_beyond_128k_when_the_model_allows_it() -> None:
    assert next_max_tokens(100_000, 0, model_cap=300_000, max_escalations=2) == 200_000
    assert next_max_tokens(200_000, 1, model_cap=300_000, max_escalations=2) == 300_000


def test_no_escalation_when_disabled_or_at_cap() -> None:
    assert next_max_tokens(1_000, 0, model_cap=64_000, max_escalations=0) is None
    assert next_max_tokens(64_000, 0, model_cap=64_000, max_escalations=2) is None
    assert next_max_tokens(70_000, 0, model_cap=64_000, max_escalations=2) is None


# -- continuation message ------------------------------------------------------------------------

def test_continuation_message_is_the_spec_text_tagged() -> None:
    msg = continuation_message()
    assert msg.role is Role.USER
    assert msg.tag == TAG_CONTINUATION
    assert msg.text == (
        "Your response was cut off at the token limit.\n"
        "Resume DIRECTLY from where you stopped — do not repeat any content.\n"
        "Continue the implementation or explanation from the exact point of interruption.")
    assert msg.text == CONTINUATION_PROMPT


def test_continuation_is_not_taken_for_the_users_request() -> None:
    from ipy_ctxrecovery.core.history import Message

    hist = (Message.user("explain"), Message.assistant("part one"), continuation_message())
    assert latest_user_index(hist) == 0


# -- stitch (the join rule in full: test_joins.py) ---------------------------------------------
# A continuation answers the prompt that was sent the partial answer up to its last word
# (``resume_point``): the model writes that word again, whole.

def test_an_exact_resume_from_what_was_sent_is_concatenated() -> None:
    assert stitch(["w1 w2 w3", "w3 w4 w5", "w5 w6"]) == "w1 w2 w3 w4 w5 w6"
    assert stitch(["def f(x):\n    ret", "return x + 1\n"]) == "def f(x):\n    return x + 1\n"


def test_repeated_tail_is_dropped() -> None:
    first = "The ladder has three levels. Level one halves the budget and level two keeps"
    again = "level one halves the budget and level two keeps the last ten messages."
    # The continuation restarted 40+ chars back: drop exactly the repeat.
    assert stitch([first, "Level one halves the budget and level two keeps the last ten."]) \
        == "The ladder has three levels. Level one halves the budget and level two keeps the last ten."
    assert overlap(first, again) == 0          # case differs: not a repeat of the tail


def test_restarting_the_interrupted_line_is_dropped() -> None:
    first = "Steps:\n1. read the file\n2. parse the hea"
    cont = "2. parse the header\n3. done"
    assert stitch([first, cont]) == "Steps:\n1. read the file\n2. parse the header\n3. done"


def test_short_accidental_overlap_is_kept() -> None:
    # "the" / "abc " at the junction is legitimately repeated text, not a repeat of the tail.
    assert stitch(["I like the cat", "the dog"]) == "I like the the dog"
    assert stitch(["x: abc abc", "abc abc"]) == "x: abc abc abc"


def test_full_repeat_of_the_previous_part_is_dropped() -> None:
    first = "Here is the complete answer so far, cut"
    assert stitch([first, first + " off here and finished."]) == \
        first + " off here and finished."


def test_multibyte_repeat_is_dropped_on_character_boundaries() -> None:
    first = "日本語のテキストは👨‍👩‍👧家族と一緒に読みます。次の段落では" * 3
    cont = "族と一緒に読みます。次の段落では、🇧🇷 について説明します。"
    out = stitch([first, cont])
    assert out == first + "、🇧🇷 について説明します。"
    out.encode("utf-8")


def test_empty_parts() -> None:
    assert stitch([]) == ""
    assert stitch(["", "abc"]) == "abc"
    assert stitch(["abc", ""]) == "abc"


@st.composite
def _split_text(draw: st.DrawFn) -> tuple[str, int, int]:
    # Distinct words: no periodic text, so the only overlap is the one we make.
    words = [f"w{i}{draw(multibyte_text(max_pieces=2))}" for i in range(draw(st.integers(8, 60)))]
    text = " ".join(words)
    j = draw(st.integers(1, len(text)))
    r = resume_point(text[:j])
    i = draw(st.integers(0, max(r - MIN_OVERLAP_CHARS, 0)))
    return text, i if r >= MIN_OVERLAP_CHARS else r, j


@PROPS
@given(_split_text())
def test_any_repeat_of_20_or_more_chars_is_removed(case: tuple[str, int, int]) -> None:
    text, i, j = case
    assert stitch([text[:j], text[i:]]) == text


# -- what a streamed continuation shows ----------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_a_streamed_continuation_shows_what_the_join_adds_however_it_is_chunked(
        chunk: int) -> None:
    resume = Resume()
    first = 'The emulator says you said "An'          # cut mid-word: "An is sent again
    continuation = '"Another essay, please" and then some more words ' * 6
    shown = StreamedJoin(resume, [first], first)
    out = [shown.feed(continuation[i:i + chunk]) for i in range(0, len(continuation), chunk)]
    out.append(shown.flush())
    assert first + "".join(out) == resume.join([first, continuation]) == shown.shown
    assert "".join(out).startswith('other essay')         # "An is not shown twice


def test_a_short_continuation_is_held_until_the_request_ends_and_a_divergent_one_shown_as_sent(
        ) -> None:
    resume = Resume()
    short = StreamedJoin(resume, ["one two thr"], "one two thr")
    assert short.feed("three.") == ""                     # under HOLD: held back
    assert short.flush() == "ee." and short.shown == "one two three."
    # The cut word written differently: what is shown cannot be taken back, so the
    # continuation goes out as the model sent it.
    other = StreamedJoin(resume, ["one two thr"], "one two thr")
    text = "four " * 60
    assert other.feed(text) == text and other.flush() == ""


def test_a_whole_paragraph_sent_again_is_shown_once() -> None:
    # QA: a repeat longer than HOLD was shown twice (the join dropped it from the answer).
    resume = Resume()
    first = ("Intro line.\n\n" + "The second paragraph explains the cap, the window and "
             "why each one matters to a long session of work. " * 5)
    repeat = first[len("Intro line.\n\n"):]                 # the paragraph, again
    continuation = repeat + "And here is what comes next, new text at last."
    assert len(repeat) > StreamedJoin.HOLD
    for chunk in (1, 7, 10_000):
        shown = StreamedJoin(resume, [first], first)
        out = [shown.feed(continuation[i:i + chunk]) for i in range(0, len(continuation), chunk)]
        out.append(shown.flush())
        assert first + "".join(out) == resume.join([first, continuation]) == shown.shown
        assert "".join(out).lstrip().startswith("And here is what comes next")
