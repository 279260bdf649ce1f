"""Settings: every number the recovery core uses, read from CHATCLI_* variables or set directly.

A :class:`Settings` is a frozen value that belongs to one session; nothing here is global.
Sizes parse with :func:`parse_size` (humanfriendly, binary units, a bare number means MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

import humanfriendly

from .errors import ConfigError
from .redaction import MASK, MIN_CREDENTIAL, credential_param, path_credential

__all__ = ["ENV_VARS", "ConfigError", "Settings", "field_for", "format_size", "parse_prices",
           "parse_size", "proxy_for", "public_url", "seconds_arg"]

MiB = 1024 * 1024
KiB = 1024

SIZE_FORMS = "a size such as 5MB, 512KB, 2.5MB, 1GB or 1024B (binary units; a bare number means MB; 0 means no cap)"


_SIZE_SHAPE = re.compile(r"\d+(?:\.\d+)?\s*(?:[kmgt]i?b?|b|bytes?)", re.IGNORECASE)
"""What a size looks like: a number and one unit (``5MB``, ``2.5 MiB``, ``512k``, ``1024B``)."""


def parse_size(text: str, *, name: str = "size") -> int:
    """Parse a human-friendly size into bytes, binary units, a bare number meaning MB.

    >>> parse_size("5MB"), parse_size("512KB"), parse_size("5"), parse_size("0")
    (5242880, 524288, 5242880, 0)
    """
    raw = text if isinstance(text, str) else str(text)
    stripped = raw.strip()
    if not stripped:
        raise ConfigError(f"{name} is empty; expected {SIZE_FORMS}.")
    if not stripped.isascii():
        # float() reads full-width and other Unicode digits; a size is typed in ASCII.
        raise ConfigError(f"{name}={raw!r} is not a valid size (use ASCII digits); expected "
                          f"{SIZE_FORMS}.")
    try:
        number = float(stripped)
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number) or number < 0:
            raise ConfigError(f"{name}={raw!r} is not a valid size; expected {SIZE_FORMS}.")
        return int(number * MiB)
    if _SIZE_SHAPE.match(stripped) and not _SIZE_SHAPE.fullmatch(stripped):
        # humanfriendly reads the first number and the first unit and ignores the rest
        # ("5MBB", "5 MB MB", "5MB;rm" would all be 5 MB).
        raise ConfigError(f"{name}={raw!r} is not a valid size (a number and one unit, "
                          f"nothing after it); expected {SIZE_FORMS}.")
    try:
        value = humanfriendly.parse_size(stripped, binary=True)
    except humanfriendly.InvalidSize:
        raise ConfigError(
            f"{name}={raw!r} is not a valid size; expected {SIZE_FORMS}."
        ) from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is not a valid size; expected {SIZE_FORMS}.")
    return int(value)


MAX_DELAY_SECONDS = 3600.0
"""The longest delay a flag takes (``--latency``): an hour per answer is already no answer."""


def seconds_arg(text: str) -> float:
    """An argparse ``type`` for a delay flag (``--latency S``): seconds from 0 to an hour."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_DELAY_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds from 0 to {MAX_DELAY_SECONDS:g} (e.g. 0.5)")
    return value


def format_size(num_bytes: int | float) -> str:
    """Format a byte count the way the SPEC's messages do: ``4.2 MB``, ``512 KB``."""
    value = float(num_bytes)
    for unit, scale in (("GB", MiB * 1024), ("MB", MiB), ("KB", KiB)):
        if value >= scale:
            shown = value / scale
            return f"{shown:.1f} {unit}" if shown < 100 and shown != int(shown) else f"{shown:.0f} {unit}"
    return f"{int(value)} B"


# Up to the last '@' before the path: an unencoded '@' in a password is still user info.
_USERINFO = re.compile(r"//[^/?#\s]*@")
_QUERY_ITEM = re.compile(r"([?&;])([^=&;#\s]*)=([^&;#\s]*)")


