"""Tests for the history compactor (SPEC §7; ANCHORS weaknesses 6 and 7)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from strategies import histories, valid_histories

from ipy_ctxrecovery.core import compactor
from ipy_ctxrecovery.core.compactor import compact, compaction_budget, compaction_target, trim
from ipy_ctxrecovery.core.events import CompactionPhase, Event
from ipy_ctxrecovery.core.history import (
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    TAG_USER_WORDS,
    History,
    Message,
    Reasoning,
    Role,
    Text,
    ToolCall,
    latest_user_index,
    problems,
    to_openai,
)
from ipy_ctxrecovery.core.prompts import (
    SUMMARIZE_SYSTEM_PROMPT,
    compaction_notice,
    summary_header,
    with_recall_hint,
)
from ipy_ctxrecovery.core.wording import describe, describe_debug
from ipy_ctxrecovery.settings import MiB, Settings, format_size

S = Settings()
CANCELLED = "✗ Compaction cancelled — history left exactly as it was"


# -- real measures and a deterministic summarizer -------------------------------------------

def wire_bytes(history: History) -> int:
    """Bytes of an OpenAI Chat Completions body (reasoning is not sent)."""
    body = {"model": "m", "messages": to_openai(history)}
    return len(json.dumps(body, ensure_ascii=False).encode("utf-8"))


def dict_bytes(history: History) -> int:
    """Bytes of a body that carries reasoning blocks too (as Anthropic's thinking does)."""
    return len(json.dumps([m.to_dict() for m in history], ensure_ascii=False).encode("utf-8"))


class Recorder:
    """A summarizer like the emulator's: extractive, ≤ ¼ of its input or 2,000 chars."""

    def __init__(self, reply: str | None = None) -> None:
        self.inputs: list[str] = []
        self.reply = reply

    def __call__(self, text: str) -> str:
        self.inputs.append(text)
        if self.reply is not None:
            return self.reply
        limit = min(len(text) // 4, 2_000)
        return "## Current task state\n" + text[:limit]


class Events(list[Event]):
    def __call__(self, event: Event) -> None:
        self.append(event)

    @property
    def phases(self) -> list[str]:
        return [e.phase for e in self if isinstance(e, CompactionPhase)]


def big_turns(n: int, result_chars: int) -> list[Message]:
    out: list[Message] = []
    for t in range(n):
        out += [Message.user(f"request {t}"),
                Message.assistant(f"reading {t}", [ToolCall("call_0", "read_file", '{"p":1}')]),
                Message.tool("call_0", f"{t}:" + "x" * result_chars, name="read_file"),
                Message.assistant(f"answer {t}")]
    return out


def snapshot(history: History) -> str:
    return json.dumps([m.to_dict() for m in history], ensure_ascii=False)


def check_invariants(before: History, after: History) -> None:
    """What every compaction must keep (ISSUE 3 'Done when')."""
    assert [m for m in after if m.role is Role.SYSTEM] == \
        [m for m in before if m.role is Role.SYSTEM]
    latest = latest_user_index(before)
    if latest is not None:
        # The latest request stays as it was, and so does every message after it, except
        # that trim may point an older duplicate tool result at its later copy.
        tail = before[latest:]
        kept = after[len(after) - len(tail):]
        assert kept[0] == tail[0]
        for a, b in zip(kept, tail, strict=True):
            assert (a.role, a.tool_calls, a.tag) == (b.role, b.tool_calls, b.tag)
            if a.role is Role.TOOL:
                ra, rb = a.tool_result, b.tool_result
                assert ra is not None and rb is not None and ra.call_id == rb.call_id
                assert ra == rb or ra.content.startswith("[Duplicate tool result omitted (")
            else:
                assert a == b
    for m in after:
        for block in m.blocks:
            for f in dataclasses.fields(block):
                value = getattr(block, f.name)
                if isinstance(value, str):
                    value.encode("utf-8")       # raises on lone surrogates


# -- budget and target ------------------------------------------------------------------------

def test_budget_window_term_only_without_cap() -> None:
    assert compaction_budget(S, window_tokens=200_000, bytes_per_token=4.0, cap=None,
                             ratio=S.chat_budget_ratio) == 600_000


def test_budget_cap_term_wins_when_smaller() -> None:
    cap = 5 * MiB
    assert compaction_budget(S, window_tokens=2_000_000, bytes_per_token=4.0, cap=cap,
                             ratio=0.75) == int(0.7 * cap)
    # A generous cap leaves the window term in charge.
    assert compaction_budget(S, window_tokens=8_000, bytes_per_token=4.0, cap=cap,
                             ratio=S.manual_compact_ratio) == 16_000


def test_budget_uses_the_settings_fraction() -> None:
    custom = S.replace(cap_budget_fraction=0.5)
    assert compaction_budget(custom, window_tokens=10**7, bytes_per_token=3.5, cap=1_000,
                             ratio=0.4) == 500


def test_target_is_below_the_trigger() -> None:
    assert compaction_target(1_000_000, S) == 600_000
    assert compaction_target(1_000_000, S.replace(compaction_target_fraction=0.5)) == 500_000
    assert compaction_target(0, S) == 0


def test_system_prompt_names_the_marker_and_sections() -> None:
    assert "STRUCTURED SUMMARY" in SUMMARIZE_SYSTEM_PROMPT
    # A notebook session's sections, then a coding agent's where relevant (issue 27).
    for section in ("Goal and constraints", "Data and variables", "Results and figures",
                    "Decisions", "Open questions", "Current step", "Files read and modified",
                    "Commands run", "Errors and resolutions"):
        assert f"\n## {section}\n" in SUMMARIZE_SYSTEM_PROMPT
    assert "language of the conversation" in SUMMARIZE_SYSTEM_PROMPT
    assert "Instructions after the messages" in SUMMARIZE_SYSTEM_PROMPT
    assert summary_header(7) == "[STRUCTURED SUMMARY — covering 7 earlier messages]"


# -- trim -------------------------------------------------------------------------------------

def test_trim_removes_old_reasoning_and_keeps_current_turn_reasoning() -> None:
    call = ToolCall("c1", "grep", "{}")
    h: History = (
        Message.system("sys"),
        Message.user("q1"),
        Message(Role.ASSISTANT, (Reasoning("think " * 50, "sig"), Text("a1"))),
        Message(Role.ASSISTANT, (Reasoning("only thinking"),)),
        Message.user("q2"),
        Message(Role.ASSISTANT, (Reasoning("current", "sig2"), call)),
        Message.tool("c1", "found"),
    )
    out, removed = trim(h)
    assert removed == 2
    assert out == (
        Message.system("sys"),
        Message.user("q1"),
        Message(Role.ASSISTANT, (Text("a1"),)),
        Message.user("q2"),
        Message(Role.ASSISTANT, (Reasoning("current", "sig2"), call)),
        Message.tool("c1", "found"),
    )
    assert problems(out) == []


def test_trim_keeps_tool_calls_of_an_assistant_emptied_of_reasoning() -> None:
    call = ToolCall("c1", "run_shell", '{"cmd": "ls"}')
    h: History = (Message.user("q1"), Message(Role.ASSISTANT, (Reasoning("why"), call)),
                  Message.tool("c1", "a b c"), Message.assistant("done"), Message.user("q2"))
    out, removed = trim(h)
    assert removed == 1
    assert out[1] == Message(Role.ASSISTANT, (call,))
    assert problems(out) == []


def test_trim_replaces_older_duplicate_results_by_a_pointer_to_the_latest() -> None:
    content = "line\n" * 500
    h: History = (
        Message.user("q1"),
        Message.assistant("", [ToolCall("call_0", "read_file", "{}")]),
        Message.tool("call_0", content, name="read_file"),
        Message.assistant("", [ToolCall("call_9", "read_file", "{}")]),
        Message.tool("call_9", content, name="read_file"),
        Message.assistant("", [ToolCall("call_0", "grep", "{}")]),
        Message.tool("call_0", "ok", name="grep"),
        Message.assistant("", [ToolCall("call_1", "grep", "{}")]),
        Message.tool("call_1", "ok", name="grep"),        # short: a pointer would be longer
        Message.user("q2"),
    )
    out, removed = trim(h)
    assert removed == 1
    assert out[2].text == ("[Duplicate tool result omitted (2500 chars): identical to the "
                           "later read_file result of call call_9]")
    assert out[2].tool_result is not None and out[2].tool_result.call_id == "call_0"
    assert out[4] == h[4] and out[6] == h[6] and out[8] == h[8]
    assert len(out) == len(h) and problems(out) == []


def test_trim_drops_the_earlier_of_identical_consecutive_user_messages() -> None:
    h: History = (Message.system("s"), Message.user("please fix it"),
                  Message(Role.ASSISTANT, (Reasoning("hmm"),)),
                  Message.user("please fix it"))
    out, removed = trim(h)
    assert out == (Message.system("s"), Message.user("please fix it"))
    assert removed == 2
    # The one kept is the latest request itself, with its meta.
    assert out[-1] is h[-1]


def test_trim_never_touches_system_messages_and_returns_input_when_nothing_to_do() -> None:
    dup = "same system text " * 100
    h: History = (Message.system(dup), Message.system(dup), Message.user("q"),
                  Message.assistant("a"), Message.user("q"))
    out, removed = trim(h)
    assert removed == 0 and out is h


def test_trim_does_not_mutate_meta() -> None:
    meta = {"notes": [1, 2]}
    h: History = (Message(Role.USER, (Text("q"),), meta=meta),
                  Message(Role.ASSISTANT, (Reasoning("r"), Text("a"))), Message.user("q2"))
    before = snapshot(h)
    trim(h)
    assert snapshot(h) == before and meta == {"notes": [1, 2]}


# -- compact: the SPEC's phases and messages ----------------------------------------------------

def spec_example() -> History:
    """23 messages, 4.2 MB; summarizing the oldest 15 (whole exchanges) leaves 9, 1.8 MB."""
    def turn(t: int, result_chars: int) -> list[Message]:
        return [Message.user(f"request {t}"),
                Message.assistant("", [ToolCall(f"c{t}", "read_file", "{}")]),
                Message.tool(f"c{t}", "x" * result_chars, name="read_file"),
                Message.assistant(f"answer {t}")]
    msgs = [Message.system("You are a coding assistant.")]
    msgs += turn(1, int(0.6 * MiB)) + turn(2, int(0.6 * MiB))
    msgs += [Message.user("request 3"), Message.assistant("answer 3"),
             Message.user("request 4"),
             Message.assistant("", [ToolCall("d", "read_file", "{}"),
                                    ToolCall("e", "read_file", "{}")]),
             Message.tool("d", "v" * 1_000, name="read_file"),
             Message.tool("e", "w" * int(1.2 * MiB), name="read_file"),
             Message.assistant("answer 4")]                 # 15 old non-system messages
    msgs += [Message.user("request 5"),
             Message.assistant("", [ToolCall("a", "read_file", "{}"),
                                    ToolCall("b", "read_file", "{}"),
                                    ToolCall("c", "read_file", "{}")]),
             Message.tool("a", "y" * MiB, name="read_file"),
             Message.tool("b", "z" * int(0.75 * MiB), name="read_file"),
             Message.tool("c", "ok", name="read_file"),
             Message.assistant("answer 5"), Message.user("request 6: go on")]
    return tuple(msgs)


def test_spec_messages_exactly() -> None:
    h = spec_example()
    assert len(h) == 23
    events = Events()
    summary = "## Files read\n- big files\n## Current task state\n- going on"
    # 2.9 MB read in 120,000-char requests: a bound that lets the summary read them all.
    out, report = compact(h, target_bytes=int(2.9 * MiB), measure=wire_bytes,
                          summarize=Recorder(summary), settings=S.replace(
                              summary_max_requests=64), on_event=events)
    # Every phase for an expert (the SPEC's four lines); a person reads two: the summary
    # being made, and its result.
    assert [describe_debug(e) for e in events] == [
        "⇣ Compacting history (23 messages, 4.2 MB → target 2.9 MB)",
        "· trim: removing reasoning and duplicate tool results (no LLM)",
        "⇣ Summarizing older messages with the model (23 messages, 4.2 MB → target 2.9 MB)…",
        "✓ Summary applied (23 → 10 messages, 4.2 MB → 1.8 MB)",
    ]
    assert [line for line in map(describe, events) if line] == [
        "⇣ Summarizing older messages with the model (23 messages, 4.2 MB → target 2.9 MB)…",
        "✓ Summary applied (23 → 10 messages, 4.2 MB → 1.8 MB)",
    ]
    assert events.phases == ["start", "trim", "summarize", "applied"]
    assert report.applied and report.summarized_messages == 15
    assert (report.before_messages, report.after_messages) == (23, 10)  # + the user's words
    assert report.after_bytes == wire_bytes(out) <= int(2.9 * MiB)
    assert out[1].tag == TAG_SUMMARY
    assert out[1].text == with_recall_hint(summary_header(15)) + "\n" + summary
    assert out[2].tag == TAG_USER_WORDS            # the user's requests 1-4, verbatim
    assert out[3] == Message.user("request 5")     # the kept part opens an exchange
    check_invariants(h, out)
    assert problems(out) == []
    last = events[-1]
    assert isinstance(last, CompactionPhase)
    assert (last.before_bytes, last.after_bytes, last.target_bytes) == \
        (report.before_bytes, report.after_bytes, int(2.9 * MiB))


def test_trim_alone_reaching_the_target_makes_no_llm_call() -> None:
    h: History = (Message.user("q1"),
                  Message(Role.ASSISTANT, (Reasoning("deliberation " * 4_000), Text("a1"))),
                  Message.user("q2"))
    before = dict_bytes(h)
    target = before // 2

    def no_llm(text: str) -> str:
        raise AssertionError("the summarizer must not be called")

    events = Events()
    out, report = compact(h, target_bytes=target, measure=dict_bytes, summarize=no_llm,
                          settings=S, on_event=events)
    assert events.phases == ["start", "trim", "applied"]
    assert describe(events[-1]) == (
        f"✓ Trimmed reasoning and duplicate tool results, no summary needed (3 → 3 messages, "
        f"{format_size(before)} → {format_size(dict_bytes(out))})")
    assert report.applied and report.trimmed_blocks == 1 and report.summarized_messages == 0
    assert dict_bytes(out) <= target
    assert out == (Message.user("q1"), Message.assistant("a1"), Message.user("q2"))


def test_already_within_target_is_a_no_op() -> None:
    h: History = (Message.user("q"),)
    events = Events()
    out, report = compact(h, target_bytes=10_000, measure=wire_bytes, summarize=Recorder(),
                          settings=S, on_event=events)
    assert out is h and not report.applied
    assert events.phases == ["start", "trim", "applied"]


def test_force_summary_summarizes_even_when_under_target() -> None:
    h = tuple(big_turns(3, 2_000)) + (Message.user("next"),)
    rec = Recorder("## Current task state\n- short")
    out, report = compact(h, target_bytes=10**9, measure=wire_bytes, summarize=rec,
                          settings=S, force_summary=True, instructions="focus on errors")
    assert report.applied and len(rec.inputs) == 1
    assert rec.inputs[0].endswith("Additional instructions for this summary: focus on errors")
    assert out[0].tag == TAG_SUMMARY and out[-1] == Message.user("next")


# -- compact: what is summarized ---------------------------------------------------------------

def test_summary_covers_the_oldest_messages_and_never_splits_a_tool_pair() -> None:
    h: History = (Message.system("sys A"), *big_turns(2, 30_000), Message.system("sys B"),
                  *big_turns(2, 30_000), Message.user("latest"),
                  Message.assistant("", [ToolCall("k", "grep", "{}")]),
                  Message.tool("k", "w" * 40_000))
    rec = Recorder()
    out, report = compact(h, target_bytes=wire_bytes(h) // 2, measure=wire_bytes,
                          summarize=rec, settings=S)
    assert report.applied
    check_invariants(h, out)
    assert problems(out) == []
    assert out[0] == Message.system("sys A") and out[1].tag == TAG_SUMMARY
    # What was kept is a suffix of the original non-system messages; system B stays
    # right after the summary and the user's messages it keeps, before everything kept.
    assert out[2].tag == TAG_USER_WORDS
    assert out[3] == Message.system("sys B")
    kept = out[4:]
    assert tuple(kept) == h[len(h) - len(kept):]
    assert len(kept) < len(h) - 3


def test_the_payload_notice_is_guidance_and_is_never_summarized_away() -> None:
    notice = Message.user("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] …", tag=TAG_PAYLOAD_NOTICE)
    h: History = (Message.system("sys"), *big_turns(2, 30_000), notice,
                  *big_turns(2, 30_000), Message.user("latest"))
    out, report = compact(h, target_bytes=wire_bytes(h) // 4, measure=wire_bytes,
                          summarize=Recorder(), settings=S)
    assert report.applied
    check_invariants(h, out)
    assert [m for m in out if m.tag == TAG_PAYLOAD_NOTICE] == [notice]
    assert out[-1] == Message.user("latest")


def test_summarizer_input_is_chunked_within_its_bound_and_never_cut() -> None:
    custom = S.replace(summarizer_input_max_chars=20_000, summary_max_requests=64)
    h: History = (*big_turns(6, 50_000), Message.user("latest"))
    rec = Recorder()
    out, report = compact(h, target_bytes=4_000, measure=wire_bytes, summarize=rec,
                          settings=custom, instructions="keep file names")
    assert report.applied and out[0].tag == TAG_SUMMARY
    assert len(rec.inputs) == report.chunks == report.summary_requests > 1
    suffix = "\n\nAdditional instructions for this summary: keep file names"
    for i, sent in enumerate(rec.inputs):
        assert sent.endswith(suffix) and len(sent) <= 20_000
        assert sent.startswith("Summarize these 24 earlier messages of the conversation")
        assert ("The summary so far: " in sent) == (i > 0)
        assert not re.search(r"… \d+ chars omitted …", sent)      # nothing cut out
        assert "omitted from this input" not in sent
    # Every replaced message reached the summarizer, the long results in labelled parts.
    sent_all = "".join(rec.inputs)
    for t in range(6):
        assert f"request {t}" in sent_all and f"answer {t}" in sent_all
    assert re.search(r"Message 3 of 24, part 1 of \d+, a tool result of read_file: 0:x", sent_all)
    assert report.summarized_messages == 24 and report.dropped_unread == 0


def test_past_the_request_bound_the_oldest_are_dropped_unread_and_told() -> None:
    custom = S.replace(summarizer_input_max_chars=20_000, summary_max_requests=3)
    h: History = (Message.system("s"), *big_turns(6, 15_000), Message.user("latest"))
    rec = Recorder()
    events = Events()
    out, report = compact(h, target_bytes=4_000, measure=wire_bytes, summarize=rec,
                          settings=custom, on_event=events)
    assert report.applied and len(rec.inputs) == report.summary_requests <= 3
    assert report.dropped_unread > 0
    assert report.summarized_messages + report.dropped_unread == 24
    # The summary covers the messages read, and a notice after it tells the model the rest.
    assert out[1].text.startswith(with_recall_hint(summary_header(report.summarized_messages)) + "\n")
    notice = out[2]
    assert notice.tag == "compaction_notice"
    assert notice.text == with_recall_hint(compaction_notice(
        report.dropped_unread, summarized=True, unread=report.dropped_unread))
    assert "left unread" in notice.text
    # The user's own requests stay verbatim after it (pins.py), the unread ones among them.
    assert out[3].tag == "user_words" and "request 0" in out[3].text and out[4:] == h[-1:]
    # The newest were read, the oldest not.
    sent = "".join(rec.inputs)
    assert "answer 5" in sent and "request 0" not in sent
    applied = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"]
    assert applied[0].dropped_unread == report.dropped_unread
    assert applied[0].summary_request_bound == 3 and applied[0].chunks == report.chunks
    line = describe(applied[0])
    assert f"{report.dropped_unread} messages dropped unread (summary-request bound 3)" in line


class Cut:
    """A summarizer whose replies are cut at max_tokens until it is asked with more."""

    def __init__(self, *, cut_again: bool) -> None:
        self.calls: list[str] = []
        self.cut_again = cut_again

    def first(self, text: str) -> compactor.SummaryReply:
        self.calls.append("first")
        return compactor.SummaryReply("## Current task state\n- half of it", truncated=True,
                                      input_tokens=100, output_tokens=50)

    def retry(self, text: str) -> compactor.SummaryReply:
        self.calls.append("retry")
        return compactor.SummaryReply("## Current task state\n- all of it",
                                      truncated=self.cut_again, input_tokens=100,
                                      output_tokens=90)


@pytest.mark.parametrize("cut_again", [False, True])
def test_a_summary_cut_at_its_max_tokens_is_retried_once_then_refused(cut_again: bool) -> None:
    h: History = (*big_turns(3, 5_000), Message.user("latest"))
    cut = Cut(cut_again=cut_again)
    out, report = compact(h, target_bytes=2_000, measure=wire_bytes, summarize=cut.first,
                          retry=cut.retry, settings=S)
    assert cut.calls == ["first", "retry"]
    assert report.summary_requests == 2
    assert (report.summary_input_tokens, report.summary_output_tokens) == (200, 140)
    if cut_again:
        assert not report.applied and out == h
        assert report.rejected_reason == "the summary was cut at its own max_tokens"
    else:
        assert report.applied and "all of it" in out[0].text


def test_a_cut_summary_without_a_retry_is_refused() -> None:
    h: History = (*big_turns(3, 5_000), Message.user("latest"))
    cut = Cut(cut_again=True)
    out, report = compact(h, target_bytes=2_000, measure=wire_bytes, summarize=cut.first,
                          settings=S)
    assert cut.calls == ["first"] and out == h
    assert report.rejected_reason == "the summary was cut at its own max_tokens"


def test_an_earlier_summary_is_summarized_again_not_stacked() -> None:
    earlier = Message.user(summary_header(6) + "\n## Files read\n- a.py", tag=TAG_SUMMARY)
    custom = S.replace(summarizer_input_max_chars=5_000, summary_max_requests=64)
    h: History = (Message.system("s"), earlier, Message.assistant("Understood."),
                  *big_turns(3, 20_000), Message.user("latest"))
    rec = Recorder("[STRUCTURED SUMMARY — covering 2 earlier messages]\n## Files read\n- a.py")
    out, report = compact(h, target_bytes=3_000, measure=wire_bytes, summarize=rec,
                          settings=custom)
    assert report.applied
    assert [m.tag for m in out].count(TAG_SUMMARY) == 1
    # N counts original messages: 6 in the earlier summary + 1 + 12 messages since.
    assert out[1].text.startswith(with_recall_hint(summary_header(19)) + "\n")
    assert "covering 2 earlier" not in out[1].text
    # The earlier summary opens the first request.
    assert "Message 1 of 14, the summary of earlier messages: [STRUCTURED SUMMARY" in rec.inputs[0]
    assert report.summarized_messages == 14
    # And again: still one summary, N keeps counting.
    out2, report2 = compact(out + (Message.assistant("ok"), Message.user("more")),
                            target_bytes=100, measure=wire_bytes,
                            summarize=Recorder("## Current task state\n- x"), settings=custom)
    assert [m.tag for m in out2].count(TAG_SUMMARY) == 1
    assert out2[1].text.startswith("[STRUCTURED SUMMARY — covering 21 earlier messages]")


def test_markdown_header_from_the_summarizer_is_normalized() -> None:
    h: History = (*big_turns(2, 5_000), Message.user("latest"))
    rec = Recorder("## **[STRUCTURED SUMMARY — covering many messages]**\n\n## Commands run\n- ls")
    out, _ = compact(h, target_bytes=500, measure=wire_bytes, summarize=rec, settings=S)
    assert out[0].text == with_recall_hint(summary_header(8)) + "\n## Commands run\n- ls"


def test_nothing_to_summarize_is_rejected_and_history_kept() -> None:
    h: History = (Message.system("s"), Message.user("x" * 10_000))
    events = Events()
    out, report = compact(h, target_bytes=100, measure=wire_bytes, summarize=Recorder(),
                          settings=S, on_event=events)
    assert out is h and not report.applied
    assert report.rejected_reason == "nothing older than the latest request to summarize"
    assert events.phases == ["start", "trim", "rejected"]


# -- rejection -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "reason"), [
    ("", "the summary is empty"),
    ("   \n\t ", "the summary is empty"),
    ("[STRUCTURED SUMMARY — covering 3 earlier messages]\n  ", "the summary is empty"),
    ("I can't help with summarizing this.", "the summarizer refused"),
    ("I cannot help with that request.", "the summarizer refused"),
    ("I’m sorry, but I can’t do that.", "the summarizer refused"),
    ("**Sorry, I am unable to comply.**", "the summarizer refused"),
    ("As an AI language model, I won't.", "the summarizer refused"),
])
def test_unusable_summaries_are_rejected(reply: str, reason: str) -> None:
    h: History = (*big_turns(3, 10_000), Message.user("latest"))
    before = snapshot(h)
    events = Events()
    out, report = compact(h, target_bytes=1_000, measure=wire_bytes,
                          summarize=Recorder(reply), settings=S, on_event=events)
    assert out is h and snapshot(out) == before
    assert not report.applied and report.rejected_reason == reason
    assert (report.after_messages, report.after_bytes) == (len(h), wire_bytes(h))
    assert events.phases == ["start", "trim", "summarize", "rejected"]
    assert describe(events[-1]) == f"✗ Compaction rejected: {reason} — history kept as it was"


