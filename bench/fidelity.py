"""Benchmark: what compaction keeps — messages read, the user's rules, planted facts, recall.

Run: ``python bench/fidelity.py`` (``--turns 60``, ``--wire openai,anthropic``,
``--cap 48KB``, ``--window 8192``, ``--compactions 3``).

A deterministic notebook-style conversation against the emulator behind a proxy body cap
(``max_body``, nginx's 413) and a small context window (known to the session, so it
compacts ahead of need). Turn ``i``'s user message pastes a text with one **planted fact**
in its middle (``threshold_i = V ms``, an identifier and a number with its unit); every
seventh turn pastes a long text (about a quarter of the cap) with its fact in the middle,
where a head-and-tail cut loses it. Four turns state a **rule** the user wants kept
(``From now on, always …``).

After each compaction (a turn after which a message of the history is gone), up to
``--compactions``, it prints:

* ``read by a summarizer``: of the user messages no longer in the working history, the
  share whose head, planted fact and tail all appeared in some summary request the emulator
  received (its system prompt names the STRUCTURED SUMMARY) — goal 100%;
* ``rules kept verbatim``: rules stated so far whose exact sentence is in the working
  history — goal 100%;
* ``facts in history``: planted facts of compacted messages whose identifier and value are
  both in the working history (kept, in the summary, or in its fact list);
* ``facts recallable``: of those compacted facts, the share a recall tool of the session
  (one whose name starts with ``recall``, if the session has one) returns when asked for the
  identifier — goal 100%; ``no recall tool`` when there is none;
* ``summary requests`` and ``summary tokens`` (the emulator's count of their input) since
  the previous compaction.

A last line does the same at the end of the conversation (all four rules stated).

Every figure is counted from what the emulator received and what the session holds; no
key, no network.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.replies import count_tokens
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.settings import parse_size

RULES = {
    3: "From now on, always report p-values with three decimals.",
    17: "Never drop rows with missing customer_id; flag them instead.",
    31: "Always use the fiscal calendar (weeks start on Monday) for weekly figures.",
    45: "From now on, call the cleaned table sales_clean, not df2.",
}

_WORDS = ("the", "cohort", "revenue", "weekly", "baseline", "variance", "segment",
          "pipeline", "column", "median", "churn", "region", "model", "feature", "sample")


def filler(chars: int, seed: int) -> str:
    """Deterministic prose of about ``chars`` characters, in lines of about 70."""
    out: list[str] = []
    n = 0
    k = seed
    line: list[str] = []
    while n < chars:
        k = (k * 1103515245 + 12345) % 2 ** 31
        word = _WORDS[k % len(_WORDS)]
        line.append(word)
        n += len(word) + 1
        if sum(len(w) + 1 for w in line) > 70:
            out.append(" ".join(line) + ".")
            line = []
    if line:
        out.append(" ".join(line) + ".")
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class Planted:
    turn: int
    text: str
    head: str
    fact: str
    ident: str
    value: str
    tail: str
    rule: str | None


def turn_message(i: int, cap: int) -> Planted:
    ident = f"threshold_{i}"
    value = f"{(i * 37) % 997}.{i % 10} ms"
    fact = f"We measured {ident} = {value} on the validation set."
    size = cap // 4 if i % 7 == 6 else 1_200
    head = f"[turn {i}] Here are my notes for step {i} of the analysis."
    tail = f"That was step {i}; reply in one short sentence."
    rule = RULES.get(i)
    body = [head, filler(size // 2, i), fact, filler(size // 2, i + 1000)]
    if rule is not None:
        body.append(rule)
    body.append(tail)
    return Planted(i, "\n".join(body), head, fact, ident, value, tail, rule)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(c.get("text", "") if isinstance(c, dict) else c)
                         for c in content)
    return ""


def summary_request_text(body: Any) -> str | None:
    """The text of a summary request (its system prompt names the STRUCTURED SUMMARY)."""
    if not isinstance(body, dict):
        return None
    system = _text_of(body.get("system", ""))
    messages = body.get("messages") or []
    for m in messages:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            system += _text_of(m.get("content"))
    if "STRUCTURED SUMMARY" not in system:
        return None
    return "\n".join(_text_of(m.get("content")) for m in messages
                     if isinstance(m, dict) and m.get("role") == "user")


def _history_text(session: ChatSession) -> str:
    return "\n".join(m.text for m in session.history)


def _recall_tool(session: ChatSession) -> Any:
    offered = getattr(session, "tools_after_compaction", ())   # main before issue 27: none
    for tool in (*session.tools, *offered):
        if tool.name.startswith("recall"):
            return tool
    return None


def _recalls(tool: Any, planted: Planted) -> bool:
    """Whether the recall tool returns the fact when asked for its identifier."""
    schema = getattr(tool, "parameters", {}) or {}
    names = set(schema.get("properties", schema))
    args: dict[str, Any] = {}
    for key in ("words", "query", "pattern", "text"):
        if key in names:
            args[key] = planted.ident
            break
    try:
        out = tool.function(**args) if hasattr(tool, "function") else tool(**args)
    except Exception:   # a bench reports what the tool could not do; it does not crash
        return False
    return planted.value in str(out)


@dataclass
class Snapshot:
    turn: int
    compacted: int = 0
    read: int = 0
    rules_stated: int = 0
    rules_kept: int = 0
    facts_in_history: int = 0
    recallable: int | None = None
    summary_requests: int = 0
    summary_tokens: int = 0
    history_messages: int = 0


@dataclass
class Run:
    wire: str
    snapshots: list[Snapshot] = field(default_factory=list)
    end: Snapshot | None = None
    compactions: int = 0
    answered: int = 0
    turns: int = 0


def run(wire: str, *, turns: int, cap: int, window: int, compactions: int) -> Run:
    out = Run(wire)
    with Emulator(context_window=window, max_body=cap) as emu:
        model = "emulator" if wire == "openai" else "emulator:anthropic"
        session = ChatSession(model, emulator=emu,
                              settings=Settings(context_window=window, read_file=False),
                              system="You are a careful data-science assistant.",
                              name=f"fidelity-{wire}")
        try:
            sent: list[Planted] = []
            seen_requests = 0
            previous_ids: set[int] = set()
            for i in range(turns):
                planted = turn_message(i, cap)
                sent.append(planted)
                out.turns += 1
                try:
                    session.send(planted.text, max_tokens=64, stream=False)
                    out.answered += 1
                except ChatError:
                    pass
                history = session.history
                ids = {id(m) for m in history}
                lost = previous_ids - ids
                previous_ids = ids
                out.compactions += bool(lost)
                if not lost or len(out.snapshots) >= compactions:
                    continue
                requests = emu.requests
                new = requests[seen_requests:]
                seen_requests = len(requests)
                texts = [t for t in (summary_request_text(r.body) for r in requests) if t]
                new_texts = [t for t in (summary_request_text(r.body) for r in new) if t]
                out.snapshots.append(_measure(session, sent, texts, new_texts, i))
            requests = emu.requests
            texts = [t for t in (summary_request_text(r.body) for r in requests) if t]
            new_texts = [t for t in (summary_request_text(r.body)
                                     for r in requests[seen_requests:]) if t]
            out.end = _measure(session, sent, texts, new_texts, turns - 1)
        finally:
            session.close()
    return out


def _measure(session: ChatSession, sent: Sequence[Planted], texts: Sequence[str],
             new_texts: Sequence[str], turn: int) -> Snapshot:
    history = _history_text(session)
    kept_verbatim = {m.text for m in session.history}
    compacted = [p for p in sent if p.text not in kept_verbatim]
    corpus = "\n".join(texts)
    snap = Snapshot(turn=turn, compacted=len(compacted), history_messages=len(session.history))
    snap.read = sum(1 for p in compacted
                    if p.head in corpus and p.fact in corpus and p.tail in corpus)
    rules = [p.rule for p in sent if p.rule]
    snap.rules_stated = len(rules)
    snap.rules_kept = sum(1 for r in rules if r in history)
    snap.facts_in_history = sum(1 for p in compacted
                                if p.ident in history and p.value in history)
    tool = _recall_tool(session)
    if tool is not None:
        snap.recallable = sum(1 for p in compacted if _recalls(tool, p))
    snap.summary_requests = len(new_texts)
    snap.summary_tokens = sum(count_tokens(t) for t in new_texts)
    return snap


def _share(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "—"


def report(result: Run) -> list[str]:
    lines = [f"## {result.wire} wire: {result.answered}/{result.turns} turns answered"]
    if not result.snapshots:
        lines.append("  no compaction happened")
    rows = [(f"compaction {k} (after turn {s.turn})", s)
            for k, s in enumerate(result.snapshots, start=1)]
    if result.end is not None:
        rows.append((f"end (turn {result.end.turn}, {result.compactions} compactions)",
                     result.end))
    for label, s in rows:
        recall = ("no recall tool" if s.recallable is None
                  else _share(s.recallable, s.compacted))
        lines.append(
            f"  {label}: "
            f"read by a summarizer {_share(s.read, s.compacted)}; "
            f"rules kept verbatim {_share(s.rules_kept, s.rules_stated)}; "
            f"facts in history {_share(s.facts_in_history, s.compacted)}; "
            f"facts recallable {recall}; "
            f"summary requests {s.summary_requests}, summary tokens {s.summary_tokens:,}; "
            f"history {s.history_messages} messages")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--wire", default="openai,anthropic")
    parser.add_argument("--cap", default="48KB")
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--compactions", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    cap = parse_size(args.cap)
    if cap is None:
        parser.error("--cap needs a size such as 48KB")
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        print(f"# fidelity: {args.turns} turns, proxy cap {args.cap}, window "
              f"{args.window:,} tokens, up to {args.compactions} compactions")
        results = []
        for wire in args.wire.split(","):
            result = run(wire.strip(), turns=args.turns, cap=cap, window=args.window,
                         compactions=args.compactions)
            results.append(result)
            print("\n".join(report(result)))
        if args.json:
            print(json.dumps([{"wire": r.wire, "answered": r.answered, "turns": r.turns,
                               "snapshots": [vars(s) for s in r.snapshots]}
                              for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
