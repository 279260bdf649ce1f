"""The turn card: a static record of one turn, read from its recorded event stream.

The streams are real turns (a session against the emulator, or a scripted provider);
every line of the card is asserted, and the card is checked through the magics: written
once under the cell, after the answer, per ``ChatMagics.turn_card``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contrast import installed_themes, theme_problems, vetted
from IPython.core.displaypub import DisplayPublisher
from IPython.testing import globalipapp
from turn_streams import KB, LOREM, Stream, events_only, record, recovery_413, routine

from ipy_ctxrecovery.core import compactor, theme
from ipy_ctxrecovery.core import events as ev
from ipy_ctxrecovery.core.history import Message
from ipy_ctxrecovery.core.wording import CARD_GLYPHS
from ipy_ctxrecovery.failures import FailureKind
from ipy_ctxrecovery.notebook import get_magics
from ipy_ctxrecovery.notebook.turn_card import TurnCard, TurnRecord, card_wanted
from ipy_ctxrecovery.session import ChatSession
from ipy_ctxrecovery.settings import Settings

DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def replay(stream: Stream, record_: TurnRecord | None = None) -> TurnRecord:
    rec = record_ or TurnRecord()
    for item in stream:
        if isinstance(item, str):
            rec.text_arrived(item)
        else:
            rec.feed(item)
    return rec


def card_of(stream: Stream, **finish: Any) -> TurnCard:
    rec = replay(stream)
    rec.finish(**{"prompt_tokens": 1234, "completion_tokens": 56, "elapsed": 2.4, **finish})
    return TurnCard(rec)


def assert_glyphs_exist(text: str) -> None:
    """Every non-ASCII character is one the card may use, and DejaVu Sans draws it."""
    odd = {c for c in text if ord(c) > 127} - CARD_GLYPHS
    assert not odd, f"characters outside CARD_GLYPHS: {sorted(odd)}"
    for c in text:
        assert unicodedata.category(c) != "So" or c in CARD_GLYPHS, c


def test_the_glyphs_are_in_dejavu_sans() -> None:
    fonttools = pytest.importorskip("fontTools.ttLib")
    if not DEJAVU.exists():
        pytest.skip("DejaVu Sans is not installed (apt-get install fonts-dejavu-core)")
    cmap = fonttools.TTFont(str(DEJAVU)).getBestCmap()
    assert {c for c in CARD_GLYPHS if ord(c) not in cmap} == set()


# -- a 413 recovered by a summary ------------------------------------------------------------

def test_a_413_recovered_by_a_summary(emulator: Any) -> None:
    session, stream = recovery_413(emulator)
    card = card_of(stream)
    sent = [e for e in events_only(stream) if isinstance(e, ev.Sending)]
    cap = session.status().cap
    assert cap is not None and len(sent) == 2
    first, second = (f"{e.body_bytes / KB:.1f} KB" for e in sent)
    lines = card.text().splitlines()
    assert lines[0] == ("turn · session default · ✓ answered after 1 recovery step · 2.4 s · "
                        "1,234 prompt + 56 completion tokens")
    assert lines[1].startswith(f"  before  request {first} · no payload cap known · ≈")
    assert lines[1].endswith(" of 200,000 tokens")
    assert lines[2].startswith("  after   history ") and \
        f"of {cap / KB:.1f} KB cap (learned) · ≈" in lines[2]
    # No model on the record and no cache reported: no cache line.
    rows = [line.split(None, 1)[1] for line in lines[3:]]
    names = [line[4:].split("  ")[0].strip() for line in lines[3:]]
    assert names == ["pre-flight", "send", "recovery 1: summarize to fit", "payload cap",
                     "compaction", "note to the model", "send"]
    glyphs = [line[2] for line in lines[3:]]
    assert glyphs == ["✓", "✗", "✓", "·", "✓", "·", "✓"]
    assert rows[0].endswith("within the window")
    assert rows[1].endswith(f"{first} · payload too large (413)")
    assert rows[2].endswith(f"a {first} request was rejected → older messages summarized to "
                            f"fit 12.0 KB")
    assert rows[3].endswith(f"learned ≈{cap / KB:.1f} KB: a {first} request was rejected "
                            "(kept for this network path)")
    assert "summary by the model: 8 → 3 messages, " in rows[4]
    # What the summary request was billed against what it removes from later requests.
    assert re.search(r" · summary request [\d,]+ \+ [\d,]+ tokens; each later request "
                     r"≈ [\d,]+ input tokens smaller$", rows[4]), rows[4]
    assert rows[6].endswith(f"{second} (try 2) · answered")
    assert_glyphs_exist(card.text())
    rec = replay(stream)
    assert rec.something_happened and rec.recovered == 1 and rec.finished
    assert card_wanted("auto", rec) and card_wanted("always", rec)
    assert not card_wanted("never", rec)
    session.close()


def test_the_html_says_the_same_and_is_static(emulator: Any) -> None:
    session, stream = recovery_413(emulator)
    card = card_of(stream)
    bundle = card._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}   # no widget: it saves as it shows
    page = bundle["text/html"]
    assert "<script" not in page and "application/vnd.jupyter" not in str(bundle)
    for _glyph, name, detail in card.rows:
        assert f">{name}</td>" in page
        assert detail.replace("→", "&#8594;") in page or detail in page
    rec = replay(stream)
    rec.feed(ev.Failed(failure_kind=FailureKind.OTHER, sentence="<b>late</b>"))
    assert bundle == card._repr_mimebundle_()           # written once: later events change nothing
    assert "&lt;b&gt;late" in TurnCard(rec).html()       # and text is escaped
    session.close()


def test_the_card_takes_its_colours_from_the_theme(emulator: Any) -> None:
    """A saved card is plain HTML: its inline colours are theme variables with fallbacks,
    green for a turn that ended well, red for one that did not (issue 25)."""
    themes = installed_themes()
    session, stream = recovery_413(emulator)
    ok = card_of(stream).html()
    rec = replay(stream)
    rec.feed(ev.Failed(failure_kind=FailureKind.OTHER, sentence="late"))
    failed = TurnCard(rec).html()
    for page in (ok, failed):
        assert theme_problems(page, themes) == [] and vetted(page) == []
    assert f"border-left:3px solid {theme.BORDER_OK}" in ok
    assert f"border-left:3px solid {theme.BORDER_ERROR}" in failed
    session.close()


# -- routine, failed, interrupted, continued, laddered ------------------------------------------

def test_a_routine_turn_has_a_card_only_when_asked(emulator: Any) -> None:
    session, stream = routine(emulator)
    rec = replay(stream)
    rec.finish(prompt_tokens=10, completion_tokens=12, elapsed=0.3)
    assert not rec.something_happened
    assert not card_wanted("auto", rec) and card_wanted("always", rec)
    lines = TurnCard(rec).text().splitlines()
    assert lines[0] == "turn · session default · ✓ answered · 0.3 s · 10 prompt + 12 completion tokens"
    assert [line[:4] for line in lines[3:]] == ["  ✓ ", "  ✓ "]
    assert lines[3].split()[1:] == ["pre-flight", "within", "the", "window"]
    assert lines[4].endswith(" · answered") and "send" in lines[4]
    session.close()


def test_a_failed_turn_says_the_history_is_as_before(emulator: Any) -> None:
    emu = emulator(context_window=200_000)
    session = ChatSession("emulator", emulator=emu, name="fails")
    session.send("one", stream=False)
    before = session.history
    emu.fail_next(400, message="Model is busy.")
    stream: Stream = []
    unsubscribe = session.subscribe(stream.append)
    with pytest.raises(Exception, match="busy"):
        session.send("two")
    unsubscribe()
    assert session.history == before
    rec = replay(stream)
    assert rec.failed is not None and rec.something_happened
    lines = TurnCard(rec).text().splitlines()
    assert lines[0].startswith("turn · session default · ✗ failed · ")
    assert "Model is busy" in lines[0]
    assert lines[2] == "  after   history exactly as before this turn"
    assert lines[-1].startswith("  ✗ send") and lines[-1].endswith(" · request failed")
    session.close()


def test_a_cancelled_summary(emulator: Any) -> None:
    """The compactor's own events for a summary interrupted (Ctrl-C, or the panel's Cancel)."""
    history = tuple(Message.user(f"question {i} " + LOREM * 20) if i % 2 == 0
                    else Message.assistant(f"answer {i} " + LOREM * 20) for i in range(9))
    rec = TurnRecord()

    def interrupted(_text: str) -> str:
        raise KeyboardInterrupt

    def size(h: Any) -> int:
        return sum(len(m.text) for m in h)

    with pytest.raises(KeyboardInterrupt):
        compactor.compact(history, target_bytes=size(history) // 3, measure=size,
                          summarize=interrupted, settings=Settings(), on_event=rec.feed)
    rec.interrupted()
    lines = TurnCard(rec).text().splitlines()
    assert lines[0] == "turn · session default · ✗ cancelled · history exactly as before"
    assert lines[1] == "  after   history exactly as before this turn"
    assert lines[2].startswith("  ✗ compaction  cancelled · history exactly as before (it was "
                               "compacting 9 messages, ")


def test_an_answer_continued_past_max_tokens(emulator: Any) -> None:
    emu = emulator(context_window=200_000)
    session = ChatSession("emulator", emulator=emu, name="continued")
    rec = replay(record(session, "go [[words 60]]", max_tokens=10))
    names = [s.name for s in rec.steps]
    assert names == ["pre-flight", "send", "continuation"] * 2 + ["pre-flight", "send"]
    details = [s.detail for s in rec.steps if s.stage == "continuation"]
    assert details == ["answer cut at max_tokens 10 → continuing with 20 (1 of 2)",
                       "answer cut at max_tokens 20 → continuing with 40 (2 of 2)"]
    assert rec.something_happened
    assert all(s.status == "done" for s in rec.steps)
    session.close()


def test_ladder_levels_each_with_before_and_after() -> None:
    from fakes import FakeProvider, failure

    overflow = failure(FailureKind.CONTEXT_OVERFLOW, "context length exceeded")
    provider = FakeProvider(window=1_000_000)
    session = ChatSession("fake", provider=provider, name="ladder")
    for i in range(13):
        session.send(f"turn {i}: " + LOREM * 3, stream=False)
    provider.script.extend([overflow, overflow])   # no numbers: the blind levels, in order
    rec = replay(record(session, "and now?"))
    recovery = [s for s in rec.steps if s.stage == "recovery"]
    assert [s.name for s in recovery] == ["recovery 1: shrink tool results",
                                          "recovery 2: drop older messages"]
    assert all(" → " in s.detail and "message" in s.detail for s in recovery)
    sends = [s for s in rec.steps if s.stage == "send"]
    assert [s.status for s in sends] == ["failed", "failed", "done"]
    assert sends[0].detail.endswith("context window exceeded")
    assert rec.outcome == "✓ answered after 2 recovery steps"
    session.close()


# -- through the magics -------------------------------------------------------------------------

class RecordingPublisher(DisplayPublisher):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[dict[str, Any]] = []

    def publish(self, data: dict[str, Any], metadata: Any = None, source: Any = None, *,
                transient: Any = None, update: bool = False, **kwargs: Any) -> None:
        self.calls.append({"data": data, "transient": transient or {}, "update": update})


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.config.pop("ChatMagics", None)
    shell.run_line_magic("load_ext", "ipy_ctxrecovery")
    magics = get_magics(shell)
    assert magics is not None
    magics.live_display, magics.stream_interval = "always", 0.0
    saved, shell.display_pub = shell.display_pub, RecordingPublisher(shell=shell)
    yield shell
    shell.display_pub = saved
    shell.run_line_magic("unload_ext", "ipy_ctxrecovery")


def cards(ip: Any) -> list[str]:
    return [c["data"]["text/plain"] for c in ip.display_pub.calls
            if "ctxr-card" in c["data"].get("text/html", "")]


def test_turn_card_modes_through_the_magics(ip: Any) -> None:
    ip.run_line_magic("chat", "emulator --max-body 32KB --context-window 200000")
    assert ip.run_cell("%%chat\nhello [[words 3]]\n").success
    assert cards(ip) == []                                   # auto: nothing happened
    ip.run_line_magic("config", "ChatMagics.turn_card = 'always'")
    assert ip.run_cell("%%chat\nagain [[words 3]]\n").success
    assert len(cards(ip)) == 1 and cards(ip)[0].startswith("turn · session default · ✓ answered")
    assert ip.display_pub.calls[-1]["data"]["text/plain"] == cards(ip)[0]  # under the answer
    ip.run_line_magic("config", "ChatMagics.turn_card = 'auto'")
    for i in range(3):
        ip.run_cell_magic("chat", "", f"part {i}: " + LOREM * 95)
    assert len(cards(ip)) == 1
    assert ip.run_cell("%%chat\nCompare them: " + LOREM * 40 + "\n").success
    assert len(cards(ip)) == 2
    card = cards(ip)[-1]
    assert "✓ answered after 1 recovery step" in card.splitlines()[0]
    assert "recovery 1: summarize to fit" in card
    assert ip.display_pub.calls[-1]["data"]["text/plain"] == card
    ip.run_line_magic("config", "ChatMagics.turn_card = 'never'")
    assert ip.run_cell("%%chat\nCompare again: " + LOREM * 60 + "\n").success
    assert len(cards(ip)) == 2


def test_a_bad_turn_card_mode_is_refused(ip: Any) -> None:
    magics = get_magics(ip)
    with pytest.raises(Exception, match="turn_card"):
        magics.turn_card = "sometimes"   # type: ignore[union-attr]


def test_a_cancelled_summary_counts_the_history_as_the_interrupt_line_does(
        ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ipy_ctxrecovery.notebook.display import ChatInterrupted

    ip.run_line_magic("config", "ChatMagics.turn_card = 'always'")
    ip.run_line_magic("config", "ChatMagics.max_payload = '24KB'")
    ip.run_line_magic("chat", "config background_compaction=off")  # the summary in the turn
    for i in range(3):
        ip.run_cell_magic("chat", "", f"part {i}: " + LOREM * 40)
    magics = get_magics(ip)
    assert magics is not None
    session = magics.workspace.session()
    history = session.history
    summarizing: list[ev.Event] = []
    unsubscribe = session.subscribe(
        lambda e: summarizing.append(e) if isinstance(e, ev.CompactionPhase)
        and e.phase == "summarize" else None)
    real_send = session.provider.send

    def send(*args: Any, **kwargs: Any) -> Any:
        if summarizing:      # the summary request: the user pressed Cancel (an interrupt)
            raise KeyboardInterrupt
        return real_send(*args, **kwargs)

    session.provider.send = send  # type: ignore[method-assign]
    try:
        with pytest.raises(ChatInterrupted) as raised:
            ip.run_cell_magic("chat", "", "and now a long one: " + LOREM * 120)
    finally:
        unsubscribe()
        session.provider.send = real_send  # type: ignore[method-assign]
    assert summarizing and session.history == history
    line = raised.value._render_traceback_()[0]
    said = f"({len(history)} messages)"
    assert said in line, line
    card = cards(ip)[-1].splitlines()
    assert card[0].startswith("turn · session default · ✗ cancelled")
    after = next(row for row in card if row.startswith("  after "))
    assert after == f"  after   history exactly as before this turn {said}"
    # The compaction's own count is what it was compacting — the history and the new
    # message — and says so.
    compaction = next(row for row in card if "compaction" in row)
    assert f"it was compacting {len(history) + 1} messages, " in compaction, compaction


def chunked_summary() -> list[ev.Event]:
    """A compaction whose summary read 14 messages in 3 requests and left 2 unread."""
    base: dict[str, Any] = {"before_messages": 30, "before_bytes": 60 * KB,
                            "target_bytes": 20 * KB}
    cost: dict[str, Any] = {"chunks": 3, "summary_requests": 3, "summary_input_tokens": 8_000,
                            "summary_output_tokens": 1_120, "read_messages": 14,
                            "dropped_unread": 2, "summary_request_bound": 8}
    return [ev.CompactionPhase(phase="start", **base),
            ev.CompactionPhase(phase="trim", **base),
            ev.CompactionPhase(phase="summarize", chunks=3, **base),
            ev.CompactionPhase(phase="applied", after_messages=15, after_bytes=18 * KB,
                               outcome="summary", **base, **cost)]


def test_a_chunked_summary_says_what_it_read_cost_and_dropped_unread() -> None:
    text = card_of(chunked_summary()).text()
    row = next(line for line in text.splitlines() if "compaction" in line)
    # Its tokens once, in and out (the row said "9,120 tokens" and then "8,000 + 1,120").
    assert "summary: 14 messages read in 3 chunks, 3 requests · " in row
    assert "summary request 8,000 + 1,120 tokens" in row and "9,120" not in row
    assert "2 messages dropped unread (summary-request bound 8)" in row


# -- cost -------------------------------------------------------------------------------------

def test_the_card_shows_the_cache_split_and_the_cost_of_a_priced_model(emulator: Any) -> None:
    _, stream = routine(emulator)
    rec = replay(stream, TurnRecord(model="claude-sonnet-4-20250514"))
    rec.finish(elapsed=1.0, prompt_tokens=10_000, completion_tokens=1_000,
               cached_tokens=8_000, cache_write_tokens=1_500)
    card = TurnCard(rec)
    # 500 × $3 + 8,000 × $0.30 + 1,500 × $3.75 + 1,000 × $15 per million = $0.0245
    lines = card.text().splitlines()
    # The cost on its own line, under the split: beside it, the line ran past 80 columns
    # and read as the cost of the cache.
    at = lines.index("  cache   8,000 cached reads + 1,500 cache writes + 500 uncached input "
                     "tokens")
    assert lines[at + 1] == "  cost    ≈ $0.0245 (estimated; input and answer)"
    assert "cache</span> 8,000 cached reads + 1,500 cache writes" in card.html()
    # JupyterLab typesets an HTML output's $…$ as LaTeX: two amounts in one card became a
    # formula (tests/test_browser.py shows it); the card's root opts out of MathJax.
    assert card.html().startswith("<div class='ctxr-card mathjax_ignore tex2jax_ignore' ")
    # The cost is one unbreakable phrase: a narrow card wrapped it after the "≈".
    assert "cost</span> ≈&nbsp;$0.0245 (estimated; input and answer)</div>" in card.html()
    over = TurnRecord(model="claude-sonnet-4", prices="claude-sonnet-4=0/0/0/1000")
    over.finish(elapsed=1.0, prompt_tokens=10, completion_tokens=1_000)
    assert "\n  cost    ≈ $1.00 (estimated; input and answer)" in TurnCard(over).text()
    unknown = TurnRecord(model="llama-3-70b")
    unknown.finish(elapsed=1.0, prompt_tokens=10, completion_tokens=1)
    assert TurnCard(unknown).text().splitlines()[-2:] == [
        "  cache   0 cached reads + 0 cache writes + 10 uncached input tokens",
        "  cost    price unknown"]
    # The emulator bills nothing: no line until it reports a cache.
    free = TurnRecord(model="emulator")
    free.finish(elapsed=1.0, prompt_tokens=10, completion_tokens=1)
    assert "cache" not in TurnCard(free).text()
    free.finish(elapsed=1.0, prompt_tokens=10, completion_tokens=1, cached_tokens=4)
    assert TurnCard(free).text().endswith(
        "cache   4 cached reads + 0 cache writes + 6 uncached input tokens\n"
        "  cost    ≈ $0.0000 (estimated; input and answer)")


def test_a_compaction_card_prices_its_summary_against_what_it_removes() -> None:
    rec = TurnRecord(model="gpt-4o")
    rec.feed(ev.CompactionPhase(phase="start", before_messages=20, before_bytes=400_000,
                                target_bytes=100_000))
    rec.feed(ev.CompactionPhase(phase="applied", before_messages=20, after_messages=5,
                                before_bytes=400_000, after_bytes=80_000, outcome="summary",
                                summary_input_tokens=30_000, summary_output_tokens=2_000))
    step = rec.latest("compaction")
    assert step is not None
    # 30,000 × $2.50 + 2,000 × $10 = $0.095; 320,000 B ≈ 80,000 tokens × $2.50 = $0.20.
    assert step.detail.endswith(
        " · summary request 30,000 + 2,000 tokens (≈ $0.0950); each later request ≈ 80,000 "
        "input tokens smaller (≈ $0.2000 uncached)")
    # The emulator bills nothing: the tokens are said, no "$0.0000" twice.
    free = TurnRecord(model="emulator")
    for event in (ev.CompactionPhase(phase="start", before_messages=20, before_bytes=400_000,
                                     target_bytes=100_000),
                  ev.CompactionPhase(phase="applied", before_messages=20, after_messages=5,
                                     before_bytes=400_000, after_bytes=80_000,
                                     outcome="summary", summary_input_tokens=30_000,
                                     summary_output_tokens=2_000)):
        free.feed(event)
    assert free.steps[0].detail.endswith(" · summary request 30,000 + 2,000 tokens; each "
                                         "later request ≈ 80,000 input tokens smaller")


def test_a_background_summary_row_says_what_its_requests_were_billed() -> None:
    # Its tokens are the session's (%chat usage counts them in the turn that tells it), not
    # the turn's answer's: the card says them, so the cards add up to %chat usage.
    rec = TurnRecord(model="gpt-4o")
    rec.feed(ev.BackgroundSummary(state="ready", covered_messages=14, before_messages=23,
                                  after_messages=10, before_bytes=40_000, after_bytes=8_000,
                                  prompt_tokens=3_000, completion_tokens=300,
                                  cached_tokens=1_000))
    (step,) = [s for s in rec.steps if s.stage == "background"]
    # 2,000 × $2.50 + 1,000 × $1.25 + 300 × $10 = $0.00925; 32,000 B ≈ 8,000 tokens × $2.50.
    assert step.detail.endswith(
        "swapped in when needed · background summary request 3,000 + 300 tokens (≈ $0.0093); "
        "each later request ≈ 8,000 input tokens smaller (≈ $0.0200 uncached)")
    failed = TurnRecord(model="gpt-4o")
    failed.feed(ev.BackgroundSummary(state="failed", reason="nothing to summarize",
                                     prompt_tokens=1_000, completion_tokens=10))
    assert failed.steps[0].detail == ("failed: nothing to summarize · background summary "
                                      "request 1,000 + 10 tokens (≈ $0.0026)")
    told = TurnRecord(model="gpt-4o")
    told.feed(ev.BackgroundSummary(state="preparing", before_bytes=4_000))
    assert "tokens" not in told.steps[0].detail


def test_a_server_compaction_row_prices_it_against_what_it_removes() -> None:
    rec = TurnRecord(model="claude-sonnet-4", estimate=lambda b: b // 4)
    rec.feed(ev.ServerCompacted(wire="anthropic", replaced_messages=23, before_bytes=20_000,
                                after_bytes=2_000, summary_chars=963, prompt_tokens=4_800,
                                completion_tokens=250, cached_tokens=3_900))
    (step,) = rec.steps
    # 900 × $3 + 3,900 × $0.30 + 250 × $15 = $0.00762; 18,000 B = 4,500 tokens × $3.
    assert step.detail.endswith(
        "history 19.5 KB → 2.0 KB · the server's compaction 4,800 + 250 tokens (≈ $0.0076); "
        "each later request ≈ 4,500 input tokens smaller (≈ $0.0135 uncached)")
    # No usage reported for it: nothing said of its cost.
    quiet = TurnRecord(model="claude-sonnet-4")
    quiet.feed(ev.ServerCompacted(wire="anthropic", replaced_messages=2, before_bytes=20_000,
                                  after_bytes=2_000))
    assert "tokens" not in quiet.steps[0].detail


def test_the_card_and_the_panel_say_how_many_facts_the_summary_kept() -> None:
    from ipy_ctxrecovery.notebook.panel import _tracker

    facts = ["Load data/raw/sales_2024.csv: 1,234 rows, 12 columns, 3.2 GB.",
             "The `unit_cost` column has a 12% lift for Acme Corp.",
             "We fit maxDepth with XGBoost 2.0.3 until 2026-11-30."]
    history = []
    for i, text in enumerate(facts):
        history += [Message.user(f"{text} " + LOREM * 10),
                    Message.assistant(f"answer {i} " + LOREM * 10)]
    history.append(Message.user("and now?"))

    def size(h: Any) -> int:
        return sum(len(m.text) for m in h)

    rec = TurnRecord()
    new, report = compactor.compact(
        tuple(history), target_bytes=size(history) // 3, measure=size,
        summarize=lambda _text: "## Data and variables\n- sales_2024.csv, 1234 rows, 3.2GB",
        settings=Settings(), on_event=rec.feed)
    assert report.applied and (report.facts_total, report.facts_kept) == (11, 2)
    said = f"the summary kept 2 of 11 facts; {report.facts_added} added back verbatim"
    assert report.facts_added == 9
    rec.finish(prompt_tokens=1, completion_tokens=1, elapsed=1.0)
    (line,) = [ln for ln in TurnCard(rec).text().splitlines() if "compaction" in ln]
    assert f"· {said}" in line
    assert said in TurnCard(rec).html()
    apply = [row for row in _tracker(rec, running=False) if row[0] == "apply"]
    assert apply[0][3].endswith(f"· {said}")