def test_too_long_summary_is_rejected() -> None:
    custom = S.replace(summary_max_chars=500)
    h: History = (*big_turns(3, 10_000), Message.user("latest"))
    out, report = compact(h, target_bytes=1_000, measure=wire_bytes,
                          summarize=Recorder("## Key decisions\n" + "d" * 600), settings=custom)
    assert out is h and not report.applied
    assert report.rejected_reason is not None
    assert report.rejected_reason.startswith("the summary is too long")


def test_summary_not_smaller_than_what_it_replaces_is_rejected() -> None:
    h: History = (Message.user("hi"), Message.assistant("hello"), Message.user("latest"))
    out, report = compact(h, target_bytes=10, measure=wire_bytes,
                          summarize=Recorder("## Current task state\n- greeting exchanged"),
                          settings=S)
    assert out is h and not report.applied
    assert report.rejected_reason == "the summary is not smaller than the messages it replaces"


def test_summarizer_error_rejects_with_a_redacted_reason() -> None:
    def failing(text: str) -> str:
        raise RuntimeError("upstream said no (Authorization: Bearer sk-abcdefghijklmnopqrstuv)")

    h: History = (*big_turns(2, 10_000), Message.user("latest"))
    out, report = compact(h, target_bytes=1_000, measure=wire_bytes, summarize=failing,
                          settings=S)
    assert out is h and not report.applied
    assert report.rejected_reason is not None
    assert report.rejected_reason.startswith("the summarizer failed (RuntimeError")
    assert "sk-abcdefghijklmnopqrstuv" not in report.rejected_reason


