"""Exact pre-flight: the pure decision (core/exact_count.py), the tokenize endpoint
(providers/tokenize.py, the emulator's /tokenize), and a session deciding on the count."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.exact_count import conclude, plan_count
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.core.wording import status_text
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.notebook.turn_card import TurnCard, TurnRecord, card_wanted
from ipy_ctxrecovery.providers.base import CountsTokens, Request
from ipy_ctxrecovery.providers.openai import OpenAIProvider
from ipy_ctxrecovery.providers.tokenize import TEMPLATE_ALLOWANCE, tokenize_url

# -- the decision -------------------------------------------------------------------------


def test_counts_only_near_the_window_budget_on_either_side() -> None:
    window = 10_000
    assert plan_count(9_100, window=window, reserve=None, margin=0.10).ask       # just under
    assert plan_count(10_900, window=window, reserve=None, margin=0.10).ask      # just over
    assert plan_count(8_999, window=window, reserve=None, margin=0.10).why == "far_under"
    assert plan_count(11_001, window=window, reserve=None, margin=0.10).why == "far_over"


def test_the_budget_is_the_window_less_the_answer_reservation() -> None:
    plan = plan_count(6_000, window=10_000, reserve=4_000, margin=0.10)
    assert plan.ask and plan.budget == 6_000
    assert not plan_count(9_500, window=10_000, reserve=4_000, margin=0.10).ask  # far over 6,000


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"can_count": False}, "no_counter"),
    ({"counted_already": True}, "already_counted"),
    ({"compacts_anyway": True}, "compacts_anyway"),
    ({"window": None}, "no_window"),
])
def test_no_count_without_a_counter_a_window_or_a_reason(kwargs: dict[str, Any],
                                                         why: str) -> None:
    args: dict[str, Any] = {"window": 10_000, "reserve": None, "margin": 0.10, **kwargs}
    plan = plan_count(10_000, **args)
    assert not plan.ask and plan.why == why


def test_no_count_where_the_chat_budget_compacts_anyway() -> None:
    # window 10,000, answer 3,000: the window budget is 7,000; the chat budget 7,500.
    near = {"window": 10_000, "reserve": 3_000, "margin": 0.10, "chat_budget": 7_500}
    assert plan_count(7_400, **near).ask                 # the count may change both
    assert plan_count(7_900, **near).ask                 # within the margin of the budget
    plan = plan_count(8_600, window=10_000, reserve=1_500, margin=0.10, chat_budget=7_500)
    assert not plan.ask and plan.why == "compacts_anyway"   # near 8,500, far over 7,500


def test_margin_zero_never_counts() -> None:
    assert not any(plan_count(est, window=10_000, reserve=None, margin=0.0).ask
                   for est in (9_999, 10_000, 10_001))


@hsettings(max_examples=200, deadline=None)
@given(est=st.integers(0, 400_000), window=st.integers(1, 200_000),
       reserve=st.none() | st.integers(0, 50_000), margin=st.floats(0, 1))
def test_asks_exactly_within_the_margin(est: int, window: int, reserve: int | None,
                                        margin: float) -> None:
    plan = plan_count(est, window=window, reserve=reserve, margin=margin)
    budget = window - (reserve or 0)
    if plan.ask:
        assert margin > 0 and abs(est - budget) <= margin * window + 1
    else:
        assert margin == 0 or abs(est - budget) > margin * window - 1


@pytest.mark.parametrize(("answer", "tokens"), [
    (4_321, 4_321), (None, None), (0, None), (-3, None), (True, None), (12.0, None),
    ("12", None)])
def test_only_a_positive_whole_count_is_decided_on(answer: object,
                                                   tokens: int | None) -> None:
    assert conclude(answer) == tokens


def test_the_margin_setting_is_validated() -> None:
    assert Settings().exact_count_margin == 0.10
    assert Settings().updated({"exact_count_margin": "0.25"}).exact_count_margin == 0.25
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="exact_count_margin"):
            Settings(exact_count_margin=bad)


# -- the tokenize endpoint -----------------------------------------------------------------


@pytest.mark.parametrize(("base", "url"), [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/tokenize"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/tokenize"),
    ("https://gw.example/llm/v1", "https://gw.example/llm/tokenize"),
    ("http://localhost:8080", "http://localhost:8080/tokenize"),
    ("https://api.openai.com/v1", None),
    ("https://team.openai.azure.com/openai", None),
])
def test_the_endpoint_is_beside_the_base_url_and_not_on_openai(base: str,
                                                               url: str | None) -> None:
    assert tokenize_url(base) == url


def test_openai_itself_is_never_asked() -> None:
    client = openai.OpenAI(api_key="sk-none", base_url="https://api.openai.com/v1")
    provider = OpenAIProvider("gpt-4o-mini", client=client)
    try:
        assert isinstance(provider, CountsTokens)
        assert provider.count_tokens(Request(messages=(Message.user("hi"),))) is None
        assert provider._tokenizer.asked == 0
    finally:
        provider.close()


def test_the_emulator_counts_as_a_chat_request_reports(emulator: Any) -> None:
    emu = emulator(context_window=8192)
    client = emu.openai_client(max_retries=0)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hello " * 300}]
    tools = [{"type": "function", "function": {"name": "f", "description": "d",
                                               "parameters": {"type": "object"}}}]
    counted = client.post(emu.url + "/tokenize", cast_to=object,
                          body={"model": "emulator", "messages": messages, "tools": tools})
    reply = client.chat.completions.create(model="emulator", messages=messages, tools=tools)
    assert counted["count"] == reply.usage.prompt_tokens
    assert counted["max_model_len"] == 8192 and len(counted["tokens"]) == counted["count"]
    assert [r.path for r in emu.requests] == ["/tokenize", "/v1/chat/completions"]


def test_the_emulator_without_the_endpoint_answers_404(emulator: Any) -> None:
    emu = emulator(tokenize=False)
    with pytest.raises(openai.NotFoundError):
        emu.openai_client(max_retries=0).post(emu.url + "/tokenize", cast_to=object,
                                              body={"messages": []})
    with pytest.raises(ConfigError, match="tokenize"):
        emu.configure(tokenize="yes")


@contextlib.contextmanager
def _llama_cpp_server(count: int, status: int = 200) -> Iterator[tuple[int, list[Any]]]:
    """A server answering /tokenize as llama.cpp's does (tools/server: ``content`` only, a
    body without it gets ``{"tokens": []}``): ``count`` tokens for any text; or failing
    with ``status``."""
    seen: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            text = isinstance(body, dict) and isinstance(body.get("content"), str)
            data = json.dumps({"tokens": list(range(count)) if text else []}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_llama_cpp_server_is_asked_in_its_text_shape_from_then_on() -> None:
    with _llama_cpp_server(37) as (port, seen):
        client = openai.OpenAI(api_key="x", base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider("local", client=client)
        request = Request(messages=(Message.system("s"), Message.user("hello there")))
        try:
            assert provider.count_tokens(request) is None       # a chat body: no tokens
            per_message, per_request = TEMPLATE_ALLOWANCE
            assert provider.count_tokens(request) == 37 + 2 * per_message + per_request
        finally:
            provider.close()
    assert [path for path, _ in seen] == ["/tokenize", "/tokenize"]
    assert "messages" in seen[0][1] and seen[1][1] == {"content": "s\n\nhello there"}


# -- a session deciding on the count ---------------------------------------------------------

WINDOW = 4096
FILLER = "lorem ipsum dolor sit amet " * 40     # ≈ 1.1 KB a turn


def _session(emu: Any, **settings: Any) -> tuple[ChatSession, list[ev.Event]]:
    s = ChatSession("emulator", emulator=emu, builtin_tools=False,
                    settings=Settings(chat_budget_ratio=1.0, background_compaction=False,
                                      **settings))
    events: list[ev.Event] = []
    s.subscribe(events.append)
    return s, events


def _fill(s: ChatSession, turns: int) -> None:
    for i in range(turns):
        s.send(f"turn {i} {FILLER}", stream=False)


def _tokenize_requests(emu: Any) -> list[Any]:
    return [r for r in emu.requests if r.path == "/tokenize"]


def test_far_from_the_window_nothing_is_counted(emulator: Any) -> None:
    emu = emulator(context_window=WINDOW)
    s, events = _session(emu)
    _fill(s, 6)                                         # up to ≈ 45% of the window
    assert _tokenize_requests(emu) == []
    assert all(e.counted_tokens is None for e in events if isinstance(e, ev.Preflight))
    assert s.status().counted_tokens is None


def test_near_the_window_the_request_is_counted_once_and_shown(emulator: Any) -> None:
    emu = emulator(context_window=WINDOW)
    s, events = _session(emu)
    _fill(s, 11)                                        # ≈ 83% of the window
    assert _tokenize_requests(emu) == []
    events.clear()
    # ≈ 92%: within the 10% margin (a body's prompt_cache_key is bytes, not tokens).
    reply = s.send(f"turn 11 {FILLER}{FILLER[:400]}", stream=False)
    assert len(_tokenize_requests(emu)) == 1
    pf = next(e for e in events if isinstance(e, ev.Preflight))
    assert pf.counted_tokens == reply.usage.prompt_tokens == pf.est_tokens
    assert pf.action == "ok"
    status = s.status()
    assert status.counted_tokens == pf.counted_tokens
    assert f"input counted exactly: {pf.counted_tokens:,} tokens" in status_text(status)
    record = TurnRecord(session=s.name)
    for event in events:
        record.feed(event)
    card = TurnCard(record).text()
    assert card_wanted("auto", record)                  # a count is worth a card
    assert f"{pf.counted_tokens:,} of {WINDOW:,} tokens (counted exactly)" in card
    assert f"input counted exactly: {pf.counted_tokens:,} tokens · within the window" in card


def _near(emu: Any, bytes_per_token: float) -> tuple[ChatSession, list[ev.Event]]:
    """A session whose next request is a little under or over the window, with an estimate
    that is off by the content's own bytes/token (what calibrated it was other text)."""
    s, events = _session(emu)
    _fill(s, 13)
    s.estimator.bytes_per_token = bytes_per_token
    events.clear()
    return s, events


