"""Plain-text output of the notebook layer: the answer object, the event printer, the streamer.

Everything here works in terminal IPython and in any Jupyter front end; the ipywidgets
panel (``panel.py``) is an optional extra on top. Nothing here talks to a model.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from ..core import events as ev
from ..core.wording import describe

__all__ = [
    "FORMATS",
    "Answer",
    "EventPrinter",
    "Streamer",
    "extract_code",
    "parse_json_answer",
    "usage_dict",
]

FORMATS = ("markdown", "text", "code", "json")

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The first fenced code block of ``text``, or the whole text when it has none."""
    match = _FENCE.search(text)
    return (match.group(1) if match else text).rstrip("\n")


def parse_json_answer(text: str) -> Any:
    """The answer parsed as JSON (a fenced ``json`` block counts); raise ValueError if it isn't."""
    for candidate in (text.strip(), extract_code(text).strip()):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ValueError("the answer is not valid JSON")


class Answer(str):
    """A model's answer as returned by ``%%chat``: a ``str`` that also carries metadata.

    It lands in ``Out[n]`` and ``_`` and can be used as a string. Its rich display offers
    ``text/plain`` and ``text/markdown`` (``text/plain`` only for ``-f text``; a fenced block
    for ``-f code``; ``application/json`` as well for ``-f json`` when the answer parses),
    and the output's metadata records the model, the token usage and what recovery did.
    """

    model: str
    usage: Mapping[str, int | None]
    actions: tuple[str, ...]
    finish_reason: str | None
    answer_format: str
    session: str

    def __new__(cls, text: str, *, model: str = "", usage: Mapping[str, int | None] | None = None,
                actions: Sequence[str] = (), finish_reason: str | None = None,
                answer_format: str = "markdown", session: str = "default") -> Answer:
        self = super().__new__(cls, text)
        self.model = model
        self.usage = dict(usage or {})
        self.actions = tuple(actions)
        self.finish_reason = finish_reason
        self.answer_format = answer_format
        self.session = session
        return self

    @property
    def text(self) -> str:
        return str(self)

    @property
    def metadata(self) -> dict[str, Any]:
        """What the output's metadata records (JSON-serializable)."""
        return {
            "model": self.model,
            "usage": dict(self.usage),
            "actions": list(self.actions),
            "finish_reason": self.finish_reason,
            "session": self.session,
        }

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
            data["text/markdown"] = f"```python\n{extract_code(text)}\n```"
        elif self.answer_format == "json":
            with contextlib.suppress(ValueError):
                data["application/json"] = parse_json_answer(text)
            data["text/markdown"] = f"```json\n{text}\n```"
        return data, {"ipy_ctxrecovery": self.metadata}


def usage_dict(usage: Any) -> dict[str, int | None]:
    """A Usage-like object (or mapping, or None) as a plain dict."""
    if usage is None:
        return {}
    if isinstance(usage, Mapping):
        return {str(k): v for k, v in usage.items()}
    return {
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
    }


class EventPrinter:
    """Prints one status line per recovery event (the SPEC's texts), nothing for routine ones.

    Routine events are the per-turn bookkeeping: a pre-flight check that found nothing to do
    and the end-of-turn sizes. ``verbose=True`` prints those too. A final failure is never
    printed here: whoever called ``send`` reports it once (the cell fails with that sentence).
    """

    def __init__(self, stream: TextIO | None = None, *, verbose: bool = False) -> None:
        self._stream = stream
        self.verbose = verbose
        self.lines: list[str] = []

    def is_routine(self, event: ev.Event) -> bool:
        if isinstance(event, ev.TurnFinished):
            return True
        return isinstance(event, ev.Preflight) and event.action == "ok"

    def __call__(self, event: ev.Event) -> None:
        message = describe(event).strip()
        if not message or isinstance(event, ev.Failed):
            return
        if self.is_routine(event) and not self.verbose:
            return
        self.lines.append(message)
        print(message, file=self._stream or sys.stdout, flush=True)


class Streamer:
    """Streams an answer into a display handle, coalescing updates (~100 ms by default).

    ``display`` and ``clock`` are injected so the same code runs under a kernel, in a test
    that captures display calls, and not at all in terminal IPython (``live=False``: the
    answer is shown once, at the end, as the cell's result).
    """

    def __init__(self, *, live: bool, fmt: str, interval: float,
                 display: Callable[..., Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.live = live
        self.fmt = fmt
        self.interval = interval
        self._display = display
        self._clock = clock
        self._handle: Any = None
        self._parts: list[str] = []
        self._last = 0.0
        self._shown = ""
        self.updates = 0

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def _bundle(self, text: str) -> dict[str, str]:
        if self.fmt == "markdown":
            return {"text/plain": text, "text/markdown": text}
        return {"text/plain": text}

    def _publish(self) -> None:
        text = self.text
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

    def __call__(self, delta: str) -> None:
        """``on_text`` callback: called with each text delta, from the kernel thread."""
        if not delta:
            return
        self._parts.append(delta)
        if self.live and (self._handle is None or self._clock() - self._last >= self.interval):
            self._publish()

    def flush(self) -> None:
        """Show whatever arrived since the last coalesced update."""
        if self.live and self._parts:
            self._publish()

    def finish(self, final: Any = None) -> bool:
        """End the stream. With ``final`` (the Answer), the live area becomes the finished
        answer, with its formats and metadata, so the cell keeps ONE output and no empty
        leftover; without, the streamed text stays as shown (a loop of cells, an interrupt,
        a failure). Returns True when ``final`` was shown here."""
        if self._handle is None:
            return False
        if final is None:
            self._publish()
            return True
        self._handle.update(final)
        return True