# -- cancellation ----------------------------------------------------------------------------------

def test_keyboard_interrupt_propagates_and_leaves_history_identical() -> None:
    def interrupted(text: str) -> str:
        raise KeyboardInterrupt

    h: History = (Message.system("s"), *big_turns(3, 10_000), Message.user("latest"))
    before = snapshot(h)
    events = Events()
    with pytest.raises(KeyboardInterrupt):
        compact(h, target_bytes=1_000, measure=wire_bytes, summarize=interrupted,
                settings=S, on_event=events)
    assert snapshot(h) == before
    assert events.phases == ["start", "trim", "summarize", "cancelled"]
    assert describe(events[-1]) == CANCELLED


def test_cancel_token_after_the_summary_discards_it() -> None:
    h: History = (*big_turns(3, 10_000), Message.user("latest"))
    rec = Recorder()
    events = Events()
    with pytest.raises(KeyboardInterrupt):
        compact(h, target_bytes=1_000, measure=wire_bytes, summarize=rec, settings=S,
                on_event=events, should_cancel=lambda: bool(rec.inputs))
    assert len(rec.inputs) == 1 and events.phases[-1] == "cancelled"
    assert "applied" not in events.phases


# -- hysteresis ------------------------------------------------------------------------------------

def test_after_compaction_the_next_turn_does_not_compact_again() -> None:
    trigger = compaction_budget(S, window_tokens=16_000, bytes_per_token=S.chars_per_token,
                                cap=None, ratio=S.chat_budget_ratio)
    target = compaction_target(trigger, S)
    h: History = (Message.system("sys"), *big_turns(16, 4_000), Message.user("latest"))
    assert wire_bytes(h) > trigger
    out, report = compact(h, target_bytes=target, measure=wire_bytes, summarize=Recorder(),
                          settings=S)
    assert report.applied and wire_bytes(out) <= target < trigger
    # The next turn adds a normal exchange; the history is still under the trigger.
    nxt = out + (Message.assistant("Here is the answer " * 20), Message.user("thanks, next?"))
    assert wire_bytes(nxt) <= trigger


