"""The plain-text layer: Answer bundles, the event printer, coalesced streaming."""

from __future__ import annotations

import io
from typing import Any

import pytest

from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.notebook.display import (
    Answer,
    EventPrinter,
    Streamer,
    extract_code,
    parse_json_answer,
)


class Handle:
    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log

    def update(self, data: Any, raw: bool = False) -> None:
        self.log.append(("update", data))


def recorder() -> tuple[list[tuple[str, Any]], Any]:
    log: list[tuple[str, Any]] = []

    def display(data: Any, raw: bool = False, display_id: bool = False) -> Handle:
        assert raw and display_id
        log.append(("display", data))
        return Handle(log)

    return log, display


def test_streamer_coalesces_updates_by_the_clock() -> None:
    now = [0.0]
    log, display = recorder()
    streamer = Streamer(live=True, fmt="markdown", interval=0.1, display=display,
                        clock=lambda: now[0])
    streamer("a")            # first delta: shown at once
    streamer("b")            # 0 s later: held
    now[0] = 0.05
    streamer("c")            # still inside the interval: held
    now[0] = 0.2
    streamer("d")            # interval passed: one update with everything so far
    streamer("e")
    streamer.flush()         # the end of the answer: what is left
    assert streamer.finish() is True   # without a final answer: the text stays as shown
    assert log == [
        ("display", {"text/plain": "a", "text/markdown": "a"}),
        ("update", {"text/plain": "abcd", "text/markdown": "abcd"}),
        ("update", {"text/plain": "abcde", "text/markdown": "abcde"}),
    ]
    assert streamer.text == "abcde" and streamer.updates == 3


def test_streamer_finish_shows_the_final_answer_in_place() -> None:
    log, display = recorder()
    streamer = Streamer(live=True, fmt="markdown", interval=0.0, display=display)
    streamer("par")
    streamer("tial")
    answer = Answer("partial", model="m")
    assert streamer.finish(answer) is True
    # The live area becomes the answer object (its formats and metadata); nothing empty.
    assert log[-1] == ("update", answer) and log[-1][1] is answer
    assert all(entry[1] for entry in log)
    quiet = Streamer(live=False, fmt="markdown", interval=0.0, display=display)
    quiet("x")
    assert quiet.finish(answer) is False  # nothing shown live: the caller returns the answer


def test_streamer_not_live_collects_without_displaying() -> None:
    log, display = recorder()
    streamer = Streamer(live=False, fmt="text", interval=0.0, display=display)
    for part in ("x", "y"):
        streamer(part)
    streamer.flush()
    streamer.finish()
    assert log == [] and streamer.text == "xy"


def test_event_printer_shows_actions_not_routine() -> None:
    out = io.StringIO()
    printer = EventPrinter(out)
    mb = 1024 * 1024
    printer(ev.Preflight(body_bytes=1, est_tokens=1, cap=None, window=10, action="ok"))
    printer(ev.TurnFinished(history_bytes=1, est_tokens=1, window=10, cap=None))
    printer(ev.MicrocompactApplied(truncated=3, summarized=2, bytes_freed=int(1.7 * mb)))
    printer(ev.Preflight(body_bytes=int(4.3 * mb), est_tokens=1, cap=5 * mb,
                         cap_source="configured", window=10, action="compact",
                         reasons=("cap",)))
    printer(ev.Failed(failure_kind=FailureKind.OTHER, sentence="reported by the cell instead"))
    assert out.getvalue().splitlines() == [
        "🗜 microcompact: 3 truncated, 2 summarized, 1.7 MB freed",
        "ℹ pre-flight: history 4.3 MB ≈ 86% of configured cap (5 MB) — compacting",
    ]
    verbose = EventPrinter(io.StringIO(), verbose=True)
    verbose(ev.TurnFinished(history_bytes=1024, est_tokens=256, window=1024, cap=None))
    assert verbose.lines == ["history 1 KB ≈ 256 tokens (25% of the 1,024-token window)"]


def test_answer_is_a_string_with_a_rich_bundle() -> None:
    answer = Answer("**hi**", model="emulator", usage={"prompt_tokens": 3},
                    actions=("✓ recovered",), finish_reason="end", session="s")
    assert answer == "**hi**" and answer.upper() == "**HI**"
    data, metadata = answer._repr_mimebundle_()
    assert data == {"text/plain": "**hi**", "text/markdown": "**hi**"}
    assert metadata == {"ipy_ctxrecovery": {"model": "emulator", "usage": {"prompt_tokens": 3},
                                            "actions": ["✓ recovered"],
                                            "finish_reason": "end", "session": "s"}}
    assert Answer("plain", answer_format="text")._repr_mimebundle_()[0] == {"text/plain": "plain"}


def test_code_and_json_extraction() -> None:
    text = "Here:\n```python\nprint(1)\n```\nand more\n```\nx\n```"
    assert extract_code(text) == "print(1)"
    assert extract_code("no fences") == "no fences"
    assert parse_json_answer('[1, {"a": null}]') == [1, {"a": None}]
    assert parse_json_answer('Sure:\n```json\n{"k": 2}\n```') == {"k": 2}
    with pytest.raises(ValueError):
        parse_json_answer("not json")
