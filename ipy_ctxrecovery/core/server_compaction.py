"""The provider's server-side compaction, decided here as pure functions
(``docs/server-compaction.md``).

* :func:`use`: whether a request asks for it (the ``server_compaction`` setting, the
  model, and whether the provider's API can carry it at all).
* :func:`trigger`: the ``compact_trigger`` (tokens) a request carries, from the chat budget
  the package compacts at itself, clamped up to the server's lowest trigger.
* :func:`server_compacts`: whether the server, not the package, keeps the window — then
  the package's own LLM summary does not run for it.
* :func:`split_reply` and :func:`replace_before`: a reply that starts with a
  :class:`~.history.Compaction` becomes the compaction message, which replaces every
  message before it but the system prompt and the pinned rules, and the answer after it.
* :func:`clearable_tool_tokens`: what the server's context editing (``clear_tool_uses``)
  could clear, to ask for it only where tool results are heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..settings import Settings
from . import pins
from .compactor import NO_LIMIT, ChatBudget
from .history import (
    TAG_PINNED_RULES,
    TAG_SERVER_COMPACTION,
    Compaction,
    History,
    Message,
    Role,
    is_server_compaction,
)

__all__ = [
    "Trigger",
    "Use",
    "clearable_tool_tokens",
    "compaction_of",
    "replace_before",
    "server_compacts",
    "split_reply",
    "steady",
    "trigger",
    "use",
]

Note = Literal["unsupported_model", "unsupported_api"]


@dataclass(frozen=True, slots=True)
class Use:
    """Whether a request asks the provider to compact on its server.

    ``asked``: the request carries the compact edit. ``carried``: the provider's API can
    carry it (Anthropic's Messages, OpenAI's Responses API; not Chat Completions), so an
    ask can be answered. ``note``: what ``"on"`` is told once — the model is not known to
    compact on its server (asked all the same), or the API cannot carry it (the package
    compacts as before).
    """

    asked: bool
    carried: bool = True
    note: Note | None = None


def use(setting: str, *, model_supports: bool, api_supports: bool) -> Use:
    """The decision for one request: ``"off"`` never; ``"auto"`` where the model and the
    API support it; ``"on"`` always asked (a model not known to support it is told once;
    an API that cannot carry it leaves it out, and the package compacts as before)."""
    if setting == "off":
        return Use(False)
    if setting == "on":
        if not api_supports:
            return Use(True, carried=False, note="unsupported_api")
        return Use(True, note=None if model_supports else "unsupported_model")
    return Use(model_supports and api_supports)


@dataclass(frozen=True, slots=True)
class Trigger:
    """The ``compact_trigger`` a request carries.

    ``derived``: the tokens the chat budget asks for (the package's own trigger: the
    lesser of the window's share and the payload cap's share, at the calibrated
    bytes/token); ``of`` which of the two set it. ``tokens``: ``derived`` clamped up to the
    server's lowest trigger; ``clamped`` when that clamp won — the server would compact
    later than the budget allows, so the package keeps the body within it as today.
    """

    tokens: int
    derived: int
    clamped: bool
    of: Literal["window", "cap"] | None = None


def trigger(budget: ChatBudget, *, bytes_per_token: float, min_trigger: int) -> Trigger:
    """``budget`` (bytes) in tokens at ``bytes_per_token`` (:func:`steady`), clamped up to
    ``min_trigger``.

    A budget with no term (``NO_LIMIT``: neither a window nor a cap) leaves the trigger to
    the server's lowest (which is then no clamp: nothing asked for less)."""
    if budget.bytes >= NO_LIMIT or budget.of is None:
        return Trigger(max(1, min_trigger), max(1, min_trigger), False, None)
    # Rounded, not floored: a window's budget is its tokens × bytes/token floored to bytes,
    # and back in tokens a floor would land just under a round number (149,999 of 150,000)
    # that two significant figures then take down a step (140,000).
    derived = steady(max(1, round(budget.bytes / max(bytes_per_token, 1e-9))))
    if derived < min_trigger:
        return Trigger(min_trigger, derived, True, budget.of)
    return Trigger(derived, derived, False, budget.of)


def steady(tokens: int) -> int:
    """``tokens`` rounded down to two significant figures (6,144 → 6,100; 11,468 →
    11,000): the calibrated bytes/token moves a little after every reply, and a trigger
    that followed it would change the body (and what a plan measured) on every turn."""
    if tokens < 100:
        return tokens
    unit = 10 ** (len(str(tokens)) - 2)
    return tokens // unit * unit


def server_compacts(decision: Use, when: Trigger | None) -> bool:
    """Whether the server keeps the window: asked, carried, and not clamped away. Then the
    package's own LLM summary does not run for the window (microcompact, the tool-result
    budget and the fit to a payload cap still do)."""
    return decision.asked and decision.carried and when is not None and not when.clamped


def compaction_of(message: Message) -> Compaction | None:
    """The :class:`Compaction` block ``message`` holds (None: none)."""
    for block in message.blocks:
        if isinstance(block, Compaction):
            return block
    return None


def split_reply(message: Message) -> tuple[Message | None, Message]:
    """A reply whose blocks start with a :class:`Compaction`: (the compaction message,
    tagged :data:`TAG_SERVER_COMPACTION`, and the answer: the blocks after it). Any other
    reply: (None, the reply)."""
    if not message.blocks or not isinstance(message.blocks[0], Compaction):
        return None, message
    compaction = Message(Role.ASSISTANT, (message.blocks[0],), tag=TAG_SERVER_COMPACTION)
    return compaction, message.with_blocks(message.blocks[1:])


def replace_before(history: History, compaction: Message, *,
                   settings: Settings | None = None) -> History:
    """``history`` as the server compaction leaves it: the system messages (in order), the
    compaction message, and the pinned-rules message after it (the user's standing
    instructions, verbatim).

    The pinned rules go *after* the compaction: the API reads nothing before a compaction
    block (it drops it), so kept before it they would be bytes the cap pays for and the
    model never reads; after it they are read beside the server's summary, as they are
    after the package's own. With ``settings``, the rules the user stated in the messages
    the compaction replaces are pinned too, as the package's own compaction pins them
    (``pins.keep``, bounded by ``pinned_rules_max_chars``); without new ones the pinned
    message is kept as it was. Every other message is replaced (the transcript keeps it).
    """
    systems = tuple(m for m in history if m.role is Role.SYSTEM)
    pinned = [m for m in history if m.tag == TAG_PINNED_RULES][-1:]
    if settings is not None:
        kept = pins.keep(pins.carried(history), history, target_bytes=0, settings=settings)
        if kept.new_rules and kept.pinned is not None:
            pinned = [kept.pinned]
    return (*systems, compaction, *pinned)


def clearable_tool_tokens(history: Sequence[Message], *, keep: int,
                          bytes_per_token: float) -> int:
    """Tokens (estimated) of the tool results a ``clear_tool_uses`` edit keeping the latest
    ``keep`` tool uses could clear: every result but the latest ``keep``, after the latest
    server compaction (what is before it is not sent)."""
    start = 0
    for i, m in enumerate(history):
        if is_server_compaction(m):
            start = i + 1
    sizes = [len(r.content.encode("utf-8", errors="surrogatepass"))
             for m in history[start:] if m.role is Role.TOOL
             for r in (m.tool_result,) if r is not None]
    old = sizes[:-keep] if keep > 0 else sizes
    return int(sum(old) / max(bytes_per_token, 1e-9))
