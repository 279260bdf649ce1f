"""Prices: what a request cost, from the provider's usage and a price table (pure).

:data:`PRICES` holds USD per million tokens for the catalogue's model families (input,
cached read, cache write, output); every entry can be overridden, and models added, with
the ``prices`` setting (``CHATCLI_PRICES``; :func:`~ipy_ctxrecovery.settings.parse_prices`).
A model with no price is "price unknown": :func:`estimate` returns None, never a guess.

Lookup follows the catalogue's rule (``catalogue.family``): exact id or the longest family
at a ``-`` boundary, so dated ids and ``-latest`` aliases share their family's price.

Tokens are counted as the providers report them: ``prompt_tokens`` is the whole input,
of which ``cached_tokens`` were read from the cache and ``cache_write_tokens`` written to
it (Anthropic's 5-minute cache write, 1.25× input; ``cache_write_1h_tokens`` of them with
the one-hour TTL, 2× input, ``caching.WRITE_SHARE``); the rest is uncached input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..settings import parse_prices
from .caching import LONG_TTL, WRITE_SHARE
from .catalogue import family

__all__ = ["PRICES", "Cost", "Price", "TokenUsage", "estimate", "price_for", "summary_usd"]


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    cached: float
    """A cached read (OpenAI's cached input, Anthropic's cache hit)."""
    write: float
    """A cache write (Anthropic's 5-minute write; 0 where writing costs nothing extra:
    OpenAI bills a write as ordinary input, see :func:`estimate`)."""
    output: float

    @property
    def free(self) -> bool:
        """Nothing is billed (the built-in emulator's price): no money is said."""
        return not (self.input or self.cached or self.write or self.output)


# USD per million tokens: (input, cached read, cache write (5 min), output).
# OpenAI (no cache-write price: a write is billed as input): gpt-4o, gpt-4o-mini, gpt-4.1
# family, gpt-4.5-preview, o1 from the openai_responses package's table of
# platform.openai.com/docs/pricing (hex.pm openai_responses 0.4.1, 2025-06-03) and the openai-models
# crate (openai.com/api/pricing); gpt-5 / 5-mini from chatgptpricing-akr.pages.dev/api-pricing
# (citing developers.openai.com/api/docs/pricing); o3 / o3-mini likewise; gpt-5.4 family and
# gpt-5.5 from morphllm.com/openai-api-pricing (June 2026, "as listed on the official pricing
# page") and the adk-model crate's table (March 2026); gpt-5.6 tiers and gpt-6-astra from the
# docs.apiyi.com model price list. Not found: the others (price unknown until set).
# Anthropic: platform.claude.com/docs pricing page (docs.anthropic.com/en/docs/about-claude/
# pricing: Opus 4/4.1, Sonnet 3.7/4, Haiku 3/3.5 with 5m cache writes and hits) and the model
# overview pages (platform.claude.com/docs/.../models/{opus-4-5,opus-5,opus-5-5}/overview);
# Opus 4.6/4.7 from the tokr crate's pricing.toml (same as Opus 4.5); Sonnet 4.5/4.6 and
# Haiku 4.5 at the published $3/$15 and $1/$5 with the standard 0.1× hit and 1.25× write;
# Sonnet 5.5 and Haiku 5.5 (prompt ≤ 100K) from the claudit and PromptFuel release notes
# (2026-10) re-checked against the pricing page.
PRICES: Mapping[str, Price] = {
    "gpt-4o": Price(2.50, 1.25, 0.0, 10.00),
    "gpt-4o-mini": Price(0.15, 0.075, 0.0, 0.60),
    "gpt-4.1": Price(2.00, 0.50, 0.0, 8.00),
    "gpt-4.1-mini": Price(0.40, 0.10, 0.0, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.0, 0.40),
    "gpt-4.5-preview": Price(75.00, 37.50, 0.0, 150.00),
    "o1": Price(15.00, 7.50, 0.0, 60.00),
    "o3": Price(2.00, 1.00, 0.0, 8.00),
    "o3-mini": Price(0.50, 0.25, 0.0, 2.00),
    "gpt-5": Price(1.25, 0.125, 0.0, 10.00),
    "gpt-5-mini": Price(0.25, 0.025, 0.0, 2.00),
    "gpt-5.4": Price(2.50, 0.25, 0.0, 15.00),
    "gpt-5.4-mini": Price(0.75, 0.075, 0.0, 4.50),
    "gpt-5.4-nano": Price(0.20, 0.02, 0.0, 1.25),
    "gpt-5.5": Price(5.00, 0.50, 0.0, 30.00),
    "gpt-5.6-sol": Price(4.00, 0.40, 0.0, 20.00),
    "gpt-5.6-terra": Price(2.00, 0.20, 0.0, 12.00),
    "gpt-5.6-luna": Price(0.20, 0.02, 0.0, 1.20),
    "gpt-6-astra": Price(10.00, 1.00, 0.0, 50.00),
    "claude-3-haiku": Price(0.25, 0.03, 0.30, 1.25),
    "claude-3-5-haiku": Price(0.80, 0.08, 1.00, 4.00),
    "claude-3-7-sonnet": Price(3.00, 0.30, 3.75, 15.00),
    "claude-sonnet-4": Price(3.00, 0.30, 3.75, 15.00),
    "claude-opus-4": Price(15.00, 1.50, 18.75, 75.00),
    "claude-opus-4-1": Price(15.00, 1.50, 18.75, 75.00),
    "claude-sonnet-4-5": Price(3.00, 0.30, 3.75, 15.00),
    "claude-haiku-4-5": Price(1.00, 0.10, 1.25, 5.00),
    "claude-opus-4-5": Price(5.00, 0.50, 6.25, 25.00),
    "claude-opus-4-6": Price(5.00, 0.50, 6.25, 25.00),
    "claude-opus-4-7": Price(5.00, 0.50, 6.25, 25.00),
    "claude-sonnet-4-6": Price(3.00, 0.30, 3.75, 15.00),
    "claude-opus-5": Price(5.00, 0.50, 6.25, 25.00),
    "claude-opus-5-5": Price(4.00, 0.20, 5.00, 20.00),
    "claude-sonnet-5": Price(2.00, 0.20, 2.50, 10.00),
    "claude-sonnet-5-5": Price(2.00, 0.10, 2.50, 10.00),
    "claude-haiku-5-5": Price(0.10, 0.01, 0.125, 0.50),
    # The built-in emulator bills nothing.
    "emulator": Price(0.0, 0.0, 0.0, 0.0),
}


class TokenUsage(Protocol):
    """What :func:`estimate` reads (``providers.base.Usage`` has it)."""

    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Cost:
    """An estimated cost in USD, by part."""

    uncached_input: float
    cached_input: float
    cache_write: float
    output: float

    @property
    def total(self) -> float:
        return self.uncached_input + self.cached_input + self.cache_write + self.output

    @property
    def input(self) -> float:
        return self.uncached_input + self.cached_input + self.cache_write


def price_for(model: str, overrides: str | None = None) -> Price | None:
    """The price of ``model``: the user's (``overrides``, the ``prices`` setting) first,
    then :data:`PRICES`; None when neither has it ("price unknown")."""
    table: dict[str, Price] = dict(PRICES)
    if overrides:
        table.update({name: Price(*values) for name, values in parse_prices(overrides).items()})
    name = family(model, table)
    return None if name is None else table[name]


def estimate(model: str, usage: TokenUsage, overrides: str | None = None) -> Cost | None:
    """What ``usage`` cost on ``model`` (None: price unknown).

    Uncached input is ``prompt_tokens − cached − written``; a write with no write price
    (OpenAI: there is none) is billed as input; a one-hour write (``cache_write_1h_tokens``,
    read where the usage has it) at ``WRITE_SHARE["1h"]`` of the input price.
    """
    price = price_for(model, overrides)
    if price is None:
        return None
    prompt = usage.prompt_tokens or 0
    cached = max(0, usage.cached_tokens or 0)
    written = max(0, usage.cache_write_tokens or 0)
    uncached = max(0, prompt - cached - written)
    write_price = price.write if price.write else price.input
    long = min(written, max(0, getattr(usage, "cache_write_1h_tokens", 0) or 0))
    long_price = price.input * WRITE_SHARE[LONG_TTL] if price.write else price.input
    per = 1_000_000
    return Cost(uncached_input=uncached * price.input / per,
                cached_input=cached * price.cached / per,
                cache_write=((written - long) * write_price + long * long_price) / per,
                output=(usage.completion_tokens or 0) * price.output / per)


def summary_usd(model: str, summary_input: int, summary_output: int, removed: int,
                overrides: str | None = None) -> tuple[float | None, float | None]:
    """(what a summary request cost, what the ``removed`` input tokens cost a later request
    at the uncached price): the turn card's and ``%chat compact``'s figures; (None, None)
    when the price is unknown, or nothing is billed (the emulator: "$0.0000" twice a
    line said nothing)."""
    price = price_for(model, overrides) if model else None
    if price is None or price.free:
        return None, None
    per = 1_000_000
    return ((summary_input * price.input + summary_output * price.output) / per,
            removed * price.input / per)