# -- properties --------------------------------------------------------------------------------------

@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=valid_histories(max_result_chars=20_000), fraction=st.floats(0.05, 1.2))
def test_compact_keeps_valid_histories_valid(h: History, fraction: float) -> None:
    before_bytes = wire_bytes(h)
    before = snapshot(h)
    out, report = compact(h, target_bytes=int(before_bytes * fraction), measure=wire_bytes,
                          summarize=Recorder(), settings=S)
    assert snapshot(h) == before                    # the input (meta dicts too) untouched
    check_invariants(h, out)
    assert problems(out) == []
    assert wire_bytes(out) <= before_bytes == report.before_bytes
    assert report.after_bytes == wire_bytes(out)
    assert report.applied == (out != h)
    assert [m.tag for m in out].count(TAG_SUMMARY) <= max(1, [m.tag for m in h].count(TAG_SUMMARY))
    if report.summarized_messages:
        first = next(m for m in out if m.role is not Role.SYSTEM)
        assert first.tag == TAG_SUMMARY


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=histories(max_result_chars=20_000, user_first=None), fraction=st.floats(0.05, 1.0))
def test_compact_on_any_history_never_loses_what_must_stay(h: History, fraction: float) -> None:
    before_bytes = dict_bytes(h)
    out, _ = compact(h, target_bytes=int(before_bytes * fraction), measure=dict_bytes,
                     summarize=Recorder(), settings=S)
    check_invariants(h, out)
    assert dict_bytes(out) <= before_bytes
    assert len([p for p in problems(out) if "first non-system" not in p]) <= \
        len([p for p in problems(h) if "first non-system" not in p])


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=histories(max_result_chars=20_000, user_first=None))
def test_trim_properties(h: History) -> None:
    out, removed = trim(h)
    check_invariants(h, out)
    assert (out is h) == (removed == 0)
    assert dict_bytes(out) <= dict_bytes(h)
    assert len(problems(out)) <= len(problems(h))
    assert trim(out)[1] == 0                            # one pass finds everything


