"""The session's use of the provider's server compaction (docs/server-compaction.md): the
pure decision and trigger, a reply's compaction split off and replacing what came before
it, no client summary while the server compacts, the fit to a proxy's cap still in force,
undo-compact, context editing, and the events and their wording."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from fakes import FakeProvider, compaction_reply, failure, tool_call_reply

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core import compactor, pins
from ipy_ctxrecovery.core import server_compaction as sc
from ipy_ctxrecovery.core.compactor import NO_LIMIT, ChatBudget
from ipy_ctxrecovery.core.events import (
    BackgroundSummary,
    CompactionPhase,
    Event,
    FitBeforeSend,
    MicrocompactApplied,
    Preflight,
    ServerCompacted,
    ServerCompactionNote,
)
from ipy_ctxrecovery.core.history import (
    TAG_PINNED_RULES,
    TAG_SERVER_COMPACTION,
    Compaction,
    Message,
    Role,
    Text,
    problems,
)
from ipy_ctxrecovery.core.prompts import SUMMARIZE_SYSTEM_PROMPT
from ipy_ctxrecovery.core.wording import describe, shown_at
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.notebook.turn_card import TurnRecord
from ipy_ctxrecovery.providers.base import ContextEdit, Usage
from ipy_ctxrecovery.session.server_side import api_supports

# -- the pure decision ------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "model", "api", "asked", "carried", "note"), [
    ("off", True, True, False, True, None),
    ("auto", True, True, True, True, None),
    ("auto", False, True, False, True, None),
    ("auto", True, False, False, True, None),
    ("on", True, True, True, True, None),
    ("on", False, True, True, True, "unsupported_model"),
    ("on", True, False, True, False, "unsupported_api"),
])
def test_use_follows_the_setting_the_model_and_the_api(
        setting: str, model: bool, api: bool, asked: bool, carried: bool,
        note: str | None) -> None:
    decision = sc.use(setting, model_supports=model, api_supports=api)
    assert (decision.asked, decision.carried, decision.note) == (asked, carried, note)


def test_the_trigger_is_the_budget_in_tokens_clamped_up_to_the_servers_lowest() -> None:
    window = sc.trigger(ChatBudget(400_000, "window", 0.75), bytes_per_token=4.0,
                        min_trigger=50_000)
    assert (window.tokens, window.derived, window.clamped, window.of) == \
        (100_000, 100_000, False, "window")
    # A 64 KB proxy: 70% of it is ≈11k tokens, below Anthropic's 50,000.
    cap = sc.trigger(ChatBudget(45_875, "cap", 0.7), bytes_per_token=4.0, min_trigger=50_000)
    assert (cap.tokens, cap.derived, cap.clamped, cap.of) == (50_000, 11_000, True, "cap")
    # Rounded down to two figures: a calibration that moves a little keeps the body.
    assert sc.trigger(ChatBudget(24_576, "window", 0.75), bytes_per_token=4.0,
                      min_trigger=1_000).tokens == 6_100
    assert sc.trigger(ChatBudget(24_600, "window", 0.75), bytes_per_token=4.01,
                      min_trigger=1_000).tokens == 6_100
    assert [sc.steady(n) for n in (7, 99, 150, 6_144, 123_456)] == [7, 99, 150, 6_100, 120_000]
    # A window's share is the same number of tokens at any calibration (its bytes are
    # floored: back in tokens that is not one step below the round number).
    for bpt in (3.7, 4.0, 4.036, 4.113, 4.169, 4.302):
        budget = compactor.chat_budget(Settings(), window_tokens=200_000, bytes_per_token=bpt,
                                       cap=None, ratio=0.75)
        assert sc.trigger(budget, bytes_per_token=bpt, min_trigger=1_000).tokens == 150_000
    # No term at all: the server's lowest, not a clamp.
    none = sc.trigger(ChatBudget(NO_LIMIT), bytes_per_token=4.0, min_trigger=1_000)
    assert (none.tokens, none.clamped) == (1_000, False)


def test_the_server_compacts_only_when_asked_carried_and_not_clamped() -> None:
    ok = sc.Trigger(6_000, 6_000, False, "window")
    clamped = sc.Trigger(50_000, 11_000, True, "cap")
    assert sc.server_compacts(sc.Use(True), ok)
    assert not sc.server_compacts(sc.Use(True), clamped)
    assert not sc.server_compacts(sc.Use(False), ok)
    assert not sc.server_compacts(sc.Use(True, carried=False), ok)


def test_split_and_replace_keep_the_system_prompt_and_the_pinned_rules_after_it() -> None:
    block = Compaction("anthropic", json.dumps({"type": "compaction", "content": "S"}), "S")
    reply = Message(Role.ASSISTANT, (block, Text("the answer")))
    compaction, answer = sc.split_reply(reply)
    assert compaction is not None and compaction.tag == TAG_SERVER_COMPACTION
    assert compaction.blocks == (block,) and answer.text == "the answer"
    assert sc.split_reply(answer) == (None, answer)
    pinned = Message.user("rules: always cite", tag=TAG_PINNED_RULES)
    history = (Message.system("sys"), pinned, Message.user("q1"), Message.assistant("a1"),
               Message.user("q2"))
    new = sc.replace_before(history, compaction)
    assert new == (history[0], compaction, pinned)
    assert problems((*new, answer)) == []


def test_the_rules_the_user_stated_in_what_it_replaces_are_pinned_after_it() -> None:
    """The server's summary reads the user's "always…/never…" like everything else, and
    may lose their wording: the rules are pinned after its compaction, verbatim, as the
    package's own compaction pins them (and an earlier pin is merged, not lost)."""
    block = Compaction("anthropic", json.dumps({"type": "compaction", "content": "S"}), "S")
    compaction = Message(Role.ASSISTANT, (block,), tag=TAG_SERVER_COMPACTION)
    earlier = pins.pinned_message(["Never drop rows with missing prices."])
    assert earlier is not None
    history = (Message.system("sys"), earlier,
               Message.user("Always report revenue in EUR. What was Q3?"),
               Message.assistant("Q3 was 1.2M EUR."),
               Message.user("From now on, round to two decimals. And Q4?"))
    new = sc.replace_before(history, compaction, settings=Settings())
    assert new[:2] == (history[0], compaction) and len(new) == 3
    assert new[2].tag == TAG_PINNED_RULES
    assert pins.rules_of(new[2]) == ("Never drop rows with missing prices.",
                                     "Always report revenue in EUR.",
                                     "From now on, round to two decimals.")
    # No new rule: the pin is kept as it was (the same message, the same bytes).
    plain = (Message.system("sys"), earlier, Message.user("What was Q3?"))
    assert sc.replace_before(plain, compaction, settings=Settings())[2] is earlier
    # None at all: nothing pinned.
    assert sc.replace_before(plain[2:], compaction, settings=Settings()) == (compaction,)


