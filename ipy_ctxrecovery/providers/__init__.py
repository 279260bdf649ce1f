"""Provider adapters on the official SDKs, and ``make_provider`` for model strings.

Model strings: ``openai:MODEL``, ``anthropic:MODEL``, ``emulator`` (the emulator through
the OpenAI wire format), ``emulator:anthropic`` (through the Anthropic wire format). A
bare model name starting with ``claude`` means Anthropic; any other bare name means
OpenAI (or whatever a given ``client=`` speaks).
"""

from __future__ import annotations

import dataclasses
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from ..core.catalogue import ModelInfo, lookup
from ..errors import ConfigError
from .base import Provider, Request, Response, StopReason, TextCallback, ToolSpec, Usage

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "MODEL_FORMS",
    "Provider",
    "Request",
    "Response",
    "StopReason",
    "TextCallback",
    "ToolSpec",
    "Usage",
    "base_url",
    "emulator_identity",
    "is_emulator_model",
    "make_provider",
    "uses_responses_api",
]

MODEL_FORMS = ("openai:MODEL, anthropic:MODEL, emulator, emulator:anthropic, "
               "or a bare model name (claude… → Anthropic, anything else → OpenAI)")

EMULATOR_API_KEY = "emulator-key"
"""The dummy key SDK clients send to an emulator that does not announce its own."""

# Prefixes people try that this package does not take as providers; each gets a hint.
_FOREIGN_PREFIXES = {
    "azure": "pass client=openai.AzureOpenAI(...) with the model (deployment) name",
    "bedrock": "pass client=anthropic.AnthropicBedrock(...) with the model id",
    "vertex": "pass client=anthropic.AnthropicVertex(...) with the model id",
    "ollama": "set OPENAI_BASE_URL to the server's /v1 URL and use openai:MODEL",
    "vllm": "set OPENAI_BASE_URL to the server's /v1 URL and use openai:MODEL",
    "lmstudio": "set OPENAI_BASE_URL to the server's /v1 URL and use openai:MODEL",
}


def is_emulator_model(spec: str) -> bool:
    """True for the model strings served by the built-in emulator (``emulator``,
    ``emulator:anthropic``)."""
    return str(spec).strip().split(":", 1)[0].lower() == "emulator"


def base_url(provider: Any) -> str | None:
    """The base URL of the SDK client behind ``provider`` (None: it shows none)."""
    url = getattr(getattr(provider, "client", None), "base_url", None)
    return None if url is None else str(url)


_emulator_ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def emulator_identity(emulator: Any) -> str | None:
    """A random id for this emulator object while it lives in this process (None when it
    cannot be tracked). A restarted emulator, or any after a kernel restart, is another."""
    try:
        found = _emulator_ids.get(emulator)
        if found is None:
            found = _emulator_ids[emulator] = uuid.uuid4().hex
    except TypeError:       # not weak-referenceable
        return None
    return found


def _bad_spec(spec: str, why: str) -> ConfigError:
    return ConfigError(f"Model {spec!r} is not valid: {why}; use {MODEL_FORMS}.")


def _speaks_anthropic(client: Any) -> bool:
    return hasattr(client, "messages") and not hasattr(client, "chat")


def make_provider(spec: str, *, client: Any = None, emulator: Any = None,
                  settings: Settings | None = None, max_retries: int | None = None) -> Provider:
    """Build the provider for a model string (see the module docstring for the forms).

    ``client`` is used as is (base URL, headers, proxies untouched). For ``emulator*``
    the given ``emulator`` is used, or one is started that ``provider.close()`` stops;
    other models ignore ``emulator``.
    ``settings.context_window`` overrides the catalogue's (or the emulator's) window.
    Only the wire's own SDK is imported (each takes seconds to import the first time).
    """
    text = spec.strip() if isinstance(spec, str) else ""
    if not text or any(ch.isspace() for ch in text):
        raise _bad_spec(str(spec), "it is empty or contains spaces")
    window = settings.context_window if settings is not None else None
    prefix, sep, rest = text.partition(":")
    prefix = prefix.lower()

    if prefix == "emulator":
        wire = rest.lower() if sep else "openai"
        if wire not in ("openai", "anthropic"):
            raise _bad_spec(text, "the emulator speaks 'openai' or 'anthropic'")
        if client is not None:
            raise ConfigError(
                f"client= cannot be combined with {text!r}; the emulator builds its own client."
            )
        return _emulator_provider(text, wire, emulator, window, max_retries,
                                  openai_api=_openai_api(settings),
                                  store=bool(settings is not None and settings.openai_store))

    # ``emulator`` is ignored for other models: a session may hold one across model switches.
    if sep and prefix in ("openai", "anthropic"):
        if not rest.strip():
            raise _bad_spec(text, f"no model name after '{prefix}:'")
        model_id, wire, full = rest, prefix, text
    elif sep and prefix in _FOREIGN_PREFIXES:
        raise _bad_spec(text, _FOREIGN_PREFIXES[prefix])
    else:
        # Bare names may contain ':' themselves (Ollama tags such as llama3:8b).
        model_id = text
        if client is not None:
            wire = "anthropic" if _speaks_anthropic(client) else "openai"
        else:
            wire = "anthropic" if text.lower().startswith("claude") else "openai"
        full = f"{wire}:{model_id}"
    info = lookup(model_id, context_window=window)
    if wire == "anthropic":
        from .anthropic import AnthropicProvider

        return AnthropicProvider(model_id, client=client, info=info, spec=full,
                                 max_retries=max_retries)
    if uses_responses_api(_openai_api(settings), client):
        from .openai_responses import OpenAIResponsesProvider

        return OpenAIResponsesProvider(model_id, client=client, info=info, spec=full,
                                       max_retries=max_retries,
                                       store=bool(settings is not None and settings.openai_store))
    from .openai import OpenAIProvider

    return OpenAIProvider(model_id, client=client, info=info, spec=full, max_retries=max_retries)