def public_url(url: object, secrets: Iterable[str] = ()) -> str:
    """``url`` fit to be shown: its ``user:password@`` part, the values of credential
    query parameters (``?key=``, ``&sig=``: :func:`~.redaction.credential_param`) and path
    segments that are credentials (a key in a known format, ``…/sk-proj-…/v1``, or one of
    ``secrets``: the session's own key, which a gateway may take in the path) masked."""
    text = _USERINFO.sub(f"//{MASK}@", str(url))
    start = text.find("?")
    head, query = (text, "") if start < 0 else (text[:start], text[start:])
    head = _masked_path(head, frozenset(s for s in secrets if s and len(s) >= MIN_CREDENTIAL))
    return head + _QUERY_ITEM.sub(_masked_item, query) if query else head


def _masked_path(head: str, secrets: frozenset[str]) -> str:
    scheme, sep, rest = head.partition("://")
    if not sep:
        scheme, rest = "", head
    host, slash, path = rest.partition("/")
    if not slash:
        return head
    segments = [MASK if path_credential(seg, secrets) else seg for seg in path.split("/")]
    return f"{scheme}{sep}{host}/" + "/".join(segments)


def _masked_item(match: re.Match[str]) -> str:
    mark, name, value = match.groups()
    return f"{mark}{name}={MASK}" if value and credential_param(name) else match.group(0)