def test_a_request_the_window_rejects_is_compacted_on_the_count(emulator: Any) -> None:
    # The 14th turn's request ≈ 4,320 tokens: over the 4,096 window; at 4.6 bytes/token
    # the estimate says ≈ 3,850 — under it. Counted, the request is compacted and never
    # sent as it was.
    for tokenize, rejected in ((False, 1), (True, 0)):
        emu = emulator(context_window=WINDOW, tokenize=tokenize)
        s, events = _near(emu, 4.6)
        before = len(emu.requests)
        s.send(f"turn 13 {FILLER}", stream=False)
        sent = emu.requests[before:]
        assert sum(r.fault == "context" for r in sent) == rejected
        # Counted once; off, the server's 404 came on an earlier turn and was remembered.
        assert len([r for r in sent if r.path == "/tokenize"]) == int(tokenize)
        pf = next(e for e in events if isinstance(e, ev.Preflight))
        if tokenize:
            assert pf.counted_tokens is not None and pf.counted_tokens > WINDOW
            assert pf.action == "compact" and "window" in pf.reasons
            assert any(isinstance(e, ev.CompactionPhase) for e in events)
            assert s.status().counted_tokens is None    # what was sent is not what was counted


def test_a_request_that_fits_is_sent_as_is_on_the_count(emulator: Any) -> None:
    # The 13th turn's request ≈ 4,010 tokens: within the 4,096 window; at 3.7 bytes/token
    # the estimate says ≈ 4,440 — over it. Counted, nothing is compacted.
    outcomes = {}
    for tokenize in (False, True):
        emu = emulator(context_window=WINDOW, tokenize=tokenize)
        s, events = _session(emu)
        _fill(s, 12)
        s.estimator.bytes_per_token = 3.7
        events.clear()
        s.send(f"turn 12 {FILLER}", stream=False)
        compacted = any(isinstance(e, ev.CompactionPhase) and e.phase == "applied"
                        and e.outcome != "nothing" for e in events)
        pf = next(e for e in events if isinstance(e, ev.Preflight))
        outcomes[tokenize] = (compacted, pf.counted_tokens, len(s.history))
    assert outcomes[False][0] is True                  # the estimate compacts needlessly
    compacted, counted, messages = outcomes[True]
    assert not compacted and counted is not None and counted <= WINDOW
    assert messages == 26                              # every turn kept as it was


