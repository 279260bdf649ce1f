"""The emulator's deterministic reply script and token rule (no I/O, no HTTP).

Both wire formats are first normalized to a list of :class:`Turn` (one per wire message;
Anthropic's top-level ``system`` becomes a leading system turn), then :func:`plan` decides
the whole answer: text or tool calls, the stop reason and the usage numbers. The rules are
documented in the package docstring (``ipy_ctxrecovery.emulator``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import markers
from ..core import recall as recall_format
from ..core.continuation import CONTINUATION_PROMPT
from ..core.cuts import head_cut
from ..core.facts import FACTS_HEADING
from ..core.markers import MERGED_TEXT_JOIN
from ..core.prompts import (
    COMPACTION_NOTICE,
    PAYLOAD_NOTICE,
    SUMMARY_CODE_SECTIONS,
    SUMMARY_HEADER,
    SUMMARY_SECTIONS,
    summary_header,
)

__all__ = [
    "summary_answer",
    "CONTINUATION_OPENERS",
    "CONTINUATION_REPEATS",
    "Continuation",
    "Plan",
    "ToolCall",
    "Turn",
    "anthropic_turns",
    "count_tokens",
    "openai_turns",
    "paragraph_pieces",
    "plan",
    "prompt_tokens",
    "recall_arguments",
    "summarize",
    "with_call_ids",
]

#: Per-message overhead and per-request priming of the token rule.
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REQUEST = 3
BYTES_PER_TOKEN = 4
#: Characters of the latest user text quoted by the default reply.
QUOTE_CHARS = 60
#: ``[[words N]]`` larger than this is clamped, so a typo cannot allocate gigabytes.
MAX_WORDS = 200_000
#: Summary bound: a quarter of the input, at most this many characters.
SUMMARY_MAX_CHARS = 2_000
SUMMARY_FRACTION = 4
SUMMARY_ITEM_CHARS = 160

CONTINUATION_MARK = CONTINUATION_PROMPT.split("\n", 1)[0]
SUMMARY_MARK = "STRUCTURED SUMMARY"
#: User messages the recovery machinery writes; they are not the user's request. Taken
#: from the texts the package writes, so a rewording cannot make the emulator answer them.
_MACHINE_PREFIXES = (
    PAYLOAD_NOTICE.partition(" —")[0],              # "[SYSTEM NOTICE"
    COMPACTION_NOTICE.partition(" due to")[0],      # "[Context was automatically compacted"
    SUMMARY_HEADER.partition(" —")[0],              # "[STRUCTURED SUMMARY"
)

_WORDS_RE = re.compile(r"\[\[words\s+(\d+)\s*\]\]")
_ECHO_RE = re.compile(r"\[\[echo\]\]\n?")
_FENCE_MARKS = ("```", "~~~")

CONTINUATION_REPEATS = ("line", "fence", "restart")
"""Named repeats of :class:`Continuation` (besides a number of characters)."""
CONTINUATION_OPENERS = ("meta", "echo")
"""What :class:`Continuation` may write before the text, as small models do."""
META_OPENERS = ("Here's the continuation:", "Continuing from where I left off:",
                "Sure! Here is the rest of the answer:", "(continued)",
                "Aqui está a continuação:")
"""The meta openers the emulator writes in turn (``opener="meta"``), as SmolLM2 does."""
_RESTART_WORDS = 6
_TOOL_RE = re.compile(r"\[\[tool\s+([A-Za-z0-9_.:-]+)\s*")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the emulator emits: ``number`` counts the calls of the history it
    answers; ``ident`` is its id on the wire (:func:`with_call_ids`; unset, ``call_<n>`` /
    ``toolu_<n>``)."""

    number: int
    name: str
    arguments: str
    ident: str = ""

    def input(self) -> Any:
        return json.loads(self.arguments)

    def wire_id(self, prefix: str) -> str:
        """Its id on the wire: ``ident``, else ``prefix`` and its number."""
        return self.ident or f"{prefix}{self.number}"


