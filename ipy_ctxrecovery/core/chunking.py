"""The summarizer's input, planned: every message rendered whole and packed into requests
that each fit one request's bound, and the text of each request.

Policy (a rolling summary, not map-reduce):

- Each message to summarize is rendered with its label and end mark (``markers.py``),
  its text unchanged: nothing is ever cut out of the middle of a message.
- The rendered messages are packed oldest first, greedily, into *chunks* of at most the
  input bound (``settings.summarizer_input_max_chars``, which the session lowers to what
  the window and the payload cap allow: ``session/compaction.py``), with the preamble and
  a manual compact's instructions counted in.
- Chunk 1's request is the preamble and chunk 1. Chunk k's request (k > 1) is the
  preamble, **the summary so far** (the answer to request k − 1) and chunk k; its answer
  is the summary so far for the next one, and the last answer is the summary. Each chunk
  after the first keeps room for the summary so far (:attr:`ChunkPlan.summary_room`,
  ``min(summary_max_chars, bound // 3)``); a summary so far longer than that is refused.
  Rolling rather than map-reduce: N chunks cost exactly N requests, no merge request can
  itself overflow, and each step sees what came before it.
- A message too big even for an empty chunk is split into parts at line (else word)
  boundaries (``cuts.head_cut``), each part its own piece with its own label
  (``Message 3 of 12, part 2 of 4, from the user: … — end of message 3, part 2 of 4``).
  The one newline or space at a cut is the only character not sent (blank lines right
  after a line cut are not sent either; they carry nothing).
- **The request bound** (``settings.summary_max_requests``): when the plan needs more
  chunks than that, the oldest messages are left out, fewest first, until it does not
  (an earlier summary opening the messages is kept: it carries most per character; a read
  part never opens with tool results whose call was left out). Those messages are
  *dropped unread*: :attr:`ChunkPlan.dropped` says how many, and the compactor says so.

Pure: no I/O, no model; the compactor (``compactor.py``) sends the requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import markers
from .cuts import head_cut
from .history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    TAG_SYNTHETIC_RESULT,
    Message,
    Role,
    ToolCall,
)

__all__ = ["Chunk", "ChunkPlan", "Piece", "body_of", "plan", "request_text", "split_body"]

SEP = "\n\n"
"""Between the preamble, the summary so far and the pieces of a request."""
SUMMARY_SHARE = 3
"""The summary so far may take at most 1/3 of a request's bound."""
MIN_PART_CHARS = 256
"""The smallest part a message is split into, whatever the bound (a bound smaller than the
framing is exceeded by the framing rather than splitting a message into letters)."""
_WIDE = 9999          # a placeholder number as wide as any count the framing shows


@dataclass(frozen=True, slots=True)
class Piece:
    """One message (or one part of it) as a request carries it."""

    message: int        # its position among the messages read, from 1
    part: int           # from 1
    parts: int
    body: str           # the message's own text (this part of it)
    text: str           # the body with its label and end mark


@dataclass(frozen=True, slots=True)
class Chunk:
    """The pieces one request carries."""

    pieces: tuple[Piece, ...]

    @property
    def chars(self) -> int:
        return sum(len(p.text) for p in self.pieces) + len(SEP) * max(0, len(self.pieces) - 1)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """The requests of one summary: ``read`` are the messages that reach the summarizer
    (in order), ``dropped`` how many of the messages given were left unread by the request
    bound (always the oldest, after an earlier summary that opens them)."""

    chunks: tuple[Chunk, ...]
    read: tuple[Message, ...]
    dropped: tuple[Message, ...]
    bound: int
    summary_room: int

    @property
    def requests(self) -> int:
        return len(self.chunks)


def _label(message: Message) -> markers.SummaryLabel:
    if message.tag == TAG_SUMMARY:
        return markers.SummaryLabel(message.role.value, summary=True)
    r = message.tool_result
    if message.role is Role.TOOL:
        return markers.SummaryLabel("tool", tool=(r.name or r.call_id) if r else None,
                                    error=r is not None and r.is_error, tag=message.tag)
    return markers.SummaryLabel(message.role.value, tag=message.tag)


def package_wrote(message: Message) -> bool:
    """Whether ``message``'s whole text is one the package wrote: a notice, a synthetic
    result, a one-liner standing for a tool result."""
    if message.tag in (TAG_COMPACTION_NOTICE, TAG_PAYLOAD_NOTICE, TAG_SYNTHETIC_RESULT):
        return True
    r = message.tool_result
    return message.role is Role.TOOL and r is not None and markers.is_one_liner(r.content)


def body_of(message: Message) -> str:
    """A message's text as the summarizer reads it: its text (the package's own
    whole-message texts without their outer brackets, ``markers.unbracket``) and its tool
    calls, one a line."""
    text = message.text
    if package_wrote(message):
        text = markers.unbracket(text)      # it follows other text here (markers.py)
    parts = [text]
    for b in message.blocks:
        if isinstance(b, ToolCall):
            parts.append(markers.tool_call(b.name, b.arguments))
    return "\n".join(p for p in parts if p)


def _framed(index: int, total: int, who: markers.SummaryLabel, body: str, part: int = 1,
            parts: int = 1) -> str:
    opening = markers.label(index, total, who, part=part, parts=parts)
    closing = markers.end_mark(index, part=part, parts=parts)
    return f"{opening} {body} {closing}" if body else f"{opening} {closing}"


