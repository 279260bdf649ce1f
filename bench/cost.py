"""Benchmark: cache-weighted input cost of a long session, three clients, both wires.

Run: ``python bench/cost.py`` (``--turns 100``, ``--wires openai,anthropic``,
``--kinds tools,plain``, ``--window 200000``).

One deterministic conversation per kind — ``tools``: each turn asks for a log part and the
emulator calls a tool returning 5–20 KB; ``plain``: 1–3 KB messages, no tools — is sent
through a :class:`ChatSession` against the emulator, by three clients:

* ``today``: rewrites of old messages at once, every turn (``microcompact_clear_at_least=0``:
  main's behaviour); on the Anthropic wire no ``cache_control`` breakpoint, so nothing
  is read from cache (main sends none);
* ``batched``: this package's defaults (rewrites batched, ``docs/caching.md``);
* ``append-only``: never rewrites an old message (microcompact ages out of reach); it still
  compacts when the window is full ("as far as the window lets it").

From the request bodies the emulator received (every request: turns, tool rounds, summary
requests), input tokens (body bytes / 4) are weighted as billed:

* OpenAI: the longest prefix shared with the previous request (tools, then each message),
  cached past the first 1,024 tokens in 128-token steps, at 0.1×; the rest at 1×.
* Anthropic: breakpoints assumed at the end of the tools, of the system prompt and of the
  last message (what h/cachewire adds; so the bench stands alone). A request reads the
  longest prefix ending at a breakpoint an earlier request wrote (the last-message
  breakpoint looks back 20 blocks) at 0.1×, and writes the rest at 1.25×; below 1,024
  tokens nothing is cached.

Printed per wire and kind: each client's weighted input tokens, its cached share, its
compactions; then the ratios against the goals (≤ 0.5× today; within 10% of append-only;
OpenAI cacheable prefix ≥ 95% of append-only's share; Anthropic ≥ 80% of input from cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipy_ctxrecovery import ChatSession, Emulator, Settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_vs_blind import filler  # noqa: E402

BYTES_PER_TOKEN = 4
MIN_CACHE_TOKENS = 1_024
OPENAI_STEP = 128
READ, WRITE = 0.1, 1.25
LOOKBACK = 20

CLIENTS = {
    "today": {"microcompact_clear_at_least": 0},
    "batched": {},
    "append-only": {"microcompact_truncate_turns": 10**6, "microcompact_summarize_turns": 10**6},
}


def fetch_log(part: int) -> str:
    """Return one part of the service log."""
    return filler(5_000 + (part * 7919) % 15_001, part)


def user_text(kind: str, i: int) -> str:
    if kind == "tools":
        return f"[turn {i}] what failed in log part {i}? [[tool fetch_log {{\"part\": {i}}}]]"
    return f"[turn {i}] here are my notes, keep them in mind:\n" + filler(1_000 + (i * 337) % 2_001,
                                                                           i)


def tokens(chars: int) -> int:
    return chars // BYTES_PER_TOKEN


def blocks(body: dict[str, Any]) -> list[str]:
    """The cacheable units of a body, in prompt order: tools, system, each message."""
    out = [json.dumps(body.get("tools") or [], sort_keys=True)]
    if "system" in body or "/messages" in body.get("_path", ""):
        out.append(json.dumps(body.get("system") or "", sort_keys=True))
    out += [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in body["messages"]]
    return out


@dataclass
class Meter:
    """Cache-weighted input tokens of a stream of request bodies, one wire."""

    wire: str
    breakpoints: bool = True
    total: int = 0
    cached: int = 0
    written: int = 0
    weighted: float = 0.0
    requests: int = 0
    _previous: str = ""
    _entries: set[str] = field(default_factory=set)

    def add(self, body: dict[str, Any]) -> None:
        parts = blocks(body)
        self.requests += 1
        if self.wire == "openai":
            self._openai("".join(parts))
        else:
            self._anthropic(parts)

    def _openai(self, text: str) -> None:
        total = tokens(len(text))
        shared = tokens(len(os.path.commonprefix([self._previous, text])))
        cached = 0 if shared < MIN_CACHE_TOKENS else \
            MIN_CACHE_TOKENS + (shared - MIN_CACHE_TOKENS) // OPENAI_STEP * OPENAI_STEP
        self._previous = text
        self.total += total
        self.cached += cached
        self.weighted += cached * READ + (total - cached)

    def _anthropic(self, parts: list[str]) -> None:
        sizes, hashes, h, size = [], [], hashlib.sha1(), 0
        for p in parts:
            h.update(p.encode("utf-8", "surrogatepass"))
            size += len(p)
            sizes.append(tokens(size))
            hashes.append(h.copy().hexdigest())
        total = sizes[-1]
        self.total += total
        n = len(parts)
        if not self.breakpoints or total < MIN_CACHE_TOKENS:
            self.weighted += total
            return
        # Breakpoints after the tools, the system prompt and the last message.
        marks = sorted({0, min(1, n - 1), n - 1})
        candidates = set(marks[:-1]) | set(range(max(0, n - 1 - LOOKBACK), n))
        read = max((sizes[k] for k in candidates if hashes[k] in self._entries), default=0)
        written = total - read
        self.cached += read
        self.written += written
        self.weighted += read * READ + written * WRITE
        self._entries.update(hashes[k] for k in marks if sizes[k] >= MIN_CACHE_TOKENS)


def run(wire: str, kind: str, client: str, turns: int, window: int) -> tuple[Meter, int]:
    model = "emulator" if wire == "openai" else "emulator:anthropic"
    settings = Settings(context_window=window, **CLIENTS[client])
    meter = Meter("openai" if wire == "openai" else "anthropic",
                  breakpoints=client != "today")
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp, \
            Emulator(context_window=window, keep_requests=256,
                     keep_body_bytes="512MB") as emu:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        session = ChatSession(model, emulator=emu, settings=settings,
                              system="You are a careful assistant who reads logs.",
                              tools=[fetch_log] if kind == "tools" else [],
                              builtin_tools=False, files_root=Path(tmp))
        try:
            for i in range(turns):
                session.send(user_text(kind, i), stream=False)
                for record in emu.requests:
                    body = record.body
                    if body is not None and record.status == 200:
                        body["_path"] = record.path
                        meter.add(body)
                emu.reset()
            compactions = session.status().compactions
        finally:
            session.close()
    return meter, compactions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--wires", default="openai,anthropic")
    parser.add_argument("--kinds", default="tools,plain")
    parser.add_argument("--window", type=int, default=200_000)
    args = parser.parse_args(argv)
    wires, kinds = args.wires.split(","), args.kinds.split(",")
    for name in wires:
        if name not in ("openai", "anthropic"):
            parser.error(f"unknown wire {name!r}; use openai or anthropic")
    for name in kinds:
        if name not in ("tools", "plain"):
            parser.error(f"unknown kind {name!r}; use tools or plain")
    for wire in wires:
        for kind in kinds:
            print(f"== {wire} {kind}: {args.turns} turns, {args.window:,}-token window")
            meters: dict[str, Meter] = {}
            fits = True
            for client in CLIENTS:
                meter, compactions = run(wire, kind, client, args.turns, args.window)
                meters[client] = meter
                if client == "append-only":
                    fits = compactions == 0
                share = meter.cached / meter.total if meter.total else 0.0
                print(f"  {client:<11} {meter.weighted:>13,.0f} weighted input tokens of "
                      f"{meter.total:>11,} ({share:.0%} read from cache, "
                      f"{meter.requests} requests, {compactions} compactions)")
            today, ours, append = (meters[c] for c in CLIENTS)
            print(f"ratio {wire} {kind} batched/today: {ours.weighted / today.weighted:.2f} "
                  "(goal ≤ 0.50)")
            print(f"ratio {wire} {kind} batched/append-only: "
                  f"{ours.weighted / append.weighted:.2f} (goal ≤ 1.10"
                  f"{'' if fits else '; append-only compacted: it does not fit'})")
            ours_share = ours.cached / ours.total if ours.total else 0.0
            append_share = append.cached / append.total if append.total else 0.0
            if wire == "openai":
                ratio = ours_share / append_share if append_share else float("nan")
                print(f"ratio {wire} {kind} cached share batched/append-only: {ratio:.2f} "
                      f"({ours_share:.0%} vs {append_share:.0%}; goal ≥ 0.95)")
            else:
                print(f"ratio {wire} {kind} input read from cache: {ours_share:.2f} "
                      "(goal ≥ 0.80)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