@dataclass(frozen=True, slots=True)
class Turn:
    """One wire message, normalized: its visible text, everything countable, tool parts."""

    role: str
    text: str = ""
    counted: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()
    """(name, arguments) of each tool call an assistant turn made."""
    tool_results: tuple[str, ...] = ()
    """Content of each tool result the turn carries."""
    pieces: tuple[str, ...] | None = None
    """Each text block (Anthropic) / text part (OpenAI list content) / paragraph run between
    the package's own texts (OpenAI string content: :func:`paragraph_pieces`) on its own;
    None means the one piece ``text``. Both adapters merge consecutive user messages, so a
    summary or notice and the real request can arrive in one message."""

    def text_pieces(self) -> tuple[str, ...]:
        return (self.text,) if self.pieces is None else self.pieces


@dataclass(frozen=True, slots=True)
class Plan:
    """The full answer to one request, before wire formatting."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish: str
    """``stop`` | ``length`` | ``tool_calls`` (mapped to each format's names)."""
    prompt_tokens: int
    completion_tokens: int
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Continuation:
    """How the emulator answers the continuation prompt — in a new message, as a chat
    model does, resuming the original answer at ``at``, the end of what it was sent back.

    ``leading_space`` False: the message starts at its first visible character (a chat
    message never starts with whitespace), so the space or newline at ``at`` is lost.
    ``repeat``: 0 resumes exactly at ``at``; a number N starts N characters earlier,
    repeating them; ``"line"`` restarts the interrupted line from its beginning;
    ``"fence"`` inside an open code block writes its opening fence line again first;
    ``"restart"`` starts the answer over from its beginning, its first words in bold when
    they end before ``at`` ("**A household refrigerator is** a versatile…", as SmolLM2-135M
    does), then goes on past ``at`` as the answer does.
    ``opener``: ``"meta"`` writes a meta opener line first (:data:`META_OPENERS`, in turn
    by ``at``); ``"echo"`` writes the continuation prompt back first.
    A prefilled Anthropic turn is always continued exactly; these apply to the prompt only.
    """

    leading_space: bool = True
    repeat: int | str = 0
    opener: str | None = None

    def resume(self, full: str, at: int) -> str:
        start = at
        if isinstance(self.repeat, int):
            start = max(0, at - self.repeat)
        elif self.repeat == "line":
            start = full.rfind("\n", 0, at) + 1
        elif self.repeat == "restart":
            start = 0
        text = full[start:]
        if self.repeat == "fence":
            fence = _open_fence_line(full[:at])
            if fence is not None:
                text = fence + "\n" + text
        elif self.repeat == "restart":
            text = _bold_opening(text, at)
        text = text if self.leading_space else text.lstrip()
        if self.opener == "meta":
            text = META_OPENERS[at % len(META_OPENERS)] + "\n\n" + text.lstrip()
        elif self.opener == "echo":
            text = CONTINUATION_PROMPT + "\n\n" + text.lstrip()
        return text


def _bold_opening(text: str, at: int) -> str:
    """``text`` with its first words in bold, when they end before ``at``."""
    found = re.match(rf"\s*(?:\S+[ ]){{1,{_RESTART_WORDS - 1}}}\S+", text)
    if found is None or found.end() > at or "*" in found.group() or "\n" in found.group():
        return text
    lead = len(found.group()) - len(found.group().lstrip())
    return f"{text[:lead]}**{found.group()[lead:]}**{text[found.end():]}"


def _open_fence_line(text: str) -> str | None:
    """The opening fence line of the code block still open at the end of ``text``."""
    opened: str | None = None
    for line in text.split("\n"):
        if line.lstrip(" ").startswith(_FENCE_MARKS):
            opened = line if opened is None else None
    return opened


def count_tokens(text: str) -> int:
    """The token rule: ``ceil(len(text.encode("utf-8")) / 4)``."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


def prompt_tokens(turns: Sequence[Turn], tools: Any = None) -> int:
    """Σ (tokens(countable text of the message) + 4) + 3, plus tokens(json.dumps(tools))."""
    total = TOKENS_PER_REQUEST + sum(count_tokens(t.counted) + TOKENS_PER_MESSAGE for t in turns)
    if tools:
        total += count_tokens(json.dumps(tools))
    return total


# --------------------------------------------------------------------------- normalization


def _pieces_of(content: Any) -> list[str]:
    """Text pieces of a content value: a string, or a list of parts/blocks with text."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") in (None, "text", "input_text"):
                parts.append(str(part.get("text", "")))
        return parts
    return [str(content)]