def split_body(body: str, cap: int, first: int | None = None) -> list[str]:
    """``body`` in parts of at most ``cap`` chars (the first of at most ``first``, when
    given), cut at line (else word) boundaries.

    The newline or space at each cut is left out (and blank lines right after a line cut),
    nothing else: joining the parts with a newline or a space gives the body back, up to
    those blank lines."""
    parts: list[str] = []
    rest = body
    while len(rest) > (limit := max(1, cap if parts or first is None else first)):
        cut = head_cut(rest, limit)
        at = cut.at if 0 < cut.at <= limit else limit
        parts.append(rest[:at])
        rest = rest[at:]
        if cut.line and cut.at == at:
            rest = rest.lstrip("\n")
        elif rest[:1].isspace():
            rest = rest[1:]
    if rest or not parts:
        parts.append(rest)
    return parts


def _pack(messages: Sequence[Message], bound: int, overhead_first: int,
          overhead_later: int) -> tuple[Chunk, ...]:
    """Greedy, oldest first (the module docstring's policy)."""
    total = len(messages)
    room_first = max(MIN_PART_CHARS, bound - overhead_first)
    room_later = max(MIN_PART_CHARS, bound - overhead_later)
    chunks: list[Chunk] = []
    current: list[Piece] = []
    used = 0
    room = room_first

    def fits(size: int) -> bool:
        return used + (len(SEP) if current else 0) + size <= room

    def add(piece: Piece) -> None:
        nonlocal used
        used += (len(SEP) if current else 0) + len(piece.text)
        current.append(piece)

    def close() -> None:
        nonlocal used, room
        if current:
            chunks.append(Chunk(tuple(current)))
            current.clear()
        used, room = 0, room_later

    for index, message in enumerate(messages, start=1):
        who = _label(message)
        body = body_of(message)
        whole = Piece(index, 1, 1, body, _framed(index, total, who, body))
        if fits(len(whole.text)):
            add(whole)
            continue
        widest = len(_framed(index, total, who, "", _WIDE, _WIDE)) + 1
        left = room - used - (len(SEP) if current else 0) - widest
        if len(whole.text) <= room_later or left < max(MIN_PART_CHARS, room // 4):
            close()         # whole in a chunk of its own, or parts from a fresh chunk
            if fits(len(whole.text)):
                add(whole)
                continue
            left = room - widest
        bodies = split_body(body, max(MIN_PART_CHARS, room_later - widest),
                            first=max(MIN_PART_CHARS, left))
        for part, text in enumerate(bodies, start=1):
            if part > 1:
                close()
            add(Piece(index, part, len(bodies), text,
                      _framed(index, total, who, text, part, len(bodies))))
    close()
    return tuple(chunks)


def _overheads(bound: int, summary_room: int, instructions: str | None,
               count: int) -> tuple[int, int]:
    """Chars a request spends beside its pieces: (the first request, a later one)."""
    extra = len(SEP) + len(markers.instructions(instructions.strip())) \
        if instructions and instructions.strip() else 0
    first = len(markers.preamble(max(count, _WIDE), chunk=_WIDE, chunks=_WIDE)) + len(SEP)
    later = len(markers.preamble(max(count, _WIDE), chunk=_WIDE, chunks=_WIDE, rolling=True)) \
        + len(SEP) + len(markers.rolling_label()) + 1 + summary_room + 1 \
        + len(markers.ROLLING_END) + len(SEP)
    return first + extra, later + extra


def plan(messages: Sequence[Message], *, bound: int, summary_max_chars: int,
         max_requests: int, instructions: str | None = None) -> ChunkPlan:
    """The requests that summarize ``messages`` (oldest first) within ``bound`` chars
    each and at most ``max_requests`` of them (the module docstring's policy)."""
    summary_room = max(1, min(summary_max_chars, bound // SUMMARY_SHARE))
    max_requests = max(1, max_requests)
    first_cost, later_cost = _overheads(bound, summary_room, instructions, len(messages))
    pinned = 1 if messages and messages[0].tag == TAG_SUMMARY else 0

    def start_after(drop: int) -> int:
        start = pinned + drop
        while start < len(messages) and messages[start].role is Role.TOOL:
            start += 1          # never a result without the call it answers
        return start

    def chunks_for(start: int) -> tuple[Chunk, ...]:
        return _pack((*messages[:pinned], *messages[start:]), bound, first_cost, later_cost)

    start, keep = pinned, pinned
    chunks = chunks_for(start)
    if len(chunks) > max_requests:
        # Fewest oldest left out: fewer messages never need more chunks.
        lo, hi = 1, len(messages) - pinned
        if len(chunks_for(start_after(hi))) > max_requests:
            start, keep, chunks = len(messages), 0, ()   # not even an earlier summary fits
        else:
            while lo < hi:
                mid = (lo + hi) // 2
                if len(chunks_for(start_after(mid))) <= max_requests:
                    hi = mid
                else:
                    lo = mid + 1
            start = start_after(lo)
            chunks = chunks_for(start)
    read = (*messages[:keep], *messages[start:])
    dropped = tuple(messages[keep:start])
    return ChunkPlan(chunks, read, dropped, bound, summary_room)


def request_text(chunk_plan: ChunkPlan, k: int, summary_so_far: str | None = None,
                 instructions: str | None = None) -> str:
    """The text of request ``k`` (from 0): the preamble, the summary so far (requests
    after the first), the chunk's pieces and a manual compact's instructions."""
    chunks = chunk_plan.chunks
    rolling = k > 0 and summary_so_far is not None
    parts = [markers.preamble(len(chunk_plan.read), chunk=k + 1, chunks=len(chunks),
                              rolling=rolling)]
    if rolling:
        parts.append(f"{markers.rolling_label()} {summary_so_far} {markers.ROLLING_END}")
    parts += [p.text for p in chunks[k].pieces]
    text = SEP.join(parts)
    if instructions and instructions.strip():
        text += SEP + markers.instructions(instructions.strip())
    return text
