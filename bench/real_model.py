"""A run against a real small model: what its summaries keep, and how its cut answers join.

Run: ``python bench/real_model.py --base-url http://127.0.0.1:8765/v1`` against an
OpenAI-compatible server such as llama-cpp-python's (``python -m llama_cpp.server --model
SmolLM2-135M-Instruct.Q4_1.gguf --n_ctx 2048``; see ``tests/test_llama_cpp_python.py``
for how to install it — it compiles for a while, so CI does not run this). Not part of
``tests/test_bench.py``: it needs that server.

Part 1 — a 30-turn conversation with one planted fact a turn (``threshold_i = V ms``) in a
2,048-token window, so the session compacts every few turns with the model as its
summarizer. Printed: each summary accepted or refused (and why), and after each compaction
the planted facts of the compacted turns still in the working history.

Part 2 — three long answers asked for with a small ``max_tokens``, continued and joined:
each join's seam, whether the joined text repeats itself, and meta text left in it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import openai

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.events import BackgroundSummary, CompactionPhase, Escalation, Truncated
from ipy_ctxrecovery.errors import ChatError

META = re.compile(r"(?i)here'?s the (rest|continuation)|continuing from|\(continued\)|"
                  r"continue from where|your response was cut")


def fact(i: int) -> tuple[str, str]:
    return f"threshold_{i}", f"{(i * 37) % 997}.{i % 10} ms"


def turn_text(i: int) -> str:
    ident, value = fact(i)
    return (f"Turn {i}. We measured {ident} = {value} on the validation set. Please "
            "remember it and reply in one short sentence.")


def conversation(client: Any, turns: int) -> list[str]:
    lines: list[str] = []
    events: list[Any] = []
    session = ChatSession("openai:smollm2-135m", client=client, name="real-fidelity",
                          settings=Settings(context_window=2048, read_file=False))
    session.subscribe(events.append)
    accepted = refused = 0
    try:
        for i in range(turns):
            events.clear()
            try:
                session.send(turn_text(i), max_tokens=48, stream=False)
            except ChatError as e:
                lines.append(f"turn {i}: failed: {e}")
                continue
            session._background.wait()      # noqa: SLF001 - its news comes with the next turn
            for e in events:
                if isinstance(e, BackgroundSummary) and e.state in ("ready", "failed"):
                    # A summary prepared in the background: accepted or refused there.
                    if e.state == "ready":
                        accepted += 1
                    else:
                        refused += 1
                    lines.append(f"turn {i}: background summary {e.state}"
                                 + (f": {e.reason}" if e.reason else ""))
                if isinstance(e, BackgroundSummary) and e.state == "swapped":
                    history = "\n".join(m.text for m in session.history)
                    gone = [k for k in range(i) if turn_text(k) not in history]
                    kept = sum(1 for k in gone if all(p in history for p in fact(k)))
                    lines.append(f"turn {i}: summary swapped in; facts of compacted turns in "
                                 f"the history: {kept}/{len(gone)}")
                if not isinstance(e, CompactionPhase):
                    continue
                if e.phase == "applied" and e.outcome == "summary":
                    accepted += 1
                    history = "\n".join(m.text for m in session.history)
                    gone = [k for k in range(i) if turn_text(k) not in history]
                    kept = sum(1 for k in gone if all(p in history for p in fact(k)))
                    checked = (f", fact check: {e.facts_kept} kept, {e.facts_added} added back"
                               if hasattr(e, "facts_kept") else "")
                    lines.append(f"turn {i}: summary accepted ({e.before_messages} → "
                                 f"{e.after_messages} messages, {e.summary_requests} "
                                 f"requests{checked}); facts of compacted turns in the "
                                 f"history: {kept}/{len(gone)}")
                elif e.phase == "rejected":
                    refused += 1
                    lines.append(f"turn {i}: summary refused: {e.reason}")
        lines.append(f"summaries accepted {accepted}, refused {refused}")
    finally:
        session.close()
    return lines


def joins(client: Any) -> list[str]:
    lines: list[str] = []
    topics = ("the history of the household refrigerator",
              "how a data scientist should validate a churn model",
              "the water cycle, for a ten-year-old")
    session = ChatSession("openai:smollm2-135m", client=client, name="real-joins",
                          settings=Settings(context_window=2048, read_file=False,
                                            max_token_escalations=3))
    events: list[Any] = []
    session.subscribe(events.append)
    try:
        for topic in topics:
            events.clear()
            session.reset()
            try:
                reply = session.send(f"Write a long, detailed essay about {topic}.",
                                     max_tokens=24, stream=False)
            except ChatError as e:
                lines.append(f"{topic}: failed: {e}")
                continue
            parts = sum(1 for e in events if isinstance(e, Escalation))
            failed = [e for e in events if isinstance(e, Truncated) and e.failed]
            text = reply.text
            sentences = [s.strip().lower() for s in re.split(r"[.!?]\s+", text) if s.strip()]
            repeats = len(sentences) - len(set(sentences))
            meta = len(META.findall(text))
            lines.append(f"{topic}: {len(text):,} chars after {parts} continuations; "
                         f"repeated sentences {repeats}; meta text {meta}"
                         + (f"; not continued: {failed[0].failed}" if failed else ""))
            lines.append("  text: " + " ".join(text.split())[:600])
    finally:
        session.close()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args(argv)
    client = openai.OpenAI(base_url=args.base_url, api_key="sk-local", max_retries=1)
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        print("# part 1: summaries by the real model")
        print("\n".join(conversation(client, args.turns)))
        print("# part 2: three long answers cut at max_tokens=24")
        print("\n".join(joins(client)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
