"""Benchmark: bytes freed by our microcompact + tool-result budget vs ChatCLI's rule.

Run: ``python bench/microcompact_savings.py`` (``--turns 30``).

A long tool-heavy conversation is built turn by turn (a user request, one to three tool
calls with results of 5,000–60,000 chars, an assistant answer), and after each turn both
first lines of defence run over the history with default settings, as a session runs them
before every request:

* ours — ``microcompact.microcompact`` then ``budget.enforce_budget`` (``Settings()``);
* ChatCLI's — its microcompact (preview at 2+ turns, one-line summary at 4+ turns only for
  results still ≥ 3,000 chars, which a 2,500-char preview never is: ANCHORS weakness 9)
  and its budget, from ``chatcli_baseline``.

Printed: the history's wire size (OpenAI messages JSON) without any compaction, with ours
and with ChatCLI's; bytes freed by each; how many results were summarized to one line;
and the ratio of bytes freed, ours/ChatCLI. No LLM, no network.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ipy_ctxrecovery import Settings
from ipy_ctxrecovery.core import budget, microcompact
from ipy_ctxrecovery.core.history import History, Message, Role, ToolCall, to_openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chatcli_baseline import ChatCLIBaseline  # noqa: E402
from recovery_vs_blind import filler  # noqa: E402


def turn_messages(i: int) -> list[Message]:
    """Turn ``i``: a request, 1–3 tool calls with results of 5–60 KB, an answer."""
    calls = 1 + i % 3
    out = [Message.user(f"[turn {i}] look at the next logs and tell me what failed")]
    ids = [f"call_{i}_{k}" for k in range(calls)]
    out.append(Message.assistant("", tuple(ToolCall(c, "fetch_log", json.dumps({"part": c}))
                                           for c in ids)))
    for k, c in enumerate(ids):
        size = 5_000 + ((i * 7 + k * 13) * 7919) % 55_001
        out.append(Message.tool(c, filler(size, i * 10 + k), name="fetch_log"))
    out.append(Message.assistant(f"Turn {i}: the worker retried the cache socket. " * 6))
    return out


def wire_bytes(history: Sequence[Message]) -> int:
    return len(json.dumps(to_openai(history)).encode())


def one_liners(history: Sequence[Message], marker: str) -> int:
    return sum(1 for m in history if m.role is Role.TOOL and m.tool_result is not None
               and m.tool_result.content.startswith(marker))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args(argv)
    settings = Settings()
    raw: list[Message] = [Message.system("You are a careful assistant.")]
    ours: History = tuple(raw)
    chatcli = ChatCLIBaseline(cast(Any, None), model="emulator", window_tokens=10**9,
                              tools={}, tool_specs=[], system="You are a careful assistant.")
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        store = budget.ResultStore(Path(tmp) / "results")
        for i in range(args.turns):
            new = turn_messages(i)
            raw.extend(new)
            # Each side compacts before the request that follows the turn's tool results,
            # then the answer is appended, as in a session.
            ours = ours + tuple(new[:-1])
            ours, _ = microcompact.microcompact(ours, settings=settings, store=store)
            ours, _ = budget.enforce_budget(
                ours, store=store, turn_budget_chars=settings.turn_budget_chars,
                per_result_max_chars=settings.per_result_max_chars,
                head_chars=settings.budget_head_chars, tail_chars=settings.budget_tail_chars)
            ours = ours + (new[-1],)
            chatcli.history.extend(new[:-1])
            chatcli._microcompact()
            chatcli._budget(200_000, 20_000, current_turn_only=True)
            chatcli.history.append(new[-1])
    full = wire_bytes(raw)
    mine, theirs = wire_bytes(ours), wire_bytes(chatcli.history)
    results = sum(1 for m in raw if m.role is Role.TOOL)
    print(f"microcompact savings: {args.turns} turns, {results} tool results, "
          f"uncompacted history {full:,} bytes")
    print(f"  ours:    {mine:>11,} bytes kept, {full - mine:>11,} freed, "
          f"{one_liners(ours, '[Old tool result')} results summarized to one line")
    print(f"  chatcli: {theirs:>11,} bytes kept, {full - theirs:>11,} freed, "
          f"{one_liners(chatcli.history, '[Old tool result')} results summarized to one line")
    freed_ratio = (full - mine) / (full - theirs) if full != theirs else float("inf")
    print(f"ratio microcompact ours/chatcli: bytes freed {freed_ratio:.2f}, "
          f"bytes kept {mine / theirs:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
