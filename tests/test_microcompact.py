"""microcompact: age-based previews and one-line summaries, judged on the original size."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import histories, valid_histories

from ipy_ctxrecovery.core import history as h
from ipy_ctxrecovery.core.budget import (
    LEVEL_OLD_PREVIEW,
    LEVEL_PREVIEW,
    LEVEL_SUMMARY,
    ResultStore,
    compaction_info,
    detect_kind,
    enforce_budget,
)
from ipy_ctxrecovery.core.history import Message, Role, ToolCall
from ipy_ctxrecovery.core.markers import OLD_PREVIEW_RE
from ipy_ctxrecovery.core.microcompact import MicrocompactReport, microcompact
from ipy_ctxrecovery.core.pairing import repair_pairing
from ipy_ctxrecovery.settings import Settings

PROPS = settings(max_examples=300, deadline=None)
S = Settings()


def listing(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()} if d.exists() else {}


JSON_30K = json.dumps([{"id": i, "name": f"ítem {i} ✓"} for i in range(1100)], ensure_ascii=False)
TRACEBACK = ("Traceback (most recent call last):\n"
             + '  File "/srv/app.py", line 10, in main\n    run()\n' * 200
             + "ValueError: boom\n")
DIFF = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n" + "@@ -1 +1 @@\n-a\n+b\n" * 600
CSV = "id,name,score\n" + "".join(f"{i},n{i},{i / 2}\n" for i in range(800))
HTML = "<!DOCTYPE html>\n<html><body>\n" + "<p>日本語のテキスト</p>\n" * 400 + "</body></html>\n"
LOG = "".join(f"2026-01-01 INFO step {i} done\n" for i in range(400))


def tool_loop(*contents: str, final: bool = True) -> h.History:
    """One user request and a tool loop: one model round trip per tool result."""
    msgs: list[Message] = [Message.system("You are helpful."), Message.user("analyse the repo")]
    for k, c in enumerate(contents):
        msgs += [Message.assistant("", [ToolCall("call_0", "run_shell", json.dumps({"k": k}))]),
                 Message.tool("call_0", c, name="run_shell")]
    if final:
        msgs.append(Message.assistant("Here is what I found."))
    return tuple(msgs)


# -- examples -------------------------------------------------------------------------------

def test_both_levels_fire_with_default_settings_on_a_realistic_history(tmp_path: Path) -> None:
    """ANCHORS 9: ChatCLI's 4-turn summary never fires with its own defaults; ours does."""
    store = ResultStore(tmp_path / "results")
    hist = tool_loop(JSON_30K, TRACEBACK, DIFF, CSV, "small result", HTML)
    ages = h.ages(hist)
    assert [ages[i] for i, m in enumerate(hist) if m.role is Role.TOOL] == [6, 5, 4, 3, 2, 1]
    out, report = microcompact(hist, settings=S, store=store)
    tools = [m for m in out if m.role is Role.TOOL]
    json_p, tb_p, diff_p = (store.path_for(c) for c in (JSON_30K, TRACEBACK, DIFF))
    assert tools[0].text == (f"[Old tool result cleared — 1 line, {len(JSON_30K)} chars, JSON "
                             f"— full content at {json_p}]")
    assert tools[1].text == (f"[Old tool result cleared — {TRACEBACK.count(chr(10))} lines, "
                             f"{len(TRACEBACK)} chars, Python traceback — full content at {tb_p}]")
    assert tools[2].text.startswith("[Old tool result cleared — ") and ", diff — " in tools[2].text
    assert str(diff_p) in tools[2].text
    # Whole rows: the head is the rows that fit 2,000 chars, the tail those that fit 500.
    end, start = CSV.rindex("\n", 0, 2_001), CSV.index("\n", len(CSV) - 501) + 1
    assert 1_500 < end <= 2_000 and 375 < len(CSV) - start <= 500
    assert tools[3].text == (CSV[:end] + f"\n… {start - end} chars omitted from old tool "
                             f"result — full output saved to {store.path_for(CSV)} …\n"
                             + CSV[start:])
    assert tools[4] is hist[11]                     # under 3,000 chars: left alone
    assert tools[5] is hist[13]                     # age 1: too recent
    assert (report.truncated, report.summarized) == (1, 3)
    freed = sum(len(a.text.encode()) - len(b.text.encode())
                for a, b in zip(hist, out, strict=True))
    assert report.bytes_freed == freed > 0
    for c in (JSON_30K, TRACEBACK, DIFF, CSV):
        assert store.path_for(c).read_text(encoding="utf-8") == c        # nothing lost