def test_public_names() -> None:
    assert set(compactor.__all__) == {
        "ChatBudget", "CompactionReport", "Measure", "Summarizer", "SummaryReply", "chat_budget",
        "compact",
        "compaction_budget",
        "compaction_target", "trim",
    }


def test_with_the_emulators_extractive_summarizer() -> None:
    from ipy_ctxrecovery.emulator.replies import summarize as emulator_summarize

    h: History = (Message.system("sys"), *big_turns(6, 8_000), Message.user("latest"))
    events = Events()
    out, report = compact(h, target_bytes=wire_bytes(h) // 3, measure=wire_bytes,
                          summarize=emulator_summarize, settings=S, on_event=events)
    assert report.applied, report.rejected_reason
    assert events.phases == ["start", "trim", "summarize", "applied"]
    summary = out[1]
    assert summary.tag == TAG_SUMMARY
    header = with_recall_hint(summary_header(report.summarized_messages)) + "\n"
    assert summary.text.startswith(header)
    assert summary.text.count("[STRUCTURED SUMMARY") == 1
    assert problems(out) == [] and wire_bytes(out) <= wire_bytes(h) // 3


# -- the split falls on exchange boundaries ----------------------------------------------------

def kept_after_summary(out: History) -> list[Message]:
    """The messages after the summary that are not pinned (system, payload notice) nor the
    user's messages kept verbatim (pins.py)."""
    at = next(i for i, m in enumerate(out) if m.tag == TAG_SUMMARY)
    return [m for m in out[at + 1:] if m.role is not Role.SYSTEM
            and m.tag not in (TAG_PAYLOAD_NOTICE, TAG_USER_WORDS)]


