"""The emulator's ``POST /tokenize``: an OpenAI-compatible server's token counter (no I/O).

Shaped as vLLM's (``vllm/entrypoints/openai/protocol.py``: ``TokenizeChatRequest`` —
``model``, ``messages``, optional ``tools`` — answered by ``TokenizeResponse``:
``count``, ``max_model_len``, ``tokens``), counted by the emulator's own token rule, so a
count is exactly the ``prompt_tokens`` a chat request with the same messages and tools
would report. A body with llama.cpp server's ``content`` instead (``{"content": text}`` →
``{"tokens": [...]}``) has its text counted by the same rule. Served at the server's root,
as vLLM and llama.cpp serve it (not under ``/v1``); ``Emulator(tokenize=False)`` plays a
server without one (404).
"""

from __future__ import annotations

import json
from typing import Any

from . import faults, replies
from .faults import Answer

__all__ = ["TOKENIZE_PATH", "tokenize_answer"]

TOKENIZE_PATH = "/tokenize"


def tokenize_answer(body: Any, *, context_window: int) -> Answer:
    """The answer to a tokenize request's parsed ``body``: 200 with the count, or vLLM's
    400 for a body that is neither shape."""
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        count = replies.prompt_tokens(replies.openai_turns(body), body.get("tools") or None)
    elif isinstance(body, dict) and isinstance(body.get("content"), str):
        count = replies.count_tokens(body["content"])
    else:
        return faults.bad_request("openai", "The request body must carry `messages` (chat) "
                                  "or `prompt`/`content` (text) to tokenize.")
    answer = {"count": count, "max_model_len": context_window, "tokens": [0] * count}
    return Answer(200, json.dumps(answer, separators=(",", ":")).encode(),
                  (("Content-Type", "application/json"),))
