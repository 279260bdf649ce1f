"""Model catalogue: longest family match, dated ids and aliases, overrides, guesses."""

from __future__ import annotations

import pytest

from ipy_ctxrecovery.core.catalogue import MODELS, lookup


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
        # 2026 lineup (see the source comments in catalogue.py)
        ("claude-opus-5-5", 1_000_000, 128_000),
        ("anthropic:claude-sonnet-5-5", 1_000_000, 128_000),
        ("claude-haiku-5-5", 1_000_000, 128_000),
        ("claude-fable-5-2", 1_000_000, 128_000),
        ("us.anthropic.claude-opus-4-8-v1:0", 1_000_000, 128_000),
        ("claude-haiku-4-5-20251001", 200_000, 64_000),
        ("claude-opus-4-5-20251101", 200_000, 64_000),
        ("gpt-6.2-sol", 1_050_000, 128_000),
        ("openrouter/openai/gpt-6-astra", 1_050_000, 128_000),
        ("gpt-5.5-2026-04-23", 1_050_000, 128_000),
        ("gpt-5.4-mini-2026-03-17", 400_000, 128_000),
        ("gpt-5.4-nano-2026-03-17", 400_000, 128_000),
        ("gpt-5.2-pro-2025-12-11", 400_000, 128_000),
        ("gpt-5.1-2025-11-13", 400_000, 128_000),
        ("gpt-5.3-chat-latest", 128_000, 16_384),
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


@pytest.mark.parametrize(
    ("model", "window", "output"),
    [
        # A newer family that extends an older one's name must not inherit the older limits.
        ("claude-opus-4-6", 1_000_000, 128_000),
        ("claude-opus-4-20250514", 200_000, 32_000),
        ("claude-opus-4-1-20250805", 200_000, 32_000),
        ("claude-sonnet-4-6", 1_000_000, 128_000),
        ("claude-sonnet-4-20250514", 200_000, 64_000),
        ("claude-sonnet-5", 1_000_000, 128_000),
        ("claude-sonnet-5-5", 1_000_000, 128_000),
        ("gpt-6-sol", 1_050_000, 128_000),
        ("gpt-6.1-sol", 1_050_000, 128_000),
        ("gpt-5.6", 1_050_000, 128_000),
        ("gpt-5.6-luna", 1_050_000, 128_000),
        ("gpt-5.4", 1_050_000, 128_000),
        ("gpt-5.4-mini", 400_000, 128_000),
        ("gpt-5.2", 400_000, 128_000),
        ("gpt-5.2-chat-latest", 128_000, 16_384),
        ("gpt-5.1-chat-latest", 128_000, 16_000),
        ("gpt-5-chat-latest", 128_000, 16_384),
        ("gpt-5-mini-2025-08-07", 400_000, 128_000),
        # gpt-5.1-codex has no row of its own: it shares gpt-5.1's 400K / 128K.
        ("gpt-5.1-codex", 400_000, 128_000),
    ],
)
def test_longer_families_win_over_their_prefixes(model: str, window: int, output: int) -> None:
    info = lookup(model)
    assert (info.context_window, info.max_output_tokens) == (window, output)
    assert not info.guessed


def test_shorter_family_rows_keep_their_own_limits() -> None:
    # The pairs above only prove something if both sides are in the table with different numbers.
    assert MODELS["claude-opus-4"] != MODELS["claude-opus-4-6"]
    assert MODELS["gpt-5.2"] != MODELS["gpt-5.2-chat"]
    assert MODELS["gpt-5.4"] != MODELS["gpt-5.4-mini"]
    assert "claude-sonnet-5-5" in MODELS and "claude-sonnet-5" in MODELS


@pytest.mark.parametrize(
    "model",
    ["claude-mythos-preview", "codex-mini-latest", "gpt-audio-mini", "gpt-6", "gpt-6.1", "claude-opus-55",
     "gpt-6-solar"],
)
def test_unsourced_or_unknown_ids_are_guessed(model: str) -> None:
    info = lookup(model)
    assert info.guessed
    assert (info.context_window, info.max_output_tokens) == (8_192, 4_096)
