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
requests), input tokens (body bytes / 4) are weighted as billed, on the bench's clock
(turns ``--gap`` 30 s apart, and a ``--pause`` of 360 s before the middle turn: past both
providers' 5-minute TTL, so every client loses its cache once, and the session's idle rule
sees the same clock):

* OpenAI: the longest prefix shared with any recent request (one used in the last 5
  minutes; tools, then each message, then the characters of the first message that
  differs), cached past the first 1,024 tokens in 128-token steps, at 0.1×; the rest at 1×.
* Anthropic: the ``cache_control`` breakpoints the body carries (none for ``today``: main
  sent none), per block (each tool, system block, content block; ``cache_control`` left
  out of the key). A request reads the furthest entry found at a breakpoint or the 20
  blocks before it (0.1×), writes up to its last breakpoint (1.25×), and pays the rest in
  full; an entry lives 5 minutes after its last read or write; below 1,024 tokens nothing
  is cached (the emulator's own rules, ``emulator/cache.py``, metered independently).

Printed per wire and kind: each client's weighted input tokens, its cached share, its
compactions and the tokens it sent for the first time; then the ratios against the goals
(≤ 0.5× today; within 10% of append-only; OpenAI cacheable prefix ≥ 95% of append-only's
share; Anthropic ≥ 80% of input from cache); the share of repeated input (tokens an earlier
request carried) read from cache; and the floor no cache lowers: first-time tokens in full,
every other token read at 0.1×.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipy_ctxrecovery import ChatSession, Emulator, Settings
from ipy_ctxrecovery.core import caching

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_vs_blind import filler  # noqa: E402

BYTES_PER_TOKEN = 4
MIN_CACHE_TOKENS = caching.min_cacheable_tokens("emulator")
READ, WRITE = 0.1, 1.25
LOOKBACK = caching.LOOKBACK_BLOCKS
KEEP_PROMPTS = 32

CLIENTS = {
    "today": {"microcompact_clear_at_least": 0, "prompt_caching": False},
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


def _plain(value: Any) -> str:
    """A block as the cache keys it: its JSON without ``cache_control``."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "cache_control"}
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def units(body: dict[str, Any], wire: str) -> tuple[list[str], list[str | None]]:
    """The cacheable units of a body in prompt order, and the TTL of the breakpoint each
    carries (None: none).

    OpenAI: the tools (one unit), then each message whole. Anthropic: each tool, each
    ``system`` block, each content block of each message (a string content is one; the
    first block of a message also carries its role): the API's blocks, which the 20-block
    lookback counts.
    """
    if wire == "openai":
        out = [_plain(body.get("tools") or [])]
        out += [_plain(m) for m in body["messages"]]
        return out, [None] * len(out)
    out: list[str] = []
    marks: list[str | None] = []

    def add(text: str, block: Any) -> None:
        out.append(text)
        control = block.get("cache_control") if isinstance(block, dict) else None
        marks.append(control.get("ttl", caching.DEFAULT_TTL) if control else None)

    for tool in body.get("tools") or []:
        add("tool:" + _plain(tool), tool)
    system = body.get("system")
    for part in ([system] if isinstance(system, str) else system or []):
        add("system:" + _plain(part), part)
    for m in body["messages"]:
        content = m.get("content")
        blocks_ = [content] if isinstance(content, str) else content or [""]
        for i, block in enumerate(blocks_):
            add((f"{m.get('role')}:" if i == 0 else "") + _plain(block), block)
    return out, marks


@dataclass
class Meter:
    """Cache-weighted input tokens of a stream of request bodies, one wire.

    ``now`` is the bench's clock (seconds) when a body is added: an OpenAI prefix stays
    cached for its ``prompt_cache_retention`` after its last use (in memory,
    ``caching.OPENAI_CACHE_TTL``, when none is sent), an Anthropic entry its breakpoint's
    ``ttl`` (5 minutes, or 1 hour written at 2×) after its last read or write.
    """

    wire: str
    breakpoints: bool = True
    total: int = 0
    cached: int = 0
    written: int = 0
    weighted: float = 0.0
    requests: int = 0
    new: int = 0
    """Tokens past the longest prefix any earlier request carried: what any client pays
    uncached once (OpenAI)."""
    fresh: int = 0
    """Tokens of units (messages, blocks) no earlier request carried anywhere: sent for
    the first time, so billed uncached by any cache (each turn's new tool result, a
    preview or a summary when it first appears)."""
    _recent: list[tuple[float, list[str], list[int], float]] = field(default_factory=list)
    _entries: dict[str, tuple[float, float]] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)

    def add(self, body: dict[str, Any], now: float = 0.0) -> None:
        parts, marks = units(body, self.wire)
        self.requests += 1
        for p in parts:
            key = hash(p)
            if key not in self._seen:
                self._seen.add(key)
                self.fresh += tokens(len(p))
        if self.wire == "openai":
            retention = body.get("prompt_cache_retention") or "in_memory"
            self._openai(parts, now, caching.OPENAI_RETENTION_TTLS[retention])
        else:
            self._anthropic(parts, marks, now)

    def _openai(self, parts: list[str], now: float, life: float) -> None:
        ends, size = [], 0
        for p in parts:
            size += len(p)
            ends.append(size)
        total = tokens(size)
        live = [r for r in self._recent if now - r[0] < r[3]]
        shared = 0
        for _, prev, prev_ends, _life in live:
            n = 0
            while n < len(prev) and n < len(parts) and prev[n] == parts[n]:
                n += 1
            chars = prev_ends[n - 1] if n else 0
            if n < len(prev) and n < len(parts):
                chars += len(os.path.commonprefix([prev[n], parts[n]]))
            shared = max(shared, chars)
        cached = caching.openai_cached_tokens(tokens(shared))
        self._recent = (live + [(now, parts, ends, life)])[-KEEP_PROMPTS:]
        self.total += total
        self.cached += cached
        self.new += total - tokens(shared)
        self.weighted += cached * READ + (total - cached)

    def _anthropic(self, parts: list[str], marks: list[str | None], now: float) -> None:
        sizes, hashes, h, size = [], [], hashlib.sha1(), 0
        for p in parts:
            h.update(p.encode("utf-8", "surrogatepass"))
            size += len(p)
            sizes.append(tokens(size))
            hashes.append(h.copy().hexdigest())
        total = sizes[-1] if sizes else 0
        self.total += total
        at = [i for i, m in enumerate(marks) if m]
        if not self.breakpoints or not at:
            self.weighted += total
            return
        self._entries = {k: e for k, e in self._entries.items() if e[0] > now}
        read_at = -1
        for mark in at:
            for j in range(mark, max(-1, mark - LOOKBACK - 1), -1):
                if hashes[j] in self._entries:
                    read_at = max(read_at, j)
                    break
        read = sizes[read_at] if read_at >= 0 else 0
        if read_at >= 0:
            life = self._entries[hashes[read_at]][1]
            self._entries[hashes[read_at]] = (now + life, life)
        done, cost = read, 0.0
        for mark in at:
            if sizes[mark] < MIN_CACHE_TOKENS:
                continue
            ttl = marks[mark] or caching.DEFAULT_TTL
            life = caching.CACHE_TTLS[ttl]
            self._entries[hashes[mark]] = (now + life, life)
            if sizes[mark] > done:
                cost += (sizes[mark] - done) * caching.WRITE_SHARE[ttl]
                done = sizes[mark]
        written = done - read
        self.cached += read
        self.written += written
        self.weighted += read * READ + cost + (total - done)


def run(wire: str, kind: str, client: str, turns: int, window: int, *, gap: float = 30.0,
        pause: float = 0.0, trace: Callable[[int, dict[str, Any], float], None] | None = None,
        retention: str = "auto") -> tuple[Meter, int]:
    """One client's session: turn ``i`` starts ``gap`` seconds after turn ``i-1`` (on the
    bench's clock, which the session's idle rule reads too), and the turn halfway waits
    ``pause`` seconds more (0: none)."""
    model = "emulator" if wire == "openai" else "emulator:anthropic"
    # today's client predates cache_retention: it sends none.
    extra = {} if client == "today" else {"cache_retention": retention}
    settings = Settings(context_window=window, **{**CLIENTS[client], **extra})
    meter = Meter("openai" if wire == "openai" else "anthropic",
                  breakpoints=client != "today")
    clock = [1_000.0]
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp, \
            Emulator(context_window=window, keep_requests=256,
                     keep_body_bytes="512MB") as emu:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        session = ChatSession(model, emulator=emu, settings=settings,
                              system="You are a careful assistant who reads logs.",
                              tools=[fetch_log] if kind == "tools" else [],
                              builtin_tools=False, files_root=Path(tmp))
        session._preparer.clock = lambda: clock[0]  # the bench's time, for the idle rule
        try:
            for i in range(turns):
                clock[0] += gap + (pause if pause and i == turns // 2 else 0.0)
                session.send(user_text(kind, i), stream=False)
                for n, record in enumerate(emu.requests):
                    body = record.body
                    if body is not None and record.status == 200:
                        meter.add(body, clock[0] + n)
                        if trace is not None:
                            trace(i, body, clock[0] + n)
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
    parser.add_argument("--gap", type=float, default=30.0,
                        help="seconds between two turns on the bench's clock")
    parser.add_argument("--retention", default="auto", choices=("auto", "short", "long"),
                        help="cache_retention of the batched and append-only clients")
    parser.add_argument("--pause", type=float, default=360.0,
                        help="seconds more before the middle turn (past the 5-minute TTL; 0: none)")
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
            print(f"== {wire} {kind}: {args.turns} turns, {args.window:,}-token window, "
                  f"{args.gap:g} s apart, a {args.pause:g} s pause before turn {args.turns // 2}")
            meters: dict[str, Meter] = {}
            fits = True
            for client in CLIENTS:
                meter, compactions = run(wire, kind, client, args.turns, args.window,
                                         gap=args.gap, pause=args.pause,
                                         retention=args.retention)
                meters[client] = meter
                if client == "append-only":
                    fits = compactions == 0
                share = meter.cached / meter.total if meter.total else 0.0
                print(f"  {client:<11} {meter.weighted:>13,.0f} weighted input tokens of "
                      f"{meter.total:>11,} ({share:.0%} read from cache, "
                      f"{meter.requests} requests, {compactions} compactions, "
                      f"{meter.fresh:,} sent for the first time)")
            today, ours, append = (meters[c] for c in CLIENTS)
            print(f"ratio {wire} {kind} batched/today: {ours.weighted / today.weighted:.2f} "
                  "(goal ≤ 0.50)")
            print(f"ratio {wire} {kind} batched/append-only: "
                  f"{ours.weighted / append.weighted:.2f} (goal ≤ 1.10"
                  f"{'' if fits else '; append-only compacted: it does not fit'})")
            ours_share = ours.cached / ours.total if ours.total else 0.0
            append_share = append.cached / append.total if append.total else 0.0
            for name in ("batched", "append-only"):
                m = meters[name]
                repeated = m.total - m.fresh
                print(f"repeated input read from cache {wire} {kind} {name}: "
                      f"{m.cached / repeated if repeated else 0.0:.2f} (of {repeated:,} tokens "
                      "an earlier request carried)")
            # What no cache can lower: each token sent for the first time is billed in full
            # (Anthropic: written, 1.25x), every other token read at 0.1x.
            first = WRITE if wire == "anthropic" else 1.0
            floor = ours.fresh * first + (ours.total - ours.fresh) * READ
            print(f"floor {wire} {kind} batched, every repeated token read from cache: "
                  f"{floor:,.0f} = {floor / today.weighted:.2f}x today "
                  f"(first-time tokens alone: {ours.fresh * first / today.weighted:.2f}x)")
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