def test_a_session_pins_the_rules_a_server_compaction_replaced(emulator: Any) -> None:
    emu = emulator(context_window=200_000)
    with ChatSession("emulator:anthropic", emulator=emu,
                     settings=Settings(context_window=6_000)) as s:
        s.send("Always answer in French. " + "the quick brown fox " * 100, stream=False)
        for i in range(12):
            s.send(f"turn {i}: " + "the quick brown fox " * 150, stream=False)
        assert any(m.tag == TAG_SERVER_COMPACTION for m in s.history), "never compacted"
        pinned = [m for m in s.history if m.tag == TAG_PINNED_RULES]
        assert [pins.rules_of(m) for m in pinned] == [("Always answer in French.",)]
        # And the rule is sent, after the compaction block.
        body = json.dumps(emu.requests[-1].body)
        assert body.index("Always answer in French.") > body.index('"compaction"')


def test_clearable_tool_tokens_leave_the_latest_uses_and_what_a_compaction_replaced() -> None:
    old = Message.tool("c1", "x" * 4_000)
    recent = [Message.tool(f"c{i}", "y" * 400) for i in range(2, 5)]
    compaction = Message(Role.ASSISTANT, (Compaction("anthropic", "{}", "S"),),
                         tag=TAG_SERVER_COMPACTION)
    assert sc.clearable_tool_tokens([old, *recent], keep=3, bytes_per_token=4.0) == 1_000
    assert sc.clearable_tool_tokens([old, compaction, *recent], keep=3,
                                    bytes_per_token=4.0) == 0


def test_which_apis_carry_it() -> None:
    class P:
        def __init__(self, **attrs: Any) -> None:
            self.__dict__.update(attrs)

    assert api_supports(P(wire="anthropic"))
    assert not api_supports(P(wire="openai"))           # Chat Completions
    assert api_supports(P(wire="openai", api="responses"))
    assert not api_supports(P(wire="anthropic", server_compaction=False))   # it says so
    assert not api_supports(P())


# -- the session ---------------------------------------------------------------------------

def compacting(script: Any = (), **kwargs: Any) -> FakeProvider:
    kwargs.setdefault("wire", "anthropic")
    kwargs.setdefault("server_compaction", True)
    kwargs.setdefault("min_compact_trigger", 1_000)
    return FakeProvider(script, **kwargs)


