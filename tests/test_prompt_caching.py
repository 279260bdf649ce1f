"""Prompt caching end to end: the Anthropic adapter's ``cache_control`` breakpoints (count,
order, placement, the minimum length, the ``prompt_caching`` setting) read from the bodies
the emulator received; the cache figures in ``Usage`` on both wires; and whole sessions
reading most of their input from the emulator's caches."""

from __future__ import annotations

from typing import Any

import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.providers.base import Caching, Request, ToolSpec

BIG_SYSTEM = "You answer questions about the project. " * 150      # ~1,500 tokens
BIG_TOOLS = tuple(ToolSpec(f"tool_{i}", "Looks things up in the project. " * 40,
                           {"type": "object", "properties": {"q": {"type": "string"}}})
                  for i in range(5))                              # ~1,700 tokens


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where the body's cache_control blocks are, in the API's order."""
    found = [f"tools.{i}" for i, t in enumerate(body.get("tools") or ()) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += [f"system.{i}" for i, b in enumerate(system) if "cache_control" in b]
    for m, message in enumerate(body["messages"]):
        content = message["content"]
        if isinstance(content, list):
            found += [f"messages.{m}.{i}" for i, b in enumerate(content) if "cache_control" in b]
    return found


def conversation(turns: int, words: int = 60) -> tuple[Message, ...]:
    history: tuple[Message, ...] = (Message.system(BIG_SYSTEM),)
    for i in range(turns):
        history += (Message.user(f"question {i}: " + "why " * words),)
        if i < turns - 1:
            history += (Message.assistant(f"answer {i}: " + "because " * words),)
    return history


@pytest.fixture
def emu() -> Any:
    with Emulator(context_window=200_000) as emulator:
        yield emulator


@pytest.fixture
def provider(emu: Any) -> Any:
    p = make_provider("emulator:anthropic", emulator=emu)
    yield p
    p.close()


def sent(provider: Any, emu: Any, request: Request) -> dict[str, Any]:
    """The body the emulator received for ``request``, checked against the adapter's size."""
    provider.send(request)
    record = emu.requests[-1]
    assert record.status == 200
    assert provider.measure(request) == len(provider.encode(request)) == record.body_bytes
    base, parts = provider.message_sizes(request)
    assert base + sum(parts) == record.body_bytes
    body: dict[str, Any] = record.body
    return body


def test_four_breakpoints_tools_system_then_the_conversation(provider: Any, emu: Any) -> None:
    history = conversation(4)
    body = sent(provider, emu, Request(history, max_tokens=50, tools=BIG_TOOLS, stream=False))
    last = len(body["messages"]) - 1
    assert breakpoints(body) == ["tools.4", "system.0", f"messages.{last - 2}.0",
                                 f"messages.{last}.0"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["system"][0]["text"] == BIG_SYSTEM


def test_a_tool_round_keeps_the_previous_turns_entry_in_reach(provider: Any, emu: Any) -> None:
    """25 tool calls in one answer: the final breakpoint is more than 20 blocks past the
    previous request's, so the earlier breakpoint on that request's last message is what
    reads it."""
    from ipy_ctxrecovery.core.history import ToolCall

    history = conversation(2)
    first = provider.send(Request(history, max_tokens=50, stream=False)).usage
    calls = tuple(ToolCall(f"call_{i}", "tool_0", '{"q": "x"}') for i in range(25))
    answer = Message.assistant("looking", calls)
    results = tuple(Message.tool(f"call_{i}", f"result {i}") for i in range(25))
    second = Request((*history, answer, *results), max_tokens=50, stream=False)
    usage = provider.send(second).usage
    # Everything the first request sent is read back, not only the system prompt.
    assert usage.cached_tokens == first.prompt_tokens
    body = emu.requests[-1].body
    last = len(body["messages"]) - 1
    assert breakpoints(body) == ["system.0", f"messages.{last - 2}.0", f"messages.{last}.24"]
    assert provider.measure(second) == emu.requests[-1].body_bytes


def test_no_breakpoint_below_the_minimum_cacheable_length(provider: Any, emu: Any) -> None:
    small = (Message.system("Be brief."), Message.user("hi"), Message.assistant("hello"),
             Message.user("and now?"))
    on = sent(provider, emu, Request(small, max_tokens=50, tools=BIG_TOOLS[:1], stream=False))
    assert breakpoints(on) == []
    assert isinstance(on["system"], str)
    off = sent(provider, emu, Request(small, max_tokens=50, tools=BIG_TOOLS[:1], stream=False,
                                      caching=None))
    assert on == off
    # A big system prompt after small tools: the system and the messages get one, the
    # tools (a prefix of ~400 tokens) none; the first turn has no earlier message.
    one_turn = (Message.system(BIG_SYSTEM), Message.user("hi"))
    body = sent(provider, emu, Request(one_turn, max_tokens=50, tools=BIG_TOOLS[:1],
                                       stream=False))
    assert breakpoints(body) == ["system.0", "messages.0.0"]


def test_the_estimate_decides_the_minimum(provider: Any, emu: Any) -> None:
    """~1,500 tokens at 4 bytes a token pass 1,024; at 10 bytes a token they do not."""
    history = conversation(1)
    body = sent(provider, emu, Request(history, max_tokens=50, stream=False))
    assert breakpoints(body) == ["system.0", "messages.0.0"]
    body = sent(provider, emu, Request(history, max_tokens=50, stream=False,
                                       caching=Caching(bytes_per_token=10.0)))
    assert breakpoints(body) == []


def test_usage_carries_the_cache_figures_on_both_wires(emu: Any) -> None:
    history = conversation(3, words=300)
    for spec in ("emulator:anthropic", "emulator"):
        p = make_provider(spec, emulator=emu)
        try:
            for stream in (False, True):
                request = Request(history, max_tokens=50, stream=stream)
                p.send(request)
                usage = p.send(request).usage
                assert usage.cached_tokens and usage.cached_tokens > 1024, (spec, stream, usage)
                assert usage.prompt_tokens is not None and usage.uncached_input is not None
                assert usage.uncached_input == usage.prompt_tokens - usage.cached_tokens \
                    - (usage.cache_write_tokens or 0)
                if spec == "emulator":
                    assert usage.cache_write_tokens == 0     # OpenAI does not say
                    assert usage.cached_tokens % 128 == 0
                else:
                    assert usage.cache_write_tokens == 0        # the same body: all read
                    assert usage.cached_tokens == usage.prompt_tokens
        finally:
            p.close()


def test_the_setting_switches_the_breakpoints_off(emu: Any) -> None:
    for caching_on in (True, False):
        session = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM,
                              settings=Settings(prompt_caching=caching_on),
                              name=f"cache-{caching_on}")
        reply = session.send("hello " * 50, stream=False)
        raw = emu.requests[-1].raw
        assert (b"cache_control" in raw) is caching_on
        assert (reply.usage.cache_write_tokens or 0) > 0 if caching_on \
            else not reply.usage.cache_write_tokens


