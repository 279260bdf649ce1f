"""session.what_if: fates tracked through the pipeline, agreement with the real send,
validation, no side effects, rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from contrast import contrast_ratio, delta_e, installed_themes, theme_problems, vetted
from fakes import FakeProvider

from ipy_ctxrecovery import ChatSession, ConfigError, CtxRecoveryError, Message, Settings
from ipy_ctxrecovery.core.budget import compaction_info
from ipy_ctxrecovery.core.catalogue import ModelInfo
from ipy_ctxrecovery.core.history import TAG_SUMMARY, History, ToolCall
from ipy_ctxrecovery.core.ladder import Level
from ipy_ctxrecovery.core.prompts import compaction_notice, with_recall_hint
from ipy_ctxrecovery.providers.base import Request
from ipy_ctxrecovery.session.store import Transcript
from ipy_ctxrecovery.session.tools import chat_tool
from ipy_ctxrecovery.session.what_if import FATE_COLOURS, FATE_WORDS, TRACK, Fate, Plan
from ipy_ctxrecovery.settings import format_size


@chat_tool
def fetch_logs(service: str) -> str:
    """Return a service's access log.

    Args:
        service: the service name.
    """
    return "".join(f"{n:05d} {service} GET /api/items/{n} 200 {n % 97} ms\n" for n in range(300))


def logged_session(emu: Any, turns: int = 6, **kwargs: Any) -> ChatSession:
    """A session on ``emu`` with ``turns`` rounds of (a log fetch, a pasted question)."""
    session = ChatSession("emulator", emulator=emu, tools=[fetch_logs], system="You are terse.",
                          **kwargs)
    for i in range(turns):
        session.send(f'Fetch {i} [[tool fetch_logs {{"service": "svc{i}"}}]]', stream=False)
        session.send(f"Question {i} " + "lorem ipsum " * 200, stream=False)
    return session


# -- agreement with the real send ------------------------------------------------------------

_OBSERVED = {1: Fate.BUDGET_PREVIEW, 2: Fate.PREVIEWED, 3: Fate.ONE_LINED}


def observed_fates(before: History, after: History) -> list[Fate]:
    """Each message's fate as seen in the history the real send kept, found by walking both
    in order (kept messages keep their order): equal → kept; a tool message answering the
    same call, shrunk → its compaction level; gone → folded into a new summary if the send
    made one, else dropped. Independent of what_if's tracking."""
    new_summary = any(m.tag == TAG_SUMMARY for m in after) and \
        not any(m.tag == TAG_SUMMARY for m in before)
    fates: list[Fate] = []
    at = 0
    for m in before:
        found: tuple[Fate, int] | None = None
        for j in range(at, len(after)):
            a = after[j]
            if a == m:
                found = (Fate.KEPT, j)
                break
            r0, r1 = m.tool_result, a.tool_result
            if r0 is not None and r1 is not None and r0.call_id == r1.call_id:
                info = compaction_info(a)
                assert info is not None
                found = (_OBSERVED[info.level], j)
                break
        if found is None:
            fates.append(Fate.SUMMARIZED if new_summary else Fate.DROPPED)
        else:
            fates.append(found[0])
            at = found[1] + 1
    return fates


def _unpinned(fate: Fate) -> Fate:
    return Fate.KEPT if fate.value.startswith("pinned") else fate


