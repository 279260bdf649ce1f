"""RequestSizer: which window is enforced, and what a guessed window may and may not do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from ipy_ctxrecovery import ChatError, ChatSession, Settings
from ipy_ctxrecovery.core.events import Event, WindowLearned
from ipy_ctxrecovery.core.history import Message, Role, latest_user_index
from ipy_ctxrecovery.core.prompts import SUMMARIZE_SYSTEM_PROMPT
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.session.endpoint import Endpoint
from ipy_ctxrecovery.session.learned import LearnedLimits
from ipy_ctxrecovery.session.sizing import RequestSizer, RequestSpec

UNKNOWN = "openai:in-house-model-7b"     # not in the catalogue: its window is a guess


def _summaries(emu: Any) -> int:
    return sum(1 for r in emu.requests if r.body and any(
        m.get("content") == SUMMARIZE_SYSTEM_PROMPT for m in r.body.get("messages", ())))


def _client(emu: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.openai_base_url, api_key=emu.token)


def test_a_guessed_window_never_summarizes_a_conversation_the_server_can_hold(
        emulator: Callable[..., Any]) -> None:
    emu = emulator(context_window=128_000)
    with ChatSession(UNKNOWN, client=_client(emu), settings=Settings()) as s:
        assert s.info.guessed and s.status().window_guessed
        for turn in range(40):
            s.send(f"turn {turn}: " + "notes about the data set " * 40)
        assert _summaries(emu) == 0                  # the 8,192-token guess cost nothing
        assert all(r.status == 200 for r in emu.requests)
        assert len(s.history) == 80                  # nothing dropped either
        # Replies reported more tokens than the guess: the window holds at least that.
        assert s.window > 8_192 and s.window == s.limits.seen_tokens


def test_a_real_overflow_still_teaches_the_window_of_an_unknown_model(
        emulator: Callable[..., Any]) -> None:
    emu = emulator(context_window=6_000)
    events: list[Event] = []
    with ChatSession(UNKNOWN, client=_client(emu), settings=Settings(),
                     on_event=events.append) as s:
        for turn in range(30):
            s.send(f"turn {turn}: " + "notes about the data set " * 40)
        learned = [e for e in events if isinstance(e, WindowLearned)]
        assert len(learned) == 1 and learned[0].window == 6_000
        assert not s.status().window_guessed and s.window == 6_000
        rejected = [r for r in emu.requests if r.status != 200]
        assert len(rejected) == 1                    # one overflow, then pre-flight keeps it


def test_a_configured_window_is_enforced_even_for_an_unknown_model(
        emulator: Callable[..., Any]) -> None:
    emu = emulator(context_window=128_000)
    with ChatSession(UNKNOWN, client=_client(emu), settings=Settings(context_window=4_000)) as s:
        assert not s.status().window_guessed
        for turn in range(12):
            s.send(f"turn {turn}: " + "notes about the data set " * 40)
        assert _summaries(emu) >= 1                  # the user's number is a fact: it is kept
        assert s.status().est_tokens < 4_000


def test_a_learned_window_below_the_default_reservation_lowers_it_not_the_message(
        emulator: Callable[..., Any]) -> None:
    # Anthropic wire (a max_tokens is always sent): the session believes a 16k window, so
    # its default reservation is 4,096 tokens; the server's window is 4,000.
    emu = emulator(context_window=4_000)
    events: list[Event] = []
    with ChatSession("emulator:anthropic", emulator=emu, on_event=events.append,
                     settings=Settings(context_window=16_000)) as s:
        for turn in range(6):
            reply = s.send(f"note {turn}: " + "measurements of the sample " * 55)  # ≈1.5 KB
            assert reply.text
        assert any(isinstance(e, WindowLearned) and e.window == 4_000 for e in events)
        chats = [r for r in emu.requests if not r.path.endswith("/count_tokens")]
        sent = [r.body["max_tokens"] for r in chats if r.status == 200]
        assert max(sent[-3:]) <= 2_000           # at most half the learned window by default
        assert all(m >= s.settings.min_answer_tokens for m in sent)
        assert len(s.history) >= 4               # earlier turns kept, not only the latest
        rejected = [r for r in emu.requests if r.status != 200]
        assert len(rejected) == 1                # the overflow that taught the window


def test_too_big_is_said_only_when_the_message_alone_cannot_fit_in_tokens(
        emulator: Callable[..., Any]) -> None:
    emu = emulator(context_window=2_000)
    with ChatSession("emulator", emulator=emu) as s:
        s.send("a short question")
        before = s.history
        try:
            s.send("word " * 3_000)              # ≈3,000+ tokens into a 2,000-token window
        except ChatError as e:
            text = str(e)
        else:
            raise AssertionError("the message cannot fit")
        assert "tokens" in text and "2,000 tokens" in text and "KB" not in text
        assert s.history == before               # nothing compacted, nothing lost
        assert len(emu.requests) == 1            # and nothing sent for it


def test_a_server_that_advertises_the_window_is_asked_once_and_believed(
        emulator: Callable[..., Any]) -> None:
    # vLLM-style: /v1/models lists the model with its max_model_len.
    emu = emulator(context_window=6_000, served_models=("in-house-model-7b",))
    with ChatSession(UNKNOWN, client=_client(emu), settings=Settings()) as s:
        assert s.status().window_guessed
        for turn in range(12):
            s.send(f"turn {turn}: " + "notes about the data set " * 80)
        asked = [r for r in emu.requests if r.method == "GET" and r.path.endswith("/models")]
        assert len(asked) == 1                                   # once per session
        assert s.window == 6_000 and not s.status().window_guessed
        assert all(r.status == 200 for r in emu.requests)        # no overflow was needed
        assert _summaries(emu) >= 1                              # the real window is enforced


def test_a_server_that_does_not_say_costs_one_quiet_request(
        emulator: Callable[..., Any]) -> None:
    emu = emulator(context_window=128_000)                       # lists only "emulator"
    with ChatSession(UNKNOWN, client=_client(emu), settings=Settings()) as s:
        for turn in range(3):
            s.send(f"turn {turn}")
        asked = [r for r in emu.requests if r.method == "GET"]
        assert len(asked) == 1 and s.status().window_guessed
    emu2 = emulator(context_window=6_000, served_models=("in-house-model-7b",))
    with ChatSession(UNKNOWN, client=_client(emu2),
                     settings=Settings(ask_server_window=False)) as s:
        s.send("hello")
        assert not [r for r in emu2.requests if r.method == "GET"]
        assert s.status().window_guessed


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_the_request_alone_is_the_system_messages_and_the_latest_request(wire: str) -> None:
    # request_alone scans only past the history it was last asked about and reuses its
    # last size: over extending histories, a compacted one and a system message after the
    # latest request, it must equal measuring the filtered history from scratch.
    if wire == "openai":
        client: Any = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test-0000")
    else:
        client = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="sk-test-0000")
    provider = make_provider(f"{wire}:emulator", client=client)
    settings = Settings(context_window=100_000)
    sizer = RequestSizer(Endpoint(provider, owned=False, client=client),
                         LearnedLimits.fresh(settings), settings, tuple)
    spec = RequestSpec()

    def from_scratch(history: tuple[Message, ...]) -> int:
        latest = latest_user_index(history)
        kept = tuple(m for i, m in enumerate(history) if m.role is Role.SYSTEM or i == latest)
        return sizer.measure(kept, spec)

    history: tuple[Message, ...] = (Message.system("Be brief."),)
    for i in range(12):
        history += (Message.user(f"question {i} " * (i + 1)), Message.assistant(f"answer {i}"))
        if i % 4 == 1:
            history += (Message.system(f"notice {i}"),)
        probe = history + (Message.user(f"latest {i} " * i),)
        assert sizer.request_alone(probe, spec)[0] == from_scratch(probe)
        assert sizer.request_alone(probe, spec)[0] == from_scratch(probe)   # asked twice
    for other in (history[:3],                                            # compacted
                  (Message.system("other"), Message.user("x"), Message.system("after")),
                  (Message.user("no system prompt"),), (Message.system("only"),)):
        assert sizer.request_alone(other, spec)[0] == from_scratch(other)
    client.close()
