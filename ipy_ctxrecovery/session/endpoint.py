"""Endpoint: the provider a session talks through, who owns it, and the network path it uses.

A session builds its own provider from a model string (and then owns it: it closes it and
may rebuild it to re-read a key), or is handed one (the caller keeps it). The network path
— the client's base URL plus the emulator behind it — is what a learned payload cap
belongs to: :meth:`Endpoint.path_key` names it, without user info, query or fragment, so
no secret reaches a file.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..core.catalogue import ModelInfo
from ..errors import redact
from ..providers import base_url, emulator_identity, is_emulator_model
from ..providers.base import Closable, Provider, Refreshable
from ..redaction import MASK, path_credential
from .redactor import client_credentials

__all__ = ["OWN_SERVICE_HOSTS", "Endpoint", "public_url"]

OWN_SERVICE_HOSTS = frozenset({"api.openai.com", "api.anthropic.com"})

ProviderFactory = Callable[[str, Any, Any], Provider]
"""``factory(model, client, emulator)`` → a new provider (``providers.make_provider``)."""


def public_url(url: str, secrets: Iterable[str] = ()) -> str:
    """``url`` without user info, query or fragment (where a secret could hide), and with
    path segments that are credentials masked (a key in a known format, or one of
    ``secrets``: :func:`~ipy_ctxrecovery.redaction.path_credential`)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    known = frozenset(s for s in secrets if s)
    path = "/".join(MASK if path_credential(seg, known) else seg
                    for seg in parts.path.rstrip("/").split("/"))
    return urlunsplit((parts.scheme, host, path, "", ""))


class Endpoint:
    """The provider in use, and what the session needs to know about it."""

    def __init__(self, provider: Provider, *, owned: bool, client: Any = None,
                 emulator: Any = None, factory: ProviderFactory | None = None) -> None:
        self.provider = provider
        self.owned = owned
        self.client = client          # the SDK client the user gave, if any
        self.emulator = emulator      # the emulator ``emulator*`` models talk to
        self._factory = factory
        self.cache_key: str | None = None
        """The conversation's ``prompt_cache_key`` (``Caching.key``), sent on the provider's
        own service only (:attr:`on_own_service`); None: none."""

    @property
    def model(self) -> str:
        return self.provider.model

    @property
    def info(self) -> ModelInfo:
        return self.provider.info

    @property
    def on_emulator(self) -> bool:
        return is_emulator_model(self.model)

    @property
    def on_own_service(self) -> bool:
        """The provider's own service (api.openai.com, api.anthropic.com) or the emulator,
        which take every caching parameter; a gateway or another server may refuse one."""
        if self.on_emulator:
            return True
        url = base_url(self.provider)
        try:
            host = (urlsplit(url).hostname or "").lower() if url else ""
        except ValueError:
            return False
        return host in OWN_SERVICE_HOSTS

    def path_key(self) -> str | None:
        """The network path as a string (None: the provider shows no base URL)."""
        return path_key(self.provider)

    def refresh(self) -> None:
        """Re-create the provider (and so its client) so a changed key is re-read.

        A provider that can refresh itself does; a user's client or provider is theirs to
        fix, and the emulator has no key to re-read.
        """
        if isinstance(self.provider, Refreshable):
            self.provider.refresh()
            return
        if not self.owned or self.client is not None or self.on_emulator \
                or self._factory is None:
            return
        try:
            fresh = self._factory(self.model, None, None)
        except Exception as e:  # keep the old provider; the retry will report the failure
            warnings.warn(f"could not re-create the provider: {redact(str(e))}",
                          RuntimeWarning, stacklevel=2)
            return
        old, self.provider = self.provider, fresh
        if isinstance(old, Closable):
            old.close()

    def path_change(self, new: Provider) -> str | None:
        """Why ``new`` reaches the model over another path than the current provider
        (None: the same path). A provider that shows no base URL is a new path."""
        old = self.provider
        if getattr(old, "emulator", None) is not getattr(new, "emulator", None):
            return "the new emulator"
        old_url, new_url = base_url(old), base_url(new)
        if old_url is None or new_url is None:
            return "the new provider"
        if old_url != new_url:
            return "the new endpoint"
        return None

    def replace(self, new: Provider, *, owned: bool) -> None:
        """Use ``new`` from now on; close the old provider if the session built it."""
        old, was_owned = self.provider, self.owned
        self.provider, self.owned = new, owned
        if was_owned and old is not new and isinstance(old, Closable):
            old.close()   # only what the session built itself, never a user's provider

    def close(self) -> None:
        """Release what the session's own provider opened (never a user's client)."""
        if self.owned and isinstance(self.provider, Closable):
            self.provider.close()


def path_key(provider: Provider) -> str | None:
    """The network path ``provider`` uses: public base URL plus its emulator's identity."""
    url = base_url(provider)
    if url is None:
        return None
    # A gateway may take the key in the path: never part of the key, so never in learned.json.
    key = public_url(url, client_credentials(getattr(provider, "client", None)))
    emulator = getattr(provider, "emulator", None)
    if emulator is not None:
        identity = emulator_identity(emulator)
        if identity is None:
            return None           # an emulator we cannot track is never the same path
        key += f" emulator {identity}"
    return key
