"""Benchmark: our ChatSession against a ChatCLI-style blind ladder, same conversation, same faults.

Run: ``python bench/recovery_vs_blind.py`` (``--turns 40``, ``--modes window,413,waf,drop``).

For each failure mode an emulator is started with that limit, and the same scripted
conversation (long pasted messages, big tool results through the emulator's
``[[tool NAME {...}]]`` convention, short questions) is run twice: (a) through
``ChatSession`` and (b) through ``chatcli_baseline.ChatCLIBaseline``. Both use the real
openai SDK with its defaults. Everything is deterministic, so the figures are reproducible.

Printed per mode and system, from what the emulator received (``emu.requests``): requests
sent (and how many were summarizer requests), requests rejected, turns answered and lost,
answers that quote the turn's request (the emulator's default reply quotes the latest real
user message, so an answer without it was given to something else), messages and bytes
kept in the working history at the end, turns where a request went out without that
turn's user request, the most SYSTEM NOTICEs in one request, bytes uploaded; then
``ratio`` lines ours/baseline.
Figures, not verdicts: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import to_openai
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.emulator.replies import paragraph_pieces
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.session.tools import as_tool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chatcli_baseline import ChatCLIBaseline  # noqa: E402

SYSTEM = "You are a careful assistant helping a developer debug a service."
SUMMARY_MARK = "STRUCTURED SUMMARY"
NOTICE_HEAD = "[SYSTEM NOTICE — PAYLOAD LIMIT HIT]"
# Fixed-length session names: previews name their file's path, so the generated names
# (with a timestamp and a pid) would move byte counts between runs.
_session_names = (f"bench-{n:03d}" for n in itertools.count(1))
_WORDS = ("error", "request", "timeout", "worker", "cache", "retry", "socket", "parse",
          "config", "deploy", "queue", "token", "handler", "latency", "upstream", "commit")


def filler(n: int, seed: int) -> str:
    """``n`` chars of deterministic log-like text (a small LCG; no randomness)."""
    state = seed * 2654435761 % 2**32 or 1
    lines: list[str] = []
    size = 0
    i = 0
    while size < n:
        words = []
        for _ in range(8):
            state = (1103515245 * state + 12345) % 2**31
            words.append(_WORDS[state % len(_WORDS)])
        line = f"{i:05d} {seed:03d} " + " ".join(words)
        lines.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(lines)[:n]


def fetch_log(n: int, seed: int = 0) -> str:
    """Return n characters of the service log starting at the given seed."""
    return filler(n, seed)


@dataclass(frozen=True)
class Mode:
    name: str
    emulator: dict[str, Any]
    paste: tuple[int, int]       # pasted text sizes (min, max) in chars
    tool_chars: int


MODES = {
    "window": Mode("context window 4096 tokens", {"context_window": 4096}, (2_000, 6_000),
                   30_000),
    "413": Mode("nginx 413 at 64KB", {"context_window": 1_000_000, "max_body": "64KB",
                                      "body_limit_style": "nginx"}, (4_000, 12_000), 30_000),
    "waf": Mode("WAF 403 at 64KB", {"context_window": 1_000_000, "waf_over": "64KB"},
                (4_000, 12_000), 30_000),
    "drop": Mode("connection drop at 600KB", {"context_window": 2_000_000,
                                              "drop_over": "600KB"}, (40_000, 100_000), 30_000),
    "combo": Mode("window 4096 tokens and nginx 413 at 16KB", {"context_window": 4096,
                                                               "max_body": "16KB"},
                  (2_000, 6_000), 30_000),
}


def script(turns: int, mode: Mode) -> list[str]:
    """The conversation: every turn starts with a unique ``[turn i]`` marker."""
    lo, hi = mode.paste
    texts = []
    for i in range(turns):
        head = f"[turn {i}] "
        kind = i % 6
        if kind in (1, 4):
            # Turn 4 of every six asks for three results at once: one turn's own growth.
            calls = " ".join(f'[[tool fetch_log {{"n": {mode.tool_chars}, "seed": {i * 10 + k}}}]]'
                             for k in range(1 if kind == 1 else 3))
            texts.append(head + "Fetch the next part of the log, please. " + calls)
        elif kind in (2, 5):
            size = lo + (i * 7919) % (hi - lo + 1)
            texts.append(head + "Here is the config and trace I see:\n" + filler(size, 1000 + i))
        else:
            texts.append(head + f"What does step {i} of the trace mean for the cache?")
    return texts


@dataclass
class Figures:
    requests: int = 0
    summarizer: int = 0
    rejected: int = 0
    answered: int = 0
    on_topic: int = 0
    lost: int = 0
    kept_messages: int = 0
    kept_bytes: int = 0
    missing_request_turns: int = 0
    most_notices: int = 0
    uploaded: int = 0
    errors: list[str] = field(default_factory=list)


def _is_summarizer(body: Any) -> bool:
    """A compaction request: its system prompt (Anthropic: top-level) asks for a summary."""
    if not isinstance(body, dict):
        return False
    return SUMMARY_MARK in str(body.get("system") or "") or any(
        m.get("role") == "system" and SUMMARY_MARK in str(m.get("content"))
        for m in body.get("messages", ()))


def _user_texts(body: Any) -> list[str]:
    """The user texts of a request body, either wire format (Anthropic: text blocks)."""
    texts = []
    for m in body.get("messages", ()):
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            # A merged run (summary, notice, request) is one string on the OpenAI wire.
            texts.extend(paragraph_pieces(content))
        elif isinstance(content, list):
            texts.extend(str(b.get("text", "")) for b in content if b.get("type") == "text")
    return texts


def _has_turn(body: Any, marker: str) -> bool:
    return any(t.startswith(marker) for t in _user_texts(body))


def measure(emu: Emulator, spans: Sequence[tuple[int, int]], figures: Figures) -> None:
    """Fill the request figures from what the emulator received during each turn."""
    records = emu.requests
    figures.requests = len(records)
    figures.rejected = sum(1 for r in records if r.status != 200)
    figures.uploaded = sum(r.body_bytes for r in records)
    figures.summarizer = sum(1 for r in records if _is_summarizer(r.body))
    figures.most_notices = max((sum(t.startswith(NOTICE_HEAD) for t in _user_texts(r.body))
                                for r in records if isinstance(r.body, dict)), default=0)
    for i, (start, end) in enumerate(spans):
        marker = f"[turn {i}]"
        for r in records[start:end]:
            if r.body is None or _is_summarizer(r.body):
                continue
            if not _has_turn(r.body, marker):
                figures.missing_request_turns += 1
                break


def _trace_event(event: Any) -> None:
    if type(event).__name__ not in ("ToolRun", "TurnFinished", "CompactionPhase"):
        print(f"    event {type(event).__name__}: {event.message.replace(chr(10), ' | ')[:300]}")


def run_ours(mode: Mode, texts: Sequence[str], *, model: str = "emulator",
             trace: bool = False) -> Figures:
    figures = Figures()
    spans: list[tuple[int, int]] = []
    with Emulator(**mode.emulator) as emu:
        session = ChatSession(model, emulator=emu, settings=Settings(), system=SYSTEM,
                              tools=[fetch_log], builtin_tools=False,
                              name=next(_session_names))
        if trace:
            session.subscribe(_trace_event)
        try:
            for i, text in enumerate(texts):
                start = len(emu.requests)
                try:
                    reply = session.send(text, stream=False)
                    figures.answered += 1
                    figures.on_topic += f"[turn {i}]" in reply.text
                except ChatError as e:
                    figures.lost += 1
                    figures.errors.append(str(e))
                spans.append((start, len(emu.requests)))
                if trace:
                    for r in emu.requests[start:]:
                        print(f"  turn {i}: status {r.status} body {r.body_bytes:,} B "
                              f"fault {r.fault} summarizer {_is_summarizer(r.body)}")
            figures.kept_messages = len(session.history)
            figures.kept_bytes = len(json.dumps(to_openai(session.history)).encode())
        finally:
            session.close()
        measure(emu, spans, figures)
    return figures


def run_baseline(mode: Mode, texts: Sequence[str]) -> Figures:
    figures = Figures()
    spans: list[tuple[int, int]] = []
    tool = as_tool(fetch_log)
    specs = [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                               "parameters": dict(tool.parameters)}}]
    with Emulator(**mode.emulator) as emu:
        client = emu.openai_client()
        bot = ChatCLIBaseline(client, model="emulator", window_tokens=emu.context_window,
                              tools={"fetch_log": fetch_log}, tool_specs=specs, system=SYSTEM)
        try:
            for i, text in enumerate(texts):
                start = len(emu.requests)
                turn = bot.send(text)
                if turn.answered:
                    figures.answered += 1
                    figures.on_topic += f"[turn {i}]" in turn.text
                else:
                    figures.lost += 1
                    figures.errors.append(turn.error)
                spans.append((start, len(emu.requests)))
        finally:
            client.close()
        figures.kept_messages = len(bot.history)
        figures.kept_bytes = len(json.dumps(to_openai(bot.history)).encode())
        measure(emu, spans, figures)
    return figures


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else ("n/a (0/0)" if not a else "inf")


def report(key: str, mode: Mode, turns: int, ours: Figures, base: Figures,
           out: Callable[[str], None] = print) -> None:
    out(f"== {key}: {mode.name}, {turns} turns ==")
    out(f"{'':28}{'ours':>12}{'baseline':>12}")
    rows = [("requests sent", "requests"), ("  of which summarizer", "summarizer"),
            ("requests rejected", "rejected"), ("turns answered", "answered"),
            ("  answer quotes its request", "on_topic"),
            ("turns lost", "lost"), ("history messages kept", "kept_messages"),
            ("history bytes kept", "kept_bytes"),
            ("turns sent w/o user request", "missing_request_turns"),
            ("most notices in a request", "most_notices"),
            ("bytes uploaded", "uploaded")]
    for label, attr in rows:
        out(f"{label:28}{getattr(ours, attr):>12,}{getattr(base, attr):>12,}")
    out(f"ratio {key} ours/baseline: answered {_ratio(ours.answered, base.answered)}, "
        f"on_topic {_ratio(ours.on_topic, base.on_topic)}, "
        f"requests {_ratio(ours.requests, base.requests)}, "
        f"rejected {_ratio(ours.rejected, base.rejected)}, "
        f"kept_bytes {_ratio(ours.kept_bytes, base.kept_bytes)}, "
        f"uploaded {_ratio(ours.uploaded, base.uploaded)}")
    for who, fig in (("ours", ours), ("baseline", base)):
        if fig.errors:
            out(f"  {who} first error: {fig.errors[0][:160]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--wire", choices=("openai", "anthropic"), default="openai",
                        help="our session's wire format (the baseline speaks openai)")
    parser.add_argument("--trace", action="store_true",
                        help="print our session's events and each request it caused")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply pasted-text and tool-result sizes (smoke tests: 0.2)")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.modes.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; use {', '.join(MODES)}")
    # Sessions write transcripts: keep them out of the user's state directory.
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as tmp:
        os.environ["IPY_CTXRECOVERY_DIR"] = tmp
        for key in keys:
            mode = MODES[key]
            if args.scale != 1.0:
                mode = Mode(mode.name, mode.emulator,
                            (int(mode.paste[0] * args.scale), int(mode.paste[1] * args.scale)),
                            int(mode.tool_chars * args.scale))
            texts = script(args.turns, mode)
            model = "emulator" if args.wire == "openai" else "emulator:anthropic"
            ours = run_ours(mode, texts, model=model, trace=args.trace)
            base = run_baseline(mode, texts)
            report(key, mode, args.turns, ours, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
