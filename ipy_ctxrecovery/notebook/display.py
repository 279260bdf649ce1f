"""Plain-text output of the notebook layer: the answer object, the event printer, the streamer.

Everything here works in terminal IPython and in any Jupyter front end; the ipywidgets
panel (``panel.py``) is an optional extra on top. Nothing here talks to a model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import re
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TextIO

from ..core import events as ev
from ..core.wording import (
    describe,
    describe_debug,
    escalated_line,
    printed_at,
    truncated_line,
)

__all__ = [
    "FORMATS",
    "Answer",
    "EventPrinter",
    "Streamer",
    "code_blocks",
    "event_record",
    "extract_code",
    "parse_json_answer",
    "usage_dict",
]

FORMATS = ("markdown", "text", "code", "json")

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)

#: Fence languages a notebook runs with a cell magic (``%%bash`` …); others are Python's.
_CELL_MAGICS = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "bash",
                "html": "html", "javascript": "javascript", "js": "javascript",
                "latex": "latex", "markdown": "markdown", "md": "markdown", "perl": "perl",
                "ruby": "ruby", "svg": "svg"}
_PYTHON = {"", "python", "py", "python3", "ipython", "ipython3", "pycon"}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced code block of ``text`` as (language, code), in order ('' = unlabelled)."""
    return [(m.group(1).strip().split()[0].lower() if m.group(1).strip() else "",
             m.group(2).rstrip("\n")) for m in _FENCE.finditer(text)]


def extract_code(text: str) -> str | None:
    """The code of an answer as one notebook cell: every fenced block in order, or the whole
    text when it has none and is Python as it stands (an answer of bare code); None when it
    is prose. Blocks all in one language a cell magic runs (``bash``, ``html`` …) get that
    magic; in a mix, the blocks that are not Python are kept as comments."""
    blocks = code_blocks(text)
    if not blocks:
        bare = text.rstrip("\n")
        try:
            compile(bare, "<answer>", "exec")
        except (SyntaxError, ValueError):
            return None
        return bare
    magics = {_CELL_MAGICS.get(lang) for lang, _ in blocks}
    if len(magics) == 1 and (magic := next(iter(magics))) is not None:
        return f"%%{magic}\n" + "\n\n".join(code for _, code in blocks)
    parts = []
    for lang, code in blocks:
        if lang in _PYTHON:
            parts.append(code)
        else:
            parts.append(f"# {lang}:\n" + "\n".join(f"# {line}" for line in code.splitlines()))
    return "\n\n".join(parts)


def parse_json_answer(text: str) -> Any:
    """The answer parsed as JSON (a fenced ``json`` block counts); raise ValueError if it isn't."""
    candidates = [text.strip()] + [code.strip() for _, code in code_blocks(text)]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ValueError("the answer is not valid JSON")


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses as dicts, enums as their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def event_record(event: ev.Event) -> dict[str, Any]:
    """One event for the output's metadata: its type, its fields and the expert's line."""
    record = {"event": type(event).__name__, **_plain(event)}
    line = describe_debug(event)
    if line:
        record["line"] = line
    return record


