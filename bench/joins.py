"""Evidence: how much of a long answer comes back when a small model continues it badly.

Run: ``python bench/joins.py`` (``--max-tokens 40``; ``--quick`` for one answer).

Three long answers (prose, markdown with a list and a code block, Portuguese prose) are
asked of the emulator over HTTP with the real OpenAI SDK, at a small ``max_tokens``, so
each is cut and continued several times. The emulator answers the continuation prompt in
each of the ways SmolLM2-135M was seen to (``continuation_repeat`` / ``continuation_opener``):
exactly, restarting the answer with its opening in bold, with a meta opener line
("Here's the continuation:"), echoing the continuation prompt, and mixes of them.

The same continuations are joined twice: by rules 1–4 only of
``core/continuation.py``'s join rule (how main joined: exact repeats, re-opened fences,
separators), and by the whole rule (meta openers and echoes dropped, restarts detected,
the held-back word put back). Per answer and mode it prints the fidelity of each joined
text to the full answer: the characters of the full answer recovered in order (difflib's
matching blocks), the extra characters (duplicates and meta text), the meta and prompt
text left in it, and whether it is exactly the answer. Figures, never verdicts.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ipy_ctxrecovery import ChatSession, Settings  # noqa: E402
from ipy_ctxrecovery.core import continuation as cont  # noqa: E402
from ipy_ctxrecovery.emulator import Emulator  # noqa: E402
from ipy_ctxrecovery.emulator.replies import META_OPENERS  # noqa: E402
from ipy_ctxrecovery.providers import make_provider  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "exact": {},
    "restart": {"continuation_repeat": "restart"},
    "meta": {"continuation_opener": "meta"},
    "echo": {"continuation_opener": "echo"},
    "meta+restart": {"continuation_opener": "meta", "continuation_repeat": "restart"},
    "echo+restart": {"continuation_opener": "echo", "continuation_repeat": "restart",
                     "continuation_leading_space": False},
}


def answers() -> dict[str, str]:
    appliances = ["refrigerator", "freezer", "dishwasher", "oven", "kettle", "toaster",
                  "blender", "microwave", "washer", "dryer", "heater", "fan"]
    prose = " ".join(
        f"A household {a} number {i} is a versatile appliance that uses {30 + 7 * i} watts "
        f"on average and lasts about {5 + i % 9} years. " for i, a in enumerate(appliances * 2))
    code = "\n".join(f"    total{i} = compute{i}(values[{i}]) * {i + 2}" for i in range(14))
    markdown = ("## Plan\n\n" + "\n".join(f"- step {i}: check column_{i} against limit {i * 3}"
                                          for i in range(1, 13))
                + "\n\n```python\ndef run(values):\n" + code + "\n    return total13\n```\n\n"
                "That is the whole plan; each step is checked before the next one starts.")
    portuguese = " ".join(
        f"O experimento {i} mediu {12 + i} amostras a {20 + i} graus, e a média foi {i}.{i + 1}."
        for i in range(30))
    return {"prose": prose, "markdown": markdown, "portuguese": portuguese}


def rules_1_to_4(previous: str, continuation: str) -> str:
    """The join as main had it: rules 1–4 of the join rule, nothing of rules 5–7."""
    if not continuation.strip():
        return previous
    sent = previous[:cont.resume_point(previous)]
    if cont._only_repeats(sent, continuation):
        return previous
    skip = cont.overlap(sent, continuation)
    if not skip:
        fence = cont._reopened_fence(sent, continuation)
        skip = fence + cont.overlap(sent, continuation[fence:]) if fence else 0
    rest = continuation[skip:]
    if sent and sent[-1] in " \t":
        rest = rest.lstrip(" \t")
    return sent + rest


class Recording:
    """The emulator's provider, keeping the text of every answer it returns."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider
        self.texts: list[str] = []

    def send(self, request: Any, on_text: Any = None) -> Any:
        response = self._provider.send(request, on_text)
        self.texts.append(response.message.text)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)


META_TEXTS = (*META_OPENERS, *(line for line in cont.CONTINUATION_PROMPT.split("\n")))


def fidelity(full: str, joined: str) -> str:
    matched = sum(b.size for b in difflib.SequenceMatcher(
        None, full, joined, autojunk=False).get_matching_blocks())
    meta = sum(joined.count(t) * len(t) for t in META_TEXTS)
    return (f"recovered {matched:,}/{len(full):,} chars ({matched / len(full):.1%}), "
            f"extra {len(joined) - matched:,}, meta/prompt text {meta:,}, "
            f"exact {'yes' if joined == full else 'no'}")


def run(name: str, text: str, mode: str, max_tokens: int, files: str) -> list[str]:
    with Emulator(**MODES[mode]) as emu:
        provider = Recording(make_provider("emulator", emulator=emu))
        session = ChatSession(provider=provider, settings=Settings(max_token_escalations=10),
                              name=f"bench-joins-{mode.replace('+', '-')}", files_root=files)
        try:
            reply = session.send("[[echo]]" + text, max_tokens=max_tokens, record=False,
                                 stream=False)
        finally:
            session.close()
    parts = provider.texts
    before = parts[0]
    for part in parts[1:]:
        before = rules_1_to_4(before, part)
    return [f"{name:<10} {mode:<13} {len(parts) - 1} continuations",
            f"    before (rules 1–4): {fidelity(text, before)}",
            f"    after  (rules 1–7): {fidelity(text, reply.text)}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="one answer only")
    args = parser.parse_args(argv)
    texts = answers()
    if args.quick:
        texts = {"prose": texts["prose"]}
    say: Callable[[str], None] = print
    with tempfile.TemporaryDirectory(prefix="ctxbench-") as files:
        for name, text in texts.items():
            for mode in MODES:
                for line in run(name, text, mode, args.max_tokens, files):
                    say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
