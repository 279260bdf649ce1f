"""markers and cuts: what the package writes around the conversation adds nothing a firewall reads.

No firewall here (``test_waf_crs.py`` runs the same corpus behind real ModSecurity + CRS):
these are the properties that make the package's own text pass the OWASP CRS at paranoia
level 1, checked on a developer's conversation (``waf_corpus.py``) and on generated text.

- **Cuts** (budget previews, microcompact previews, the ladder's long-message cut, a
  message cut in the summarizer's input) keep a head that is a prefix of the original and
  a tail that is a suffix, cut at a line boundary when one is near, else at a word
  boundary; the marker between them is on a line of its own only between whole lines.
  So every line start and line end of a preview is one of the original's, or the
  marker's.
- **The summarizer's input** (its framing: an instruction, a label opening and an end mark
  closing each message, notes) adds no occurrence of any hazard (``waf_corpus.HAZARDS``):
  no command word starting a line, no line ending after a method name, no bracket after
  the conversation's text, no SQL function name before a parenthesis.
- **The package's own texts** (the summarizer's prompt, markers, labels, notices) start no
  line with a command word and carry no brackets where text precedes them.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import waf_corpus as corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from ipy_ctxrecovery.core import markers, prompts, recall
from ipy_ctxrecovery.core.budget import ResultStore, preview
from ipy_ctxrecovery.core.compactor import compact
from ipy_ctxrecovery.core.continuation import CONTINUATION_PROMPT
from ipy_ctxrecovery.core.cuts import head_cut, tail_cut
from ipy_ctxrecovery.core.history import (
    TAG_COMPACTION_NOTICE,
    TAG_SUMMARY,
    TAG_SYNTHETIC_RESULT,
    History,
    Message,
    Role,
    Text,
    ToolCall,
)
from ipy_ctxrecovery.core.ladder import truncate_text
from ipy_ctxrecovery.core.microcompact import microcompact
from ipy_ctxrecovery.core.pairing import MISSING_RESULT
from ipy_ctxrecovery.settings import Settings

PROPS = settings(max_examples=200, deadline=None)

# Words that open a line the package writes (each passes the CRS: test_waf_crs.py).
OUR_LINE_STARTS = {"Message", "Tool", "…", "—", "Additional", "You", "Your", "##", "In", "The"}


def line_starts(text: str) -> list[str]:
    """The first word of every line after the first (where 932100–932115 look)."""
    return [m.group(1) for m in re.finditer(r"\n[ \t]*(\S+)", text)]


# -- the corpus -------------------------------------------------------------------------------

def _histories() -> list[History]:
    """Conversations from the corpus, with what the package itself puts in a history: an
    earlier summary, a compaction notice, a synthetic result, old results microcompacted to
    previews and one-liners."""
    out = []
    for seed in range(6):
        r = random.Random(seed)
        code = seed % 2 == 1
        texts = corpus.code_turns(seed, 8) if code else corpus.tool_turns(seed, 8)
        h: list[Message] = [Message.system("Be brief.")]
        if seed % 3 == 0:
            h.append(Message.user(f"{prompts.summary_header(6)}\n## Files read\n- app/export.py\n"
                                  "## Current task state\n- the retry loop", tag=TAG_SUMMARY))
        for i, text in enumerate(texts):
            h.append(Message.user(text))
            if not code and i % 2 == 0:
                call = f"call_{i}"
                h.append(Message(Role.ASSISTANT, (Text("Reading the log."),
                                                  ToolCall(call, "read_log", '{"name": "w.log"}'))))
                result = MISSING_RESULT if i == 4 else corpus.tool_result(r)
                h.append(Message.tool(call, result, name="read_log", is_error=i == 4,
                                      tag=TAG_SYNTHETIC_RESULT if i == 4 else None))
            h.append(Message.assistant(corpus.reply(r)))
            if i == 3:
                h.append(Message.user(prompts.compaction_notice(4, summarized=seed % 2 == 0),
                                      tag=TAG_COMPACTION_NOTICE))
        h.append(Message.user("Now write the fix."))
        out.append(tuple(h))
    return out


HISTORIES = _histories()


def _compacted(h: History, tmp_path: Path) -> History:
    """``h`` with its old results microcompacted, as the session sends it."""
    out, _ = microcompact(h, settings=Settings(), store=ResultStore(tmp_path / "results"))
    return out


def _summarizer_inputs(h: History, bound: int, requests: int = 8) -> list[str]:
    inputs: list[str] = []

    def summarize(text: str) -> str:
        inputs.append(text)
        return f"{prompts.summary_header(3)}\n## Current step\n- none: the retry loop of the worker was reviewed"

    def measure(history: History) -> int:
        return sum(len(m.text) for m in history)

    compact(h, target_bytes=measure(h) // 4, measure=measure, summarize=summarize,
            settings=Settings(summarizer_input_max_chars=bound, summary_max_requests=requests),
            force_summary=True,
            instructions="Start with the retry loop")
    assert inputs
    return inputs


def _as_quoted(m: Message) -> str:
    """A message's text as the summarizer's input quotes it (the package's own whole-message
    texts without their outer brackets; tool calls as lines)."""
    text = m.text
    ours = m.tag in (TAG_COMPACTION_NOTICE, TAG_SYNTHETIC_RESULT) or (
        m.role is Role.TOOL and markers.is_one_liner(text))
    parts = [markers.unbracket(text) if ours else text]
    parts += [markers.tool_call(b.name, b.arguments) for b in m.blocks if isinstance(b, ToolCall)]
    return "\n".join(p for p in parts if p)


@pytest.mark.parametrize("index", range(len(HISTORIES)))
def test_the_summarizers_framing_adds_no_hazard(index: int, tmp_path: Path) -> None:
    h = _compacted(HISTORIES[index], tmp_path)
    summarized = [m for m in h if m.role is not Role.SYSTEM][:-1]     # all but the latest
    (sent,) = _summarizer_inputs(h, bound=10_000_000)                  # nothing cut
    quoted = [_as_quoted(m) for m in summarized]
    for m, q in zip(summarized, quoted, strict=True):
        assert q in sent                                        # the user's text, unchanged
        if m.tag is None and m.role is not Role.TOOL:
            assert m.text in sent
    expected = {name: sum(corpus.hazards(q)[name] for q in quoted)
                for name in corpus.HAZARDS}
    assert corpus.hazards(sent) == expected
    # Every line the framing starts opens with one of its own (vetted) words.
    starts = {w for q in quoted for w in line_starts(q)}
    assert set(line_starts(sent)) - starts <= OUR_LINE_STARTS


@pytest.mark.parametrize("index", range(len(HISTORIES)))
@pytest.mark.parametrize("bound", [3_000, 6_000])
def test_a_bounded_summarizer_input_splits_messages_cleanly(index: int, bound: int,
                                                            tmp_path: Path) -> None:
    h = _compacted(HISTORIES[index], tmp_path)
    quoted = [_as_quoted(m) for m in h if m.role is not Role.SYSTEM][:-1]
    # The summary so far carried into a later request is the model's text (here "- none").
    starts = {w for q in quoted for w in line_starts(q)} | {"-"}
    bodies: dict[int, list[str]] = {}
    for sent in _summarizer_inputs(h, bound, requests=10_000):
        assert len(sent) <= bound + 200                 # + the user's instructions
        assert set(line_starts(sent)) - starts <= OUR_LINE_STARTS
        pieces = re.split(r"\n\n(?=Message \d+ of \d+, |Additional |The summary so far: )", sent)
        for piece in pieces:
            opened = markers.LABEL_RE.match(piece)
            closed = markers.END_RE.search(piece)
            if not (opened and closed):
                continue                                # the instruction, the summary so far
            bodies.setdefault(int(opened.group(1)), []).append(
                piece[opened.end():closed.start()])
    assert sorted(bodies) == list(range(1, len(quoted) + 1))    # every message read
    split = 0
    for i, parts in bodies.items():
        if len(parts) == 1:
            assert parts[0] == quoted[i - 1]            # whole, never cut
        else:
            _assert_clean_split(quoted[i - 1], parts)
            split += 1
    assert split or bound > 3_000                       # the bound made the compactor split


def _assert_clean_split(original: str, parts: list[str]) -> None:
    """``parts`` are ``original`` in order, cut only at a line end (the newline, and blank
    lines after it, not sent) or a word end (the one space not sent)."""
    at = 0
    for n, part in enumerate(parts):
        assert original.startswith(part, at), (at, part[:80])
        at += len(part)
        if n == len(parts) - 1:
            break
        if original[at] == "\n":
            while at < len(original) and original[at] == "\n":
                at += 1
        else:
            assert original[at].isspace() and not part[-1].isspace(), part[-40:]
            at += 1
    assert at == len(original)


# -- cuts -------------------------------------------------------------------------------------

def _assert_clean_cut(original: str, out: str, marker: re.Pattern[str]) -> None:
    """``out`` is a head of ``original``, a marker, a tail; a newline beside the marker only
    where the original had a line boundary, and a space only next to a whole word."""
    found = list(marker.finditer(out))
    assert found, out[:200]
    m = found[-1]
    head, tail, joined = out[:m.start()], out[m.end():], m.group()
    assert original.startswith(head) and original.endswith(tail)
    start = len(original) - len(tail)
    left, right = joined[:1], joined[-1:]
    if head:
        if left == "\n":
            assert original[len(head)] == "\n"          # the head is whole lines
        else:
            assert left == " " and not head[-1].isspace()
    if tail:
        if right == "\n":
            assert original[start - 1] == "\n"          # the tail is whole lines
        else:
            assert right == " " and not tail[0].isspace()
    # So every line start and line end in the output is the original's, or the marker's.
    assert set(line_starts(out)) <= set(line_starts(original)) | {"…"}


def _corpus_results() -> list[str]:
    r = random.Random(7)
    return [corpus.tool_result(r) for _ in range(30)]


@pytest.mark.parametrize("limit,head,tail", [(20_000, 4_000, 1_000), (3_000, 800, 200),
                                             (1_500, 500, 300), (600, 300, 100)])
def test_budget_previews_cut_the_corpus_at_lines(limit: int, head: int, tail: int) -> None:
    for content in _corpus_results():
        out = preview(content, limit=limit, head=head, tail=tail, path=Path("/r/x.txt"))
        if out != content:
            assert len(out) <= limit
            _assert_clean_cut(content, out, markers.BUDGET_RE)


def test_microcompact_previews_cut_the_corpus_at_lines(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    for content in _corpus_results():
        h: History = (Message.user("read it"),
                      Message(Role.ASSISTANT, (ToolCall("c1", "read_log", "{}"),)),
                      Message.tool("c1", content, name="read_log"),
                      Message.assistant("done"), Message.user("next"), Message.assistant("ok"),
                      Message.user("again"))
        out, _ = microcompact(h, settings=Settings(microcompact_summarize_turns=99),
                              store=store)
        if out[2].text != content:
            _assert_clean_cut(content, out[2].text, markers.OLD_PREVIEW_RE)


def test_the_ladder_cuts_a_long_answer_at_lines() -> None:
    r = random.Random(3)
    for _ in range(30):
        text = "\n\n".join(corpus.reply(r) for _ in range(6))
        out = truncate_text(text, 900, what="a long assistant message")
        if out != text:
            assert len(out) <= 900
            _assert_clean_cut(text, out, markers.LONG_MESSAGE_RE)


_LINES = st.lists(st.text(alphabet=st.sampled_from("ab cé\t-"), min_size=0, max_size=90),
                  min_size=1, max_size=60).map("\n".join)


@PROPS
@given(text=_LINES, n=st.integers(0, 3_000))
def test_head_and_tail_cuts_prefer_lines_then_words(text: str, n: int) -> None:
    h = head_cut(text, n)
    assert 0 <= h.at <= max(0, min(n, len(text)))
    window = text[max(1, n - max(1, n // 4)):n + 1]
    if n < len(text):
        if h.line:
            assert text[h.at] == "\n"
        elif "\n" in window:
            pytest.fail(f"a line end was within reach: {h}")
        elif h.at and text[h.at].isspace() and text[:h.at].strip():
            # At a word's end (a head of blanks only has no word to end: any cut will do).
            assert not text[h.at - 1].isspace()
    t = tail_cut(text, n)
    assert t.at >= len(text) - n
    if 0 < t.at < len(text) and t.line:
        assert text[t.at - 1] == "\n"


@PROPS
@given(text=_LINES, n=st.integers(0, 3_000))
def test_a_cut_never_starts_or_ends_a_line_the_text_did_not(text: str, n: int) -> None:
    """Head + marker + tail, joined as the package joins them."""
    if len(text) <= n:
        return
    h = head_cut(text, n * 3 // 4)
    t = tail_cut(text, n // 4, floor=h.at)
    at_words = (h.line or not h.at or text[h.at].isspace()) and (
        t.line or t.at == len(text) or text[t.at - 1].isspace())
    if not at_words:
        return      # no whitespace near the cut: a cluster boundary, inside a long token
    out = markers.join_cut(text[:h.at], markers.cut_marker(t.at - h.at), text[t.at:],
                           head_line=h.line, tail_line=t.line)
    assert set(line_starts(out)) <= set(line_starts(text)) | {"…"}
    ends = {m.group(1) for m in re.finditer(r"(\S+)[ \t]*\n", out)}
    assert ends <= {m.group(1) for m in re.finditer(r"(\S+)[ \t]*\n", text)} | {"…"}


# -- the package's own texts ------------------------------------------------------------------

def _own_texts() -> dict[str, str]:
    path = Path("/home/dev/.local/share/ipy_ctxrecovery/sessions/s1/results/0a1b.txt")
    return {
        "summarizer prompt": prompts.SUMMARIZE_SYSTEM_PROMPT,
        "payload notice": prompts.PAYLOAD_NOTICE,
        "compaction notice": prompts.compaction_notice(3, summarized=True),
        "compaction notice, dropped": prompts.compaction_notice(3, summarized=False),
        "summary header": prompts.summary_header(12),
        "continuation": CONTINUATION_PROMPT,
        "error explained": prompts.explain_error("total = sum(values)", "NameError: values"),
        "preamble": markers.preamble(12),
        "label": markers.label(3, 12, markers.SummaryLabel("user", tag=TAG_COMPACTION_NOTICE)),
        "tool label": markers.label(5, 12, markers.SummaryLabel("tool", tool="read_log",
                                                                error=True)),
        "end mark": markers.end_mark(3),
        "part label": markers.label(3, 12, markers.SummaryLabel("user"), part=2, parts=4),
        "part end mark": markers.end_mark(3, part=2, parts=4),
        "chunked preamble": markers.preamble(12, chunk=2, chunks=3, rolling=True),
        "summary so far": f"{markers.rolling_label()} x {markers.ROLLING_END}",
        "compaction notice, unread": prompts.compaction_notice(5, summarized=True, unread=3),
        "omitted note": markers.omitted_note(4, 12_000),
        "instructions": markers.instructions(""),
        **{f"budget marker {i}": m for i, m in enumerate(markers.budget_markers(
            1234, path, (10, 80, 200)))},
        "old preview marker": markers.old_preview_marker(1234, path),
        "long message marker": markers.long_message_marker(1234, "a long assistant message"),
        "cut marker": markers.cut_marker(1234),
        "one-liner": markers.old_result_cleared(120, 9_000, "text", path),
        "pointer": markers.duplicate_pointer(5_000, "read_log", "call_3"),
        "recall hint": prompts.RECALL_HINT,
        "compaction notice, recall": prompts.with_recall_hint(
            prompts.compaction_notice(3, summarized=False)),
        "summary header, recall": prompts.with_recall_hint(prompts.summary_header(12)),
        "recall label": recall.label(3, "tool result of read_log"),
        "recall result": recall.search(recall.entries(
            [Message.user("close the window"), Message.assistant("def close(self):\n    pass")]),
            recall.compile_query("close"), max_chars=4_000),
    }


@pytest.mark.parametrize("name", list(_own_texts()))
def test_the_packages_own_texts_start_no_line_with_a_command(name: str) -> None:
    text = _own_texts()[name]
    assert not set(w.lower() for w in line_starts("\n" + text)) & corpus.COMMAND_WORDS
    assert corpus.hazards(text)["942190"] == corpus.hazards(text)["921110"] == 0
    assert "`" not in text                          # a backtick is a shell substitution


FOLLOWERS = ["label", "tool label", "end mark", "omitted note", "old preview marker",
             "long message marker", "cut marker", "recall label", "recall hint",
             *[f"budget marker {i}" for i in range(4)]]


@pytest.mark.parametrize("name", FOLLOWERS)
def test_what_follows_the_conversations_text_has_no_brackets(name: str) -> None:
    """A marker or label written after the conversation's text closes no match it opened:
    no ``[`` or ``]`` (941370 after ``def close(self):``), no ``(`` or ``)`` right after it."""
    text = _own_texts()[name]
    assert "[" not in text and "]" not in text
    assert not text.lstrip().startswith(("(", ")"))
    for ending in corpus.ENDINGS + ["def close(self):"]:
        joined = f"{ending} {text}"
        assert corpus.hazards(joined) == corpus.hazards(ending)


def test_our_whole_message_texts_lose_their_brackets_only_in_the_summarizers_input() -> None:
    notice = prompts.compaction_notice(2, summarized=False)
    one_liner = markers.old_result_cleared(3, 300, "text", None)
    assert markers.is_one_liner(one_liner) and not markers.is_one_liner("[1, 2, 3]")
    assert markers.unbracket(notice) == notice[1:-1]
    assert markers.unbracket("no brackets") == "no brackets"


def test_read_file_shows_whole_lines_before_its_cut(tmp_path: Path) -> None:
    from ipy_ctxrecovery.session.tools import make_read_file

    (tmp_path / "big.log").write_text(corpus.log(random.Random(1), 400) + "\n")
    tool = make_read_file(tmp_path, tmp_path / "results", max_chars=3_000)
    text, is_error = tool.run('{"path": "big.log", "limit": 400}')
    assert not is_error
    body, marker = text.rsplit("\n", 1)
    assert marker.startswith("… cut at 3000 chars; continue with offset=")
    lines = (tmp_path / "big.log").read_text().splitlines()
    shown = body.split("\n")[1:]                        # after the header
    assert shown == lines[:len(shown)]                  # whole lines only