def body_size(text: str) -> int:
    """A text's bytes in a request body (JSON string, UTF-8, as the SDKs send it)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8"))


def agree(session: ChatSession, emu: Any, text: str, **overrides: Any) -> Plan:
    """what_if, then the same settings on the session and the real send; fates must be
    equal and sizes equal up to the summary (the only estimate in a plan)."""
    plan = session.what_if(text=text, stream=False, **overrides)
    names = {"cap": "max_payload", "window": "context_window"}
    session.update(settings=session.settings.updated(
        {names.get(k, k): v for k, v in overrides.items()}))
    before = session.history + (Message.user(text),)
    sent_before = emu.received
    session.send(text, stream=False)
    chat = [r for r in emu.requests[-(emu.received - sent_before):]
            if not any(m["role"] == "system" and "STRUCTURED SUMMARY" in m["content"]
                       for m in r.body["messages"])]       # the summarizer's own requests
    assert len(chat) == 1 and chat[0].status == 200
    after = session.history[:-1]              # the answer is the one message added
    assert observed_fates(before, after) == [_unpinned(m.fate) for m in plan.messages]
    real = chat[0].body_bytes
    summaries = [m.text for m in after if m.tag == TAG_SUMMARY and m not in before]
    estimated = [m.text for m in plan.history if m.tag == TAG_SUMMARY and m not in before]
    assert len(summaries) == len(estimated) == int(plan.summary)
    # Tolerance: none beyond the summary — the real one's size minus the estimate's.
    delta = sum(map(body_size, summaries)) - sum(map(body_size, estimated))
    assert real == plan.after_bytes + delta
    assert plan.request_survives and after[-1] == before[-1]
    return plan


def test_microcompact_fates_and_size_agree_with_the_send_to_the_byte(emulator: Any) -> None:
    emu = emulator(context_window=128_000)
    session = logged_session(emu)
    plan = agree(session, emu, "next A", microcompact_truncate_turns=1,
                 microcompact_summarize_turns=3)
    assert plan.fates[Fate.PREVIEWED] == 1 and not plan.summary
    assert plan.fate_of(0) is Fate.PINNED_SYSTEM
    assert plan.fate_of(len(plan.messages) - 1) is Fate.PINNED_REQUEST


def test_a_cap_summary_agrees_with_the_send(emulator: Any) -> None:
    emu = emulator(context_window=128_000)
    session = logged_session(emu)
    plan = agree(session, emu, "next B", cap="24KB")
    assert plan.summary and plan.fates[Fate.SUMMARIZED] > 10
    assert plan.preflight_action == "compact" and "of configured cap" in plan.preflight_line
    assert plan.trigger is not None and plan.target is not None and plan.target < plan.trigger
    assert plan.summary_input_chars and plan.summary_chars
    assert [a.kind for a in plan.added] == ["summary (size estimated)",
                                            "the user's earlier messages, verbatim"]


def test_a_window_summary_agrees_with_the_send(emulator: Any) -> None:
    emu = emulator(context_window=128_000)
    session = logged_session(emu)
    plan = agree(session, emu, "next C", window=6000)
    assert plan.summary and plan.compacted and plan.preflight_action == "compact"
    assert "over the chat budget" in plan.preflight_line
    assert "of the 6,000-token window: chat_budget_ratio" in plan.preflight_line
    assert plan.trigger is not None and plan.before_bytes > plan.trigger


def test_messages_dropped_by_the_fit_agree_with_the_send(emulator: Any) -> None:
    # Old messages too small to summarize (both the estimate and the emulator's summary
    # are rejected), a latest message that fits the cap alone: the fit drops the old ones.
    emu = emulator(context_window=128_000)
    session = ChatSession("emulator", emulator=emu, system="You are terse.")
    for i in range(4):
        session.send(f"hi{i} [[words 1]]", stream=False)
    text = "big " * 2000
    whole = session.what_if(text=text, stream=False)
    assert session.what_if(text=text, cap="4KB").refused   # a 4 KB cap refuses it alone
    # What is left once the old messages are dropped: the system prompt, the notice the fit
    # adds (a configured cap is a hard limit: it must fit too) and the latest message.
    notice = Message.user(with_recall_hint(compaction_notice(8, summarized=False)))
    left = session.provider.measure(Request(      # type: ignore[attr-defined]
        messages=(session.history[0], notice, Message.user(text)), max_tokens=None,
        stream=False, tools=tuple(t.spec for t in session.tools),
        caching=session._sizer.caching))     # type: ignore[attr-defined]  # its cache key too
    cap = left + (whole.before_bytes - left) // 2
    plan = agree(session, emu, text, cap=cap)
    assert plan.fates[Fate.DROPPED] == 8
    assert [a.kind for a in plan.added] == ["compaction notice"]


# -- the chat budget: which setting compacts when ----------------------------------------------

def chatty(**kwargs: Any) -> ChatSession:
    """A reopened conversation of 24 messages, ≈24 KB, no tools."""
    history: list[Message] = []
    for i in range(12):
        history += [Message.user(f"q{i} " + "words " * 300), Message.assistant(f"a{i} ok")]
    return resumed(tuple(history), **kwargs)


def budget_line(plan: Plan) -> str:
    return next(line for line in plan.summary_lines() if line.startswith("chat budget"))


def test_the_chat_budget_is_one_number_under_one_name() -> None:
    session = chatty(window=32_000)
    quiet = session.what_if(text="next")
    assert quiet.preflight_action == "ok" and quiet.trigger is not None
    assert budget_line(quiet) == (f"chat budget {format_size(quiet.trigger)} (75% of the "
                                  "32,000-token window: chat_budget_ratio) — not reached")
    plan = session.what_if(text="next", chat_budget_ratio=0.15)
    assert plan.preflight_action == "compact" and plan.summary
    assert plan.trigger is not None and plan.target is not None
    budget = f"chat budget {format_size(plan.trigger)}"
    term = "(15% of the 32,000-token window: chat_budget_ratio)"
    assert f"over the {budget.replace('budget ', 'budget, ')} {term}" in plan.preflight_line
    assert budget_line(plan) == f"{budget} {term} — compacting to {format_size(plan.target)}"
    assert (plan.budget_of, plan.budget_share) == ("window", 0.15)
    assert not any("trigger" in line for line in plan.summary_lines())


def test_in_a_growing_chat_the_cap_share_compacts_before_the_jump_rule() -> None:
    session = chatty(window=128_000)
    size = session.what_if(text="next").before_bytes
    cap = int(size / 0.78)               # the history at 78% of the cap: over 70%, under 85%
    plan = session.what_if(text="next", cap=cap)
    assert plan.preflight_action == "compact" and "over the chat budget" in plan.preflight_line
    term = f"(70% of the configured cap {format_size(cap)}: cap_budget_fraction)"
    assert term in plan.preflight_line and term in budget_line(plan)
    # The 85% rule has no part in it: raising it changes nothing...
    higher = session.what_if(text="next", cap=cap, preflight_cap_fraction=0.95)
    assert higher.preflight_line == plan.preflight_line and higher.fates == plan.fates
    # ...raising the cap share does.
    later = session.what_if(text="next", cap=cap, cap_budget_fraction=0.95)
    assert later.preflight_action == "ok" and budget_line(later).endswith("— not reached")
    assert "95% of the configured cap" in budget_line(later)


def test_a_jump_past_the_cap_share_compacts_to_the_jump_budget_of_the_window() -> None:
    session = chatty(window=12_000)
    size = session.what_if(text="next").before_bytes
    cap = int(size / 0.9)                # at 90%: past the 85% jump share
    plan = session.what_if(text="next", cap=cap, cap_budget_fraction=0.95)
    assert plan.preflight_action == "compact" and "% of configured cap" in plan.preflight_line
    assert plan.budget_setting == "preflight_budget_ratio"
    assert "(40% of the 12,000-token window: preflight_budget_ratio) — compacting to" \
        in budget_line(plan)


def test_no_cap_and_a_guessed_window_is_no_chat_budget() -> None:
    session = chatty()
    provider = session.provider
    provider.info = ModelInfo("fake", 128_000, 4096, guessed=True)   # type: ignore[attr-defined]
    plan = session.what_if(text="next")
    assert plan.budget_of is None and not plan.window_known
    assert budget_line(plan) == ("chat budget: none (no payload cap and no known window) — "
                                 "not reached")


# -- fates of the other steps ------------------------------------------------------------------

def resumed(messages: History, name: str = "crafted", **kwargs: Any) -> ChatSession:
    """A session reopened on a crafted working history (``ChatSession.resume``)."""
    files = Transcript(name)
    files.create()
    files.save_history(messages)
    files.release()                         # written: the session is its one writer
    return ChatSession.resume(name, provider=FakeProvider(window=kwargs.pop("window", 128_000)),
                              **kwargs)


def test_a_budget_preview_is_planned_for_the_current_turn() -> None:
    call = ToolCall("call_1", "fetch", "{}")
    history = (Message.user("read it"), Message.assistant("", [call]),
               Message.tool("call_1", "x" * 9_000, name="fetch"))
    session = resumed(history)
    plan = session.what_if(per_result_max_chars=5_000, turn_budget_chars=5_000)
    assert [m.fate for m in plan.messages] == [Fate.PINNED_REQUEST, Fate.KEPT,
                                               Fate.BUDGET_PREVIEW]
    assert plan.messages[2].steps == (("budget", Fate.BUDGET_PREVIEW),)
    shrunk = plan.history[2]
    assert plan.messages[2].bytes == 9_000 and len(shrunk.text) <= 5_000
    assert compaction_info(shrunk) is not None and TRACK not in shrunk.meta


def test_the_trim_is_told_apart_from_the_summary() -> None:
    history: list[Message] = [Message.system("sys")]
    for i in range(30):
        history += [Message.user(f"q{i} " + "words " * 300),
                    Message.assistant(f"a{i} " + "answer " * 200, reasoning="thinking " * 50)]
    history.append(Message.assistant("", reasoning="only thoughts " * 40))
    session = resumed(tuple(history))
    plan = session.what_if(text="next", cap="100KB")
    fates = [m.fate for m in plan.messages]
    assert fates[-2] is Fate.DROPPED              # reasoning only: the trim removed it
    assert plan.messages[-2].steps == (("compaction", Fate.DROPPED),)
    assert Fate.SUMMARIZED in fates
    kept = [m for m in plan.messages if m.role == "assistant" and m.fate is Fate.TRIMMED]
    assert kept and all(m.bytes_after < m.bytes for m in kept)   # their reasoning went


def test_a_message_that_cannot_fit_is_refused_in_the_plan(emulator: Any) -> None:
    session = logged_session(emulator(context_window=128_000), turns=1)
    plan = session.what_if(text="x" * 20_000, cap="8KB")
    assert plan.refused is not None and "send a shorter message" in plan.refused
    assert all(_unpinned(m.fate) is Fate.KEPT for m in plan.messages)
    assert "refused before sending" in plan.text()


def test_the_ladder_on_a_rejection_keeps_the_request_at_every_rung(emulator: Any) -> None:
    session = logged_session(emulator(context_window=128_000))
    plan = session.what_if(text="next")
    payload, window = plan.ladder
    assert payload.rejection == "payload" and window.rejection == "window"
    # The session's own recovery: a 413 is fitted exactly, by a summary of the oldest
    # messages, and a resend rejected again at that size gives up (nothing smaller fits).
    first = payload.rungs[0]
    assert first.level is Level.EXACT_FIT and first.summarized
    assert [r.level for r in window.rungs] == [Level.AGGRESSIVE, Level.EMERGENCY,
                                               Level.NUCLEAR]
    for climb in plan.ladder:
        sizes = [r.bytes for r in climb.rungs]
        assert sizes == sorted(sizes, reverse=True) and sizes[-1] < plan.after_bytes
        assert all(r.request_kept for r in climb.rungs)
        assert climb.give_up
    assert "recovery attempts" in (window.give_up or "")
    nuclear = window.rungs[-1]
    keep = session.settings.nuclear_keep_messages
    assert nuclear.messages <= keep + 2         # system + notice + the last few
    lines = plan.ladder_lines()
    assert lines[0].startswith("if rejected as too large (HTTP 413): exact_fit (summary) → ")


def test_emergency_keep_changes_what_the_ladder_keeps(emulator: Any) -> None:
    session = logged_session(emulator(context_window=128_000))
    few = session.what_if(text="next", emergency_keep_messages=3).ladder[1].rungs[1]
    many = session.what_if(text="next", emergency_keep_messages=12).ladder[1].rungs[1]
    assert few.level is many.level is Level.EMERGENCY
    assert few.messages < many.messages


# -- settings: names, values, objects ----------------------------------------------------------

def test_aliases_env_names_and_settings_objects() -> None:
    session = resumed((Message.user("hello"), Message.assistant("hi")))
    assert session.what_if(cap="256KB").settings.max_payload == 256 * 1024
    assert session.what_if(window=32_000).settings.context_window == 32_000
    assert session.what_if(CHATCLI_EMERGENCY_KEEP_MESSAGES="7").settings \
        .emergency_keep_messages == 7
    plan = session.what_if(Settings(max_payload=1024 * 1024), emergency_keep_messages=5)
    assert (plan.settings.max_payload, plan.settings.emergency_keep_messages) == (1 << 20, 5)
    assert plan.changes == {"max_payload": (None, 1 << 20), "emergency_keep_messages": (10, 5)}
    assert session.what_if(cap=None, window=None).changes == {}


@pytest.mark.parametrize(("overrides", "words"), [
    ({"emergency_keep": 3}, "emergency_keep is not a setting (did you mean "
                            "emergency_keep_messages?)"),
    ({"capp": "1MB"}, "capp is not a setting (did you mean cap?)"),
    ({"emergency_keep_messages": 0}, "must be at least 1"),
    ({"preflight_cap_fraction": 1.5}, "must be a fraction in (0, 1]"),
    ({"cap": "lots"}, "is not a valid size"),
    ({"window": "wide"}, "is not a whole number"),
    ({"microcompact_truncate_turns": 5, "microcompact_summarize_turns": 3}, "is below"),
])
def test_bad_settings_are_one_sentence_and_change_nothing(
        overrides: dict[str, Any], words: str) -> None:
    session = resumed((Message.user("hello"), Message.assistant("hi")))
    before = (session.history, session.settings, session.directory / "history.json")
    snapshot = before[2].read_bytes()
    with pytest.raises(ConfigError) as caught:
        session.what_if(**overrides)
    message = str(caught.value)
    assert words in message and "\n" not in message and "Traceback" not in message
    assert (session.history, session.settings) == before[:2]
    assert before[2].read_bytes() == snapshot


def test_a_settings_argument_must_be_settings() -> None:
    session = resumed((Message.user("hello"),))
    with pytest.raises(ConfigError, match="is not a Settings object"):
        session.what_if({"max_payload": 5})  # type: ignore[arg-type]


def test_a_session_with_no_history_says_so(emulator: Any) -> None:
    session = ChatSession("emulator", emulator=emulator(), system="sys")
    with pytest.raises(CtxRecoveryError, match=r"has no history yet: send a message first"):
        session.what_if(cap="1MB")
    plan = session.what_if(text="first question")
    assert [m.fate for m in plan.messages] == [Fate.PINNED_SYSTEM, Fate.PINNED_REQUEST]


# -- no side effects -------------------------------------------------------------------------

def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_what_if_changes_nothing_and_writes_nothing(emulator: Any) -> None:
    emu = emulator(context_window=128_000)
    session = logged_session(emu, turns=3)
    files, received = _files(session.directory), emu.received
    history, limits = session.history, json.dumps(
        session.limits.to_json(model=session.model, path=None, settings=session.settings))
    for overrides in ({}, {"cap": "16KB"}, {"window": 3000},
                      {"microcompact_truncate_turns": 1, "microcompact_summarize_turns": 1}):
        plan = session.what_if(text="next", **overrides)
        assert plan.ladder                        # the ladder's search writes nothing either
    assert session.history is history and session.settings == Settings.from_env()
    assert json.dumps(session.limits.to_json(model=session.model, path=None,
                                             settings=session.settings)) == limits
    assert _files(session.directory) == files and emu.received == received
    assert all(TRACK not in m.meta for m in session.history)


# -- rendering -----------------------------------------------------------------------------------

def test_plan_renders_as_text_and_html(emulator: Any) -> None:
    session = logged_session(emulator(context_window=128_000))
    plan = session.what_if(text="next <b>", microcompact_truncate_turns=1,
                           microcompact_summarize_turns=3)
    bundle = plan._repr_mimebundle_()
    text, page = bundle["text/plain"], bundle["text/html"]
    assert text == str(plan) and text.startswith("what-if: no payload cap · window 128,000 tokens")
    assert "tool result previewed (microcompact)" in text
    assert "messages kept (#1–#" in text            # runs of kept messages are collapsed
    assert "latest request: kept" in text and "if rejected as too large" in text
    assert page.count("title='#") == len(plan.messages)      # one strip cell per message
    assert "next &lt;b&gt;" in page and "<b>what-if</b>" in page


def test_a_long_history_collapses_in_the_strip_and_the_table() -> None:
    history: list[Message] = []
    for i in range(2_000):
        history += [Message.user(f"q{i}"), Message.assistant(f"a{i}")]
    session = resumed(tuple(history))
    plan = session.what_if(text="next")
    page = plan.html()
    assert page.count("title='#") <= 1_500 and "title='#0–#" in page
    assert len(plan.messages) == 4_001 and len(plan.text().splitlines()) < 40


def test_fate_colours_are_told_apart_and_show_on_a_light_and_a_dark_page() -> None:
    """Data colours, the same in every theme: each at least 3:1 (WCAG's non-text minimum)
    against a white and the dark theme's #111 page, and fates the legend names apart at
    least a CIE76 distance of 20 from each other."""
    for fate, colour in FATE_COLOURS.items():
        assert contrast_ratio(colour, "#fff") >= 3.0, fate
        assert contrast_ratio(colour, "#111") >= 3.0, fate
    named = {}
    for fate, colour in FATE_COLOURS.items():
        named.setdefault(FATE_WORDS[fate].split(" (")[0], set()).add(colour)
    words = sorted(named)
    for i, a in enumerate(words):
        for b in words[i + 1:]:
            for x in named[a]:
                for y in named[b]:
                    assert delta_e(x, y) >= 20, (a, b, x, y)


def test_the_plan_page_has_no_colour_but_the_theme_and_the_fates(emulator: Any) -> None:
    session = logged_session(emulator(context_window=128_000))
    plan = session.what_if(text="next", microcompact_truncate_turns=1,
                           microcompact_summarize_turns=3)
    page = plan.html()
    assert "messages kept (#" in page                    # the dim line is on the page
    assert theme_problems(page, installed_themes(), allowed=FATE_COLOURS.values()) == []
    assert vetted(page) == []


def test_a_give_up_never_says_a_size_is_more_than_the_same_size() -> None:
    # QA: "the request is 8.5 KB, more than the 8.5 KB this request can carry": two sizes
    # a few bytes apart, rounded alike. Where they round alike they are given in bytes.
    from ipy_ctxrecovery.core.ladder.apply import _sized
    from ipy_ctxrecovery.settings import format_size

    assert format_size(8_750) == format_size(8_700)     # the case: alike when rounded
    assert _sized(8_750, 8_700) == ("8,750 bytes", "8,700 bytes")
    assert _sized(20_000, 8_700) == (format_size(20_000), format_size(8_700))