def test_an_answer_is_never_kept_without_its_question() -> None:
    # Summarizing the first two messages alone would reach the target, keeping "answer 2"
    # with its request summarized; the split moves on to request 3 instead.
    notice = Message.user("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] …", tag=TAG_PAYLOAD_NOTICE)
    h: History = (Message.system("s"), Message.user("request 1 " + "a" * 40_000),
                  Message.assistant("answer 1"), Message.user("request 2 " + "b" * 40_000),
                  Message.assistant("answer 2 " + "c" * 2_000), notice,
                  Message.user("request 3"), Message.assistant("answer 3"),
                  Message.user("request 4"))
    target = wire_bytes(h) - 60_000
    out, report = compact(h, target_bytes=target, measure=wire_bytes,
                          summarize=Recorder("## Current task state\n- going on"), settings=S)
    assert report.applied and report.summarized_messages == 4
    assert [m.text for m in kept_after_summary(out)] == \
        ["request 3", "answer 3", "request 4"]
    assert out[0] == h[0] and notice in out
    assert out[1].text.startswith("[STRUCTURED SUMMARY — covering 4 earlier messages]")
    check_invariants(h, out)


def test_a_tool_loop_is_summarized_whole_with_its_request() -> None:
    h: History = (Message.user("request 1"),
                  Message.assistant("", [ToolCall("c1", "read_file", "{}")]),
                  Message.tool("c1", "x" * 80_000, name="read_file"),
                  Message.assistant("", [ToolCall("c2", "read_file", "{}")]),
                  Message.tool("c2", "y" * 5_000, name="read_file"),
                  Message.assistant("answer 1"), Message.user("request 2"))
    out, report = compact(h, target_bytes=wire_bytes(h) // 2, measure=wire_bytes,
                          summarize=Recorder("## Files read\n- a.py"), settings=S)
    assert report.summarized_messages == 6
    assert [m.text for m in kept_after_summary(out)] == ["request 2"]
    assert problems(out) == []


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=valid_histories(max_result_chars=20_000), fraction=st.floats(0.05, 1.0))
def test_the_kept_part_starts_at_a_user_request(h: History, fraction: float) -> None:
    out, report = compact(h, target_bytes=int(wire_bytes(h) * fraction), measure=wire_bytes,
                          summarize=Recorder(), settings=S)
    check_invariants(h, out)
    assert problems(out) == []
    if not report.summarized_messages:
        return
    kept = kept_after_summary(out)
    latest = latest_user_index(h)
    if latest is not None:
        # The latest request is never summarized, so a user message is always in range.
        assert kept and kept[0].role is Role.USER
        assert kept[0].tag is None or kept[0] == h[latest]


