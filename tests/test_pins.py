"""pins: the user's rules pinned verbatim and the user's messages kept across compactions.

Detection (``rules_in``): rules against questions, corrections, five languages. The two
messages read back what they wrote. Through the compactor: rules survive three
compactions word for word, kept messages stay within their budget, neither is ever sent
to the summarizer as text to compress. End to end, a real ChatSession against the
emulator (both wires, and strict role alternation): the rules reach every request after
the compactions, go with a reset, and come back on resume.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import waf_corpus as corpus

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core import pins
from ipy_ctxrecovery.core.compactor import compact
from ipy_ctxrecovery.core.events import CompactionPhase, Event
from ipy_ctxrecovery.core.history import (
    TAG_PINNED_RULES,
    TAG_SUMMARY,
    TAG_USER_WORDS,
    History,
    Message,
    Role,
    problems,
    to_openai,
)
from ipy_ctxrecovery.core.ladder import drop_oldest
from ipy_ctxrecovery.core.markers import MERGED_TEXT_JOIN
from ipy_ctxrecovery.core.prompts import PINNED_RULES_HEADER, USER_WORDS_HEADER
from ipy_ctxrecovery.core.wording import compaction_detail
from ipy_ctxrecovery.emulator.roles import alternates
from ipy_ctxrecovery.providers.openai import to_wire

S = Settings()


# -- detection --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, rule", [
    ("Always use metric units. Thanks!", "Always use metric units."),
    ("Never drop rows with NaN values.", "Never drop rows with NaN values."),
    ("Plot it. From now on, label every axis.", "From now on, label every axis."),
    ("Don't round the p-values.", "Don't round the p-values."),
    ("Make sure the dates are parsed as UTC.", "Make sure the dates are parsed as UTC."),
    ("Use polars instead of pandas.", "Use polars instead of pandas."),
    ("Please always show the code first, e.g. as a cell.",
     "Please always show the code first, e.g. as a cell."),
    ("Good. Going forward, keep the columns sorted by name.",
     "Going forward, keep the columns sorted by name."),
    ("- never touch the raw/ folder", "never touch the raw/ folder"),
    # corrections
    ("No, I meant the median, not the mean.", "No, I meant the median, not the mean."),
    ("Actually, use the 2023 file.", "Actually, use the 2023 file."),
    # Portuguese
    ("Sempre use vírgula como separador decimal.", "Sempre use vírgula como separador decimal."),
    ("A partir de agora, responda em português.", "A partir de agora, responda em português."),
    ("Na verdade, use o arquivo de 2023.", "Na verdade, use o arquivo de 2023."),
    ("Não use a coluna id.", "Não use a coluna id."),
    # Spanish
    ("Siempre usa el formato ISO para las fechas.", "Siempre usa el formato ISO para las fechas."),
    ("De ahora en adelante, responde en español.", "De ahora en adelante, responde en español."),
    ("No, quise decir la mediana.", "No, quise decir la mediana."),
    # French
    ("Utilise toujours des unités métriques.", "Utilise toujours des unités métriques."),
    ("Ne supprime jamais la colonne id.", "Ne supprime jamais la colonne id."),
    ("Désormais, réponds en français.", "Désormais, réponds en français."),
    # German
    ("Verwende polars statt pandas.", "Verwende polars statt pandas."),
    ("Ab jetzt bitte auf Deutsch antworten.", "Ab jetzt bitte auf Deutsch antworten."),
    ("Nein, ich meinte den Median.", "Nein, ich meinte den Median."),
])
def test_a_rule_is_found_verbatim(text: str, rule: str) -> None:
    assert pins.rules_in(text) == (rule,)
    assert rule in text


@pytest.mark.parametrize("text", [
    "Can you always use metric units?",
    "Why do you always use pandas?",
    "Should I never drop rows with NaN?",
    "Could you make sure the dates are UTC",        # a question without its mark
    "¿Siempre usas pandas?",
    "Tu utilises toujours pandas ?",
    "What is the mean?",
    "Tell me what the mean is.",
    "I never liked pandas.",
    "I used polars instead of pandas yesterday.",
    "Eu sempre uso pandas.",
    "Don't worry about it.",
    "Actually, that looks great.",
    "> Always quote your sources.",                   # a quoted line
    "```python\n# always = True\nnever = 1\n```",     # code
    "Always " + "very " * 200 + "long.",              # a paste, not a rule
])
def test_not_a_rule(text: str) -> None:
    assert pins.rules_in(text) == ()


def test_several_rules_in_one_message_in_order_without_repeats() -> None:
    text = ("Load sales.csv.\nAlways use metric units. Never drop the id column!\n"
            "What is the mean? Always use metric units.")
    assert pins.rules_in(text) == ("Always use metric units.", "Never drop the id column!")


# -- the two messages read back what they wrote -------------------------------------------------

def test_the_pinned_message_reads_back_its_rules() -> None:
    rules = ("Always use metric units.", "No — I meant the median — not the mean.",
             "Never drop the id column")
    m = pins.pinned_message(rules)
    assert m is not None and m.tag == TAG_PINNED_RULES and m.role is Role.USER
    assert m.text.startswith(PINNED_RULES_HEADER) and "\n" not in m.text
    assert pins.rules_of(m) == rules
    assert pins.rules_of(Message.from_dict(m.to_dict())) == rules
    assert pins.pinned_message(()) is None


def test_the_kept_message_reads_back_its_messages() -> None:
    texts = ("first\nwith lines", "second — with a dash\n\nand a paragraph", "third")
    m = pins.words_message(texts)
    assert m is not None and m.tag == TAG_USER_WORDS
    assert m.text.startswith(USER_WORDS_HEADER)
    assert pins.kept_messages_of(m) == texts
    assert pins.words_message(()) is None


def test_no_line_of_ours_starts_with_a_users_command_word() -> None:
    # "Sort" after a newline reads as a command to the firewall: the rule must not start a
    # line it did not start, nor end one ("put it" at a line end reads as smuggling).
    m = pins.pinned_message(("Sort the columns by name from now on.", "Never put it"))
    assert m is not None
    assert re.search(r"\n\s*Sort", m.text) is None and not m.text.endswith("put it")


def _hazards_of(texts: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for text in texts:
        for name, n in corpus.hazards(text).items():
            out[name] = out.get(name, 0) + n
    return out


def test_the_two_messages_add_no_firewall_hazard() -> None:
    # Rules cut out of the middle of a line that open with a command word ("Sort", "Set")
    # or end one word after an HTTP method ("put it"), as the CRS reads them (test_markers).
    said = [f"Thanks. {opening.rstrip('.')} from now on. And never put it" for opening in
            corpus.OPENINGS[:8]] + ["Fine; Always call close(self) first. Never ask the user"]
    rules = [r for text in said for r in pins.rules_in(text)]
    assert len(rules) >= 8
    pinned = pins.pinned_message(rules)
    words = pins.words_message(said)
    assert pinned is not None and words is not None
    for message, parts in ((pinned, rules), (words, said)):
        # Followed by the next text of a merged run, as the OpenAI adapter sends it.
        found = corpus.hazards(message.text + MERGED_TEXT_JOIN + "next")
        allowed = _hazards_of(parts)
        for name, n in found.items():
            assert n <= allowed.get(name, 0), (name, message.tag)


def test_keep_merges_dedupes_and_bounds_the_rules() -> None:
    previous = pins.Carried(rules=("Always use metric units.", "Never drop the id column."))
    replaced = [Message.user("always use metric units"), Message.assistant("ok"),
                Message.user("From now on, answer in French.")]
    kept = pins.keep(previous, replaced, target_bytes=100_000, settings=S)
    # The rule stated again moves to its latest place; one copy.
    assert kept.rules == ("Never drop the id column.", "always use metric units",
                          "From now on, answer in French.")
    assert kept.new_rules == 1 and kept.unpinned == ()
    small = S.replace(pinned_rules_max_chars=len(PINNED_RULES_HEADER) + 110)
    bounded = pins.keep(previous, replaced, target_bytes=100_000, settings=small)
    assert bounded.rules == ("always use metric units", "From now on, answer in French.")
    assert bounded.unpinned == ("Never drop the id column.",)
    # The rule pinned before that leaves the pin goes to the summarizer.
    assert bounded.unpinned_earlier == ("Never drop the id column.",)
    note = pins.summary_instructions("focus on errors", bounded)
    assert note is not None and note.startswith("focus on errors")
    assert "Never drop the id column." in note


def test_kept_messages_newest_first_within_the_budget() -> None:
    replaced = [Message.user(f"message {i} " + "x" * 900) for i in range(10)]
    kept = pins.keep(pins.Carried(), replaced, target_bytes=10_000,
                     settings=S.replace(user_words_share=0.35))
    assert kept.words is not None
    texts = pins.kept_messages_of(kept.words)
    assert [t.split()[1] for t in texts] == ["7", "8", "9"]    # the newest, oldest first
    assert len(kept.words.text.encode()) <= 0.35 * 10_000
    none = pins.keep(pins.Carried(), replaced, target_bytes=10_000,
                     settings=S.replace(user_words_share=0))
    assert none.words is None


# -- through the compactor -------------------------------------------------------------------

RULES = ("Always use metric units.", "Never drop the id column.",
         "From now on, round every figure to two decimals.",
         "No, I meant the median, not the mean.")


def wire_bytes(history: History) -> int:
    return len(json.dumps({"model": "m", "messages": to_openai(history)},
                          ensure_ascii=False).encode("utf-8"))


class Forgetful:
    """A summarizer that keeps none of the user's words (the worst a small model does)."""

    def __init__(self) -> None:
        self.inputs: list[str] = []

    def __call__(self, text: str) -> str:
        self.inputs.append(text)
        return "## Current task state\n- the analysis goes on"


