"""budget: ResultStore (0700/0600, content-addressed, write-once), preview, enforce_budget."""

from __future__ import annotations

import copy
import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import MULTIBYTE_PIECES, histories, multibyte_text

from ipy_ctxrecovery.core import history as h
from ipy_ctxrecovery.core.budget import (
    LEVEL_PREVIEW,
    MIN_PREVIEW_BODY_CHARS,
    ResultStore,
    compaction_info,
    enforce_budget,
    preview,
    shrink_tool_message,
)
from ipy_ctxrecovery.core.cuts import is_boundary
from ipy_ctxrecovery.core.history import Message, Role, ToolCall
from ipy_ctxrecovery.core.markers import BUDGET_RE
from ipy_ctxrecovery.settings import Settings

PROPS = settings(max_examples=300, deadline=None)
S = Settings()


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def listing(d: Path) -> dict[str, int]:
    if not d.exists():
        return {}
    return {p.name: p.stat().st_mtime_ns for p in d.iterdir()}


def call(i: str = "call_0") -> Message:
    return Message.assistant("", [ToolCall(i, "read_file", '{"path": "big.txt"}')])


# -- ResultStore ----------------------------------------------------------------------------

def test_store_creates_private_directory_on_first_write_only(tmp_path: Path) -> None:
    d = tmp_path / "sessions" / "s1" / "results"
    store = ResultStore(d)
    assert not d.exists()                       # nothing written at construction
    path = store.persist("hello ✓")
    assert d.is_dir() and mode(d) == 0o700
    assert mode(d.parent) == 0o700 and mode(d.parent.parent) == 0o700
    assert path.parent == d and mode(path) == 0o600
    digest = hashlib.sha256("hello ✓".encode()).hexdigest()
    assert path.name.endswith(".txt") and digest.startswith(path.name[:-4])
    assert len(path.name[:-4]) >= 16
    assert path.read_bytes() == "hello ✓".encode()
    assert store.path_for("hello ✓") == path


def test_persisting_again_writes_nothing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    content = "日本語 👨‍👩‍👧 " * 1000
    p1 = store.persist(content)
    before = listing(store.directory)
    os.utime(p1, ns=(1_000_000_000, 1_000_000_000))     # any rewrite would change this
    p2 = store.persist(content)
    assert p1 == p2
    assert p2.stat().st_mtime_ns == 1_000_000_000
    assert set(listing(store.directory)) == set(before) == {p1.name}   # no temp files left
    assert store.persist("other") != p1
    assert store.load(p1) == content
    assert store.load(tmp_path / "elsewhere.txt") is None


def test_store_path_is_absolute_and_stable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = ResultStore(Path("rel"))
    assert store.directory.is_absolute()
    assert ResultStore(tmp_path / "rel").path_for("x") == store.path_for("x")


