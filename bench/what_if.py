"""How long ``session.what_if`` takes on long histories (figures, no verdict).

Histories cycle: a user question, an assistant tool call, a tool result of
``--result-chars`` (20,000 by default, so 1,000 messages ≈ 5 MB), an assistant answer.
They are written as a saved session and reopened with ``ChatSession.resume`` on the
emulator (OpenAI wire); nothing is sent. For each size, three what-ifs:

- ``cold``: the first what-if on the reopened session (no message measured before);
- ``warm``: the same settings again (what a slider sees after its first move);
- ``compact``: a cap at a third of the body, so pre-flight compacts and an (estimated)
  LLM summary folds the oldest messages — the most work a what-if does.

Run: ``python bench/what_if.py`` (``--sizes 100,1000,10000``, ``--repeat 3``,
``--result-chars 20000``). Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ipy_ctxrecovery import ChatSession, Message
from ipy_ctxrecovery.core.budget import ResultStore
from ipy_ctxrecovery.core.history import ToolCall
from ipy_ctxrecovery.core.microcompact import microcompact
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.session.store import Transcript, data_root
from ipy_ctxrecovery.settings import Settings, format_size


def history(messages: int, result_chars: int) -> tuple[Message, ...]:
    """A long session's working history: each cycle a pasted question, a tool call, its
    result and a long answer; older results already shrunk by microcompact, as the
    session's own earlier turns would have left them."""
    out: list[Message] = [Message.system("You are a careful assistant.")]
    line = "2026-01-01T00:00:00 svc{s} GET /api/items/{n} 200 {ms} ms\n"
    paste = "Traceback (most recent call last):\n  File \"app.py\", line 12, in handler\n" * 100
    answer = "The handler retries the request without a timeout; set one and log the id.\n"
    n = 0
    while len(out) < messages:
        call = ToolCall(f"call_{n}", "fetch_logs", f'{{"service": "svc{n}"}}')
        body = "".join(line.format(s=n, n=k, ms=k % 97) for k in range(result_chars // 48 + 1))
        out += [Message.user(f"[turn {n}] Why does svc{n} fail?\n" + paste),
                Message.assistant("", [call]),
                Message.tool(call.id, body[:result_chars], name="fetch_logs"),
                Message.assistant(answer * 140)]
        n += 1
    aged, _ = microcompact(tuple(out[:messages]), settings=Settings(),
                           store=ResultStore(data_root() / "bench-results"))
    return aged


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times: list[float] = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--result-chars", type=int, default=20_000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-what-if-") as root, \
            Emulator(context_window=2_000_000) as emu:
        os.environ["IPY_CTXRECOVERY_DIR"] = root
        print(f"{'messages':>9} {'history':>9} {'cold':>9} {'warm':>9} {'compact':>9}  "
              "fates (compact)")
        for n in sizes:
            name = f"bench-{n}"
            files = Transcript(name)
            files.create()        # a saved session: its files exist
            files.save_history(history(n, args.result_chars))
            files.release()        # the session resumed on them is their writer
            session = ChatSession.resume(name, model="emulator", emulator=emu)
            start = time.perf_counter()
            first = session.what_if(text="next question")
            cold = time.perf_counter() - start
            warm, _ = timed(functools.partial(session.what_if, text="next question"),
                            args.repeat)
            cap = max(16_384, first.after_bytes // 3)
            compact, plan = timed(functools.partial(session.what_if, text="next question",
                                                    cap=cap), args.repeat)
            fates = ", ".join(f"{k.value} {v}" for k, v in plan.fates.items())
            print(f"{n:>9,} {format_size(first.before_bytes):>9} {cold * 1000:>7.1f}ms "
                  f"{warm * 1000:>7.1f}ms {compact * 1000:>7.1f}ms  {fates}")
            print(f"ratio what_if n={n}: warm/100ms {warm / 0.1:.2f} cold/100ms {cold / 0.1:.2f} "
                  f"compact/100ms {compact / 0.1:.2f}")
            session.close()


if __name__ == "__main__":
    main()