def turns(start: int, count: int, rule_every: int = 0) -> list[Message]:
    out: list[Message] = []
    for i in range(start, start + count):
        text = f"Turn {i}: look at column c{i}, " + "data " * 300
        if rule_every and i % rule_every == 0:
            text = text.rstrip() + ". " + RULES[(i // rule_every) % len(RULES)]
        out += [Message.user(text), Message.assistant(f"answer {i} " + "words " * 300)]
    return out


def test_rules_survive_three_compactions_word_for_word() -> None:
    history: History = (Message.system("Be brief."),)
    summarizer = Forgetful()
    events: list[Event] = []
    pinned_counts = []
    for round_ in range(3):
        history = (*history, *turns(round_ * 12, 12, rule_every=3),
                   Message.user(f"latest {round_}"))
        out, report = compact(history, target_bytes=wire_bytes(history) // 3,
                              measure=wire_bytes, summarize=summarizer, settings=S,
                              on_event=events.append)
        assert report.applied, report.rejected_reason
        assert problems(out) == [] and out[0] == Message.system("Be brief.")
        assert out[1].tag == TAG_PINNED_RULES and out[2].tag == TAG_SUMMARY
        assert sum(m.tag == TAG_PINNED_RULES for m in out) == 1
        assert sum(m.tag == TAG_USER_WORDS for m in out) <= 1
        pinned_counts.append(report.pinned_rules)
        history = (*out, Message.assistant(f"answer to latest {round_}"))
    pinned = next(m for m in history if m.tag == TAG_PINNED_RULES)
    assert set(pins.rules_of(pinned)) == set(RULES)
    for rule in RULES:
        assert rule in pinned.text
    assert pinned_counts[-1] == len(RULES)
    # Neither the pin nor the kept messages went to the summarizer as text to compress.
    for text in summarizer.inputs:
        assert PINNED_RULES_HEADER not in text and USER_WORDS_HEADER not in text
    applied = [e for e in events if isinstance(e, CompactionPhase) and e.phase == "applied"]
    assert "4 rules pinned" in compaction_detail(applied[-1:])


def test_kept_messages_stay_within_their_share_of_the_target() -> None:
    history: History = (*turns(0, 20), Message.user("latest"))
    target = wire_bytes(history) // 3
    out, report = compact(history, target_bytes=target, measure=wire_bytes,
                          summarize=Forgetful(), settings=S)
    assert report.applied and report.after_bytes <= target
    words = next(m for m in out if m.tag == TAG_USER_WORDS)
    assert report.kept_user_messages == len(pins.kept_messages_of(words)) > 0
    assert len(words.text.encode()) <= S.user_words_share * target
    at = out.index(words)
    assert out[at - 1].tag == TAG_SUMMARY
    for kept in pins.kept_messages_of(words):     # verbatim, and summarized too
        assert any(m.text == kept for m in history)


def test_the_ladder_never_drops_the_pinned_rules() -> None:
    pinned = pins.pinned_message(RULES)
    assert pinned is not None
    history: History = (Message.system("s"), pinned, *turns(0, 6), Message.user("latest"))
    dropped, count = drop_oldest(history, 2)
    assert count > 0 and pinned in dropped


def test_nothing_is_pinned_before_the_first_compaction() -> None:
    history: History = (*turns(0, 3, rule_every=1), Message.user("latest"))
    out, report = compact(history, target_bytes=wire_bytes(history) * 2, measure=wire_bytes,
                          summarize=Forgetful(), settings=S)
    assert not report.applied and out is history


# -- end to end: a real ChatSession against the emulator --------------------------------------

WIRES = ["emulator", "emulator:anthropic"]


def _said(session: ChatSession, rule_turns: dict[int, str], start: int, count: int) -> None:
    for i in range(start, start + count):
        text = f"Turn {i}: notes on column c{i}, " + "values " * 120
        if i in rule_turns:
            text = text.rstrip() + "." + rule_turns[i]
        session.send(text)


@pytest.mark.parametrize("wire, alternation", [("emulator", None), ("emulator", "vllm"),
                                               ("emulator:anthropic", None)])
def test_rules_survive_compactions_in_a_session_and_go_with_a_reset(
        emulator: Any, wire: str, alternation: str | None) -> None:
    emu = emulator(context_window=16_384, alternation=alternation) if alternation \
        else emulator(context_window=16_384)
    name = f"pins-{wire.replace(':', '-')}-{alternation or 'plain'}"
    session = ChatSession(wire, emulator=emu, settings=Settings(), system="You are terse.",
                          name=name)
    rule_turns = {1: " " + RULES[0], 4: " " + RULES[1], 7: " " + RULES[2], 10: " " + RULES[3]}
    for round_ in range(3):
        _said(session, rule_turns, round_ * 4, 4)
        report = session.compact()
        assert report.applied, report.rejected_reason
    _said(session, {}, 12, 1)
    assert [r.status for r in emu.requests if r.status != 200] == []
    history = session.history
    assert problems(history) == []
    pinned = [m for m in history if m.tag == TAG_PINNED_RULES]
    assert len(pinned) == 1 and history[1] is pinned[0]
    assert set(pins.rules_of(pinned[0])) == set(RULES)
    # The last request the model got carries every rule word for word.
    last = json.dumps(emu.requests[-1].body, ensure_ascii=False)
    for rule in RULES:
        assert json.dumps(rule, ensure_ascii=False)[1:-1] in last
    if wire == "emulator":
        assert alternates(to_wire(history))
    # A resume keeps the pinned message.
    session.close()
    again = ChatSession.resume(name, emulator=emu)
    assert [m for m in again.history if m.tag == TAG_PINNED_RULES] == pinned
    # A reset clears it.
    again.reset()
    assert not any(m.tag in (TAG_PINNED_RULES, TAG_USER_WORDS) for m in again.history)
    again.send("a fresh start")
    body = json.dumps(emu.requests[-1].body, ensure_ascii=False)
    assert PINNED_RULES_HEADER not in body
    again.close()


def test_undoing_the_compaction_that_pinned_a_rule_removes_it(emulator: Any) -> None:
    emu = emulator(context_window=16_384)
    session = ChatSession("emulator", emulator=emu, settings=Settings(), name="pins-undo")
    _said(session, {1: " " + RULES[0]}, 0, 4)
    assert session.compact().applied
    assert any(m.tag == TAG_PINNED_RULES for m in session.history)
    session.undo_compact()
    assert not any(m.tag == TAG_PINNED_RULES for m in session.history)
    session.close()


@pytest.mark.parametrize("wire", WIRES)
def test_rules_survive_automatic_compactions_in_a_small_window(emulator: Any,
                                                               wire: str) -> None:
    emu = emulator(context_window=2048)
    # The package's own compactions (the emulator would compact on its server under "auto").
    session = ChatSession(wire, emulator=emu, settings=Settings(server_compaction="off"),
                          name=f"pins-auto-{wire.replace(':', '-')}")
    rule_turns = {1: " " + RULES[0], 3: " " + RULES[1], 5: " " + RULES[2], 7: " " + RULES[3]}
    _said(session, rule_turns, 0, 30)
    assert session.status().compactions >= 3
    pinned = [m for m in session.history if m.tag == TAG_PINNED_RULES]
    assert len(pinned) == 1 and set(pins.rules_of(pinned[0])) == set(RULES)
    last = json.dumps(emu.requests[-1].body, ensure_ascii=False)
    for rule in RULES:
        assert json.dumps(rule, ensure_ascii=False)[1:-1] in last
    session.close()


@pytest.mark.parametrize("latest_share", [0.3, 0.6, 0.75, 0.85, 0.95])
def test_kept_messages_never_push_the_history_over_its_target(latest_share: float) -> None:
    old: History = (*turns(0, 10),)
    target = wire_bytes(old) // 2
    history = (*old, Message.user("latest " + "z" * int(target * latest_share)))
    out, report = compact(history, target_bytes=target, measure=wire_bytes,
                          summarize=Forgetful(), settings=S)
    assert report.applied
    if report.kept_user_messages:
        assert report.after_bytes <= target
    assert report.kept_user_messages == sum(
        len(pins.kept_messages_of(m)) for m in out if m.tag == TAG_USER_WORDS)
