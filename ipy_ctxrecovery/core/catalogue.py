"""Model catalogue: context window and maximum output tokens per model family.

Lookup is by exact id or by family prefix at a ``-`` boundary (dated ids, ``-latest``
aliases); the longest matching family wins, so ``gpt-4o-mini-2024-07-18`` is gpt-4o-mini
and ``gpt-4o`` is never taken for ``gpt-4``. Unknown models get a stated conservative
default and ``guessed=True``.

Capabilities are data too: ``assistant_prefill`` says whether the model continues a final
assistant turn (:data:`PREFILL_FAMILIES`); unknown models are taken not to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_MODEL_INFO", "MODELS", "PREFILL_FAMILIES", "SERVER_COMPACTION_FAMILIES",
           "ModelInfo", "family", "lookup"]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the recovery core needs to know about a model."""

    name: str
    context_window: int
    max_output_tokens: int
    guessed: bool = False
    window_overridden: bool = False
    assistant_prefill: bool = False
    """The model continues the text of a final assistant turn (a *prefill*) instead of
    rejecting it; see :data:`PREFILL_FAMILIES`."""
    server_compaction: bool = False
    """The provider compacts this model's conversations on its server when asked
    (Anthropic's ``compact_20260112`` edit, OpenAI's Responses ``context_management``)."""
    min_compact_trigger: int = 0
    """Tokens: the lowest compaction trigger the provider accepts for it (Anthropic's is
    50,000); a budget below it is kept by the package's own compaction."""