OPENAI_SERVICE_HOST = "api.openai.com"
"""The host whose OpenAI wire speaks the Responses API when ``openai_api`` is "auto"."""


def _openai_api(settings: Settings | None) -> str:
    value = getattr(settings, "openai_api", "auto") if settings is not None else "auto"
    return value if isinstance(value, str) else "auto"


def uses_responses_api(openai_api: str, client: Any = None) -> bool:
    """Whether the OpenAI wire speaks the Responses API: ``openai_api`` "responses", or
    "auto" on OpenAI's own service (a ``client=``'s base URL, else ``OPENAI_BASE_URL``,
    else the SDK's default, api.openai.com). Any other server is of unknown capability
    and keeps Chat Completions, which every OpenAI-compatible server speaks."""
    if openai_api != "auto":
        return openai_api == "responses"
    import os
    from urllib.parse import urlsplit

    if client is not None:
        url = str(getattr(client, "base_url", "") or "")
        if type(client).__name__.startswith("Azure"):
            return False
    else:
        url = os.environ.get("OPENAI_BASE_URL") or f"https://{OPENAI_SERVICE_HOST}/v1"
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return False
    return host == OPENAI_SERVICE_HOST


def _emulator_provider(spec: str, wire: str, emulator: Any, window: int | None,
                       max_retries: int | None, *, openai_api: str = "auto",
                       store: bool = False) -> Provider:
    on_close = None
    if emulator is None:
        from ..emulator import Emulator

        emulator = Emulator() if window is None else Emulator(context_window=window)
        emulator.__enter__()

        def on_close() -> None:
            emulator.__exit__(None, None, None)

    info = _emulator_info(emulator, window)
    key = getattr(emulator, "api_key", None) or EMULATOR_API_KEY
    # The emulator's per-instance token: without it, it answers 401 (another local
    # process cannot use it, nor consume its scripted faults).
    headers = dict(getattr(emulator, "token_headers", None) or {})
    provider: Provider
    try:
        if wire == "anthropic":
            import anthropic

            from .anthropic import AnthropicProvider

            a_client = anthropic.Anthropic(base_url=emulator.anthropic_base_url, api_key=key,
                                           default_headers=headers)
            provider = AnthropicProvider("emulator", client=a_client, info=info, spec=spec,
                                         max_retries=max_retries, on_close=on_close,
                                         owns_client=True)
        elif openai_api == "responses":     # "auto" on the emulator: Chat Completions
            import openai

            from .openai_responses import OpenAIResponsesProvider

            o_client = openai.OpenAI(base_url=emulator.openai_base_url, api_key=key,
                                     default_headers=headers)
            # The emulator's model reasons, and encrypts its reasoning when asked.
            provider = OpenAIResponsesProvider("emulator", client=o_client, info=info,
                                               spec=spec, max_retries=max_retries,
                                               on_close=on_close, owns_client=True,
                                               store=store, encrypted_reasoning=True)
        else:
            import openai

            from .openai import OpenAIProvider

            o_client = openai.OpenAI(base_url=emulator.openai_base_url, api_key=key,
                                     default_headers=headers)
            provider = OpenAIProvider("emulator", client=o_client, info=info, spec=spec,
                                      max_retries=max_retries, on_close=on_close,
                                      owns_client=True)
    except BaseException:
        if on_close is not None:
            on_close()
        raise
    provider.emulator = emulator
    return provider


def _emulator_info(emulator: Any, window: int | None) -> ModelInfo:
    default = lookup("emulator")
    emu_window = getattr(emulator, "context_window", None) or default.context_window
    output = getattr(emulator, "max_output_tokens", None) or min(default.max_output_tokens, emu_window)
    info = dataclasses.replace(default, context_window=emu_window, max_output_tokens=output)
    if window is not None and window != emu_window:
        info = dataclasses.replace(info, context_window=window,
                                   max_output_tokens=min(output, window), window_overridden=True)
    return info
