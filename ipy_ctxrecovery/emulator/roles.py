"""Strict role alternation on the OpenAI path, as the chat templates of many open models
enforce it, with the rejections the servers running them send back.

The templates of Mistral, Llama 2, Gemma and others raise ``Conversation roles must
alternate user/assistant/user/assistant/...`` from Jinja. The rule here is the one in
Mistral's templates: after an optional first system message, the messages must alternate
user, assistant, user, … starting with a user message — any role other than ``user``
counts as the assistant's turn — leaving out tool results and the assistant messages that
call tools ("except for tool calls and results"). A request with two user messages in a row
is rejected, as one with a system message after the first turn at a user's place.

How the servers answer (``STYLES``):

* ``vllm`` — HTTP 400, ``{"error": {"message": "Conversation roles must alternate
  user/assistant/user/assistant/...", "type": "BadRequestError", "param": null, "code":
  400}}`` (vLLM serving Gemma 3: suitenumerique/conversations#197; older vLLM put the same
  fields at the top level with ``"object": "error"``, vllm-project/vllm#6862).
* ``llama.cpp`` — HTTP 500 (the template's exception is a server error there), ``{"error":
  {"code": 500, "message": "\\n------------\\nWhile executing CallExpression at line 19,
  column 27 in source: … Error: Jinja Exception: Conversation roles must alternate
  user/assistant/user/assistant/...", "type": "server_error"}}`` (llama-server,
  idiap/sdialog#122).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .faults import Answer, _date

__all__ = ["MESSAGE", "STYLES", "alternates", "rejection"]

STYLES = ("vllm", "llama.cpp")

MESSAGE = "Conversation roles must alternate user/assistant/user/assistant/..."

_LLAMA_CPP_SOURCE = (
    "\n------------\nWhile executing CallExpression at line 19, column 27 in source:\n"
    "...% 2 == 0) -%}\u21b5        {{ raise_exception(\"Conversation roles must alternate "
    "user...\n                                           ^\nError: Jinja Exception: "
)


def alternates(messages: Sequence[Any]) -> bool:
    """Whether ``messages`` (a Chat Completions ``messages`` list) pass the rule above."""
    items = [m for m in messages if isinstance(m, Mapping)]
    if items and items[0].get("role") in ("system", "developer"):
        items = items[1:]
    turns = [m for m in items
             if m.get("role") != "tool" and not (m.get("role") == "assistant"
                                                 and m.get("tool_calls"))]
    return all((m.get("role") == "user") == (i % 2 == 0) for i, m in enumerate(turns))


def rejection(style: str) -> Answer:
    """The answer of a server of ``style`` to a request that does not alternate."""
    if style == "llama.cpp":
        body: dict[str, Any] = {"error": {"code": 500, "message": _LLAMA_CPP_SOURCE + MESSAGE,
                                          "type": "server_error"}}
        return Answer(500, json.dumps(body, ensure_ascii=False).encode(),
                      (("Date", _date()), ("Content-Type", "application/json; charset=utf-8"),
                       ("Server", "llama.cpp")))
    body = {"error": {"message": MESSAGE, "type": "BadRequestError", "param": None, "code": 400}}
    return Answer(400, json.dumps(body).encode(),
                  (("Date", _date()), ("Content-Type", "application/json"),
                   ("server", "uvicorn")))