class Answer(str):
    """A model's answer as returned by ``%%chat``: a ``str`` that also carries metadata.

    It lands in ``Out[n]`` and ``_`` and can be used as a string. Its rich display offers
    ``text/plain`` and ``text/markdown`` (``text/plain`` only for ``-f text``; the code blocks
    with their languages for ``-f code``; ``application/json`` as well for ``-f json`` when
    the answer parses), and the output's metadata records the model, the token usage, what
    recovery did (``actions``, the lines shown) and every event in full (``events``).

    Once the answer has been shown where it streamed (``shown``), displaying it again in
    the same cell shows nothing: ``run_cell_magic`` as a cell's last expression does not
    show it twice. In a later cell (``_``, ``Out[n]``), or between cells, it shows as usual.
    """

    model: str
    usage: Mapping[str, int | None]
    actions: tuple[str, ...]
    events: tuple[dict[str, Any], ...]
    finish_reason: str | None
    answer_format: str
    session: str
    # The run of the cell that showed it (see _running_cell); not pickled or copied.
    _shown_in: weakref.ref[Any] | None = None

    def __new__(cls, text: str, *, model: str = "", usage: Mapping[str, int | None] | None = None,
                actions: Sequence[str] = (), finish_reason: str | None = None,
                answer_format: str = "markdown", session: str = "default",
                events: Sequence[Mapping[str, Any]] = ()) -> Answer:
        self = super().__new__(cls, text)
        self.model = model
        self.usage = dict(usage or {})
        self.actions = tuple(actions)
        self.events = tuple(dict(e) for e in events)
        self.finish_reason = finish_reason
        self.answer_format = answer_format
        self.session = session
        self._shown_in = None
        return self

    @property
    def shown(self) -> bool:
        """True while the cell that showed this answer runs."""
        return self._shown_in is not None and self._shown_in() is _running_cell()

    @shown.setter
    def shown(self, value: bool) -> None:
        self._shown_in = weakref.ref(_running_cell()) if value else None

    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle (``%store``) is not the object that was shown.
        return {k: v for k, v in self.__dict__.items() if k != "_shown_in"}

    @property
    def text(self) -> str:
        return str(self)

    @property
    def metadata(self) -> dict[str, Any]:
        """What the output's metadata records (JSON-serializable)."""
        data: dict[str, Any] = {
            "model": self.model,
            "usage": dict(self.usage),
            "actions": list(self.actions),
            "finish_reason": self.finish_reason,
            "session": self.session,
        }
        if self.events:
            data["events"] = [dict(e) for e in self.events]
        return data

    @property
    def _ipython_display_(self) -> Callable[[], None] | None:
        # IPython calls this instead of formatting the object when it is callable: an
        # answer already shown displays nothing the second time.
        return _shown_already if self.shown else None

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's plain-text formatter would otherwise print str's repr, with quotes.
        printer.text(str(self))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
        text = str(self)
        data: dict[str, Any] = {"text/plain": text}
        if self.answer_format == "markdown":
            data["text/markdown"] = text
        elif self.answer_format == "code":
            blocks = code_blocks(text) or [("python", text)]
            data["text/markdown"] = "\n\n".join(f"```{lang or 'python'}\n{code}\n```"
                                                 for lang, code in blocks)
        elif self.answer_format == "json":
            with contextlib.suppress(ValueError):
                data["application/json"] = parse_json_answer(text)
            data["text/markdown"] = f"```json\n{text}\n```"
        return data, {"ipy_ctxrecovery": self.metadata}


def _shown_already() -> None:
    return None


class _NoCell:
    """Stands for "no cell is running" (outside IPython, or between two cells)."""


_NO_CELL = _NoCell()


def _running_cell() -> Any:
    """The running cell's run: the ``ExecutionResult`` IPython fills while the cell runs, one
    object per run. Not the execution count: IPython 9 advances it before the cell runs and
    IPython 8 after, and a cell run without storing history leaves it as it was."""
    from IPython import get_ipython

    shell = get_ipython()
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    return result if result is not None else _NO_CELL


def usage_dict(usage: Any) -> dict[str, int | None]:
    """A Usage-like object (or mapping, or None) as a plain dict."""
    if usage is None:
        return {}
    if isinstance(usage, Mapping):
        return {str(k): v for k, v in usage.items()}
    out = {
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
    }
    # The prompt cache's share of the input, as the provider reported it (docs/caching.md).
    for name in ("cached_tokens", "cache_write_tokens", "uncached_input"):
        if hasattr(usage, name):
            out[name] = getattr(usage, name)
    return out


