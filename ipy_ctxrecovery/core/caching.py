"""The providers' prompt-caching rules, as data: one home for the numbers the Anthropic
adapter places its breakpoints by and the emulator accounts its caches by.

OpenAI caches the longest exact prefix of a prompt on its own: nothing is cached below
``OPENAI_MIN_CACHED_TOKENS`` (1,024), and ``prompt_tokens_details.cached_tokens`` grows in
steps of ``OPENAI_CACHE_STEP`` (128) past it. Anthropic caches only up to ``cache_control``
breakpoints the client sets: at most ``MAX_BREAKPOINTS`` (4) in a request, in the order
tools → system → messages; each breakpoint also finds an entry written at any of the
``LOOKBACK_BLOCKS`` (20) blocks before it; an entry lives ``5m`` (the default) or ``1h``
after its last use; a prefix shorter than the model's minimum cacheable length
(:func:`min_cacheable_tokens`) is never cached, and asking for it is no error.
"""

from __future__ import annotations

__all__ = [
    "BREAKPOINT",
    "CACHE_TTLS",
    "DEFAULT_TTL",
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "OPENAI_CACHE_STEP",
    "OPENAI_CACHE_TTL",
    "OPENAI_MIN_CACHED_TOKENS",
    "min_cacheable_tokens",
    "openai_cached_tokens",
    "too_many_breakpoints",
]

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
CACHE_TTLS = {"5m": 300.0, "1h": 3600.0}
"""Seconds an Anthropic cache entry lives after its last use, by ``cache_control.ttl``."""
DEFAULT_TTL = "5m"
BREAKPOINT = {"type": "ephemeral"}
"""The ``cache_control`` value the adapter sets (the SDK's ``CacheControlEphemeralParam``)."""

OPENAI_MIN_CACHED_TOKENS = 1024
OPENAI_CACHE_STEP = 128
OPENAI_CACHE_TTL = 300.0
"""Seconds an OpenAI prefix stays cached after its last use (5 to 10 minutes idle)."""

# (substring of the model id, minimum cacheable tokens), first match wins; Anthropic's
# table: 4,096 for Opus 4.5/4.6 and Haiku 4.5, 2,048 for Sonnet 4.6 and Haiku 3/3.5,
# 1,024 for the other Sonnets and Opuses.
_MINIMUMS = (
    ("opus-4-6", 4096), ("opus-4-5", 4096), ("haiku-4", 4096),
    ("sonnet-4-6", 2048), ("haiku", 2048),
)
_DEFAULT_MINIMUM = 1024


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix (tokens) Anthropic caches for ``model``; 1,024 for a model the
    table does not name (the emulator's)."""
    name = model.lower().replace(".", "-")
    return next((n for part, n in _MINIMUMS if part in name), _DEFAULT_MINIMUM)


def openai_cached_tokens(shared: int) -> int:
    """``cached_tokens`` for a prompt sharing ``shared`` leading tokens with a cached one:
    0 below 1,024, else ``shared`` rounded down to a multiple of 128."""
    if shared < OPENAI_MIN_CACHED_TOKENS:
        return 0
    return shared - shared % OPENAI_CACHE_STEP


def too_many_breakpoints(found: int) -> str:
    """The Anthropic API's 400 for more than four ``cache_control`` blocks."""
    return (f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}.")
