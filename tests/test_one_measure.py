"""One measure of a state: the turn card, the live panel, ``%chat status`` and
``%chat explore`` print the same bytes and tokens for the same history.

Each view is read as the user reads it (its text), after real turns on the emulator — one
taught a payload cap by a 413, one answered without the built-in tool (``--no-read-file``)
— and every figure is compared to the unit, with the session's own measure
(:meth:`~ipy_ctxrecovery.session.ChatSession.history_size`) behind them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.displaypub import DisplayPublisher
from turn_streams import LOREM

from ipy_ctxrecovery.notebook import get_magics
from ipy_ctxrecovery.notebook.magics import ChatMagics

#: "7.9 KB ≈ 1,982 tokens", "14.3 KB of 22.3 KB cap (learned) · ≈3,609 of …"
_SIZE = r"(\d[\d,.]* (?:B|KB|MB))"
_TOKENS = r"≈ ?([\d,]+)"


class Recording(DisplayPublisher):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shown: list[dict[str, Any]] = []

    def publish(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self.shown.append(data)


@pytest.fixture
def chat(loaded_shell: Any) -> Iterator[tuple[Any, ChatMagics, Recording]]:
    magics = get_magics(loaded_shell)
    assert magics is not None
    magics.live_display, magics.turn_card, magics.stream_interval = "always", "always", 0.0
    recording = Recording(shell=loaded_shell)
    saved, loaded_shell.display_pub = loaded_shell.display_pub, recording
    yield loaded_shell, magics, recording
    loaded_shell.display_pub = saved


def _card(recording: Recording) -> str:
    cards = [d["text/plain"] for d in recording.shown
             if str(d.get("text/plain", "")).startswith("turn · ")]
    assert cards, "no turn card was shown"
    return cards[-1]


def _figures(line: str) -> tuple[str, int]:
    size = re.search(_SIZE, line)
    tokens = re.search(_TOKENS, line)
    assert size and tokens, line
    return size.group(1), int(tokens.group(1).replace(",", ""))


def _line(text: str, start: str) -> str:
    found = [line for line in text.splitlines() if line.strip().startswith(start)]
    assert len(found) == 1, (start, text)
    return found[0]


def _views(ip: Any, magics: ChatMagics, recording: Recording,
           capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """What each view prints of the history now: (size, tokens) and its cap words."""
    card = _line(_card(recording), "after")
    panel = magics.workspace.panel("default").text()
    capsys.readouterr()
    ip.run_line_magic("chat", "status")
    status = capsys.readouterr().out
    explorer = ip.run_line_magic("chat", "explore").text()
    size_line, tokens_line = panel.splitlines()[1:3]       # the size bar, the token bar
    history = [line for line in explorer.splitlines() if line.startswith("history:")]
    return {
        "card": _figures(card),
        "panel": _figures(size_line + " " + tokens_line),
        "status": _figures(_line(status, "history:")),
        "explorer": _figures(history[0]) if len(history) == 1 else None,
        "texts": {"card": card, "panel": panel, "status": status, "explorer": explorer},
    }


def test_card_panel_status_and_explorer_agree_to_the_unit_with_a_learned_cap(
        chat: tuple[Any, ChatMagics, Recording], capsys: pytest.CaptureFixture[str]) -> None:
    ip, magics, recording = chat
    ip.run_line_magic("chat", "emulator --max-body 24KB --context-window 200000")
    magics.workspace.panel("default")          # a panel follows the turns, as in a notebook
    for i in range(14):                        # past 24 KB: a 413 teaches the cap
        ip.run_cell_magic("chat", "", f"part {i}: " + LOREM * 40)
    session = magics.workspace.session("default")
    # (a summary being prepared in the background meanwhile moves none of these figures: its
    # usage is taken into the token estimate at the next turn)
    status = session.status()
    assert status.cap_source == "learned" and status.compactions >= 1
    views = _views(ip, magics, recording, capsys)
    expected = (f"{status.history_bytes / 1024:.1f} KB", status.est_tokens)
    assert views["card"] == views["panel"] == views["status"] == views["explorer"] == expected
    assert (status.history_bytes, status.est_tokens) == session.history_size()
    # The same cap, in the same words, where each names it.
    cap = f"{status.cap / 1024:.1f} KB"
    texts = views["texts"]
    assert f"of {cap} cap (learned)" in texts["card"]
    assert f"history  {expected[0]} of {cap} cap (learned)" in texts["panel"]
    assert f"payload cap: {cap} (learned)" in texts["status"]
    assert f"cap {cap} (learned)" in texts["explorer"]
    # The explorer's next request is another quantity, and says so.
    before = _line(texts["explorer"], "before:")
    assert "the history and the next message" in before
    assert _figures(before) != expected


def test_a_turn_without_the_built_in_tool_reads_the_same_as_the_status(
        chat: tuple[Any, ChatMagics, Recording], capsys: pytest.CaptureFixture[str]) -> None:
    ip, magics, recording = chat
    # Code calling the magic (its answer is returned), not a %%chat cell of its own: the
    # shell's last cell is this one, whatever an earlier test ran in the same shell.
    ip.run_cell("pass", store_history=True)
    ip.run_line_magic("chat", "emulator --context-window 200000")
    for i in range(3):
        ip.run_cell_magic("chat", "", f"part {i}: " + LOREM * 20)
    answer = ip.run_cell_magic("chat", "--no-read-file", "and without the tool: " + LOREM * 20)
    views = _views(ip, magics, recording, capsys)
    assert views["card"] == views["panel"] == views["status"] == views["explorer"]
    # The raw figures behind them: the card's TurnFinished and the status, byte for byte.
    finished = [e for e in answer.events if e["event"] == "TurnFinished"][-1]
    status = magics.workspace.session("default").status()
    assert (finished["history_bytes"], finished["est_tokens"]) == \
        (status.history_bytes, status.est_tokens)
    # An exchange not kept (--no-history) leaves the history as it was: so says the card.
    ip.run_cell_magic("chat", "--no-history", "off the record: " + LOREM * 20)
    views = _views(ip, magics, recording, capsys)
    assert views["card"] == views["panel"] == views["status"] == views["explorer"]


def test_between_turns_the_panel_names_the_history_while_a_turn_runs_the_request(
        chat: tuple[Any, ChatMagics, Recording]) -> None:
    ip, magics, recording = chat
    ip.run_line_magic("chat", "emulator --context-window 200000")
    panel = magics.workspace.panel("default")
    seen: list[str] = []
    session = magics.workspace.session("default")
    unsubscribe = session.subscribe(lambda _e: seen.append(panel.text().splitlines()[1]))
    ip.run_cell_magic("chat", "", "hello " + LOREM)
    unsubscribe()
    assert any(line.startswith("request  ") for line in seen), seen
    assert panel.text().splitlines()[1].startswith("history  ")
