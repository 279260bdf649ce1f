"""Base URLs the SDKs cannot use: one with a query string, told in one sentence at setup.

Both SDKs join a request's path to the base URL as text, after its query string: with
``OPENAI_BASE_URL=https://gw/v1?key=K`` a chat request goes to ``https://gw/v1/`` with the
query ``key=Kchat/completions`` (Anthropic: ``?key=K/v1/messages``), so no request can
reach the API and the key is mangled too (tests/test_environment.py pins this on the
installed SDKs). A query belongs in the client's ``default_query``, which the SDKs add
after the path.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from ..settings import public_url

__all__ = ["query_problem"]

# wire -> (the SDK's name, its client class, its key variable)
_SDKS = {"openai": ("OpenAI", "openai.OpenAI", "OPENAI_API_KEY"),
         "anthropic": ("Anthropic", "anthropic.Anthropic", "ANTHROPIC_API_KEY")}


def query_problem(url: object, *, wire: str, source: str | None = None) -> str | None:
    """The sentence saying why ``url`` cannot be a base URL of the ``wire`` SDK (None when
    it can): it has a query string. ``source`` names where it was set (an environment
    variable); None: a client's ``base_url``. Credentials are masked (``public_url``)."""
    if url is None:
        return None
    text = str(url)
    if "?" not in text.partition("#")[0]:
        return None
    api, client_class, key_variable = _SDKS.get(wire, _SDKS["openai"])
    parts = urlsplit(text)
    bare = urlunsplit(parts._replace(query="", fragment=""))
    names = dict.fromkeys(unquote_plus(item.partition("=")[0])
                          for item in re.split(r"[&;]", parts.query) if item.partition("=")[0])
    query = ", ".join(f"{name!r}: ..." for name in names)
    where = source if source is not None else "the client's base_url"
    return (f"{where} ({public_url(text)}) has a query string, which the {api} SDK cannot "
            f"use: it adds each request's path after the query, so no request would reach "
            f"the API — give the base URL without the query ({public_url(bare)}) and send "
            f"the key as api_key= ({key_variable}) or in a header (default_headers=, or the "
            f"one your gateway documents), or pass the query as the client's default_query: "
            f"client={client_class}(base_url=..., default_query={{{query}}}).")