# family -> (context window tokens, max output tokens), from the providers' model pages
# (searched 2026-11-30). A family also covers its dated snapshots and ``-latest``/``-vN:M``
# aliases; the longest family at a ``-`` boundary wins, so every id that extends a shorter
# family with different limits needs its own row (``claude-opus-4-6`` vs ``claude-opus-4``).
MODELS: Mapping[str, tuple[int, int]] = {
    # OpenAI, legacy: platform.openai.com/docs/models/<id> (numbers predate this update)
    "gpt-3.5-turbo": (16_385, 4_096),
    "gpt-4": (8_192, 8_192),
    "gpt-4-32k": (32_768, 8_192),
    "gpt-4-turbo": (128_000, 4_096),
    "gpt-4o": (128_000, 16_384),
    "gpt-4o-mini": (128_000, 16_384),
    "chatgpt-4o": (128_000, 16_384),
    "gpt-4.1": (1_047_576, 32_768),
    "gpt-4.1-mini": (1_047_576, 32_768),
    "gpt-4.1-nano": (1_047_576, 32_768),
    "gpt-4.5-preview": (128_000, 16_384),
    "o1": (200_000, 100_000),
    "o1-mini": (128_000, 65_536),
    "o1-preview": (128_000, 32_768),
    "o3": (200_000, 100_000),
    "o3-mini": (200_000, 100_000),
    "o3-pro": (200_000, 100_000),
    "o4-mini": (200_000, 100_000),
    # OpenAI GPT-5 / 5.1 / 5.2: developers.openai.com/api/docs/models/gpt-5.1 (400,000 / 128,000);
    # gpt-5.2(-pro): docs.oxen.ai gpt-5-2-2025-12-11, vercel.com/ai-gateway gpt-5.2-pro.
    "gpt-5": (400_000, 128_000),
    "gpt-5-mini": (400_000, 128_000),
    "gpt-5-nano": (400_000, 128_000),
    "gpt-5.1": (400_000, 128_000),
    "gpt-5.2": (400_000, 128_000),
    "gpt-5.2-pro": (400_000, 128_000),
    # OpenAI chat snapshots (ChatGPT "Instant"): developers.openai.com/api/docs/models/
    # gpt-5.3-chat-latest (128,000 / 16,384); gpt-5.2-chat-latest: docs.oxen.ai; gpt-5.1-chat-latest:
    # only a third-party table (labring/fastgpt-plugin #297, 128,000 / 16,000). Without these rows
    # the chat ids would inherit the 400K window of gpt-5.1/gpt-5.2.
    "gpt-5-chat": (128_000, 16_384),
    "gpt-5.1-chat": (128_000, 16_000),
    "gpt-5.2-chat": (128_000, 16_384),
    "gpt-5.3-chat": (128_000, 16_384),
    # OpenAI GPT-5.4 / 5.5: vercel.com/ai-gateway/models/gpt-5.4(-nano, -mini-fast), docs.oxen.ai
    # gpt-5-5-2026-04-23, runware.ai/docs/models/openai-gpt-5-5 (OpenAI's own page not stored).
    "gpt-5.4": (1_050_000, 128_000),
    "gpt-5.4-mini": (400_000, 128_000),
    "gpt-5.4-nano": (400_000, 128_000),
    "gpt-5.5": (1_050_000, 128_000),
    # OpenAI GPT-5.6 (``gpt-5.6`` is the alias of Sol): vercel.com/ai-gateway/models/gpt-5.6-*,
    # developer.box.com GPT-5.6 Luna model card.
    "gpt-5.6": (1_050_000, 128_000),
    "gpt-5.6-sol": (1_050_000, 128_000),
    "gpt-5.6-terra": (1_050_000, 128_000),
    "gpt-5.6-luna": (1_050_000, 128_000),
    # OpenAI GPT-6: developers.openai.com/api/docs/models/gpt-6-sol (1,050,000 / 128,000); the
    # other tiers from vercel.com/ai-gateway/models/gpt-6-*, runware.ai, docs.laozhang.ai GPT-6.2.
    "gpt-6-astra": (1_050_000, 128_000),
    "gpt-6-sol": (1_050_000, 128_000),
    "gpt-6-luna": (1_050_000, 128_000),
    "gpt-6.1-sol": (1_050_000, 128_000),
    "gpt-6.1-terra": (1_050_000, 128_000),
    "gpt-6.2-astra": (1_050_000, 128_000),
    "gpt-6.2-sol": (1_050_000, 128_000),
    # Anthropic, retired or pre-4.5 (numbers predate this update)
    "claude-3-haiku": (200_000, 4_096),
    "claude-3-opus": (200_000, 4_096),
    "claude-3-sonnet": (200_000, 4_096),
    "claude-3-5-haiku": (200_000, 8_192),
    "claude-3-5-sonnet": (200_000, 8_192),
    "claude-3-7-sonnet": (200_000, 64_000),
    "claude-sonnet-4": (200_000, 64_000),
    "claude-opus-4": (200_000, 32_000),
    "claude-opus-4-1": (200_000, 32_000),
    # Anthropic 4.5: platform.claude.com/docs/en/models/{sonnet,opus,haiku}-4-5/overview. Sonnet 4.5
    # retires 2026-11-30 and Opus 4.5 on 2027-01-22 (the SDK's DEPRECATED_MODELS); kept so old
    # sessions still get correct limits.
    "claude-sonnet-4-5": (200_000, 64_000),
    "claude-opus-4-5": (200_000, 64_000),
    "claude-haiku-4-5": (200_000, 64_000),
    # Anthropic 4.6-4.8: platform.claude.com/docs/en/models/{opus-4-6,opus-4-8,sonnet-4-6}/overview;
    # Opus 4.7: the Bedrock and Vertex AI model cards (docs.aws.amazon.com model-card-anthropic-
    # claude-opus-4-7, docs.cloud.google.com .../claude/opus-4-7).
    "claude-opus-4-6": (1_000_000, 128_000),
    "claude-opus-4-7": (1_000_000, 128_000),
    "claude-opus-4-8": (1_000_000, 128_000),
    "claude-sonnet-4-6": (1_000_000, 128_000),
    # Anthropic 5.x: platform.claude.com/docs/en/models/{opus-5,sonnet-5,fable-5,haiku-5-5}/overview
    # and the "compares to the current lineup" table on those pages (Opus/Sonnet/Haiku 5.5, Fable
    # 5.1, 5.2). Mythos 5 "shares Claude Fable 5's specifications" (fable-5 overview); Mythos 5.2:
    # docs.aws.amazon.com model-card-anthropic-claude-mythos-5-2.
    "claude-opus-5": (1_000_000, 128_000),
    "claude-opus-5-5": (1_000_000, 128_000),
    "claude-sonnet-5": (1_000_000, 128_000),
    "claude-sonnet-5-5": (1_000_000, 128_000),
    "claude-haiku-5-5": (1_000_000, 128_000),
    "claude-fable-5": (1_000_000, 128_000),
    "claude-fable-5-1": (1_000_000, 128_000),
    "claude-fable-5-2": (1_000_000, 128_000),
    "claude-mythos-5": (1_000_000, 128_000),
    "claude-mythos-5-2": (1_000_000, 128_000),
    # The built-in emulator's defaults (an Emulator instance reports its own limits).
    "emulator": (8_192, 4_096),
}

