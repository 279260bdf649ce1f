"""RequestSizer: which window is enforced, and what a guessed window may and may not do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.events import Event, WindowLearned
from ipy_ctxrecovery.prompts import SUMMARIZE_SYSTEM_PROMPT

UNKNOWN = "openai:in-house-model-7b"     # not in the catalogue: its window is a guess


def _summaries(emu: Any) -> int:
    return sum(1 for r in emu.requests if r.body and any(
        m.get("content") == SUMMARIZE_SYSTEM_PROMPT for m in r.body.get("messages", ())))


def _client(emu: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.openai_base_url, api_key="sk-test-sizing-0123456789")


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
