"""Hypothesis strategies for realistic histories (shared by every recovery-core test).

Public strategies:

- ``histories(valid_pairing=None, *, user_first=True, end_with_user=None, ...)``: a
  ``history.History`` with system messages in odd places (start and middle), user and
  assistant turns, assistant messages with 1-3 tool calls whose ids repeat across turns
  (``call_0`` in every turn), tool results from empty to ~60k chars (JSON, tracebacks,
  diffs, CSV, HTML, logs, plain text), reasoning blocks, tagged notices, ``meta`` dicts,
  and multibyte text (emoji with ZWJ/skin tones, flags, CJK, combining marks, Devanagari).

  ``valid_pairing``: True → ``history.problems()`` reports no pairing problem;
  False → at least one pairing problem (an orphan result, a missing result, or a result
  that drifted after a later message); None → either.
  ``user_first``: True → the first non-system message is a user message; None → sometimes
  not (as after a blind truncation); False → never.
  ``end_with_user``: True → the last message is a real user request (tag None);
  False → the history ends inside or after the model's reply (the current turn holds
  tool results, as when the budget runs mid tool loop); None → either.

- ``valid_histories(**kw)``: always ``history.problems() == []``; after the system messages
  it starts with a user message and it ends with a real user request (tag None).

- ``multibyte_text(max_pieces=...)``: short text mixing ASCII and multi-codepoint clusters.

Generation is cheap: big tool results are built from templates around a short drawn seed,
never drawn character by character.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from hypothesis import strategies as st

from ipy_ctxrecovery.core import history as h
from ipy_ctxrecovery.core.history import Message, Reasoning, Role, Text, ToolCall

__all__ = [
    "MULTIBYTE_PIECES",
    "RESULT_KINDS",
    "histories",
    "multibyte_text",
    "result_content",
    "valid_histories",
]

# Grapheme clusters and characters that break naive byte/char cuts.
MULTIBYTE_PIECES: tuple[str, ...] = (
    "é", "ß", "ñ", "ø", "中", "文", "日本語", "한국어", "д", "Ж",
    "😀", "🚀", "👍🏽", "👨\u200d👩\u200d👧", "🇧🇷", "e\u0301", "a\u0308\u0323",
    "\u0915\u094d\u0937", "𝔘", "\u00a0", "—", "…", "€",
)
_ASCII_PIECES: tuple[str, ...] = (
    "a", "b", "x", "z", " ", "the ", "file ", "error ", "ok", "42", ".", ",", "\n", "\t",
    "{", "}", "\"", "\\", "/", ":", "-",
)

RESULT_KINDS: tuple[str, ...] = ("text", "json", "traceback", "diff", "csv", "html", "log")

_TOOL_NAMES = ("read_file", "run_shell", "grep", "list_dir", "python")


_PIECE = st.sampled_from(_ASCII_PIECES + MULTIBYTE_PIECES)


@functools.cache
def multibyte_text(*, min_pieces: int = 0, max_pieces: int = 12) -> st.SearchStrategy[str]:
    """Short text from ASCII and multibyte pieces (never lone surrogates).

    Cached: building strategies afresh on every draw dominated generation time.
    """
    return st.lists(_PIECE, min_size=min_pieces, max_size=max_pieces).map("".join)


def _build_content(kind: str, seed: str, size: int) -> str:
    """A tool result of roughly ``size`` chars (≥ size when size > 0, then cut to size)."""
    if size <= 0:
        return ""
    seed = seed or "x"
    if kind == "json":
        item = json.dumps({"name": seed, "value": 1}, ensure_ascii=False)
        count = size // (len(item) + 2) + 1
        body = "[" + ", ".join(item for _ in range(count)) + "]"
        # Keep JSON intact (detection and realism); may overshoot size a little.
        return body if len(body) <= size + len(item) + 2 else body
    if kind == "traceback":
        frame = f'  File "/srv/app/{seed}.py", line 12, in handler\n    do_it()\n'
        count = max(1, size // len(frame))
        return ("Traceback (most recent call last):\n" + frame * count
                + f"ValueError: bad value {seed}\n")
    if kind == "diff":
        hunk = f"@@ -1,2 +1,2 @@\n-old {seed}\n+new {seed}\n context\n"
        count = max(1, size // len(hunk))
        return "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n" + hunk * count
    if kind == "csv":
        row = f"1,{seed.replace(',', ';').replace(chr(10), ' ')},3.5\n"
        count = max(1, size // len(row))
        return "id,name,score\n" + row * count
    if kind == "html":
        para = f"<p>{seed}</p>\n"
        count = max(1, size // len(para))
        return "<!DOCTYPE html>\n<html><body>\n" + para * count + "</body></html>\n"
    if kind == "log":
        line = f"2026-01-01T00:00:00Z INFO worker: {seed}\n"
        return (line * (size // len(line) + 1))[:size]
    line = f"{seed} lorem ipsum\n"
    return (line * (size // len(line) + 1))[:size]


@functools.cache
def _sizes(max_chars: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, min(300, max_chars)), st.integers(0, min(6_000, max_chars)),
                     st.integers(0, max_chars))


@functools.cache
def result_content(*, max_chars: int = 60_000) -> st.SearchStrategy[str]:
    """A tool result's content: mostly small, sometimes large, sometimes empty."""
    return st.tuples(st.sampled_from(RESULT_KINDS), multibyte_text(min_pieces=1, max_pieces=8),
                     _sizes(max_chars)).map(lambda t: _build_content(t[0], t[1], t[2]))


