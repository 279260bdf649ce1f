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
    code_blocks,
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
    streamer = Streamer(mode="display", fmt="markdown", interval=0.1, display=display,
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
    streamer = Streamer(mode="display", fmt="markdown", interval=0.0, display=display)
    streamer("par")
    streamer("tial")
    answer = Answer("partial", model="m")
    assert streamer.finish(answer) is True
    # The live area becomes the answer object (its formats and metadata); nothing empty.
    assert log[-1] == ("update", answer) and log[-1][1] is answer
    assert all(entry[1] for entry in log)
    assert answer.shown  # shown where it streamed: displaying it again shows nothing
    quiet = Streamer(mode="off", fmt="markdown", interval=0.0, display=display)
    quiet("x")
    fresh = Answer("x")
    assert quiet.finish(fresh) is False and not fresh.shown  # the caller shows it


def test_streamer_not_live_collects_without_displaying() -> None:
    log, display = recorder()
    streamer = Streamer(mode="off", fmt="text", interval=0.0, display=display)
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
        "✂ microcompact: 3 truncated, 2 summarized, 1.7 MB freed",
        "ℹ pre-flight: history 4.3 MB ≈ 86% of configured cap (5 MB) — compacting",
    ]
    assert len(printer.events) == 5   # every event is kept (the output's metadata)
    debug = EventPrinter(io.StringIO(), verbosity="debug")
    debug(ev.TurnFinished(history_bytes=1024, est_tokens=256, window=1024, cap=None))
    assert debug.lines == ["· history 1 KB ≈ 256 tokens (25% of the 1,024-token window)"]
    quiet = EventPrinter(io.StringIO(), verbosity="quiet")
    quiet(ev.MicrocompactApplied(truncated=3, summarized=2, bytes_freed=10))
    quiet(ev.Truncated(max_tokens=80, escalations=2))
    assert quiet.lines == ["⚠ answer still cut at max_tokens=80 after 2 escalations — raise "
                           "--max-tokens or CHATCLI_MAX_TOKEN_ESCALATIONS, or ask for a "
                           "shorter answer"]


def test_a_cut_at_the_models_own_limit_names_it() -> None:
    printer = EventPrinter(io.StringIO(), model_limit=10, model="emulator")
    printer(ev.Truncated(max_tokens=10, escalations=0))
    assert printer.lines == ["⚠ answer cut at 10 tokens: that is the most emulator writes in "
                             "one answer — ask for a shorter answer, or for the rest in the "
                             "next cell"]


def test_terminal_streaming_prints_deltas_and_ends_the_line_before_a_status_line() -> None:
    out = io.StringIO()
    streamer = Streamer(mode="print", fmt="markdown", interval=0.1, out=out)
    printer = EventPrinter(out, before_line=streamer.break_line)
    streamer("w1 ")
    streamer("w2")
    assert out.getvalue() == "w1 w2"          # as it arrives, no coalescing
    printer(ev.Escalation(attempt=1, max_tokens=20, previous=10, of=2))
    streamer(" w3")
    answer = Answer("w1 w2 w3")
    assert streamer.finish(answer) is True and answer.shown
    assert out.getvalue() == ("w1 w2\n↗ answer cut at max_tokens=10 — continuing with "
                              "max_tokens=20 (escalation 1/2)\n w3\n")


def terminal() -> tuple[io.StringIO, Streamer, EventPrinter]:
    """What the magic wires up in terminal IPython: a printing streamer, and an event
    printer whose lines wait while the answer's line is open."""
    out = io.StringIO()
    streamer = Streamer(mode="print", fmt="markdown", interval=0.1, out=out)
    printer = EventPrinter(out, before_line=streamer.break_line,
                           mid_line=lambda: streamer.line_open)
    return out, streamer, printer


def test_terminal_streaming_holds_status_lines_until_the_continued_answer_ends() -> None:
    out, streamer, printer = terminal()
    streamer("w1 w2 w")
    printer(ev.Escalation(attempt=1, max_tokens=20, previous=10, of=2))
    streamer("3 w4")                           # the cut word goes on, on the same line
    printer(ev.Escalation(attempt=2, max_tokens=40, previous=20, of=2))
    streamer(" w5")
    assert out.getvalue() == "w1 w2 w3 w4 w5"
    printer.release()
    # Told after the answer, in the past: the answer was continued.
    assert out.getvalue() == ("w1 w2 w3 w4 w5\n"
                              "↗ answer cut at max_tokens=10 — continued with max_tokens=20 "
                              "(escalation 1/2)\n"
                              "↗ answer cut at max_tokens=20 — continued with max_tokens=40 "
                              "(escalation 2/2)\n")
    printer.release()                          # nothing held: nothing printed
    printer(ev.Escalation(attempt=1, max_tokens=20, previous=10, of=2))   # no open line
    assert out.getvalue().endswith("(escalation 2/2)\n↗ answer cut at max_tokens=10 — "
                                   "continuing with max_tokens=20 (escalation 1/2)\n")