def test_a_ten_turn_anthropic_session_reads_most_input_from_cache(emu: Any) -> None:
    session = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM, name="ten")
    shares = []
    for turn in range(10):
        reply = session.send(f"turn {turn}: " + "tell me more about it " * 20)
        usage = reply.usage
        assert usage.prompt_tokens and usage.cached_tokens is not None
        shares.append(usage.cached_tokens / usage.prompt_tokens)
        assert usage.uncached_input == usage.prompt_tokens - usage.cached_tokens \
            - (usage.cache_write_tokens or 0)
    assert shares[0] == 0
    assert all(share > 0.75 for share in shares[1:]), shares
    assert shares[-1] > 0.9, shares


def test_an_openai_session_shows_cached_tokens_once_past_1024(emu: Any) -> None:
    session = ChatSession("emulator", emulator=emu, system="Be helpful.", name="oa")
    seen = []
    for turn in range(8):
        reply = session.send(f"turn {turn}: " + "tell me more about it " * 20)
        seen.append((reply.usage.prompt_tokens, reply.usage.cached_tokens))
    assert seen[0][1] == 0
    for (before, _), (_, cached) in zip(seen, seen[1:], strict=False):
        assert before is not None and cached is not None
        if before < 1024:
            assert cached == 0, seen
        else:
            assert cached >= 1024 and cached % 128 == 0 and cached > before - 128, seen
    assert seen[-1][1], seen


def test_the_turn_log_sums_cache_figures_as_reported() -> None:
    from ipy_ctxrecovery.session.turn_log import TurnLog

    log = TurnLog()
    log.add_usage(100, 10)
    assert (log.cached_tokens, log.cache_write_tokens) == (0, 0)
    log.add_usage(2000, 20, cached=1500, cache_write=None)
    log.add_usage(2100, 20, cached=1900, cache_write=150)
    assert (log.prompt_tokens, log.completion_tokens) == (4200, 50)
    assert (log.cached_tokens, log.cache_write_tokens) == (3400, 150)