def _text_of(content: Any) -> str:
    """Text of a content value, its pieces joined."""
    return "".join(_pieces_of(content))


def openai_turns(body: Mapping[str, Any]) -> list[Turn]:
    """Normalize an OpenAI Chat Completions request's ``messages``."""
    turns: list[Turn] = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, Mapping):
            continue
        role = str(msg.get("role", "user"))
        if role == "developer":
            role = "system"
        content = msg.get("content")
        pieces = _pieces_of(content)
        text = "".join(pieces)
        if isinstance(content, str):
            pieces = paragraph_pieces(content)
        counted = [text]
        refusal = msg.get("refusal")
        if isinstance(refusal, str):
            counted.append(refusal)
        for key in ("reasoning_content", "reasoning"):
            if isinstance(msg.get(key), str):
                counted.append(msg[key])
        calls: list[tuple[str, str]] = []
        for call in msg.get("tool_calls") or []:
            if not isinstance(call, Mapping):
                continue
            fn = call.get("function") or {}
            name, args = str(fn.get("name", "")), str(fn.get("arguments", ""))
            calls.append((name, args))
            counted += [name, args]
        if role in ("tool", "function"):
            turns.append(Turn("tool", "", text, tool_results=(text,)))
        else:
            turns.append(Turn(role, text, "".join(counted), tuple(calls), pieces=tuple(pieces)))
    return turns


def anthropic_turns(body: Mapping[str, Any]) -> list[Turn]:
    """Normalize an Anthropic Messages request's ``system`` and ``messages``."""
    turns: list[Turn] = []
    system = _text_of(body.get("system"))
    if system:
        turns.append(Turn("system", system, system))
    for msg in body.get("messages") or []:
        if not isinstance(msg, Mapping):
            continue
        role = str(msg.get("role", "user"))
        content = msg.get("content")
        if isinstance(content, str) or content is None:
            text = content or ""
            turns.append(Turn(role, text, text))
            continue
        texts: list[str] = []
        counted: list[str] = []
        calls: list[tuple[str, str]] = []
        results: list[str] = []
        for block in content:
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text", "")))
                counted.append(texts[-1])
            elif kind == "thinking":
                counted.append(str(block.get("thinking", "")))
            elif kind == "redacted_thinking":
                counted.append(str(block.get("data", "")))
            elif kind in ("tool_use", "server_tool_use"):
                name, args = str(block.get("name", "")), json.dumps(block.get("input", {}))
                calls.append((name, args))
                counted += [name, args]
            elif kind == "tool_result":
                result = _text_of(block.get("content"))
                results.append(result)
                counted.append(result)
        text = "".join(texts)
        if role == "user" and results and not text.strip():
            turns.append(Turn("tool", "", "".join(counted), tool_results=tuple(results)))
        else:
            turns.append(Turn(role, text, "".join(counted), tuple(calls), tuple(results),
                              tuple(texts)))
    return turns


# --------------------------------------------------------------------------- the script


def _piece_kind(piece: str) -> str:
    """``blank`` | ``machine`` (summary/notice) | ``continuation`` | ``real``."""
    stripped = piece.lstrip()
    if not stripped:
        return "blank"
    if stripped.startswith(_MACHINE_PREFIXES):
        return "machine"
    if stripped.startswith(CONTINUATION_MARK):
        return "continuation"
    return "real"