# Nested values too, so a test can see whether a step mutated a meta dict in place;
# st.builds(dict) gives every message its own (empty) dict.
_META: st.SearchStrategy[dict[str, Any]] = st.one_of(st.builds(dict), st.fixed_dictionaries(
    {"origin": st.sampled_from(["cell", "transcript"]),
     "notes": st.lists(st.integers(0, 9), max_size=2)}))


def _meta(draw: st.DrawFn) -> dict[str, Any]:
    return draw(_META)


@functools.cache
@st.composite
def _assistant_round(draw: st.DrawFn, turn: int, id_style: str,
                     max_result_chars: int) -> list[Message]:
    """One model round trip that calls 1-3 tools, followed by their results."""
    count = draw(st.integers(1, 3))
    calls = []
    for k in range(count):
        if id_style == "repeat":
            call_id = f"call_{k}"        # the same ids in every turn (some providers do this)
        elif id_style == "anthropic":
            call_id = f"toolu_{k}"
        else:
            call_id = f"call_{turn}_{k}_{draw(st.integers(0, 99))}"
        name = draw(st.sampled_from(_TOOL_NAMES))
        args = json.dumps({"path": draw(multibyte_text(max_pieces=4)) + ".txt"},
                          ensure_ascii=draw(st.booleans()))
        calls.append(ToolCall(call_id, name, args))
    blocks: list[Any] = []
    if draw(st.integers(0, 3)) == 0:
        blocks.append(Reasoning(draw(multibyte_text(min_pieces=1)),
                                draw(st.one_of(st.none(), st.just("sig-abc")))))
    if draw(st.booleans()):
        blocks.append(Text(draw(multibyte_text(min_pieces=1))))
    blocks.extend(calls)
    results = [
        Message.tool(c.id, draw(result_content(max_chars=max_result_chars)),
                     is_error=draw(st.integers(0, 9)) == 0, name=c.name)
        for c in calls
    ]
    if len(results) > 1 and draw(st.integers(0, 3)) == 0:
        results = draw(st.permutations(results))   # parallel calls may answer out of order
    return [Message(Role.ASSISTANT, tuple(blocks)), *results]


@functools.cache
@st.composite
def _turn(draw: st.DrawFn, turn: int, id_style: str, max_result_chars: int,
          *, last: bool, end_with_user: bool) -> list[Message]:
    """A user request, 0-3 tool rounds, and (usually) the model's final answer."""
    msgs = [Message(Role.USER, (Text(draw(multibyte_text(min_pieces=1))),), meta=_meta(draw))]
    if last and end_with_user:
        return msgs
    for _ in range(draw(st.integers(0, 3))):
        msgs.extend(draw(_assistant_round(turn, id_style, max_result_chars)))
    # A history captured mid tool loop ends on tool results: no final answer yet.
    if not (last and len(msgs) > 1 and draw(st.booleans())):
        reasoning = draw(st.one_of(st.none(), multibyte_text(min_pieces=1)))
        msgs.append(Message.assistant(draw(multibyte_text(min_pieces=1, max_pieces=20)),
                                      reasoning=reasoning))
    return msgs


def _tool_spans(hist: list[Message]) -> list[int]:
    return [i for i, m in enumerate(hist) if m.role is Role.TOOL]


def _pairing_broken(hist: list[Message]) -> bool:
    return any("first non-system" not in p for p in h.problems(hist))


