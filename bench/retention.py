"""Benchmark: what a notebook's pauses cost, by cache retention, on both wires.

Run: ``python bench/retention.py`` (``--turns 60``, ``--wires anthropic,openai``).

A notebook user does not chat 30 seconds apart: between two ``%%chat`` cells they read the
answer, run code, look at a plot. The conversation here is one deterministic notebook
session — each turn pastes 1–4 KB (a traceback, a frame's ``describe()``, a log excerpt)
and asks about it — sent through a :class:`ChatSession` against the emulator, whose clock
the bench moves: most turns 20–90 s apart, one in six after a pause of 8–25 minutes (past
the 5-minute cache), and one lunch break of two hours (past the hour too).

Each ``cache_retention`` setting runs the same session, and so does ``today``: the client
before issue 28 (``prompt_caching=off``: no Anthropic breakpoint, no OpenAI key or
retention):

* Anthropic: ``short`` (5-minute entries), ``long`` (1-hour entries, written at 2×
  input), ``auto`` (5-minute entries until the session's pauses make 1-hour ones pay,
  ``core.caching.long_ttl_pays``);
* OpenAI: ``short`` (``prompt_cache_retention="in_memory"``: 5 minutes in the emulator),
  ``long`` (``"24h"``), ``auto`` (nothing sent: the API's default, which is a day for an
  organization without zero data retention and in-memory with it; the emulator's is
  in-memory, so here ``auto`` costs what ``short`` does).

The figures are the emulator's own usage, as the session reports it (every request: the
turns and any summary request): input tokens weighted as billed (cached reads 0.1×,
Anthropic writes 1.25× for 5 minutes and 2× for an hour, OpenAI writes as input), the share
read from cache, and the input cost in USD at ``--price-model``'s list price (Claude Sonnet
4.6 and GPT-5.4 by default; the emulator itself bills nothing). Printed last: each
setting's cost against ``short`` and against ``today``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ipy_ctxrecovery import ChatSession, Emulator, Settings
from ipy_ctxrecovery.core import caching, prices
from ipy_ctxrecovery.providers.base import Usage

CHOICES = {"anthropic": ("today", "short", "long", "auto"),
           "openai": ("today", "short", "long", "auto")}
TODAY = {"prompt_caching": False}
"""The client before issue 28: no breakpoint (Anthropic), no key, no retention."""
PRICE_MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5.4"}
SYSTEM = ("You help a data scientist in a Jupyter notebook: read what they paste, explain "
          "it, and suggest the next cell to run. ") * 12


def pauses(turns: int, seed: int = 7) -> list[float]:
    """Seconds before each turn: 20–90 s, one in six 8–25 minutes, one of two hours."""
    rng = random.Random(seed)
    gaps = [rng.uniform(20, 90) if rng.random() > 1 / 6 else rng.uniform(480, 1500)
            for _ in range(turns)]
    gaps[0] = 0.0
    if turns > 10:
        gaps[turns * 2 // 3] = 7_200.0
    return gaps


def paste(i: int) -> str:
    """Turn ``i``'s message: a question and a 1–4 KB paste."""
    rng = random.Random(i)
    rows = "\n".join(f"{rng.choice(['count', 'mean', 'std', 'min', 'max'])}_{n}  "
                     f"{rng.uniform(0, 1e4):12.3f}  {rng.uniform(0, 1):.4f}"
                     for n in range(rng.randint(30, 120)))
    return f"Cell {i}: what does this say, and what should I look at next?\n{rows}"


@dataclass
class Figures:
    weighted: float = 0.0
    prompt: int = 0
    cached: int = 0
    written: int = 0
    written_1h: int = 0
    usd: float = 0.0

    def add(self, usage: Usage, model: str) -> None:
        prompt = usage.prompt_tokens or 0
        long = usage.cache_write_1h_tokens
        short = usage.cache_write_tokens - long
        uncached = prompt - usage.cached_tokens - usage.cache_write_tokens
        self.weighted += (usage.cached_tokens * caching.READ_SHARE + uncached
                          + short * caching.WRITE_SHARE["5m"]
                          + long * caching.WRITE_SHARE["1h"])
        self.prompt += prompt
        self.cached += usage.cached_tokens
        self.written += usage.cache_write_tokens
        self.written_1h += long
        cost = prices.estimate(model, Usage(prompt, 0, usage.cached_tokens,
                                            usage.cache_write_tokens,
                                            cache_write_1h_tokens=long))
        self.usd += cost.input if cost is not None else 0.0


def run(wire: str, choice: str, turns: int, price_model: str) -> Figures:
    """One session under ``cache_retention=choice``, on the bench's clock."""
    clock = [1_000.0]
    figures = Figures()
    model = "emulator:anthropic" if wire == "anthropic" else "emulator"
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp, \
            Emulator(context_window=200_000, clock=lambda: clock[0], keep_requests=8) as emu:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        session = ChatSession(model, emulator=emu, system=SYSTEM, files_root=Path(tmp),
                              settings=Settings(**TODAY) if choice == "today"
                              else Settings(cache_retention=choice), builtin_tools=False,
                              clock=lambda: clock[0])
        try:
            for i, gap in enumerate(pauses(turns)):
                clock[0] += gap
                figures.add(session.send(paste(i), stream=False).usage, price_model)
        finally:
            session.close()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--wires", default="anthropic,openai")
    args = parser.parse_args(argv)
    wires = args.wires.split(",")
    for name in wires:
        if name not in CHOICES:
            parser.error(f"unknown wire {name!r}; use anthropic or openai")
    gaps = pauses(args.turns)
    medium = sum(1 for g in gaps if 300 <= g < 3600)
    print(f"{args.turns} turns; pauses: {medium} of 5-60 minutes, "
          f"{sum(1 for g in gaps if g >= 3600)} past the hour; "
          f"{sum(gaps) / 3600:.1f} hours in all")
    for wire in wires:
        price_model = PRICE_MODELS[wire]
        results = {choice: run(wire, choice, args.turns, price_model)
                   for choice in CHOICES[wire]}
        print(f"== {wire} (input priced as {price_model})")
        for choice, f in results.items():
            share = f.cached / f.prompt if f.prompt else 0.0
            print(f"  {choice:<5} {f.weighted:>11,.0f} weighted input tokens of {f.prompt:>9,} "
                  f"({share:.0%} read from cache; {f.written:,} written, {f.written_1h:,} "
                  f"of them for an hour) ${f.usd:.3f}")
        base, today = results["short"].weighted, results["today"].weighted
        for choice, f in results.items():
            if choice not in ("short", "today"):
                print(f"ratio {wire} {choice}/short: {f.weighted / base:.2f}")
        for choice, f in results.items():
            if choice != "today":
                print(f"ratio {wire} {choice}/today: {f.weighted / today:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