def test_a_server_without_the_endpoint_is_asked_once_a_session(emulator: Any) -> None:
    emu = emulator(context_window=WINDOW, tokenize=False)
    s, events = _session(emu)
    _fill(s, 11)
    for i in range(3):                                  # three sends near the window
        s.estimator.bytes_per_token = 4.6 if i % 2 else 3.9
        s.send(f"again {i} " + "x" * 200, stream=False)
    asked = _tokenize_requests(emu)
    assert [r.status for r in asked] == [404]
    assert all(e.counted_tokens is None for e in events if isinstance(e, ev.Preflight))


def test_an_answer_reservation_is_not_lowered_needlessly(emulator: Any) -> None:
    # Default chat budget (75%): a request of ≈ 2,450 tokens with max_tokens 1,500 asked
    # is near the window budget (4,096 − 1,500). At 3.7 bytes/token the estimate says
    # ≈ 2,720 + 1,500 > 4,096 and would lower max_tokens; counted, it fits as asked.
    outcomes = {}
    for tokenize in (False, True):
        emu = emulator(context_window=WINDOW, tokenize=tokenize)
        s = ChatSession("emulator", emulator=emu, builtin_tools=False, max_tokens=1_500,
                        settings=Settings(background_compaction=False))
        events: list[ev.Event] = []
        s.subscribe(events.append)
        _fill(s, 7)
        s.estimator.bytes_per_token = 3.7
        events.clear()
        s.send(f"turn 7 {FILLER}", stream=False)
        chat = [r for r in emu.requests if r.path == "/v1/chat/completions"][-1]
        lowered = [e for e in events if isinstance(e, ev.MaxTokensLowered)]
        outcomes[tokenize] = (chat.body["max_tokens"], lowered)
    assert outcomes[False][0] < 1_500 and outcomes[False][1]
    assert outcomes[True] == (1_500, [])