def test_a_budget_preview_is_still_summarized_at_age_four(tmp_path: Path) -> None:
    """The ANCHORS 9 path, turn by turn: budget preview → old preview → one-line summary."""
    store = ResultStore(tmp_path / "results")
    big = JSON_30K
    hist: h.History = (Message.user("go"),
                       Message.assistant("", [ToolCall("call_0", "read_file", "{}")]),
                       Message.tool("call_0", big))
    stages = []
    for _ in range(5):
        hist, _ = microcompact(hist, settings=S, store=store)
        hist, _ = enforce_budget(hist, store=store, turn_budget_chars=S.turn_budget_chars,
                                 per_result_max_chars=S.per_result_max_chars,
                                 head_chars=S.budget_head_chars, tail_chars=S.budget_tail_chars)
        info = compaction_info(hist[2])
        stages.append((h.ages(hist)[2], info.level if info else 0, len(hist[2].text)))
        hist = (*hist, Message.assistant("", [ToolCall("call_0", "grep", "{}")]),
                Message.tool("call_0", "small"))
    assert [s[:2] for s in stages] == [(0, LEVEL_PREVIEW), (1, LEVEL_PREVIEW),
                                       (2, LEVEL_OLD_PREVIEW), (3, LEVEL_OLD_PREVIEW),
                                       (4, LEVEL_SUMMARY)]
    assert stages[2][2] < S.microcompact_min_chars              # the preview is under 3,000 …
    assert hist[2].text.startswith(f"[Old tool result cleared — 1 line, {len(big)} chars, JSON")
    assert str(store.path_for(big)) in hist[2].text            # … and still summarized
    assert len(list(store.directory.iterdir())) == 1           # persisted once, one path