class EventPrinter:
    """Prints the status lines of a turn's events at a verbosity, in the order they happen.

    ``normal``: one line per thing that happened; ``quiet``: only what changed the answer or
    dropped context; ``debug``: every event, with the numbers an expert reads
    (:func:`~ipy_ctxrecovery.wording.shown_at` decides). A final failure is never printed
    here: whoever called ``send`` reports it once (the cell fails with that sentence).
    ``before_line`` runs before each line (the terminal streamer ends its open line);
    ``mid_line`` says whether an answer is being printed on an open line: a status line
    then waits for :meth:`release` (the answer has ended), so the printed answer reads on
    without a status line through a word — an escalation's says the answer was continued.
    ``model_limit``/``model`` let a cut answer name the model's own output limit.
    ``events`` keeps every event seen, printed or not.
    """

    def __init__(self, stream: TextIO | None = None, *, verbosity: str = "normal",
                 before_line: Callable[[], None] | None = None,
                 mid_line: Callable[[], bool] | None = None,
                 model_limit: int | None = None, model: str | None = None) -> None:
        self._stream = stream
        self.verbosity = verbosity
        self.before_line = before_line
        self.mid_line = mid_line
        self.model_limit = model_limit
        self.model = model
        self.lines: list[str] = []
        self.events: list[ev.Event] = []
        self._held: list[str] = []

    def line_for(self, event: ev.Event) -> str:
        """What this printer says for ``event`` ('' for nothing)."""
        if isinstance(event, ev.Failed) or not printed_at(event, self.verbosity):
            return ""
        if isinstance(event, ev.Truncated):
            return truncated_line(event, self.model_limit, self.model)
        render = describe_debug if self.verbosity == "debug" else describe
        text = render(event).strip("\n").rstrip()
        # Quiet shows a step's outcome alone, not under the line it continues.
        return text.strip() if self.verbosity == "quiet" else text

    def __call__(self, event: ev.Event) -> None:
        self.events.append(event)
        line = self.line_for(event)
        if line and self.mid_line is not None and self.mid_line():
            if isinstance(event, ev.Escalation) and self.verbosity != "debug":
                line = escalated_line(event)
            self._held.append(line)
            return
        self.say(line)

    def say(self, message: str) -> None:
        """Print one line (or block) among the event lines (after any held ones)."""
        if not message:
            return
        if self.before_line is not None:
            self.before_line()
        held, self._held = self._held, []
        for line in (*held, message):
            self.lines.append(line)
            print(line, file=self._stream or sys.stdout, flush=True)

    def release(self) -> None:
        """Print the lines held while an answer was being printed (it has ended)."""
        if self._held:
            self.say(self._held.pop())


StreamMode = Literal["display", "print", "off"]

_LONG_LINE = 2000
_LINE_TAIL = 500
"""A printed line longer than ``_LONG_LINE`` goes out at a space ``_LINE_TAIL`` characters
from its end (a line with no space at all, at ten times that length): a name and its
secret are never that far apart."""


