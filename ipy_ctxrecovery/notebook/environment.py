"""What the kernel's environment says: the model used by default, where each provider's
requests go (and through which proxy), and the ``CHATCLI_*`` settings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from ..core.wording import endpoint_text
from ..providers import is_emulator_model
from ..providers.base_urls import query_problem
from ..session.redactor import client_credentials
from ..settings import ENV_VARS, ConfigError, Settings, proxy_for, public_url

__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "DEFAULT_OPENAI_MODEL",
    "SDK_ENDPOINTS",
    "auto_model",
    "base_url_problem",
    "default_endpoint",
    "describe_endpoint",
    "env_settings",
    "session_endpoint",
]

# Used when only a key is configured: current, non-deprecated models in both SDKs' lists.
DEFAULT_OPENAI_MODEL = "openai:gpt-5.4-mini"
DEFAULT_ANTHROPIC_MODEL = "anthropic:claude-sonnet-5-5"

#: Where each provider's SDK sends requests unless its base-URL variable says otherwise.
_KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")

SDK_ENDPOINTS = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
}


def auto_model(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The model used when none is configured, and why: a key in the environment, else the emulator."""
    source = os.environ if env is None else env
    if source.get("OPENAI_API_KEY", "").strip():
        return DEFAULT_OPENAI_MODEL, "OPENAI_API_KEY is set"
    if source.get("ANTHROPIC_API_KEY", "").strip():
        return DEFAULT_ANTHROPIC_MODEL, "ANTHROPIC_API_KEY is set"
    return "emulator", "no OPENAI_API_KEY/ANTHROPIC_API_KEY set"


def _wire(model: str) -> str:
    prefix = model.split(":", 1)[0].lower()
    return prefix if prefix in SDK_ENDPOINTS else (
        "anthropic" if model.lower().startswith("claude") else "openai")


def default_endpoint(model: str, env: Mapping[str, str] | None = None) -> str | None:
    """Where ``model``'s requests go with the SDK's own settings (None: the emulator)."""
    if is_emulator_model(model):
        return None
    source = os.environ if env is None else env
    var, default = SDK_ENDPOINTS[_wire(model)]
    return source.get(var, "").strip() or default


def base_url_problem(model: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why the SDK's base-URL variable cannot work for ``model`` (a query string: see
    ``providers.base_urls``), in one sentence; None when it can or is not set."""
    if is_emulator_model(model):
        return None
    source = os.environ if env is None else env
    wire = _wire(model)
    var = SDK_ENDPOINTS[wire][0]
    return query_problem(source.get(var, "").strip() or None, wire=wire, source=var)


def describe_endpoint(url: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """``url`` and the proxy the environment routes it through, credentials masked."""
    if url is None:
        return None
    source = os.environ if env is None else env
    # A gateway may take the key in the path: the environment's keys are masked there too.
    keys = tuple(source.get(var, "") for var in _KEY_VARS)
    proxy, var = proxy_for(url, env) or (None, None)
    return endpoint_text(public_url(url, keys), proxy, proxy_var=var)


def session_endpoint(session: Any, embedded: Any = None) -> str:
    """Where a live session's requests go (``%chat status``); ``embedded``: the kernel's
    own emulator (a session given another one is told as "an emulator"). The OpenAI
    wire's Responses API is named (``openai_api``: the user can see the one in use)."""
    where = _endpoint(session, embedded)
    # Read where it is loaded, not imported here: importing it imports the openai SDK, which
    # the extension's load leaves to the first session that needs it (bench/panel.py).
    responses = sys.modules.get("ipy_ctxrecovery.providers.openai_responses")
    if responses is not None and isinstance(session.provider,
                                            responses.OpenAIResponsesProvider):
        where += " (Responses API)"
    return where


def _endpoint(session: Any, embedded: Any) -> str:
    provider = session.provider
    client = getattr(provider, "client", None)
    url = getattr(client, "base_url", None)
    emulator = getattr(provider, "emulator", None)
    if emulator is not None and url is not None:
        which = "the embedded emulator" if emulator is embedded else "an emulator"
        return f"{which} at {public_url(url)}"
    if url is None:
        return "set by your own client"
    keys = tuple(client_credentials(client))
    if _own_http_client(client):
        return endpoint_text(public_url(str(url), keys), own_http_client=True)
    proxy, var = proxy_for(str(url)) or (None, None)
    return endpoint_text(public_url(str(url), keys), proxy, proxy_var=var)


def _own_http_client(client: Any) -> bool:
    """Whether an SDK client was built with the user's ``http_client=`` (its proxy, CA and
    transport are its own) rather than the SDK's default, which reads the environment.
    Both SDKs keep the HTTP client as ``_client`` and name their default's class so."""
    http = getattr(client, "_client", None)
    return http is not None and type(http).__name__ != "SyncHttpxClientWrapper"


def env_settings(env: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """Settings from the CHATCLI_* variables, skipping bad ones with one warning line each.

    A value that cannot be read (``lots`` for a size) is named with its own sentence. The
    rest are kept as long as they hold together: a variable is kept when the settings
    with it and the ones kept so far are valid, asked again until nothing changes (so a
    pair set to agree is kept whatever its order); each one left out is named with what
    it contradicts — another bad variable never costs a good one its value.
    """
    source = os.environ if env is None else env
    readable: dict[str, str] = {}
    warnings: dict[str, str] = {}
    for var, field_name in ENV_VARS.items():
        raw = source.get(var, "")
        if not raw.strip():
            continue
        try:
            Settings.read_value(var, raw)   # the value itself; the checks come next
        except ConfigError as e:
            # "ignoring CHATCLI_PRICES: CHATCLI_PRICES: the price of…" said the name twice.
            said = str(e).removeprefix(f"{var}: ")
            warnings[var] = (f"⚠ ignoring {var}: {said} Using the default "
                             f"({_shown_default(field_name)}).")
            continue
        readable[var] = raw
    kept: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for var, raw in readable.items():
            if var not in kept and _valid({**kept, var: raw}):
                kept[var] = raw
                changed = True
    for var, raw in readable.items():
        if var in kept:
            continue
        try:
            Settings().updated({**kept, var: raw}, source="environment variable")
        except ConfigError as e:
            reason = str(e).rstrip(".")
            warnings[var] = (f"⚠ ignoring {var}={raw}: {reason}. Using the default "
                             f"({_shown_default(ENV_VARS[var])}).")
    ordered = [warnings[var] for var in ENV_VARS if var in warnings]
    return Settings().updated(kept, source="environment variable"), ordered


def _valid(values: Mapping[str, str]) -> bool:
    try:
        Settings().updated(values, source="environment variable")
    except ConfigError:
        return False
    return True


def _shown_default(field_name: str) -> str:
    default = getattr(Settings(), field_name)
    return "none" if default is None else str(default)
