"""Extended thinking's budget against the answer's reservation; a pure function.

Anthropic's extended thinking (``thinking: {"type": "enabled", "budget_tokens": B}``,
a model option, or inside ``extra_body``) spends its budget out of ``max_tokens``: the API
refuses a request whose ``max_tokens`` is not above ``B`` — 400 "`max_tokens` must be
greater than `thinking.budget_tokens`" (anthropics/claude-code#8756) — and a ``B`` under
:data:`MIN_BUDGET` (danny-avila/LibreChat#8346). Pre-flight and the ladder lower
``max_tokens`` near the end of the window; sending the budget unchanged would then be
refused on every turn. So :func:`fit_thinking` keeps thinking's *share* of the answer:

* the budget is lowered in proportion when ``max_tokens`` is: ``B × sent ÷ asked``
  (``asked``: the max_tokens the request asked for, or the provider's default), never
  raised, and never to ``sent`` or above — a budget that was not below what was asked
  (an invalid request to begin with, such as a budget above the provider's default) gets
  half of ``sent``, so thinking and the answer share what there is;
* when that is under :data:`MIN_BUDGET`, the request goes without extended thinking
  (``{"type": "disabled"}``): an answer without thinking is what fits, not a refusal.

Adaptive thinking (``"type": "adaptive"``) has no budget and is left alone; so is a
request whose beta names include interleaved thinking's, whose budget spans a whole tool
loop and may exceed ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["INTERLEAVED_BETA", "MIN_BUDGET", "ThinkingFit", "fit_thinking"]

MIN_BUDGET = 1024
"""The least ``budget_tokens`` the API takes."""
INTERLEAVED_BETA = "interleaved-thinking-2025-05-14"
"""The beta whose budget may exceed ``max_tokens``."""


@dataclass(frozen=True, slots=True)
class ThinkingFit:
    """What :func:`fit_thinking` changed: the budget asked, the one sent (None: thinking
    off for this request) and the options that carry it."""

    asked: int
    sent: int | None
    max_tokens: int
    options: Mapping[str, Any]


def _budget(thinking: Any) -> int | None:
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def _interleaved(options: Mapping[str, Any]) -> bool:
    betas = options.get("betas")
    extra = options.get("extra_headers")
    header = extra.get("anthropic-beta") if isinstance(extra, Mapping) else None
    named = [*(betas if isinstance(betas, list | tuple) else ()),
             *(str(header).split(",") if header else ())]
    return any(str(b).strip() == INTERLEAVED_BETA for b in named)


def fit_thinking(options: Mapping[str, Any], max_tokens: int | None,
                 asked: int | None) -> ThinkingFit | None:
    """The options of a request sending ``max_tokens`` with thinking's budget fitted to
    it (module docstring), or None when nothing needs to change. ``asked``: the
    max_tokens before any lowering (None: as ``max_tokens``)."""
    if max_tokens is None:
        return None
    extra = options.get("extra_body")
    inner = extra if isinstance(extra, Mapping) else {}
    top = _budget(options.get("thinking")) is not None
    thinking = options.get("thinking") if top else inner.get("thinking")
    budget = _budget(thinking)
    if budget is None or not isinstance(thinking, Mapping) or _interleaved(options):
        return None
    asked = max_tokens if asked is None else max(asked, max_tokens)
    share = budget * max_tokens // asked if budget < asked else max_tokens // 2
    fitted = min(budget, share, max_tokens - 1)
    if fitted == budget:
        return None
    if fitted < MIN_BUDGET:
        sent: int | None = None
        changed: Mapping[str, Any] = {"type": "disabled"}
    else:
        sent = fitted
        changed = {**thinking, "budget_tokens": fitted}
    new = {**options, "thinking": changed} if top else \
        {**options, "extra_body": {**inner, "thinking": changed}}
    return ThinkingFit(budget, sent, max_tokens, new)