# Families whose API continues a prefilled final assistant turn. Anthropic: "Prefilling is
# only available for non-extended thinking modes" and "The prefill content cannot end with
# trailing whitespace" (docs.claude.com/en/docs/prefill-claudes-response); from Claude 4.6 on
# "Prefilling assistant messages returns a 400 error" (platform.claude.com/docs/en/about-claude/
# models/migration-guide, "Prefill removal"; the API says "This model does not support
# assistant message prefill. The conversation must end with a user message.", seen in
# strands-agents/sdk-python#1694); Opus 4.7/4.8 and Fable 5 (always-on thinking) likewise.
# A model not listed is only ever asked with the continuation prompt, which every model takes.
PREFILL_FAMILIES: frozenset[str] = frozenset({
    "claude-3-haiku", "claude-3-opus", "claude-3-sonnet", "claude-3-5-haiku",
    "claude-3-5-sonnet", "claude-3-7-sonnet", "claude-sonnet-4", "claude-opus-4",
    "claude-opus-4-1", "claude-sonnet-4-5", "claude-opus-4-5", "claude-haiku-4-5",
    # The built-in emulator honours a prefill on its Anthropic path (emulator/replies.py).
    "emulator",
})

# Families whose provider compacts on its server when asked, with the lowest trigger (input
# tokens) it accepts. Anthropic: "Compaction is supported on the following models: Claude
# Fable 5, Claude Mythos 5, Claude Mythos Preview, Claude Opus 5, Claude Opus 4.8, Claude
# Opus 4.7, Claude Opus 4.6, Claude Sonnet 5, Claude Sonnet 4.6"; the trigger's "value must
# be at least 50,000 tokens", default 150,000 (platform.claude.com/docs/en/build-with-claude/
# compaction, fetched 2026-08-02). A family is matched as the catalogue's own family of the
# model (``claude-opus-5-5`` is not ``claude-opus-5``: the page does not list it). A family
# not listed is never asked under "auto" (``server_compaction="on"`` asks all the same). The
# emulator compacts any conversation past a trigger of at least 1,000 tokens.
SERVER_COMPACTION_FAMILIES: Mapping[str, int] = {
    "claude-opus-4-6": 50_000,
    "claude-opus-4-7": 50_000,
    "claude-opus-4-8": 50_000,
    "claude-opus-5": 50_000,
    "claude-sonnet-4-6": 50_000,
    "claude-sonnet-5": 50_000,
    "claude-fable-5": 50_000,
    "claude-mythos-5": 50_000,
    "claude-mythos-preview": 50_000,
    "emulator": 1_000,
}

DEFAULT_MODEL_INFO = ModelInfo("unknown", 8_192, 4_096, guessed=True)
"""Conservative guess for a model the catalogue does not know (e.g. a local vLLM model)."""


def bare(model: str) -> str:
    """Strip our ``provider:`` prefix and router/cloud prefixes (``openai/``, ``anthropic.``)."""
    name = model.strip().lower()
    if ":" in name and name.split(":", 1)[0] in {"openai", "anthropic", "emulator"}:
        prefix, rest = name.split(":", 1)
        name = rest if prefix != "emulator" else "emulator"
    name = name.rsplit("/", 1)[-1]
    for cloud_prefix in ("us.", "eu.", "apac.", "global."):
        if name.startswith(cloud_prefix):
            name = name[len(cloud_prefix):]
    if name.startswith("anthropic."):
        name = name[len("anthropic."):]
    return name


def family(model: str, families: Iterable[str]) -> str | None:
    """The entry of ``families`` that ``model`` belongs to: its exact id or the longest
    family at a ``-`` (or ``@``) boundary, after the provider prefixes are stripped."""
    name = bare(model)
    best: str | None = None
    for candidate in families:
        if (name == candidate or name.startswith(candidate + "-")
                or name.startswith(candidate + "@")) and (
                best is None or len(candidate) > len(best)):
            best = candidate
    return best


def lookup(model: str, *, context_window: int | None = None) -> ModelInfo:
    """Return the model's limits; ``context_window`` (CHATCLI_CONTEXT_WINDOW) overrides the window."""
    best = family(model, MODELS)
    if best is None:
        info = ModelInfo(model, DEFAULT_MODEL_INFO.context_window,
                         DEFAULT_MODEL_INFO.max_output_tokens, guessed=True)
    else:
        window, output = MODELS[best]
        # The model's own family, so a longer family the page does not list is not taken
        # for a shorter one it does (claude-opus-5-5 for claude-opus-5).
        compacts = best if best in SERVER_COMPACTION_FAMILIES else None
        info = ModelInfo(model, window, output, assistant_prefill=best in PREFILL_FAMILIES,
                         server_compaction=compacts is not None,
                         min_compact_trigger=SERVER_COMPACTION_FAMILIES.get(compacts or "", 0))
    if context_window is not None:
        info = dataclasses.replace(
            info, context_window=context_window,
            max_output_tokens=min(info.max_output_tokens, context_window),
            guessed=False, window_overridden=True)
    return info
