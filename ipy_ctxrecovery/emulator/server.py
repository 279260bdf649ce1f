"""The emulator's HTTP server: :class:`Emulator`, its request records and fault queue.

A stdlib ``ThreadingHTTPServer`` in a daemon thread, HTTP/1.1 with keep-alive, chunked
transfer encoding for SSE. Each request goes, in order, through: the emulator's own token
(401, before anything else: no fault is consumed, nothing is recorded),
``max_request_body`` (its own 413, the body is never buffered), a scripted middlebox
fault, ``drop_over``, ``max_body`` (413), ``waf_over`` (403), ``latency``, a scripted
provider fault, the API key, request validation (role alternation, prefill, output limit,
context window), then the deterministic reply.

Bounded memory: the last ``keep_requests`` requests are recorded, and of those only the
newest bodies up to ``keep_body_bytes`` in all are kept (older records keep their size,
status and fault; ``raw`` and ``body`` become None). ``received`` counts every recorded
request since the start (or the last ``reset()``). A record keeps the request's headers
with the values of credential headers masked, so a test can see what a client sent
(a gateway's extra header) and no key is held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import io
import itertools
import json
import re
import secrets
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..redaction import MASK
from ..settings import parse_size
from . import api, faults, quirks, replies, responses, roles
from .cache import PromptCache
from .context import betas_of
from .faults import Answer, Fault
from .tokenize import TOKENIZE_PATH, tokenize_answer

__all__ = ["Emulator", "RequestRecord"]

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
MODELS_PATH = "/v1/models"
#: Seconds a connection may sit idle (or a client may stall mid-body) before it is closed.
SOCKET_TIMEOUT = 30.0
#: Bytes read per chunk while receiving or draining a body.
READ_CHUNK = 64 * 1024
#: The header the product's own clients send the emulator's token in (the token is also
#: accepted as the API key: ``Authorization: Bearer`` or ``x-api-key``).
TOKEN_HEADER = "X-Emulator-Token"
#: Defaults: what a request may carry (Anthropic's own limit is 32 MB), how many requests
#: are recorded and how many body bytes those records keep.
MAX_REQUEST_BODY = 32 * 1024 * 1024
KEEP_REQUESTS = 10_000
KEEP_BODY_BYTES = 32 * 1024 * 1024
#: Body bytes read and discarded after an early 401/413, so the client reads the answer
#: instead of a reset; past this the connection is simply closed.
_DRAIN_AFTER_REFUSAL = 1024 * 1024
#: Header names whose values a record masks (Authorization, x-api-key, the emulator's
#: token, cookies, a gateway's own key header…).
_CREDENTIAL_HEADER = re.compile(r"(?i)auth|key|token|secret|cookie|signature|password")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the emulator received.

    ``status`` is None when the connection was dropped; ``body_bytes`` is the body size
    (the declared Content-Length when the body was not read); ``raw`` the body as received
    (None when not read, or no longer kept: see ``keep_body_bytes``); ``body`` its parsed
    JSON (None when there is no ``raw`` or it is not JSON; parsed on each access, so a
    record holds only the bytes); ``fault`` the fault that answered it (``"413:nginx"``,
    ``"waf:cloudflare"``, ``"drop"``, ``"429"``, ``"context"``, ``"output_limit"``,
    ``"auth"``, ``"max_request_body"``, ``"prefill"``, ``"alternation"``, ``"content"``,
    ``"thinking"``) or None — a refusal answered as an empty 200 stream keeps its label
    with status 200; ``headers`` the request's headers in the order received, the value of every
    credential header (``Authorization``, ``x-api-key``, ``X-Emulator-Token``, cookies…)
    replaced by ``[REDACTED]``.
    """

    path: str
    status: int | None
    body_bytes: int
    fault: str | None
    stream: bool = False
    raw: bytes | None = None
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None when it was not sent."""
        wanted = name.lower()
        return next((v for k, v in self.headers if k.lower() == wanted), None)

    @property
    def body(self) -> Any:
        if not self.raw:
            return None
        try:
            return json.loads(self.raw)
        except ValueError:
            return None


def _size(value: int | str | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a size.")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value!r} must not be negative.")
        return value or None
    return parse_size(value, name=name) or None


def _token(value: str | bool | None) -> str | None:
    if value is True:
        return secrets.token_urlsafe(24)
    if value is None or value is False:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"token={value!r} is not valid; give True (a random token), a "
                          "non-empty string, or None (no token: anyone on this host may call).")
    return value.strip()


PREFILL_MODES = ("continue", "reject")


def _repeat(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if value in replies.CONTINUATION_REPEATS:
        return str(value)
    raise ConfigError(f"continuation_repeat={value!r} must be a number of characters ≥ 0, "
                      f"or one of {', '.join(replies.CONTINUATION_REPEATS)}.")


def _positive_int(value: Any, name: str, *, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a whole number of tokens ≥ 1.")
    return value


class Emulator:
    """A local OpenAI + Anthropic API with deterministic replies and real-world faults.

    Every request must carry the emulator's ``token`` (``X-Emulator-Token``, or as the API
    key) unless it was created with ``token=None``: another process on the machine cannot
    use it, nor consume its scripted faults. :meth:`openai_client`/:meth:`anthropic_client`
    and the package's own providers send it.

    >>> with Emulator(context_window=8192, max_body="256KB") as emu:  # doctest: +SKIP
    ...     client = emu.openai_client(max_retries=0)
    """

    def __init__(self, *, context_window: int = 8192, max_output_tokens: int | None = None,
                 max_body: int | str | None = None, body_limit_style: str = "nginx",
                 waf_over: int | str | None = None, drop_over: int | str | None = None,
                 latency: float = 0.0, waf_style: str = "cloudflare",
                 api_key: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 log: Callable[[str], None] | None = None, token: str | bool | None = True,
                 max_request_body: int | str = MAX_REQUEST_BODY,
                 keep_requests: int = KEEP_REQUESTS,
                 keep_body_bytes: int | str = KEEP_BODY_BYTES,
                 continuation_leading_space: bool = True, continuation_repeat: int | str = 0,
                 continuation_opener: str | None = None,
                 prefill: str = "continue", alternation: str | None = None,
                 served_models: tuple[str, ...] = ("emulator",),
                 string_content_only: bool = False, empty_stream_on_error: bool = False,
                 stream_usage: bool = True, tokenize: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        #: This emulator's prompt caches (:mod:`.cache`); ``clock`` gives their time.
        self.cache = PromptCache(clock)
        #: The Responses API's stored responses (``store``, ``previous_response_id``).
        self.responses = responses.ResponseStore()
        self._faults: deque[Fault] = deque()
        if isinstance(keep_requests, bool) or not isinstance(keep_requests, int) \
                or keep_requests < 1:
            raise ConfigError(f"keep_requests={keep_requests!r} must be a whole number ≥ 1.")
        self._records: deque[RequestRecord] = deque(maxlen=keep_requests)
        self._with_body: deque[int] = deque()  # numbers of the records that still hold raw
        self._body_bytes = 0
        self._received = 0
        #: Requests refused for a missing or wrong token (not recorded otherwise).
        self.refused = 0
        self.token = _token(token)
        self.max_request_body = _size(max_request_body, "max_request_body") or MAX_REQUEST_BODY
        self.keep_body_bytes = _size(keep_body_bytes, "keep_body_bytes") or 0
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        self.host = host
        self._port = port
        self.log = log
        self.configure(context_window=context_window, max_output_tokens=max_output_tokens,
                       max_body=max_body, body_limit_style=body_limit_style,
                       waf_over=waf_over, drop_over=drop_over, latency=latency,
                       waf_style=waf_style, api_key=api_key,
                       continuation_leading_space=continuation_leading_space,
                       continuation_repeat=continuation_repeat,
                       continuation_opener=continuation_opener, prefill=prefill,
                       alternation=alternation, served_models=served_models,
                       string_content_only=string_content_only,
                       empty_stream_on_error=empty_stream_on_error, stream_usage=stream_usage)
        self.configure(tokenize=tokenize)

    # ------------------------------------------------------------------ configuration

    def configure(self, **changes: Any) -> None:
        """Change limits while running (validated; sizes accept ``parse_size`` strings)."""
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "context_window":
                checked[name] = _positive_int(value, name, allow_none=False)
            elif name == "max_output_tokens":
                checked[name] = _positive_int(value, name, allow_none=True)
            elif name in ("max_body", "waf_over", "drop_over"):
                checked[name] = _size(value, name)
            elif name == "body_limit_style":
                checked[name] = faults._check(value, faults.BODY_LIMIT_STYLES, name)
            elif name == "waf_style":
                checked[name] = faults._check(value, faults.WAF_STYLES, name)
            elif name == "latency":
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ConfigError(f"latency={value!r} must be a number of seconds ≥ 0.")
                checked[name] = float(value)
            elif name == "api_key":
                checked[name] = value or None
            elif name in ("continuation_leading_space", "tokenize"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{name}={value!r} must be True or False.")
                checked[name] = value
            elif name == "continuation_repeat":
                checked[name] = _repeat(value)
            elif name == "continuation_opener":
                checked[name] = None if value is None else \
                    faults._check(value, replies.CONTINUATION_OPENERS, name)
            elif name == "prefill":
                checked[name] = faults._check(value, PREFILL_MODES, name)
            elif name == "alternation":
                checked[name] = None if value is None else faults._check(value, roles.STYLES, name)
            elif name in _QUIRK_NAMES:
                checked[name] = quirks.check(name, value)
            elif name == "served_models":
                if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                    raise ConfigError(f"{name}={value!r} must be a list of model names.")
                checked[name] = tuple(value)
            else:
                raise ConfigError(f"{name} is not an emulator setting.")
        with self._lock:
            for name, value in checked.items():
                setattr(self, name, value)

    context_window: int
    max_output_tokens: int | None
    max_body: int | None
    waf_over: int | None
    drop_over: int | None
    body_limit_style: str
    waf_style: str
    latency: float
    api_key: str | None
    continuation_leading_space: bool
    """False: answers to the continuation prompt start at their first visible character."""
    continuation_repeat: int | str
    """What an answer to the continuation prompt repeats first (``replies.Continuation``)."""
    continuation_opener: str | None
    """What an answer to the continuation prompt writes before the text: a ``meta`` opener,
    or an ``echo`` of the prompt (``replies.Continuation``); None: nothing."""
    prefill: str
    """``continue`` a final assistant turn on the Anthropic path, or ``reject`` it (400)."""
    alternation: str | None
    """Strict role alternation on the OpenAI path, rejected as ``vllm`` or ``llama.cpp``."""
    served_models: tuple[str, ...]
    """The model ids ``GET /v1/models`` lists, each with the context window as vLLM tells
    it (``max_model_len``)."""
    string_content_only: bool
    """A message whose content is a list of parts gets HTTP 500 (:mod:`.quirks`)."""
    empty_stream_on_error: bool
    """A refused streamed request gets HTTP 200 and an empty event stream (:mod:`.quirks`)."""
    stream_usage: bool
    """False: streamed replies carry no usage, whatever the request asks (:mod:`.quirks`)."""
    tokenize: bool
    """Serve ``POST /tokenize`` (vLLM's shape, the emulator's token rule: :mod:`.tokenize`);
    False: a server without one (404)."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Emulator:
        """Bind and serve in a daemon thread; returns self. Idempotent."""
        if self._server is not None:
            return self
        handler = type("_BoundHandler", (_Handler,), {"emulator": self})
        server = _Server((self.host, self._port), handler)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"ipy_ctxrecovery-emulator-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        # Keep-alive connections would otherwise go on answering after close().
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        if self._server is not None:
            return int(self._server.server_address[1])
        return self._port

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:8765``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """Base URL for ``openai.OpenAI(base_url=...)`` (ends in ``/v1``)."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Base URL for ``anthropic.Anthropic(base_url=...)`` (the SDK appends /v1/messages)."""
        return self.url

    @property
    def token_headers(self) -> dict[str, str]:
        """The header that admits a request (empty when the emulator has no token)."""
        return {TOKEN_HEADER: self.token} if self.token else {}

    def openai_client(self, **kwargs: Any) -> Any:
        """A real ``openai.OpenAI`` pointed here, sending the token (api_key defaults to
        the emulator's)."""
        import openai

        kwargs.setdefault("api_key", self.api_key or "sk-emulator")
        kwargs["default_headers"] = {**self.token_headers, **(kwargs.get("default_headers") or {})}
        return openai.OpenAI(base_url=self.openai_base_url, **kwargs)

    def anthropic_client(self, **kwargs: Any) -> Any:
        """A real ``anthropic.Anthropic`` pointed here, sending the token (api_key defaults
        to the emulator's)."""
        import anthropic

        kwargs.setdefault("api_key", self.api_key or "sk-ant-emulator")
        kwargs["default_headers"] = {**self.token_headers, **(kwargs.get("default_headers") or {})}
        return anthropic.Anthropic(base_url=self.anthropic_base_url, **kwargs)

    # ------------------------------------------------------------------ faults and records

    def script(self, *specs: Fault | int | str) -> None:
        """Queue one-off faults, consumed one per request in order (see faults.parse_fault)."""
        parsed = [faults.parse_fault(s) for s in specs]
        with self._lock:
            self._faults.extend(parsed)

    def fail_next(self, status: int, *, retry_after: float | None = None,
                  message: str | None = None, times: int = 1) -> None:
        """Queue ``times`` provider errors with ``status`` (429 may carry ``retry_after``)."""
        fault = faults.http_error(status, retry_after=retry_after, message=message)
        with self._lock:
            self._faults.extend([fault] * times)

    @property
    def pending_faults(self) -> tuple[Fault, ...]:
        with self._lock:
            return tuple(self._faults)

    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of the recorded requests (the last ``keep_requests``), oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def received(self) -> int:
        """Requests recorded since the start or the last :meth:`reset` (dropped ones too)."""
        with self._lock:
            return self._received

    def reset(self) -> None:
        """Forget the recorded requests and the prompt caches, and drop queued faults."""
        self.cache.clear()
        self.responses.clear()
        with self._lock:
            self._records.clear()
            self._with_body.clear()
            self._body_bytes = 0
            self._received = 0
            self._faults.clear()

    def _next_fault(self, *, middlebox: bool) -> Fault | None:
        """Pop the head of the queue if it belongs to this layer (middlebox or provider):
        a provider fault waits for a request that gets past the middleboxes."""
        with self._lock:
            if self._faults and (self._faults[0].kind in _MIDDLEBOX_KINDS) == middlebox:
                return self._faults.popleft()
            return None

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            number = self._received
            self._received += 1
            if record.raw is not None and len(record.raw) > self.keep_body_bytes:
                record = dataclasses.replace(record, raw=None)
            self._records.append(record)
            if record.raw is not None:
                self._with_body.append(number)
                self._body_bytes += len(record.raw)
            self._forget_bodies()
        if self.log is not None:
            status = "dropped" if record.status is None else str(record.status)
            fault = f" [{record.fault}]" if record.fault else ""
            self.log(f"{record.method} {record.path} {status} {record.body_bytes} B{fault}")

    def _forget_bodies(self) -> None:
        """Drop the oldest bodies until the kept ones fit ``keep_body_bytes`` (lock held)."""
        first = self._received - len(self._records)  # the number of the oldest record
        while self._with_body and (self._body_bytes > self.keep_body_bytes
                                   or self._with_body[0] < first):
            number = self._with_body.popleft()
            if number < first:   # the record itself left the ring: its body went with it
                continue
            old = self._records[number - first]
            self._body_bytes -= len(old.raw or b"")
            self._records[number - first] = dataclasses.replace(old, raw=None)

    def _admits(self, headers: Any) -> bool:
        """Whether a request carries this emulator's token (always, when it has none)."""
        if self.token is None:
            return True
        auth = headers.get("Authorization", "")
        offered = [headers.get(TOKEN_HEADER, ""), headers.get("x-api-key", ""),
                   auth[7:].strip() if auth[:7].lower() == "bearer " else ""]
        return any(hmac.compare_digest(o.encode(), self.token.encode()) for o in offered if o)

    def _new_id(self, prefix: str) -> str:
        with self._lock:
            n = next(self._ids)
        return f"{prefix}{n:024d}"

    def __repr__(self) -> str:
        state = self.url if self.running else "stopped"
        return (f"Emulator({state}, context_window={self.context_window}, "
                f"max_body={self.max_body}, waf_over={self.waf_over}, "
                f"drop_over={self.drop_over})")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer is normal here (tests close streams early).
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """One connection; ``emulator`` is bound by :meth:`Emulator.start`."""

    emulator: Emulator
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT
    server_version = "ipy_ctxrecovery-emulator"

    def setup(self) -> None:
        super().setup()
        with self.emulator._lock:
            self.emulator._connections.add(self.connection)

    def finish(self) -> None:
        with self.emulator._lock:
            self.emulator._connections.discard(self.connection)
        with contextlib.suppress(OSError, ValueError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        # Silence the stdlib access log (it goes to stderr); Emulator.log reports requests.
        return

    # ------------------------------------------------------------------ entry points

    def _refuse_without_token(self) -> bool:
        """Answer 401 and close when the request lacks the token; True when refused."""
        emu = self.emulator
        if emu._admits(self.headers):
            return False
        with emu._lock:
            emu.refused += 1
        if emu.log is not None:
            emu.log(f"{self.command} {_request_path(self.path)} 401 [no emulator token]")
        body = {"error": {"type": "authentication_error", "code": "emulator_token",
                          "message": f"This emulator requires its token: send the "
                                     f"{TOKEN_HEADER} header (Emulator.token)."}}
        self._refuse(Answer(401, json.dumps(body).encode(),
                            (("Content-Type", "application/json"),), close=True))
        return True

    def _refuse(self, answer: Answer) -> None:
        """Send an answer without buffering the body; a small body is drained first so the
        client reads the answer rather than a reset."""
        declared = self._declared_length()
        if declared is not None and 0 < declared <= _DRAIN_AFTER_REFUSAL:
            self._drain(declared)
        self._send(answer)

    def do_GET(self) -> None:
        if self._refuse_without_token():
            return
        path = _request_path(self.path)
        if path.rstrip("/") == MODELS_PATH:
            emu = self.emulator
            body = {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "emulator",
                 "max_model_len": emu.context_window} for name in emu.served_models]}
            answer = Answer(200, (json.dumps(body, indent=2) + "\n").encode(),
                            (("Content-Type", "application/json"),))
        else:
            answer = faults.not_found(_wire_of(path) or "openai", "GET", path)
        self.emulator._record(RequestRecord(path, answer.status, 0, None, method="GET",
                                            headers=self._shown_headers()))
        self._send(answer)

    def do_POST(self) -> None:
        if self._refuse_without_token():
            return
        emu = self.emulator
        path = _request_path(self.path)
        counting = path.rstrip("/").endswith(COUNT_TOKENS_PATH)
        wire_name = "anthropic" if counting else _wire_of(path)
        declared = self._declared_length()

        def record(status: int | None, fault_label: str | None, raw: bytes | None = None,
                   body: Any = None, stream: bool = False) -> None:
            size = len(raw) if raw is not None else (declared or 0)
            emu._record(RequestRecord(path, status, size, fault_label, stream, raw,
                                      headers=self._shown_headers()))

        if declared is not None and declared > emu.max_request_body:
            self._too_large(wire_name, declared, record)
            return
        if emu.tokenize and path.rstrip("/") == TOKENIZE_PATH:
            self._tokenize(declared, record)
            return
        fault = emu._next_fault(middlebox=True)

        # 1. Middleboxes: they act on the size before the provider sees anything.
        if fault is not None:
            self._middlebox(fault, declared, record)
            return
        size = declared
        raw: bytes | None = None
        if size is None:  # chunked upload: the size is known only after reading it
            try:
                raw = self._read_body(None)
            except _TooLarge as e:
                self._too_large(wire_name, e.size, record)
                return
            size = len(raw)
        if emu.drop_over is not None and size > emu.drop_over:
            self._middlebox(faults.drop(), declared, record, raw_read=raw)
            return
        if emu.max_body is not None and size > emu.max_body:
            self._middlebox(faults.body_too_large(emu.body_limit_style), declared, record,
                            raw_read=raw)
            return
        if raw is None:
            raw = self._read_body(size)
        if emu.waf_over is not None and len(raw) > emu.waf_over:
            answer = faults.waf_answer(emu.waf_style, host=self._host(), client=self._client())
            record(answer.status, f"waf:{emu.waf_style}", raw)
            self._send(answer)
            return

        # 2. The provider.
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        stream = bool(isinstance(body, dict) and body.get("stream"))
        if emu.latency:
            time.sleep(emu.latency)
        fault = emu._next_fault(middlebox=False)
        fault_label = fault.label if fault is not None else None
        if fault is not None and fault.kind == "stream_error" and not stream:
            fault = faults.http_error(529 if wire_name == "anthropic" else 500)
        if fault is not None and fault.kind == "status":
            answer = faults.provider_error(wire_name or "openai", fault.status,
                                           message=fault.message, retry_after=fault.retry_after)
            record(answer.status, fault_label, raw, body, stream)
            self._send(answer)
            return
        if wire_name is None:
            answer = faults.not_found("openai", "POST", path)
            record(answer.status, None, raw, body, stream)
            self._send(answer)
            return
        if counting:
            answer = api.count_tokens(body, presented_key=self._presented_key(wire_name),
                                      api_key=emu.api_key, betas=self._betas())
            record(answer.status, "auth" if answer.status == 401 else None, raw, body)
            self._send(answer)
            return
        responses_kind = responses.path_kind(path)
        if responses_kind is not None:
            label, answer_or_stream = responses.respond(
                responses_kind, body, presented_key=self._presented_key(wire_name),
                api_key=emu.api_key, context_window=emu.context_window,
                max_output_tokens=emu.max_output_tokens, new_id=emu._new_id,
                store=emu.responses, continuation=replies.Continuation(
                    emu.continuation_leading_space, emu.continuation_repeat,
                    emu.continuation_opener),
                cache=emu.cache, stream_usage=emu.stream_usage)
            wire_name = "responses"
        else:
            label, answer_or_stream = api.respond(
                wire_name, body, presented_key=self._presented_key(wire_name),
                api_key=emu.api_key, context_window=emu.context_window,
                max_output_tokens=emu.max_output_tokens, new_id=emu._new_id,
                continuation=replies.Continuation(emu.continuation_leading_space,
                                                  emu.continuation_repeat,
                                                  emu.continuation_opener),
                prefill=emu.prefill, alternation=emu.alternation,
                string_content_only=emu.string_content_only,
                empty_stream_on_error=emu.empty_stream_on_error, stream_usage=emu.stream_usage,
                cache=emu.cache, betas=self._betas())
        broken = fault.kind if fault is not None else None
        if isinstance(answer_or_stream, Answer):
            if answer_or_stream.status == 200 and broken == "stream_cut":
                record(200, fault_label, raw, body, stream)
                self._send(answer_or_stream, cut=True)
                return
            record(answer_or_stream.status, label, raw, body, stream)
            self._send(answer_or_stream)
        else:
            headers, events = answer_or_stream
            # ``label``: a refusal answered as an empty stream (``empty_stream_on_error``).
            record(200, fault_label or label, raw, body, stream)
            self._send_stream(headers, events, broken=broken, wire_name=wire_name)

    def _tokenize(self, declared: int | None, record: Callable[..., None]) -> None:
        """``POST /tokenize`` (:mod:`.tokenize`): the size limits of the path apply as to any
        request; scripted faults are left for the requests they were queued for."""
        emu = self.emulator
        try:
            raw = self._read_body(declared)
        except _TooLarge as e:
            self._too_large(None, e.size, record)
            return
        if emu.max_body is not None and len(raw) > emu.max_body:
            self._middlebox(faults.body_too_large(emu.body_limit_style), declared, record,
                            raw_read=raw)
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        answer = tokenize_answer(body, context_window=emu.context_window)
        record(answer.status, None, raw)
        self._send(answer)

    def _too_large(self, wire_name: str | None, size: int, record: Callable[..., None]) -> None:
        """The emulator's own limit: 413 in the provider's format, the body never read."""
        limit = self.emulator.max_request_body
        answer = faults.provider_error(
            wire_name or "openai", 413,
            message=f"Request exceeds the maximum allowed number of bytes ({size} > {limit}; "
                    "the emulator's max_request_body).")
        record(answer.status, "max_request_body")
        self._send(dataclasses.replace(answer, close=True))

    # ------------------------------------------------------------------ middleboxes

    def _middlebox(self, fault: Fault, declared: int | None,
                   record: Callable[..., None], raw_read: bytes | None = None) -> None:
        if fault.kind == "drop":
            # Take part of the body, then reset the connection with no response at all.
            if raw_read is None and declared:
                self._read_some(min(declared, READ_CHUNK))
            record(None, "drop")
            self._abort()
            return
        if fault.kind == "body_limit":
            answer = faults.body_limit_answer(fault.style)
            record(answer.status, fault.label, raw_read)
            self._send(answer)
            if raw_read is None and declared:
                self._drain(declared)
            return
        raw = raw_read if raw_read is not None else self._read_body(declared or 0)
        answer = faults.waf_answer(fault.style, host=self._host(), client=self._client())
        record(answer.status, fault.label, raw)
        self._send(answer)

    def _shown_headers(self) -> tuple[tuple[str, str], ...]:
        """The request's headers for its record, credential values masked."""
        return tuple((k, MASK if _CREDENTIAL_HEADER.search(k) else v)
                     for k, v in self.headers.items())

    def _betas(self) -> frozenset[str]:
        """The request's ``anthropic-beta`` names (:mod:`.context`)."""
        return betas_of(self.headers.get("anthropic-beta"))

    def _presented_key(self, wire_name: str) -> str | None:
        auth = self.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        if wire_name == "anthropic":
            return self.headers.get("x-api-key") or bearer
        return bearer

    # ------------------------------------------------------------------ I/O

    def _declared_length(self) -> int | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return None
        try:
            return max(int(self.headers.get("Content-Length", "0")), 0)
        except ValueError:
            return 0

    def _read_body(self, length: int | None) -> bytes:
        if length is None:
            return b"".join(self._read_chunked())
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> Iterator[bytes]:
        total, limit = 0, self.emulator.max_request_body
        while True:
            line = self.rfile.readline(1024)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return
            total += size
            if total > limit:  # stop reading: the rest is never buffered
                raise _TooLarge(total)
            yield self.rfile.read(size)
            self.rfile.readline(1024)

    def _read_some(self, n: int) -> None:
        with contextlib.suppress(OSError):
            self.rfile.read(n)

    def _drain(self, remaining: int) -> None:
        """Read and discard the rest of a body after an early answer (nginx lingering close)."""
        with contextlib.suppress(OSError):
            while remaining > 0:
                got = self.rfile.read(min(remaining, READ_CHUNK))
                if not got:
                    break
                remaining -= len(got)

    def _abort(self, *, reset: bool = True) -> None:
        """Close the connection now: with ``reset`` an RST (a drop mid-request), else a
        plain FIN after what was sent (a cut answer). The client never hangs."""
        self.close_connection = True
        sock = self.connection
        with contextlib.suppress(OSError):
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                self.wfile.flush()
                sock.shutdown(socket.SHUT_RDWR)
        for stream in (self.wfile, self.rfile):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        with contextlib.suppress(OSError):
            sock.close()
        # The stdlib flushes and closes these after the handler returns.
        self.wfile = io.BytesIO()
        self.rfile = io.BytesIO()

    def _host(self) -> str:
        return (self.headers.get("Host") or "127.0.0.1").split(":", 1)[0]

    def _client(self) -> str:
        return str(self.client_address[0])

    def _head(self, status: int, reason: str, headers: Iterable[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send(self, answer: Answer, *, cut: bool = False) -> None:
        headers = list(answer.headers)
        names = {k.lower() for k, _ in headers}
        if "date" not in names:
            headers.insert(0, ("Date", faults._date()))
        headers.append(("Content-Length", str(len(answer.body))))
        if answer.close:
            headers.append(("Connection", "close"))
            self.close_connection = True
        else:
            headers.append(("Connection", "keep-alive"))
        body = answer.body[:len(answer.body) // 2] if cut else answer.body
        self.wfile.write(self._head(answer.status, answer.status_line_reason, headers) + body)
        self.wfile.flush()
        if cut:
            self._abort(reset=False)

    def _send_stream(self, headers: Iterable[tuple[str, str]], events: Iterable[bytes], *,
                     broken: str | None = None, wire_name: str = "openai") -> None:
        if broken is not None:
            # Half the answer, then the provider's error event or a cut connection.
            listed = list(events)
            events = listed[:max(2, (len(listed) - 2) // 2)]
            if broken == "stream_error":
                events.append(responses.stream_error_event() if wire_name == "responses"
                              else faults.stream_error_event(wire_name))
        headers = list(headers)
        given = {k.lower() for k, _ in headers}
        head = [(k, v) for k, v in (("Date", faults._date()),
                                    ("Content-Type", "text/event-stream; charset=utf-8"),
                                    ("Transfer-Encoding", "chunked"),
                                    ("Connection", "keep-alive"), ("Cache-Control", "no-cache"))
                if k.lower() not in given] + headers
        try:
            self.wfile.write(self._head(200, "OK", head))
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            if broken == "stream_cut":
                self._abort(reset=False)
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client stopped reading (closed the stream early): nothing left to do.
            self.close_connection = True


_MIDDLEBOX_KINDS = frozenset({"body_limit", "waf", "drop"})
_QUIRK_NAMES = frozenset(q.name for q in quirks.QUIRKS)


class _TooLarge(Exception):
    """A chunked body passed ``max_request_body`` (``size``: bytes announced so far)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _request_path(target: str) -> str:
    """The path of a request target: origin-form (``/v1/models?x``), or the absolute-form
    a client sends to a forward proxy (``http://llm.example/v1/models``), which the
    emulator then answers itself, as a gateway that is also the proxy would."""
    target = target.split("?", 1)[0]
    if "://" in target:
        target = urlsplit(target).path or "/"
    return target


def _wire_of(path: str) -> str | None:
    trimmed = path.rstrip("/")
    if trimmed.endswith(OPENAI_PATH):
        return "openai"
    if trimmed.endswith(ANTHROPIC_PATH):
        return "anthropic"
    if responses.path_kind(trimmed) is not None:
        return "openai"
    return None
