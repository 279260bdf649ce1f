"""Replay: a recorded session re-run under other limits and settings, on a private emulator.

:func:`replay` reads a session's transcript from disk (``transcript.jsonl``: the user's
messages, the assistant's answers and tool calls, the full tool results, reset marks),
starts a fresh :class:`~.session.ChatSession` per configuration against an embedded
:class:`~..emulator.Emulator` of its own, configured with ``limits`` (``context_window``,
``max_body`` and ``body_limit_style``, ``waf_over``, ``drop_over``, ``max_output_tokens``),
and re-sends the recorded user turns in order. Nothing leaves the machine and no tool
runs: the fresh session is offered one stand-in tool per recorded tool name that returns
the recorded results, and each turn's text asks the emulator for those calls
(``[[tool NAME ARGS]]``, unless the recorded text already does) and for an answer about
as long as the recorded one (``[[words N]]``, for answers longer than the emulator's own).
What is approximate: a turn's tool rounds are replayed as one round with all its calls;
the SDK's own retries are off (a dropped request counts once, nobody waits).

The fresh sessions live in a temporary data directory that is removed afterwards; the
user's session directory is never written. :class:`ReplayReport` gives, per configuration,
turns answered, requests sent, rejections by kind, LLM summaries, bytes uploaded, and per
turn the history kept and whether the latest request was in it; it renders as a table
(text and HTML) and, with matplotlib (the ``explore`` extra), as a plot.
"""

from __future__ import annotations

import contextlib
import html
import io
import itertools
import json
import os
import re
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import read_regular
from ..core.events import CompactionPhase, Event, LadderStep, ServerCompacted
from ..core.history import Message, Role, ToolCall, latest_user_index
from ..emulator import Emulator
from ..errors import ChatError, ConfigError, CtxRecoveryError
from ..settings import Settings, format_size, parse_size
from .store import ENV_DIR, SMALL_MAX, TRANSCRIPT_MAX, Transcript, session_dir, validate_name
from .tools import Tool, make_read_file
from .what_if import resolve_settings

__all__ = ["LIMITS", "RecordedTurn", "ReplayReport", "ReplayRun", "TurnRow", "read_turns",
           "replay"]

LIMITS = ("context_window", "max_body", "body_limit_style", "waf_over", "drop_over",
          "max_output_tokens")
"""The emulator limits a replay can set (``limits=``, and sweep keys except context_window,
which as a sweep key is the configured setting)."""

_TOOL_DIRECTIVE = re.compile(r"\[\[tool\s")
_WORDS_DIRECTIVE = re.compile(r"\[\[words\s+\d+\s*\]\]")
_LONG_ANSWER = 300
"""Recorded answers longer than this are asked for by length (the emulator's own default
reply is a short quote); shorter ones are left to the emulator."""
_NO_RESULT = "[replay: no result was recorded for this call]"
_ROOT_LOCK = threading.Lock()


# -- the recorded session ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RecordedTurn:
    """One recorded user turn: its text, the tool calls its answer made (in order) with
    their recorded results, the final answer's length, and whether a reset came before."""

    text: str
    calls: tuple[ToolCall, ...] = ()
    results: tuple[tuple[str, bool], ...] = ()
    answer_chars: int = 0
    reset_before: bool = False

    def replay_text(self) -> str:
        """The text to send: the recorded one, plus what makes the emulator repeat the
        recorded tool calls and answer about as long (module docstring)."""
        text = self.text
        if self.calls and not _TOOL_DIRECTIVE.search(text):
            text += "\n" + " ".join(f"[[tool {c.name} {_object(c.arguments)}]]"
                                    for c in self.calls)
        if self.answer_chars > _LONG_ANSWER and not _WORDS_DIRECTIVE.search(text):
            text += f" [[words {_words_for(self.answer_chars)}]]"
        return text