def test_held_lines_come_before_the_next_line_said_outside_the_answer() -> None:
    out, streamer, printer = terminal()
    streamer("w1")
    printer(ev.Escalation(attempt=1, max_tokens=20, previous=10, of=2))
    printer(ev.Truncated(max_tokens=20, escalations=1))      # held too: mid-answer
    assert out.getvalue() == "w1"
    printer.say("ℹ said by the magic")                          # the answer has ended
    assert printer.lines[0].startswith("↗ answer cut at max_tokens=10 — continued")
    assert printer.lines[1].startswith("⚠ answer still cut at max_tokens=20")
    assert printer.lines[2] == "ℹ said by the magic"
    assert out.getvalue().startswith("w1\n↗ answer cut")


def test_a_shown_answer_displays_nothing_the_second_time() -> None:
    from IPython.core.formatters import DisplayFormatter

    formatter = DisplayFormatter()
    answer = Answer("hello")
    data, _ = formatter.format(answer)
    assert data["text/markdown"] == "hello"
    answer.shown = True
    assert formatter.format(answer) == ({}, {})


def test_a_copy_or_a_pickle_of_a_shown_answer_shows() -> None:
    import copy
    import pickle

    from IPython.core.formatters import DisplayFormatter

    answer = Answer("hello", model="m", usage={"prompt_tokens": 3})
    answer.shown = True
    for other in (pickle.loads(pickle.dumps(answer)), copy.deepcopy(answer)):
        assert other == "hello" and other.model == "m" and other.usage == {"prompt_tokens": 3}
        assert not other.shown and formatter_text(DisplayFormatter(), other) == "hello"
    assert answer.shown


def formatter_text(formatter: Any, answer: Answer) -> str:
    return str(formatter.format(answer)[0]["text/plain"])


def test_event_records_for_the_metadata() -> None:
    from ipy_ctxrecovery.notebook.display import event_record

    record = event_record(ev.ToolRun(name="fetch", ok=False, detail="Error: boom"))
    assert record == {"event": "ToolRun", "name": "fetch", "ok": False, "chars": 0,
                      "limit_reached": False, "max_rounds": 0, "detail": "Error: boom",
                      "line": "⚙ fetch failed: Error: boom"}


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
    assert code_blocks(text) == [("python", "print(1)"), ("", "x")]
    assert extract_code(text) == "print(1)\n\nx"     # every block, in order
    assert extract_code("x = 1\nprint(x)\n") == "x = 1\nprint(x)"    # bare code: a cell
    assert extract_code("Use a dict comprehension here.") is None    # prose: no cell
    shell = "```bash\nls -l\n```\nthen\n```sh\npwd\n```"
    assert extract_code(shell) == "%%bash\nls -l\n\npwd"
    mixed = "```python\nimport os\n```\n```bash\npip install x\n```"
    assert extract_code(mixed) == "import os\n\n# bash:\n# pip install x"
    code = Answer(mixed, answer_format="code")._repr_mimebundle_()[0]["text/markdown"]
    assert code == "```python\nimport os\n```\n\n```bash\npip install x\n```"
    assert parse_json_answer('[1, {"a": null}]') == [1, {"a": None}]
    assert parse_json_answer('Sure:\n```json\n{"k": 2}\n```') == {"k": 2}
    with pytest.raises(ValueError):
        parse_json_answer("not json")


KEY = "gw-team42-0f9e8d7c6b5a"


def hide(text: str) -> str:
    return text.replace(KEY, "[REDACTED]")


def test_a_streamed_display_shows_each_update_masked() -> None:
    log, display = recorder()
    streamer = Streamer(mode="display", fmt="text", interval=0.0, display=display, mask=hide)
    for delta in ("key gw-team42-", "0f9e8d7c6b5a", " done"):
        streamer(delta)
    shown = [data["text/plain"] for _, data in log]
    assert shown == ["key gw-team42-", "key [REDACTED]", "key [REDACTED] done"]
    assert streamer.text == f"key {KEY} done"          # the answer itself, unmasked


def test_a_printed_answer_goes_out_a_line_at_a_time_so_a_secret_is_masked_with_its_name(
        ) -> None:
    from ipy_ctxrecovery.redaction import mask_secrets

    out = io.StringIO()
    streamer = Streamer(mode="print", fmt="text", interval=0.0, out=out,
                        mask=lambda t: mask_secrets(hide(t)))
    streamer("the key is gw-te")
    assert out.getvalue() == "" and streamer.line_open      # the unended line waits
    streamer("am42-0f9e8d7c6b5a, keep it\nsafe. password = hunter2")
    assert out.getvalue() == "the key is [REDACTED], keep it\n"
    streamer("hunter2 in the config\nAuthorization: Bearer abcdef")
    streamer("0123456789abcdef end")
    assert streamer.finish() is True
    assert out.getvalue() == ("the key is [REDACTED], keep it\n"
                              "safe. password = [REDACTED] in the config\n"
                              "Authorization: Bearer [REDACTED] end\n")
    long = io.StringIO()
    streamer = Streamer(mode="print", fmt="text", interval=0.0, out=long, mask=hide)
    streamer("word " * 1000)                                 # 5,000 chars, no line end
    assert 4000 < len(long.getvalue()) < 5000 and long.getvalue().endswith(" ")
