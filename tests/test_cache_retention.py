"""How long the provider keeps the cache (the ``cache_retention`` setting, docs/caching.md):
the rule that picks Anthropic's one-hour entries, what each wire sends, what the emulator
keeps and bills, and a session that switches after its pauses."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core import caching, prices
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.cache import PromptCache
from ipy_ctxrecovery.emulator.replies import Turn
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.providers._common import openai_cache_parameters
from ipy_ctxrecovery.providers.base import Caching, Request, Usage

BIG_SYSTEM = "You answer questions about the project. " * 150      # ~1,500 tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _history(turns: int) -> tuple[Message, ...]:
    history: tuple[Message, ...] = (Message.system(BIG_SYSTEM),)
    for i in range(turns):
        history += (Message.user(f"question {i}: " + "why " * 60),)
        if i < turns - 1:
            history += (Message.assistant(f"answer {i}: " + "because " * 60),)
    return history


# -- the rule ------------------------------------------------------------------------------

def test_long_entries_pay_once_a_pause_outlives_the_short_cache() -> None:
    quick = [30.0] * 20
    # Two pauses of ten minutes in twenty: 10% × 1.15 × 20,000 = 2,300 > 0.75 × 1,000.
    assert caching.long_ttl_pays(quick[:18] + [600.0, 900.0], 20_000, 1_000)
    assert not caching.long_ttl_pays(quick, 20_000, 1_000)
    # One pause is not a habit (a meeting): every later write at 2x would bet on more.
    assert not caching.long_ttl_pays(quick[:19] + [600.0], 20_000, 1_000)
    # A pause past the hour loses both caches: it counts for neither.
    assert not caching.long_ttl_pays(quick[:18] + [600.0, 7_200.0], 20_000, 1_000)
    # A short prefix that grows fast: the 2x writes cost more than the pauses save.
    assert not caching.long_ttl_pays(quick[:18] + [600.0, 600.0], 2_000, 1_000)
    assert not caching.long_ttl_pays([], 20_000, 1_000)


def test_openai_retentions_by_model_family() -> None:
    assert caching.openai_retentions("gpt-5.1-2025-11-13") == ("in_memory", "24h")
    assert caching.openai_retentions("gpt-4.1") == ("in_memory", "24h")
    assert caching.openai_retentions("gpt-4.1-mini") == ()
    assert caching.openai_retentions("gpt-5-mini") == ()
    assert caching.openai_retentions("gpt-5.5-pro") == ("24h",)
    assert caching.openai_retentions("gpt-4o") == ()
    assert caching.long_life("anthropic", "claude-sonnet-4-6") == 3600.0
    assert caching.long_life("openai", "gpt-5.4") == 86_400.0
    assert caching.long_life("openai", "gpt-4o") is None
    # From gpt-5.6 on: no retention field (deprecated), a 30-minute minimum life.
    assert caching.openai_retentions("gpt-5.6-sol") == ()
    assert caching.long_life("openai", "gpt-5.6-terra") == 1_800.0


def test_one_hour_writes_are_billed_at_twice_the_input_price() -> None:
    price = prices.price_for("claude-sonnet-4-6")
    assert price is not None
    short = prices.estimate("claude-sonnet-4-6", Usage(10_000, 0, 0, 4_000))
    long = prices.estimate("claude-sonnet-4-6",
                           Usage(10_000, 0, 0, 4_000, cache_write_1h_tokens=4_000))
    assert short is not None and long is not None
    assert short.cache_write == pytest.approx(4_000 * price.write / 1e6)
    assert long.cache_write == pytest.approx(4_000 * 2 * price.input / 1e6)
    assert long.uncached_input == short.uncached_input == pytest.approx(6_000 * price.input / 1e6)


def test_openai_parameters_follow_the_model_and_the_callers_own_win() -> None:
    both = Caching(key="k", retention="long")
    assert openai_cache_parameters(both, "gpt-5.4") == {"prompt_cache_key": "k",
                                                        "prompt_cache_retention": "24h"}
    assert openai_cache_parameters(both, "gpt-4o") == {"prompt_cache_key": "k"}
    assert openai_cache_parameters(Caching(key="k"), "gpt-5.4") == {"prompt_cache_key": "k"}
    short = Caching(retention="short")
    assert openai_cache_parameters(short, "gpt-5.4") == {"prompt_cache_retention": "in_memory"}
    # gpt-5.5 takes only 24h, gpt-4o neither: nothing they would refuse is sent.
    assert openai_cache_parameters(short, "gpt-5.5") == {}
    assert openai_cache_parameters(Caching(retention="long"), "gpt-4o") == {}
    assert openai_cache_parameters(None, "gpt-5.4") == {}


# -- the wires, against the emulator -------------------------------------------------------

@pytest.fixture
def emu() -> Any:
    with Emulator(context_window=200_000) as emulator:
        yield emulator


def test_long_anthropic_breakpoints_live_an_hour_and_are_measured_exactly(emu: Any) -> None:
    provider = make_provider("emulator:anthropic", emulator=emu)
    try:
        request = Request(_history(4), max_tokens=50, stream=False, caching=Caching(retention="long"))
        response = provider.send(request)
        record = emu.requests[-1]
        assert provider.measure(request) == len(provider.encode(request)) == record.body_bytes
        controls = [b["cache_control"] for m in record.body["messages"]
                    for b in m["content"] if isinstance(b, dict) and "cache_control" in b]
        controls += [b["cache_control"] for b in record.body["system"]]
        assert controls and all(c == {"type": "ephemeral", "ttl": "1h"} for c in controls)
        # The TTL needs its beta: without it the API refuses it or keeps five minutes.
        assert "extended-cache-ttl-2025-04-11" in (record.header("anthropic-beta") or "")
        usage = response.usage
        assert usage.cache_write_tokens > 0
        assert usage.cache_write_1h_tokens == usage.cache_write_tokens
        # An hour later less a minute, the same prefix is read; a 5-minute one would be gone.
        short = Request(_history(4), max_tokens=50, stream=False, caching=Caching())
        assert b'"ttl"' not in provider.encode(short)
        provider.send(short)
        assert "extended-cache-ttl" not in (emu.requests[-1].header("anthropic-beta") or "")
    finally:
        provider.close()


@pytest.mark.parametrize("spec", ["emulator", "emulator:openai-responses"])
def test_openai_requests_carry_the_key_and_the_retention(emu: Any, spec: str) -> None:
    settings = Settings(openai_api="responses" if spec.endswith("responses") else "chat")
    provider = make_provider("emulator", emulator=emu, settings=settings)
    try:
        request = Request(_history(2), max_tokens=50, stream=False,
                          caching=Caching(key="conv-1", retention="long"))
        provider.send(request)
        assert emu.requests[-1].path.endswith("/responses") == spec.endswith("responses")
        body = emu.requests[-1].body
        assert body["prompt_cache_key"] == "conv-1"
        assert body["prompt_cache_retention"] == "24h"
        assert provider.measure(request) == emu.requests[-1].body_bytes
        mine = Request(_history(2), max_tokens=50, stream=False,
                       options={"prompt_cache_key": "mine"}, caching=Caching(key="conv-1"))
        provider.send(mine)
        body = emu.requests[-1].body
        assert body["prompt_cache_key"] == "mine" and "prompt_cache_retention" not in body
    finally:
        provider.close()


def test_the_emulator_keeps_an_openai_prefix_for_its_retention() -> None:
    clock = Clock()
    cache = PromptCache(clock)
    turns = [Turn("user", "word " * 3_000, "word " * 3_000, pieces=("word " * 3_000,))]
    for retention, life in ((None, caching.OPENAI_CACHE_TTL), ("24h", 86_400.0)):
        cache.clear()
        cache.openai("m", turns, retention=retention)
        clock.now += life - 1
        assert cache.openai("m", turns, retention=retention).read > 0, retention
        clock.now += life + 1
        assert cache.openai("m", turns, retention=retention).read == 0, retention


def test_the_emulator_refuses_an_unknown_retention(emu: Any) -> None:
    client = openai.OpenAI(base_url=emu.openai_base_url, api_key=emu.token, max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="emulator", messages=[{"role": "user",
                                                                      "content": "hi"}],
                                       extra_body={"prompt_cache_retention": "forever"})
    assert "Supported values are: 'in_memory' and '24h'" in str(raised.value)


# -- a session -----------------------------------------------------------------------------

def _ttls(body: dict[str, Any]) -> set[str]:
    found = {b["cache_control"].get("ttl", "5m") for m in body["messages"]
             for b in (m["content"] if isinstance(m["content"], list) else ())
             if isinstance(b, dict) and "cache_control" in b}
    system = body.get("system")
    if isinstance(system, list):
        found |= {b["cache_control"].get("ttl", "5m") for b in system if "cache_control" in b}
    return found


def test_auto_switches_to_one_hour_entries_after_two_long_pauses(tmp_path: Any) -> None:
    """Turns 30 s apart write 5-minute entries; one 10-minute pause loses them and changes
    nothing; after the second the next warm request switches to one-hour ones, and the
    pause after that reads the prefix from the cache instead of writing it again."""
    clock = Clock()
    with Emulator(context_window=200_000, clock=clock) as emu:
        session = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM,
                              name="auto-retention", files_root=tmp_path, clock=clock)

        def turn(i: int, after: float) -> tuple[set[str], Usage]:
            clock.now += after
            reply = session.send(f"turn {i}: " + "tell me more about it " * 40, stream=False)
            return _ttls(emu.requests[-1].body), reply.usage

        for i in range(4):
            assert turn(i, 30.0)[0] == {"5m"}
        ttls, cold = turn(4, 600.0)             # a pause: cache gone, still 5-minute
        assert ttls == {"5m"} and cold.cached_tokens == 0
        assert turn(5, 30.0)[0] == {"5m"}       # one pause is not a habit
        ttls, cold = turn(6, 600.0)             # the second: cache gone again
        assert ttls == {"5m"} and cold.cached_tokens == 0
        ttls, warm = turn(7, 30.0)              # warm: switches, writes only what is new
        assert ttls == {"1h"} and warm.cached_tokens > 0
        assert warm.cache_write_1h_tokens == warm.cache_write_tokens
        ttls, after = turn(8, 600.0)            # the same pause now reads the prefix
        assert ttls == {"1h"} and after.cached_tokens > 0.8 * (after.prompt_tokens or 0)
        assert session.status().cost is not None
        session.close()


@pytest.mark.parametrize("choice, expected", [("short", {"5m"}), ("long", {"1h"})])
def test_short_and_long_are_kept_whatever_the_pauses(tmp_path: Any, choice: str,
                                                     expected: set[str]) -> None:
    clock = Clock()
    with Emulator(context_window=200_000, clock=clock) as emu:
        session = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM,
                              settings=Settings(cache_retention=choice), name=f"r-{choice}",
                              files_root=tmp_path, clock=clock)
        for i, pause in enumerate((30.0, 600.0, 30.0, 30.0)):
            clock.now += pause
            session.send(f"turn {i}: " + "tell me more " * 40, stream=False)
            assert _ttls(emu.requests[-1].body) == expected
        session.close()


def test_a_session_sends_one_prompt_cache_key_that_names_no_path(emu: Any,
                                                                 tmp_path: Any) -> None:
    session = ChatSession("emulator", emulator=emu, name="keyed", files_root=tmp_path)
    session.send("hello", stream=False)
    session.send("again", stream=False)
    keys = {r.body.get("prompt_cache_key") for r in emu.requests}
    assert len(keys) == 1
    key = keys.pop()
    assert isinstance(key, str) and key.startswith("ipy-ctxrecovery-")
    assert "keyed" not in key and "/" not in key
    off = ChatSession("emulator", emulator=emu, name="unkeyed", files_root=tmp_path,
                      settings=Settings(prompt_caching=False))
    off.send("hello", stream=False)
    assert "prompt_cache_key" not in emu.requests[-1].body
    session.close()
    off.close()


def test_the_setting_refuses_a_word_it_does_not_know() -> None:
    with pytest.raises(Exception) as raised:
        Settings().updated({"cache_retention": "forever"})
    assert "cache_retention" in str(raised.value) and "long" in str(raised.value)


def test_one_hour_writes_are_said_and_kept_across_a_resume(emu: Any, tmp_path: Any,
                                                           monkeypatch: Any) -> None:
    from ipy_ctxrecovery.core import wording

    assert wording.cache_split(10_000, 8_000, 1_200, 1_200) == (
        "8,000 cached reads + 1,200 cache writes (all for 1 hour) + 800 uncached input tokens")
    assert "(200 for 1 hour)" in wording.cache_split(10_000, 8_000, 1_200, 200)
    assert "hour" not in wording.cache_split(10_000, 8_000, 1_200)
    monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(tmp_path))
    settings = Settings(cache_retention="long")
    first = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM, name="hour",
                        settings=settings)
    first.send("hello " * 50, stream=False)
    written = first.status().cache_write_1h_tokens
    assert written > 0 and written == first.status().cache_write_tokens
    assert "(all for 1 hour)" in wording.status_text(first.status())
    first.close()
    again = ChatSession.resume("hour", model="emulator:anthropic", emulator=emu,
                               system=BIG_SYSTEM, settings=settings)
    assert again.status().cache_write_1h_tokens == written
    again.close()


def test_a_plan_predicts_the_body_the_switched_session_sends(tmp_path: Any) -> None:
    """After the pauses switch ``auto`` to one-hour entries, ``what_if`` and ``dry_run``
    plan the body the next send carries, breakpoints and their TTL included."""
    clock = Clock()
    with Emulator(context_window=200_000, clock=clock) as emu:
        session = ChatSession("emulator:anthropic", emulator=emu, system=BIG_SYSTEM,
                              name="planned", files_root=tmp_path, clock=clock)
        for i, pause in enumerate((30.0, 600.0, 30.0, 600.0, 30.0)):
            clock.now += pause
            session.send(f"turn {i}: " + "tell me more " * 40, stream=False)
        assert _ttls(emu.requests[-1].body) == {"1h"}
        clock.now += 30.0
        text = "and the next one " * 30
        plan = session.what_if(text=text, stream=False)
        dry = session.dry_run(text)
        session.send(text, stream=False)
        assert plan.after_bytes == dry.body_bytes == emu.requests[-1].body_bytes
        session.close()


def test_status_says_the_prompt_cache_where_it_is_not_the_default(tmp_path: Any) -> None:
    from ipy_ctxrecovery.core.wording import status_text

    clock = Clock()
    with Emulator(context_window=200_000, clock=clock) as emu:
        def status(model: str, **settings: Any) -> str:
            session = ChatSession(model, emulator=emu, system=BIG_SYSTEM, clock=clock,
                                  files_root=tmp_path, settings=Settings(**settings))
            for pause in (30.0, 600.0, 30.0, 600.0, 30.0):
                clock.now += pause
                session.send("more " * 30, stream=False)
            text = status_text(session.status())
            session.close()
            return next((line for line in text.splitlines()
                         if line.startswith("prompt cache: ")), "")

        assert status("emulator") == ""          # the default says nothing
        assert status("emulator:anthropic") == (
            "prompt cache: 1-hour entries (cache_retention=auto: the session's pauses make "
            "them pay)")
        assert status("emulator:anthropic", cache_retention="short") == (
            "prompt cache: 5-minute entries (cache_retention=short)")
        assert status("emulator", cache_retention="long") == (
            "prompt cache: 24-hour retention where the model takes it (cache_retention=long)")
        assert "OpenAI still caches a repeated prefix" in status("emulator",
                                                                 prompt_caching=False)