def _object(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = {}
    return json.dumps(value if isinstance(value, dict) else {}, ensure_ascii=False)


def _words_for(chars: int) -> int:
    """How many emulator words (``w1 w2 …``) make about ``chars`` characters."""
    total, n = -1, 0
    for digits in itertools.count(1):
        band = 9 * 10 ** (digits - 1)
        per = digits + 2          # "w" + digits + a space
        if total + band * per >= chars:
            return n + max(1, (chars - total) // per)
        total += band * per
        n += band
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class _Recorded:
    name: str
    model: str
    system: str | None
    turns: tuple[RecordedTurn, ...]
    tools: tuple[Any, ...] = ()


def _transcript_path(source: Any) -> tuple[str, Path, Mapping[str, Any]]:
    """(name, transcript path, session.json) of a ChatSession or a saved session's name."""
    directory = getattr(source, "directory", None)
    if isinstance(directory, Path):
        name = str(getattr(source, "name", directory.name))
        meta = {"model": getattr(source, "model", ""), "system": getattr(source, "system", None)}
        return name, directory / "transcript.jsonl", meta
    if not isinstance(source, str):
        raise CtxRecoveryError(f"replay() takes a ChatSession or a saved session's name, not "
                               f"{type(source).__name__}.")
    name = validate_name(source)
    folder = session_dir(name)
    path = folder / "transcript.jsonl"
    damage = Transcript.damage(name)
    if damage is not None:
        raise CtxRecoveryError(damage)
    if not path.is_file():
        raise CtxRecoveryError(f"there is no saved session named {name!r}; "
                               "transcript.list_sessions() (or %chat sessions) lists them.")
    try:
        meta = json.loads(read_regular(folder / "session.json", SMALL_MAX).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        meta = {}
    return name, path, meta if isinstance(meta, dict) else {}


def read_turns(source: Any) -> _Recorded:
    """The recorded user turns of ``source`` (a ChatSession or a saved session's name).

    A torn last line (a crash mid-write) is skipped, as the transcript itself does; any
    other line that is not a record is a corrupt transcript, said in one sentence.
    """
    name, path, meta = _transcript_path(source)
    try:
        # A live session that has said nothing yet may have no transcript file at all.
        lines = read_regular(path, TRANSCRIPT_MAX).decode("utf-8").splitlines() \
            if os.path.lexists(path) else []
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise CtxRecoveryError(f"the transcript of session {name!r} cannot be read "
                               f"({why}); nothing was replayed.") from None
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    system: str | None = meta.get("system") if isinstance(meta.get("system"), str) else None
    turns: list[dict[str, Any]] = []
    reset = False
    for k, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
            kind = record["type"]
            message = Message.from_dict(record["message"]) if kind == "message" else None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if k == len(numbered) - 1 and isinstance(e, json.JSONDecodeError):
                break                                  # a torn last line
            raise CtxRecoveryError(
                f"the transcript of session {name!r} is corrupt at line {number} "
                f"({path}); nothing was replayed.") from None
        if kind == "reset":
            reset = True
            continue
        if message is None:
            continue
        if message.role is Role.SYSTEM:
            system = system or message.text
        elif message.role is Role.USER and message.tag is None:
            turns.append({"text": message.text, "calls": [], "results": {}, "answer": 0,
                          "reset": reset})
            reset = False
        elif turns and message.role is Role.ASSISTANT:
            turns[-1]["calls"].extend(message.tool_calls)
            if not message.tool_calls:
                turns[-1]["answer"] = len(message.text)
        elif turns and message.role is Role.TOOL and message.tool_result is not None:
            result = message.tool_result
            turns[-1]["results"].setdefault(result.call_id, (result.content, result.is_error))
    if not turns:
        raise CtxRecoveryError(f"session {name!r} has no user messages to replay.")
    recorded = tuple(RecordedTurn(
        text=t["text"], calls=tuple(t["calls"]),
        results=tuple(t["results"].get(c.id, (_NO_RESULT, True)) for c in t["calls"]),
        answer_chars=t["answer"], reset_before=t["reset"]) for t in turns)
    offered = getattr(source, "tools", None)
    if offered is None:
        # A saved session was offered the built-in read_file unless it was turned off;
        # its schema is part of every request's size.
        offered = (make_read_file(path.parent, path.parent / "results"),) \
            if Settings.from_env().read_file else ()
    return _Recorded(name, str(meta.get("model") or ""), system, recorded, tuple(offered))


# -- stand-in tools -------------------------------------------------------------------------

class _Results:
    """The recorded results of the turn being replayed, per tool name, in call order."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[str, bool]]] = {}

    def load(self, turn: RecordedTurn) -> None:
        self.queues = {}
        for call, result in zip(turn.calls, turn.results, strict=True):
            self.queues.setdefault(call.name, deque()).append(result)

    def next(self, name: str) -> tuple[str, bool]:
        queue = self.queues.get(name)
        return queue.popleft() if queue else (_NO_RESULT, True)


@dataclass(frozen=True, slots=True)
class _ReplayedTool(Tool):
    """A tool that returns the recorded results instead of running anything."""

    results: _Results = field(default_factory=_Results)

    def run(self, arguments: str, check: Callable[[], None] | None = None
            ) -> tuple[str, bool]:
        return self.results.next(self.name)


def _tools(recorded: _Recorded, results: _Results, offered: Sequence[Any]) -> list[Tool]:
    """A stand-in per recorded tool name; with the schema of the source session's own tool
    of that name when it has one (the schemas are part of every request's size)."""
    known = {t.name: t for t in offered if isinstance(t, Tool)}
    names = dict.fromkeys([*known, *(c.name for t in recorded.turns for c in t.calls)])
    out: list[Tool] = []
    for name in names:
        tool = known.get(name)
        description = tool.description if tool else "Replays the recorded results of this tool."
        parameters = tool.parameters if tool else {"type": "object", "properties": {}}
        out.append(_ReplayedTool(name, description, parameters, _no_call, None, results))
    return out


def _no_call(**_arguments: Any) -> str:
    return ""


# -- the report -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TurnRow:
    """One replayed turn: answered or not (``error``: the sentence), the history kept after
    it, whether it holds the turn's request, and what the turn cost."""

    turn: int
    answered: bool
    history_bytes: int
    history_messages: int
    request_present: bool
    requests: int
    rejections: tuple[str, ...] = ()
    rejected_bytes: tuple[int, ...] = ()
    summaries: int = 0
    ladder_steps: int = 0
    error: str | None = None
    server_compactions: int = 0
    """The provider's compactions on its server in this turn (no summary of the package's)."""


@dataclass(frozen=True)
class ReplayRun:
    """One configuration replayed."""

    label: str
    settings: Settings
    limits: Mapping[str, Any]
    turns: tuple[TurnRow, ...]
    total_turns: int
    requests: int
    rejections: Mapping[str, int]
    summaries: int
    bytes_uploaded: int
    cancelled: bool = False
    final_cap: int | None = None
    server_compactions: int = 0
    """Compactions the provider made on its server (``server_compaction``)."""

    @property
    def answered(self) -> int:
        return sum(1 for t in self.turns if t.answered)

    @property
    def cap(self) -> int | None:
        """The payload cap configured in this run's settings."""
        return self.settings.max_payload

    @property
    def proxy_limit(self) -> int | None:
        """The smallest body the emulator rejects or drops (None: no body limit)."""
        sizes = [self.limits.get(k) for k in ("max_body", "waf_over", "drop_over")]
        found = [s for s in sizes if isinstance(s, int)]
        return min(found) if found else None

    @property
    def requests_without_request(self) -> int:
        return sum(1 for t in self.turns if t.answered and not t.request_present)


_ROWS: tuple[tuple[str, Callable[[ReplayRun], str]], ...] = (
    ("turns answered", lambda r: f"{r.answered}/{r.total_turns}"
                                 + (" (cancelled)" if r.cancelled else "")),
    ("requests sent", lambda r: f"{r.requests:,}"),
    ("rejections", lambda r: ", ".join(f"{n} {k}" for k, n in r.rejections.items()) or "0"),
    ("LLM summaries", lambda r: f"{r.summaries}"),
    ("server compactions", lambda r: f"{r.server_compactions}"),
    ("bytes uploaded", lambda r: format_size(r.bytes_uploaded)),
    ("history at the end", lambda r: (f"{r.turns[-1].history_messages} msgs, "
                                      f"{format_size(r.turns[-1].history_bytes)}")
                                     if r.turns else "-"),
    ("largest history", lambda r: format_size(max((t.history_bytes for t in r.turns),
                                                   default=0))),
    ("turns kept w/o request", lambda r: f"{r.requests_without_request}"),
    ("cap at the end", lambda r: format_size(r.final_cap) if r.final_cap else "none"),
)


@dataclass(frozen=True)
class ReplayReport:
    """The replays of one recorded session, side by side (module docstring)."""

    source: str
    runs: tuple[ReplayRun, ...]
    cancelled: bool = False

    def table(self) -> list[list[str]]:
        """Rows of the side-by-side table; the first row names the configurations."""
        return [["", *(r.label for r in self.runs)],
                *([name, *(cell(r) for r in self.runs)] for name, cell in _ROWS)]

    def text(self) -> str:
        rows = self.table()
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [f"replay of session {self.source}"
                 + (" — cancelled, partial figures" if self.cancelled else "")]
        for row in rows:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        lines += ["", "history per turn (█ history, | configured cap, ! proxy limit, ✗ a rejection):"]
        for run in self.runs:
            lines.append(f"{run.label}:")
            lines += _bars(run)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def html(self) -> str:
        rows = self.table()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        body = "".join("<tr>" + "".join(
            f"<td style='text-align:{'left' if i == 0 else 'right'}'>{html.escape(c)}</td>"
            for i, c in enumerate(row)) + "</tr>" for row in rows[1:])
        note = " — cancelled, partial figures" if self.cancelled else ""
        return (f"<div><b>replay of session {html.escape(self.source)}</b>{note}"
                f"<table><tr>{head}</tr>{body}</table></div>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def plot(self) -> ReplayPlot:
        """History size per turn against each run's cap, rejections marked: a figure with
        matplotlib (the ``explore`` extra), else the text bars."""
        return ReplayPlot(self)


def _bars(run: ReplayRun, width: int = 40) -> list[str]:
    """Text bars of the history per turn, with the configured cap (``|``) and the proxy's
    limit (``!``) where they fall on the scale."""
    largest = max((t.history_bytes for t in run.turns), default=0) or 1
    lines = {"|": run.cap, "!": run.proxy_limit}
    # A limit far above every history would flatten the bars: it is named, not drawn.
    shown = {mark: size for mark, size in lines.items() if size and size <= 5 * largest}
    top = max(largest, *shown.values(), 1)
    out = [f"  ({'cap' if mark == '|' else 'proxy limit'} {format_size(size)}: off the "
           "scale)" for mark, size in lines.items() if size and mark not in shown]
    for t in run.turns:
        cells = list(("█" * round(width * t.history_bytes / top)).ljust(width + 1))
        for mark, size in shown.items():
            cells[min(width, round(width * size / top))] = mark
        flags = " ✗" * len(t.rejections) + ("" if t.answered else " (failed)")
        out.append(f"  {t.turn:>3} {''.join(cells)} {format_size(t.history_bytes):>9}{flags}")
    return out


class ReplayPlot:
    """A :class:`ReplayReport` as a plot (``image/png``), or its text bars without
    matplotlib."""

    def __init__(self, report: ReplayReport) -> None:
        self.report = report

    def figure(self) -> Any:
        """The matplotlib figure (raises :class:`CtxRecoveryError` without matplotlib)."""
        try:
            import matplotlib
            matplotlib.use("Agg", force=False)
            from matplotlib.figure import Figure
        except ImportError:
            raise CtxRecoveryError(
                "plotting needs matplotlib: pip install 'ipy-ctxrecovery[explore]' "
                "(print(report) shows the same figures as text).") from None
        figure = Figure(figsize=(7.5, 3.8), dpi=100)
        ax = figure.subplots()
        colours = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f"]
        runs = self.report.runs
        seen = [t.history_bytes for r in runs for t in r.turns] + \
            [b for r in runs for t in r.turns for b in t.rejected_bytes]
        largest = max(seen, default=1) or 1
        proxy = {r.proxy_limit for r in runs if r.proxy_limit}
        # Limits far above every size would flatten the curves: they are named, not drawn.
        top = max([largest, *(x for x in proxy if x <= 4 * largest),
                   *(r.cap for r in runs if r.cap and r.cap <= 4 * largest)]) * 1.15 / 1024
        for run, colour in zip(runs, itertools.cycle(colours)):
            x = [t.turn for t in run.turns]
            ax.plot(x, [t.history_bytes / 1024 for t in run.turns], color=colour, marker=".",
                    label=f"{run.label}: history kept")
            if run.cap and run.cap / 1024 <= top:
                ax.axhline(run.cap / 1024, color=colour, linestyle="--", linewidth=0.8)
            elif run.cap:
                ax.annotate(f"cap {format_size(run.cap)} ↑", (x[-1] if x else 1, top),
                            color=colour, fontsize=8, ha="right", va="top")
            hits = [(t.turn, size) for t in run.turns for size in t.rejected_bytes]
            if hits:
                ax.scatter([turn for turn, _ in hits], [size / 1024 for _, size in hits],
                           marker="x", s=60, color=colour, zorder=3,
                           label=f"{run.label}: rejected request")
        for limit in proxy:
            if limit / 1024 <= top:
                ax.axhline(limit / 1024, color="#c62828", linestyle=":", linewidth=1.2)
                ax.annotate(f"proxy limit {format_size(limit)}", (0.01, limit / 1024),
                            xycoords=("axes fraction", "data"), color="#c62828", fontsize=8,
                            va="bottom")
        ax.set_ylim(0, top)
        ax.set_xlabel("turn")
        ax.set_ylabel("KB")
        ax.set_title(f"replay of {self.report.source} (dashed: configured cap)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figure.tight_layout()
        return figure

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png")
        return buffer.getvalue()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self.report.text()}
        try:
            bundle["image/png"] = self.png()
        except CtxRecoveryError as e:
            bundle["text/plain"] += f"\n({e})"
        return bundle


# -- running --------------------------------------------------------------------------------

def _rejection(fault: str | None, status: int | None) -> str | None:
    if status == 200:
        return None
    if fault is None:
        return "dropped" if status is None else f"HTTP {status}"
    if fault.startswith("413") or fault == "max_request_body":
        return "413"
    if fault.startswith("waf"):
        return "WAF 403"
    return {"drop": "dropped", "context": "context window",
            "output_limit": "max_tokens limit"}.get(fault, fault)


@contextlib.contextmanager
def _private_root(root: Path) -> Iterator[None]:
    """Sessions created inside the block keep their files under ``root`` (their paths are
    fixed when they are made, so the variable is set only while one is made)."""
    with _ROOT_LOCK:
        before = os.environ.get(ENV_DIR)
        os.environ[ENV_DIR] = str(root)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(ENV_DIR, None)
            else:
                os.environ[ENV_DIR] = before


def _check_limits(limits: Mapping[str, Any] | None) -> dict[str, Any]:
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise ConfigError(f"limits={limits!r} is not a mapping; give e.g. "
                          "limits={'max_body': '256KB', 'context_window': 32000}.")
    unknown = [k for k in limits if k not in LIMITS]
    if unknown:
        raise ConfigError(f"limits: {unknown[0]!r} is not an emulator limit; use "
                          f"{', '.join(LIMITS)}.")
    checked = dict(limits)
    for key in ("max_body", "waf_over", "drop_over"):
        value = checked.get(key)
        if isinstance(value, str):
            checked[key] = parse_size(value, name=key) or None
    Emulator(**checked)                   # validated as the emulator does; not started
    return checked


@dataclass(frozen=True, slots=True)
class _Config:
    label: str
    settings: Settings
    limits: dict[str, Any]


def _configs(base: Settings, settings: Settings | Mapping[str, Any] | None,
             limits: dict[str, Any], sweep: Mapping[str, Sequence[Any]] | None) -> list[_Config]:
    if isinstance(settings, Mapping):
        chosen = resolve_settings(base, None, settings)
    else:
        chosen = resolve_settings(base, settings)
    if sweep is None:
        return [_Config("replay", chosen, limits)]
    if not isinstance(sweep, Mapping) or len(sweep) != 1:
        raise ConfigError("sweep= takes one setting and its values, e.g. "
                          "sweep={'max_payload': ['64KB', '256KB', '1MB']}.")
    (key, values), = sweep.items()
    if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
        raise ConfigError(f"sweep[{key!r}] must be a non-empty list of values.")
    configs = []
    for value in values:
        label = f"{key}={value}"
        if key in LIMITS and key != "context_window":
            configs.append(_Config(label, chosen, _check_limits({**limits, key: value})))
        else:
            configs.append(_Config(label, resolve_settings(chosen, None, {key: value}), limits))
    return configs


def replay(source: Any, *, settings: Settings | Mapping[str, Any] | None = None,
           limits: Mapping[str, Any] | None = None,
           sweep: Mapping[str, Sequence[Any]] | None = None,
           on_progress: Callable[[int, int], None] | None = None,
           cancel: Callable[[], bool] | threading.Event | None = None) -> ReplayReport:
    """Replay ``source`` (a ChatSession or a saved session's name) under ``limits`` and
    ``settings`` — once, or once per value of ``sweep`` (module docstring).

    ``settings``: a Settings, or overrides as for ``what_if`` (``cap=``, ``window=``, any
    field); default: the session's own (for a name, the environment's). ``limits``: the
    emulator's (:data:`LIMITS`). ``sweep``: one key — a Settings field (or ``cap``/
    ``window``), or an emulator limit — and its values. ``on_progress(done, total)``
    after each turn; ``cancel()`` (or a set Event) stops before the next turn, and the
    report holds what was done. Bad input raises one sentence before anything runs.
    """
    recorded = read_turns(source)
    base = getattr(source, "settings", None)
    if not isinstance(base, Settings):
        base = Settings.from_env()
    configs = _configs(base, settings, _check_limits(limits), sweep)
    stop = cancel.is_set if isinstance(cancel, threading.Event) else cancel
    total = len(configs) * len(recorded.turns)
    done = 0
    runs: list[ReplayRun] = []

    def progress() -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    with tempfile.TemporaryDirectory(prefix="ipy_ctxrecovery-replay-") as root:
        for n, config in enumerate(configs, 1):
            run = _run(recorded, config, Path(root), n, progress, stop)
            runs.append(run)
            if run.cancelled:
                break
    return ReplayReport(recorded.name, tuple(runs), cancelled=any(r.cancelled for r in runs))


def _wire(model: str) -> str:
    lowered = model.lower()
    anthropic = lowered.startswith(("anthropic:", "claude", "emulator:anthropic"))
    return "emulator:anthropic" if anthropic else "emulator"


def _run(recorded: _Recorded, config: _Config, root: Path, number: int,
         progress: Callable[[], None], stop: Callable[[], bool] | None) -> ReplayRun:
    from ..providers import make_provider
    from .session import ChatSession

    results = _Results()
    rows: list[TurnRow] = []
    cancelled = False
    with Emulator(**config.limits) as emu:
        # The SDK's own retries would wait seconds on each dropped request.
        provider = make_provider(_wire(recorded.model), emulator=emu, settings=config.settings,
                                 max_retries=0)
        with _private_root(root):
            # Back to back, with no time between turns for a summary prepared ahead: each
            # turn compacts in itself, so a run's summaries are those its turns needed.
            session = ChatSession(provider=provider,
                                  settings=config.settings.replace(background_compaction=False),
                                  system=recorded.system,
                                  tools=_tools(recorded, results, recorded.tools),
                                  builtin_tools=False, name=f"replay-{number}",
                                  sleep=lambda _seconds: None)
        events: list[Event] = []
        session.subscribe(events.append)
        try:
            for i, turn in enumerate(recorded.turns, 1):
                if stop is not None and stop():
                    cancelled = True
                    break
                if turn.reset_before:
                    session.reset()
                rows.append(_turn(session, emu, turn, i, results, events))
                progress()
            final_cap = session.caps.effective()
        finally:
            session.close()
            provider.close()      # type: ignore[attr-defined]
        records = emu.requests
    rejections = Counter(kind for r in records
                         if (kind := _rejection(r.fault, r.status)) is not None)
    return ReplayRun(config.label, config.settings, config.limits, tuple(rows),
                     len(recorded.turns), len(records), dict(rejections),
                     sum(t.summaries for t in rows), sum(r.body_bytes for r in records),
                     cancelled, final_cap,
                     server_compactions=sum(t.server_compactions for t in rows))


def _turn(session: Any, emu: Emulator, turn: RecordedTurn, number: int, results: _Results,
          events: list[Event]) -> TurnRow:
    results.load(turn)
    text = turn.replay_text()
    first, events[:] = emu.received, []
    error = None
    try:
        session.send(text, stream=False)
    except ChatError as e:
        error = str(e)
    records = emu.requests[-(emu.received - first):] if emu.received > first else []
    history = session.history
    latest = latest_user_index(history)
    status = session.status()
    server = sum(1 for e in events if isinstance(e, ServerCompacted))
    return TurnRow(
        turn=number, answered=error is None, history_bytes=status.history_bytes,
        history_messages=len(history),
        # A server compaction in the turn holds the request (its summary read it).
        request_present=(latest is not None and history[latest].text == text) or server > 0,
        server_compactions=server,
        requests=len(records),
        rejections=tuple(k for r in records if (k := _rejection(r.fault, r.status))),
        rejected_bytes=tuple(r.body_bytes for r in records if _rejection(r.fault, r.status)),
        summaries=sum(1 for e in events
                      if isinstance(e, CompactionPhase) and e.phase == "summarize"),
        ladder_steps=sum(1 for e in events if isinstance(e, LadderStep)), error=error)
