"""Benchmark: one ``ChatSession`` turn against one bare SDK call on the same messages.

Run: ``python bench/overhead.py`` (``--quick`` for a seconds-long run; ``--repeat 7``;
``--min-seconds 3``; ``--cases 100KB,1MB,5MB,20MB,10000msgs``; ``--wires openai,anthropic``).

For each wire and each history — 100 KB, 1 MB, 5 MB and 20 MB in 50 messages, and
10,000 messages (≈ 2 MB) — a session resumed on that history sends one short message
(``session.send(text, stream=False)``: microcompact, tool-result budget, pre-flight,
compaction check, the send, the transcript and history files), interleaved with the bare
SDK call a user would make on the same messages (``client.chat.completions.create`` /
``client.messages.create`` with the history already as dicts, the same client settings,
the same emulator). Medians of ``--repeat`` runs of each (more for a small history, until
the pairs took ``--min-seconds``), after one warm-up of each. The
emulator runs in a process of its own (``python -m ipy_ctxrecovery.emulator``), as a real
server would: its parsing neither competes for this process's GIL nor counts in its memory.

At 5 MB it also prints the *physical floor*: ``json.dumps`` of the body plus one
``httpx2`` POST of those bytes to the same emulator endpoint (the emulator's own parse and
token count included, as in both of the above), and the peak and retained memory of a
session turn and a bare call (``tracemalloc``, in a separate pass: it slows everything).

It prints ratios, never verdicts (``ratio session/bare openai 5MB: 0.93``). The server
is a loopback emulator with no model behind it, so the ratios are upper bounds of what
a real provider's latency would show.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
import httpx2
import openai

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import History, Message, Role, ToolCall, to_openai
from ipy_ctxrecovery.providers.anthropic import to_anthropic
from ipy_ctxrecovery.providers.base import ToolSpec
from ipy_ctxrecovery.session.store import Transcript

TOOL = ToolSpec("fetch_log", "Return n characters of the service log.",
                {"type": "object", "properties": {"n": {"type": "integer"}},
                 "required": ["n"]})
KEY = "emulator-key"
FILES: dict[str, float] = {"files": 0.0}
"""Seconds spent persisting the history and learned limits (see ``time_snapshot_files``)."""
CASES: dict[str, tuple[int, int]] = {          # name: (body bytes, messages)
    "100KB": (100_000, 50),
    "1MB": (1_000_000, 50),
    "5MB": (5_000_000, 50),
    "20MB": (20_000_000, 50),
    "10000msgs": (2_000_000, 10_000),
}
QUICK: dict[str, tuple[int, int]] = {
    "100KB": (100_000, 50),
    "1MB": (1_000_000, 50),
    "2000msgs": (400_000, 2_000),
}


def history_of(n: int, *, result_chars: int = 12_000) -> History:
    """A deterministic tool-heavy history of ``n`` messages (plus a system prompt): user
    text → tool call → tool result of ``result_chars`` → assistant text (bench/trim.py's
    and the issue's 4.3 MB / 1,334-message case: ``history_of(1334)``)."""
    out: list[Message] = [Message.system("You are a careful assistant.")]
    i = 0
    while len(out) - 1 < n:
        step = (len(out) - 1) % 4
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
    if out[-1].role is not Role.USER:
        out.append(Message.user(f"[turn {i}] and now?"))
    return tuple(out)


def conversation(total: int, count: int, *, line: str | None = None) -> History:
    """``count`` alternating user/assistant text messages of ``total`` bytes in all
    (no tool results: microcompact and the budget leave it as it is, so the session and
    the bare call send the same messages), each ``line`` repeated (default: one with a
    "—" and a "✓")."""
    each = max(1, total // count)
    line = line or "The service log shows a cache timeout at 12:04 — retry with backoff ✓. "
    text = (line * (each // len(line) + 1))[:each]
    out: list[Message] = [Message.system("You are a careful assistant.")]
    for i in range(count):
        head = f"[{i}] "
        body = head + text[len(head):]
        out.append(Message.user(body) if i % 2 == 0 else Message.assistant(body))
    return tuple(out)


def median_pair(a: Callable[[], object], b: Callable[[], object],
                repeat: int, *, min_seconds: float = 0.0,
                after: Callable[[], object] | None = None) -> tuple[float, float, int]:
    """Medians of ``a`` and ``b`` run alternately (after one warm-up each), and the number
    of pairs: ``repeat``, or more until the pairs took ``min_seconds`` (a few-millisecond
    call needs many runs for its median to hold still on a shared machine). ``after``
    runs after each call, untimed (setting up the next one)."""
    a()
    b()
    ta: list[float] = []
    tb: list[float] = []
    spent = 0.0
    while len(ta) < repeat or spent < min_seconds:
        for fn, out in ((a, ta), (b, tb)):
            gc.collect()
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
            spent += out[-1]
            if after is not None:
                after()
    return statistics.median(ta), statistics.median(tb), len(ta)


class RemoteEmulator:
    """The emulator in a child process (started and stopped by this benchmark)."""

    def __init__(self, context_window: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "ipy_ctxrecovery.emulator", "--port", "0", "--quiet",
             "--context-window", str(context_window)],
            stdout=subprocess.PIPE, text=True)
        urls: dict[str, str] = {}
        assert self._proc.stdout is not None
        while len(urls) < 2:
            line = self._proc.stdout.readline()
            if not line:
                raise RuntimeError("the emulator did not start")
            label, _, url = line.partition(" base URL:")
            if url:
                urls[label.strip()] = url.strip()
        self.openai_base_url = urls["OpenAI"]
        self.anthropic_base_url = urls["Anthropic"]

    def __enter__(self) -> RemoteEmulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)


class Case:
    """A session on ``history`` and the bare SDK call on the same messages, for one wire."""

    def __init__(self, wire: str, emu: RemoteEmulator, history: History, name: str) -> None:
        self.wire = wire
        files = Transcript(name)
        files.create()        # a saved session: its files exist
        files.save_history(history)
        files.release()       # written: the session below is its one writer
        if wire == "openai":
            self.client: Any = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY)
            self.url = emu.openai_base_url.rstrip("/") + "/chat/completions"
        else:
            self.client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY)
            self.url = emu.anthropic_base_url.rstrip("/") + "/v1/messages"
        # The session gets a client of its own, built the same way as the bare call's.
        own = type(self.client)(base_url=str(self.client.base_url), api_key=KEY)
        # The bare call asks no server compaction; the session must send the same body.
        self.session = ChatSession.resume(name, model=f"{wire}:emulator", client=own,
                                          settings=Settings(context_window=10_000_000,
                                                            server_compaction="off"),
                                          builtin_tools=False)
        self._own = own
        self.turn = 0
        self.max_tokens = self.session.provider.default_max_tokens  # type: ignore[attr-defined]

    def close(self) -> None:
        self.session.close()
        self.client.close()
        self._own.close()

    def text(self) -> str:
        self.turn += 1
        return f"[bench turn {self.turn}] and what next?"

    def session_turn(self) -> object:
        return self.session.send(self.text(), stream=False)

    def payload(self, text: str) -> dict[str, Any]:
        history = (*self.session.history, Message.user(text))
        if self.wire == "openai":
            return {"model": "emulator", "messages": to_openai(history), "stream": False}
        system, messages = to_anthropic(history)
        body: dict[str, Any] = {"model": "emulator", "max_tokens": self.max_tokens,
                                "messages": messages, "stream": False}
        if system:
            body["system"] = system
        return body

    def bare(self) -> Callable[[], object]:
        """The bare call on the session's current messages (dicts built beforehand)."""
        payload = self.payload(self.text())
        if self.wire == "openai":
            return lambda: self.client.chat.completions.create(**payload)
        return lambda: self.client.messages.create(**payload)

    def floor(self) -> Callable[[], object]:
        payload = self.payload(self.text())
        headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}",
                   "x-api-key": KEY, "anthropic-version": "2023-06-01"}
        http = httpx2.Client(timeout=600)

        def run() -> object:
            body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
            return http.post(self.url, content=body, headers=headers).read()
        return run


