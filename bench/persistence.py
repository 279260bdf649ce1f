"""Benchmark: bytes a session writes to disk per turn, journal (now) vs whole snapshot (before).

Run: ``python bench/persistence.py`` (``--turns 300``, ``--turn-kb 10``).

One session of ``--turns`` turns, each a user message of ``--turn-kb`` KB answered by a
short reply, run twice in fresh state directories:

* **journal** — the product as it is: ``transcript.jsonl`` and ``history.journal`` get
  one appended line per turn; ``history.json`` is rewritten only on compaction, undo,
  reset or close; ``learned.json`` only on a real change;
* **before** — the same session with the persistence the product had before the
  journal: ``history.json`` rewritten whole (and fsynced) after every turn, and
  ``learned.json`` rewritten whenever its content changed at all (every turn: the token
  calibration always moves).

Bytes are the kernel's count of bytes this process passed to ``write(2)``
(``/proc/self/io`` ``wchar``), read around each ``send``: nothing else writes in between.
The provider is a local echo (no HTTP), so only the session's own work is counted. The
window is large enough that nothing is compacted, as in the issue's measurement.

Printed per mode: total bytes written, bytes per turn (median, last, max), the largest
ratio of a turn's bytes to the size of the messages it added, and the history size at
the end; then the before/journal ratios and the most a journal turn wrote beyond twice
its new messages (the transcript and the journal each hold them once; the rest is record
framing and ``learned.json``). Figures, not verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery._files import write_private_atomic
from ipy_ctxrecovery.core.catalogue import ModelInfo
from ipy_ctxrecovery.core.history import History, Message, to_openai
from ipy_ctxrecovery.providers.base import Request, Response, StopReason, TextCallback, Usage


class EchoProvider:
    """A provider with no network: the body is JSON, the answer a short echo."""

    model = "echo"
    info = ModelInfo("echo", 50_000_000, 4096)

    def encode(self, request: Request) -> bytes:
        return json.dumps({"messages": to_openai(request.messages)},
                          ensure_ascii=False).encode("utf-8")

    def send(self, request: Request, on_text: TextCallback | None = None) -> Response:
        body = len(self.encode(request))
        text = f"echo: {request.messages[-1].text[:40]}"
        return Response(Message.assistant(text), StopReason.END,
                        Usage(body // 4 + len(request.messages), len(text) // 4), body)


def bytes_written() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def whole_snapshot(files: Any) -> Callable[..., None]:
    """``Transcript.save_history`` as it was before the journal: the whole file, fsynced
    (without the counters the journal lines carry)."""
    def save(history: History, counters: Any = None) -> None:
        data = json.dumps({"version": 1, "messages": [m.to_dict() for m in history]},
                          ensure_ascii=False)
        write_private_atomic(files.history_path, data)
    return save


def run(turns: int, turn_kb: float, *, before: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-persist-") as root:
        os.environ["IPY_CTXRECOVERY_DIR"] = root
        s = ChatSession(provider=EchoProvider(), name="bench", settings=Settings(),
                        builtin_tools=False)
        if before:
            # As it was before: learned.json whenever anything changed, history.json
            # whole and fsynced every turn.
            whole = ChatSession._save_learned
            s._save_learned = lambda **_: whole(s, exact=True)  # type: ignore[method-assign]
            s._files.save_history = whole_snapshot(s._files)  # type: ignore[method-assign]
        per_turn: list[int] = []
        ratios: list[float] = []
        excess: list[int] = []
        filler = "lorem ipsum dolor sit amet " * int(turn_kb * 1024 / 27 + 1)
        for i in range(turns):
            n, start = len(s.history), bytes_written()
            s.send(f"[turn {i}] {filler}"[: int(turn_kb * 1024)])
            written = bytes_written() - start
            new = sum(len(json.dumps(m.to_dict(), ensure_ascii=False))
                      for m in s.history[n:])
            per_turn.append(written)
            ratios.append(written / new)
            excess.append(written - 2 * new)
        history_bytes = sum(len(json.dumps(m.to_dict(), ensure_ascii=False))
                            for m in s.history)
        start = bytes_written()
        s.close()
        close_bytes = bytes_written() - start
        files = sorted(p.name for p in (Path(root) / "sessions" / "bench").iterdir())
    return {"per_turn": per_turn, "ratios": ratios, "excess": max(excess),
            "history": history_bytes,
            "close": close_bytes, "files": files}


def mb(n: float) -> str:
    return f"{n / 1024 / 1024:.2f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--turn-kb", type=float, default=10.0)
    args = parser.parse_args(argv)
    if not Path("/proc/self/io").exists():
        print("this benchmark reads /proc/self/io (Linux)", file=sys.stderr)
        return 2
    print(f"persistence: {args.turns} turns of {args.turn_kb:g} KB user messages")
    results = {}
    for mode in ("before", "journal"):
        r = results[mode] = run(args.turns, args.turn_kb, before=mode == "before")
        per = r["per_turn"]
        print(f"== {mode}: written {mb(sum(per))} over {len(per)} turns for a "
              f"{mb(r['history'])} history (+{r['close']:,} bytes on close)")
        print(f"   bytes per turn: median {statistics.median(per):,.0f}, last {per[-1]:,}, "
              f"max {max(per):,}; max bytes written / new message bytes "
              f"{max(r['ratios']):.2f}")
    b, j = results["before"], results["journal"]
    print(f"ratio persistence before/journal: total bytes {sum(b['per_turn']) / sum(j['per_turn']):.1f}x, "
          f"last turn {b['per_turn'][-1] / j['per_turn'][-1]:.1f}x; journal max per-turn "
          f"ratio to new messages {max(j['ratios']):.2f}, at most {j['excess']:,} bytes over "
          "2x the new messages (goal: 2x plus a constant)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
