"""The recall tool (``core/recall.py``, ``session/recall.py``): after a compaction the model can
look up what was compacted away, in the session's own transcript and nowhere else.

Real sessions against the emulator over both wires: compacted three times, then asked about
a detail of the first turn, the emulator calls ``recall_transcript`` and quotes the passage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ipy_ctxrecovery import ChatSession
from ipy_ctxrecovery.core import recall
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.core.prompts import (
    RECALL_HINT,
    SUMMARIZE_SYSTEM_PROMPT,
    compaction_notice,
    with_recall_hint,
)
from ipy_ctxrecovery.emulator.replies import recall_arguments
from ipy_ctxrecovery.settings import Settings

WIRES = ["emulator", "emulator:anthropic"]
SUMMARIZE_PROMPT_START = SUMMARIZE_SYSTEM_PROMPT.split("\n")[0]
FACT = "The churn threshold for this project is 0.37; keep it in mind."


def _filler(label: str) -> str:
    return f"{label}:\n" + "\n".join(f"line {j} of words and more words" for j in range(30))


def _offered(request: Any) -> list[str]:
    names = []
    for tool in (request.body or {}).get("tools") or []:
        fn = tool.get("function")
        names.append(fn["name"] if isinstance(fn, dict) else tool["name"])
    return names


def _compacted_three_times(session: ChatSession) -> None:
    session.send(FACT)
    for i in range(3):
        session.send(_filler(f"Filler turn {i}"))
        session.send(_filler(f"More filler {i}"))
        assert session.compact().applied
    assert session.status().compactions == 3
    assert all(m.text != FACT for m in session.history)   # the turn was compacted away


@pytest.mark.parametrize("wire", WIRES)
def test_a_detail_of_a_compacted_turn_is_recalled_through_the_tool(wire: str,
                                                                   emulator: Any) -> None:
    emu = emulator()
    session = ChatSession(wire, emulator=emu, name=f"recall-{wire.replace(':', '-')}")
    _compacted_three_times(session)
    before = len(emu.requests)
    reply = session.send("Recall the churn threshold from the first turn.")
    sent = [r for r in emu.requests[before:] if r.method == "POST"]
    assert len(sent) == 2                           # the tool call, then the answer
    assert recall.RECALL_TOOL in _offered(sent[0])
    assert reply.text == f'In turn 1 the user wrote: "{FACT}"'
    call, result = session.history[-3], session.history[-2]
    assert call.tool_calls[0].name == recall.RECALL_TOOL
    assert json.loads(call.tool_calls[0].arguments) == {
        "from_turn": 1, "to_turn": 1, "words": "churn threshold"}
    assert result.text.startswith("Transcript passages of turn 1 matching the words churn, "
                                  "threshold:\n— turn 1, user —\n" + FACT)
    assert any("recall_transcript: ok" in a for a in reply.actions)
    session.close()


def test_not_offered_before_a_compaction_and_offered_from_then_on(emulator: Any) -> None:
    emu = emulator()
    session = ChatSession("emulator", emulator=emu, name="recall-offer")
    session.send(FACT)
    session.send("Recall the churn threshold.")        # no tool yet: a plain answer
    assert all(recall.RECALL_TOOL not in _offered(r) for r in emu.requests if r.method == "POST")
    assert [t.name for t in session.tools] == ["read_file"]
    assert session.history[-1].text.startswith("Emulator reply:")
    session.send(_filler("filler"))
    session.send(_filler("more filler"))
    assert session.compact().applied
    assert [t.name for t in session.tools] == ["read_file", recall.RECALL_TOOL]
    session.send("hello again")
    assert recall.RECALL_TOOL in _offered(emu.requests[-1])
    session.close()


def test_a_compaction_inside_a_recovery_offers_it_from_the_next_round(emulator: Any) -> None:
    # A 12 KB proxy cap: the turn that hits it is compacted by the recovery and resent with
    # the tools it was fitted with; every request after that one offers the tool.
    emu = emulator(max_body="12KB")
    session = ChatSession("emulator", emulator=emu, name="recall-midturn")
    session.send(FACT)
    for i in range(12):
        session.send(_filler(f"Turn {i}"))
        if session.status().compactions:
            break
    assert session.status().compactions == 1
    session.send("And now?")
    posts = [r for r in emu.requests if r.method == "POST"]
    rejected = next(i for i, r in enumerate(posts) if r.status == 413)
    assert all(recall.RECALL_TOOL not in _offered(r) for r in posts[:rejected + 1])
    resent = [r for r in posts[rejected + 1:]             # the summarizer's request aside
              if SUMMARIZE_PROMPT_START not in json.dumps(r.body, ensure_ascii=False)]
    assert RECALL_HINT in json.dumps(resent[0].body, ensure_ascii=False)
    assert recall.RECALL_TOOL not in _offered(resent[0])      # as it was fitted
    assert len(resent) >= 2 and all(recall.RECALL_TOOL in _offered(r) for r in resent[1:])
    session.close()


def _session_with_turns(name: str, turns: int) -> ChatSession:
    session = ChatSession("emulator", name=name)
    for i in range(1, turns + 1):
        session.send(f"Turn {i} says the marker value is m{i}x and nothing else.")
    return session


def _recall(session: ChatSession, **arguments: Any) -> tuple[str, bool]:
    tool = session.tools_after_compaction[0]
    return tool.run(json.dumps(arguments))


def test_a_turn_range_limits_the_search() -> None:
    session = _session_with_turns("recall-range", 6)
    text, error = _recall(session, words="marker value", from_turn=3, to_turn=4)
    assert not error
    assert [(p.turn, p.role) for p in recall.parse_passages(text)] == [
        (3, "user"), (3, "assistant"), (4, "user"), (4, "assistant")]
    assert "m3x" in text and "m4x" in text and "m2x" not in text and "m5x" not in text
    text, error = _recall(session, pattern=r"m[56]x", from_turn=5)
    assert not error and {p.turn for p in recall.parse_passages(text)} == {5, 6}
    text, error = _recall(session, words="marker", from_turn=9)
    assert error and text == ("Error: The transcript has 6 turns, so there is nothing from "
                              "turn 9 on.")
    text, error = _recall(session, words="nowhere-to-be-found")
    assert not error and text == ("No passage of turns 1-6 matches the words "
                                  "nowhere-to-be-found.")
    session.close()


def test_the_result_stays_within_its_bound() -> None:
    settings = Settings(recall_max_chars=600)
    session = ChatSession("emulator", name="recall-bound", settings=settings)
    for i in range(30):
        session.send(f"Row {i}: the marker appears here " + "padding " * 60)
    text, error = _recall(session, words="marker")
    assert not error and len(text) <= 600
    assert "more passages are not shown; narrow the search with from_turn and to_turn" in text
    assert recall.parse_passages(text)[0].turn == 1
    # a long line is shown around its match, cut at word ends
    long = recall.search(recall.entries([Message.user("x " * 900 + "needle " + "y " * 900)]),
                         recall.compile_query("needle"), max_chars=4_000)
    line = recall.parse_passages(long)[0].lines[0]
    assert "needle" in line and len(line) <= recall.LINE_SHOW_CHARS + 4
    assert line.startswith("… x") and line.endswith("y …")
    session.close()


def test_it_reads_the_transcript_and_no_other_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the churn threshold is 0.99 in this other file\n")
    session = _session_with_turns("recall-confined", 2)
    tool = session.tools_after_compaction[0]
    assert set(tool.parameters["properties"]) == {"words", "pattern", "from_turn", "to_turn"}
    assert tool.parameters["additionalProperties"] is False
    text, error = tool.run(json.dumps({"words": "churn", "path": str(secret)}))
    assert error and text.startswith("Error: unknown argument 'path'")
    opened: list[str] = []
    real_open = os.open

    def spy(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    for words in (str(secret), "../../secret.txt", "~/.ssh/id_rsa", "/etc/passwd"):
        text, error = tool.run(json.dumps({"words": words}))
        assert not error and text.startswith("No passage of turns 1-2 matches")
    text, error = tool.run(json.dumps({"pattern": r"\.\./secret"}))
    assert not error and "0.99" not in text
    assert opened and set(opened) == {str(session.directory / "transcript.jsonl")}
    session.close()


@pytest.mark.parametrize(("pattern", "why"), [
    ("(a+)+$", "repeats a repeat"),
    ("(a|ab)*c", "repeats an alternation"),
    ("a*a*a*x", "has 3 repeats"),
    (r"(x)\1", "back-reference"),
    ("[unclosed", "is not a valid regular expression"),
    ("x" * 201, "201 characters long"),
])
def test_a_bad_or_costly_pattern_is_one_sentence(pattern: str, why: str) -> None:
    session = _session_with_turns(f"recall-bad-{abs(hash(pattern)) % 10_000}", 1)
    text, error = _recall(session, pattern=pattern)
    assert error and why in text
    body = text.removeprefix("Error: ")
    assert body.count(". ") == 0 and body.endswith(".") and "\n" not in body
    text, error = _recall(session, words="marker", pattern="m1x")
    assert error and text == "Error: Give either words or a pattern, not both."
    session.close()


def test_without_a_transcript_on_disk_it_answers_from_memory(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    # A directory that cannot be created: the session runs in memory, nothing is saved.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("IPY_CTXRECOVERY_DIR", str(blocker))
    session = ChatSession("emulator", name="recall-memory")
    assert not session._files.path.is_file()
    text, error = _recall(session, words="anything")
    assert error and text == "Error: This session has no transcript to search yet."
    with pytest.warns(RuntimeWarning):
        session.send(FACT)
    text, error = _recall(session, words="churn")
    assert not error and FACT in text
    session.close()


def test_the_notices_name_the_tool_in_a_sentence_of_their_own() -> None:
    assert recall.RECALL_TOOL in RECALL_HINT
    notice = with_recall_hint(compaction_notice(3, summarized=False))
    assert notice == compaction_notice(3, summarized=False)[:-1] + " " + RECALL_HINT + "]"
    assert with_recall_hint("[STRUCTURED SUMMARY — covering 4 earlier messages]") == (
        "[STRUCTURED SUMMARY — covering 4 earlier messages] " + RECALL_HINT)


def test_the_emulator_reads_a_recall_question() -> None:
    assert recall_arguments("What was the churn threshold in the first turn?") == {
        "from_turn": 1, "to_turn": 1, "words": "churn threshold"}
    assert recall_arguments("Look up the model_name we chose in turn 4") == {
        "from_turn": 4, "to_turn": 4, "words": "model_name"}
    assert recall_arguments("Plot the churn rate") is None
    assert recall_arguments("Which region did the requests come from?") is None
    assert recall_arguments("What was the slowest service?") is None
    assert recall_arguments("what was it?") is None


def test_listed_in_chat_tools(loaded_shell: Any, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    loaded_shell.run_line_magic("chat", "tools")
    out = capsys.readouterr().out.splitlines()
    at = out.index("offered after a compaction (not yet: the session has not compacted):")
    assert out[at + 1].startswith("  recall_transcript (built-in, offered after a compaction): "
                                  "Search the full transcript")
