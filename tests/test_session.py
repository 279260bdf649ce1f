"""ChatSession with a scripted fake provider: the turn loop, retries, tools, events, files."""

from __future__ import annotations

import json
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeProvider, cut_reply, failure, killed, tool_call_reply

from ipy_ctxrecovery import ChatSession, Reply, Settings
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT
from ipy_ctxrecovery.core.events import (
    Escalation,
    Event,
    Failed,
    Retrying,
    ToolRun,
    Truncated,
    TurnFinished,
)
from ipy_ctxrecovery.core.history import Role, problems
from ipy_ctxrecovery.core.wording import describe, describe_debug
from ipy_ctxrecovery.errors import ChatError, ConfigError, CtxRecoveryError
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.providers.base import StopReason, Usage
from ipy_ctxrecovery.session.store import Transcript

SETTINGS = Settings()


def session(*script: Any, **kwargs: Any) -> tuple[ChatSession, FakeProvider, list[float]]:
    provider = kwargs.pop("provider", None) or FakeProvider(script)
    sleeps: list[float] = []
    kwargs.setdefault("settings", SETTINGS)
    s = ChatSession(provider=provider, sleep=sleeps.append, **kwargs)
    return s, provider, sleeps


def roles(history: Any) -> list[str]:
    return [m.role.value for m in history]


