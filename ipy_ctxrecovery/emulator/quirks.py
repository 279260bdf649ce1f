"""How OpenAI-compatible servers really answer, where they differ from the OpenAI API: the
emulator's quirk flags, each declared once (:data:`QUIRKS`), and the answers they give.

All three are on the OpenAI path (``/v1/chat/completions``) and are what
llama-cpp-python's server (``python -m llama_cpp.server``) does:

* ``string_content_only`` — a message whose ``content`` is a list of parts gets HTTP 500.
  The server renders the messages with the model's Jinja chat template, and templates such
  as SmolLM2's concatenate ``message['content']`` as a string: the ``TypeError`` becomes
  ``{"error": {"message": "can only concatenate str (not \\"list\\") to str", "type":
  "internal_server_error", "param": null, "code": null}}`` (``llama_cpp/server/errors.py``
  ``RouteErrorHandler``; the error as users met it: abetlen/llama-cpp-python#1080).
* ``empty_stream_on_error`` — a streamed request the server refuses (over the window, a
  content its template cannot render, roles that do not alternate, ``max_tokens`` above
  the output limit) gets ``200`` and an event stream with no event at all, not even
  ``data: [DONE]``: the server starts the SSE response before it calls the model
  (``llama_cpp/server/app.py`` ``get_event_publisher``), and sse-starlette under uvicorn
  then ends the stream cleanly when the call raises (measured with sse-starlette 3.7 and
  uvicorn 0.54). The same body unstreamed gets the server's own error; over the window
  that is its 400 in its own wording and by its own rule — a prompt of at least
  ``n_ctx`` tokens is refused, a ``max_tokens`` that does not fit beside the prompt is cut
  to fit rather than refused (``llama_cpp/llama.py``): "This model's maximum context length
  is 2048 tokens. However, you requested 2285 tokens (2285 in the messages, None in the
  completion). Please reduce the length of the messages or completion."
* ``stream_usage=False`` — streamed replies carry no usage, whatever
  ``stream_options.include_usage`` asks (llama-cpp-python's chunks have none).

``Emulator(**{name: value})``, ``python -m ipy_ctxrecovery.emulator --FLAG`` and
``%chat emulator --FLAG`` all take them from :data:`QUIRKS` (:func:`arguments`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .faults import Answer, _date

__all__ = ["QUIRKS", "Quirk", "arguments", "check", "content_rejection", "empty_stream",
           "has_list_content", "overflow_error"]


@dataclass(frozen=True, slots=True)
class Quirk:
    """One quirk flag: the ``Emulator`` keyword, its default, the command-line flag that
    turns the default around (on both command lines), and its help."""

    name: str
    default: bool
    flag: str
    help: str


QUIRKS: tuple[Quirk, ...] = (
    Quirk("string_content_only", False, "--string-content-only",
          "Answer HTTP 500 to a message whose content is a list of parts, as "
          "llama-cpp-python's server does (its chat templates take only a string)."),
    Quirk("empty_stream_on_error", False, "--empty-stream-on-error",
          "Answer a streamed request it refuses (over the window, ...) with HTTP 200 and "
          "an empty event stream, and the same request unstreamed with its error, as "
          "llama-cpp-python's server does."),
    Quirk("stream_usage", True, "--no-stream-usage",
          "Leave usage out of streamed replies, even when stream_options.include_usage "
          "asks for it (llama-cpp-python)."),
)


def arguments() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """The quirks as ``add_argument(*flags, **options)`` pairs. Not given, a flag parses
    to None (the emulator's default stands); given, to the opposite of the default."""
    return [((q.flag,), {"dest": q.name, "action": "store_const", "const": not q.default,
                         "default": None, "help": q.help}) for q in QUIRKS]


def check(name: str, value: Any) -> bool:
    """``value`` for the quirk ``name``, which must be True or False."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be True or False.")
    return value


def has_list_content(messages: Sequence[Any]) -> bool:
    """Whether any message of a Chat Completions ``messages`` list has list content."""
    return any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages)


# What FastAPI's JSONResponse sends under uvicorn (compact JSON, these headers).
_JSON_HEADERS = (("server", "uvicorn"), ("content-type", "application/json"))


def _json_answer(status: int, error: dict[str, Any]) -> Answer:
    body = json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":"))
    return Answer(status, body.encode(), (("date", _date()), *_JSON_HEADERS))


def content_rejection() -> Answer:
    """llama-cpp-python's 500 for a content its chat template cannot concatenate."""
    return _json_answer(500, {"message": 'can only concatenate str (not "list") to str',
                              "type": "internal_server_error", "param": None, "code": None})


def overflow_error(*, window: int, prompt: int, max_tokens: int | None) -> Answer | None:
    """llama-cpp-python's 400 for a prompt of ``window`` tokens or more (its rule: a
    ``max_tokens`` that does not fit is cut, not refused); None when the prompt fits."""
    if prompt < window:
        return None
    message = (f"This model's maximum context length is {window} tokens. However, you "
               f"requested {(max_tokens or 0) + prompt} tokens ({prompt} in the messages, "
               f"{max_tokens} in the completion). Please reduce the length of the messages "
               "or completion.")
    return _json_answer(400, {"message": message, "type": "invalid_request_error",
                              "param": "messages", "code": "context_length_exceeded"})


EMPTY_STREAM_HEADERS: tuple[tuple[str, str], ...] = (
    ("server", "uvicorn"), ("cache-control", "no-store"), ("x-accel-buffering", "no"),
    ("content-type", "text/event-stream; charset=utf-8"))
"""The headers sse-starlette's EventSourceResponse sends under uvicorn."""


def empty_stream() -> tuple[tuple[tuple[str, str], ...], tuple[bytes, ...]]:
    """A ``200`` event stream with no event in it (the server's ``Streamed`` answer)."""
    return EMPTY_STREAM_HEADERS, ()