class Streamer:
    """Shows an answer while it arrives.

    ``display`` (a Jupyter front end): into one display handle, updates coalesced (~100 ms
    by default). ``print`` (terminal IPython): each delta written to ``out`` as it comes.
    ``off``: nothing live; the answer is shown once, at the end, as the cell's result.
    ``mask``: what is shown of the text (the session's redactor: the transcript's masking),
    applied to the whole text at each update; printed text goes out a line at a time, so a
    secret and the name it is given ("password = …", "Bearer …") are masked together.
    ``display`` and ``clock`` are injected so tests capture display calls without a kernel.
    """

    def __init__(self, *, mode: StreamMode, fmt: str, interval: float,
                 display: Callable[..., Any] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 out: TextIO | None = None,
                 mask: Callable[[str], str] | None = None) -> None:
        self.mode = mode
        self.fmt = fmt
        self.interval = interval
        self._display = display
        self._clock = clock
        self._out = out
        self._mask = mask
        self._handle: Any = None
        self._parts: list[str] = []
        self._pending = ""              # printed mode: the line not yet ended
        self._last = 0.0
        self._shown = ""
        self._printed = 0
        self._line_open = False
        self.updates = 0

    @property
    def live(self) -> bool:
        return self.mode != "off"

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def _bundle(self, text: str) -> dict[str, str]:
        if self.fmt == "markdown":
            return {"text/plain": text, "text/markdown": text}
        return {"text/plain": text}

    def _publish(self) -> None:
        text = self.text
        if self._mask is not None:
            text = self._mask(text)
        if text == self._shown:
            return
        self._shown = text
        self._last = self._clock()
        self.updates += 1
        if self._handle is None:
            if self._display is None:
                from IPython.display import display as ipy_display

                self._display = ipy_display
            self._handle = self._display(self._bundle(text), raw=True, display_id=True)
        else:
            self._handle.update(self._bundle(text), raw=True)

    def _write(self, text: str) -> None:
        if not text:
            return
        out = self._out or sys.stdout
        out.write(text)
        out.flush()
        self._printed += len(text)
        self._line_open = not text.endswith("\n")

    def _print(self, delta: str) -> None:
        """Print ``delta``, masked, up to its last line end; the rest waits for more (a
        very long line goes out at a space, keeping its tail)."""
        if self._mask is None:
            self._write(delta)
            return
        text = self._pending + delta
        end = text.rfind("\n") + 1
        if len(text) - end > _LONG_LINE:
            space = max(text.rfind(c, end, len(text) - _LINE_TAIL) for c in " \t") + 1
            end = space if space > end else (
                len(text) - _LINE_TAIL if len(text) - end > 10 * _LONG_LINE else end)
        self._pending = text[end:]
        self._write(self._mask(text[:end]))

    def _end_line(self) -> None:
        pending, self._pending = self._pending, ""
        if pending:
            self._write(self._mask(pending) if self._mask is not None else pending)

    def __call__(self, delta: str) -> None:
        """``on_text`` callback: called with each text delta, from the kernel thread."""
        if not delta:
            return
        self._parts.append(delta)
        if self.mode == "print":
            self._print(delta)
        elif self.mode == "display" and (self._handle is None
                                         or self._clock() - self._last >= self.interval):
            self._publish()

    @property
    def line_open(self) -> bool:
        """An answer is being printed and its last line is not ended."""
        return self.mode == "print" and (self._line_open or bool(self._pending))

    def break_line(self) -> None:
        """End a printed line that the answer left open, so a status line starts on its own."""
        if self.mode == "print":
            self._end_line()
            if self._line_open:
                self._write("\n")

    def flush(self) -> None:
        """Show whatever arrived since the last coalesced update."""
        if self.mode == "display" and self._parts:
            self._publish()

    def finish(self, final: Any = None) -> bool:
        """End the stream; True when the answer was shown here (then it is not shown again).

        ``display``: with ``final`` (the Answer) the live area becomes the finished answer,
        with its formats and metadata, so the cell keeps ONE output and no empty leftover;
        without, the streamed text stays as shown (a loop of cells, an interrupt, a
        failure). ``print``: the open line is ended. An Answer shown here is marked
        ``shown``, so displaying it again (as a cell's last expression) shows nothing.
        """
        if self.mode == "print":
            self.break_line()
            shown = self._printed > 0
        elif self._handle is None:
            return False
        elif final is None:
            self._publish()
            return True
        else:
            self._handle.update(final)
            shown = True
        if shown and isinstance(final, Answer):
            final.shown = True
        return shown


class ChatInterrupted(KeyboardInterrupt):
    """Ctrl-C (or "interrupt kernel") during a chat: shown as its one sentence.

    A KeyboardInterrupt, so Run-All stops as it should; IPython prints what
    ``_render_traceback_`` returns instead of the SDK's traceback through the HTTP stack.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]