def test_store_survives_lone_surrogates(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    path = store.persist("bad \ud800 json")
    assert path.exists() and store.persist("bad \ud800 json") == path
    assert store.load(path) == "bad \ud800 json"


# -- preview --------------------------------------------------------------------------------

def test_preview_spec_shape_head_marker_tail(tmp_path: Path) -> None:
    content = "".join(f"line {i}\n" for i in range(5000))          # ~44k chars
    path = tmp_path / "abc.txt"
    out = preview(content, limit=20_000, head=4_000, tail=1_000, path=path)
    # Whole lines: the head is the lines that fit 4,000 chars, the tail those that fit 1,000.
    h = content.rindex("\n", 0, 4_001)
    t = content.index("\n", len(content) - 1_001) + 1
    lines = content.split("\n")
    first = content.count("\n", 0, h) + 1                 # the first line the head lacks
    last = len(lines) - 2 - content.count("\n", t)        # the last line the tail lacks
    assert lines[first - 1] in content[:h] and lines[last + 1] in content[t:]
    marker = (f"\n… {t - h} chars omitted: lines {first}–{last} of {len(lines)} — full "
              f"output saved to {path}; read them with read_file(path, offset={first}, "
              f"limit={last - first + 1}) …\n")
    assert out == content[:h] + marker + content[t:]
    assert 3_000 < h <= 4_000 and 750 < len(content) - t <= 1_000


def test_preview_fits_short_content_unchanged() -> None:
    assert preview("short", limit=10, head=4, tail=4, path=None) == "short"


def test_preview_scales_head_and_tail_to_a_small_limit(tmp_path: Path) -> None:
    content = "x" * 50_000
    path = tmp_path / "p.txt"
    out = preview(content, limit=1_000, head=4_000, tail=1_000, path=path)
    assert len(out) <= 1_000
    assert str(path) in out
    head, tail = _parts(out)
    assert len(head) > 3 * len(tail)                              # proportion 4:1 kept
    assert out.endswith("x")


@pytest.mark.parametrize("limit", [0, 1, 5, 24, 30, 60, 200, 1000])
def test_preview_never_exceeds_tiny_limits(limit: int, tmp_path: Path) -> None:
    content = "é👍🏽" * 1000
    out = preview(content, limit=limit, head=4_000, tail=1_000, path=tmp_path / "p.txt")
    assert len(out) <= limit
    out.encode("utf-8")


def test_preview_does_not_split_clusters() -> None:
    family = "👨\u200d👩\u200d👧"
    content = family * 3000
    for limit in range(40, 160):
        out = preview(content, limit=limit, head=37, tail=23, path=None)
        head, tail = _parts(out)
        assert len(head) % len(family) == 0 and len(tail) % len(family) == 0


@PROPS
@given(pieces=st.lists(st.sampled_from(MULTIBYTE_PIECES + ("a", "\r\n", "b")), min_size=1,
                       max_size=400),
       limit=st.integers(0, 3000), head=st.integers(0, 2000), tail=st.integers(0, 2000))
def test_preview_property(pieces: list[str], limit: int, head: int, tail: int) -> None:
    content = "".join(pieces)
    out = preview(content, limit=limit, head=head, tail=tail, path=Path("/r/x.txt"))
    assert len(out) <= max(limit, 0) or out == content
    out.encode("utf-8")
    if out == content:
        return
    info_head, tail_text = _parts(out)
    assert content.startswith(info_head) and is_boundary(content, len(info_head))
    assert content.endswith(tail_text)
    assert is_boundary(content, len(content) - len(tail_text))


def _parts(out: str) -> tuple[str, str]:
    """A preview's head and tail (the text around its marker; all of it when it has none)."""
    found = list(BUDGET_RE.finditer(out))
    if not found:
        return out, ""
    return out[:found[-1].start()], out[found[-1].end():]


# -- enforce_budget -------------------------------------------------------------------------

def _turn(*sizes: int, old: tuple[int, ...] = ()) -> h.History:
    msgs: list[Message] = [Message.system("sys")]
    if old:
        msgs.append(Message.user("earlier"))
        for k, n in enumerate(old):
            msgs += [call(f"call_{k}"), Message.tool(f"call_{k}", f"old{k} " + "o" * n)]
        msgs.append(Message.assistant("done"))
    msgs.append(Message.user("read them all"))
    for k, n in enumerate(sizes):
        msgs += [call(f"call_{k}"), Message.tool(f"call_{k}", f"{k}:" + "é" * n)]
    return tuple(msgs)


def test_over_per_result_limit_becomes_preview_with_persisted_full_content(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(30_000, 5_000)
    out, report = enforce_budget(hist, store=store, turn_budget_chars=S.turn_budget_chars,
                                 per_result_max_chars=S.per_result_max_chars,
                                 head_chars=S.budget_head_chars, tail_chars=S.budget_tail_chars)
    big = hist[3].text
    path = store.path_for(big)
    assert report.replaced == 1 and report.persisted == (path,)
    assert path.read_text(encoding="utf-8") == big
    assert out[3].text == preview(big, limit=20_000, head=4_000, tail=1_000, path=path)
    assert f"full output saved to {path}" in out[3].text
    assert out[5] is hist[5]                                    # 5k result untouched
    info = compaction_info(out[3])
    assert info is not None and info.level == LEVEL_PREVIEW
    assert (info.original_chars, info.original_lines, info.path) == (len(big), 1, path)
    assert report.chars_before == h.char_size(hist) and report.chars_after == h.char_size(out)
    assert "1 result replaced by previews" in report.message


def test_only_the_current_turn_is_budgeted(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(100, old=(50_000,))
    out, report = enforce_budget(hist, store=store, turn_budget_chars=200_000,
                                 per_result_max_chars=20_000)
    assert out is hist and report.replaced == 0 and not store.directory.exists()
    assert report.message == "✂ tool-result budget: within limits"


def test_turn_budget_previews_the_largest_first(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(19_000, 15_000, 18_000, 2_000)
    out, report = enforce_budget(hist, store=store, turn_budget_chars=40_000,
                                 per_result_max_chars=20_000)
    tools = [m for m in out if m.role is Role.TOOL]
    # 54k total: previewing the 19k one (→ ~5.2k) leaves ~40.2k, then the 18k one.
    assert compaction_info(tools[0]) is not None and compaction_info(tools[2]) is not None
    assert tools[1] is hist[5] and tools[3] is hist[9]
    assert sum(len(m.text) for m in tools) <= 40_000
    assert report.replaced == 2


def test_turn_budget_goes_below_standard_previews_when_it_must(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(*([4_000] * 12))                               # 48k in results of ~4k
    out, report = enforce_budget(hist, store=store, turn_budget_chars=20_000,
                                 per_result_max_chars=10_000)
    tools = [m for m in out if m.role is Role.TOOL]
    assert sum(len(m.text) for m in tools) <= 20_000
    for m in tools:
        info = compaction_info(m)
        if info is not None:
            assert len(info.head) + len(info.tail) >= MIN_PREVIEW_BODY_CHARS
            assert info.path is not None and info.path.exists()


def test_aggressive_halved_limits(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(15_000)
    out, report = enforce_budget(hist, store=store, turn_budget_chars=100_000,
                                 per_result_max_chars=10_000)
    assert report.replaced == 1 and len(out[-1].text) <= 10_000
    out2, report2 = enforce_budget(hist, store=store, turn_budget_chars=200_000,
                                   per_result_max_chars=20_000)
    assert out2 is hist and report2.replaced == 0                # limits restored afterwards


def test_running_twice_is_byte_identical_and_writes_nothing(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(30_000, 25_000, 9_000, 9_000, 9_000)
    once, r1 = enforce_budget(hist, store=store, turn_budget_chars=30_000,
                              per_result_max_chars=20_000)
    files = listing(store.directory)
    twice, r2 = enforce_budget(once, store=store, turn_budget_chars=30_000,
                               per_result_max_chars=20_000)
    assert twice is once and r2.replaced == 0
    assert listing(store.directory) == files
    # A fresh run on the original (next turn re-budgets the same content): same bytes, no file.
    again, _ = enforce_budget(hist, store=store, turn_budget_chars=30_000,
                              per_result_max_chars=20_000)
    assert [m.to_dict() for m in again] == [m.to_dict() for m in once]
    assert listing(store.directory) == files


def test_preview_meta_lost_still_recognised(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    once, _ = enforce_budget(_turn(30_000), store=store, turn_budget_chars=200_000,
                             per_result_max_chars=20_000)
    reloaded = h.from_openai(h.to_openai(once))                  # meta does not survive
    assert reloaded[-1].meta == {}
    twice, report = enforce_budget(reloaded, store=store, turn_budget_chars=200_000,
                                   per_result_max_chars=20_000)
    assert twice is reloaded and report.replaced == 0
    info = compaction_info(reloaded[-1])
    assert info is not None and info.original_chars == 30_002


def test_shrinking_a_preview_again_uses_the_original_file(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r")
    hist = _turn(30_000)
    once, _ = enforce_budget(hist, store=store, turn_budget_chars=200_000,
                             per_result_max_chars=20_000)
    smaller = shrink_tool_message(once[-1], 1_000, store=store, head=4_000, tail=1_000)
    assert smaller is not None and len(smaller.text) <= 1_000
    info = compaction_info(smaller)
    assert info is not None and info.original_chars == 30_002
    assert info.path == store.path_for(hist[-1].text)
    assert len(list(store.directory.iterdir())) == 1


# -- properties -----------------------------------------------------------------------------

def _strings(hist: h.History) -> list[str]:
    out = []
    for m in hist:
        for b in m.blocks:
            out += [getattr(b, f) for f in b.__slots__ if isinstance(getattr(b, f), str)]
    return out


@PROPS
@given(hist=histories(True, end_with_user=False),
       turn_budget=st.integers(1_000, 200_000), per_result=st.integers(200, 20_000),
       head=st.integers(0, 4_000), tail=st.integers(0, 1_000))
def test_budget_properties(hist: h.History, turn_budget: int, per_result: int, head: int,
                           tail: int) -> None:
    per_result = min(per_result, turn_budget)
    snapshot = copy.deepcopy([(m, dict(m.meta)) for m in hist])
    with tempfile.TemporaryDirectory() as d:
        store = ResultStore(Path(d) / "results")
        out, report = enforce_budget(hist, store=store, turn_budget_chars=turn_budget,
                                     per_result_max_chars=per_result, head_chars=head,
                                     tail_chars=tail)
        assert [(m, dict(m.meta)) for m in hist] == snapshot         # input untouched
        assert len(out) == len(hist)
        for a, b in zip(hist, out, strict=True):
            assert a.role is b.role
            if a.role is not Role.TOOL:
                assert a is b                                        # systems, users in place
            else:
                assert len(b.text) <= len(a.text)
                assert b.tool_result is not None and a.tool_result is not None
                assert b.tool_result.call_id == a.tool_result.call_id
        assert h.problems(out) == h.problems(hist) == []
        assert h.char_size(out) <= h.char_size(hist)
        for s in _strings(out):
            s.encode("utf-8")
        latest = h.latest_user_index(hist)
        start = -1 if latest is None else latest
        turn = [i for i in range(start + 1, len(out)) if out[i].role is Role.TOOL]
        assert all(len(out[i].text) <= per_result for i in turn)
        if sum(len(out[i].text) for i in turn) > turn_budget:
            # Over budget only when nothing left can shrink further.
            floor = MIN_PREVIEW_BODY_CHARS + 200 + len(str(store.directory))
            for i in turn:
                if compaction_info(out[i]) is None:
                    assert len(out[i].text) <= floor
        for i in range(start + 1):
            assert out[i] is hist[i]                                 # earlier turns untouched
        for a, b in zip(hist, out, strict=True):
            if a is not b:
                info = compaction_info(b)
                assert info is not None and info.path is not None
                assert store.load(info.path) == a.text               # nothing lost
        for p in report.persisted:
            assert mode(p) == 0o600 and store.load(p) is not None
        files = listing(store.directory)
        named = {info.path.name for m in out
                 if (info := compaction_info(m)) is not None and info.path is not None}
        assert set(files) == named                                   # no file for nothing
        again, report2 = enforce_budget(out, store=store, turn_budget_chars=turn_budget,
                                        per_result_max_chars=per_result, head_chars=head,
                                        tail_chars=tail)
        assert again is out and report2.replaced == 0
        assert listing(store.directory) == files


@pytest.mark.parametrize("cluster", ["👍🏽", "👨\u200d👩\u200d👧", "🇧🇷", "e\u0301",
                                     "a\u0308\u0323", "\u0915\u094d\u0937", "\r\n", "❤\ufe0f"])
def test_is_boundary_keeps_clusters_whole(cluster: str) -> None:
    text = cluster * 3
    for k in range(len(text) + 1):
        assert is_boundary(text, k) == (k % len(cluster) == 0), k


@PROPS
@given(text=multibyte_text(min_pieces=1, max_pieces=60), limit=st.integers(0, 80))
def test_preview_of_multibyte_text_is_valid_utf8(text: str, limit: int) -> None:
    out = preview(text, limit=limit, head=limit, tail=limit // 2, path=None)
    out.encode("utf-8")
    assert len(out) <= limit or out == text