def proxy_for(url: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The proxy the environment routes ``url`` through, as (masked proxy URL, variable),
    or None: ``HTTPS_PROXY``/``HTTP_PROXY`` by scheme, then ``ALL_PROXY``, either case, unless
    ``NO_PROXY`` names the host (the rules the SDKs' HTTP client follows)."""
    source = os.environ if env is None else env
    parts = urlsplit(str(url))
    host = (parts.hostname or "").lower()
    scheme = parts.scheme.lower() or "https"
    no_proxy = source.get("NO_PROXY", source.get("no_proxy", ""))
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        entry = entry.split(":", 1)[0] if entry.count(":") == 1 else entry
        if entry == "*" or (entry and (host == entry.lstrip(".")
                                       or host.endswith("." + entry.lstrip(".")))):
            return None
    for var in (f"{scheme.upper()}_PROXY", f"{scheme}_proxy", "ALL_PROXY", "all_proxy"):
        value = source.get(var, "").strip()
        if value:
            return public_url(value), var
    return None


# Environment variable -> Settings field (SPEC §8).
ENV_VARS: Mapping[str, str] = {
    "CHATCLI_CONTEXT_WINDOW": "context_window",
    "CHATCLI_MAX_RECOVERY_ATTEMPTS": "max_recovery_attempts",
    "CHATCLI_MAX_TOKEN_ESCALATIONS": "max_token_escalations",
    "CHATCLI_EMERGENCY_KEEP_MESSAGES": "emergency_keep_messages",
    "CHATCLI_MAX_PAYLOAD": "max_payload",
    "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "microcompact_truncate_turns",
    "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "microcompact_summarize_turns",
    "CHATCLI_SUMMARY_MAX_REQUESTS": "summary_max_requests",
    "CHATCLI_PRICES": "prices",
    "CHATCLI_BACKGROUND_COMPACTION": "background_compaction",
    "CHATCLI_PROMPT_CACHING": "prompt_caching",
    "CHATCLI_CACHE_RETENTION": "cache_retention",
    "CHATCLI_SERVER_COMPACTION": "server_compaction",
    "CHATCLI_OPENAI_API": "openai_api",
    "CHATCLI_OPENAI_STORE": "openai_store",
}

_FLAG_FIELDS = frozenset({"redact_stored", "read_file", "ask_server_window",
                          "background_compaction", "prompt_caching", "openai_store"})
CHOICES: Mapping[str, tuple[str, ...]] = {
    "server_compaction": ("auto", "on", "off"),
    "cache_retention": ("auto", "short", "long"),
    "openai_api": ("auto", "chat", "responses"),
}
"""Fields that take one word of a few (the first is the default)."""
_TEXT_FIELDS = frozenset({"read_file_root", "prices"})
_FLAG_WORDS = {"true": True, "1": True, "yes": True, "on": True,
               "false": False, "0": False, "no": False, "off": False}

_SIZE_FIELDS = frozenset(
    {"max_payload", "no_cap_warn_bytes", "likely_payload_min_bytes", "assumed_cap_bytes",
     "max_reply"}
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every threshold of SPEC §2–§8 as a named field; defaults are the SPEC's."""

    # --- SPEC §8 (environment variables) ---
    context_window: int | None = None
    """Context window in tokens; None = from the model catalogue."""
    max_recovery_attempts: int = 3
    max_token_escalations: int = 2
    emergency_keep_messages: int = 10
    max_payload: int | None = None
    """POST body cap in bytes; None = no cap configured."""
    microcompact_truncate_turns: int = 2
    microcompact_summarize_turns: int = 4

    # --- tool-result budget (SPEC §5) ---
    turn_budget_chars: int = 200_000
    per_result_max_chars: int = 20_000
    budget_head_chars: int = 4_000
    budget_tail_chars: int = 1_000

    # --- microcompact (SPEC §6) ---
    microcompact_min_chars: int = 3_000
    microcompact_head_chars: int = 2_000
    microcompact_tail_chars: int = 500

    # --- pre-flight (SPEC §2) ---
    preflight_cap_fraction: float = 0.85
    preflight_budget_ratio: float = 0.40
    exact_count_margin: float = 0.10
    """Exact pre-flight (``core/exact_count.py``): a request whose estimated input is
    within this share of the window of the window budget (the window less the answer's
    reservation), either side, is counted once by the provider's own token counter where
    it has one, and decided on that count; 0 = never count."""
    no_cap_warn_bytes: int = int(2.5 * MiB)
    assumed_cap_bytes: int = 4 * MiB
    likely_payload_min_bytes: int = 500 * KiB
    """A connection dropped on a body larger than any the path carried and larger than
    this is fitted at once, as a proxy's size limit (SPEC §1); a smaller one is sent once
    more first (it may be a blip), and a second drop shows the limit."""

    # --- compaction budget (ANCHORS: min(window × ratio × chars/token, 0.7 × cap)) ---
    chat_budget_ratio: float = 0.75
    manual_compact_ratio: float = 0.50
    cap_budget_fraction: float = 0.70
    compaction_target_fraction: float = 0.60
    """Hysteresis: compaction aims at this fraction of the trigger, not at the trigger."""
    chars_per_token: float = 4.0
    summarizer_input_max_chars: int = 120_000
    summary_max_chars: int = 16_000
    summary_max_requests: int = 8
    """The most summary requests one compaction sends (its chunks, a retry of a reply cut
    short); past it the oldest messages are dropped unread, and the compaction says so."""
    background_compaction: bool = True
    """Prepare the summary in a worker ahead of need and swap it in when a turn needs room
    (``session/background.py``), so no turn waits for it."""
    prepare_summary_ratio: float = 0.70
    """The share of the compaction trigger past which the summary is prepared: above
    ``compaction_target_fraction`` (where a compaction leaves the history), or a summary
    would be prepared again right after each one, with little to summarize yet."""

    # --- recovery ladder (SPEC §3) ---
    aggressive_factor: float = 0.5
    aggressive_assistant_max_chars: int = 5_000
    nuclear_keep_messages: int = 4
    exact_fit_margin: float = 0.10
    learned_cap_fraction: float = 0.75
    min_answer_tokens: int = 256
    """The smallest answer a reservation is lowered to before a message is called too big."""

    # --- session loop ---
    max_tool_rounds: int = 8
    transient_retries: int = 2
    max_retry_wait: float = 60.0
    """Seconds: the longest a transient retry waits (a server's Retry-After included);
    a server asking for longer fails the turn with a sentence saying when to retry."""
    turn_timeout: float | None = 900.0
    """Seconds: the most one turn (every request, retry and wait in it) may take; None =
    no deadline. A server that never answers or a stalled stream fails the turn then."""
    max_reply: int = 32 * MiB
    """Bytes: the largest reply body read — an answer, an error body, or what an event
    stream's answer carries (its raw stream may be 8 times this: each piece comes in a
    JSON envelope). A larger one is refused unread with one sentence (``%chat config
    max_reply=128MB`` raises it): masking and saving a reply cost time in proportion."""

    def __post_init__(self) -> None:
        # Checked when built, however built: a Settings that exists is safe to compute with.
        self.validate()

    # --- files and privacy (README "Files and privacy") ---
    redact_stored: bool = True
    """Mask well-known secret formats in what is written to disk and exported (the
    session's own credentials are masked whatever this says)."""
    read_file: bool = True
    """Offer the built-in read_file tool."""
    read_file_root: str | None = None
    """The directory read_file may read under; None = the session's working directory."""

    # --- the model's window ---
    ask_server_window: bool = True
    """For a model the catalogue does not know, ask the server its window once (vLLM's,
    OpenRouter's and LM Studio's model lists say it)."""

    # --- prompt caching and cost (docs/caching.md) ---
    prompt_caching: bool = True
    """Set cache breakpoints on the Anthropic wire (tools, system prompt, the conversation),
    so a turn reads its repeated prefix from the provider's cache (OpenAI caches on its
    own; it is sent a ``prompt_cache_key`` for the conversation). Off: no breakpoint, key
    or retention is sent."""
    cache_retention: str = "auto"
    """How long the provider keeps the cache: "short" (Anthropic's 5-minute entries,
    OpenAI's ``prompt_cache_retention="in_memory"``), "long" (Anthropic's 1-hour entries,
    written at 2× the input price instead of 1.25×; OpenAI's ``"24h"``, at no extra cost;
    neither is zero-data-retention eligible) or "auto": on Anthropic's own service (and
    the emulator) 1-hour entries once the session's pauses between requests make them the
    cheaper (``core.caching.long_ttl_pays``); on OpenAI nothing is sent (its default: a
    day without zero data retention, minutes with it), and the cache is taken for warm.
    OpenAI's values are sent only to models that take them."""
    microcompact_clear_at_least: int = 4_000
    """Tokens: rewrites of messages already sent (microcompact, the tool-result budget) wait
    until they clear at least this many at once, unless a compaction or a fit is due or the
    cache has expired (``cache_ttl_seconds``); 0 = rewrite at once, every turn."""
    cache_ttl_seconds: float = 300.0
    """Seconds a provider keeps a short-retention prompt cache unused (5 minutes on both
    providers): a session idle longer has lost its cache, so pending rewrites are free then.
    A request sent with long retention lives 1 hour (Anthropic) or 24 hours (OpenAI)."""
    prices: str | None = None
    """Price overrides, ``model=in/cached/write/out`` pairs (USD per million tokens, comma
    separated) or a JSON object (``CHATCLI_PRICES``); see :func:`parse_prices`."""

    # --- the providers' own context management (docs/server-compaction.md) ---
    server_compaction: str = "auto"
    """The provider's server-side compaction: "auto" (on where the provider and the model
    support it), "on" (asked for; a model without it is told in one line) or "off". While
    the server compacts, the package's own summary does not run for the window; the
    payload-cap fit, microcompact and the tool-result budget still do."""
    openai_api: str = "auto"
    """The OpenAI wire's API: "chat" (Chat Completions), "responses" (the Responses API),
    or "auto": the Responses API on OpenAI's own service, Chat Completions on any other
    server (of unknown capability) and on the emulator."""
    openai_store: bool = False
    """On the Responses API, let the server store responses (``store=true``) and send only
    what is new after ``previous_response_id``. Off (the default): nothing is kept on the
    server and every request carries the history (``store=false``)."""

    # --- the user's words kept across compactions (core/pins.py) ---
    pinned_rules_max_chars: int = 4_000
    """Characters: the most the pinned message of the user's standing instructions holds;
    past it the oldest rules are summarized like the rest (0 = pin none)."""
    user_words_share: float = 0.20
    """Of the compaction target, the share kept for the user's own messages verbatim after
    the summary, newest first (0 = keep none)."""

    # --- recall (session/recall.py) ---
    recall_max_chars: int = 4_000
    """The most characters one result of the built-in recall_transcript tool holds (at most
    per_result_max_chars); 0 = the tool is never offered."""

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise :class:`ConfigError` when a value or a relation between values is wrong.

        Everything that passes is safe to compute with: finite numbers, whole numbers where
        a count is meant, and no zero where a value divides or bounds (a cap of 0 bytes,
        0 characters per token).
        """
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in CHOICES:
                if value not in CHOICES[f.name]:
                    raise ConfigError(f"{_label(f.name)}={value!r} is not one of "
                                      f"{', '.join(CHOICES[f.name])}.")
                continue
            if f.name in _FLAG_FIELDS:
                if not isinstance(value, bool):
                    raise _not_a_flag(f.name, value)
                continue
            if f.name in _TEXT_FIELDS:
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f"{f.name}={value!r} is not a path.")
                if f.name == "prices" and value is not None:
                    parse_prices(value, name=_label(f.name))
                continue
            if value is None:
                if f.name not in _OPTIONAL:
                    raise ConfigError(f"{_label(f.name)} must be set (it has no 'none' form).")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{_label(f.name)}={value!r} is not a number.")
            if not math.isfinite(value):
                raise ConfigError(f"{_label(f.name)}={value!r} is not a finite number.")
            if f.type in ("int", int) and f.name not in _OPTIONAL \
                    and not isinstance(value, int):
                raise ConfigError(f"{_label(f.name)}={value!r} is not a whole number.")
            if value < 0:
                raise ConfigError(f"{_label(f.name)}={value!r} must not be negative.")
        if self.context_window is not None and not isinstance(self.context_window, int):
            raise ConfigError(f"{_label('context_window')}={self.context_window!r} is not a "
                              "whole number of tokens.")
        if self.context_window is not None \
                and not MIN_WINDOW <= self.context_window <= MAX_WINDOW:
            raise ConfigError(
                f"{_label('context_window')}={self.context_window:,} tokens is outside what "
                f"any model has; give {MIN_WINDOW:,} to {MAX_WINDOW:,} tokens, or 0 to use "
                "the model's own window.")
        if self.max_payload is not None and not (
                isinstance(self.max_payload, int) and self.max_payload >= MIN_PAYLOAD):
            raise ConfigError(
                f"{_label('max_payload')}={self.max_payload!r} is not a usable cap; give a "
                "positive whole number of bytes, or None for no cap.")
        if self.max_payload is not None and not MIN_CAP <= self.max_payload <= MAX_CAP:
            shown = format_size(self.max_payload) if self.max_payload < 1024 * MAX_CAP \
                else "far more than 1 GB"
            raise ConfigError(
                f"{_label('max_payload')}={shown} is outside what a "
                f"proxy's body limit can be; give {format_size(MIN_CAP)} to "
                f"{format_size(MAX_CAP)} (e.g. 5MB, 512KB), or 0 for no cap.")
        if not MIN_CHARS_PER_TOKEN <= self.chars_per_token <= MAX_CHARS_PER_TOKEN:
            raise ConfigError(
                f"chars_per_token={self.chars_per_token!r} must be between "
                f"{MIN_CHARS_PER_TOKEN:g} and {MAX_CHARS_PER_TOKEN:g} (4 is typical).")
        if self.assumed_cap_bytes < 1:
            raise ConfigError(f"assumed_cap_bytes={self.assumed_cap_bytes!r} must be a "
                              "positive number of bytes.")
        if not isinstance(self.max_reply, int) or self.max_reply < MIN_REPLY:
            shown = format_size(self.max_reply) if isinstance(self.max_reply, int) \
                else repr(self.max_reply)
            raise ConfigError(f"max_reply={shown} is below {format_size(MIN_REPLY)}; give a "
                              "size such as 32MB (an answer with its envelope is larger).")
        if self.turn_timeout is not None and self.turn_timeout < 1:
            raise ConfigError(f"turn_timeout={self.turn_timeout!r} must be at least 1 second, "
                              "or None for no deadline.")
        if not 0 <= self.user_words_share < 1:
            raise ConfigError(f"user_words_share={self.user_words_share!r} must be a fraction "
                              "in [0, 1).")
        if not 0 <= self.exact_fit_margin < 1:
            raise ConfigError(f"exact_fit_margin={self.exact_fit_margin!r} must be a fraction "
                              "in [0, 1).")
        if isinstance(self.exact_count_margin, bool) \
                or not isinstance(self.exact_count_margin, int | float) \
                or not 0 <= self.exact_count_margin <= 1:
            raise ConfigError(f"exact_count_margin={self.exact_count_margin!r} must be a "
                              "fraction in [0, 1] (0.10: count requests within 10% of the "
                              "window; 0: never count).")
        for name in ("summarizer_input_max_chars", "summary_max_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be at least 1.")
        if self.summary_max_requests < 1:
            raise ConfigError(
                f"{_label('summary_max_requests')}={self.summary_max_requests!r} allows no "
                "summary request; give at least 1 (the default is 8).")
        for name in _AT_LEAST_ONE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{_label(name)}={value!r} must be at least 1.")
        if self.microcompact_summarize_turns < self.microcompact_truncate_turns:
            raise ConfigError(
                f"{_label('microcompact_summarize_turns')}={self.microcompact_summarize_turns} "
                f"is below {_label('microcompact_truncate_turns')}="
                f"{self.microcompact_truncate_turns}; results must be truncated before they "
                "are summarized, so set it to at least the truncate age."
            )
        if self.per_result_max_chars > self.turn_budget_chars:
            raise ConfigError(
                f"per_result_max_chars={self.per_result_max_chars} exceeds "
                f"turn_budget_chars={self.turn_budget_chars}; lower it to the turn budget or less."
            )
        for name in ("preflight_cap_fraction", "preflight_budget_ratio", "chat_budget_ratio",
                     "manual_compact_ratio", "cap_budget_fraction", "compaction_target_fraction",
                     "aggressive_factor", "learned_cap_fraction", "prepare_summary_ratio"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{name}={value!r} must be a fraction in (0, 1].")

    def updated(self, values: Mapping[str, str | int | float | None], *,
                source: str = "setting") -> Settings:
        """Apply textual values keyed by env-var name or field name (``%chat config``).

        Unknown keys, bad values and bad relations raise :class:`ConfigError` naming the key.
        """
        changes: dict[str, Any] = {}
        names = {f.name for f in fields(self)}
        for key, raw in values.items():
            name = field_for(key)
            if name not in names:
                known = ", ".join(sorted(ENV_VARS))
                raise ConfigError(
                    f"{key} is not a known {source}; use one of {known} "
                    "or a Settings field name."
                )
            changes[name] = _coerce(name, key, raw)
        try:
            return dataclasses.replace(self, **changes)
        except ConfigError as e:
            said = str(e)
            # A key typed otherwise than the sentence names its setting (max_payload, said
            # as CHATCLI_MAX_PAYLOAD) is added inside the sentence, never as a second one.
            aside = [key for key in values if key not in said
                     and (field_for(key) in said or _label(field_for(key)) in said)]
            if not aside:
                raise
            raise ConfigError(f"{said.rstrip('.')} (from {', '.join(aside)}).") from None

    @staticmethod
    def read_value(key: str, raw: str) -> Any:
        """``raw`` read as the value of setting ``key`` (env-var or field name), on its own
        — not checked against the other settings; a ConfigError when it cannot be read."""
        return _coerce(field_for(key), key, raw)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the CHATCLI_* variables of SPEC §8; unset or empty keeps the default."""
        source = os.environ if env is None else env
        present = {k: source[k] for k in ENV_VARS if source.get(k, "").strip()}
        return cls().updated(present, source="environment variable")


MIN_PAYLOAD = 1
"""The smallest payload cap: 0 bytes is no cap (None), not a cap nothing fits under."""
MIN_CAP = 4 * KiB
MAX_CAP = 1024 * MiB
"""A payload cap is a proxy's body limit: below a few KB no request fits (the request's
own frame is ~1 KB), above 1 GB no proxy limits anything."""
MIN_REPLY = 64 * KiB
"""The smallest ``max_reply``: an ordinary answer with its envelope fits many times over."""
MIN_WINDOW = 256
MAX_WINDOW = 10_000_000
"""The context windows models have: a few hundred tokens to millions."""
MIN_CHARS_PER_TOKEN = 1.0
MAX_CHARS_PER_TOKEN = 10.0
"""The range a bytes-per-token estimate can take (as ``preflight`` clamps calibration)."""
_OPTIONAL = frozenset({"context_window", "max_payload", "turn_timeout"})
"""Fields where None is a value (no override, no cap, no deadline)."""
_AT_LEAST_ONE = ("max_recovery_attempts", "emergency_keep_messages", "context_window",
                 "microcompact_truncate_turns", "microcompact_summarize_turns",
                 "turn_budget_chars", "per_result_max_chars", "nuclear_keep_messages")
"""Counts where 0 makes no sense (the others, e.g. max_token_escalations, may be 0)."""


def field_for(key: str) -> str:
    """The Settings field a key names: an env-var name (``CHATCLI_MAX_PAYLOAD``) or a field
    name in any case, ``-`` for ``_`` (``%chat config`` keys). Unknown keys come back as
    they would be a field's name; the caller checks."""
    return ENV_VARS.get(key.upper(), key.lower().replace("-", "_"))


def _is_zero(raw: object) -> bool:
    """``0``, ``0.0``, ``0KB``: a zero written as one (not a small number rounded down)."""
    return re.fullmatch(r"\s*0+(?:\.0*)?\s*[a-z]*\s*", str(raw), re.IGNORECASE) is not None


def _label(name: str) -> str:
    for env, field_name in ENV_VARS.items():
        if field_name == name:
            return env
    return name


def _not_a_flag(key: str, value: object) -> ConfigError:
    """The one sentence for a value an on/off setting does not take."""
    return ConfigError(f"{key}={value!r} is not valid; use on or off (or True or False).")


def _coerce(name: str, key: str, raw: str | int | float | None) -> Any:
    """Turn one textual value into the field's type, or raise a ConfigError naming ``key``."""
    if raw is None:
        return None
    if name in CHOICES:
        word = str(raw).strip().lower()
        if word not in CHOICES[name]:
            raise ConfigError(f"{key}={raw!r} is not one of {', '.join(CHOICES[name])}.")
        return word
    if name in _FLAG_FIELDS:
        if isinstance(raw, bool):
            return raw
        flag = _FLAG_WORDS.get(str(raw).strip().lower())
        if flag is None:
            raise _not_a_flag(key, raw)
        return flag
    if name in _TEXT_FIELDS:
        text = str(raw).strip()
        if text.lower() in {"", "none"}:
            return None
        if name == "prices":
            parse_prices(text, name=key)
            return text
        path = os.path.expanduser(text)
        if not os.path.isdir(path):
            raise ConfigError(f"{key}={raw!r} is not a directory; give an existing "
                              "directory, or None for the working directory.")
        return path
    if name in _SIZE_FIELDS:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            value = int(raw)
        else:
            value = parse_size(str(raw), name=key)
        if name == "max_payload":
            if value == 0 and _is_zero(raw):
                return None
            if value == 0:
                # Said here, with the text typed: 0.0000001 rounds to 0, which would be no cap.
                raise ConfigError(
                    f"{key}={raw!r} rounds to 0 B, under {format_size(MIN_CAP)}, smaller than "
                    "any proxy's body limit; give a cap such as 256KB or 5MB, or 0 for no cap.")
        return value
    text = str(raw).strip()
    if not text.isascii():
        # int() and float() read full-width and other Unicode digits; settings are ASCII.
        raise ConfigError(f"{key}={raw!r} is not a number (use ASCII digits).")
    default = getattr(Settings(), name)
    if name == "context_window" and text.lower() in {"", "none", "auto", "0"}:
        return None
    if name == "turn_timeout" and text.lower() in {"", "none", "off", "0"}:
        return None
    if isinstance(default, float) or name == "turn_timeout":
        try:
            value_f = float(text)
        except ValueError:
            raise ConfigError(
                f"{key}={raw!r} is not a number; expected a decimal such as 0.5."
            ) from None
        if not math.isfinite(value_f):
            raise ConfigError(f"{key}={raw!r} is not a finite number; expected e.g. 0.5.")
        return value_f
    try:
        value_i = int(text.replace("_", ""))
    except ValueError:
        hint = "a whole number of tokens such as 128000" if name == "context_window" \
            else "a whole number such as 3"
        raise ConfigError(f"{key}={raw!r} is not a whole number; expected {hint}.") from None
    if value_i < 0:
        least = 1 if name in _AT_LEAST_ONE else 0
        raise ConfigError(f"{key}={raw!r} must not be negative; expected a whole number "
                          f"≥ {least}.")
    return value_i


PRICE_FORMS = ("model=in/cached/write/out pairs in USD per million tokens, comma separated "
               "(e.g. gpt-4o=2.5/1.25/0/10), or a JSON object in single quotes such as "
               """'{"gpt-4o": [2.5, 1.25, 0, 10]}'""")
"""The quotes keep the JSON's own: a %chat config line (as a shell) takes off the others."""


def parse_prices(text: str, *, name: str = "prices") -> dict[str, tuple[float, float, float, float]]:
    """Price overrides: model → (input, cached read, cache write, output), USD per million
    tokens. Two forms: ``model=in/cached/write/out`` pairs separated by commas, or a JSON
    object of model → four numbers (or an object with ``input``, ``cached``, ``write``,
    ``output``). A malformed value is one ConfigError sentence naming ``name``.

    >>> parse_prices("gpt-4o=2.5/1.25/0/10")
    {'gpt-4o': (2.5, 1.25, 0.0, 10.0)}
    """
    stripped = str(text).strip()
    entries: list[tuple[str, object]] = []
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            raise ConfigError(f"{name} is not valid JSON; expected {PRICE_FORMS}.") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{name} is not a JSON object; expected {PRICE_FORMS}.")
        for model, value in data.items():
            if isinstance(value, dict):
                value = [value.get(k) for k in ("input", "cached", "write", "output")]
            entries.append((str(model), value))
    else:
        for pair in filter(None, (p.strip() for p in stripped.split(","))):
            model, sep, value = pair.partition("=")
            if not sep:
                raise ConfigError(f"{name}: {pair!r} has no '='; expected {PRICE_FORMS}.")
            entries.append((model, value.split("/")))
    prices: dict[str, tuple[float, float, float, float]] = {}
    for model, value in entries:
        model = model.strip().lower()
        numbers: list[float] = []
        if isinstance(value, list) and len(value) == 4:
            for v in value:
                if isinstance(v, bool):     # JSON true is not a price (float(True) is 1.0)
                    break
                try:
                    number = float(v.strip()) if isinstance(v, str) else float(v)
                except (TypeError, ValueError):
                    break
                if not math.isfinite(number) or number < 0:
                    break
                numbers.append(number)
        if not model or len(numbers) != 4:
            raise ConfigError(f"{name}: the price of {model or 'a model'!r} is not four "
                              f"non-negative numbers; expected {PRICE_FORMS}.")
        prices[model] = (numbers[0], numbers[1], numbers[2], numbers[3])
    if not prices:
        raise ConfigError(f"{name} names no model; expected {PRICE_FORMS}.")
    return prices
