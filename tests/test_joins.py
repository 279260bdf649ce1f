"""The continuation join rule (escalation: resume_point, join, stitch, Resume): every place
an answer can be cut, every way a model resumes in a new message, and the prefill path."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anthropic
import openai
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ipy_ctxrecovery.core import catalogue
from ipy_ctxrecovery.core.continuation import (
    CONTINUATION_PROMPT,
    MAX_RETRACT_CHARS,
    Resume,
    StreamedJoin,
    join,
    join_report,
    resume_for,
    resume_point,
    stitch,
    strip_meta_opener,
)
from ipy_ctxrecovery.core.history import TAG_CONTINUATION, Role
from ipy_ctxrecovery.providers.anthropic import AnthropicProvider
from ipy_ctxrecovery.providers.openai import OpenAIProvider

PROPS = settings(max_examples=400, deadline=None)
NOWHERE = "http://127.0.0.1:9"


def sent(previous: str) -> str:
    """What the model is sent back of ``previous`` before the continuation prompt."""
    return previous[:resume_point(previous)]


# -- the documented cases ------------------------------------------------------------------------

def test_a_cut_at_a_word_boundary_resumes_at_that_word_and_keeps_the_space() -> None:
    # The bug: "…w99" + "w100…" (a new message has no leading space) became "w99w100".
    cut = "w96 w97 w98 w99"
    assert sent(cut) == "w96 w97 w98 "
    assert join(cut, "w99 w100 w101") == "w96 w97 w98 w99 w100 w101"
    assert join(cut, " w99 w100") == "w96 w97 w98 w99 w100"       # a leading space is harmless


def test_a_cut_mid_word_resumes_at_the_start_of_the_word() -> None:
    cut = "The answer is forty-tw"
    assert sent(cut) == "The answer is "
    assert join(cut, "forty-two, and that is all.") == "The answer is forty-two, and that is all."


def test_a_cut_mid_line_keeps_the_line_and_its_newline() -> None:
    cut = "Steps:\n1. read the file\n2. parse the hea"
    assert sent(cut) == "Steps:\n1. read the file\n2. parse the "
    assert join(cut, "header\n3. done") == "Steps:\n1. read the file\n2. parse the header\n3. done"
    # Restarting the interrupted line, with or without its number, is not repeated.
    assert join(cut, "2. parse the header\n3. done") == join(cut, "header\n3. done")
    # A cut right after a line: the last word goes back too, so the newline that a new
    # message would drop is already in what was sent.
    assert sent("one two\nthree four\n") == "one two\nthree "
    assert join("one two\nthree four\n", "four\n\nfive") == "one two\nthree four\n\nfive"


def test_a_cut_inside_a_code_block_keeps_indentation_and_the_block_open() -> None:
    cut = "Code:\n```python\nfor i in range(3):\n    pri"
    assert sent(cut) == "Code:\n```python\nfor i in range(3):\n    "
    whole = "Code:\n```python\nfor i in range(3):\n    print(i)\n```"
    assert join(cut, "print(i)\n```") == whole
    # The line restarted with its indentation, or without it.
    assert join(cut, "    print(i)\n```") == whole
    assert join("Code:\n```python\nx = 1\n    y = f(", "y = f(x)\n```") == \
        "Code:\n```python\nx = 1\n    y = f(x)\n```"
    # The block opened again: the fence line is dropped, and so is a restart of the block.
    assert join(cut, "```python\nprint(i)\n```") == whole
    assert join(cut, "```python\nfor i in range(3):\n    print(i)\n```") == whole


def test_a_fence_without_info_string_is_kept_as_it_may_close_the_block() -> None:
    cut = "```\nx = 1\ny = 2"
    assert join(cut, "2\n```\nDone.") == "```\nx = 1\ny = 2\n```\nDone."
    # A fence starts a block: the held-back "2" is put back before it (rule 7).
    assert join(cut, "```\nmore") == "```\nx = 1\ny = 2\n```\nmore"


def test_cjk_text_without_spaces_is_glued_not_spaced() -> None:
    cut = "前置き。" + "日本語のテキストは家族と一緒に読みます。" * 4 + "次の段落では"
    # A run too long for a word: only its last character is held back.
    assert sent(cut) == cut[:-1]
    assert join(cut, "は、漢字について説明します。") == cut + "、漢字について説明します。"
    # A repeat of ≥ 20 UTF-8 bytes (7 CJK characters) is dropped.
    assert join(cut, "一緒に読みます。次の段落では、漢字。") == cut + "、漢字。"
    # Emoji sequences are never split.
    family = "はい" * 50 + "👨‍👩‍👧"
    assert sent(family) == "はい" * 50
    # A short CJK run is a word like any other.
    assert sent("漢字 かな") == "漢字 "


def test_a_long_run_is_not_taken_for_a_word() -> None:
    url = "see https://example.com/" + "a" * MAX_RETRACT_CHARS
    assert sent(url) == url[:-1]
    assert join(url, "a/b and more") == url + "/b and more"


def test_a_repeat_of_twenty_characters_anywhere_is_dropped() -> None:
    first = "The ladder has three levels. Level one halves the budget and level two keeps"
    assert stitch([first, "Level one halves the budget and level two keeps the last ten."]) \
        == "The ladder has three levels. Level one halves the budget and level two keeps the last ten."


def test_a_short_repeat_inside_a_line_or_of_whole_lines_is_real_text() -> None:
    # "the " again at the junction is not a restart of the line: kept.
    assert join("I like the cat", "the dog") == "I like the the dog"
    # The whole answer so far, repeated: a restart.
    assert join("Intro:\n\nw1 w2", "Intro:\n\nw1 w2 w3") == "Intro:\n\nw1 w2 w3"
    # Two closing braces, two fences: whole lines that repeat are text, not a restart.
    assert join("  }\n}\nend", "}\nend") == "  }\n}\n}\nend"
    assert join("```\nx\n```\nnext", "```\ny\n```") == "```\nx\n```\n```\ny\n```"


def test_nothing_visible_or_nothing_new_leaves_the_answer_as_it_was() -> None:
    assert join("abc def", "") == "abc def"
    assert join("abc def", " \n") == "abc def"
    assert stitch([]) == "" and stitch(["", "abc"]) == "abc" and stitch(["abc", ""]) == "abc"
    # A repeat cut off before it got past what was sent: nothing new yet.
    first = "The ladder has three levels. Level one halves the budget and level two keeps"
    assert join(first, "Level one halves the budg") == first
    assert join("Steps:\n1. read\n2. parse the hea", "2. par") == "Steps:\n1. read\n2. parse the hea"


def test_a_blank_or_one_word_answer_starts_over() -> None:
    assert sent("a") == sent("Hello, ") == sent("   ") == sent("") == ""
    assert stitch(["Hello, ", "Hello, world."]) == "Hello, world."


# -- Resume: what is sent, how parts join ----------------------------------------------------------

def test_resume_by_prompt_sends_the_retracted_partial_and_the_prompt() -> None:
    resume = Resume()
    assert resume.messages([]) == ()
    partial, prompt = resume.messages(["w1 w2 w3", "w3 w4 w5"])
    assert partial.role is Role.ASSISTANT and partial.text == "w1 w2 w3 w4 "
    assert prompt.text == CONTINUATION_PROMPT
    assert partial.tag == prompt.tag == TAG_CONTINUATION       # neither stays in the history
    assert resume.join(["w1 w2 w3", "w3 w4 w5", "w5 w6"]) == "w1 w2 w3 w4 w5 w6"


def test_resume_by_prefill_sends_the_partial_without_trailing_whitespace_and_concatenates() -> None:
    resume = Resume(prefill=True)
    (partial,) = resume.messages(["w1 w2 w", "3 w4 \n\n"])
    assert partial.role is Role.ASSISTANT and partial.tag == TAG_CONTINUATION
    assert partial.text == "w1 w2 w3 w4"                 # the API rejects trailing whitespace
    # The model continues the exact text it was given: mid-word, and the whitespace again.
    assert resume.join(["w1 w2 w", "3 w4 \n\n", "\n\nw5"]) == "w1 w2 w3 w4\n\nw5"
    assert resume.join(["w1 w2 w", ""]) == "w1 w2 w"


def test_the_provider_decides_prefill_from_the_catalogue_and_the_options() -> None:
    def anthropic_provider(model: str) -> AnthropicProvider:
        return AnthropicProvider(model, client=anthropic.Anthropic(
            base_url=NOWHERE, api_key="sk-ant-x", max_retries=0))

    older, newer = anthropic_provider("claude-sonnet-4-5-20250929"), anthropic_provider("claude-opus-4-6")
    assert resume_for(older, {}).prefill
    assert not resume_for(newer, {}).prefill                 # Claude 4.6+ rejects a prefill
    assert not resume_for(anthropic_provider("claude-something-new"), {}).prefill
    # Extended thinking rejects a prefill, on any model; disabled thinking does not.
    assert not resume_for(older, {"thinking": {"type": "enabled", "budget_tokens": 2048}}).prefill
    assert not resume_for(older, {"extra_body": {"thinking": {"type": "adaptive"}}}).prefill
    assert resume_for(older, {"thinking": {"type": "disabled"}}).prefill
    # The OpenAI wire has no prefill; a provider without the method gets the prompt.
    gpt = OpenAIProvider("gpt-4o", client=openai.OpenAI(base_url=NOWHERE, api_key="sk-x"))
    assert not resume_for(gpt, {}).prefill
    assert not resume_for(object()).prefill
    for p in (older, newer, gpt):
        p.close()


def test_prefill_capability_is_catalogue_data() -> None:
    assert catalogue.lookup("claude-3-5-sonnet-20241022").assistant_prefill
    assert catalogue.lookup("anthropic.claude-3-7-sonnet-20250219-v1:0").assistant_prefill
    assert catalogue.lookup("claude-opus-4-20250514").assistant_prefill
    assert catalogue.lookup("emulator").assistant_prefill
    for model in ("claude-opus-4-6", "claude-sonnet-4-6", "claude-opus-4-8", "claude-fable-5",
                  "claude-opus-5-5", "gpt-4o", "llama3:8b"):
        assert not catalogue.lookup(model).assistant_prefill, model
    # An override of the window keeps the capability.
    assert catalogue.lookup("claude-haiku-4-5", context_window=50_000).assistant_prefill
    assert set(catalogue.PREFILL_FAMILIES) <= set(catalogue.MODELS)


# -- properties: any text, any cut, any way of resuming ---------------------------------------------

_SUFFIX = st.sampled_from(["", "", "", ",", ".", "!", "é", "日本", "—x", "🇧🇷"])
_CJK_START = 0x4E00


@st.composite
def documents(draw: st.DrawFn) -> str:
    """Prose, lists, fenced code and CJK paragraphs made of distinct words (so the only
    repeats are the ones a model makes)."""
    blocks: list[str] = []
    n = 0
    cjk = _CJK_START
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["prose", "list", "code", "cjk"]))
        size = draw(st.integers(1, 12))
        if kind == "prose":
            lines = []
            for _ in range(draw(st.integers(1, 3))):
                lines.append(" ".join(f"w{n + i}{draw(_SUFFIX)}" for i in range(size)))
                n += size
            blocks.append("\n".join(lines))
        elif kind == "list":
            blocks.append("\n".join(f"- item{n + i} costs {n + i}.5" for i in range(size)))
            n += size
        elif kind == "code":
            info = draw(st.sampled_from(["python", "", "js"]))
            body = "\n".join(f"{'    ' * (i % 3)}x{n + i} = f{n + i}(y{n + i})" for i in range(size))
            blocks.append(f"```{info}\n{body}\n```")
            n += size
        else:
            sentences = []
            for _ in range(size):
                length = draw(st.integers(3, 30))
                sentences.append("".join(chr(cjk + i) for i in range(length)) + "。")
                cjk += length
            blocks.append("".join(sentences))
    return draw(st.sampled_from(["\n\n", "\n"])).join(blocks)


def _open_fence_line(text: str) -> str | None:
    opened: str | None = None
    for line in text.split("\n"):
        if line.startswith("```"):
            opened = line if opened is None else None
    return opened


Behaviour = Callable[[str, int], str]


def _exact(t: str, r: int) -> str:
    return t[r:]


def _no_space(t: str, r: int) -> str:
    return t[r:].lstrip()


def _line(t: str, r: int) -> str:
    return t[t.rfind("\n", 0, r) + 1:]


def _line_no_indent(t: str, r: int) -> str:
    return _line(t, r).lstrip()


def _fence(t: str, r: int) -> str:
    # Only a fence with an info string can be told from a closing one (module docstring).
    fence = _open_fence_line(t[:r])
    return (fence + "\n" + t[r:]) if fence not in (None, "```") else t[r:]


def _whole(t: str, r: int) -> str:
    return t


BEHAVIOURS: dict[str, Behaviour] = {
    "exact": _exact, "no leading space": _no_space, "restarts the line": _line,
    "restarts the line unindented": _line_no_indent, "reopens the fence": _fence,
    "restarts the answer": _whole,
}


@PROPS
@given(documents(), st.data())
def test_every_cut_and_every_resume_gives_the_text_back(text: str, data: Any) -> None:
    k = data.draw(st.integers(1, len(text) - 1), label="cut")
    name = data.draw(st.sampled_from(sorted(BEHAVIOURS)), label="model")
    cut = text[:k]
    r = resume_point(cut)
    assert text.startswith(sent(cut))
    assert join(cut, BEHAVIOURS[name](text, r)) == text


@PROPS
@given(documents(), st.data())
def test_a_repeat_of_twenty_or_more_characters_is_removed(text: str, data: Any) -> None:
    k = data.draw(st.integers(1, len(text) - 1), label="cut")
    r = resume_point(text[:k])
    if r < 20:
        return
    n = data.draw(st.integers(20, r), label="repeat")
    assert join(text[:k], text[r - n:]) == text


@PROPS
@given(documents(), st.data())
def test_many_cuts_with_a_doubling_limit_give_the_text_back(text: str, data: Any) -> None:
    prefill = data.draw(st.booleans(), label="prefill")
    resume = Resume(prefill=prefill)
    limit = data.draw(st.integers(1, 40), label="first limit")
    parts = [text[:limit]]
    done = limit >= len(text)
    while not done:
        limit *= 2                      # what the session's escalation does
        partial = resume.messages(parts)[0].text
        assert text.startswith(partial)
        if prefill:
            assert partial == partial.rstrip()
            answer = text[len(partial):]
        else:
            name = data.draw(st.sampled_from(sorted(BEHAVIOURS)), label="model")
            answer = BEHAVIOURS[name](text, len(partial))
        done = len(answer) <= limit
        parts.append(answer[:limit])
    assert resume.join(parts) == text


def _subsequence(small: str, big: str) -> bool:
    chars = iter(big)
    return all(c in chars for c in small)


@PROPS
@given(st.lists(st.text(max_size=40), max_size=5))
@example([":\r", "A"])     # the held word's line end is a carriage return,
@example([":\x1f", "A"])   # or any character str.strip() takes for white space
def test_stitch_never_invents_text(parts: list[str]) -> None:
    # Each join is the previous answer unchanged; or what was sent (with the held-back
    # word put back, and a space or line end after it) followed by what is left of the
    # continuation once openers, echoes and repeats are dropped — its characters in its
    # order; or, for a restart that replaced the answer, the continuation stripped. No
    # character is made up.
    result = ""
    for part in parts:
        joined = stitch([result, part]) if result else part
        if result and joined != result:
            base = sent(result)
            if joined == part.strip():
                pass                                        # a restart replaced it
            else:
                assert joined.startswith(base)
                added = joined[len(base):]
                held = result[len(base):].rstrip()
                if held and added.startswith(held) and not _subsequence(added, part):
                    added = added[len(held):].lstrip()
                assert _subsequence(added, part), (result, part, joined)
        result = joined
    assert stitch(parts) == result


# -- what small models write around the text (rules 5–7) ---------------------------------------

FRIDGE = ("A household refrigerator is a versatile appliance. It keeps food cold and fresh. "
          "Another essential")


def test_a_restart_in_bold_is_a_consistent_restart_and_only_what_goes_past_is_added() -> None:
    # SmolLM2-135M: "…Another essential **A household refrigerator is a versatile appliance**…"
    restart = ("**A household refrigerator is a versatile appliance.** It keeps food cold "
               "and fresh. Another essential part is the freezer.")
    report = join_report(FRIDGE, restart)
    assert report.text == FRIDGE + " part is the freezer."
    assert report.restart == "extended" and report.added and not report.failed
    # Case and whitespace set aside the same way; a repeat of the tail alone too.
    assert join(FRIDGE, "a household  refrigerator IS a versatile\nappliance. It keeps food "
                        "cold and fresh. Another essential part.") == FRIDGE + " part."
    assert join(FRIDGE, "It keeps *food* cold and fresh. Another essential part.") == \
        FRIDGE + " part."
    # Cut again before it got past what was sent: nothing new yet.
    assert join_report(FRIDGE, "**A household refrigerator is a versatile appliance.** It") \
        .text == FRIDGE


def test_an_inconsistent_restart_replaces_the_answer_only_when_it_is_longer() -> None:
    longer = ("**A household refrigerator is a versatile appliance.** It stores food at low "
              "temperatures, has a freezer, shelves and a door that seals, and runs all day.")
    report = join_report(FRIDGE, longer)
    assert report.text == longer and report.restart == "replaced" and report.added
    shorter = "A household refrigerator is a versatile appliance. It hums."
    report = join_report(FRIDGE, shorter)
    assert report.text == FRIDGE and report.restart == "not joined" and report.failed
    assert report.dropped == ("a restart of the answer",)
    # A continuation that does not open as the answer does is text.
    assert join(FRIDGE, "part is the freezer.") == FRIDGE.rsplit(" ", 1)[0] + " part is the freezer."


META_OPENERS = [
    "Here's the continuation:", "Here is the continuation:\n", "Continuing from where I left off:",
    "Continuing:", "Sure, here is the rest of the answer:", "Sure! Here is the rest:",
    "(continued)", "[Continued]", "**Continued:**", "Certainly! Let me continue.",
    "Okay, picking up where I left off:", "Aqui está a continuação:", "Continuando de onde parei:",
    "Claro! Aqui está o resto:", "Aquí está la continuación:", "¡Claro! Continuando:",
    "Voici la suite :", "Bien sûr ! Voici la suite de la réponse :", "(suite)",
    "Hier ist die Fortsetzung:", "Gerne! Hier ist der Rest der Antwort:", "(Fortsetzung)",
    "Here's a revised version:",      # SmolLM2-135M on llama-cpp-python, rewriting
]


def test_meta_openers_are_dropped_at_the_join() -> None:
    cut = "w1 w2 w3 w4"
    for opener in META_OPENERS:
        for gap in (" ", "\n", "\n\n"):
            report = join_report(cut, opener + gap + "w4 w5 w6")
            assert report.text == "w1 w2 w3 w4 w5 w6", (opener, gap)
            assert report.dropped == ("a meta opener",)
    # Two in a row, and one before a restart.
    assert join(cut, "Sure! Here's the rest:\n\n(continued)\nw4 w5") == "w1 w2 w3 w4 w5"
    assert join(FRIDGE, "Here's the continuation:\n\n**A household refrigerator is a versatile "
                        "appliance.** It keeps food cold and fresh. Another essential part.") \
        == FRIDGE + " part."
    # Only meta text: nothing kept, and the join says so.
    assert join_report(cut, "Here's the continuation:").failed


def test_an_answer_that_starts_with_here_or_continuing_is_text() -> None:
    cut = "The loop runs twice. The values"
    for text in ("Here is why: the counter starts at one.", "Here the loop ends.",
                 "Here is the rest of the data: 3, 4.", "Here, the value is 3.",
                 "Continuing education is a choice.", "Suite à votre question, oui.",
                 "Sure enough, it works.", "Continue reading the file: it is long."):
        assert strip_meta_opener(text) == text, text
        assert join_report(cut, text).dropped == (), text
    # A meta phrase later in the continuation is text too.
    assert join("w1 w2", "w2 and here's the continuation: w3") == "w1 w2 and here's the continuation: w3"


def test_an_echo_of_the_continuation_prompt_is_removed_wherever_it_is() -> None:
    cut = "w1 w2 w3 w4"
    report = join_report(cut, CONTINUATION_PROMPT + "\n\nw4 w5")
    assert report.text == "w1 w2 w3 w4 w5"
    assert report.dropped == ("an echo of the continuation prompt",)
    first = CONTINUATION_PROMPT.split("\n")[0]
    assert join(cut, f"w4 w5. {first} w6") == "w1 w2 w3 w4 w5. w6"
    assert join(cut, f"w4 w5\n{first}\nw6") == "w1 w2 w3 w4 w5\nw6"
    # Its case, spacing, dashes and emphasis changed; "my response" for "your response".
    assert join(cut, "RESUME directly from where you stopped - do not repeat any content.\n"
                     "w4 w5") == "w1 w2 w3 w4 w5"
    assert join(cut, "*My response was cut off at the token limit.* w4 w5") == "w1 w2 w3 w4 w5"
    # An echo cut off by max_tokens at the end: its start is dropped too.
    assert join(cut, "w4 w5\nResume DIRECTLY from where") == "w1 w2 w3 w4 w5"
    # Only the echo: nothing kept.
    assert join_report(cut, CONTINUATION_PROMPT).failed
    assert CONTINUATION_PROMPT not in stitch([cut, "w4 " + CONTINUATION_PROMPT + " w5"])


def test_the_held_back_word_comes_back_when_the_continuation_starts_anew() -> None:
    cut = "The fridge keeps food cold."
    assert sent(cut) == "The fridge keeps food "
    report = join_report(cut, "It also has a freezer.")
    assert report.text == "The fridge keeps food cold. It also has a freezer."
    assert report.restored == "cold. "
    assert join(cut, "\n\n## The freezer") == "The fridge keeps food cold.\n\n## The freezer"
    assert join(cut, "- a freezer") == "The fridge keeps food cold.\n- a freezer"
    # After a meta opener, the same.
    assert join(cut, "Here's the continuation: It also has a freezer.") == \
        "The fridge keeps food cold. It also has a freezer."
    # Written again, or another word in its place (lower case): joined as it is.
    assert join(cut, "cold. It hums.") == "The fridge keeps food cold. It hums."
    assert join("The answer is forty-tw", "42, and that is all.") == "The answer is 42, and that is all."
    # A sentence's first word alone is not put back before another sentence.
    assert join("Food stays cold. It", "The freezer too.") == "Food stays cold. The freezer too."


def test_the_prompt_text_never_reaches_a_joined_answer_through_a_stream() -> None:
    resume = Resume()
    parts = ["w1 w2 w3 w4 w5 w6 w7 w8"]
    shown = resume.join(parts)
    out = StreamedJoin(resume, parts, shown)
    echoed = CONTINUATION_PROMPT + "\n\nw8 w9 w10"
    streamed = "".join(out.feed(c) for c in echoed) + out.flush()
    assert shown + streamed == "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"
    # A restart in bold is held back until it goes past what is shown, then joined.
    out = StreamedJoin(resume, [FRIDGE], FRIDGE)
    restart = ("**A household refrigerator is a versatile appliance.** It keeps food cold "
               "and fresh. Another essential part is the freezer.")
    streamed = "".join(out.feed(c) for c in restart) + out.flush()
    assert FRIDGE + streamed == FRIDGE + " part is the freezer."


def _bold_restart(t: str, r: int) -> str:
    # The answer over again, its first three words in bold (a small model's restart).
    found = re.match(r"w\d+ w\d+ w\d+", t)
    if found is None or found.end() > r or r < 40:
        return t
    return f"**{found.group()}**{t[found.end():]}"


EXTRA: dict[str, Behaviour] = {
    "meta opener": lambda t, r: META_OPENERS[r % len(META_OPENERS)] + "\n\n" + t[r:],
    "echoes the prompt": lambda t, r: CONTINUATION_PROMPT + "\n\n" + t[r:],
    "restarts in bold": _bold_restart,
    "meta opener, restart in bold": lambda t, r: "Here's the continuation:\n" + _bold_restart(t, r),
}


@PROPS
@given(documents(), st.data())
def test_every_cut_and_every_small_model_resume_gives_the_text_back(text: str, data: Any) -> None:
    k = data.draw(st.integers(1, len(text) - 1), label="cut")
    name = data.draw(st.sampled_from(sorted(EXTRA)), label="model")
    cut = text[:k]
    assert join(cut, EXTRA[name](text, resume_point(cut))) == text
