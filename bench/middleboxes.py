"""Benchmark: 40 turns behind real middleboxes, our ChatSession against the bare SDK.

Run: ``python bench/middleboxes.py`` (``--kinds nginx-413,squid``, ``--wires openai``,
``--turns 40``, ``--limit 56KB``). Needs the Debian packages ``.ci/run`` installs; a kind
whose program is missing is reported as such and skipped.

Each middlebox of ``tests/middleboxes.py`` runs on 127.0.0.1 with a body limit in front of
an emulator with no limits of its own, and the same conversation (``[turn i]`` and ~6 KB
of plain prose per turn, ``tests/middlebox_chat.py``) goes through it twice per wire:
(a) ``ChatSession`` with the real SDK client pointed at the middlebox, (b) the bare SDK —
the same client resending the whole growing history, a failed turn's message taken back.
Both keep the SDKs' default retries. ModSecurity is also run with one message CRS blocks
for its content (a SQL injection) planted early (turn 3) and late (turn 30, when
``--turns`` reaches it).

Per row, counted from the middlebox's own access log (so SDK retries count): requests,
rejected requests by status and per limit (ModSecurity has two: its body size, 413, and
CRS's verdict on content, 403 — the planted message's or the package's own requests';
every other kind has one), turns answered; for ours the smallest learned cap and the
largest body that passed (what the upstream answered 200). Then a ``ratio`` line per row
pair. Figures, not verdicts: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import middlebox_chat as chat  # noqa: E402
from middleboxes import KINDS, Middlebox, missing, start  # noqa: E402

from ipy_ctxrecovery import Emulator, parse_size  # noqa: E402

# Fixed-length fresh names: a reused name would resume the earlier run's transcript.
_names = (f"bench-box-{n:03d}" for n in itertools.count(1))


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    planted_at: int | None = None


def scenarios(kinds: Sequence[str], turns: int) -> list[Scenario]:
    out = [Scenario(kind, kind) for kind in kinds]
    if "modsec" in kinds:
        out += [Scenario(f"modsec +SQLi@{at}", "modsec", at)
                for at in (chat.PLANTED_EARLY, chat.PLANTED_LATE) if at < turns]
    return out


@dataclass
class Figures:
    requests: int = 0
    by_status: str = ""
    size_rejections: int = 0
    content_rejections: int = 0
    answered: int = 0
    min_cap: int | None = None
    largest_passed: int = 0
    first_error: str = ""


def run(turns: Iterator[chat.Turn], box: Middlebox) -> Figures:
    before = len(box.requests())
    fig = Figures()
    for turn in turns:
        fig.answered += turn.answered
        if turn.learned_cap is not None:
            fig.min_cap = turn.learned_cap if fig.min_cap is None else min(fig.min_cap,
                                                                           turn.learned_cap)
        fig.largest_passed = turn.largest_passed
        if not turn.answered and not fig.first_error:
            fig.first_error = f"turn {turn.index}: {turn.error}"
    logged = box.requests()[before:]
    rejected = Counter(r.status for r in logged if r.status != 200)
    fig.requests = len(logged)
    fig.by_status = ", ".join(f"{n}×{s}" for s, n in sorted(rejected.items())) or "0"
    # ModSecurity has two limits: its body size (413) and CRS's verdict on content (403:
    # the planted message, or the package's own requests). Any other kind has one.
    fig.content_rejections = rejected.pop(403, 0) if box.kind == "modsec" else 0
    fig.size_rejections = sum(rejected.values())
    return fig


def _kb(n: int | None) -> str:
    return "—" if n is None else f"{n / 1024:.1f} KB"


def report(scenario: Scenario, wire: str, turns: int, ours: Figures, bare: Figures,
           out: Callable[[str], None] = print) -> None:
    for who, fig in (("ours", ours), ("bare SDK", bare)):
        content = f", content {fig.content_rejections}" if scenario.kind == "modsec" else ""
        cap = f"min learned cap {_kb(fig.min_cap)} vs largest passed " \
              f"{_kb(fig.largest_passed)}" if who == "ours" else ""
        out(f"{scenario.name:18} {wire:9} {who:8} answered {fig.answered:>2}/{turns}  "
            f"requests {fig.requests:>3}  rejected {fig.by_status:14} "
            f"(size limit {fig.size_rejections}{content})  {cap}".rstrip())
        if fig.first_error:
            out(f"{'':37}first lost {fig.first_error[:150]}")
    out(f"ratio {scenario.name} {wire} ours/bare: answered "
        f"{ours.answered / bare.answered if bare.answered else float('inf'):.2f}, size "
        f"rejections {ours.size_rejections}/{bare.size_rejections}")


def bench(scenario: Scenario, wire: str, turns: int, limit: int, upstream: Emulator,
          workdir: Path) -> tuple[Figures, Figures]:
    planted = {scenario.planted_at: chat.SQL_INJECTION} if scenario.planted_at is not None else {}
    texts = chat.script(turns, planted=planted)
    box = start(scenario.kind, upstream.url, limit=limit,
                workdir=workdir / f"{scenario.kind}-{wire}-{scenario.planted_at}")
    try:
        with chat.new_session(wire, box, upstream, next(_names)) as session:
            ours = run(chat.session_turns(session, texts, upstream), box)
        bare = run(chat.bare_turns(wire, box, upstream, texts), box)
    finally:
        box.stop()
    return ours, bare


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated, from {', '.join(KINDS)}")
    parser.add_argument("--wires", default=",".join(chat.WIRES))
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--limit", default="56KB", help="the middleboxes' body limit")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    wires = [w.strip() for w in args.wires.split(",") if w.strip()]
    bad = [k for k in kinds if k not in KINDS] + [w for w in wires if w not in chat.WIRES]
    if bad:
        parser.error(f"unknown kind(s)/wire(s) {', '.join(bad)}; kinds: {', '.join(KINDS)}; "
                     f"wires: {', '.join(chat.WIRES)}")
    limit = parse_size(args.limit)
    with tempfile.TemporaryDirectory(prefix="ctxbench-boxes-") as tmp:
        os.environ["IPY_CTXRECOVERY_DIR"] = str(Path(tmp) / "state")
        with Emulator(context_window=1_000_000) as upstream:
            for scenario in scenarios(kinds, args.turns):
                reason = missing(scenario.kind)
                if reason is not None:
                    print(f"{scenario.name:18} not run: {reason}")
                    continue
                for wire in wires:
                    ours, bare = bench(scenario, wire, args.turns, limit, upstream, Path(tmp))
                    report(scenario, wire, args.turns, ours, bare)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
