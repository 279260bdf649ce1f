"""The emulator's prompt caches (emulator/cache.py): OpenAI's 1,024-token threshold and
128-token steps, Anthropic's breakpoints with the 20-block lookback, TTLs on an injected
clock, the per-model minimum, the 4-breakpoint 400 — by the rules directly and through
the real SDKs over HTTP."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from ipy_ctxrecovery.core import caching
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.cache import (
    PromptCache,
    anthropic_blocks,
    breakpoint_error,
)
from ipy_ctxrecovery.emulator.replies import anthropic_turns, openai_turns, prompt_tokens

BP = {"type": "ephemeral"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def text(n_tokens: int, tag: str = "x") -> str:
    """A text of exactly ``n_tokens`` emulator tokens (4 bytes each)."""
    return (tag * 4 * n_tokens)[:4 * n_tokens]


# -- the rules -----------------------------------------------------------------------------

@pytest.mark.parametrize(("shared", "cached"), [(0, 0), (1023, 0), (1024, 1024), (1151, 1024),
                                                (1152, 1152), (5000, 4992)])
def test_openai_counts_past_1024_in_128_token_steps(shared: int, cached: int) -> None:
    assert caching.openai_cached_tokens(shared) == cached


def test_minimum_cacheable_length_by_model() -> None:
    assert caching.min_cacheable_tokens("claude-sonnet-4-5") == 1024
    assert caching.min_cacheable_tokens("claude-opus-4-1") == 1024
    assert caching.min_cacheable_tokens("claude-3-5-haiku-latest") == 2048
    assert caching.min_cacheable_tokens("claude-3-haiku-20240307") == 2048
    assert caching.min_cacheable_tokens("claude-haiku-4-5") == 4096
    assert caching.min_cacheable_tokens("emulator") == 1024


def openai_body(*contents: str, model: str = "gpt-4o") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "system" if i == 0 else "user", "content": c}
                                         for i, c in enumerate(contents)]}


def openai_read(cache: PromptCache, body: dict[str, Any]) -> int:
    return cache.openai(body["model"], openai_turns(body), body.get("tools")).read


def test_openai_reads_the_prefix_shared_with_a_recent_request() -> None:
    cache = PromptCache(Clock())
    system = text(2000)
    assert openai_read(cache, openai_body(system, "first")) == 0
    shared = prompt_tokens(openai_turns(openai_body(system)))
    assert openai_read(cache, openai_body(system, "second")) == shared - shared % 128
    # A short prompt never reads, however much it shares.
    assert openai_read(cache, openai_body("short", "a")) == 0
    assert openai_read(cache, openai_body("short", "b")) == 0
    # Another model has its own cache; a changed first message shares nothing.
    assert openai_read(cache, openai_body(system, "third", model="gpt-4.1")) == 0
    assert openai_read(cache, openai_body(text(2000, "y"), "second")) == 0


def test_openai_prefix_expires_after_its_ttl() -> None:
    clock = Clock()
    cache = PromptCache(clock)
    system = text(3000)
    openai_read(cache, openai_body(system, "a"))
    clock.now += caching.OPENAI_CACHE_TTL - 1
    assert openai_read(cache, openai_body(system, "b")) > 0       # a read renews it
    clock.now += caching.OPENAI_CACHE_TTL - 1
    assert openai_read(cache, openai_body(system, "c")) > 0
    clock.now += caching.OPENAI_CACHE_TTL + 1
    assert openai_read(cache, openai_body(system, "d")) == 0


def anthropic_body(system: Any, blocks: list[dict[str, Any]], *, model: str = "claude-sonnet-4-5",
                   tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": 100, "system": system,
                            "messages": [{"role": "user", "content": blocks}]}
    if tools:
        body["tools"] = tools
    return body


def small_blocks(n: int, mark: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    marks = mark or {}
    return [{"type": "text", "text": f"block {i}", **({"cache_control": marks[i]}
                                                        if i in marks else {})}
            for i in range(n)]


def test_blocks_prefix_tokens_end_at_the_prompt_tokens() -> None:
    tools = [{"name": f"t{i}", "description": text(50), "input_schema": {"type": "object"},
              **({"cache_control": BP} if i == 2 else {})} for i in range(3)]
    body = anthropic_body([{"type": "text", "text": text(700)},
                           {"type": "text", "text": "more"}], small_blocks(5, {4: BP}), tools=tools)
    blocks = anthropic_blocks(body)
    assert len(blocks) == 3 + 2 + 5
    assert [b.tokens for b in blocks] == sorted(b.tokens for b in blocks)
    assert blocks[-1].tokens == prompt_tokens(anthropic_turns(body), tools)
    assert [i for i, b in enumerate(blocks) if b.cache_control] == [2, 9]


def test_anthropic_writes_then_reads_at_a_breakpoint() -> None:
    cache = PromptCache(Clock())
    system = [{"type": "text", "text": text(1500), "cache_control": BP}]
    first = anthropic_body(system, small_blocks(3, {2: BP}))
    used = cache.anthropic(first)
    total = prompt_tokens(anthropic_turns(first))
    assert (used.read, used.write) == (0, total)
    second = anthropic_body(system, small_blocks(6, {5: BP}))
    used = cache.anthropic(second)
    blocks = anthropic_blocks(second)
    # The new breakpoint finds the entry written three blocks back and writes the rest.
    assert used.read == anthropic_blocks(first)[-1].tokens
    assert used.write == blocks[-1].tokens - used.read
    # The same request again reads it all and writes nothing.
    again = cache.anthropic(second)
    assert (again.read, again.write) == (blocks[-1].tokens, 0)


def lookback_case(distance: int) -> int:
    """Tokens read by a breakpoint ``distance`` blocks after the only entry written."""
    cache = PromptCache(Clock())
    system = [{"type": "text", "text": text(1500)}]
    cache.anthropic(anthropic_body(system, small_blocks(40, {5: BP})))
    return cache.anthropic(anthropic_body(system, small_blocks(40, {5 + distance: BP}))).read


def test_a_breakpoint_looks_back_at_most_20_blocks() -> None:
    assert lookback_case(caching.LOOKBACK_BLOCKS) > 0
    assert lookback_case(caching.LOOKBACK_BLOCKS + 1) == 0
    assert lookback_case(1) == lookback_case(caching.LOOKBACK_BLOCKS)


def test_anthropic_ttl_five_minutes_by_default_and_one_hour_when_asked() -> None:
    # One hour only with the extended-cache-ttl beta; without it a 1h breakpoint is a
    # five-minute one, as the API keeps it.
    beta = frozenset({caching.EXTENDED_TTL_BETA})
    for ttl, betas, life in (({}, frozenset(), 300.0), ({"ttl": "1h"}, beta, 3600.0),
                             ({"ttl": "1h"}, frozenset(), 300.0)):
        clock = Clock()
        cache = PromptCache(clock)
        body = anthropic_body([{"type": "text", "text": text(1500), "cache_control": {**BP, **ttl}}],
                              small_blocks(1))
        written = cache.anthropic(body, betas)
        assert written.write > 0 and written.write_1h == (written.write if betas else 0)
        clock.now += life - 1
        assert cache.anthropic(body, betas).read == written.write    # renewed by the read
        clock.now += life - 1
        assert cache.anthropic(body, betas).read == written.write
        clock.now += life + 1
        assert cache.anthropic(body, betas).read == 0


def test_nothing_is_cached_below_the_models_minimum() -> None:
    cache = PromptCache(Clock())
    short = anthropic_body([{"type": "text", "text": text(900), "cache_control": BP}],
                           small_blocks(1))
    assert cache.anthropic(short).write == 0
    assert cache.anthropic(short).read == 0
    # 1,500 tokens: cached for Sonnet (1,024), not for Haiku 3.5 (2,048).
    mid = [{"type": "text", "text": text(1500), "cache_control": BP}]
    assert cache.anthropic(anthropic_body(mid, small_blocks(1))).write > 0
    haiku = anthropic_body(mid, small_blocks(1), model="claude-3-5-haiku-latest")
    assert cache.anthropic(haiku).write == 0 and cache.anthropic(haiku).read == 0


def test_more_than_four_breakpoints_and_bad_ttl_are_refused() -> None:
    four = anthropic_body([{"type": "text", "text": "s", "cache_control": BP}],
                          small_blocks(5, {0: BP, 1: BP, 2: BP}))
    assert breakpoint_error(four) is None
    five = anthropic_body([{"type": "text", "text": "s", "cache_control": BP}],
                          small_blocks(5, {0: BP, 1: BP, 2: BP, 3: BP}))
    assert breakpoint_error(five) == ("A maximum of 4 blocks with cache_control may be "
                                      "provided. Found 5.")
    bad = anthropic_body("s", small_blocks(1, {0: {**BP, "ttl": "2h"}}))
    assert "ttl" in (breakpoint_error(bad) or "")


# -- over HTTP, through the SDKs ------------------------------------------------------------

def test_the_sdks_see_the_cache_figures_streamed_and_not() -> None:
    clock = Clock()
    with Emulator(context_window=100_000, clock=clock) as emu:
        client = emu.anthropic_client(max_retries=0)
        system = [{"type": "text", "text": text(2000), "cache_control": BP}]
        kwargs: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 50, "system": system,
                                  "messages": [{"role": "user", "content": "hello"}]}
        first = client.messages.create(**kwargs).usage
        assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 2000
        assert first.cache_creation is not None \
            and first.cache_creation.ephemeral_5m_input_tokens == first.cache_creation_input_tokens
        with client.messages.stream(**kwargs) as stream:
            second = stream.get_final_message().usage
        assert second.cache_read_input_tokens == first.cache_creation_input_tokens
        assert second.cache_creation_input_tokens == 0
        # input_tokens is the uncached remainder: the user message only.
        body = emu.requests[-1].body
        assert second.input_tokens == prompt_tokens(anthropic_turns(body)) \
            - second.cache_read_input_tokens
        with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks"):
            client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "text", "text": "a", "cache_control": BP}] * 5}])

        openai = emu.openai_client(max_retries=0)
        messages = [{"role": "system", "content": text(1500)}, {"role": "user", "content": "q"}]
        got = [openai.chat.completions.create(model="gpt-4o", messages=messages)
               .usage.prompt_tokens_details.cached_tokens]
        for chunk in openai.chat.completions.create(model="gpt-4o", messages=messages,
                                                    stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage is not None:
                got.append(chunk.usage.prompt_tokens_details.cached_tokens)
        assert got[0] == 0 and got[1] >= 1024 and got[1] % 128 == 0


def test_each_emulator_has_its_own_cache_and_reset_forgets_it() -> None:
    kwargs: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": [
        {"role": "user", "content": [{"type": "text", "text": text(1500), "cache_control": BP}]}]}
    with Emulator() as one, Emulator() as two:
        a, b = one.anthropic_client(max_retries=0), two.anthropic_client(max_retries=0)
        assert a.messages.create(**kwargs).usage.cache_creation_input_tokens > 0
        assert b.messages.create(**kwargs).usage.cache_read_input_tokens == 0
        assert a.messages.create(**kwargs).usage.cache_read_input_tokens > 0
        one.reset()
        assert a.messages.create(**kwargs).usage.cache_read_input_tokens == 0


def test_a_refused_request_writes_nothing() -> None:
    with Emulator(context_window=1200) as emu:
        client = emu.anthropic_client(max_retries=0)
        kwargs: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 500, "messages": [
            {"role": "user", "content": [{"type": "text", "text": text(1100),
                                          "cache_control": BP}]}]}
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(**kwargs)
        emu.configure(context_window=10_000)
        assert client.messages.create(**kwargs).usage.cache_read_input_tokens == 0