def test_a_turn_updates_history_transcript_and_files() -> None:
    s, fake, _ = session("Hi there.", name="basic", system="Be brief.")
    reply = s.send("Hello")
    assert isinstance(reply, Reply)
    assert reply.text == str(reply) == "Hi there."
    assert reply.finish_reason == StopReason.END.value == "end"
    assert reply.model == "fake"
    assert reply.usage.prompt_tokens and reply.usage.completion_tokens is not None
    assert roles(s.history) == ["system", "user", "assistant"]
    assert [m.text for m in s.transcript] == ["Be brief.", "Hello", "Hi there."]
    # What the provider got: the system prompt, the user message, and the built-in tool.
    sent = fake.requests[0]
    assert roles(sent.messages) == ["system", "user"]
    assert [t.name for t in sent.tools] == ["read_file"]
    lines = (s.directory / "transcript.jsonl").read_text().splitlines()
    assert [json.loads(line)["message"]["role"] for line in lines] == ["system", "user", "assistant"]
    assert len(Transcript(s.name).load_history() or ()) == 3
    assert stat.S_IMODE(s.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((s.directory / "history.json").stat().st_mode) == 0o600


def test_streaming_text_goes_to_on_text_only_when_streaming() -> None:
    s, fake, _ = session("streamed", "not streamed")
    chunks: list[str] = []
    s.send("one", on_text=chunks.append)
    s.send("two", on_text=chunks.append, stream=False)
    assert chunks == ["streamed"]
    assert [r.stream for r in fake.requests] == [True, False]


def test_options_and_max_tokens_reach_the_request() -> None:
    s, fake, _ = session("a", "b", max_tokens=100)
    s.send("x", options={"temperature": 0.2})
    s.send("y", max_tokens=7)
    assert fake.requests[0].max_tokens == 100
    assert fake.requests[0].options == {"temperature": 0.2}
    assert fake.requests[1].max_tokens == 7


def test_unrecoverable_failure_raises_one_sentence_and_keeps_history() -> None:
    key = "sk-proj-abcdefghijklmnop1234567890"
    s, _, _ = session("first answer", failure(FailureKind.OTHER, f"bad request with key {key}"),
                      name="fails")
    events: list[Event] = []
    s.subscribe(events.append)
    s.send("first")
    before = s.history
    with pytest.raises(ChatError) as info:
        s.send("second")
    assert key not in str(info.value) and "REDACTED" in str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.failure.kind is FailureKind.OTHER
    assert s.history == before
    assert [m.text for m in s.transcript][-1] == "second"
    on_disk = (s.directory / "transcript.jsonl").read_text()
    assert "second" in on_disk and key not in on_disk
    assert any(isinstance(e, Failed) for e in events)


def test_auth_failure_refreshes_once_then_gives_up() -> None:
    s, fake, _ = session(failure(FailureKind.AUTH, "bad key"), "ok after refresh")
    assert s.send("x").text == "ok after refresh"
    assert fake.refreshed == 1
    s2, fake2, _ = session(failure(FailureKind.AUTH, "bad key"), failure(FailureKind.AUTH, "bad key"))
    with pytest.raises(ChatError, match="bad key"):
        s2.send("x")
    assert fake2.refreshed == 1 and len(fake2.requests) == 2


def test_transient_failures_retry_with_backoff_through_injected_sleep() -> None:
    s, fake, sleeps = session(failure(FailureKind.TRANSIENT, "503"),
                              failure(FailureKind.TRANSIENT, "429", retry_after=7.0), "finally")
    events: list[Event] = []
    s.subscribe(events.append)
    assert s.send("x").text == "finally"
    assert sleeps == [1.0, 7.0]
    assert [e.attempt for e in events if isinstance(e, Retrying)] == [1, 2]
    retries = SETTINGS.transient_retries
    s2, fake2, sleeps2 = session(*[failure(FailureKind.TRANSIENT, "503")] * (retries + 1))
    with pytest.raises(ChatError):
        s2.send("x")
    assert len(fake2.requests) == retries + 1 and len(sleeps2) == retries


def test_output_limit_clamps_max_tokens_and_resends() -> None:
    fake = FakeProvider([failure(FailureKind.OUTPUT_LIMIT, "max_tokens too large",
                                 limit_tokens=4096), "fits now"], window=1_000_000)
    s, _, _ = session(provider=fake, max_tokens=100_000)
    assert s.send("x").text == "fits now"
    assert [r.max_tokens for r in fake.requests] == [100_000, 4096]


def test_max_tokens_cut_is_escalated_and_stitched_into_one_message() -> None:
    # The partial answer goes back up to its last word, which the model writes again.
    s, fake, _ = session(cut_reply("The answer is forty"), cut_reply("forty-two, and"),
                         "and that is all.", max_tokens=50, name="cut")
    events: list[Event] = []
    s.subscribe(events.append)
    reply = s.send("question")
    assert reply.text == "The answer is forty-two, and that is all."
    assert reply.finish_reason == "end"
    assert [r.max_tokens for r in fake.requests] == [50, 100, 200]
    second = fake.requests[1].messages
    assert second[-1].text == CONTINUATION_PROMPT
    assert second[-2].role is Role.ASSISTANT and second[-2].text == "The answer is "
    third = fake.requests[2].messages
    assert [m.text for m in third[-3:]] == ["question", "The answer is forty-two, ",
                                           CONTINUATION_PROMPT]
    # One stitched assistant message; no partials or continuation prompts kept.
    assert [m.text for m in s.history] == ["question", reply.text]
    assert [m.text for m in s.transcript] == ["question", reply.text]
    assert [e.max_tokens for e in events if isinstance(e, Escalation)] == [100, 200]
    assert any("escalation" in a for a in reply.actions)


def test_escalation_stops_after_the_configured_number() -> None:
    s, fake, _ = session(cut_reply("a b "), cut_reply("b c "), cut_reply("c d "), "never",
                         max_tokens=10)
    reply = s.send("q")
    assert reply.text == "a b c d "
    assert reply.finish_reason == "length"
    assert len(fake.requests) == SETTINGS.max_token_escalations + 1


def test_an_answer_still_cut_after_the_escalations_says_so() -> None:
    events: list[Event] = []
    s, _, _ = session(cut_reply("a "), cut_reply("b "), cut_reply("c "), max_tokens=10,
                      on_event=events.append)
    reply = s.send("q")
    truncated = [e for e in events if isinstance(e, Truncated)]
    n = SETTINGS.max_token_escalations
    assert len(truncated) == 1 and truncated[0].escalations == n
    last = [e.max_tokens for e in events if isinstance(e, Escalation)][-1]
    assert truncated[0].max_tokens == last
    assert describe(truncated[0]) == (
        f"⚠ answer still cut at max_tokens={last:,} after {n} escalations — raise "
        "--max-tokens or CHATCLI_MAX_TOKEN_ESCALATIONS, or ask for a shorter answer")
    assert describe(truncated[0]) in reply.actions
    # An answer that ends by itself says nothing of the kind.
    events.clear()
    s2, _, _ = session(cut_reply("a "), "done", max_tokens=10, on_event=events.append)
    s2.send("q")
    assert not any(isinstance(e, Truncated) for e in events)


def test_tools_run_with_validated_arguments_and_errors_become_results() -> None:
    calls: list[tuple[str, int]] = []

    def lookup(key: str, times: int = 1) -> str:
        """Look a key up.

        Args:
            key: the key.
            times: repeat count.
        """
        calls.append((key, times))
        if key == "boom":
            raise RuntimeError("exploded")
        return key * times

    s, fake, _ = session(
        tool_call_reply("lookup", {"key": "ab", "times": 2}, "c1"),
        tool_call_reply("lookup", {"key": 5}, "c2"),
        tool_call_reply("lookup", {"key": "boom"}, "c3"),
        tool_call_reply("nonexistent", {}, "c4"),
        "all done", tools=[lookup], name="tools")
    events: list[Event] = []
    s.subscribe(events.append)
    reply = s.send("use the tool")
    assert reply.text == "all done"
    assert calls == [("ab", 2), ("boom", 1)]
    results = [m.tool_result for m in s.history if m.role is Role.TOOL]
    assert [(r.content, r.is_error) for r in results if r] == [
        ("abab", False),
        ("Error: argument 'key' must be a string, not a number (tool lookup).", True),
        ("Error: lookup raised RuntimeError: exploded", True),
        ("Error: there is no tool named 'nonexistent' (tools: lookup, read_file).", True),
    ]
    assert problems(s.history) == []
    for request in fake.requests:
        assert problems(request.messages) == []
    assert {t.name for t in fake.requests[0].tools} == {"lookup", "read_file"}
    assert [e.ok for e in events if isinstance(e, ToolRun)] == [True, False, False, False]
    # The transcript holds the calls and the full results too.
    assert sum(1 for m in s.transcript if m.role is Role.TOOL) == 4


def test_tool_rounds_are_bounded() -> None:
    settings = SETTINGS.replace(max_tool_rounds=2)

    def ping() -> str:
        """Ping."""
        return "pong"

    script = [tool_call_reply("ping", {}, f"c{i}") for i in range(10)]
    s, fake, _ = session(*script, tools=[ping], settings=settings)
    reply = s.send("loop forever")
    assert reply.finish_reason == "tool_calls"
    # Two rounds run, a third answered "limit reached", one last chance, then stop.
    assert len(fake.requests) == 4
    contents = [m.text for m in s.history if m.role is Role.TOOL]
    assert contents[:2] == ["pong", "pong"]
    assert all("limit of 2 tool rounds" in c for c in contents[2:])
    assert problems(s.history) == []


def test_read_file_tool_reads_under_the_chosen_root(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("alpha\nbeta\n")
    s, _, _ = session(tool_call_reply("read_file", {"path": "data.txt", "offset": 1}),
                      "read it", files_root=tmp_path)
    s.send("read data.txt")
    result = next(m for m in s.history if m.role is Role.TOOL)
    assert result.text.endswith("beta\n") and "alpha" not in result.text
    s2, fake2, _ = session("x", builtin_tools=False)
    s2.send("hi")
    assert fake2.requests[0].tools == ()


def test_subscriber_errors_warn_but_do_not_kill_the_turn() -> None:
    s, _, _ = session("fine", "fine again")
    seen: list[Event] = []

    def broken(event: Event) -> None:
        raise ValueError("display bug")

    s.subscribe(broken)
    unsubscribe = s.subscribe(seen.append)
    with pytest.warns(RuntimeWarning, match="display bug"):
        assert s.send("x").text == "fine"
    assert any(isinstance(e, TurnFinished) for e in seen)
    unsubscribe()
    count = len(seen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.send("y")
    assert len(seen) == count


def test_record_false_keeps_nothing() -> None:
    s, fake, _ = session("kept", "not kept")
    s.send("one")
    history, transcript = s.history, s.transcript
    assert s.send("two", record=False).text == "not kept"
    assert s.history == history and s.transcript == transcript
    assert fake.requests[1].messages[-1].text == "two"


def test_resume_restores_history_and_transcript() -> None:
    s, _, _ = session("first", "second", name="resumable", system="sys")
    s.send("a")
    s.send("b")
    s.close()
    again = ChatSession.resume("resumable", provider=FakeProvider(["third"]), settings=SETTINGS)
    assert again.history == s.history
    assert again.transcript == s.transcript
    assert again.system == "sys"
    again.send("c")
    assert [m.text for m in again.transcript] == ["sys", "a", "first", "b", "second", "c", "third"]
    with pytest.raises(CtxRecoveryError, match="no saved session"):
        ChatSession.resume("never-existed", provider=FakeProvider())


def test_reset_keeps_the_system_prompt_and_the_transcript() -> None:
    s, _, _ = session("a", "b", system="sys", name="resetme")
    s.send("x")
    s.reset()
    assert [m.text for m in s.history] == ["sys"]
    assert len(s.transcript) == 3
    records = [json.loads(line) for line in
               (s.directory / "transcript.jsonl").read_text().splitlines()]
    assert records[-1]["type"] == "reset"


def test_status_reports_sizes_and_counts() -> None:
    s, _, _ = session("answer", settings=SETTINGS.replace(max_payload=1024 * 1024))
    s.send("question")
    st = s.status()
    assert st.messages == 2 and st.transcript_messages == 2
    assert st.window == 8192 and not st.window_guessed
    assert st.cap == 1024 * 1024 and st.cap_source == "configured"
    assert st.history_bytes > 0 and st.est_tokens > 0
    text = str(st)
    assert "8,192-token window" in text and "1 MB (configured)" in text and "2 messages" in text


def test_max_tokens_that_cannot_fit_the_window_is_lowered_before_sending() -> None:
    s, fake, _ = session("ok", "ok", max_tokens=8150)
    events: list[Event] = []
    s.subscribe(events.append)
    s.send("x")
    sent = fake.requests[0].max_tokens
    assert sent is not None and 7000 < sent < 8192 - 144
    assert any("sending max_tokens" in describe(e) for e in events)
    s.send("y", max_tokens=100)
    assert fake.requests[1].max_tokens == 100


def test_two_sessions_never_share_learned_state() -> None:
    a, _, _ = session("ok")
    b, _, _ = session("ok")
    a.caps.record_rejection(100_000)
    a.estimator.calibrate(1000, 100)
    assert b.caps.effective() is None
    assert b.estimator.samples == 0
    assert a.caps is not b.caps and a.estimator is not b.estimator
    assert a.name != b.name


def test_payload_failure_state_stays_in_its_session() -> None:
    a, fake_a, _ = session(
        "first", failure(FailureKind.PAYLOAD_TOO_LARGE, "413 Request Entity Too Large",
                         status=413), "recovered")
    b, fake_b, _ = session("first", "plain")
    for s in (a, b):
        s.send("z" * 3000)
        s.send("y" * 500)
    assert a.caps.effective() is not None and a.status().cap_source == "learned"
    assert b.caps.effective() is None and b.status().cap is None
    notice = "[SYSTEM NOTICE — PAYLOAD LIMIT HIT]"
    assert any(notice in m.text for m in fake_a.requests[-1].messages)
    assert not any(notice in m.text for r in fake_b.requests for m in r.messages)
    assert a.status().recoveries == 1 and b.status().recoveries == 0
    cap = a.caps.effective()
    a.reset()
    assert a.caps.effective() == cap  # the network did not change
    assert not any(notice in m.text for m in a.history)


def test_interrupting_compaction_leaves_history_exactly_as_it_was() -> None:
    def interrupt_summaries(request: Any) -> Any:
        if any("STRUCTURED SUMMARY" in m.text for m in request.messages
               if m.role is Role.SYSTEM):
            raise KeyboardInterrupt
        return "fine"

    fake = FakeProvider([interrupt_summaries] * 50, window=2048)
    s, _, _ = session(provider=fake, name="cancel")
    phases: list[str] = []
    s.subscribe(lambda e: phases.append(getattr(e, "phase", "")))
    committed = s.history
    with pytest.raises(KeyboardInterrupt):
        for i in range(40):
            committed = s.history
            s.send(f"message {i} " + "word " * 150)
    assert "cancelled" in phases
    assert s.history == committed  # the turn's history was never swapped in
    assert s.history[-1].role is Role.ASSISTANT
    assert Transcript(s.name).load_history() == committed
    interrupted = s.transcript[-1]
    assert interrupted.role is Role.USER  # the interrupted request is on record
    assert interrupted not in s.history


def test_opening_an_existing_name_keeps_the_snapshot_until_a_turn() -> None:
    s, _, _ = session("one", name="kept")
    s.send("first")
    s.close()                               # one writer: a second open waits for the close
    killed(ChatSession(provider=FakeProvider(), name="kept", settings=SETTINGS))
    again = ChatSession.resume("kept", provider=FakeProvider(), settings=SETTINGS)
    assert [m.text for m in again.history] == ["first", "one"]


def test_a_previewed_result_can_be_read_back_with_read_file() -> None:
    def dump() -> str:
        """Dump a big log."""
        return "".join(f"row {k}\n" for k in range(20_000))

    fake = FakeProvider([tool_call_reply("dump", {}, "c1"), "dumped"], window=1_000_000)
    s, _, _ = session(provider=fake, tools=[dump], name="readback")
    s.send("dump it")
    sent_result = next(m for m in fake.requests[-1].messages if m.role is Role.TOOL)
    assert len(sent_result.text) < 20_000 <= len(dump())  # previewed on the wire
    persisted = list((s.directory / "results").iterdir())
    assert len(persisted) == 1 and persisted[0].read_text() == dump()
    assert str(persisted[0]) in sent_result.text  # the preview names the file
    fake.script.extend([tool_call_reply("read_file", {"path": str(persisted[0]),
                                                      "offset": 15_000, "limit": 2}, "c2"),
                        "read"])
    s.send("read rows 15000-15001")
    back = [m for m in s.history if m.role is Role.TOOL][-1]
    assert not back.tool_result.is_error  # type: ignore[union-attr]
    assert back.text.endswith("row 15000\nrow 15001\n")
    assert dump() in [m.text for m in s.transcript]  # the transcript has it whole


def test_bad_arguments_fail_before_anything_starts() -> None:
    import threading

    def running() -> int:
        return sum(t.name.startswith("ipy_ctxrecovery-emulator") for t in threading.enumerate())

    before = running()
    with pytest.raises(ConfigError, match="session name"):
        ChatSession("emulator", name="../escape")

    def untyped(x: bytes) -> None:
        """Takes bytes."""

    with pytest.raises(TypeError, match="parameter 'x'"):
        ChatSession("emulator", tools=[untyped])
    assert running() == before


class WindowFake(FakeProvider):
    """A provider that enforces a token window with its own (denser) token rule and, like
    Anthropic's adapter, puts a default ``max_tokens`` in every body that sets none."""

    DEFAULT_MAX_TOKENS = 2048
    default_max_tokens = DEFAULT_MAX_TOKENS     # told as data, as the adapters tell it

    def encode(self, request: Any) -> bytes:
        payload = json.loads(super().encode(request))
        payload["max_tokens"] = request.max_tokens or self.DEFAULT_MAX_TOKENS
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")

    def send(self, request: Any, on_text: Any = None) -> Any:
        body = self.encode(request)
        prompt = len(body) * 2 // 3          # 1.5 bytes per token: pre-flight guesses 4
        sent = json.loads(body)["max_tokens"]
        window = self.info.context_window
        if prompt > window:
            self.requests.append(request)
            raise failure(FailureKind.CONTEXT_OVERFLOW,
                          f"prompt is too long: {prompt} tokens > {window} maximum",
                          prompt_tokens=prompt, limit_tokens=window)
        if prompt + sent > window:
            self.requests.append(request)
            raise failure(FailureKind.CONTEXT_OVERFLOW,
                          f"input length and max_tokens exceed context limit: {prompt} + "
                          f"{sent} > {window}", prompt_tokens=prompt, output_tokens=sent,
                          limit_tokens=window)
        reply = super().send(request, on_text)
        return type(reply)(reply.message, reply.stop, Usage(0, 1), len(body))


def test_exact_fit_leaves_room_for_the_max_tokens_the_provider_adds() -> None:
    fake = WindowFake(window=4096)
    s, _, _ = session(provider=fake)
    events: list[Event] = []
    s.subscribe(events.append)
    s.send("note 0: " + "x" * 2200)
    s.send("note 1: " + "x" * 2200)
    sent = len(fake.requests)
    s.send("note 2: " + "x" * 2200)     # over the window: the provider says by how much
    # One rejection for the window, then the resend fits prompt + the default max_tokens.
    assert len(fake.requests) - sent == 2
    assert fake.requests[-1].max_tokens is None
    assert any("room kept for max_tokens 2,048" in describe_debug(e) for e in events)


def test_a_turn_after_an_exact_fit_does_not_compact_again() -> None:
    limit = 12_000

    def proxy(request: Any) -> Any:
        if len(FakeProvider().encode(request)) > limit:
            return failure(FailureKind.PAYLOAD_TOO_LARGE, "413 Request Entity Too Large",
                           status=413)
        return None

    class Proxy(FakeProvider):
        def send(self, request: Any, on_text: Any = None) -> Any:
            rejection = proxy(request)
            if rejection is not None:
                self.requests.append(request)
                raise rejection
            return super().send(request, on_text)

    fake = Proxy()
    # (no summary prepared ahead either: tests/test_background.py)
    s, _, _ = session(provider=fake, settings=SETTINGS.replace(background_compaction=False))
    for i in range(4):
        s.send(f"note {i}: " + "x" * 3000)
    assert s.status().recoveries == 1
    sent = len(fake.requests)
    s.send("a short question")
    summaries = [r for r in fake.requests[sent:]
                 if any("STRUCTURED SUMMARY" in m.text for m in r.messages
                        if m.role is Role.SYSTEM)]
    assert summaries == [] and s.status().compactions == 0


# -- update(): changing a live session ------------------------------------------------------------

def _rejected_once() -> tuple[ChatSession, FakeProvider]:
    """A session that learned a payload cap from one 413 and has usage counted."""
    s, fake, _ = session(
        "first", failure(FailureKind.PAYLOAD_TOO_LARGE, "413 Request Entity Too Large",
                         status=413), "recovered", name="learner")
    s.send("z" * 9000)
    s.send("y" * 500)
    assert s.status().cap_source == "learned"
    return s, fake


def test_update_settings_keeps_learned_caps_counters_and_history() -> None:
    s, fake = _rejected_once()
    before = s.status()
    learned, rejected, history = s.caps.learned, s.caps.smallest_rejected, s.history
    assert learned is not None
    notes = s.update(settings=SETTINGS.replace(max_payload=5 * 1024 * 1024))
    assert notes == ()
    after = s.status()
    assert s.settings.max_payload == s.caps.configured == 5 * 1024 * 1024
    # The learned cap is below the configured one, so it still wins.
    assert s.caps.smallest_rejected == rejected
    assert after.cap == learned and after.cap_source == "learned"
    assert s.history == history and s.provider is fake
    for field in ("prompt_tokens", "completion_tokens", "compactions", "recoveries"):
        assert getattr(after, field) == getattr(before, field)
    assert after.recoveries == 1
    # A configured cap below the learned one takes over.
    s.update(settings=SETTINGS.replace(max_payload=4096))
    assert s.status().cap == 4096 and s.status().cap_source == "configured"


def test_a_cap_set_mid_session_applies_at_the_next_preflight() -> None:
    s, fake, _ = session("a", "b", "c")
    s.send("q" * 6000)
    assert len(fake.bodies[-1]) > 6000
    s.update(settings=SETTINGS.replace(max_payload=4096))
    s.send("next")
    assert fake.bodies, "nothing sent"
    assert len(fake.bodies[-1]) <= 4096
    assert s.status().cap == 4096


def test_calibration_stays_unless_the_model_changes() -> None:
    s, _, _ = session("ok", "ok")
    s.send("hello there")
    calibrated = s.estimator.bytes_per_token
    assert s.estimator.samples == 1
    s.update(settings=SETTINGS.replace(chars_per_token=2.0))
    assert s.estimator.bytes_per_token == calibrated  # measured beats the heuristic
    fresh, _, _ = session()
    fresh.update(settings=SETTINGS.replace(chars_per_token=2.0))
    assert fresh.estimator.bytes_per_token == 2.0  # nothing measured yet


def test_tools_update_is_offered_on_the_next_request() -> None:
    s, fake, _ = session("one", "two", "three")
    s.send("before")
    assert [t.name for t in fake.requests[-1].tools] == ["read_file"]

    def word_count(text: str) -> int:
        """Count words."""
        return len(text.split())

    s.update(tools=[word_count])
    s.send("after")
    assert [t.name for t in fake.requests[-1].tools] == ["read_file", "word_count"]
    s.update(tools=())
    s.send("none")
    assert [t.name for t in fake.requests[-1].tools] == ["read_file"]


def test_max_tokens_keep_versus_none() -> None:
    s, fake, _ = session("a", "b", "c", max_tokens=50)
    s.update(settings=SETTINGS)
    s.send("x")
    assert fake.requests[-1].max_tokens == 50
    s.update(max_tokens=None)
    s.send("y")
    assert fake.requests[-1].max_tokens is None


def test_a_new_provider_resets_what_belongs_to_the_old_path_and_model() -> None:
    s, _ = _rejected_once()
    s.estimator.calibrate(1000, 100)
    counters = (s.status().prompt_tokens, s.status().recoveries)
    other = FakeProvider(["hello"], model="other-model")
    notes = s.update(provider=other)
    assert s.provider is other and s.model == "other-model"
    assert s.estimator.samples == 0  # another tokenizer
    assert s.caps.learned is None and s.caps.smallest_rejected is None
    assert len(notes) == 1 and "learned payload cap" in notes[0] and "forgotten" in notes[0]
    status = s.status()
    assert status.cap is None and status.cap_note is not None
    assert "forgotten" in str(status)
    s.update(settings=SETTINGS.replace(max_payload=1024 * 1024))
    assert s.status().cap_note is None and "forgotten" not in str(s.status())
    assert (status.prompt_tokens, status.recoveries) == counters
    s.send("on the new provider")
    assert other.requests and s.status().recoveries == counters[1]
    # Another path change with nothing learned on the path left: the old note does not
    # stay (QA: it outlived later emulator restarts).
    s.update(settings=SETTINGS)
    s.limits.cap_note = "learned payload cap 20 KB forgotten: the old path may have other limits"
    s.update(provider=FakeProvider(["hi"], model="third-model"))
    assert s.status().cap_note is None


def test_update_checks_everything_before_changing_anything() -> None:
    s, fake, _ = session("ok")
    with pytest.raises(CtxRecoveryError, match="either provider= or model="):
        s.update(provider=FakeProvider(), model="emulator")
    with pytest.raises(ConfigError):
        s.update(settings=SETTINGS.replace(max_payload=123_000), model="azure:gpt-4o")
    assert s.settings is SETTINGS and s.caps.configured is None and s.provider is fake
    s.update(emulator=object())  # not on an emulator model: kept for later, nothing rebuilt
    assert s.provider is fake


def test_update_to_a_new_emulator_forgets_the_learned_cap_and_is_saved(emulator: Any) -> None:
    first = emulator(max_body="16KB")
    s = ChatSession("emulator", emulator=first, settings=SETTINGS, name="moving")
    for i in range(5):  # the history outgrows 16 KB: rejected once, learned, recovered
        s.send(f"{i} " + "a" * 5000)
    assert s.status().cap_source == "learned"
    tokens = s.status().prompt_tokens
    second = emulator()
    notes = s.update(emulator=second)
    assert len(notes) == 1 and "the new emulator" in notes[0]
    assert s.status().cap is None and s.status().prompt_tokens == tokens
    assert s.estimator.samples >= 1  # same model string, same tokenizer
    s.send("hello")
    assert second.requests and s.model == "emulator"
    notes = s.update(model="emulator:anthropic", emulator=second)
    assert s.model == "emulator:anthropic"
    assert notes == ()  # nothing learned to forget; the calibration resets silently
    assert s.estimator.samples == 0
    s.send("in the other wire format")
    assert second.requests[-1].path.endswith("/v1/messages")
    s.close()
    assert ChatSession.resume("moving", emulator=second, settings=SETTINGS).model == \
        "emulator:anthropic"


class _ProxiedFake(FakeProvider):
    """A fake provider that shows a base URL, as SDK-backed providers do."""

    def __init__(self, *args: Any, url: str = "https://user:pw@proxy.example/v1?key=s3cret",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client = type("Client", (), {"base_url": url})()


def _learned_file(s: ChatSession) -> dict[str, Any]:
    path = s.directory / "learned.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_learned_state_is_restored_on_the_same_model_and_path_only() -> None:
    s, _, _ = session("a", "b", provider=_ProxiedFake(["a", "b"]), name="persisted",
                      settings=Settings(context_window=8000))
    s.send("hello")
    s.caps.record_rejection(30_000)
    s.limits.window, s.limits.output_limit, s.limits.warned_no_cap = 6000, 1000, True
    s.send("again")                                  # the turn after a change writes it
    data = _learned_file(s)
    text = (s.directory / "learned.json").read_text(encoding="utf-8")
    assert "s3cret" not in text and "pw" not in text and data["path"].startswith("https://proxy")
    assert data["caps"]["smallest_rejected"] == 30_000
    bpt = s.estimator.bytes_per_token
    s.close()

    cap = Settings(context_window=8000, max_payload=40_000)
    again = ChatSession.resume("persisted", provider=_ProxiedFake(), settings=cap)
    assert again.caps.smallest_rejected == 30_000 and again.caps.configured == 40_000
    assert again.status().cap_source == "learned" and again.window == 6000
    assert again.output_cap == 1000 and again.limits.warned_no_cap
    assert again.estimator.bytes_per_token == bpt and again.estimator.samples == 2
    again.close()

    # Another configured window: the learned one is not restored (the caps are).
    other = ChatSession.resume("persisted", provider=_ProxiedFake(),
                               settings=Settings(context_window=7000))
    assert other.window == 7000 and other.caps.smallest_rejected == 30_000
    killed(other)          # left as it is: close() would save its own learned state
    # Another base URL: neither caps nor window nor output limit; calibration stays.
    moved = ChatSession.resume("persisted", provider=_ProxiedFake(url="https://elsewhere/v1"),
                               settings=Settings(context_window=8000))
    assert moved.caps.effective() is None and moved.window == 8000
    assert moved.output_cap == 4096 and moved.estimator.bytes_per_token == bpt
    assert "not restored" in str(moved.status())
    killed(moved)
    # Another model on the same path: the caps stay, calibration and window do not.
    model = ChatSession.resume("persisted", provider=_ProxiedFake(model="other"),
                               settings=Settings(context_window=8000))
    assert model.caps.smallest_rejected == 30_000 and model.window == 8000
    assert model.estimator.samples == 0


def test_learned_state_is_written_only_when_it_changed() -> None:
    s, _, _ = session("a", provider=_ProxiedFake(["a"]), name="quiet-writes")
    s.send("hello")
    path = s.directory / "learned.json"
    inode = path.stat().st_ino
    s.update(max_tokens=50)                          # nothing learned changed: no rewrite
    s.close()
    assert path.stat().st_ino == inode
    s.caps.assumed = 1234
    s.close()
    assert path.stat().st_ino != inode and _learned_file(s)["caps"]["assumed"] == 1234


def test_a_provider_without_a_base_url_never_restores_caps() -> None:
    s, _, _ = session("a", name="no-url")
    s.send("hello")
    s.caps.record_rejection(30_000)
    s.close()
    again = ChatSession.resume("no-url", provider=FakeProvider(), settings=SETTINGS)
    assert again.caps.effective() is None and again.estimator.samples == 1


def _user_lines(path: Path) -> list[str]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["message"]["blocks"][0]["text"] for r in records
            if r.get("type") == "message" and r["message"]["role"] == "user"]


def test_a_session_shared_by_threads_runs_one_turn_at_a_time(emulator: Any) -> None:
    # Issue 26: 4 threads on one session wrote a user message 2-4 times to the transcript.
    import threading

    s = ChatSession("emulator", name="shared", emulator=emulator(), settings=SETTINGS)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def talk(t: int) -> None:
        start.wait()
        for i in range(12):
            try:
                s.send(f"thread {t} message {i}", stream=i % 2 == 0)
            except BaseException as e:      # noqa: BLE001 - collected, asserted below
                errors.append(e)

    threads = [threading.Thread(target=talk, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    said = sorted(f"thread {t} message {i}" for t in range(4) for i in range(12))
    assert sorted(_user_lines(s.directory / "transcript.jsonl")) == said
    assert sorted(m.text for m in s.transcript if m.role is Role.USER) == said
    turns = [m.role.value for m in s.history if m.role is not Role.SYSTEM]
    assert turns == ["user", "assistant"] * (len(turns) // 2) and len(turns) == 96
    assert s.status().turns == 48
    s.close()
    again = ChatSession.resume("shared", emulator=emulator(), settings=SETTINGS)
    assert [m.role.value for m in again.history] == [m.role.value for m in s.history]
    again.close()


def test_compact_reset_and_undo_from_another_thread_wait_for_the_turn_in_flight(
        emulator: Any) -> None:
    import threading

    s = ChatSession("emulator", name="shared-admin", emulator=emulator(), settings=SETTINGS)
    errors: list[BaseException] = []
    done = threading.Event()

    def talk(t: int) -> None:
        for i in range(10):
            try:
                s.send(f"thread {t} message {i} " + "words " * 40, stream=i % 2 == 1)
            except BaseException as e:      # noqa: BLE001 - collected, asserted below
                errors.append(e)

    def manage() -> None:
        while not done.is_set():
            for step in (s.compact, s.undo_compact, s.reset, s.forget_limits):
                try:
                    step()
                except CtxRecoveryError:    # nothing to compact or undo just now
                    pass
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

    talkers = [threading.Thread(target=talk, args=(t,)) for t in range(3)]
    admin = threading.Thread(target=manage)
    for thread in (*talkers, admin):
        thread.start()
    for thread in talkers:
        thread.join(180)
    done.set()
    admin.join(60)
    assert not errors
    said = sorted(f"thread {t} message {i} " + "words " * 40 for t in range(3) for i in range(10))
    assert sorted(_user_lines(s.directory / "transcript.jsonl")) == said
    assert problems(s.history) == []
    s.close()


def test_a_fit_after_a_compaction_that_was_not_applied_says_no_compaction() -> None:
    """QA (notebook 09): the summarizer failed, "history kept as it was", then the fit's
    line said "still 29.0 KB after compaction" — of a compaction that did not happen."""
    from ipy_ctxrecovery.core.events import CompactionPhase, FitBeforeSend
    from ipy_ctxrecovery.core.wording import describe
    from ipy_ctxrecovery.failures import FailureKind

    fake = FakeProvider(["a1", "a2", "a3", failure(FailureKind.TRANSIENT, "503"), "a4"],
                        window=128_000)
    events: list[Any] = []
    s = ChatSession(provider=fake, settings=Settings(max_payload=24 * 1024,
                                                     background_compaction=False),
                    on_event=events.append, sleep=lambda _s: None)
    for i in range(3):
        s.send(f"turn {i}: " + "words " * 700)
    s.send("runbook: " + "restart the pod and watch p99 " * 500)
    rejected = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "rejected"]
    fits = [describe(e) for e in events if isinstance(e, FitBeforeSend)]
    assert rejected and fits
    assert all("after compaction" not in line for line in fits), fits


def test_a_session_that_changes_model_prices_each_models_tokens_at_its_own_price() -> None:
    # The session's cost priced every token at the model in force: a cheap model's turns
    # were billed at the dear one's after a switch (%chat usage overstated them ×2 here).
    prices = "gpt-4o-mini=1/0/0/0,gpt-4.5-preview=100/0/0/0"
    s = ChatSession("fake", provider=FakeProvider(["one"], model="gpt-4o-mini"),
                    settings=Settings(prices=prices), name="two-models")
    s.send("a")
    cheap = s.status().prompt_tokens
    s.update(provider=FakeProvider(["two"], model="gpt-4.5-preview"))
    s.send("b")
    dear = s.status().prompt_tokens - cheap
    expected = (cheap * 1 + dear * 100) / 1e6
    assert s.status().cost == pytest.approx(expected)
    s.close()
    # Kept with the session: a resumed one prices them as before.
    again = ChatSession.resume("two-models", provider=FakeProvider(model="gpt-4.5-preview"),
                               settings=Settings(prices=prices))
    assert again.status().cost == pytest.approx(expected)
    again.close()


def test_a_session_that_cannot_build_its_provider_leaves_its_name_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No key set: the session failed, and the retry once the key was set was refused with
    # "session 'keyless' is open in this process already" until the kernel restarted.
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(CtxRecoveryError, match="No OpenAI key"):
        ChatSession("openai:gpt-4o-mini", name="keyless")
    again = ChatSession("fake", provider=FakeProvider(), name="keyless")
    again.close()
