"""Benchmark: the time a user waits per turn, with and without background compaction.

Run: ``python bench/latency.py`` (``--turns 60``, ``--latency 0.6``, ``--think 1.5``,
``--window 8000``).

The emulator answers every request after ``--latency`` seconds (the summary requests
too); the user thinks ``--think`` seconds between turns. The session knows an 8,000-token
window, so a long chat compacts every few turns. Two clients run the same conversation:

* ``today`` — ``background_compaction=False``: the turn that compacts waits for its summary
  request, then for its answer (today's main);
* ``background`` — the summary is prepared in a worker once the history passes
  ``prepare_summary_ratio`` of the trigger, and swapped in at the turn that needs room.

Printed for each: median and worst wait of the compacting turns (a summary applied or
swapped in) and of the plain ones, the ratio slowest compacting turn / median plain turn
(the goal: at most 1.3, against 2.1 today), the summary requests the emulator received and
the summaries applied (one prepared near the end may not have been needed yet).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.events import BackgroundSummary, CompactionPhase
from ipy_ctxrecovery.emulator import Emulator


def turn_text(i: int) -> str:
    return f"[turn {i}] " + "notes about the weekly revenue by region and segment " * 20


@dataclass
class Waits:
    name: str
    compacting: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    summaries: int = 0
    applied: int = 0
    swapped: int = 0


def _summary_requests(emu: Emulator) -> int:
    count = 0
    for record in emu.requests:
        body = record.body
        if not isinstance(body, dict):
            continue
        messages = body.get("messages") or []
        first = messages[0] if messages and isinstance(messages[0], dict) else {}
        if first.get("role") == "system" and "STRUCTURED SUMMARY" in str(first.get("content")):
            count += 1
    return count


def run(name: str, *, background: bool, turns: int, latency: float, think: float,
        window: int, prepare: float | None = None) -> Waits:
    out = Waits(name)
    with Emulator(context_window=window, latency=latency) as emu:
        session = ChatSession("emulator", emulator=emu, name=f"latency-{name}",
                              settings=Settings(context_window=window,
                                                background_compaction=background,
                                                **({} if prepare is None else
                                                   {"prepare_summary_ratio": prepare})))
        events: list[Any] = []
        session.subscribe(events.append)
        try:
            for i in range(turns):
                events.clear()
                start = time.monotonic()
                session.send(turn_text(i), max_tokens=40, stream=False)
                wait = time.monotonic() - start
                swapped = any(isinstance(e, BackgroundSummary) and e.state == "swapped"
                              for e in events)
                summarized = any(isinstance(e, CompactionPhase) and e.phase == "applied"
                                 and e.outcome == "summary" for e in events)
                out.swapped += swapped
                out.applied += swapped or summarized
                (out.compacting if swapped or summarized else out.plain).append(wait)
                time.sleep(think)
        finally:
            session.close()
        out.summaries = _summary_requests(emu)
    return out


def report(w: Waits) -> list[str]:
    def fig(xs: list[float]) -> str:
        if not xs:
            return "none"
        return f"{len(xs)} turns, median {statistics.median(xs):.2f} s, worst {max(xs):.2f} s"

    lines = [f"== {w.name}: compacting {fig(w.compacting)}; plain {fig(w.plain)}; "
             f"summary requests {w.summaries}, summaries applied {w.applied}"
             + (f" ({w.swapped} swapped in)" if w.swapped else "")]
    if w.compacting and w.plain:
        ratio = max(w.compacting) / statistics.median(w.plain)
        lines.append(f"ratio {w.name} slowest compacting / median plain: {ratio:.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--latency", type=float, default=0.6)
    parser.add_argument("--think", type=float, default=1.5)
    parser.add_argument("--window", type=int, default=8000)
    parser.add_argument("--prepare", type=float, default=None,
                        help="prepare_summary_ratio for the background client (default: "
                             "the setting's default)")
    parser.add_argument("--only", choices=("today", "background"), default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        print(f"# latency: {args.turns} turns, {args.latency} s a request, {args.think} s "
              f"think time, window {args.window:,} tokens")
        for name, background in (("today", False), ("background", True)):
            if args.only not in (None, name):
                continue
            waits = run(name, background=background, turns=args.turns,
                        latency=args.latency, think=args.think, window=args.window,
                        prepare=args.prepare)
            print("\n".join(report(waits)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
