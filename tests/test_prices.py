"""core/prices: the price table, the user's overrides, and what a usage cost."""

from __future__ import annotations

import pytest

from ipy_ctxrecovery.core import prices
from ipy_ctxrecovery.core.catalogue import MODELS
from ipy_ctxrecovery.core.prices import PRICES, Price, estimate, price_for
from ipy_ctxrecovery.errors import ConfigError
from ipy_ctxrecovery.providers.base import Usage
from ipy_ctxrecovery.settings import Settings, parse_prices


def test_every_priced_family_is_a_catalogue_model() -> None:
    assert set(PRICES) <= set(MODELS)


def test_anthropic_cache_writes_cost_a_quarter_more_and_reads_a_tenth() -> None:
    for name, p in PRICES.items():
        if name.startswith("claude-") and p.input:
            assert p.write == pytest.approx(1.25 * p.input, rel=0.05), name  # Haiku 3: $0.30
            assert p.cached <= 0.12 * p.input, name


def test_a_dated_id_takes_its_family_price_and_the_longest_family_wins() -> None:
    assert price_for("gpt-4o-2024-08-06") == PRICES["gpt-4o"]
    assert price_for("gpt-4o-mini-2024-07-18") == PRICES["gpt-4o-mini"]
    assert price_for("anthropic:claude-opus-4-1-20250805") == PRICES["claude-opus-4-1"]


def test_a_model_without_a_price_is_price_unknown() -> None:
    assert price_for("llama-3-70b") is None
    assert estimate("llama-3-70b", Usage(1000, 10)) is None


def test_estimate_splits_the_input_as_reported() -> None:
    # claude-sonnet-4: $3 in, $0.30 read, $3.75 write, $15 out per million.
    cost = estimate("claude-sonnet-4", Usage(1_000_000, 100_000, cached_tokens=600_000,
                                             cache_write_tokens=300_000))
    assert cost is not None
    assert cost.uncached_input == pytest.approx(0.30)
    assert cost.cached_input == pytest.approx(0.18)
    assert cost.cache_write == pytest.approx(1.125)
    assert cost.output == pytest.approx(1.5)
    assert cost.total == pytest.approx(3.105)


def test_an_openai_cache_write_is_billed_as_input() -> None:
    cost = estimate("gpt-4o", Usage(2_000_000, 0, cached_tokens=1_000_000,
                                    cache_write_tokens=1_000_000))
    assert cost is not None and cost.input == pytest.approx(2.5 + 1.25)


def test_the_user_overrides_a_price_and_adds_a_model() -> None:
    overrides = "gpt-4o=1/0.5/0/2, my-local=0.1/0.01/0/0.2"
    assert price_for("gpt-4o", overrides) == Price(1.0, 0.5, 0.0, 2.0)
    assert price_for("my-local-7b", overrides) == Price(0.1, 0.01, 0.0, 0.2)
    assert price_for("gpt-4o") == PRICES["gpt-4o"]       # the table itself is unchanged
    json_form = '{"my-local": {"input": 1, "cached": 0.1, "write": 1.25, "output": 5}}'
    assert price_for("my-local", json_form) == Price(1.0, 0.1, 1.25, 5.0)


def test_the_prices_setting_from_the_environment() -> None:
    s = Settings.from_env({"CHATCLI_PRICES": "gpt-4o=1/0.5/0/2"})
    assert s.prices == "gpt-4o=1/0.5/0/2"
    assert prices.price_for("gpt-4o", s.prices) == Price(1.0, 0.5, 0.0, 2.0)


@pytest.mark.parametrize("bad", ["gpt-4o", "gpt-4o=1/2/3", "gpt-4o=1/2/x/4", "gpt-4o=-1/0/0/1",
                                 "{not json", '["a"]', '{"a": [1, 2]}', ",", "=1/1/1/1",
                                 '{"a": [1, true, 0, 2]}', '{"a": {"input": false, "cached": 0, '
                                 '"write": 0, "output": 1}}'])
def test_a_malformed_price_is_one_sentence(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"CHATCLI_PRICES": bad})
    said = str(info.value)
    assert said.startswith("CHATCLI_PRICES") and said.endswith(".") and "\n" not in said
    assert "in/cached/write/out" in said
    with pytest.raises(ConfigError):
        parse_prices(bad)


def test_the_json_example_a_malformed_price_gives_works_where_it_is_typed() -> None:
    # The example was unquoted: typed on a %chat config line, IPython's argument split takes
    # its double quotes off and the JSON no longer parses. In single quotes it survives that
    # split, as it does a shell's export.
    import shlex

    from ipy_ctxrecovery.settings import PRICE_FORMS

    example = PRICE_FORMS[PRICE_FORMS.index("'"):]
    (word,) = shlex.split(f"prices={example}")
    assert parse_prices(word.partition("=")[2]) == {"gpt-4o": (2.5, 1.25, 0.0, 10.0)}


def test_a_summary_is_priced_against_what_it_removes() -> None:
    # 30,000 × $2.50 + 2,000 × $10 = $0.095; 80,000 removed tokens × $2.50 = $0.20.
    paid, saved = prices.summary_usd("gpt-4o", 30_000, 2_000, 80_000)
    assert (paid, saved) == (pytest.approx(0.095), pytest.approx(0.20))
    assert prices.summary_usd("my-local", 1, 1, 1) == (None, None)
    assert prices.summary_usd("emulator", 1, 1, 1) == (None, None)    # bills nothing
    assert prices.summary_usd("my-local", 1_000_000, 0, 0, "my-local=1/0/0/1")[0] == 1.0
