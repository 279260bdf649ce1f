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

How long a cache lives (the ``cache_retention`` setting, docs/caching.md "How long the cache
lives"): Anthropic's ``1h`` entries cost ``WRITE_SHARE["1h"]`` (2×) the input price to write
against ``5m``'s 1.25×, and :func:`long_ttl_pays` says when the pauses a session has taken
make them the cheaper; OpenAI's ``prompt_cache_retention`` (``in_memory``: 5 to 10 minutes
idle; ``24h``: up to a day) costs the same either way, and :func:`openai_retentions` says
which a model takes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .catalogue import family

__all__ = [
    "BREAKPOINT",
    "CACHE_TTLS",
    "EXTENDED_TTL_BETA",
    "LONG_TTL",
    "OPENAI_RETENTION_TTLS",
    "READ_SHARE",
    "WRITE_SHARE",
    "DEFAULT_TTL",
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "OPENAI_CACHE_STEP",
    "OPENAI_CACHE_TTL",
    "OPENAI_MIN_CACHED_TOKENS",
    "breakpoint",
    "long_life",
    "long_ttl_pays",
    "min_cacheable_tokens",
    "openai_cached_tokens",
    "openai_retentions",
    "too_many_breakpoints",
]

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
CACHE_TTLS = {"5m": 300.0, "1h": 3600.0}
"""Seconds an Anthropic cache entry lives after its last use, by ``cache_control.ttl``."""
DEFAULT_TTL = "5m"
LONG_TTL = "1h"
EXTENDED_TTL_BETA = "extended-cache-ttl-2025-04-11"
"""The beta a ``cache_control.ttl`` of ``1h`` needs: without it the API refuses the request
or keeps the entry five minutes (vellum-ai/vellum-assistant#22189,
griffinwork40/agent-afk#757)."""
BREAKPOINT = {"type": "ephemeral"}
"""The ``cache_control`` value the adapter sets (the SDK's ``CacheControlEphemeralParam``)."""
READ_SHARE = 0.1
"""A cached read's price as a share of uncached input (both providers' 0.1× on the models
the price table lists; OpenAI's older models read at 0.25–0.5×)."""
WRITE_SHARE = {"5m": 1.25, "1h": 2.0}
"""An Anthropic cache write's price as a share of uncached input, by TTL."""

OPENAI_MIN_CACHED_TOKENS = 1024
OPENAI_CACHE_STEP = 128
OPENAI_CACHE_TTL = 300.0
"""Seconds an OpenAI prefix stays cached after its last use (5 to 10 minutes idle)."""
OPENAI_RETENTION_TTLS = {"in_memory": OPENAI_CACHE_TTL, "24h": 86_400.0}
"""Seconds an OpenAI prefix stays cached, by ``prompt_cache_retention``."""

# OpenAI's prompt_cache_retention by family (developers.openai.com/api/docs/guides/
# prompt-caching#prompt-cache-retention and the SDK's field docs, openai 3.57): extended
# (24h) retention for gpt-4.1, gpt-5, gpt-5-codex, gpt-5.1 (codex, codex-mini, chat),
# gpt-5.2, gpt-5.3-codex and gpt-5.4; "for gpt-5.5, gpt-5.5-pro, and future models, only
# 24h is supported". From gpt-5.6 on the field is deprecated for ``prompt_cache_options``,
# whose ``ttl`` ("30m", the only value and the default) is a minimum life: nothing is sent
# there, and the cache is taken to live those 30 minutes. A family not listed takes
# in_memory only (nothing is sent). The emulator takes both, so the tests can see either.
_BOTH = ("in_memory", "24h")
_ONLY_24H = ("24h",)
_RETENTIONS = {
    "gpt-4.1": _BOTH, "gpt-4.1-mini": (), "gpt-4.1-nano": (),
    "gpt-5": _BOTH, "gpt-5-mini": (), "gpt-5-nano": (), "gpt-5-codex": _BOTH,
    "gpt-5.1": _BOTH, "gpt-5.2": _BOTH, "gpt-5.3-codex": _BOTH, "gpt-5.4": _BOTH,
    "gpt-5.4-mini": (), "gpt-5.4-nano": (),
    "gpt-5.5": _ONLY_24H, "gpt-5.6": (), "gpt-6": (),
    "emulator": _BOTH,
}
_MIN_LIFE = {"gpt-5.6": 1_800.0, "gpt-6": 1_800.0}
"""Families whose cache lives at least ``prompt_cache_options.ttl`` (30 minutes)."""

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


def breakpoint(ttl: str = DEFAULT_TTL) -> dict[str, str]:
    """The ``cache_control`` of a breakpoint whose entry lives ``ttl`` (``5m`` is the
    API's default and is not sent)."""
    return dict(BREAKPOINT) if ttl == DEFAULT_TTL else {**BREAKPOINT, "ttl": ttl}


def openai_retentions(model: str) -> tuple[str, ...]:
    """The ``prompt_cache_retention`` values ``model`` takes, the API's default for it
    first where it has only one (``()``: none may be sent, in-memory caching only)."""
    name = family(model, _RETENTIONS)
    return () if name is None else _RETENTIONS[name]


def long_life(wire: str | None, model: str) -> float | None:
    """Seconds a long-retention cache lives unused on ``wire`` for ``model`` (None: the
    model has no long retention, the short one applies)."""
    if wire == "anthropic":
        return CACHE_TTLS[LONG_TTL]
    if wire == "openai":
        if "24h" in openai_retentions(model):
            return OPENAI_RETENTION_TTLS["24h"]
        name = family(model, _MIN_LIFE)
        if name is not None:
            return _MIN_LIFE[name]
    return None


PAUSES_TO_SWITCH = 2
"""Pauses of 5 to 60 minutes :func:`long_ttl_pays` wants among ``gaps`` before it bets on
more: one may be an accident (a meeting), two are a habit."""


def long_ttl_pays(gaps: Sequence[float], prefix_tokens: float, written_tokens: float) -> bool:
    """Whether one-hour Anthropic entries cost less than five-minute ones, judged by the
    session's recent pauses between requests (``gaps``, seconds).

    A pause longer than five minutes but within the hour loses a ``5m`` cache: the next
    request writes its whole prefix again (``prefix_tokens`` at 1.25×) where a ``1h`` one
    reads it (0.1×). Every write costs 2× instead of 1.25× in exchange, on what a request
    adds (``written_tokens``, about the tokens written per request). With ``m`` the share of
    pauses in that range, long pays when ``m·(1.25 − 0.1)·P > (2 − 1.25)·W``, and when at
    least ``PAUSES_TO_SWITCH`` pauses say so. A pause past the hour loses both, and counts
    for neither.
    """
    short_life, long_life = CACHE_TTLS[DEFAULT_TTL], CACHE_TTLS[LONG_TTL]
    lost = sum(1 for g in gaps if short_life <= g < long_life)
    if lost < PAUSES_TO_SWITCH:
        return False
    saved_by = lost / len(gaps)
    short_write, long_write = WRITE_SHARE[DEFAULT_TTL], WRITE_SHARE[LONG_TTL]
    return saved_by * (short_write - READ_SHARE) * prefix_tokens \
        > (long_write - short_write) * max(0.0, written_tokens)


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
