"""Benchmark: how many of the user's rules survive compaction word for word (issue 27).

Run: ``python bench/user_words.py`` (``--turns 20`` for a short run).

A conversation behind a proxy that refuses bodies over ``--cap`` (48 KB, configured as the
payload cap) runs against the emulator; every turn carries a figure, and four turns state a rule the user wants kept
("Always…", "Never…", "From now on…", a correction). It runs twice: with the rules pinned
and the user's messages kept (the defaults, ``core/pins.py``), and without
(``pinned_rules_max_chars=0, user_words_share=0``: only the summary carries them). For each
it prints the compactions, and how many rules the last request carries verbatim. Figures,
never verdicts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ipy_ctxrecovery import ChatSession, Emulator, Settings  # noqa: E402

RULES = ("Always report areas in square metres.", "Never drop the parcel_id column.",
         "From now on, round every figure to two decimals.",
         "No, I meant the median price, not the mean.")


def run(turns: int, cap: int, settings: Settings, name: str) -> tuple[int, int, int]:
    """(compactions, rules in the last request verbatim, turns answered)."""
    at = {turns * k // 5: rule for k, rule in enumerate(RULES, start=1)}
    with Emulator(context_window=200_000, max_body=cap) as emu:
        session = ChatSession("emulator", emulator=emu, settings=settings, name=name)
        answered = 0
        for i in range(turns):
            text = (f"Turn {i}: parcel {1000 + i} has {37 + i * 3} m2 at {210 + i} per m2; "
                    + "notes " * 150).rstrip() + "."
            if i in at:
                text += " " + at[i]
            try:
                session.send(text, stream=False)
                answered += 1
            except Exception as e:          # a figure, not a verdict: count and go on
                print(f"  turn {i}: {type(e).__name__}", file=sys.stderr)
        last = json.dumps(emu.requests[-1].body, ensure_ascii=False)
        kept = sum(json.dumps(rule, ensure_ascii=False)[1:-1] in last for rule in RULES)
        compactions = session.status().compactions
        session.close()
    return compactions, kept, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--cap", type=int, default=48 * 1024, help="bytes")
    args = parser.parse_args()
    # The cap is configured (CHATCLI_MAX_PAYLOAD), so pre-flight compacts before a send.
    cases = {"pinned": Settings(max_payload=args.cap),
             "unpinned": Settings(max_payload=args.cap, pinned_rules_max_chars=0,
                                  user_words_share=0)}
    for label, settings in cases.items():
        compactions, kept, answered = run(args.turns, args.cap, settings, f"bench-{label}")
        print(f"{label}: {answered}/{args.turns} turns answered, {compactions} compactions, "
              f"rules verbatim in the last request {kept}/{len(RULES)}")


if __name__ == "__main__":
    main()
