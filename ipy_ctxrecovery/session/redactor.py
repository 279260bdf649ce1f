"""Redactor: what one session masks before text is stored, shown in an error or an event,
or exported — its own client's credentials (keys, credential headers, what its base URL
carries) always, and the well-known secret formats
(``ipy_ctxrecovery.redaction``) unless the user opted out for conversation text.

What is *sent* to the model is never changed by it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from ..core.history import Compaction, Message, Reasoning, Text, ToolCall, ToolResult
from ..redaction import MIN_CREDENTIAL, mask_exact, mask_secrets, url_credentials

__all__ = ["Redactor", "client_credentials"]

_CREDENTIAL_ATTRS = ("api_key", "auth_token", "aws_secret_key", "aws_session_token",
                     "_azure_ad_token")
_CREDENTIAL_HEADER = re.compile(r"(?i)auth|key|token|secret|cookie|signature|password")
_SCHEME = re.compile(r"(?i)^(?:bearer|basic|token|digest)\s+")


@functools.lru_cache(maxsize=512)
def _is_credential_header(name: str) -> bool:
    # Remembered per name: a client's dozen header names are asked about every time text is
    # stored, and the case-blind alternation costs microseconds a name.
    return _CREDENTIAL_HEADER.search(name) is not None


def client_credentials(client: Any) -> set[str]:
    """The credential strings an SDK client sends: its key attributes, the values of its
    credential headers (``Authorization: Bearer K`` gives both the header value and K), and
    what its base URL and its ``default_query`` carry (user info, sent as
    ``Basic base64(user:password)``, and ``?key=``-like query values:
    :func:`~ipy_ctxrecovery.redaction.url_credentials`)."""
    if client is None:
        return set()
    values: list[Any] = [getattr(client, name, None) for name in _CREDENTIAL_ATTRS]
    try:
        headers = dict(getattr(client, "default_headers", None) or {})
        query = dict(getattr(client, "default_query", None) or {})
    except Exception:  # a client-like object whose headers cannot be listed
        headers, query = {}, {}
    values += [v for k, v in headers.items() if _is_credential_header(str(k))]
    url = getattr(client, "base_url", None)
    from_url = url_credentials(str(url)) if url is not None else frozenset()
    if query:
        # Judged as in a URL's query, in the forms it is sent (encoded) and echoed.
        from_url |= url_credentials("?" + urlencode(query, doseq=True))
    try:
        return set(_credential_strings(tuple(values))) | from_url
    except TypeError:           # an unhashable attribute value: not a string either
        return set(_credential_strings.__wrapped__(tuple(values))) | from_url


@functools.lru_cache(maxsize=64)
def _credential_strings(values: tuple[Any, ...]) -> frozenset[str]:
    # Remembered: the same client's values are asked about every time text is stored.
    found: set[str] = set()
    for value in values:
        if isinstance(value, str) and len(value.strip()) >= MIN_CREDENTIAL:
            found.add(value.strip())
            bare = _SCHEME.sub("", value.strip())
            if len(bare) >= MIN_CREDENTIAL:
                found.add(bare)
    return frozenset(found)


class Redactor:
    """Masks one session's credentials and the well-known formats.

    ``credentials`` is called for the strings the session's client sends *now* (the
    provider may change); every credential ever seen is remembered, so a key replaced
    after an auth failure is still masked where it was echoed. ``formats`` says whether
    conversation text is checked for well-known formats too (the ``redact_stored``
    setting); :meth:`shown` (errors, events) always checks them.
    """

    def __init__(self, credentials: Callable[[], Iterable[str]] = tuple,
                 formats: Callable[[], bool] = lambda: True) -> None:
        self._credentials = credentials
        self._formats = formats
        self._known: set[str] = set()
        self._longest_first: tuple[str, ...] = ()
        self._check: Callable[[], None] | None = None

    @contextlib.contextmanager
    def checking(self, check: Callable[[], None]) -> Iterator[None]:
        """Within the block, masking calls ``check`` now and then (it raises to stop: the
        turn's deadline), so a many-MB answer is masked within the turn or not at all."""
        before, self._check = self._check, check
        try:
            yield
        finally:
            self._check = before

    def credentials(self) -> tuple[str, ...]:
        """Every credential seen so far, longest first (asked each time text is masked)."""
        known = self._known
        before = len(known)
        known.update(c for c in self._credentials() if len(c) >= MIN_CREDENTIAL)
        if len(known) != before or len(self._longest_first) != len(known):
            self._longest_first = tuple(sorted(known, key=len, reverse=True))
        return self._longest_first

    def own(self, text: str) -> str:
        """``text`` with this session's credentials masked (nothing else)."""
        return mask_exact(text, self.credentials())

    def shown(self, text: str) -> str:
        """Text for an error or an event: credentials and formats masked, always."""
        return mask_secrets(mask_exact(text, self.credentials()))

    def stored(self, text: str) -> str:
        """Conversation text for a file: credentials always, formats unless opted out."""
        text = mask_exact(text, self.credentials())
        return mask_secrets(text, check=self._check) if self._formats() else text

    def value(self, data: Any) -> Any:
        """A JSON-like value with every string (keys too) passed through :meth:`stored`."""
        if isinstance(data, str):
            return self.stored(data)
        if isinstance(data, list):
            return [self.value(v) for v in data]
        if isinstance(data, dict):
            return {self.value(k) if isinstance(k, str) else k: self.value(v)
                    for k, v in data.items()}
        return data

    def arguments(self, text: str) -> str:
        """Tool-call arguments: masked value by value when they are JSON, so the masked
        text is still the same JSON shape; as text otherwise (or when nested too deeply
        to walk)."""
        try:
            data = json.loads(text)
            masked = self.value(data)
            return text if masked == data else json.dumps(masked, ensure_ascii=False)
        except (ValueError, RecursionError):
            return self.stored(text)

    def message(self, message: Message) -> Message:
        """``message`` as it may be stored (the same object when nothing was masked)."""
        blocks = tuple(self._block(b) for b in message.blocks)
        if all(new is old for new, old in zip(blocks, message.blocks, strict=True)):
            return message
        return message.with_blocks(blocks)

    def messages(self, messages: Iterable[Message]) -> tuple[Message, ...]:
        return tuple(self.message(m) for m in messages)

    def _block(self, block: Any) -> Any:
        if isinstance(block, Text):
            original = block.text
            text = self.stored(original)
            return block if text == original else Text(text)
        if isinstance(block, Reasoning):
            text = self.stored(block.text)
            # A provider's signature covers the exact text: a masked one cannot be sent back.
            return block if text == block.text else Reasoning(text, None)
        if isinstance(block, Compaction):
            # The server's summary may repeat a secret of the conversation. A masked block
            # no longer matches its signature: a session resumed from disk sends it as the
            # provider's failed compaction would be (a no-op), and the transcript has all.
            summary = None if block.summary is None else self.stored(block.summary)
            data = self.stored(block.data)
            if summary == block.summary and data == block.data:
                return block
            return Compaction(block.wire, data, summary)
        if isinstance(block, ToolCall):
            arguments = self.arguments(block.arguments)
            return block if arguments == block.arguments else replace(block, arguments=arguments)
        if isinstance(block, ToolResult):
            content = self.stored(block.content)
            return block if content == block.content else replace(block, content=content)
        return block