def test_summary_from_markers_alone_when_meta_is_lost(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    hist = tool_loop(CSV, "x", "y")
    truncated, _ = microcompact(hist, settings=S, store=store)
    assert compaction_info(truncated[3]).level == LEVEL_OLD_PREVIEW  # type: ignore[union-attr]
    reloaded = h.from_openai(h.to_openai(truncated))               # meta gone
    older = (*reloaded, Message.assistant("", [ToolCall("c", "x", "{}")]), Message.tool("c", "z"),
             Message.assistant("", [ToolCall("c", "x", "{}")]), Message.tool("c", "z"))
    out, report = microcompact(older, settings=S, store=store)
    assert report.summarized == 1
    assert out[3].text == (f"[Old tool result cleared — {CSV.count(chr(10))} lines, {len(CSV)} "
                           f"chars, CSV — full content at {store.path_for(CSV)}]")


def test_rerun_is_idempotent_and_writes_nothing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    hist = tool_loop(JSON_30K, TRACEBACK, DIFF, CSV, LOG, HTML)
    once, r1 = microcompact(hist, settings=S, store=store)
    files = listing(store.directory)
    twice, r2 = microcompact(once, settings=S, store=store)
    assert twice is once and r2 == MicrocompactReport(0, 0, 0)
    assert listing(store.directory) == files
    again, r3 = microcompact(hist, settings=S, store=store)
    assert [m.to_dict() for m in again] == [m.to_dict() for m in once] and r3 == r1


def test_nothing_old_enough_returns_the_same_tuple(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    hist = tool_loop(JSON_30K, final=False)
    out, report = microcompact(hist, settings=S, store=store)
    assert out is hist and report == MicrocompactReport(0, 0, 0)
    assert not store.directory.exists()


def test_a_shrink_that_would_not_help_writes_no_file(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    hist = tool_loop("tiny", "a", "b", "c", "d")          # "tiny" is 5 round trips old
    out, report = microcompact(hist, settings=S.replace(microcompact_min_chars=0), store=store)
    assert out[3] is hist[3]                              # a summary line would be longer
    assert not store.directory.exists()


def test_custom_turn_settings(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    hist = tool_loop(CSV, "a", "b")          # CSV at age 3
    s = S.replace(microcompact_truncate_turns=1, microcompact_summarize_turns=3)
    out, report = microcompact(hist, settings=s, store=store)
    assert report.summarized == 1 and out[3].text.startswith("[Old tool result cleared")
    s = S.replace(microcompact_truncate_turns=5, microcompact_summarize_turns=6)
    assert microcompact(hist, settings=s, store=store)[0] is hist
    s = S.replace(microcompact_min_chars=len(CSV) + 1)
    assert microcompact(hist, settings=s, store=store)[0] is hist


@pytest.mark.parametrize(("truncated", "summarized", "freed", "text"), [
    (3, 2, int(1.7 * 1024 * 1024), "✂ microcompact: 3 truncated, 2 summarized, 1.7 MB freed"),
    (1, 0, 2_048, "✂ microcompact: 1 truncated, 0 summarized, 2 KB freed"),
    (0, 1, 500, "✂ microcompact: 0 truncated, 1 summarized, 500 B freed"),
])
def test_report_message(truncated: int, summarized: int, freed: int, text: str) -> None:
    assert MicrocompactReport(truncated, summarized, freed).message == text


def test_bytes_freed_counts_utf8_bytes(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    content = "日本語" * 2_000                    # 6,000 chars, 18,000 bytes
    hist = tool_loop(content, "a", "b")
    out, report = microcompact(hist, settings=S, store=store)
    assert report.truncated == 1
    assert report.bytes_freed == len(content.encode()) - len(out[3].text.encode())
    assert report.bytes_freed > len(content) - len(out[3].text)


@pytest.mark.parametrize(("text", "kind"), [
    (JSON_30K, "JSON"), ('{"a": 1}', "JSON"), (TRACEBACK, "Python traceback"), (DIFF, "diff"),
    (CSV, "CSV"), (HTML, "HTML"), (LOG, "text"), ("", "empty"),
    ("<?xml version='1.0'?><a/>", "XML"), ("[not json", "text"),
])
def test_detect_kind(text: str, kind: str) -> None:
    assert detect_kind(text) == kind


def test_multibyte_cuts_keep_clusters(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    family = "👨\u200d👩\u200d👧"
    content = "x" + family * 1_000            # cut points fall inside clusters
    out, _ = microcompact(tool_loop(content, "a", "b"), settings=S, store=store)
    text = out[3].text
    marker = OLD_PREVIEW_RE.search(text)
    assert marker is not None
    head, tail = text[:marker.start()], text[marker.end():]
    assert (len(head) - 1) % len(family) == 0 and len(tail) % len(family) == 0
    text.encode("utf-8")


# -- properties -----------------------------------------------------------------------------

def _check_step(before: h.History, after: h.History) -> None:
    assert len(after) == len(before)
    for a, b in zip(before, after, strict=True):
        assert a.role is b.role and a.tag == b.tag
        if a.role is not Role.TOOL:
            assert a is b
        else:
            assert len(b.text) <= len(a.text)
            assert a.tool_result is not None and b.tool_result is not None
            assert (a.tool_result.call_id, a.tool_result.is_error) == \
                (b.tool_result.call_id, b.tool_result.is_error)
        for blk in b.blocks:
            for f in blk.__slots__:
                v = getattr(blk, f)
                if isinstance(v, str):
                    v.encode("utf-8")
    assert h.problems(after) == h.problems(before)
    assert h.char_size(after) <= h.char_size(before)


@PROPS
@given(hist=st.one_of(valid_histories(), histories(None, user_first=None)),
       truncate=st.integers(1, 4), extra=st.integers(0, 3), min_chars=st.integers(0, 5_000))
def test_microcompact_properties(hist: h.History, truncate: int, extra: int,
                                 min_chars: int) -> None:
    s = S.replace(microcompact_truncate_turns=truncate,
                  microcompact_summarize_turns=truncate + extra, microcompact_min_chars=min_chars)
    snapshot = copy.deepcopy([(m, dict(m.meta)) for m in hist])
    with tempfile.TemporaryDirectory() as d:
        store = ResultStore(Path(d) / "results")
        out, report = microcompact(hist, settings=s, store=store)
        assert [(m, dict(m.meta)) for m in hist] == snapshot
        _check_step(hist, out)
        ages = h.ages(hist)
        for i, (a, b) in enumerate(zip(hist, out, strict=True)):
            if a is b or a.role is not Role.TOOL:
                continue
            info = compaction_info(b)
            assert info is not None and ages[i] >= truncate
            assert info.original_chars >= min_chars
            assert info.level == (LEVEL_SUMMARY if ages[i] >= truncate + extra
                                  else LEVEL_OLD_PREVIEW)
            assert info.path is not None and store.load(info.path) == a.text   # nothing lost
        assert report.bytes_freed == sum(
            len(a.text.encode()) - len(b.text.encode()) for a, b in zip(hist, out, strict=True))
        files = listing(store.directory)
        named = {info.path.name for m in out
                 if (info := compaction_info(m)) is not None and info.path is not None}
        assert set(files) == named                      # no file written for nothing
        again, report2 = microcompact(out, settings=s, store=store)
        assert again is out and report2 == MicrocompactReport(0, 0, 0)
        assert listing(store.directory) == files


@PROPS
@given(hist=histories(True, end_with_user=False), rounds=st.integers(1, 5))
def test_pipeline_over_turns_keeps_invariants(hist: h.History, rounds: int) -> None:
    """As the session runs it: microcompact → budget → pairing, turn after turn."""
    with tempfile.TemporaryDirectory() as d:
        store = ResultStore(Path(d) / "results")
        originals = {m.text for m in hist if m.role is Role.TOOL}
        for k in range(rounds):
            before = hist
            hist, _ = microcompact(hist, settings=S, store=store)
            hist, _ = enforce_budget(hist, store=store, turn_budget_chars=S.turn_budget_chars,
                                     per_result_max_chars=S.per_result_max_chars,
                                     head_chars=S.budget_head_chars,
                                     tail_chars=S.budget_tail_chars)
            hist, report = repair_pairing(hist)
            assert not report.changed
            _check_step(before, hist)
            assert h.problems(hist) == []
            for m in hist:
                info = compaction_info(m)
                if info is not None and info.path is not None:
                    assert store.load(info.path) in originals
            hist = (*hist, Message.assistant("", [ToolCall("call_0", "grep", "{}")]),
                    Message.tool("call_0", f"round {k} " + "r" * 4_000))
            originals.add(hist[-1].text)


# -- batched rewrites (microcompact.rewrite_now, Preparer.rewrites) ----------------------------

from ipy_ctxrecovery.core.microcompact import rewrite_now  # noqa: E402


def decide(freed: int, broken: int, *, idle: float | None = 1.0, due: bool = False,
           **changes: object) -> tuple[bool, str]:
    d = rewrite_now(freed_tokens=freed, broken_tokens=broken, idle_seconds=idle,
                    shrink_due=due, settings=S.replace(**changes))
    return d.rewrite, d.reason


def test_no_rewrite_below_the_clear_at_least_bound() -> None:
    bound = S.microcompact_clear_at_least
    assert decide(bound - 1, bound) == (False, "below_bound")
    # At the bound and paying for the cache it breaks: rewritten.
    assert decide(bound, bound + 100) == (True, "saves")


def test_a_rewrite_that_breaks_more_cache_than_it_saves_waits() -> None:
    # 5,000 tokens freed but 100,000 cached tokens re-written: 0.1·(5k·9 + 100k) < 1.25·95k.
    assert decide(5_000, 100_000) == (False, "not_worth")
    assert decide(60_000, 100_000) == (True, "saves")


def test_rewrite_when_idle_past_the_cache_ttl() -> None:
    assert decide(10, 100_000, idle=S.cache_ttl_seconds) == (True, "idle")
    assert decide(10, 100_000, idle=S.cache_ttl_seconds - 1) == (False, "below_bound")
    assert decide(10, 100_000, idle=30.0, cache_ttl_seconds=20.0) == (True, "idle")


def test_rewrite_when_a_fit_needs_it_and_when_nothing_cached_breaks() -> None:
    assert decide(10, 100_000, due=True) == (True, "fit")
    assert decide(10, 0) == (True, "unsent")
    # Batching off (today's behaviour): every rewrite at once.
    assert decide(10, 100_000, microcompact_clear_at_least=0) == (True, "off")


def test_the_settings_take_the_batching_values() -> None:
    s = Settings().updated({"microcompact_clear_at_least": "0", "cache_ttl_seconds": "60"})
    assert (s.microcompact_clear_at_least, s.cache_ttl_seconds) == (0, 60.0)


# -- through a session, against the emulator ------------------------------------------------

_RESULT = "\n".join(f"line {i}: " + "value " * 12 for i in range(120))   # ~9 KB


def _fetch(part: int) -> str:
    """Return a long log part."""
    return f"part {part}\n" + _RESULT


def _tool_session(emulator: object, tmp_path: Path, **changes: object) -> tuple[object, object]:
    from ipy_ctxrecovery import ChatSession

    emu = emulator(context_window=1_000_000)  # type: ignore[operator]
    session = ChatSession("emulator", emulator=emu, settings=Settings(**changes),  # type: ignore[arg-type]
                          tools=[_fetch], builtin_tools=False, files_root=tmp_path)
    return session, emu


def _turn(session: object, i: int) -> None:
    session.send(f"look at part {i} [[tool _fetch {{\"part\": {i}}}]]")  # type: ignore[attr-defined]


def _tool_texts(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def test_a_session_defers_rewrites_below_the_bound(emulator: object, tmp_path: Path) -> None:
    # Each ~9 KB result frees ~1,700 tokens when previewed: below 50,000, nothing is
    # rewritten and every request extends the previous one.
    session, emu = _tool_session(emulator, tmp_path, microcompact_clear_at_least=50_000)
    for i in range(6):
        _turn(session, i)
    bodies = [r.body for r in emu.requests]  # type: ignore[attr-defined]
    for before, after in zip(bodies, bodies[1:], strict=False):
        assert after["messages"][:len(before["messages"])] == before["messages"]
    assert all("omitted" not in t for t in _tool_texts(bodies[-1]))


def test_a_session_rewrites_at_once_with_batching_off(emulator: object, tmp_path: Path) -> None:
    session, emu = _tool_session(emulator, tmp_path, microcompact_clear_at_least=0)
    for i in range(6):
        _turn(session, i)
    last = emu.requests[-1].body  # type: ignore[attr-defined]
    assert any("omitted" in t or "cleared" in t for t in _tool_texts(last))


@pytest.mark.parametrize("retention, idle", [("short", S.cache_ttl_seconds + 1),
                                              ("auto", 86_400.0 + 1)])
def test_a_session_rewrites_when_idle_past_the_ttl(emulator: object, tmp_path: Path,
                                                   retention: str, idle: float) -> None:
    """With in-memory retention the cache is gone after five idle minutes; with OpenAI's
    default (a day, for an organization without zero data retention) after a day."""
    session, emu = _tool_session(emulator, tmp_path, microcompact_clear_at_least=50_000,
                                 cache_retention=retention)
    now = [1000.0]
    session._preparer.clock = lambda: now[0]  # type: ignore[attr-defined]
    for i in range(5):
        _turn(session, i)
    assert all("omitted" not in t for t in _tool_texts(emu.requests[-1].body))  # type: ignore[attr-defined]
    now[0] += idle
    _turn(session, 5)
    first = [r.body for r in emu.requests][-2]  # type: ignore[attr-defined]
    assert any("omitted" in t or "cleared" in t for t in _tool_texts(first))


def test_openai_default_retention_is_not_rewritten_on_a_guess(emulator: object,
                                                              tmp_path: Path) -> None:
    """Five idle minutes lose an in-memory cache, not a 24-hour one; OpenAI's default is
    either (it follows the organization's data retention), so nothing is rewritten."""
    session, emu = _tool_session(emulator, tmp_path, microcompact_clear_at_least=50_000)
    now = [1000.0]
    session._preparer.clock = lambda: now[0]  # type: ignore[attr-defined]
    for i in range(5):
        _turn(session, i)
    now[0] += S.cache_ttl_seconds + 1
    _turn(session, 5)
    first = [r.body for r in emu.requests][-2]  # type: ignore[attr-defined]
    assert all("omitted" not in t and "cleared" not in t for t in _tool_texts(first))
    assert "prompt_cache_retention" not in first


def test_a_session_rewrites_when_the_window_needs_it(emulator: object, tmp_path: Path) -> None:
    # A compaction trigger the raw history passes: the pending rewrites go at once (no LLM
    # summary needed, the microcompacted history fits).
    session, emu = _tool_session(emulator, tmp_path, microcompact_clear_at_least=50_000,
                                 context_window=12_000)
    for i in range(6):
        _turn(session, i)
    texts = _tool_texts(emu.requests[-1].body)  # type: ignore[attr-defined]
    assert any("omitted" in t or "cleared" in t for t in texts)
    assert session.status().compactions == 0  # type: ignore[attr-defined]


def test_dry_run_and_what_if_batch_rewrites_as_the_run_does(emulator: object,
                                                             tmp_path: Path) -> None:
    """Both know the previous request: while the rewrites wait (below the bound) they
    plan none, as the next send makes none; idle past the TTL they plan them, as it does."""
    from ipy_ctxrecovery.core.events import MicrocompactApplied

    session, emu = _tool_session(emulator, tmp_path, microcompact_clear_at_least=50_000,
                                 cache_retention="short")
    now = [1000.0]
    session._preparer.clock = lambda: now[0]  # type: ignore[attr-defined]
    for i in range(5):
        _turn(session, i)

    def planned() -> tuple[bool, int]:
        dry = session.dry_run("and now?")  # type: ignore[attr-defined]
        plan = session.what_if(text="and now?", stream=False)  # type: ignore[attr-defined]
        rewrites = any(isinstance(e, MicrocompactApplied) for e in dry.steps)
        assert rewrites == any("omitted" in m.text or "cleared" in m.text
                               for m in plan.planned if m.tool_result is not None)
        assert plan.after_bytes == dry.body_bytes
        return rewrites, plan.after_bytes

    assert planned()[0] is False
    size = planned()[1]
    session.send("and now?", stream=False)  # type: ignore[attr-defined]
    assert all("omitted" not in t for t in _tool_texts(emu.requests[-1].body))  # type: ignore[attr-defined]
    assert emu.requests[-1].body_bytes == size  # type: ignore[attr-defined]
    now[0] += S.cache_ttl_seconds + 1
    rewrites, size = planned()
    assert rewrites is True
    session.send("and now?", stream=False)  # type: ignore[attr-defined]
    assert any("omitted" in t or "cleared" in t for t in _tool_texts(emu.requests[-1].body))  # type: ignore[attr-defined]
    assert emu.requests[-1].body_bytes == size  # type: ignore[attr-defined]
