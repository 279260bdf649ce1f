"""replay(): recorded turns re-sent on a private emulator; the report; bad input."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ipy_ctxrecovery import ChatSession, ConfigError, CtxRecoveryError, Settings
from ipy_ctxrecovery.core.history import ToolCall
from ipy_ctxrecovery.session.replay import RecordedTurn, ReplayReport, read_turns, replay
from ipy_ctxrecovery.session.store import data_root
from ipy_ctxrecovery.session.tools import chat_tool


@chat_tool
def fetch_logs(service: str) -> str:
    """Return a service's access log.

    Args:
        service: the service name.
    """
    return "".join(f"{n:05d} {service} GET /api/items/{n} 200 {n % 97} ms\n" for n in range(300))


def recorded(emu: Any, turns: int = 4, *, name: str = "recorded",
             sizes: list[tuple[int, int]] | None = None) -> ChatSession:
    """A session recorded on ``emu``: a log fetch and a pasted question per turn;
    ``sizes`` gets (messages, bytes) of the history after each send."""
    session = ChatSession("emulator", emulator=emu, tools=[fetch_logs], system="You are terse.",
                          name=name)
    for i in range(turns):
        for text in (f'Fetch {i} [[tool fetch_logs {{"service": "svc{i}"}}]]',
                     f"Question {i} " + "lorem ipsum " * 300):
            session.send(text, stream=False)
            if sizes is not None:
                sizes.append((len(session.history), session.status().history_bytes))
    return session


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


# -- the recorded turns ---------------------------------------------------------------------------

def test_read_turns_finds_requests_calls_results_and_resets(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=2)
    session.reset()
    session.send("after the reset", stream=False)
    found = read_turns(session)
    assert found.system == "You are terse." and found.model == "emulator"
    assert [t.text.split()[0] for t in found.turns] == ["Fetch", "Question", "Fetch",
                                                         "Question", "after"]
    fetch = found.turns[0]
    assert [c.name for c in fetch.calls] == ["fetch_logs"]
    assert fetch.results == ((fetch_logs("svc0"), False),)
    assert [t.reset_before for t in found.turns] == [False, False, False, False, True]
    by_name = read_turns(session.name)                    # from disk, without the session
    assert (by_name.system, by_name.turns) == (found.system, found.turns)
    assert [t.name for t in found.tools] == ["read_file", "fetch_logs"]
    assert [t.name for t in by_name.tools] == ["read_file"]   # the built-in, by default


def test_replay_text_asks_for_the_recorded_calls_and_answer_length() -> None:
    call = ToolCall("c1", "grep", '{"pattern": "err"}')
    plain = RecordedTurn("find errors", (call,), (("3 hits", False),), answer_chars=2_000)
    text = plain.replay_text()
    assert text.startswith("find errors\n[[tool grep {\"pattern\": \"err\"}]] [[words ")
    words = int(text.rsplit("[[words ", 1)[1].rstrip("]"))
    reply = " ".join(f"w{i}" for i in range(1, words + 1))
    assert abs(len(reply) - 2_000) < 10
    emulated = RecordedTurn('go [[tool grep {"pattern": "x"}]]', (call,), answer_chars=80)
    assert emulated.replay_text() == emulated.text         # already asks; short answer


# -- fidelity -------------------------------------------------------------------------------

def test_a_replay_under_the_same_limits_repeats_the_session(emulator: Any) -> None:
    sizes: list[tuple[int, int]] = []
    session = recorded(emulator(context_window=128_000), sizes=sizes)
    report = replay(session, limits={"context_window": 128_000})
    (run,) = report.runs
    assert run.answered == run.total_turns == 8 and not run.rejections
    assert [t.history_messages for t in run.turns] == [n for n, _ in sizes]
    differences = [row.history_bytes - size for row, (_, size) in zip(run.turns, sizes,
                                                                       strict=True)]
    # Equal to the byte, but for the saved-file paths that previews name (the replay's
    # sessions live in another directory): no preview yet in the first two turns.
    assert differences[:2] == [0, 0] and all(abs(d) <= 100 for d in differences)
    assert all(t.request_present for t in run.turns)
    assert run.requests == 12 and run.summaries == 0        # 4 tool turns take 2 requests


def test_a_sweep_runs_one_replay_per_value_behind_the_same_proxy(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=6)
    seen: list[tuple[int, int]] = []
    report = replay(session, limits={"max_body": "16KB"},
                    sweep={"max_payload": ["8KB", "1MB"]},
                    on_progress=lambda done, total: seen.append((done, total)))
    below, above = report.runs
    assert (below.label, above.label) == ("max_payload=8KB", "max_payload=1MB")
    assert (below.cap, above.cap) == (8 * 1024, 1024 * 1024)
    assert below.proxy_limit == above.proxy_limit == 16 * 1024
    assert not below.rejections
    assert above.rejections == {"413": 1}            # one rejection teaches the cap
    assert above.final_cap is not None and above.final_cap < 16 * 1024
    assert all(t.answered and t.request_present for r in report.runs for t in r.turns)
    assert max(t.history_bytes for t in below.turns) < 8 * 1024
    assert seen == [(i, 24) for i in range(1, 25)]
    assert below.bytes_uploaded < above.bytes_uploaded


def test_a_sweep_of_an_emulator_limit(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=3)
    report = replay(session, sweep={"waf_over": ["12KB", "1MB"]})
    assert [r.limits["waf_over"] for r in report.runs] == [12 * 1024, 1024 * 1024]
    assert report.runs[0].rejections.get("WAF 403") == 1 and not report.runs[1].rejections


def test_a_reset_is_replayed(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=2)
    session.reset()
    session.send("fresh start", stream=False)
    run = replay(session).runs[0]
    assert run.turns[-1].history_messages == 3        # system, request, answer
    assert run.turns[-2].history_messages > 3


def test_replays_write_nothing_outside_a_temporary_directory(emulator: Any,
                                                             data_dir: Path) -> None:
    session = recorded(emulator(context_window=128_000), turns=2)
    before = _tree(data_dir)
    report = replay(session, limits={"max_body": "8KB"}, sweep={"cap": ["4KB", "1MB"]})
    assert len(report.runs) == 2
    assert _tree(data_dir) == before
    assert os.environ["IPY_CTXRECOVERY_DIR"] == str(data_dir) == str(data_root())


def test_cancel_stops_between_turns_and_keeps_what_was_done(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=3)
    stop = threading.Event()
    report = replay(session, sweep={"cap": ["8KB", "16KB"]},
                    on_progress=lambda done, total: stop.set() if done == 2 else None,
                    cancel=stop)
    assert report.cancelled and len(report.runs) == 1
    assert len(report.runs[0].turns) == 2 and report.runs[0].cancelled
    assert "cancelled" in report.text() and "2/6 (cancelled)" in report.text()


# -- rendering --------------------------------------------------------------------------------

def test_the_report_renders_as_a_table_bars_and_a_plot(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=3)
    report = replay(session, limits={"max_body": "16KB"}, sweep={"cap": ["8KB", "64KB"]})
    table = report.table()
    assert table[0] == ["", "cap=8KB", "cap=64KB"]
    assert [row[0] for row in table[1:4]] == ["turns answered", "requests sent", "rejections"]
    text = str(report)
    assert "turns answered" in text and "6/6" in text
    assert "|" in text and "!" in text and "✗" in text      # cap, proxy limit, a rejection
    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"] == text and "<table>" in bundle["text/html"]
    pytest.importorskip("matplotlib")
    plot = report.plot()._repr_mimebundle_()
    assert plot["image/png"].startswith(b"\x89PNG") and plot["text/plain"] == text


def test_without_matplotlib_the_plot_is_the_text(emulator: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    session = recorded(emulator(context_window=128_000), turns=1)
    report = replay(session)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    bundle = report.plot()._repr_mimebundle_()
    assert "image/png" not in bundle
    assert bundle["text/plain"].endswith("(plotting needs matplotlib: pip install "
                                         "'ipy-ctxrecovery[explore]' (print(report) shows "
                                         "the same figures as text).)")
    with pytest.raises(CtxRecoveryError, match="plotting needs matplotlib"):
        report.plot().figure()


# -- bad input --------------------------------------------------------------------------------

def test_a_session_that_does_not_exist(data_dir: Path) -> None:
    with pytest.raises(CtxRecoveryError, match=r"^there is no saved session named 'nope'; "):
        replay("nope")
    with pytest.raises(ConfigError, match="is not valid"):
        replay("../etc")
    with pytest.raises(CtxRecoveryError, match="takes a ChatSession or a saved session's name"):
        replay(42)
    assert not (data_dir / "sessions" / "nope").exists()


def test_a_corrupt_transcript_is_one_sentence_and_left_alone(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=1)
    path = session.directory / "transcript.jsonl"
    good = path.read_bytes()
    lines = good.decode().splitlines(keepends=True)
    path.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    corrupt = path.read_bytes()
    with pytest.raises(CtxRecoveryError) as caught:
        replay(session.name)
    assert str(caught.value) == (f"the transcript of session 'recorded' is corrupt at line 2 "
                                 f"({path}); nothing was replayed.")
    assert path.read_bytes() == corrupt
    path.write_text(lines[0] + '{"type": "message", "message": {"role": "wizard"}}\n')
    with pytest.raises(CtxRecoveryError, match="is corrupt at line 2"):
        replay(session.name)
    path.write_bytes(good + b'{"type": "mess')          # a torn last line is skipped
    assert replay(session.name).runs[0].total_turns == 2


def test_a_session_without_user_turns(emulator: Any) -> None:
    session = ChatSession("emulator", emulator=emulator(), system="sys", name="empty")
    with pytest.raises(CtxRecoveryError, match="^session 'empty' has no user messages to "
                                               "replay.$"):
        replay(session)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"limits": {"max_bodies": "1MB"}}, "'max_bodies' is not an emulator limit; use "),
    ({"limits": {"max_body": "huge"}}, "max_body='huge' is not a valid size"),
    ({"limits": {"context_window": 0}}, "context_window=0 must be a whole number"),
    ({"limits": ["max_body"]}, "is not a mapping"),
    ({"sweep": {"cap": ["1MB"], "window": [1000]}}, "sweep= takes one setting"),
    ({"sweep": {"cap": []}}, "must be a non-empty list"),
    ({"sweep": {"capp": ["1MB"]}}, "capp is not a setting (did you mean cap?)"),
    ({"sweep": {"cap": ["1MB", "lots"]}}, "is not a valid size"),
    ({"settings": {"emergency_keep_messages": 0}}, "must be at least 1"),
    ({"settings": "fast"}, "is not a Settings object"),
])
def test_bad_settings_and_limits_are_one_sentence_before_anything_runs(
        emulator: Any, data_dir: Path, kwargs: dict[str, Any], words: str) -> None:
    session = recorded(emulator(context_window=128_000), turns=1)
    before = _tree(data_dir)
    with pytest.raises(ConfigError) as caught:
        replay(session, **kwargs)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert _tree(data_dir) == before


def test_settings_default_to_the_sessions_own(emulator: Any) -> None:
    session = recorded(emulator(context_window=128_000), turns=1)
    session.update(settings=Settings(max_payload=64 * 1024))
    assert replay(session).runs[0].settings.max_payload == 64 * 1024
    assert replay(session, settings={"cap": "32KB"}).runs[0].cap == 32 * 1024
    assert isinstance(replay(session.name), ReplayReport)
