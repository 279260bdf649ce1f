"""Replies that are not what an API sends, each one sentence (``core.wording``).

An HTTP 200 whose body is an HTML page or a plain text — a proxy, a captive portal or a
login page answering for the API — is named by its content type and its first words
(masked, shortened) instead of the JSON parser's "Expecting value: line 1 column 1".
A body that starts like JSON but does not parse stays a cut-off reply (``_common``).
A 200 in the API's shape that holds no answer at all (an empty ``choices`` list, an empty
``content`` list) is :func:`no_answer`.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from typing import Any

import httpx2

from ..core.classify import fingerprint, page_title
from ..core.wording import first_line, no_answer_in_reply, not_json_reply
from ..errors import ChatError, redact
from ..failures import Failure, FailureKind
from ..settings import public_url

__all__ = ["check_stream", "excerpt", "no_answer", "not_json", "not_json_body", "parse_failure",
           "rejected_reply", "reply_json"]

EXCERPT_CHARS = 100
"""How much of a body that is not JSON the sentence quotes."""

_STREAM_TYPES = ("event-stream", "eventstream")   # SSE, and Bedrock's binary event stream
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_UNSHOWN = re.compile(r"<(script|style|head)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def _looks_like_json(body: bytes) -> bool:
    """Whether ``body`` is empty or starts like a JSON object or array: a cut-off or
    garbled reply of the API, not something else answering for it."""
    head = body.lstrip()[:1]
    return not head or head in (b"{", b"[")


def _is_html(content_type: str, text: str) -> bool:
    return "html" in content_type.lower() or text.lstrip()[:1] == "<"


def excerpt(text: str, *, page: bool = False, limit: int = EXCERPT_CHARS) -> str:
    """The first words of a body as a person reads them, on one line, at most ``limit``
    characters, secrets masked. ``page``: an HTML page, read as its title and then its
    visible text (no tags, scripts or styles)."""
    if page:
        visible = html.unescape(_TAG.sub(" ", _UNSHOWN.sub(" ", text)))
        text = f"{page_title(text, ('title',))} {visible}"
    words = redact(" ".join(text.split())).split(" ")
    shown: list[str] = []
    for word in words:                  # whole words: a mask is never cut in two
        if len(" ".join([*shown, word])) > limit - 1:
            break
        shown.append(word)
    if not shown:
        return first_line(words[0], limit)
    return " ".join(shown) + ("…" if len(shown) < len(words) else "")


def not_json(response: httpx2.Response, size: int, api: str, *, streamed: bool = False,
             keys: Iterable[str] = ()) -> ChatError:
    """The ChatError for ``response``, a 200 whose (read) body is not what the API sends."""
    content_type = response.headers.get("content-type", "").split(";")[0].strip()
    url = public_url(response.url, keys) if response.url else None
    return not_json_body(response.content, size, api, content_type=content_type, url=url,
                         redirected=bool(response.history), streamed=streamed)


def not_json_body(body: bytes | str, size: int, api: str, *, content_type: str | None = None,
                  url: str | None = None, redirected: bool = False,
                  streamed: bool = False) -> ChatError:
    """The ChatError for a 200 whose ``body`` is not what the API sends (``content_type``
    None: not known, as when the SDK's own method parsed the reply)."""
    head = body[:64 * 1024]
    text = head.decode("utf-8", errors="replace") if isinstance(head, bytes) else head
    page = _is_html(content_type or "", text)
    words = excerpt(text, page=page)
    reason = not_json_reply(api, content_type, words, url, redirected=redirected,
                            streamed=streamed, page=page)
    return ChatError(Failure(FailureKind.OTHER, reason, request_bytes=size,
                             fingerprint=fingerprint(f"{content_type} {words}")))


def parse_failure(exc: BaseException, size: int, api: str) -> ChatError | None:
    """For the parser's error on a reply the SDK's own method read: :func:`not_json_body`
    when the document is not JSON at all, None when it starts like JSON (cut off)."""
    doc = getattr(exc, "doc", None) if isinstance(exc, json.JSONDecodeError) else None
    if not isinstance(doc, str) or _looks_like_json(doc.encode("utf-8", errors="replace")[:64]):
        return None
    return not_json_body(doc, size, api)


def rejected_reply(exc: BaseException, size: int, api: str,
                   keys: Iterable[str] = ()) -> ChatError | None:
    """For an SDK error on a 200 it would not read (a client built with
    ``_strict_response_validation``: "Expected Content-Type … application/json"):
    :func:`not_json` when the body is not JSON at all, else None."""
    response = getattr(exc, "response", None)
    if type(exc).__name__ != "APIResponseValidationError" \
            or not isinstance(response, httpx2.Response) or response.status_code != 200:
        return None     # an error event inside a 200 stream is the API's own error
    try:
        body = response.read()
    except Exception:  # noqa: BLE001 - an unreadable body: the SDK's error is told instead
        return None
    return None if _looks_like_json(body) else not_json(response, size, api, keys=keys)


def reply_json(response: Any, size: int, api: str, keys: Iterable[str] = ()) -> Any:
    """The parsed JSON of a whole reply (an ``httpx2.Response``, or its bytes). A body
    that is not JSON at all is :func:`not_json`; one that starts like JSON and does not
    parse raises the parser's error (a cut-off reply)."""
    if not isinstance(response, httpx2.Response):
        return json.loads(response)
    content = response.content
    try:
        return json.loads(content)
    except (json.JSONDecodeError, RecursionError):
        if _looks_like_json(content):
            raise
    raise not_json(response, size, api, keys=keys)


def check_stream(stream: Any, size: int, api: str, keys: Iterable[str] = ()) -> None:
    """Raise :func:`not_json` when a streamed reply's 200 is not an event stream: its
    content type is not one and its body (then read whole) neither starts like one nor
    like JSON (a server that answers a streamed request whole is read as before)."""
    response = getattr(stream, "response", None)
    if not isinstance(response, httpx2.Response):
        return
    content_type = response.headers.get("content-type", "").lower()
    if any(kind in content_type for kind in _STREAM_TYPES):
        return
    body = response.read()          # the stream then iterates these bytes
    if _looks_like_json(body) or body.lstrip().startswith(_SSE_FIELDS):
        return
    raise not_json(response, size, api, streamed=True, keys=keys)


def no_answer(size: int, api: str, what: str) -> ChatError:
    """A 200 in the API's shape with no answer in it: ``what`` is the empty part."""
    return ChatError(Failure(FailureKind.TRANSIENT, no_answer_in_reply(api, what),
                             request_bytes=size, fingerprint=fingerprint(f"empty {what}")))