def paragraph_pieces(text: str) -> list[str]:
    """A string content's pieces: the texts of a merged run (a summary, a notice, the
    request) that the OpenAI adapter sends as one string, joined by ``MERGED_TEXT_JOIN``;
    from another client, a summary, notice or continuation prompt the package wrote is a
    blank-line paragraph of its own, and so is the text between them (the package writes
    no blank line inside a notice, and the emulator's own summaries have none either)."""
    if MERGED_TEXT_JOIN in text:
        return text.split(MERGED_TEXT_JOIN)
    if "\n\n" not in text:
        return [text]
    pieces: list[str] = []
    own: list[str] = []               # paragraphs of the text since the last machine piece
    for paragraph in text.split("\n\n"):
        if _piece_kind(paragraph) in ("machine", "continuation"):
            if own:
                pieces.append("\n\n".join(own))
                own = []
            pieces.append(paragraph)
        else:
            own.append(paragraph)
    if own:
        pieces.append("\n\n".join(own))
    return pieces


def _is_continuation(turn: Turn) -> bool:
    """A user turn whose last piece that is not blank or a notice is the continuation prompt."""
    if turn.role != "user":
        return False
    kinds = [k for k in map(_piece_kind, turn.text_pieces()) if k not in ("blank", "machine")]
    return bool(kinds) and kinds[-1] == "continuation"


def _real_text(turn: Turn) -> str | None:
    """The user's own request in ``turn``: its last real piece (None if it has none)."""
    if turn.role != "user":
        return None
    for piece in reversed(turn.text_pieces()):
        if _piece_kind(piece) == "real":
            return piece
    return None


def _last_real_user(turns: Sequence[Turn]) -> int | None:
    for i in range(len(turns) - 1, -1, -1):
        if _real_text(turns[i]) is not None:
            return i
    return None


def _parse_tools(text: str) -> list[tuple[str, str]]:
    """``[[tool NAME {json}]]`` directives, in order; bad JSON becomes ``{}``."""
    found: list[tuple[str, str]] = []
    decoder = json.JSONDecoder()
    for match in _TOOL_RE.finditer(text):
        rest = text[match.end():]
        args: Any = {}
        end = 0
        if rest.startswith("{"):
            try:
                args, end = decoder.raw_decode(rest)
            except ValueError:
                args, end = {}, 0
        if not rest[end:].lstrip().startswith("]]"):
            continue
        if not isinstance(args, dict):
            args = {}
        found.append((match.group(1), json.dumps(args)))
    return found


# -- recall: a question about an earlier detail, when the request offers the recall tool --

_RECALL_ASK_RE = re.compile(r"\b(?:recall|look\s+(?:it\s+)?up|look\s+back|remind\s+me)\b|"
                            r"\bwhat\s+(?:was|were|did)\b.*\b(?:turn|earlier|before|"
                            r"previously)\b", re.IGNORECASE | re.DOTALL)
_TURN_WORDS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5}
_TURN_RE = re.compile(r"\b(first|second|third|fourth|fifth)\s+(?:turn|message)\b|"
                      r"\bturn\s+(\d{1,6})\b", re.IGNORECASE)
_RECALL_WORD_RE = re.compile(r"[A-Za-z0-9][\w.-]*[A-Za-z0-9]|[A-Za-z0-9]")
#: Words of a question that are not what it asks about.
_RECALL_STOP = frozenset("""
a about after again agreed all also am an and any are as asked at back be been before but by
can chose could decided detail details did do does earlier exact exactly first fifth for
fourth from gave had has have how i in is it its just look me mentioned message my number
of on once or our please recall remind said say second set that the then there third this
to told turn up use used value was we were what when where which who why with would you
your conversation earlier start beginning
""".split())  # noqa: SIM905 - a word list reads best as prose
RECALL_WORDS_MAX = 3
"""Search words the emulator takes from a recall question (every one must match)."""


def _offered(tools: Any) -> set[str]:
    """Names of the tools a request offers (Chat Completions, Messages or Responses)."""
    names: set[str] = set()
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, Mapping):
            fn = tool.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else tool.get("name")
            if isinstance(name, str):
                names.add(name)
    return names