def run_case(wire: str, emu: RemoteEmulator, key: str, total: int, count: int, repeat: int,
             counter: dict[str, int], *, floor: bool, memory: bool,
             min_seconds: float = 0.0) -> None:
    history = conversation(total, count)
    case = Case(wire, emu, history, f"bench-{wire}-{key}")
    try:
        # The bare call's dicts are built beforehand, outside either call's time, from
        # the session's current messages (so both send the same history).
        bare_calls: list[Callable[[], object]] = [case.bare()]

        def bare() -> object:
            return bare_calls[-1]()

        def next_bare() -> None:
            bare_calls[-1] = case.bare()

        before, files_before = counter["sdk"], FILES["files"]
        t_session, t_bare, runs = median_pair(case.session_turn, bare, repeat,
                                              min_seconds=min_seconds, after=next_bare)
        files = (FILES["files"] - files_before) / (runs + 1)
        body = len(json.dumps(case.payload("x"), ensure_ascii=False).encode())
        sdk_runs = counter["sdk"] - before - (runs + 1)   # less the bare calls' own
        print(f"{wire} {key} ({count:,} msgs, {body / 1e6:.2f} MB): session "
              f"{t_session * 1e3:.1f} ms (of which {files * 1e3:.1f} ms persisting the "
              f"history and learned limits), bare SDK {t_bare * 1e3:.1f} ms; the SDK's request pipeline "
              f"ran {max(sdk_runs, 0)} times in {runs + 1} session turns")
        print(f"ratio session/bare {wire} {key}: {t_session / t_bare:.2f} "
              f"(without persisting {(t_session - files) / t_bare:.2f})")
        if floor:
            run_floor = case.floor()
            t_floor = statistics.median(
                [_timed(run_floor) for _ in range(repeat + 1)][1:] or [_timed(run_floor)])
            print(f"ratio session/floor {wire} {key}: {t_session / t_floor:.2f} "
                  f"(bare/floor {t_bare / t_floor:.2f}; floor {t_floor * 1e3:.1f} ms)")
        if memory:
            mb = body / 1e6
            peak_s, kept_s = _memory(case.session_turn)
            peak_b, _ = _memory(case.bare())       # its payload built beforehand
            print(f"memory {wire} {key}: a session turn peaks at {peak_s / 1e6:.1f} MB and "
                  f"keeps {kept_s / 1e6:.2f} MB; a bare call peaks at {peak_b / 1e6:.1f} MB")
            print(f"ratio memory {wire} {key}: session peak/bare peak {peak_s / peak_b:.2f}, "
                  f"session peak per MB of history {peak_s / 1e6 / mb:.2f}")
    finally:
        case.close()