def test_a_breakpoint_never_lands_on_a_thinking_block(provider: Any, emu: Any) -> None:
    """The API takes no cache_control on a thinking block, nor an assistant message that
    ends in one: a message's trailing thinking is not sent (one that is only thinking is
    not sent at all), and a breakpoint is on the block after a leading one."""
    from ipy_ctxrecovery.core.history import Reasoning, Role, Text

    only_thinking = Message(Role.ASSISTANT, (Reasoning("thought " * 20, "sig-1"),))
    thinks_first = Message(Role.ASSISTANT, (Reasoning("more thought", "sig-2"),
                                            Text("partial answer"), Reasoning("after", "sig-3")))
    history = (Message.system(BIG_SYSTEM), Message.user("question: " + "why " * 60),
               only_thinking, Message.user("go on"), thinks_first)
    body = sent(provider, emu, Request(history, max_tokens=50, stream=False,
                                       caching=Caching(keep=3)))
    # messages: 0 user (the question and "go on" merged), 1 assistant (thinking, text)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant"]
    assert [b["type"] for b in body["messages"][1]["content"]] == ["thinking", "text"]
    # The kept prefix (three messages) ends on the question; the last mark is the text.
    assert breakpoints(body) == ["system.0", "messages.0.0", "messages.1.1"]
    # The emulator refuses what the API refuses.
    from ipy_ctxrecovery.emulator.cache import breakpoint_error

    body["messages"][1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert breakpoint_error(body) == ("messages.1.content.0.thinking.cache_control: "
                                      "Extra inputs are not permitted")


def tool_history(turns: int) -> tuple[Message, ...]:
    """A system prompt, then ``turns`` rounds of a request, a tool call and its ~2,000-token
    result, each answered."""
    from ipy_ctxrecovery.core.history import ToolCall

    history: tuple[Message, ...] = (Message.system(BIG_SYSTEM),)
    for i in range(turns):
        history += (Message.user(f"read part {i}"),
                    Message.assistant("", (ToolCall(f"call_{i}", "tool_0", '{"q": "x"}'),)),
                    Message.tool(f"call_{i}", f"part {i}: " + "log line here\n" * 600),
                    Message.assistant(f"part {i} is fine"))
    return history


@pytest.mark.parametrize("keep", [True, False])
def test_the_kept_prefix_is_read_by_the_request_that_rewrites_after_it(
        provider: Any, emu: Any, keep: bool) -> None:
    """A rewrite of turn 8's result (a batched microcompact) breaks the prefix from there:
    with a breakpoint after the first 8 turns (``Caching.keep``, in both requests) they are
    read back; without it only the system prompt is, since the entries the previous
    request wrote all end after the rewrite."""
    history = tool_history(10)
    kept = 1 + 4 * 8
    caching = Caching(keep=kept) if keep else Caching()
    first = Request((*history, Message.user("next")), max_tokens=50, stream=False,
                    caching=caching)
    provider.send(first)
    rewritten = list(history)
    rewritten[kept + 2] = Message.tool("call_8", "[Old tool result cleared]")
    second = Request((*rewritten, Message.user("next")), max_tokens=50, stream=False,
                     caching=caching)
    usage = provider.send(second).usage
    assert provider.measure(second) == emu.requests[-1].body_bytes
    prefix = provider.send(Request(history[:kept], max_tokens=50, stream=False,
                                   caching=None)).usage.prompt_tokens
    system_only = provider.send(Request(history[:1] + (Message.user("x"),), max_tokens=50,
                                        stream=False, caching=None)).usage.prompt_tokens
    assert prefix is not None and system_only is not None
    if keep:
        assert usage.cached_tokens >= prefix - 10, (usage, prefix)
    else:
        assert usage.cached_tokens <= system_only, (usage, system_only)


def _log_part(part: int) -> str:
    """Return one part of the log."""
    return f"part {part}\n" + "\n".join(f"line {i}: " + "value " * 12 for i in range(120))


def test_a_tool_session_keeps_its_cache_across_batched_rewrites(emu: Any, tmp_path: Any) -> None:
    """A ~6,000-token paste, then twelve tool turns on the Anthropic wire with batched
    rewrites every other turn: with the breakpoint after the prefix no batch touches, a
    rewriting request reads the paste from the cache; without it (the entries of the last
    messages all end after the rewrite) it writes the paste again, every batch."""
    paste = "notes: " + "the service restarts at noon and logs to /var/log/app. " * 440
    totals = {}
    for keep in (True, False):
        session = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM,
                              tools=[_log_part], builtin_tools=False, files_root=tmp_path,
                              name=f"keep-{keep}")
        if not keep:
            session._sizer.keep = None
        session.send(paste, stream=False)
        read = written = 0
        for i in range(12):
            usage = session.send(f"look at part {i} [[tool _log_part {{\"part\": {i}}}]]",
                                 stream=False).usage
            read += usage.cached_tokens
            written += usage.cache_write_tokens
        totals[keep] = (read, written)
        session.close()
        emu.reset()
    # Each batch reads what it would have written: at least two pastes in all.
    assert totals[True][0] - totals[False][0] > 12_000, totals
    assert totals[False][1] - totals[True][1] > 12_000, totals


def test_the_size_is_exact_wherever_the_kept_prefix_ends(provider: Any) -> None:
    """``measure`` counts the kept breakpoint wherever it lands: on a merged tool result,
    an assistant message with thinking, a system message (none), the last message."""
    from ipy_ctxrecovery.core.history import Reasoning, Role, Text

    history = (*tool_history(3), Message(Role.ASSISTANT, (Reasoning("why", "sig"),
                                                          Text("so"))),
               Message.tool("call_2", "late result"), Message.system("note"),
               Message.user("next"))
    for keep in range(len(history) + 1):
        request = Request(history, max_tokens=50, tools=BIG_TOOLS, stream=False,
                          caching=Caching(keep=keep))
        body = provider.encode(request)
        assert provider.measure(request) == len(body), keep
        assert body.count(b"cache_control") <= 4, keep