def test_a_failing_count_is_ignored_and_not_taken_for_a_missing_endpoint() -> None:
    with _llama_cpp_server(5, status=500) as (port, seen):
        client = openai.OpenAI(api_key="x", base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider("local", client=client)
        request = Request(messages=(Message.user("hello"),))
        try:
            assert provider.count_tokens(request) is None
            assert provider.count_tokens(request) is None
        finally:
            provider.close()
    assert len(seen) == 2                  # no retry within a count; asked again next time


@pytest.mark.parametrize("server_compaction", ["off", "auto"])
def test_a_compacted_request_near_the_window_is_counted_before_it_is_sent(
        emulator: Any, server_compaction: str) -> None:
    """Big pastes in an 8K window: the request a compaction (ours) or a fit (while the
    server compacts) leaves sits just under the window with its answer, by an estimate a
    few percent off. Counted as it will be sent, its max_tokens is lowered where it does
    not fit; uncounted, the window rejected it (two rejections in 30 turns on either
    setting, before)."""
    emu = emulator(context_window=8_192, max_body="64KB")
    with ChatSession("emulator:anthropic", emulator=emu,
                     settings=Settings(server_compaction=server_compaction)) as s:
        for i in range(30):
            s.send(f"turn {i}: " + "data row value " * (300 if i % 3 else 1500), stream=False)
        assert [r.fault for r in emu.requests if r.status != 200] == []
        counts = [r for r in emu.requests if "count_tokens" in r.path]
        assert counts, "nothing was counted: the test shows nothing"
        chats = [r for r in emu.requests if "count_tokens" not in r.path]
        # At most one count per body sent: a count is never repeated for the same request.
        assert len(counts) <= len(chats)
        assert len({bytes(r.raw) for r in counts}) == len(counts)