def chat(provider: FakeProvider, settings: Settings | None = None,
         **kwargs: Any) -> tuple[ChatSession, list[Event]]:
    events: list[Event] = []
    s = ChatSession(provider=provider, settings=settings or Settings(), system="Be brief.",
                    on_event=events.append, sleep=lambda _s: None, **kwargs)
    return s, events


def test_each_request_carries_the_trigger_derived_from_the_chat_budget() -> None:
    fake = compacting(window=8_192)
    s, _ = chat(fake)
    s.send("hello")
    context = fake.requests[-1].context
    assert context is not None and context.clear_tool_uses is None
    assert context.compact_trigger == sc.steady(int(8_192 * Settings().chat_budget_ratio))
    assert b'"context_management"' in fake.bodies[-1]
    # A payload cap lowers it: 70% of 32 KB at the calibrated bytes/token.
    capped = compacting(window=8_192)
    s2, _ = chat(capped, Settings(max_payload=32 * 1024))
    s2.send("hello")
    bpt = s2.limits.tokens.bytes_per_token
    trigger = capped.requests[-1].context.compact_trigger  # type: ignore[union-attr]
    assert trigger < int(8_192 * 0.75)
    assert abs(trigger - int(0.7 * 32 * 1024 / bpt)) <= int(0.7 * 32 * 1024 / bpt) // 3


def test_off_and_an_api_without_it_ask_nothing() -> None:
    fake = compacting()
    s, _ = chat(fake, Settings(server_compaction="off"))
    s.send("hello")
    assert fake.requests[-1].context is None
    chat_completions = FakeProvider((), wire="openai", server_compaction=True)
    s2, events = chat(chat_completions)          # auto: Chat Completions cannot carry it
    s2.send("hello")
    assert chat_completions.requests[-1].context is None
    assert not [e for e in events if isinstance(e, ServerCompactionNote)]


def test_on_tells_once_when_the_model_or_the_api_lacks_it() -> None:
    fake = compacting(server_compaction=False)
    s, events = chat(fake, Settings(server_compaction="on"))
    s.send("one")
    s.send("two")
    notes = [e for e in events if isinstance(e, ServerCompactionNote)]
    assert [n.note for n in notes] == ["unsupported_model"]
    assert fake.requests[-1].context is not None      # asked all the same
    assert "not known to compact on its server" in describe(notes[0])
    plain = FakeProvider((), wire="openai")
    s2, events2 = chat(plain, Settings(server_compaction="on"))
    s2.send("one")
    s2.send("two")
    assert [e.note for e in events2 if isinstance(e, ServerCompactionNote)] == \
        ["unsupported_api"]


def test_a_reply_with_a_compaction_replaces_the_history_before_it() -> None:
    fake = compacting(["a1", "a2", compaction_reply("a3", "what was said")])
    s, events = chat(fake)
    s.send("q1")
    s.send("q2")
    reply = s.send("q3")
    assert reply.text == "a3"
    assert [(m.role, m.tag) for m in s.history] == [
        (Role.SYSTEM, None), (Role.ASSISTANT, TAG_SERVER_COMPACTION), (Role.ASSISTANT, None)]
    told = [e for e in events if isinstance(e, ServerCompacted)]
    assert len(told) == 1 and told[0].replaced_messages == 5
    assert told[0].summary_chars == len("what was said") and told[0].wire == "anthropic"
    assert told[0].after_bytes < told[0].before_bytes
    # The transcript keeps everything, and the compaction too.
    assert [m.text for m in s.transcript if m.role is Role.USER] == ["q1", "q2", "q3"]
    assert any(m.tag == TAG_SERVER_COMPACTION for m in s.transcript)
    # The next request no longer carries what it replaced, and the window counts it.
    s.send("q4")
    sent = fake.requests[-1].messages
    assert [m.text for m in sent if m.role is Role.USER] == ["q4"]
    assert any(m.tag == TAG_SERVER_COMPACTION for m in sent)
    assert b"what was said" in fake.bodies[-1]
    after_bytes, after_tokens = s.history_size()
    everything = tuple(m for m in s.transcript if m.tag != TAG_SERVER_COMPACTION)
    full_bytes, full_tokens = s.history_size(everything)
    assert after_bytes < full_bytes and after_tokens < full_tokens
    assert s.status().history_bytes == after_bytes
    assert s.status().compactions == 1


