"""Benchmark: a long session behind a 64 KB body cap with the server's compaction on and off.

Run: ``python bench/server_compaction.py`` (``--turns 100``, ``--wires anthropic,responses``,
``--cap 64KB``, ``--window 200000``; ``--quick``: 20 turns, what ``tests/test_bench.py``
runs; ``--trace``: one line per request).

One deterministic conversation (``script``): turn ``i`` starts with ``[turn i]``; in every
five turns, two are short questions, one pastes a long text (6–16 KB), one asks for a
tool result (``[[tool fetch_log …]]``, 12–24 KB) and one pastes a short note (1.5–3 KB).
It is sent through a :class:`ChatSession` against the emulator behind an nginx-style 413
at ``--cap`` (not configured: the session learns it from the first rejection), in a window
far larger than the cap, on two wires — Anthropic (``emulator:anthropic``) and OpenAI's
Responses API (``emulator:openai``, ``openai_api="responses"``) — once with
``server_compaction="on"`` and once ``"off"``.

Printed per wire and setting, from what the emulator received (``emu.requests``) and the
session's events: requests sent, rejections (any non-200, drops included), bytes uploaded
(the sum of the bodies), the largest body (and the largest after the first rejection),
server compactions (``ServerCompacted`` events), the package's own LLM summaries (summary
requests — a system prompt naming the STRUCTURED SUMMARY — and the compactions they
applied), turns answered; then ``ratio`` lines on/off. Figures, never verdicts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipy_ctxrecovery import ChatSession, Emulator, Settings
from ipy_ctxrecovery.core.events import (
    CompactionPhase,
    Event,
    FitBeforeSend,
    LadderStep,
    ServerCompacted,
)
from ipy_ctxrecovery.settings import parse_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_vs_blind import filler  # noqa: E402

SYSTEM = "You are a careful assistant helping a developer debug a service."
SUMMARY_MARK = "STRUCTURED SUMMARY"
_DROPPED = re.compile(r"(\d+) messages? dropped")
#: wire name → (model, settings of that wire)
WIRES: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic": ("emulator:anthropic", {}),
    "responses": ("emulator:openai", {"openai_api": "responses"}),
}
SETTINGS = ("on", "off")
# Fixed-length session names: previews name their file's path.
_names = (f"bench-sc-{n:03d}" for n in itertools.count(1))


def fetch_log(n: int, seed: int = 0) -> str:
    """Return n characters of the service log starting at the given seed."""
    return filler(n, seed)


def script(turns: int) -> list[str]:
    """The conversation: every turn starts with a unique ``[turn i]`` marker."""
    texts = []
    for i in range(turns):
        head = f"[turn {i}] "
        kind = i % 5
        if kind == 1:
            size = 6_000 + (i * 7919) % 10_001
            texts.append(head + "Here is the trace I see:\n" + filler(size, 1000 + i))
        elif kind == 3:
            n = 12_000 + (i * 3571) % 12_001
            texts.append(head + "Fetch the next part of the log, please. "
                         f'[[tool fetch_log {{"n": {n}, "seed": {i}}}]]')
        elif kind == 4:
            size = 1_500 + (i * 337) % 1_501
            texts.append(head + "A note for later:\n" + filler(size, 2000 + i))
        else:
            texts.append(head + f"What does step {i} of the trace mean for the cache?")
    return texts


def is_summary_request(body: Any) -> bool:
    """The package's own summary request: its system prompt names the STRUCTURED SUMMARY
    (Anthropic: top-level ``system``; Responses: ``instructions`` or a system item)."""
    if not isinstance(body, dict):
        return False
    if SUMMARY_MARK in json.dumps(body.get("system") or "", ensure_ascii=False) \
            or SUMMARY_MARK in str(body.get("instructions") or ""):
        return True
    items = body.get("messages") or body.get("input") or ()
    return isinstance(items, list) and any(
        isinstance(m, dict) and m.get("role") in ("system", "developer")
        and SUMMARY_MARK in json.dumps(m.get("content"), ensure_ascii=False) for m in items)


@dataclass
class Figures:
    requests: int = 0
    rejected: int = 0
    uploaded: int = 0
    largest: int = 0
    largest_after: int = 0          # the largest body after the first rejection
    over_cap_after: int = 0         # bodies over the cap sent after the first rejection
    server_compactions: int = 0
    summary_requests: int = 0
    client_summaries: int = 0       # compactions of the package's that applied a summary
    client_trims: int = 0           # compactions of the package's that applied a trim
    dropped_unread: int = 0        # messages a fit dropped, or a summary left unread
    answered: int = 0
    on_topic: int = 0              # answers quoting their own request ([turn i])
    errors: tuple[str, ...] = ()


def run(wire: str, setting: str, turns: int, cap: int, window: int,
        trace: bool = False) -> Figures:
    model, extra = WIRES[wire]
    settings = Settings(server_compaction=setting, **extra)
    events: list[Event] = []
    errors: list[str] = []
    answered = on_topic = 0
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp, \
            Emulator(context_window=window, max_body=cap, body_limit_style="nginx",
                     keep_requests=100_000, keep_body_bytes="1GB") as emu:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        session = ChatSession(model, emulator=emu, settings=settings, system=SYSTEM,
                              tools=[fetch_log], builtin_tools=False, files_root=Path(tmp),
                              name=next(_names))
        session.subscribe(events.append)
        try:
            for i, text in enumerate(script(turns)):
                start = len(emu.requests)
                try:
                    reply = session.send(text, stream=False)
                    answered += bool(reply.text)
                    on_topic += f"[turn {i}]" in reply.text
                except Exception as e:     # a figure, not a verdict: count and go on
                    errors.append(f"turn {i}: {type(e).__name__}: {e}"[:200])
                if trace:
                    for r in emu.requests[start:]:
                        kind = "summary" if is_summary_request(r.body) else "turn"
                        print(f"    turn {i:3d} {kind:<7} {r.status} {r.body_bytes:>7,} B"
                              f"{'  ' + r.fault if r.fault else ''}")
        finally:
            session.close()
        records = emu.requests
    figures = Figures(requests=len(records), answered=answered, on_topic=on_topic,
                      errors=tuple(errors))
    figures.rejected = sum(1 for r in records if r.status != 200)
    figures.uploaded = sum(r.body_bytes for r in records)
    figures.largest = max((r.body_bytes for r in records), default=0)
    first = next((n for n, r in enumerate(records) if r.status != 200), None)
    if first is not None:
        after = records[first + 1:]
        figures.largest_after = max((r.body_bytes for r in after), default=0)
        figures.over_cap_after = sum(1 for r in after if r.body_bytes > cap)
    figures.summary_requests = sum(1 for r in records if is_summary_request(r.body))
    figures.server_compactions = sum(isinstance(e, ServerCompacted) for e in events)
    applied = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"]
    figures.client_summaries = sum(e.outcome == "summary" for e in applied)
    figures.client_trims = sum(e.outcome == "trim" for e in applied)
    figures.dropped_unread = sum(e.dropped_unread for e in applied) + sum(
        int(m.group(1)) for e in events if isinstance(e, LadderStep | FitBeforeSend)
        for note in e.notes for m in [_DROPPED.search(note)] if m)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="20 turns (the smoke test)")
    parser.add_argument("--wires", default="anthropic,responses")
    parser.add_argument("--cap", default="64KB", help="the proxy's body cap (413 above it)")
    parser.add_argument("--window", type=int, default=200_000, help="tokens")
    parser.add_argument("--trace", action="store_true", help="one line per request")
    args = parser.parse_args(argv)
    turns = 20 if args.quick else args.turns
    cap = parse_size(args.cap, name="--cap")
    wires = args.wires.split(",")
    for name in wires:
        if name not in WIRES:
            parser.error(f"unknown wire {name!r}; use {' or '.join(WIRES)}")
    print(f"{turns} turns behind a {cap:,}-byte cap (nginx 413, learned), "
          f"{args.window:,}-token window")
    for wire in wires:
        results: dict[str, Figures] = {}
        for setting in SETTINGS:
            print(f"== {wire} server_compaction={setting}")
            f = results[setting] = run(wire, setting, turns, cap, args.window, args.trace)
            after = (f" (after the first rejection {f.largest_after:,}, "
                     f"{f.over_cap_after} over the cap)") if f.rejected else ""
            print(f"  requests sent            {f.requests}")
            print(f"  rejections (non-200)     {f.rejected}")
            print(f"  bytes uploaded           {f.uploaded:,}")
            print(f"  largest body             {f.largest:,}{after}")
            print(f"  server compactions       {f.server_compactions}")
            print(f"  client summaries         {f.client_summaries} "
                  f"({f.summary_requests} summary requests, {f.client_trims} trims)")
            print(f"  messages dropped unread  {f.dropped_unread}")
            print(f"  turns answered           {f.answered}/{turns} "
                  f"({f.on_topic} quoting their request)")
            for error in f.errors:
                print(f"    {error}")
        on, off = results["on"], results["off"]
        print(f"ratio bytes on/off {wire}: {on.uploaded / off.uploaded:.2f}")
        print(f"ratio requests on/off {wire}: {on.requests / off.requests:.2f}")
        print(f"ratio largest body on/off {wire}: {on.largest_after / off.largest_after:.2f}"
              if on.largest_after and off.largest_after else
              f"ratio largest body on/off {wire}: {on.largest / off.largest:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
