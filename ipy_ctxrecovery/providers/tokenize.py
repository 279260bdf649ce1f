"""An OpenAI-compatible server's tokenize endpoint: the exact input tokens of a request
(``base.CountsTokens`` for the Chat Completions adapter).

Two shapes are in use, both served at the server's root (not under ``/v1``):

* vLLM: ``POST /tokenize`` ``{"model", "messages", "tools"?}`` → ``{"count": N,
  "max_model_len": …, "tokens": […]}`` — the chat template applied, so ``count`` is the
  prompt the chat request would have (vllm/entrypoints/openai/protocol.py,
  ``TokenizeChatRequest``/``TokenizeResponse``).
* llama.cpp server: ``POST /tokenize`` ``{"content": text}`` → ``{"tokens": […]}``
  (tools/server/tests/unit/test_tokenize.py). It reads only ``content``: a chat body gets
  ``{"tokens": []}``. Its count is of the text alone, so :data:`TEMPLATE_ALLOWANCE` is
  added for the chat template's tokens around each message.

The chat shape is asked first; an empty token list with no ``count`` switches this
provider to the text shape from the next request on. A 404/405/501 means the server has
no counter: remembered for the provider's life (the session's), so it is asked once. On
OpenAI's own service and Azure OpenAI there is no such endpoint for Chat Completions:
nothing is sent. Every request goes through the SDK's own client (``client.post``), with
a short timeout and no retries; any failure is "no count" (None), never an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

import openai

__all__ = ["NO_TOKENIZER_HOSTS", "TEMPLATE_ALLOWANCE", "TOKENIZE_TIMEOUT", "Tokenizer",
           "tokenize_url"]

log = logging.getLogger(__name__)

TOKENIZE_TIMEOUT = 5.0
"""Seconds a count may take; a slower server is decided on the estimate."""

NO_TOKENIZER_HOSTS = ("api.openai.com", ".openai.azure.com")
"""Hosts (a leading dot: any subdomain) known to have no tokenize endpoint."""

TEMPLATE_ALLOWANCE = (4, 3)
"""(tokens per message, tokens per request) added to a text-only count (llama.cpp's
shape) for the chat template's role markers — the allowance of OpenAI's own guide to
counting chat tokens (openai-cookbook, "How to count tokens with tiktoken")."""

_MISSING = frozenset({404, 405, 501})

Shape = Literal["chat", "text"]


def tokenize_url(base_url: Any) -> str | None:
    """The tokenize endpoint beside ``base_url`` (``http://h:8000/v1`` →
    ``http://h:8000/tokenize``; a gateway prefix is kept: ``…/llm/v1`` → ``…/llm/tokenize``),
    None on a host known to have none.

    >>> tokenize_url("http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000/tokenize'
    >>> tokenize_url("https://api.openai.com/v1") is None
    True
    """
    text = str(base_url or "").strip()
    if "://" not in text:
        return None
    scheme, rest = text.split("://", 1)
    host_port, _, path = rest.partition("/")
    host = host_port.rpartition("@")[2].split(":", 1)[0].lower()
    if any(host == h or (h.startswith(".") and host.endswith(h)) for h in NO_TOKENIZER_HOSTS):
        return None
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts and parts[-1] == "v1":
        parts.pop()
    return f"{scheme}://{host_port}/" + "/".join([*parts, "tokenize"])


class Tokenizer:
    """One provider's tokenize endpoint and what it has shown (module docstring)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.shape: Shape | None = "chat" if url is not None else None
        """The body shape to send; None: the server has no tokenize endpoint."""
        self.asked = 0
        """Count requests sent (for tests and the curious)."""

    @property
    def available(self) -> bool:
        return self.shape is not None

    def count(self, client: Any, *, model: str, messages: Sequence[dict[str, Any]],
              tools: Sequence[dict[str, Any]] | None,
              texts: Callable[[], list[str]]) -> int | None:
        """The input tokens of a chat request of ``messages`` (its wire form) and ``tools``,
        by one request to the server's tokenize endpoint; None when it cannot say.
        ``texts``: the request's texts, for the text shape."""
        shape, url = self.shape, self.url
        if shape is None or url is None:
            return None
        if shape == "chat":
            body: dict[str, Any] = {"model": model, "messages": list(messages)}
            if tools:
                body["tools"] = list(tools)
        else:
            pieces = texts()
            if tools:
                pieces.append(json.dumps(list(tools)))
            body = {"content": "\n\n".join(pieces)}
        self.asked += 1
        try:
            answer = client.with_options(timeout=TOKENIZE_TIMEOUT, max_retries=0).post(
                url, cast_to=object, body=body)
        except openai.APIStatusError as exc:
            if exc.status_code in _MISSING:
                self.shape = None       # no counter here: never asked again
            log.debug("tokenize: HTTP %s; deciding on the estimate", exc.status_code)
            return None
        except Exception as exc:  # a timeout, a reset, a body that is not JSON: no count
            log.debug("tokenize failed (%s); deciding on the estimate", type(exc).__name__)
            return None
        return self._read(answer, len(messages))

    def _read(self, answer: Any, n_messages: int) -> int | None:
        if not isinstance(answer, dict):
            return None
        count = answer.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            return count
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            return None
        if self.shape == "chat":
            if not tokens and n_messages:
                self.shape = "text"     # llama.cpp reads only ``content``: ask so next time
            return None
        per_message, per_request = TEMPLATE_ALLOWANCE
        return len(tokens) + per_message * n_messages + per_request if tokens else None