def test_undo_compact_goes_back_past_a_server_compaction() -> None:
    fake = compacting(["a1", compaction_reply("a2"), "a3"])
    s, _ = chat(fake)
    s.send("q1")
    s.send("q2")
    s.send("q3")
    s.undo_compact()
    assert [m.text for m in s.history] == ["Be brief.", "q1", "a1", "q2", "a2", "q3", "a3"]
    assert problems(s.history) == []


def test_the_pinned_rules_message_is_kept_after_the_compaction() -> None:
    fake = compacting([compaction_reply("ok")])
    s, _ = chat(fake)
    pinned = Message.user("Your standing instructions: always cite.", tag=TAG_PINNED_RULES)
    s._history = (*s._history, pinned, Message.user("q0"), Message.assistant("a0"))
    s.send("q1")
    assert [m.tag for m in s.history] == [None, TAG_SERVER_COMPACTION, TAG_PINNED_RULES, None]


def long_chat(fake: FakeProvider, settings: Settings, turns: int = 12,
              size: int = 1_500) -> tuple[ChatSession, list[Event]]:
    s, events = chat(fake, settings)
    for i in range(turns):
        s.send(f"turn {i}: " + "words " * (size // 6))
    return s, events


def test_no_client_summary_while_the_server_compacts() -> None:
    # 12 turns of ~1.5 KB in a 2,048-token window: the package's own compaction would run.
    settings = Settings(background_compaction=True)
    plain = FakeProvider((), window=2_048)
    baseline, base_events = long_chat(plain, settings)
    assert any(isinstance(e, CompactionPhase) and e.phase == "summarize" for e in base_events)
    assert any(r.messages[0].text == SUMMARIZE_SYSTEM_PROMPT for r in plain.requests)
    fake = compacting(window=2_048, min_compact_trigger=100, compacts=True)
    s, events = long_chat(fake, settings)
    assert fake.compactions >= 2
    assert len([e for e in events if isinstance(e, ServerCompacted)]) == fake.compactions
    assert not any(isinstance(e, CompactionPhase) for e in events)
    assert not any(isinstance(e, BackgroundSummary) for e in events)
    assert s._background.jobs == 0
    assert not any(r.messages and r.messages[0].text == SUMMARIZE_SYSTEM_PROMPT
                   for r in fake.requests)
    assert all(r.context is not None for r in fake.requests)
    assert len(fake.requests) == 12     # one request a turn: nothing else was asked
    # Pre-flight says what it leaves to the server, and never "compacting".
    said = [describe(e) for e in events if isinstance(e, Preflight) and e.action != "ok"]
    assert said and all(e.server_compacts for e in events if isinstance(e, Preflight))
    assert all("the provider compacts on its server" in line or "fitting" in line
               for line in said)
    assert not any("compacting" in line for line in said)
    assert not [e for e in events if isinstance(e, ServerCompactionNote)]


def test_a_server_that_does_not_compact_hands_the_window_back_to_the_package() -> None:
    """"on" for a model the catalogue does not know: asked, and the package's summary
    waits — until a reply past the trigger comes back without a compaction. Then it is
    told once, and the package compacts itself."""
    fake = FakeProvider((), window=2_048, wire="anthropic")     # never compacts
    s, events = long_chat(fake, Settings(server_compaction="on"), turns=12)
    notes = [e.note for e in events if isinstance(e, ServerCompactionNote)]
    assert notes == ["unsupported_model", "not_compacting"]
    said = describe(next(e for e in events if isinstance(e, ServerCompactionNote)
                         and e.note == "not_compacting"))
    assert "this server does not compact" in said
    assert any(isinstance(e, CompactionPhase) and e.phase == "summarize" for e in events)
    assert not s._sizer.server.compacts() and s.limits.server_did_not_compact
    assert "the server did not compact past its trigger" in str(s.status())
    assert "did not compact past its trigger" in "\n".join(s.what_if(size=100).summary_lines())


def test_a_clamped_trigger_leaves_the_package_compacting_and_says_so_once() -> None:
    # A 16 KB cap: 70% of it is ≈2,900 tokens, below a server whose lowest is 50,000.
    fake = compacting(window=200_000, min_compact_trigger=50_000)
    s, events = long_chat(fake, Settings(max_payload=16 * 1024), turns=14)
    notes = [e for e in events if isinstance(e, ServerCompactionNote)]
    assert [n.note for n in notes] == ["clamped"] and notes[0].of == "cap"
    assert notes[0].trigger_tokens == 50_000 and notes[0].derived_tokens < 50_000
    assert "below the server's lowest trigger" in describe(notes[0])
    # "needs compaction by ≈N tokens" read as an amount to remove: it is where it is due.
    assert f"needs compaction at ≈{notes[0].derived_tokens:,} tokens" in describe(notes[0])
    assert any(isinstance(e, CompactionPhase) and e.phase == "summarize" for e in events)
    assert all(r.context is not None and r.context.compact_trigger == 50_000
               for r in fake.requests if r.messages[0].text == "Be brief.")
    assert all(len(b) <= 16 * 1024 for b in fake.bodies)


def test_the_cap_fit_still_works_while_the_server_compacts() -> None:
    """A configured 8 KB cap under a window the server keeps (its trigger is 70% of the cap,
    not clamped). A turn that jumps from under the trigger to over the cap would be
    rejected before the server ever saw it: the fit keeps it under the cap — dropping the
    oldest, never by a summary, and only at the cap itself, not at the chat budget — and
    the server then compacts that request."""
    fake = compacting(window=200_000, min_compact_trigger=100, compacts=True)
    s, events = chat(fake, Settings(max_payload=8 * 1024))
    for text in ("a" * 2_000, "b" * 2_500, "c" * 4_500, "d" * 100, "e" * 3_000, "f" * 5_000):
        s.send(text)
    assert all(len(b) <= 8 * 1024 for b in fake.bodies)
    fits = [e for e in events if isinstance(e, FitBeforeSend)]
    assert fits and all(f.over == "cap" for f in fits)
    assert all(f.goal_bytes >= int(8 * 1024 * (1 - s.settings.exact_fit_margin)) - 1
               for f in fits)           # aimed just under the cap, not at the target
    assert fake.compactions >= 1 and any(isinstance(e, ServerCompacted) for e in events)
    assert not any(isinstance(e, CompactionPhase) for e in events)
    assert len(fake.requests) == 6      # no summary request


def cap_fits_while_the_server_compacts() -> list[Event]:
    """A configured 8 KB cap while the server compacts; turns that jump over the cap."""
    fake = compacting(window=200_000, min_compact_trigger=100, compacts=True)
    s, events = chat(fake, Settings(max_payload=8 * 1024))
    for text in ("a" * 2_000, "b" * 2_500, "c" * 4_500, "d" * 100, "e" * 3_000, "f" * 5_000):
        s.send(text)
    assert not any(isinstance(e, CompactionPhase) for e in events)
    return events


def test_preflight_says_fitting_for_a_body_over_the_cap_while_the_server_compacts() -> None:
    """A body over the cap is fitted, not left to the server (it would never see it)."""
    events = cap_fits_while_the_server_compacts()
    over = [e for e in events if isinstance(e, Preflight) and "cap" in e.reasons
            and e.cap is not None and e.body_bytes > e.cap]
    assert over and all(e.server_compacts for e in over)
    assert all("fitting" in describe(e) and "the provider compacts" not in describe(e)
               for e in over)


def test_the_card_calls_a_body_over_the_cap_over_it_and_fitted() -> None:
    from ipy_ctxrecovery.core.wording import preflight_verdict

    over = [e for e in cap_fits_while_the_server_compacts() if isinstance(e, Preflight)
            and "cap" in e.reasons and e.cap is not None and e.body_bytes > e.cap]
    assert over and all(preflight_verdict(e).startswith("over the cap → fitting")
                        for e in over)
    own = Preflight(body_bytes=29_000, est_tokens=7_000, cap=24_000, cap_source="configured",
                    window=128_000, action="compact", reasons=("cap",))
    assert preflight_verdict(own) == "over the cap → compacting"
    near = dataclasses.replace(own, body_bytes=22_000, server_compacts=True)
    assert preflight_verdict(near) == "near the cap → the provider compacts on its server"


def test_the_card_says_what_pre_flight_does_once_for_the_cap_and_the_window() -> None:
    from ipy_ctxrecovery.core.wording import preflight_verdict

    both = Preflight(body_bytes=40_000, est_tokens=9_700, cap=24_000, cap_source="configured",
                     window=8_192, max_tokens=4_096, action="compact",
                     reasons=("cap", "window"), server_compacts=True)
    assert preflight_verdict(both) == ("over the cap and prompt + answer over the window → "
                                       "fitting (no summary: the server compacts)")
    near = dataclasses.replace(both, body_bytes=22_000)
    assert preflight_verdict(near) == ("near the cap → the provider compacts on its server · "
                                       "prompt + answer over the window → fitting (no "
                                       "summary: the server compacts)")


def test_the_fit_line_speaks_of_no_compaction_while_the_server_compacts() -> None:
    """The package compacted nothing before the fit: no "still … after compaction"."""
    fits = [describe(e) for e in cap_fits_while_the_server_compacts()
            if isinstance(e, FitBeforeSend)]
    assert fits and all("after compaction" not in line and "fitting to" in line
                        for line in fits)


def test_a_body_near_the_cap_but_under_it_is_left_to_the_server() -> None:
    near = Preflight(body_bytes=7_500, est_tokens=1_900, cap=8_192, cap_source="configured",
                     window=200_000, action="compact", reasons=("cap",), server_compacts=True)
    assert describe(near).endswith("the provider compacts on its server")


class Proxy(FakeProvider):
    """A proxy in front of the fake: bodies over ``limit`` bytes get a 413."""

    limit = 10_000

    def send(self, request: Any, on_text: Any = None) -> Any:
        if len(self.encode(request)) > self.limit:
            self.requests.append(request)
            raise failure(FailureKind.PAYLOAD_TOO_LARGE, "413 Request Entity Too Large",
                          status=413)
        return super().send(request, on_text)


def test_a_proxy_413_is_fitted_without_a_summary_while_the_server_compacts() -> None:
    """No cap known at first: the trigger is the window's, above the proxy's limit, so a
    body passes the limit before the server compacts. One 413; the ladder drops (no
    summary), the cap is learned, and from then on the trigger follows it — the server
    compacts below the cap, and no request is rejected again."""
    fake = Proxy((), wire="anthropic", server_compaction=True, min_compact_trigger=100,
                 window=200_000, compacts=True)
    s, events = long_chat(fake, Settings(background_compaction=False), turns=16, size=1_500)
    assert s.status().recoveries == 1
    assert len(fake.requests) - len(fake.bodies) == 1     # one rejection in 16 turns
    assert not any(isinstance(e, CompactionPhase) for e in events)
    assert not any(r.messages[0].text == SUMMARIZE_SYSTEM_PROMPT for r in fake.requests)
    assert fake.compactions >= 1
    trigger = fake.requests[-1].context.compact_trigger  # type: ignore[union-attr]
    assert trigger * s.limits.tokens.bytes_per_token <= Proxy.limit


def test_the_413_drop_says_why_there_was_no_summary_while_the_server_compacts() -> None:
    """QA: "↳ oldest messages dropped to fit (23 → 10 messages)" where, with the server's
    compaction off, the same 413 is answered by a summary: the line and the card say why."""
    from ipy_ctxrecovery.core.events import LadderStep
    from ipy_ctxrecovery.core.wording import ladder_detail

    fake = Proxy((), wire="anthropic", server_compaction=True, min_compact_trigger=100,
                 window=200_000, compacts=True)
    _, events = long_chat(fake, Settings(background_compaction=False), turns=16, size=1_500)
    drops = [e for e in events if isinstance(e, LadderStep)
             and e.after_messages < e.before_messages]
    assert drops
    assert all(describe(e).endswith("messages; no summary: the server compacts)")
               for e in drops)
    assert all(ladder_detail(e, done=True).endswith("; no summary: the server compacts)")
               for e in drops)
    plain = Proxy((), window=200_000)
    _, own = long_chat(plain, Settings(background_compaction=False), turns=16, size=1_500)
    assert not any("server compacts" in describe(e) for e in own if isinstance(e, LadderStep))


def test_context_editing_is_asked_with_heavy_tool_results_and_reported_as_microcompact() -> None:
    edits = (ContextEdit("clear_tool_uses", cleared_tokens=2_345, cleared_items=4),)
    fake = compacting(window=200_000, min_compact_trigger=100)
    # Results microcompact leaves alone (recent enough): what the server could clear.
    s, events = chat(fake, Settings(microcompact_clear_at_least=1_000,
                                    microcompact_truncate_turns=50,
                                    microcompact_summarize_turns=60))
    calls = [Message.assistant("", [tc]) for tc in
             (tool_call_reply("read_file", {}, call_id=f"c{i}").message.tool_calls[0]
              for i in range(6))]
    turns: list[Message] = []
    for i, call in enumerate(calls):
        turns += [Message.user(f"q{i}"), call, Message.tool(f"c{i}", "z" * 4_000)]
    s._history = (*s._history, *turns)
    fake.script.append(compaction_reply("ok", edits=edits))
    s.send("next")
    context = fake.requests[-1].context
    assert context is not None and context.clear_tool_uses is not None
    assert context.clear_tool_uses.clear_at_least == 1_000
    assert context.clear_tool_uses.keep == 3
    assert context.clear_tool_uses.trigger < context.compact_trigger  # type: ignore[operator]
    told = [e for e in events if isinstance(e, MicrocompactApplied) and e.on_server]
    assert len(told) == 1 and told[0].summarized == 4 and told[0].cleared_tokens == 2_345
    assert told[0].bytes_freed == 0
    assert "cleared by the provider" in describe(told[0])


def test_light_tool_results_ask_no_context_editing() -> None:
    fake = compacting(window=200_000, min_compact_trigger=100)
    s, _ = chat(fake)
    s.send("hello")
    assert fake.requests[-1].context.clear_tool_uses is None  # type: ignore[union-attr]


# -- what is shown -------------------------------------------------------------------------

def test_the_event_is_a_quiet_status_line_and_a_card_row() -> None:
    event = ServerCompacted(wire="openai", replaced_messages=7, before_bytes=40_000,
                            after_bytes=3_000, summary_chars=None)
    assert shown_at(event) == "quiet"
    line = describe(event)
    assert "7 messages replaced" in line and "an encrypted summary the package cannot read" in line and "undo-compact" in line
    record = TurnRecord()
    record.feed(event)
    step = record.latest("server_compaction")
    assert step is not None and step.status == "done"
    assert "7 messages → 1" in step.detail and "an encrypted summary the package cannot read" in step.detail


def nesting(text: str) -> int:
    depth = deepest = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
    return deepest


def test_an_encrypted_compaction_is_said_without_brackets_in_brackets() -> None:
    event = ServerCompacted(wire="openai", replaced_messages=7, before_bytes=40_000,
                            after_bytes=3_000, summary_chars=None)
    record = TurnRecord()
    record.feed(event)
    step = record.latest("server_compaction")
    assert step is not None
    assert nesting(describe(event)) == 1 and nesting(step.detail) == 1
    assert "encrypted" in describe(event) and "encrypted" in step.detail


def test_the_panel_shows_a_server_compaction_row() -> None:
    from ipy_ctxrecovery.notebook import panel

    record = TurnRecord()
    record.feed(ServerCompacted(wire="anthropic", replaced_messages=3, before_bytes=9_000,
                                after_bytes=1_000, summary_chars=120))
    rows = panel._tracker(record, running=False)
    names = [name for _, _, name, _ in rows]
    assert "server compaction" in names
    detail = next(d for _, _, name, d in rows if name == "server compaction")
    assert "summary of 120 characters" in detail


def test_what_if_says_server_compaction_instead_of_a_summary() -> None:
    fake = compacting(window=2_048, min_compact_trigger=100)
    s, _ = chat(fake)
    for i in range(3):
        s.send(f"turn {i}: " + "words " * 250)
    plan = s.what_if(size=3_000)
    assert not plan.summary
    text = "\n".join(plan.summary_lines())
    assert "server compaction: the provider compacts past" in text
    assert "LLM summary would run" not in text
    off = s.what_if(server_compaction="off", size=3_000)
    assert off.server_line is None and off.summary


def test_what_if_judges_the_server_trigger_on_the_request_it_would_send() -> None:
    """A request the fit brings under the trigger is not one the server would compact: the
    plan's server line measures the request after pre-flight, not the one before it."""
    fake = compacting(window=8_192, min_compact_trigger=100, compacts=True)
    s, _ = chat(fake)
    for i in range(4):
        s.send(f"turn {i}: " + "words " * 700)
    plan = s.what_if(size=20_000)
    assert plan.server_line is not None and plan.after_bytes < plan.before_bytes
    sent = s._sizer.estimate(plan.after_bytes)
    trigger = int(plan.server_line.split("compacts past ")[1].split()[0].replace(",", ""))
    assert ("is over it" in plan.server_line) == (sent > trigger)
    if "is over it" in plan.server_line:
        assert f"≈{sent:,} tokens" in plan.server_line


def test_history_lists_the_compaction_as_its_own_kind(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from ipy_ctxrecovery.notebook import subcommands

    opaque = Message(Role.ASSISTANT, (Compaction("openai", "{}", None),),
                     tag=TAG_SERVER_COMPACTION)
    readable = Message(Role.ASSISTANT, (Compaction("anthropic", "{}", "We  discussed\nX."),),
                       tag=TAG_SERVER_COMPACTION)
    assert "encrypted summary the package cannot read" in subcommands._describe_blocks(opaque)
    assert subcommands._describe_blocks(readable) == "We discussed X."
    assert "server compaction" in subcommands._TAG_WORDS[TAG_SERVER_COMPACTION]


def test_usage_of_a_compaction_reply_is_counted() -> None:
    fake = compacting([compaction_reply("a")])
    s, _ = chat(fake)
    reply = s.send("q")
    assert reply.usage == Usage(10, 5, 0, 0)


def test_the_compaction_event_carries_what_the_compaction_was_billed() -> None:
    # The card prices the server's compaction from its event (turn_card._billed_note).
    own = Usage(4_800, 250, 3_900, 100)
    reply = dataclasses.replace(compaction_reply("a"), usage=Usage(10, 5, compaction=own))
    s, events = chat(compacting([reply]))
    s.send("q")
    (told,) = [e for e in events if isinstance(e, ServerCompacted)]
    assert (told.prompt_tokens, told.completion_tokens, told.cached_tokens,
            told.cache_write_tokens) == (4_800, 250, 3_900, 100)
    s2, events2 = chat(compacting([compaction_reply("a")]))      # none reported
    s2.send("q")
    (quiet,) = [e for e in events2 if isinstance(e, ServerCompacted)]
    assert quiet.prompt_tokens is None and quiet.completion_tokens is None


def test_chat_history_shows_the_compaction_in_a_shell(loaded_shell: Any,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from ipy_ctxrecovery.notebook import get_magics

    loaded_shell.run_cell_magic("chat", "", "first")
    session = get_magics().workspace.session()
    compaction = Message(Role.ASSISTANT, (Compaction("anthropic", "{}", "We  discussed\nX."),),
                         tag=TAG_SERVER_COMPACTION)
    opaque = Message(Role.ASSISTANT, (Compaction("openai", "{}", None),),
                     tag=TAG_SERVER_COMPACTION)
    session._history = (compaction, Message.assistant("ok"), opaque)
    capsys.readouterr()
    loaded_shell.run_line_magic("chat", "history")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith(
        "assistant [server compaction: replaces everything before it] We discussed X.")
    assert "an encrypted summary the package cannot read, from the openai server" in lines[3]


def test_the_transcript_labels_the_compaction_as_the_servers(
        loaded_shell: Any, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    # QA: `%chat export x.md` showed the server's summary as "## assistant" prose, as if
    # the model had said it; `--full` said it "replaces everything before it", in the
    # transcript that keeps everything before it.
    from ipy_ctxrecovery.notebook import get_magics

    loaded_shell.run_cell_magic("chat", "", "first")
    session = get_magics().workspace.session()
    compaction = Message(Role.ASSISTANT, (Compaction("anthropic", "{}", "We discussed X."),),
                         tag=TAG_SERVER_COMPACTION)
    session._transcript = [*session.transcript, compaction]
    capsys.readouterr()
    loaded_shell.run_line_magic("chat", "history --full")
    last = capsys.readouterr().out.splitlines()[-1]
    assert "replaces everything" not in last
    assert last.endswith("[server compaction: the provider's summary of the messages "
                         "before it] We discussed X.")
    loaded_shell.run_line_magic("chat", f"export {tmp_path / 't.md'}")
    text = (tmp_path / "t.md").read_text()
    assert text.endswith("## assistant · server compaction: the provider's summary of the "
                         "messages before it\n\nWe discussed X.\n")


def test_a_resumed_session_keeps_its_server_compaction() -> None:
    fake = compacting(["a1", compaction_reply("a2", "S"), "a3"])
    s, _ = chat(fake, name="resumed-compaction")
    for text in ("q1", "q2"):
        s.send(text)
    kept = s.history
    s.close()
    again = ChatSession.resume("resumed-compaction", provider=compacting(["a3"]),
                               settings=Settings())
    assert again.history == kept
    again.send("q3")
    assert problems(again.history) == []
    assert again.history[1].tag == TAG_SERVER_COMPACTION
    again.close()


def test_the_recall_tool_is_offered_after_a_server_compaction() -> None:
    fake = compacting([compaction_reply("a1"), "a2"])
    s, _ = chat(fake)
    s.send("q1")
    assert "recall_transcript" not in [t.name for t in fake.requests[0].tools]
    s.send("q2")
    assert "recall_transcript" in [t.name for t in fake.requests[-1].tools]


def test_status_says_what_the_server_compaction_does() -> None:
    s, _ = chat(compacting(window=8_192))
    assert str(s.status()).splitlines()[-1] == \
        "server compaction: on, past 6,100 input tokens (no summary of the package's)"
    s2, _ = chat(compacting(), Settings(server_compaction="off"))
    assert s2.status().server_compaction is None
    assert "server compaction" not in str(s2.status())
    s3, _ = chat(FakeProvider((), wire="openai"), Settings(server_compaction="on"))
    assert "cannot carry it" in str(s3.status())
