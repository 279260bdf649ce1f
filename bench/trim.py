"""Benchmark: our non-LLM fit against LangChain's ``trim_messages`` on the same histories.

Run: ``python bench/trim.py`` (``--quick`` for a seconds-long run; ``--repeat 30``).
Needs langchain-core: ``pip install -e '.[bench]'``.

Each history is fitted into a 100,000-token window, both ways:

* ours, drop-only — ``ladder.apply`` of an EXACT_FIT decision (what the session does after
  a context overflow): the oldest whole units dropped until the request body *measured*
  by the provider (``measure()``, byte-exact) is at most 90 % of 100,000 × 4 bytes;
* ours, previews first — ``ladder.preflight_fit`` (what pre-flight does before a send):
  tool results become previews naming their saved file, then the oldest units go;
* ``trim_messages(strategy="last", token_counter=count_tokens_approximately,
  max_tokens=90_000, include_system=True, start_on="human")`` on the same messages as
  LangChain messages (converted beforehand, not timed).

Per fit it prints the median time, the messages and content characters kept (previews
count their kept head and tail, not their marker), and validity: every tool call
answered by the results right after it (``history.problems``), the conversation starting
on a user message, the latest user request kept, and the body measured under the target.
Figures, never verdicts. Our sizes come from the OpenAI adapter's per-message sizes,
computed once per fit; the provider's size memo is warm, as in a session, where pre-flight
measured the history just before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import openai

from ipy_ctxrecovery.core import budget, ladder
from ipy_ctxrecovery.core.history import History, Role, latest_user_index, problems
from ipy_ctxrecovery.core.ladder.decide import Decision, LadderState, Level
from ipy_ctxrecovery.providers.base import Request
from ipy_ctxrecovery.providers.openai import OpenAIProvider
from ipy_ctxrecovery.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import TOOL, conversation, history_of  # noqa: E402

WINDOW = 100_000
BYTES_PER_TOKEN = 4
MARGIN = 0.10
TARGET_TOKENS = int(WINDOW * (1 - MARGIN))
TARGET_BYTES = TARGET_TOKENS * BYTES_PER_TOKEN


def histories(quick: bool) -> dict[str, History]:
    if quick:
        return {"tool-heavy 334 msgs (1.1 MB)": history_of(334),
                "text 1,000 msgs (0.5 MB)": conversation(500_000, 1_000)}
    issue = history_of(1334)
    return {
        "issue case: 1,334 msgs, 4.3 MB (ends on an unanswered call)": issue,
        "same, every call answered (1,333 msgs)": (*issue[:-2], issue[-1]),
        "tool-heavy 4,000 msgs, 13 MB": history_of(4000),
        "text 10,000 msgs, 2 MB": conversation(2_000_000, 10_000),
    }


def to_langchain(h: History) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    for m in h:
        if m.role is Role.SYSTEM:
            out.append(SystemMessage(m.text))
        elif m.role is Role.USER:
            out.append(HumanMessage(m.text))
        elif m.role is Role.ASSISTANT:
            out.append(AIMessage(m.text, tool_calls=[
                {"id": c.id, "name": c.name, "args": json.loads(c.arguments or "{}")}
                for c in m.tool_calls]))
        else:
            r = m.tool_result
            assert r is not None
            out.append(ToolMessage(r.content, tool_call_id=r.call_id))
    return out


def from_langchain(kept: list[Any], source: list[Any], h: History) -> History:
    """Our messages for a LangChain result (trim_messages keeps the objects it was given)."""
    index = {id(m): i for i, m in enumerate(source)}
    return tuple(h[index[id(m)]] for m in kept)


def content_kept(h: History) -> int:
    """Characters of the original content still shown (a preview: its head and tail)."""
    total = 0
    for m in h:
        if m.tag is not None and m.role is not Role.TOOL:
            continue                           # our notices are not content
        info = budget.compaction_info(m) if m.role is Role.TOOL else None
        if info is not None:
            total += len(info.head) + len(info.tail)
        else:
            total += m.char_size()
    return total


def validity(before: History, after: History, size: int) -> str:
    issues = problems(after)
    latest = latest_user_index(before)
    kept_latest = latest is None or before[latest] in after
    first = next((m for m in after if m.role is not Role.SYSTEM), None)
    starts_on_user = first is not None and first.role is Role.USER
    return (f"pairs {'ok' if not [p for p in issues if 'tool' in p] else 'BROKEN'}, "
            f"starts on user {'yes' if starts_on_user else 'NO'}, "
            f"latest request {'kept' if kept_latest else 'LOST'}, "
            f"body {size / 1e3:,.0f} KB {'≤' if size <= TARGET_BYTES else '>'} target "
            f"{TARGET_BYTES / 1e3:,.0f} KB")


def timings(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(timings(fn, repeat))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small histories, few runs")
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        from langchain_core.messages import trim_messages
        from langchain_core.messages.utils import count_tokens_approximately
    except ImportError:
        print("bench/trim.py needs langchain-core: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    repeat = args.repeat or (3 if args.quick else 30)
    settings = Settings()
    provider = OpenAIProvider("gpt-4o", client=openai.OpenAI(base_url="http://127.0.0.1:9",
                                                             api_key="bench"))

    def measure(h: History) -> int:
        return int(provider.measure(Request(h, tools=(TOOL,))))

    decision = Decision(Level.EXACT_FIT, 1, LadderState(), target_bytes=TARGET_BYTES,
                        limit_bytes=WINDOW * BYTES_PER_TOKEN, payload_related=False)
    print(f"trim: fit into {WINDOW:,} tokens (target {TARGET_TOKENS:,} tokens ≈ "
          f"{TARGET_BYTES / 1e3:,.0f} KB of request body); median of {repeat} runs")
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        store = budget.ResultStore(Path(tmp) / "results")
        for name, h in histories(args.quick).items():
            measure(h)                                  # pre-flight's measure: memo warm
            lc = to_langchain(h)
            print(f"== {name}: {len(h):,} messages, body {measure(h) / 1e6:.2f} MB, "
                  f"content {content_kept(h):,} chars")

            def ours_drop(h: History = h) -> ladder.LadderResult:
                return ladder.apply(decision, h, settings=settings, store=store,
                                    measure=measure, part=provider.message_size)

            def ours_previews(h: History = h) -> ladder.LadderResult:
                return ladder.preflight_fit(h, target_bytes=TARGET_BYTES,
                                            limit_bytes=WINDOW * BYTES_PER_TOKEN,
                                            payload_related=False, settings=settings,
                                            store=store, measure=measure,
                                            part=provider.message_size)

            def theirs(lc: list[Any] = lc) -> list[Any]:
                return trim_messages(lc, max_tokens=TARGET_TOKENS, strategy="last",
                                     token_counter=count_tokens_approximately,
                                     include_system=True, start_on="human",
                                     allow_partial=False)

            # Interleaved rounds, so a busy machine slows both sides alike.
            drops: list[float] = []
            lcs: list[float] = []
            for _ in range(3):
                drops += timings(ours_drop, max(1, repeat // 3))
                lcs += timings(theirs, max(1, repeat // 3))
            t_drop, t_lc = statistics.median(drops), statistics.median(lcs)
            t_prev = median(ours_previews, max(1, repeat // 10))
            rows = [("ours drop-only", t_drop, ours_drop().history),
                    ("ours previews+drop", t_prev, ours_previews().history),
                    ("trim_messages", t_lc, from_langchain(theirs(), lc, h))]
            for label, t, out in rows:
                size = measure(out)
                print(f"  {label:<19} {t * 1e3:8.2f} ms  kept {len(out):>5,} msgs, "
                      f"{content_kept(out):>9,} content chars; {validity(h, out, size)}")
            kept_drop, kept_lc = content_kept(rows[0][2]), content_kept(rows[2][2])
            print(f"ratio trim {name.split(':')[0]}: trim_messages/ours drop-only time "
                  f"{t_lc / t_drop:.1f} (fastest runs {min(lcs) / min(drops):.1f}), "
                  f"content kept ours/trim_messages "
                  f"{kept_drop / max(kept_lc, 1):.2f} (previews+drop "
                  f"{content_kept(rows[1][2]) / max(kept_lc, 1):.2f}, messages "
                  f"{len(rows[1][2]) / max(len(rows[2][2]), 1):.2f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