@st.composite
def _break_pairing(draw: st.DrawFn, hist: list[Message]) -> list[Message]:
    """Apply 1-3 pairing faults; guarantee the result has a pairing problem."""
    out = list(hist)
    for _ in range(draw(st.integers(1, 3))):
        fault = draw(st.sampled_from(("missing", "orphan", "drift", "system_between")))
        tools = _tool_spans(out)
        if fault == "missing" and tools:
            del out[draw(st.sampled_from(tools))]
        elif fault == "drift" and tools:
            i = draw(st.sampled_from(tools))
            moved = out.pop(i)
            # Past at least one later non-tool message (a user message got in between).
            later = [j for j in range(i, len(out)) if out[j].role is not Role.TOOL]
            if later:
                out.insert(draw(st.sampled_from(later)) + 1, moved)
            else:
                out.insert(i, moved)
                out.insert(i, Message.user(draw(multibyte_text(min_pieces=1))))
        elif fault == "system_between" and tools:
            i = draw(st.sampled_from(tools))
            out.insert(i, Message.system("mid-loop system note"))
        else:
            call_id = draw(st.sampled_from(("call_0", "call_1", "call_9", "toolu_0", "ghost")))
            pos = draw(st.integers(0, len(out)))
            out.insert(pos, Message.tool(call_id, draw(result_content(max_chars=2_000))))
    if not _pairing_broken(out):
        out.append(Message.tool("orphan_tail", "stray result"))
    return out


@st.composite
def histories(draw: st.DrawFn, valid_pairing: bool | None = None, *,
              user_first: bool | None = True, end_with_user: bool | None = None,
              min_turns: int = 1, max_turns: int = 6,
              max_result_chars: int = 60_000) -> h.History:
    """A realistic history; see the module docstring for the flags."""
    if valid_pairing is None:
        valid_pairing = draw(st.integers(0, 3)) != 0
    if end_with_user is None:
        end_with_user = draw(st.booleans())
    id_style = draw(st.sampled_from(("repeat", "repeat", "anthropic", "unique")))
    n_turns = draw(st.integers(min_turns, max_turns))

    out: list[Message] = []
    for _ in range(draw(st.integers(0, 2))):
        out.append(Message.system(draw(multibyte_text(min_pieces=1))))
    if draw(st.integers(0, 4)) == 0:
        out.append(Message.user("[STRUCTURED SUMMARY — covering 6 earlier messages]\n"
                                + draw(multibyte_text(min_pieces=1)), tag=h.TAG_SUMMARY))
        out.append(Message.assistant("Understood."))
    for t in range(n_turns):
        if t and draw(st.integers(0, 5)) == 0:
            out.append(Message.system(draw(multibyte_text(min_pieces=1))))  # mid-history
        if t and draw(st.integers(0, 9)) == 0:
            out.append(Message.user(draw(st.sampled_from(
                ("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] compacted.", "[Context compacted.]"))),
                tag=draw(st.sampled_from((h.TAG_PAYLOAD_NOTICE, h.TAG_COMPACTION_NOTICE)))))
        out.extend(draw(_turn(t, id_style, max_result_chars, last=t == n_turns - 1,
                              end_with_user=end_with_user)))

    if not valid_pairing:
        out = draw(_break_pairing(out))
        if end_with_user and out[-1].role is not Role.USER:
            out.append(Message.user(draw(multibyte_text(min_pieces=1))))

    if user_first is False or (user_first is None and draw(st.integers(0, 3)) == 0):
        # As after a blind cut: drop the leading user message(s) of the first turn.
        first = next((i for i, m in enumerate(out) if m.role is not Role.SYSTEM), None)
        if first is not None and out[first].role is Role.USER and len(out) > first + 1:
            del out[first]
        first = next((i for i, m in enumerate(out) if m.role is not Role.SYSTEM), None)
        if user_first is False and (first is None or out[first].role is Role.USER):
            out.insert(first if first is not None else len(out),
                       Message.assistant(draw(multibyte_text(min_pieces=1))))
    return tuple(out)


def valid_histories(*, min_turns: int = 1, max_turns: int = 6,
                    max_result_chars: int = 60_000) -> st.SearchStrategy[h.History]:
    """Histories with ``problems() == []`` that end with a real user request."""
    return histories(True, user_first=True, end_with_user=True, min_turns=min_turns,
                     max_turns=max_turns, max_result_chars=max_result_chars)