def recall_arguments(text: str) -> dict[str, Any] | None:
    """The recall tool's arguments for a question about an earlier detail, or None when
    ``text`` asks no such question (it says recall, look up, look back or remind me, or asks
    what was… about a turn or something earlier): its distinctive words, and the turn it
    names."""
    if not _RECALL_ASK_RE.search(text):
        return None
    args: dict[str, Any] = {}
    turn = _TURN_RE.search(text)
    if turn is not None:
        n = _TURN_WORDS[turn.group(1).lower()] if turn.group(1) else int(turn.group(2))
        args["from_turn"] = args["to_turn"] = max(n, 1)
    rest = _TURN_RE.sub(" ", text)
    words = [w for w in (m.group(0).lower() for m in _RECALL_WORD_RE.finditer(rest))
             if w not in _RECALL_STOP and (len(w) > 2 or w.isdigit())]
    picked = list(dict.fromkeys(words))[:RECALL_WORDS_MAX]
    if not picked:
        return None
    args["words"] = " ".join(picked)
    return args


def _recall_answer(words: str, result: str) -> str:
    """The answer after the recall tool's ``result``: the passage line that holds the most
    search words, quoted with its turn and role."""
    wanted = words.lower().split()
    best: tuple[int, int, str, str] | None = None
    for passage in recall_format.parse_passages(result):
        for line in passage.lines:
            score = sum(w in line.lower() for w in wanted)
            if score and (best is None or score > best[0]):
                best = (score, passage.turn, passage.role, line.strip())
    if best is None:
        first = result.strip().split("\n", 1)[0]
        return f"I looked in the transcript and found nothing to quote: {first}"
    return f'In turn {best[1]} the {best[2]} wrote: "{best[3]}"'


def _echo(text: str) -> str | None:
    match = _ECHO_RE.search(text)
    return text[match.end():] if match else None


def _words(text: str) -> str | None:
    match = _WORDS_RE.search(text)
    if not match:
        return None
    n = min(int(match.group(1)), MAX_WORDS)
    return " ".join(f"w{i}" for i in range(1, n + 1))


def _default_reply(turns: Sequence[Turn], user_text: str, tools: Any) -> str:
    quoted = user_text[:QUOTE_CHARS]
    p = prompt_tokens(turns, tools)
    count = f"{len(turns)} message{'' if len(turns) == 1 else 's'}"
    return f'Emulator reply: you said "{quoted}" ({count}, {p} prompt tokens).'