ASCII_LINE = "The service log shows a cache timeout at 12:04 - retry with backoff, ok. "


def steady_memory(wire: str, emu: RemoteEmulator, total: int, *, ascii_only: bool) -> None:
    """RAM a session keeps for its history once resumed and a few turns on (``tracemalloc``,
    this process), against the encoded history and against the same messages held as the
    plain dicts a bare SDK caller keeps. A str with any character past Latin-1 takes 2
    bytes a character in CPython (the default text has a "—" and a "✓"), so both texts."""
    history = conversation(total, 50, line=ASCII_LINE if ascii_only else None)
    label = "ascii" if ascii_only else "multibyte"
    name = f"bench-mem-{wire}-{label}"
    files = Transcript(name)
    files.create()
    files.save_history(history)
    files.release()           # written: the session below is its one writer
    payload = json.dumps(to_openai(history) if wire == "openai" else to_anthropic(history)[1],
                         ensure_ascii=False)
    body = len(payload.encode())
    del history
    cls = openai.OpenAI if wire == "openai" else anthropic.Anthropic
    base = emu.openai_base_url if wire == "openai" else emu.anthropic_base_url
    client = cls(base_url=base, api_key=KEY)
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        dicts = json.loads(payload)          # what a bare caller holds: fresh strings and dicts
        plain = tracemalloc.get_traced_memory()[0] - start
        del dicts
        gc.collect()
        start, _ = tracemalloc.get_traced_memory()
        session = ChatSession.resume(name, model=f"{wire}:emulator", client=client,
                                     settings=Settings(context_window=10_000_000),
                                     builtin_tools=False)
        for turn in range(3):
            session.send(f"[memory turn {turn}] and what next?", stream=False)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    session.close()
    client.close()
    mb = body / 1e6
    print(f"memory steady {wire} {label}: a session on a {mb:.2f} MB history keeps "
          f"{kept / 1e6:.2f} MB after 3 turns; the same messages as plain dicts take "
          f"{plain / 1e6:.2f} MB")
    print(f"ratio memory steady {wire} {label}: {kept / 1e6 / mb:.2f} MB per MB of history "
          f"(plain dicts {plain / 1e6 / mb:.2f}); session/plain dicts {kept / plain:.2f}")


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _memory(fn: Callable[[], object]) -> tuple[int, int]:
    """(peak bytes allocated during ``fn``, bytes still allocated after it)."""
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        result = fn()
        del result
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, after - base


