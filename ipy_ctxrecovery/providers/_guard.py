"""What one send may read, and how it stops when its caller gives up on it.

Two bounds the SDKs do not have:

- **Size.** A reply body larger than the request's ``max_reply`` — an answer, an error
  body, an event stream (8 times the bound: each piece of an answer comes in a JSON
  envelope) — is refused before it is read further: at once when its ``Content-Length``
  says so, else as soon as the bytes read pass the bound. The SDKs read a whole body
  (an error body too) into memory and parse it; masking and saving it would then cost
  minutes.
- **Cancellation.** A send whose caller gave up (the turn's deadline, an interrupt: the
  request's :class:`~.base.Cancel` is set) stops at its next byte, and its socket is shut
  down at once, so a server that trickles bytes — or says nothing — holds neither the
  worker thread nor the connection. No request of a cancelled send is sent again.

Both work through event hooks on the SDK client's own HTTP client (its proxies, TLS and
transports untouched): a request hook and a response hook, installed once per HTTP client,
that act only inside :func:`guarding` — the send on this thread says what applies through a
context variable, so the user's own requests through the same client are left alone.
The refusal raised is the adapter's subclass of :class:`ReplyRefused` and of its SDK's base
error, which neither SDK wraps or retries.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx2

from ..core.wording import reply_too_large
from .base import Cancel

__all__ = ["STREAM_FACTOR", "ReplyRefused", "guarding"]

STREAM_FACTOR = 8
"""An event stream may carry this many times ``max_reply`` in raw bytes."""


class ReplyRefused(Exception):
    """A reply refused for its size (``sentence`` says so), or a send stopped because its
    caller gave up on it (``cancelled``)."""

    def __init__(self, sentence: str, *, cancelled: bool = False) -> None:
        super().__init__(sentence)
        self.sentence = sentence
        self.cancelled = cancelled


@dataclass(frozen=True, slots=True)
class _Send:
    """The send in progress on this thread."""

    limit: int | None
    cancel: Cancel | None
    refusal: type[ReplyRefused]
    api: str

    def stop_if_cancelled(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise self.refusal("the send was given up", cancelled=True)


_CURRENT: ContextVar[_Send | None] = ContextVar("ipy_ctxrecovery_send", default=None)


@contextlib.contextmanager
def guarding(client: Any, *, limit: int | None, cancel: Cancel | None,
             refusal: type[ReplyRefused], api: str) -> Iterator[None]:
    """Within the block, the requests this thread sends through ``client`` (an SDK client)
    are held to ``limit`` bytes a reply and stop when ``cancel`` is set."""
    _install(getattr(client, "_client", None))
    token = _CURRENT.set(_Send(limit, cancel, refusal, api))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _install(http: Any) -> None:
    """Add the two hooks to an HTTP client (httpx2's or httpx's), once."""
    hooks = getattr(http, "event_hooks", None)
    if not isinstance(hooks, dict):
        return
    for name, hook in (("request", _on_request), ("response", _on_response)):
        installed = hooks.setdefault(name, [])
        if hook not in installed:
            installed.append(hook)


def _on_request(request: Any) -> None:
    send = _CURRENT.get()
    if send is None:
        return
    send.stop_if_cancelled()
    if send.cancel is not None:
        # A new connection's socket, as soon as it is open: a server that never answers
        # is shut out too (a pooled connection is reached through its response).
        traced = request.extensions.get("trace")
        request.extensions["trace"] = _tracer(send.cancel, traced)


def _tracer(cancel: Cancel, traced: Callable[[str, dict[str, Any]], Any] | None
            ) -> Callable[[str, dict[str, Any]], Any]:
    def trace(name: str, info: dict[str, Any]) -> Any:
        if name.endswith(("connect_tcp.complete", "start_tls.complete")):
            _close_on_cancel(cancel, info.get("return_value"))
        return traced(name, info) if traced is not None else None

    return trace


def _close_on_cancel(cancel: Cancel, stream: Any) -> None:
    get = getattr(stream, "get_extra_info", None)
    sock = get("socket") if callable(get) else None
    if isinstance(sock, socket.socket):
        cancel.on_cancel(lambda: _shut(sock))


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: it wakes a read blocked in another thread; the HTTP client
    # then closes the connection itself.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _on_response(response: Any) -> None:
    send = _CURRENT.get()
    if send is None:
        return
    if send.cancel is not None:
        _close_on_cancel(send.cancel, response.extensions.get("network_stream"))
    send.stop_if_cancelled()
    if send.limit is None:
        return
    stream = "event-stream" in response.headers.get("content-type", "").lower()
    status = response.status_code
    limit = send.limit * STREAM_FACTOR if stream and status < 400 else send.limit
    try:
        length: int | None = int(response.headers.get("content-length", ""))
    except ValueError:
        length = None

    def refuse(length: int | None = None) -> ReplyRefused:
        return send.refusal(reply_too_large(send.api, send.limit or 0, status=status,
                                            length=length, stream=stream and status < 400))

    if length is not None and length > limit:
        raise refuse(length)
    response.stream = _bounded_type(response.stream)(response.stream, limit, send, refuse)


def _bounded_type(inner: Any) -> type[_Bounded]:
    """:class:`_Bounded`, or for a legacy ``httpx`` client's stream its subclass of that
    library's stream type (each checks the type of what it iterates)."""
    if isinstance(inner, httpx2.SyncByteStream):
        return _Bounded
    legacy = getattr(sys.modules.get("httpx"), "SyncByteStream", None)
    if isinstance(legacy, type) and isinstance(inner, legacy):
        return _legacy_bounded(legacy)
    return _Bounded


@functools.cache
def _legacy_bounded(legacy: type) -> type[_Bounded]:
    return type("_LegacyBounded", (_Bounded, legacy), {})


class _Bounded(httpx2.SyncByteStream):
    """A response's byte stream that stops past ``limit`` bytes or once its send is
    cancelled (any read error after a cancel is that cancel)."""

    def __init__(self, inner: Any, limit: int, send: _Send,
                 refuse: Callable[[], ReplyRefused]) -> None:
        self._inner = inner
        self._limit = limit
        self._send = send
        self._refuse = refuse

    def __iter__(self) -> Iterator[bytes]:
        read = 0
        try:
            for chunk in self._inner:
                self._send.stop_if_cancelled()
                read += len(chunk)
                if read > self._limit:
                    raise self._refuse()
                yield chunk
        except ReplyRefused:
            raise
        except Exception:
            self._send.stop_if_cancelled()
            raise

    def close(self) -> None:
        self._inner.close()
