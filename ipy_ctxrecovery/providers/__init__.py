"""Provider adapters on the official SDKs, and ``make_provider`` for model strings.

Model strings: ``openai:MODEL``, ``anthropic:MODEL``, ``emulator`` (the emulator through
the OpenAI wire format), ``emulator:anthropic`` (through the Anthropic wire format).
"""

from .base import Provider, Request, Response, StopReason, TextCallback, ToolSpec, Usage

__all__ = [
    "Provider",
    "Request",
    "Response",
    "StopReason",
    "TextCallback",
    "ToolSpec",
    "Usage",
]
