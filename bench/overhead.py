"""Benchmark: what our per-request pipeline costs next to one emulator round trip.

Run: ``python bench/overhead.py`` (``--sizes 10,100,500``, ``--repeat 7``).

For histories of 10/100/500 messages (a tool-heavy mix: user text, tool call, a 12,000-char
tool result, assistant text), it times with ``time.perf_counter`` (median of ``--repeat``
runs, after one warm-up):

* the pipeline a request goes through before it is sent — ``microcompact`` + tool-result
  budget + ``provider.encode`` (the exact body bytes, through the SDK) + ``preflight.check``;
* one round trip to a local emulator (``provider.send`` of a fresh Request: SDK, HTTP on
  127.0.0.1, the emulator's parse and token count, the SDK's parse);
* ``provider.encode`` against ``json.dumps`` of the same payload;
* ``provider.measure`` (the fast body size the compactor's search uses) against
  ``provider.encode``, on both wires: *warm* (the messages were measured before, as in a
  search over one history's candidates) and *cold* (every message new to its memo), and
  whether the size equals ``len(encode())``;
* in a whole session (the ``window`` and ``413`` conversations of ``recovery_vs_blind``,
  ``--session-turns``): how many times the session encoded a body per request sent, and
  the share of the session's wall time spent encoding.

It prints ratios, never verdicts: the round trip here is a loopback call with no model
behind it, so the ratio is an upper bound of the share a real provider would see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ipy_ctxrecovery import ChatSession, Settings, budget, microcompact, preflight
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.history import History, Message, ToolCall, to_openai
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.providers.base import Request, ToolSpec

TOOL = ToolSpec("fetch_log", "Return n characters of the service log.",
                {"type": "object", "properties": {"n": {"type": "integer"}},
                 "required": ["n"]})


def history_of(n: int, *, result_chars: int = 12_000) -> History:
    """A deterministic tool-heavy history of ``n`` messages (plus a system prompt)."""
    out: list[Message] = [Message.system("You are a careful assistant.")]
    i = 0
    while len(out) - 1 < n:
        k = len(out) - 1
        step = k % 4
        if step == 0:
            out.append(Message.user(f"[turn {i}] please look at part {i} " + "x" * 400))
        elif step == 1:
            out.append(Message.assistant("", (ToolCall(f"call_{i}", "fetch_log",
                                                       json.dumps({"n": result_chars})),)))
        elif step == 2:
            line = f"{i:05d} worker cache retry socket parse config deploy\n"
            body = (line * (result_chars // len(line) + 1))[:result_chars]
            out.append(Message.tool(f"call_{i}", body, name="fetch_log"))
        else:
            out.append(Message.assistant(f"Part {i} shows a cache timeout. " * 8))
            i += 1
    if out[-1].role.value != "user":
        out.append(Message.user(f"[turn {i}] and now?"))
    return tuple(out)


def fresh_copies(history: History, count: int) -> list[History]:
    """``count`` copies of ``history`` whose messages are new to a measure() memo (a tag
    no other copy has: same bytes on the wire, different message identity)."""
    return [tuple(Message(m.role, m.blocks, tag=f"bench-cold-{k}") for m in history)
            for k in range(count)]


def measure_ratios(label: str, provider: object, request: Request, repeat: int) -> None:
    """measure() vs encode() on one provider: speed ratios (warm/cold) and exactness."""
    encode = provider.encode  # type: ignore[attr-defined]
    measure = provider.measure  # type: ignore[attr-defined]
    copies = iter(fresh_copies(request.messages, repeat + 1))

    def cold() -> int:
        return int(measure(Request(next(copies), tools=request.tools, stream=request.stream)))

    t_enc = median_time(lambda: encode(request), repeat)
    t_warm = median_time(lambda: measure(request), repeat)
    t_cold = median_time(cold, repeat)
    exact = measure(request) == len(encode(request))
    print(f"  measure {label}: warm {t_warm * 1e3:.3f} ms, cold {t_cold * 1e3:.2f} ms, "
          f"encode {t_enc * 1e3:.2f} ms, size equals len(encode()): {exact}")
    print(f"ratio measure {label}: encode/measure warm {t_enc / t_warm:.1f}, "
          f"cold {t_enc / t_cold:.1f}")


def median_time(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up (also persists tool results once, as a session's second turn would)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def session_encodes(key: str, turns: int) -> None:
    """Encodes per request and encode share of wall time over one scripted conversation."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import recovery_vs_blind as rvb

    mode = rvb.MODES[key]
    texts = rvb.script(turns, mode)
    calls = [0]
    spent = [0.0]
    with Emulator(**mode.emulator) as emu:
        session = ChatSession("emulator", emulator=emu, settings=Settings(), system=rvb.SYSTEM,
                              tools=[rvb.fetch_log], builtin_tools=False)
        provider = session.provider
        original = provider.encode

        def counted(request: Request) -> bytes:
            start = time.perf_counter()
            try:
                return original(request)
            finally:
                calls[0] += 1
                spent[0] += time.perf_counter() - start

        provider.encode = counted  # type: ignore[method-assign]
        start = time.perf_counter()
        try:
            for text in texts:
                session.send(text, stream=False)
        finally:
            total = time.perf_counter() - start
            session.close()
        sent = len(emu.requests)
    print(f"session {key} ({turns} turns): {calls[0]} encodes for {sent} requests, "
          f"{spent[0]:.2f} s encoding of {total:.2f} s")
    print(f"ratio session {key}: encodes/request {calls[0] / sent:.2f}, "
          f"encode_time/session_time {spent[0] / total:.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,500", help="history sizes in messages")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--result-chars", type=int, default=12_000)
    parser.add_argument("--session-turns", type=int, default=40,
                        help="turns of the whole-session figure (0 skips it)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    settings = Settings()
    print(f"overhead: median of {args.repeat} runs per figure "
          f"(tool results {args.result_chars:,} chars)")
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp, \
            Emulator(context_window=50_000_000) as emu:
        store = budget.ResultStore(Path(tmp) / "results")
        provider = make_provider("emulator", emulator=emu)
        a_provider = make_provider("emulator:anthropic", emulator=emu)
        caps = preflight.Caps.from_settings(settings)
        estimator = preflight.TokenEstimator.from_settings(settings)
        try:
            for n in sizes:
                history = history_of(n, result_chars=args.result_chars)

                def pipeline(history: History = history) -> int:
                    h, _ = microcompact.microcompact(history, settings=settings, store=store)
                    h, _ = budget.enforce_budget(
                        h, store=store, turn_budget_chars=settings.turn_budget_chars,
                        per_result_max_chars=settings.per_result_max_chars,
                        head_chars=settings.budget_head_chars,
                        tail_chars=settings.budget_tail_chars)
                    body = provider.encode(Request(h, tools=(TOOL,), stream=False))
                    preflight.check(len(body), settings=settings, caps=caps,
                                    estimator=estimator, window_tokens=emu.context_window,
                                    max_tokens=None, warned=True)
                    return len(body)

                sent, _ = microcompact.microcompact(history, settings=settings, store=store)

                def round_trip(sent: History = sent) -> object:
                    return provider.send(Request(sent, tools=(TOOL,), stream=False))

                request = Request(sent, tools=(TOOL,), stream=False)
                payload = {"model": "emulator", "messages": to_openai(sent),
                           "tools": [{"type": "function",
                                      "function": {"name": TOOL.name,
                                                   "description": TOOL.description,
                                                   "parameters": dict(TOOL.parameters)}}],
                           "stream": False}

                def encode(request: Request = request) -> bytes:
                    return provider.encode(request)

                def dumps(payload: dict[str, object] = payload) -> bytes:
                    return json.dumps(payload).encode()

                t_pipe = median_time(pipeline, args.repeat)
                t_rt = median_time(round_trip, args.repeat)
                t_enc = median_time(encode, args.repeat)
                t_json = median_time(dumps, args.repeat)
                body = len(provider.encode(request))
                print(f"history {n:>4} msgs ({body / 1024:,.0f} KB sent): pipeline "
                      f"{t_pipe * 1e3:.2f} ms, round trip {t_rt * 1e3:.2f} ms, encode "
                      f"{t_enc * 1e3:.2f} ms, json.dumps {t_json * 1e3:.2f} ms")
                print(f"ratio overhead n={n}: pipeline/round_trip {t_pipe / t_rt:.2f}, "
                      f"encode/json.dumps {t_enc / t_json:.2f}")
                for wire, p in (("openai", provider), ("anthropic", a_provider)):
                    measure_ratios(f"n={n} {wire}", p, request, args.repeat)
        finally:
            for p in (provider, a_provider):
                close = getattr(p, "close", None)
                if callable(close):
                    close()
    if args.session_turns > 0:
        with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
            os.environ["IPY_CTXRECOVERY_DIR"] = tmp
            for key in ("window", "413"):
                session_encodes(key, args.session_turns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