def test_an_interrupt_while_the_summary_request_is_built_is_told_as_cancelled(monkeypatch) -> None:
    import ipy_ctxrecovery.core.compactor as compactor

    def interrupted(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(compactor, "_summarizer_plan", interrupted)
    h: History = (Message.system("s"), *big_turns(3, 10_000), Message.user("latest"))
    before = snapshot(h)
    events = Events()
    with pytest.raises(KeyboardInterrupt):
        compact(h, target_bytes=1_000, measure=wire_bytes, summarize=Recorder(), settings=S,
                on_event=events)
    assert snapshot(h) == before
    assert events.phases == ["start", "trim", "summarize", "cancelled"]


# -- the messages a compaction keeps reach the provider byte for byte -------------------------

def _text(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


@pytest.mark.parametrize("wire", ["emulator", "emulator:anthropic"])
def test_a_compaction_keeps_the_messages_it_does_not_touch_byte_identical(
        emulator: object, wire: str) -> None:
    """The summary replaces a leading run of messages; what follows it goes out in the next
    body exactly as before, and the body after that extends it (its cache holds)."""
    from ipy_ctxrecovery import ChatSession

    emu = emulator(context_window=100_000)  # type: ignore[operator]
    session = ChatSession(wire, emulator=emu, settings=Settings(), system="sys")
    for i in range(8):
        session.send(f"message {i} " + "words " * 300)
    session.send("probe", record=False)       # the history as it stands, on the wire
    before = emu.requests[-1].body["messages"][:-1]
    assert session.compact().applied
    session.send("next one")
    after = emu.requests[-1].body["messages"]
    first = 1 if after[0]["role"] == "system" else 0
    summary, kept = after[first], after[first + 1:-1]
    assert "STRUCTURED SUMMARY" in _text(summary) and kept
    # Every kept message but the request the summary is merged with (one user turn on both
    # wires) is the same JSON as before the compaction; that request's text is kept whole.
    assert [json.dumps(_unmarked(m), sort_keys=True) for m in kept] == \
        [json.dumps(_unmarked(m), sort_keys=True) for m in before[len(before) - len(kept):]]
    assert _text(summary).endswith(_text(before[len(before) - len(kept) - 1]))
    session.send("and one more")
    again = emu.requests[-1].body["messages"]
    # (the Anthropic wire's rolling cache breakpoint moves to the newest message; the cache
    # matches the content before it, so the markers are left out of the comparison)
    assert _unmarked(again[:len(after)]) == _unmarked(after)
    session.close()


def _unmarked(value: object) -> object:
    """``value`` without ``cache_control`` keys (prompt-cache breakpoints)."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


# -- the summary checked against what it replaces (issue 27) -------------------------------------

def notebook_turns() -> History:
    """Four exchanges with facts in them, and the latest request."""
    facts = ["Load data/raw/sales_2024.csv: 1,234 rows, 12 columns, 3.2 GB in memory.",
             "The `unit_cost` column shows a 12% lift for Acme Corp, p-value 0.05.",
             "We fit maxDepth with XGBoost 2.0.3 and seed=42 until 2026-11-30.",
             "The report is at https://example.com/report and reports/q3_summary.md."]
    out: list[Message] = [Message.system("You help with data work.")]
    for i, text in enumerate(facts):
        out += [Message.user(f"{text} " + "Please go on with the analysis. " * 40),
                Message.assistant(f"Noted, step {i}. " + "The analysis goes on. " * 40)]
    return (*out, Message.user("and now?"))


def test_the_fact_check_appends_what_the_summary_lost_within_its_bound() -> None:
    h = notebook_turns()
    facts = compactor.fact_check.extract([compactor._fact_text(m) for m in h[1:-1]])
    summary = "## Data and variables\n- data/raw/sales_2024.csv with 1234 rows, 3.2GB"
    events = Events()
    out, report = compact(h, target_bytes=wire_bytes(h) // 3, measure=wire_bytes,
                          summarize=Recorder(summary), settings=S, on_event=events)
    assert report.applied and report.summarized_messages == 8
    text = out[1].text
    assert text.startswith(f"{with_recall_hint(summary_header(8))}\n{summary}\n\nFacts kept verbatim:\n")
    listed = text.split("Facts kept verbatim:\n")[1].splitlines()
    assert listed[0] == "- reports/q3_summary.md"           # the most recent first
    assert "- 12 columns" in listed and "- Acme Corp" in listed and "- seed=42" not in listed
    assert "- 42" in listed
    assert (report.facts_total, report.facts_kept, report.facts_added) == \
        (len(facts), 3, len(facts) - 3)
    assert compactor.fact_check.missing(facts, text) == ()
    applied = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"]
    assert (applied[0].facts_kept, applied[0].facts_added, applied[0].facts_total) == \
        (3, len(facts) - 3, len(facts))

    # A tight bound: the list stops where the next fact would not fit.
    tight = S.replace(summary_max_chars=len(with_recall_hint(summary_header(8))) + len(summary) + 60)
    out, report = compact(h, target_bytes=wire_bytes(h) // 3, measure=wire_bytes,
                          summarize=Recorder(summary), settings=tight)
    assert report.applied and len(out[1].text) <= tight.summary_max_chars
    replaced = [compactor._fact_text(m) for m in h[1:1 + report.summarized_messages]]
    lost = compactor.fact_check.missing(compactor.fact_check.extract(replaced), summary)
    listed = out[1].text.split("Facts kept verbatim:\n")[1].splitlines()
    assert 0 < report.facts_added == len(listed) < len(lost)
    assert listed == [f"- {f.text}" for f in reversed(lost)][:len(listed)]


@pytest.mark.parametrize(("reply", "reason"), [
    ("I'm ready to help. What's your next question?",
     "the summarizer answered the conversation instead of summarizing it"),
    ("The previous message was cut off at token limit.",
     "the summary keeps none of the 15 facts of the messages it replaces"),
    ("… 6 older messages (12000 chars) omitted from this input to bound its size …",
     "the summary is mostly the summarizer's own framing, not the conversation"),
])
def test_a_summary_that_is_not_one_is_refused_with_its_reason(reply: str, reason: str) -> None:
    h = notebook_turns()
    events = Events()
    out, report = compact(h, target_bytes=wire_bytes(h) // 3, measure=wire_bytes,
                          summarize=Recorder(reply), settings=S, on_event=events)
    assert out is h and not report.applied and report.rejected_reason == reason
    assert events.phases[-1] == "rejected"


def test_a_summary_cut_at_its_max_tokens_is_refused() -> None:
    text, reason, check = compactor._normalize_summary(
        "## Current step\n- the plot of 3.2 GB", 4, S, 10_000, texts=["3.2 GB"], truncated=True)
    assert text is None and reason == "the summary was cut off at its own max_tokens"
    assert check.total == 0
    text, reason, check = compactor._normalize_summary(
        "## Current step\n- the plot", 4, S, 10_000, texts=["3.2 GB of unit_cost"])
    assert reason is None and text is not None and text.endswith("- unit_cost\n- 3.2 GB")
    assert (check.total, check.kept, check.added) == (2, 0, 2)