def time_snapshot_files(counter: dict[str, float]) -> None:
    """Time the session's persistence of its history and learned limits
    (``Transcript.save_history``: a journal line per turn, history.json only on compaction,
    undo, reset or close; ``save_learned``: learned.json only on a real change)."""
    from ipy_ctxrecovery.session.store import Transcript

    for name in ("save_history", "save_learned"):
        original = getattr(Transcript, name)

        def timed(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return __original(self, *args, **kwargs)
            finally:
                counter["files"] += time.perf_counter() - start

        setattr(Transcript, name, timed)


def count_sdk_pipeline(counter: dict[str, int]) -> None:
    """Count the SDK's create() calls (the request pipeline) on both wires (Anthropic's
    beta resource too: a request that asks the server to compact goes through it)."""
    from anthropic.resources.beta.messages import Messages as BetaMessages
    from anthropic.resources.messages import Messages
    from openai.resources.chat.completions import Completions

    for cls in (Completions, Messages, BetaMessages):
        original = cls.create

        def counted(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            counter["sdk"] += 1
            return __original(self, *args, **kwargs)

        cls.create = counted  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small histories, 2 runs each (for tests/test_bench.py)")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--cases", default=None, help=f"some of {','.join(CASES)}")
    parser.add_argument("--wires", default="openai,anthropic")
    parser.add_argument("--min-seconds", type=float, default=3.0,
                        help="run each case's pairs for at least this long (default 3)")
    args = parser.parse_args(argv)
    table = QUICK if args.quick else CASES
    names = [c.strip() for c in (args.cases or ",".join(table)).split(",") if c.strip()]
    unknown = [c for c in names if c not in {**CASES, **QUICK}]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}; choose from {', '.join(CASES)}")
    repeat = args.repeat or (2 if args.quick else 7)
    counter = {"sdk": 0}
    count_sdk_pipeline(counter)
    time_snapshot_files(FILES)
    print(f"overhead: median of {repeat} runs per figure, session and bare call interleaved")
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        with RemoteEmulator(context_window=50_000_000) as emu:
            for wire in [w.strip() for w in args.wires.split(",") if w.strip()]:
                for key in names:
                    total, count = {**CASES, **QUICK}[key]
                    special = key == "5MB" or (args.quick and key == "1MB")
                    run_case(wire, emu, key, total, count, repeat, counter,
                             floor=special, memory=special,
                             min_seconds=0.0 if args.quick else args.min_seconds)
                steady = QUICK["1MB"][0] if args.quick else CASES["5MB"][0]
                for ascii_only in (True, False):
                    steady_memory(wire, emu, steady, ascii_only=ascii_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
