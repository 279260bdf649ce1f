"""pairing.repair_pairing: positional repair, repeated ids, orphans, synthetic results, drift."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from strategies import histories, valid_histories

from ipy_ctxrecovery.core import history as h
from ipy_ctxrecovery.core.history import Message, Role, ToolCall
from ipy_ctxrecovery.core.pairing import MISSING_RESULT, PairingReport, repair_pairing

PROPS = settings(max_examples=300, deadline=None)


def pairing_problems(hist: h.History) -> list[str]:
    return [p for p in h.problems(hist) if "first non-system" not in p]


def asst(*ids: str, text: str = "") -> Message:
    return Message.assistant(text, [ToolCall(i, "read_file", "{}") for i in ids])


# -- examples ---------------------------------------------------------------------------------

def test_valid_history_is_returned_unchanged_as_the_same_tuple() -> None:
    hist = (Message.system("s"), Message.user("u"), asst("call_0", "call_1"),
            Message.tool("call_1", "b"), Message.tool("call_0", "a"), Message.assistant("done"),
            Message.user("again"), asst("call_0"), Message.tool("call_0", "c"))
    out, report = repair_pairing(hist)
    assert out is hist
    assert report == PairingReport()
    assert not report.changed
    assert report.message == "🔧 tool pairing: nothing to repair"


def test_orphan_results_are_removed() -> None:
    hist = (Message.user("u"), Message.tool("ghost", "x"), Message.assistant("hi"),
            Message.tool("call_0", "stray"))
    out, report = repair_pairing(hist)
    assert out == (Message.user("u"), Message.assistant("hi"))
    assert report == PairingReport(orphans_removed=2)
    assert report.message == "🔧 tool pairing: 2 orphan results removed"


def test_unanswered_call_gets_synthetic_error_result() -> None:
    hist = (Message.user("u"), asst("call_0", "call_1"), Message.tool("call_0", "a"),
            Message.user("next"))
    out, report = repair_pairing(hist)
    assert report == PairingReport(synthetic_added=1)
    assert out[:3] == hist[:3]
    synthetic = out[3]
    assert synthetic.role is Role.TOOL and synthetic.tag == h.TAG_SYNTHETIC_RESULT
    r = synthetic.tool_result
    assert r is not None
    assert (r.call_id, r.content, r.is_error, r.name) == ("call_1", MISSING_RESULT, True,
                                                          "read_file")
    assert MISSING_RESULT.startswith("[Tool result missing — the tool execution was interrupted")
    assert out[4] == Message.user("next")
    assert pairing_problems(out) == []
    assert report.message == "🔧 tool pairing: 1 missing result filled in"


def test_drifted_result_is_moved_back_after_its_call() -> None:
    hist = (Message.user("u"), asst("call_0", "call_1"), Message.tool("call_0", "a"),
            Message.user("interjection"), Message.tool("call_1", "b"))
    out, report = repair_pairing(hist)
    assert report == PairingReport(moved=1)
    assert out == (hist[0], hist[1], hist[2], hist[4], hist[3])
    assert report.message == "🔧 tool pairing: 1 drifted result moved back"


def test_system_message_between_call_and_result_keeps_its_place_among_non_tool_messages() -> None:
    hist = (Message.user("u"), asst("call_0"), Message.system("note"), Message.tool("call_0", "a"),
            Message.assistant("ok"))
    out, report = repair_pairing(hist)
    assert report.moved == 1
    assert [m.role for m in out] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.SYSTEM,
                                     Role.ASSISTANT]
    assert pairing_problems(out) == []


def test_repeated_ids_are_matched_to_the_nearest_preceding_issuer() -> None:
    # Turn 1's call_0 went unanswered; turn 2 reuses call_0 and answers it twice.
    hist = (Message.user("u1"), asst("call_0"), Message.user("u2"), asst("call_0"),
            Message.tool("call_0", "first"), Message.tool("call_0", "duplicate"))
    out, report = repair_pairing(hist)
    assert report == PairingReport(orphans_removed=1, synthetic_added=1)
    assert out[2].tool_result is not None and out[2].tool_result.content == MISSING_RESULT
    assert out[5].text == "first"
    assert len(out) == 6
    assert pairing_problems(out) == []


def test_repeated_ids_valid_across_turns_is_untouched() -> None:
    hist = (Message.user("u1"), asst("call_0"), Message.tool("call_0", "a"),
            Message.user("u2"), asst("call_0"), Message.tool("call_0", "b"))
    out, report = repair_pairing(hist)
    assert out is hist and not report.changed


def test_result_before_any_call_is_an_orphan() -> None:
    hist = (Message.system("s"), Message.tool("call_0", "early"), Message.user("u"),
            asst("call_0"), Message.tool("call_0", "a"))
    out, report = repair_pairing(hist)
    assert report == PairingReport(orphans_removed=1)
    assert out == (hist[0], hist[2], hist[3], hist[4])


def test_first_non_system_assistant_is_left_for_the_ladder() -> None:
    hist = (Message.system("s"), asst("call_0"), Message.tool("call_0", "a"), Message.user("u"))
    out, report = repair_pairing(hist)
    assert out is hist
    assert h.problems(out) == ["first non-system message is assistant, not user"]


def test_combined_report_message() -> None:
    hist = (Message.user("u"), Message.tool("x", "orphan"), asst("a", "b"),
            Message.user("mid"), Message.tool("a", "late"))
    out, report = repair_pairing(hist)
    assert report == PairingReport(orphans_removed=1, synthetic_added=1, moved=1)
    assert report.message == ("🔧 tool pairing: 1 orphan result removed, 1 missing result "
                              "filled in, 1 drifted result moved back")
    assert pairing_problems(out) == []


# -- properties -------------------------------------------------------------------------------

def _non_tool(hist: h.History) -> list[Message]:
    return [m for m in hist if m.role is not Role.TOOL]


@PROPS
@given(histories(user_first=None))
def test_any_history_repairs_to_valid_pairing(hist: h.History) -> None:
    snapshot = copy.deepcopy([(m, dict(m.meta)) for m in hist])
    out, report = repair_pairing(hist)
    assert pairing_problems(out) == []
    # Only tool messages move: every other message keeps its relative order (systems too).
    assert _non_tool(out) == _non_tool(hist)
    assert all(a is b for a, b in zip(_non_tool(out), _non_tool(hist), strict=True))
    # First non-system role is never changed by pairing repair.
    first_in = next((m.role for m in hist if m.role not in (Role.SYSTEM, Role.TOOL)), None)
    first_out = next((m.role for m in out if m.role is not Role.SYSTEM), None)
    if first_out is not Role.TOOL:
        assert first_out == first_in
    # Every result kept is an original message; the rest are synthetic.
    originals = {id(m) for m in hist}
    added = [m for m in out if id(m) not in originals]
    assert len(added) == report.synthetic_added
    assert all(m.tag == h.TAG_SYNTHETIC_RESULT for m in added)
    assert len(out) == len(hist) - report.orphans_removed + report.synthetic_added
    # Idempotent, inputs untouched, the latest user request kept.
    again, report2 = repair_pairing(out)
    assert again is out and not report2.changed
    assert [(m, dict(m.meta)) for m in hist] == snapshot
    latest_in, latest_out = h.latest_user_index(hist), h.latest_user_index(out)
    if latest_in is not None:
        assert latest_out is not None and out[latest_out] is hist[latest_in]
    for m in out:
        for b in m.blocks:
            for s in vars_of(b):
                s.encode("utf-8")


def vars_of(block: h.Block) -> list[str]:
    return [v for v in (getattr(block, f) for f in block.__slots__) if isinstance(v, str)]


@PROPS
@given(histories(False))
def test_broken_pairing_is_reported(hist: h.History) -> None:
    assert pairing_problems(hist)
    out, report = repair_pairing(hist)
    assert report.changed
    assert pairing_problems(out) == []


@PROPS
@given(valid_histories())
def test_valid_histories_are_untouched(hist: h.History) -> None:
    out, report = repair_pairing(hist)
    assert out is hist and not report.changed
    assert h.problems(out) == []
