"""The one-pass fit (``exactfit``) and what ladder's exact fit and preflight_fit get from it.

Properties over generated histories: the fit's result is valid (pairing, starts on a user
message, latest request kept, pinned messages kept), its *measured* size is at most the
target whenever anything older than the latest request can still go, and it is maximal
(keeping one more unit would not fit) — the same cut as ``ladder.drop_oldest``. The sizes
come from the real adapters (``message_size``) and from a measure with no parts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import histories, valid_histories

from ipy_ctxrecovery.core import budget
from ipy_ctxrecovery.core.budget import DeferredStore, ResultStore
from ipy_ctxrecovery.core.exactfit import (
    Outline,
    Sizes,
    drop_fit,
    first_defect,
    outline,
    valid_pairs,
)
from ipy_ctxrecovery.core.history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    History,
    Message,
    Role,
    ToolCall,
    latest_user_index,
    problems,
    to_openai,
)
from ipy_ctxrecovery.core.ladder import (
    Decision,
    LadderState,
    Level,
    apply,
    drop_oldest,
    preflight_fit,
)
from ipy_ctxrecovery.core.pairing import repair_pairing
from ipy_ctxrecovery.core.prompts import PAYLOAD_NOTICE
from ipy_ctxrecovery.providers.anthropic import AnthropicProvider
from ipy_ctxrecovery.providers.base import Request, ToolSpec
from ipy_ctxrecovery.providers.openai import OpenAIProvider
from ipy_ctxrecovery.settings import Settings, format_size

PROPS = settings(max_examples=120, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
FIT_PROPS = settings(PROPS, max_examples=80)
S = Settings()
NOWHERE = "http://127.0.0.1:9"
TOOL = ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {}})

PROVIDERS = {
    "openai": OpenAIProvider("gpt-4o", client=openai.OpenAI(base_url=NOWHERE, api_key="k")),
    "anthropic": AnthropicProvider("claude-x", client=anthropic.Anthropic(
        base_url=NOWHERE, api_key="k")),
}


def plain_measure(h: History) -> int:
    """A body with default ``json.dumps`` separators and no ``message_size``."""
    return len(json.dumps({"model": "m", "messages": to_openai(h)}, ensure_ascii=False).encode())


def sizes_for(kind: str) -> Sizes:
    if kind == "plain":
        return Sizes(plain_measure)
    provider = PROVIDERS[kind]
    return Sizes(lambda h: provider.measure(Request(h, tools=(TOOL,))), provider.message_size)


def _pairing_problems(h: History) -> list[str]:
    return [p for p in problems(h) if not p.startswith("first non-system")]


# -- valid_pairs ---------------------------------------------------------------------------------

@PROPS
@given(hist=histories(user_first=None, max_result_chars=300))
def test_valid_pairs_agrees_with_problems(hist: History) -> None:
    assert valid_pairs(hist) == (not _pairing_problems(hist))
    at = first_defect(hist)
    if at is not None:
        # Everything before the first defect is whole; the defect is an assistant message
        # with calls or a stray tool message.
        assert not _pairing_problems(hist[:at])
        assert hist[at].role is Role.TOOL or hist[at].tool_calls


@PROPS
@given(hist=histories(user_first=None, max_result_chars=300), pairs=st.booleans())
def test_outline_is_what_a_plain_scan_finds(hist: History, pairs: bool) -> None:
    # The outline's one loop against three separate obvious scans: the first pairing
    # problem ``history.problems`` reports, every system message, every tagged message.
    found = [int(p.split(":")[0].removeprefix("message ")) for p in _pairing_problems(hist)]
    expected = Outline(found[0] if found and pairs else None,
                       tuple(i for i, m in enumerate(hist) if m.role is Role.SYSTEM),
                       tuple(i for i, m in enumerate(hist) if m.tag is not None))
    assert outline(hist, pairs=pairs) == expected


def test_valid_pairs_sees_a_call_that_is_not_last_and_a_stray_result() -> None:
    odd = Message(Role.ASSISTANT, (ToolCall("a", "f"), *Message.assistant("text").blocks))
    assert not valid_pairs((Message.user("q"), odd, Message.user("next")))
    assert valid_pairs((Message.user("q"), odd, Message.tool("a", "r")))
    assert not valid_pairs((Message.user("q"), Message.assistant("x"), Message.tool("a", "r")))


# -- message sizes: base + parts == measure ------------------------------------------------------

@PROPS
@given(hist=histories(user_first=None, max_result_chars=2_000), stream=st.booleans())
def test_message_sizes_add_up_to_measure(hist: History, stream: bool) -> None:
    for provider in PROVIDERS.values():
        request = Request(hist, tools=(TOOL,), stream=stream)
        base, parts = provider.message_sizes(request)
        assert base + sum(parts) == provider.measure(request)
        assert len(parts) == len(hist)


@PROPS
@given(hist=valid_histories(max_turns=4, max_result_chars=3_000), data=st.data())
def test_a_preview_changes_the_body_by_its_part_sizes(hist: History, data: Any,
                                                      tmp_path_factory: Any) -> None:
    tools = [i for i, m in enumerate(hist) if m.role is Role.TOOL and len(m.text) > 600]
    if not tools:
        return
    i = data.draw(st.sampled_from(tools))
    store = ResultStore(tmp_path_factory.mktemp("r"))
    new = budget.shrink_tool_message(hist[i], 550, store=store, head=300, tail=100)
    assert new is not None
    after = (*hist[:i], new, *hist[i + 1:])
    for provider in PROVIDERS.values():
        def size(h: History, provider: Any = provider) -> int:
            # Without prompt-cache breakpoints: where they go depends on the whole prefix's
            # length, so a shrink may move one (35 bytes each, at most 4: within the exact
            # fit's margin).
            return int(provider.measure(Request(h, caching=None)))

        delta = provider.message_size(new) - provider.message_size(hist[i])
        assert size(after) - size(hist) == delta


# -- drop_fit --------------------------------------------------------------------------------

def _conversation(h: History) -> list[Message]:
    return [m for m in h if m.role is not Role.SYSTEM
            and m.tag not in (TAG_COMPACTION_NOTICE, TAG_PAYLOAD_NOTICE, TAG_SUMMARY)]


@FIT_PROPS
@given(hist=histories(user_first=None, max_turns=6, max_result_chars=3_000),
       fraction=st.floats(0.05, 1.0), kind=st.sampled_from(["openai", "anthropic", "plain"]),
       payload=st.booleans())
def test_drop_fit_is_valid_fits_and_is_maximal(hist: History, fraction: float, kind: str,
                                               payload: bool) -> None:
    sizes = sizes_for(kind)
    # As ladder.apply hands it over: one payload notice at most (the latest).
    notices = [i for i, m in enumerate(hist) if m.tag == TAG_PAYLOAD_NOTICE]
    hist = tuple(m for i, m in enumerate(hist) if i not in notices[:-1])
    repaired, _ = repair_pairing(hist)
    target = int(sizes.measure(repaired) * fraction)
    fit = drop_fit(hist, target, sizes, payload_notice=payload)
    out = fit.history
    assert fit.size == sizes.measure(out)               # the size reported is measured
    assert _pairing_problems(out) == []
    latest = latest_user_index(repaired)
    if latest is not None:
        # The latest request is kept, with everything after it.
        assert out[latest_user_index(out)] == repaired[latest]
        assert _conversation(out)[-len(_conversation(repaired[latest:])):] == \
            _conversation(repaired[latest:])
        assert problems(out) == []                    # starts on a user message too
    assert [m for m in out if m.role is Role.SYSTEM] == \
        [m for m in hist if m.role is Role.SYSTEM]
    assert [m for m in out if m.tag == TAG_SUMMARY] == [m for m in hist if m.tag == TAG_SUMMARY]
    assert fit.dropped == len(_conversation(repaired)) - len(_conversation(out))
    # Over the target only when nothing before the latest request is left to drop.
    if fit.size > target:
        assert latest is None or len(_conversation(out)) == len(_conversation(repaired[latest:]))
    # Maximal: the same cut as drop_oldest, and one unit more would not fit.
    units = next(u for u in range(len(repaired) + 1)
                 if _conversation(drop_oldest(repaired, u)[0]) == _conversation(out))
    if units and fit.size <= target:
        more = drop_oldest(repaired, units - 1)[0]
        assert payload or sizes.measure(more) > target


def test_drop_fit_of_the_bench_case_keeps_the_latest_request_and_fits() -> None:
    hist = _bench_history(300)
    sizes = sizes_for("openai")
    fit = drop_fit(hist, 100_000, sizes)
    assert fit.size <= 100_000 and problems(fit.history) == []
    assert fit.history[-1] == hist[-1]
    assert fit.repair.synthetic_added == 1            # the unanswered call near the end


@pytest.mark.parametrize("kind", ["openai", "anthropic", "plain"])
def test_a_history_that_fits_loses_nothing_even_by_less_than_a_notice(kind: str) -> None:
    # Every cut that drops adds a compaction notice; a history already under the target by
    # less than a notice's size once had its oldest units dropped and ended over it.
    hist = (Message.user("a"), Message.assistant("a"), Message.system("a"),
            Message.user(PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE), Message.user("a"),
            Message.assistant("a"))
    sizes = sizes_for(kind)
    for slack in (0, 40):
        fit = drop_fit(hist, sizes.measure(hist) + slack, sizes)
        assert (fit.history, fit.dropped, fit.notice_added) == (hist, 0, False)


def _bench_history(n: int) -> History:
    out: list[Message] = [Message.system("You are careful.")]
    for i in range(n // 4):
        out += [Message.user(f"[turn {i}] look " + "x" * 400),
                Message.assistant("", (ToolCall(f"c{i}", "read_file", "{}"),)),
                Message.tool(f"c{i}", f"{i:05d} log line\n" * 800, name="read_file"),
                Message.assistant(f"Part {i} shows a timeout. " * 8)]
    out += [Message.user("one more"), Message.assistant("", (ToolCall("cx", "read_file", "{}"),)),
            Message.user("and now?")]
    return tuple(out)


# -- preflight_fit: one pass, results written only when kept, no fsync ---------------------------

@FIT_PROPS
@given(hist=valid_histories(max_turns=6, max_result_chars=8_000), fraction=st.floats(0.1, 0.9),
       kind=st.sampled_from(["openai", "anthropic", "plain"]))
def test_preflight_fit_measures_under_the_target_and_writes_only_kept_results(
        hist: History, fraction: float, kind: str, tmp_path_factory: Any) -> None:
    sizes = sizes_for(kind)
    store = ResultStore(tmp_path_factory.mktemp("r"))
    target = int(sizes.measure(hist) * fraction)
    provider = PROVIDERS.get(kind)
    result = preflight_fit(hist, target_bytes=target, limit_bytes=None, payload_related=False,
                           settings=S, store=store, measure=sizes.measure,
                           part=provider.message_size if provider else None)
    out = result.history
    assert problems(out) == []
    latest = latest_user_index(hist)
    assert latest is None or out[latest_user_index(out)] == hist[latest]
    if sizes.measure(out) > target:
        # Only the latest request and its turn are left, every result at its smallest.
        kept = _conversation(out)
        assert latest is not None and len(kept) == len(_conversation(hist[latest:]))
    named = {Path(m.meta[budget.META_KEY]["path"]) for m in out
             if m.role is Role.TOOL and budget.META_KEY in m.meta}
    written = set(store.directory.glob("*.txt")) if store.directory.exists() else set()
    assert written == named
    for path in written:
        assert store.path_for(path.read_text(encoding="utf-8")) == path


def test_preflight_fit_of_many_results_writes_no_dropped_preview_and_never_fsyncs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real(fd)))
    hist = _bench_history(400)
    sizes = sizes_for("openai")
    store = ResultStore(tmp_path / "results")
    result = preflight_fit(hist, target_bytes=120_000, limit_bytes=None, payload_related=False,
                           settings=S, store=store, measure=sizes.measure,
                           part=PROVIDERS["openai"].message_size)
    assert sizes.measure(result.history) <= 120_000
    previews = [m for m in result.history if m.role is Role.TOOL and budget.META_KEY in m.meta]
    assert previews and result.removed_messages > 0
    assert len(list(store.directory.glob("*.txt"))) == len(previews) < 100
    assert fsyncs == []


def test_deferred_store_reads_back_what_it_has_not_written_yet(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    deferred = DeferredStore(store)
    path = deferred.persist("full ✓ text")
    assert deferred.load(path) == "full ✓ text" and not path.exists()
    msg = budget.shrink_tool_message(Message.tool("c", "y" * 5_000), 600, store=deferred,
                                     head=300, tail=100)
    assert msg is not None
    assert deferred.commit((msg,)) == (store.path_for("y" * 5_000),)
    assert store.load(store.path_for("y" * 5_000)) == "y" * 5_000
    assert not path.exists()                      # not named by the history: never written


def test_result_store_rewrites_a_file_cut_short(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    path = store.persist("whole result ✓")
    path.write_bytes(b"whole")                    # as a power cut could leave it
    assert store.persist("whole result ✓") == path
    assert store.load(path) == "whole result ✓"
    assert (path.stat().st_mode & 0o777) == 0o600


# -- apply's exact fit against a straightforward reference ---------------------------------------

def _reference_fit(hist: History, target: int, measure: Any,
                   payload: bool) -> tuple[History, int, list[str]] | None:
    """The exact fit done the obvious way: repair pairing in the whole history, then drop
    one more oldest unit at a time (``drop_oldest``), measuring every candidate, until one
    fits; None when none does (the fit then previews results, not compared here)."""
    notices = [i for i, m in enumerate(hist) if m.tag == TAG_PAYLOAD_NOTICE]
    hist = tuple(m for i, m in enumerate(hist) if i not in notices[:-1])
    repaired, report = repair_pairing(hist)
    notes = []
    if report.changed:
        notes.append(f"pairing repaired: {report.orphans_removed} orphan results removed, "
                     f"{report.synthetic_added} missing results added, {report.moved} moved")
    for units in range(len(repaired) + 1):
        out, dropped = drop_oldest(repaired, units)
        if payload and not any(m.tag == TAG_PAYLOAD_NOTICE for m in out):
            at = latest_user_index(out)
            at = len(out) if at is None else at
            out = (*out[:at], Message.user(PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE), *out[at:])
        if measure(out) <= target:
            return out, dropped, notes
    return None


@settings(FIT_PROPS, max_examples=200)
@given(hist=histories(user_first=None, max_turns=6, max_result_chars=3_000),
       fraction=st.floats(0.05, 1.0), kind=st.sampled_from(["openai", "anthropic", "plain"]),
       payload=st.booleans())
def test_exact_fit_is_the_reference_fit(hist: History, fraction: float, kind: str,
                                        payload: bool, tmp_path_factory: Any) -> None:
    # The one-pass fit (outline, walk back over part sizes, repair of the kept part only,
    # measure folded in C) gives exactly what the obvious search gives: the same messages,
    # the same count dropped, the same notes and flags.
    sizes = sizes_for(kind)
    provider = PROVIDERS.get(kind)
    target = int(sizes.measure(hist) * fraction)
    decision = Decision(Level.EXACT_FIT, 1, LadderState(), target_bytes=target,
                        limit_bytes=None, payload_related=False, inject_payload_notice=payload)
    result = apply(decision, hist, settings=S, store=ResultStore(tmp_path_factory.mktemp("r")),
                   measure=sizes.measure, part=provider.message_size if provider else None)
    reference = _reference_fit(hist, target, sizes.measure, payload)
    if reference is None:
        return
    out, dropped, notes = reference
    assert result.history == out
    assert [m.meta for m in result.history] == [m.meta for m in out]
    assert result.level is Level.EXACT_FIT
    assert result.removed_messages == dropped
    if dropped:
        notes.append(f"{dropped} message{'s' if dropped != 1 else ''} dropped to fit "
                     f"{format_size(target)}")
    assert list(result.notes) == notes
    assert result.compaction_notice_added == bool(dropped)
    assert result.payload_notice_added == (payload and not any(
        m.tag == TAG_PAYLOAD_NOTICE for m in hist))
    assert result.changed == (out != hist)