def _compose(turns: Sequence[Turn], tools: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The complete (uncut) answer to a request that is not a continuation."""
    if any(t.role == "system" and SUMMARY_MARK in t.text for t in turns):
        supplied = "\n\n".join(t.text for t in turns if t.role == "user" and t.text.strip())
        return summarize(supplied), ()
    u = _last_real_user(turns)
    user_text = (_real_text(turns[u]) or "") if u is not None else ""
    after = turns[u + 1:] if u is not None else turns
    results = [r for t in after for r in t.tool_results]
    directives = _parse_tools(user_text)
    if directives and not results:
        return "", tuple(directives)
    if not directives and recall_format.RECALL_TOOL in _offered(tools):
        asked = recall_arguments(user_text)
        if asked is not None and not results:
            return "", ((recall_format.RECALL_TOOL, json.dumps(asked)),)
        called = [args for t in after for name, args in t.tool_calls
                  if name == recall_format.RECALL_TOOL]
        if asked is not None and called and results:
            try:
                words = str(json.loads(called[-1]).get("words", ""))
            except (ValueError, AttributeError):
                words = ""
            return _recall_answer(words, results[-1]), ()
    body = _echo(user_text)
    if body is None:
        body = _words(user_text)
    if body is None:
        body = _default_reply(turns, user_text, tools)
    if directives and results:
        names = [name for name, _ in directives]
        lines = [f"Tool {names[i] if i < len(names) else names[-1]} returned {len(r)} chars."
                 for i, r in enumerate(results)]
        body = " ".join([*lines, body])
    return body, ()


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan(turns: Sequence[Turn], *, tools: Any = None, limit: int | None = None,
         continuation: Continuation | None = None, prefill: bool = False) -> Plan:
    """Decide the answer to ``turns``; ``limit`` is the completion-token budget (None = none).

    A continuation (latest user message starts with the continuation prompt) recomputes
    the original answer from the request that produced the first partial, and resumes it
    after the text already produced (their longest common prefix) as ``continuation``
    says (default: exactly, no repetition). With ``prefill`` a final assistant turn is
    continued the same way, always exactly.
    """
    notes: dict[str, Any] = {}
    p = prompt_tokens(turns, tools)
    prefilled = prefill and bool(turns) and turns[-1].role == "assistant"
    if turns and (prefilled or _is_continuation(turns[-1])):
        u = _last_real_user(turns)
        start = 0 if u is None else u + 1
        # The original request ends before the first assistant text after the last
        # real user message or tool result.
        j = start
        for k in range(start, len(turns)):
            if turns[k].role == "tool" or turns[k].tool_results:
                j = k + 1
        first = next((k for k in range(j, len(turns)) if turns[k].role == "assistant"), j)
        produced = "".join(t.text for t in turns[first:] if t.role == "assistant")
        full, calls = _compose(turns[:first], tools)
        at = _common_prefix(full, produced)
        style = Continuation() if prefilled or continuation is None else continuation
        text = style.resume(full, at) if not calls else ""
        notes["continuation"] = {"produced_chars": len(produced), "total_chars": len(full),
                                 "prefill": prefilled}
    else:
        text, calls = _compose(turns, tools)
    earlier = sum(len(t.tool_calls) for t in turns)
    tool_calls = tuple(ToolCall(earlier + i + 1, name, args) for i, (name, args) in enumerate(calls))
    if tool_calls:
        completion = count_tokens("".join(c.arguments for c in tool_calls))
        return Plan("", tool_calls, "tool_calls", p, completion, notes)
    finish = "stop"
    if limit is not None and count_tokens(text) > limit:
        text = _cut(text, limit * BYTES_PER_TOKEN)
        finish = "length"
    return Plan(text, (), finish, p, count_tokens(text), notes)


def with_call_ids(plan: Plan, new_id: Callable[[str], str], prefix: str) -> Plan:
    """``plan`` with each tool call named ``new_id(prefix)``: the real APIs' ids are random,
    so never the same twice, even after a compaction shortened the history the call
    numbers count."""
    if not plan.tool_calls:
        return plan
    calls = tuple(dataclasses.replace(c, ident=new_id(prefix)) for c in plan.tool_calls)
    return dataclasses.replace(plan, tool_calls=calls)


def summary_answer(text: str, max_tokens: int | None = None) -> str:
    """What the emulator answers a summary request whose input is ``text`` (its system
    prompt names the STRUCTURED SUMMARY), within ``max_tokens``: a what-if of a session on
    the emulator plans with the summary the emulator will really write."""
    answer = summarize(text)
    if max_tokens is not None and count_tokens(answer) > max_tokens:
        answer = _cut(answer, max_tokens * BYTES_PER_TOKEN)
    return answer


def _cut(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` within ``max_bytes`` UTF-8 bytes (never splits a char)."""
    raw = text.encode("utf-8")[:max(max_bytes, 0)]
    return raw.decode("utf-8", errors="ignore")


# --------------------------------------------------------------------------- summaries

_MESSAGE_MARK_RE = re.compile(r"^\s*[\[#*]*\s*(user|assistant|tool|system)\b", re.I | re.M)
_PATH_RE = re.compile(r"(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|md|txt|json|csv|ipynb|toml|yaml|"
                      r"yml|cfg|ini|sh|js|ts|go|rs|c|h|html|log)\b")
_COMMAND_RE = re.compile(r"^\s*(?:\$|>>>|%|!)\s*\S|`[^`]+`")
_ERROR_RE = re.compile(r"error|exception|traceback|failed|failure", re.I)
_DECISION_RE = re.compile(r"\b(decid|chose|choose|agreed|plan|will|should|must)\w*", re.I)
_RULE_RE = re.compile(r"\b(?:always|never|must|from now on|do not|don't|please|want|need|"
                      r"goal|only)\b", re.I)
_DATA_RE = re.compile(r"\b(?:dataframe|df|columns?|rows?|shape|dtypes?|table|variables?|"
                      r"index)\b|\b[a-z]+_[a-z0-9_]+\b", re.I)
_RESULT_RE = re.compile(r"\d+(?:[.,]\d+)?\s?(?:%|[a-z]+\b)|\b(?:plot|figure|chart|accuracy|"
                        r"mean|median|p-value|correlation|result)\w*", re.I)

# The compactor's framing of the summarizer input (``core/markers.py``): an instruction
# naming the count, a label opening and an end mark closing each message, cut markers, a
# note on omitted messages and the user's extra instructions. None of it is conversation,
# so none of it is quoted; the count (or the labels) gives the header's N.
_FRAMING_RE = re.compile(
    r"^(?:\[?\s*STRUCTURED SUMMARY\b"                             # an earlier summary's header
    r"|##\s+(?:Files|Commands|Key|Errors|Current task)\b"         # an earlier summary's headings
    rf"|##\s+(?:{'|'.join(map(re.escape, SUMMARY_SECTIONS + SUMMARY_CODE_SECTIONS))})\b"
    rf"|{re.escape(FACTS_HEADING)})")


def _conversation_lines(text: str) -> tuple[list[str], int]:
    """The distinct conversation lines of ``text`` (framing skipped) and its message count."""
    lines: list[str] = []
    seen: set[str] = set()
    announced = sections = 0
    for raw in text.splitlines():
        line = " ".join(raw.split())
        preamble = markers.PREAMBLE_RE.match(line)
        if preamble:
            announced = announced or int(preamble.group(1))
            continue
        if markers.OMITTED_NOTE_RE.match(line) or line.startswith(markers.INSTRUCTIONS_PREFIX):
            continue
        pieces, opened = markers.unframe_line(line)
        sections += opened
        for piece in pieces:
            if _FRAMING_RE.match(piece):
                continue
            if piece.startswith("- "):      # an earlier summary's bullet: quote the fact only
                piece = piece[2:].strip()
            if piece and piece not in seen:
                seen.add(piece)
                lines.append(piece)
    n = announced or sections or len(_MESSAGE_MARK_RE.findall(text)) or 1
    return lines, n


def _shorten(item: str) -> str:
    """``item`` cut to ``SUMMARY_ITEM_CHARS`` at a word end, as a model shortens a fact (a
    word cut in two before a line end can read as an attack to a firewall: core/cuts.py)."""
    return item[:head_cut(item, SUMMARY_ITEM_CHARS - 2).at] + " …"


def summarize(text: str) -> str:
    """Extractive summary: a ``[STRUCTURED SUMMARY — covering N earlier messages]`` header
    and sections of conversation lines copied from ``text`` (the compactor's instruction
    and framing lines are skipped), at most min(len(text)/4, 2000) chars."""
    lines, n = _conversation_lines(text)
    header = summary_header(n)
    bound = max(min(len(text) // SUMMARY_FRACTION, SUMMARY_MAX_CHARS), len(header))
    goal, data, results, decisions, questions, current = SUMMARY_SECTIONS
    files, commands, errors = SUMMARY_CODE_SECTIONS
    sections = [
        (goal, lines[:1] + [ln for ln in lines if _RULE_RE.search(ln)]),
        (data, [ln for ln in lines if _DATA_RE.search(ln)]),
        (results, [ln for ln in lines if _RESULT_RE.search(ln)]),
        (decisions, [ln for ln in lines if _DECISION_RE.search(ln)]),
        (questions, [ln for ln in lines if ln.endswith("?")]),
        (files, [ln for ln in lines if _PATH_RE.search(ln)]),
        (commands, [ln for ln in lines if _COMMAND_RE.search(ln)]),
        (errors, [ln for ln in lines if _ERROR_RE.search(ln)]),
        (current, lines[-2:]),
    ]
    out = header
    used: set[str] = set()
    for title, items in sections:
        picked = [i for i in items if i not in used][:4]
        if not picked:
            continue
        block = f"\n## {title}"
        for item in picked:
            short = item if len(item) <= SUMMARY_ITEM_CHARS else _shorten(item)
            if len(out) + len(block) + len(short) + 3 > bound:
                break
            block += f"\n- {short}"
            used.add(item)
        if block.count("\n- "):
            out += block
    return out
