"""core/summary_check: a summary is refused, with one short reason, for each way a model
was seen to write something else (issue 27, against SmolLM2-135M on llama-cpp-python)."""

from __future__ import annotations

import pytest

from ipy_ctxrecovery.core import markers
from ipy_ctxrecovery.core.facts import FACTS_HEADING, extract
from ipy_ctxrecovery.core.prompts import SUMMARIZE_SYSTEM_PROMPT, summary_header
from ipy_ctxrecovery.core.summary_check import MIN_FACTS, refusal, without_preface

REPLACED = extract([
    "Load data/raw/sales_2024.csv into df: 1,234 rows, 12 columns, 3.2 GB.",
    "The `unit_cost` column has a 12% lift for Acme Corp; the p-value is 0.05.",
])
GOOD = ("## Goal and constraints\n- compare regions; never drop the outliers\n"
        "## Data and variables\n- df from data/raw/sales_2024.csv: 1,234 rows, 12 columns\n"
        "## Results and figures\n- unit_cost lift 12%, p-value 0.05\n"
        "## Open questions\n- should Acme Corp be split by region?\n"
        "## Current step\n- the regional plot")

ANSWERS = "the summarizer answered the conversation instead of summarizing it"
FRAMING = "the summary is mostly the summarizer's own framing, not the conversation"


def test_a_real_summary_passes() -> None:
    assert refusal(GOOD, facts=REPLACED) is None
    assert refusal("Here is the summary:\n" + GOOD, facts=REPLACED) is None
    assert refusal("Sure! Here's a summary of the conversation:\n\n" + GOOD,
                   facts=REPLACED) is None
    assert without_preface("Sure, here is the summary:\n\n" + GOOD) == GOOD
    assert without_preface(GOOD) == GOOD


def test_cut_at_its_own_max_tokens() -> None:
    assert refusal(GOOD[:90], facts=REPLACED, truncated=True) == \
        "the summary was cut off at its own max_tokens"


@pytest.mark.parametrize("text", [
    "I'm ready to help. What's your next question?",
    "Hello! How can I help you today?",
    "Sure, here is the code you asked for:\n\ndf.groupby('region').mean()",
    "Here is the continuation: the regional plot shows 1,234 rows.",
    "The data has 1,234 rows and 12 columns.\n\nWhich region should I plot first?",
])
def test_an_answer_instead_of_a_summary(text: str) -> None:
    assert refusal(text, facts=REPLACED) == ANSWERS


@pytest.mark.parametrize("text", [
    markers.omitted_note(6, 12_000),
    "[6 older messages (4812 chars) omitted from this input to bound its size]",
    f"{markers.label(3, 12, markers.SummaryLabel('user'))} {markers.end_mark(3)}\n"
    f"{markers.label(4, 12, markers.SummaryLabel('assistant'))} {markers.end_mark(4)}",
    "[message 3 of 12, from the user] ok [end of message 3]",
    markers.preamble(12),
    SUMMARIZE_SYSTEM_PROMPT,
    f"{summary_header(12)}\n## Goal and constraints\n- none\n## Current step\n- none",
])
def test_mostly_the_prompts_or_the_inputs_own_framing(text: str) -> None:
    assert refusal(text, facts=REPLACED) == FRAMING


def test_keeps_none_of_the_inputs_facts() -> None:
    text = "The previous message was cut off at token limit."
    assert refusal(text, facts=REPLACED) == \
        f"the summary keeps none of the {len(REPLACED)} facts of the messages it replaces"
    assert refusal(text, facts=()) is None                  # an input without facts
    few = REPLACED[:MIN_FACTS - 1]
    assert refusal(text, facts=few) is None                 # too few to judge by
    assert refusal(text + " It had 3.2 GB.", facts=REPLACED) is None


def test_an_earlier_fact_list_counts_as_kept_facts() -> None:
    listed = f"## Current step\n- the plot\n\n{FACTS_HEADING}\n- 3.2 GB\n- unit_cost"
    assert refusal(listed, facts=REPLACED) is None
