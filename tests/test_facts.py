"""core/facts: the facts of the messages a summary replaces, which it lost, and their list."""

from __future__ import annotations

import re

import waf_corpus as corpus

from ipy_ctxrecovery.core.facts import (
    FACTS_HEADING,
    Fact,
    FactCheck,
    append_missing,
    extract,
    missing,
)

NOTEBOOK = [
    "Load data/raw/sales_2024.csv into df. It has 1,234 rows and 12 columns; memory is 3.2 GB.",
    "df.groupby(\"region\") gave a p-value of 0.05 and a 12% lift for Acme Corp. The "
    "`price usd` column and `unit_cost` matter. The deadline is 2026-11-30, see "
    "https://example.com/report?id=3&token=[REDACTED]. We fit maxDepth on a DataFrame "
    "with XGBoost 2.0.3 on Python 3.11, seed=42. Revenue grew; revenue is up in São Paulo, "
    "\"well above plan\". That was step 2 of 3 for request 12.",
]


def texts(facts: tuple[Fact, ...]) -> list[str]:
    return [f.text for f in facts]


def test_each_kind_is_taken_verbatim_with_its_message() -> None:
    facts = extract(NOTEBOOK)
    kinds = {f.text: f.kind for f in facts}
    assert kinds == {
        "data/raw/sales_2024.csv": "path", "1,234 rows": "number", "12 columns": "number",
        "3.2 GB": "number", "df.groupby": "identifier", "0.05": "number", "12%": "number",
        "Acme Corp": "name", "price usd": "quoted", "unit_cost": "identifier",
        "2026-11-30": "date", "https://example.com/report?id=3&token=": "url",
        "maxDepth": "identifier", "DataFrame": "identifier", "XGBoost": "identifier",
        "2.0.3": "number", "Python": "name", "3.11": "number", "42": "number",
        "São Paulo": "name", "well above plan": "quoted",
    }
    # Not facts: a common word opening a sentence ("Revenue", "The", "That"), an ordinal
    # or a count of one or two digits ("step 2", "request 12"), the redaction mark.
    assert {f.message for f in facts if f.text == "3.2 GB"} == {0}
    assert {f.message for f in facts if f.text == "Acme Corp"} == {1}


def test_deduplicated_and_ordered_by_last_occurrence() -> None:
    facts = extract(["the unit_cost is 3.2 GB", "path a/b.csv", "again unit_cost"])
    assert texts(facts) == ["3.2 GB", "a/b.csv", "unit_cost"]
    assert facts[-1].message == 2
    assert texts(extract("3.2 GB then 3.2GB")) == ["3.2GB"]      # one value and unit


def test_numbers_compare_by_value_and_unit() -> None:
    facts = extract("1,234 rows, 3.2 GB, 12%, 0.05 and $1,200")
    assert missing(facts, "1234 rows; 3.20GB; 12 percent; 0.050; 1200 USD") == ()
    assert texts(missing(facts, "1,234 columns, 3.2 MB, 12, 0.5, $1,300")) == \
        ["1,234 rows", "3.2 GB", "12%", "0.05", "$1,200"]
    assert missing(extract("seed=42"), "the seed was 42 runs") == ()    # a bare value


def test_identifiers_and_paths_exactly_names_and_quotes_ignoring_case() -> None:
    facts = extract(["call df.groupby on `unit_cost` from data/x.csv for Acme Corp, "
                     "\"well above plan\""])
    assert texts(missing(facts, "DF.groupby on unit_costs from data/x.csv.bak")) == \
        ["df.groupby", "unit_cost", "data/x.csv", "Acme Corp", "well above plan"]
    assert missing(facts, "df.groupby() on unit_cost, data/x.csv: acme  corp, WELL above "
                   "plan") == ()


def test_missing_facts_are_appended_most_recent_first_within_the_bound() -> None:
    facts = extract(NOTEBOOK)
    summary = "## Results and figures\n- 3.2GB of sales, 1234 rows, 12 cols"
    text, check = append_missing(summary, facts, 10_000)
    lost = missing(facts, summary)
    assert check == FactCheck(total=len(facts), kept=len(facts) - len(lost), added=len(lost),
                              left_out=0)
    assert check.kept == 3
    head, listed = text.split(f"\n\n{FACTS_HEADING}\n")
    assert head == summary
    assert listed.splitlines() == [f"- {f.text}" for f in reversed(lost)]
    assert missing(facts, text) == ()

    bound = len(summary) + len(FACTS_HEADING) + 2 + 40
    short, check = append_missing(summary, facts, bound)
    assert len(short) <= bound
    shown = short.split(f"{FACTS_HEADING}\n")[1].splitlines()
    assert shown == [f"- {f.text}" for f in reversed(lost)][:len(shown)]
    assert check.added == len(shown) and check.left_out == len(lost) - len(shown) > 0
    # the next fact would not have fit
    assert len(short) + 1 + len(f"- {list(reversed(lost))[len(shown)].text}") > bound


def test_nothing_missing_or_no_room_leaves_the_summary_as_it_was() -> None:
    facts = extract("3.2 GB of unit_cost")
    assert append_missing("3.2 GB of unit_cost", facts, 1_000) == \
        ("3.2 GB of unit_cost", FactCheck(2, 2, 0, 0))
    assert append_missing("nothing", facts, 20) == ("nothing", FactCheck(2, 0, 0, 2))
    assert append_missing("nothing", (), 1_000) == ("nothing", FactCheck())


def test_the_list_starts_no_command_and_ends_no_line_after_a_method() -> None:
    facts = extract(['"please put it"', "Set the timeout to 30 s in cfg/app.toml", "\"sort ok\"",
                     "`Format` and `head`"])
    text, check = append_missing("summary", facts, 1_000)
    listed = text.split(f"{FACTS_HEADING}\n")[1]
    assert "please put it" not in listed and check.left_out == 1    # 921110 at its line end
    assert all(line.startswith("- ") for line in listed.splitlines())
    hazards = corpus.hazards("\n" + text + "\n")
    assert hazards["932100-932115"] == hazards["921110"] == 0
    assert not re.search(r"[\[\]`]", listed)


def test_an_earlier_summarys_list_is_read_a_fact_a_line() -> None:
    earlier = f"## Current step\n- going on\n\n{FACTS_HEADING}\n- Acme\n- unit_cost\n- 3.2 GB"
    assert texts(extract([earlier, "more"])) == ["Acme", "unit_cost", "3.2 GB"]


def test_a_list_from_the_developers_conversation_reads_as_nothing_to_a_firewall() -> None:
    import random

    r = random.Random(5)
    texts = [*corpus.code_turns(1, 8), *corpus.tool_turns(2, 8),
             *(corpus.tool_result(r) for _ in range(4)), *(corpus.reply(r) for _ in range(8))]
    facts = extract(texts)
    text, check = append_missing("## Current step\n- the fix", facts, 16_000)
    assert check.added > 20
    listed = text.split(f"{FACTS_HEADING}\n")[1]
    hazards = corpus.hazards("\n" + listed + "\n")
    assert hazards["932100-932115"] == hazards["921110"] == 0
    assert hazards["941370-close"] == 0 and "`" not in listed
