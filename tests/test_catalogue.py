"""Model catalogue: longest family match, dated ids and aliases, overrides, guesses."""

from __future__ import annotations

import pytest

from ipy_ctxrecovery.catalogue import MODELS, lookup


@pytest.mark.parametrize(
    ("model", "window", "output"),
    [
        ("gpt-4o", 128_000, 16_384),
        ("openai:gpt-4o-mini", 128_000, 16_384),
        ("gpt-4o-mini-2024-07-18", 128_000, 16_384),
        ("gpt-4-0613", 8_192, 8_192),
        ("gpt-4-turbo-2024-04-09", 128_000, 4_096),
        ("gpt-4.1-mini-2025-04-14", 1_047_576, 32_768),
        ("o3-mini-2025-01-31", 200_000, 100_000),
        ("claude-sonnet-4-5-20250929", 200_000, 64_000),
        ("anthropic:claude-sonnet-4-20250514", 200_000, 64_000),
        ("claude-3-5-sonnet-latest", 200_000, 8_192),
        ("claude-opus-4-1-20250805", 200_000, 32_000),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", 200_000, 8_192),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000),
        ("openrouter/openai/gpt-4o", 128_000, 16_384),
        ("emulator", 8_192, 4_096),
    ],
)
def test_known_models_resolve_to_the_most_specific_family(model: str, window: int, output: int) -> None:
    info = lookup(model)
    assert (info.context_window, info.max_output_tokens) == (window, output)
    assert not info.guessed


@pytest.mark.parametrize("model", ["gpt-4omega", "o30", "claude-sonnet-45", "llama3:70b", "mistral-large"])
def test_no_substring_collisions_and_unknown_models_are_guessed(model: str) -> None:
    info = lookup(model)
    assert info.guessed
    assert info.context_window == 8_192


def test_context_window_override_wins_and_is_not_a_guess() -> None:
    info = lookup("llama3", context_window=131_072)
    assert info.context_window == 131_072 and not info.guessed and info.window_overridden
    assert lookup("gpt-4o", context_window=2_048).max_output_tokens == 2_048


def test_every_family_resolves_to_itself() -> None:
    for family, (window, output) in MODELS.items():
        info = lookup(family)
        assert (info.context_window, info.max_output_tokens) == (window, output), family
