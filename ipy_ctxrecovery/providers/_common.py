"""What both SDK adapters share: body capture, option splitting, error conversion, reprs,
and ``SDKAdapter``, the encode/measure/send/close skeleton around each adapter's one SDK call.

``BodyCapture`` runs the adapter's real SDK call on a private copy of the user's client,
made with the SDKs' public ``with_options(http_client=…, max_retries=0)``; the copy's
in-memory transport records the first API request and sends nothing. So the bytes come
out of the SDK's own request pipeline — parameter transforms, Azure/Bedrock/Vertex body
rewrites, middleware, ``extra_body`` merging, JSON encoding — and not from a
re-implementation. It runs once per request *shape* (``_wire.Template``), on a probe
whose history is a sentinel; every request of that shape is then the template filled
with its history's one ``json`` encoding.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from operator import is_, itemgetter
from typing import Any

import httpx2

from ..core.caching import openai_retentions
from ..core.catalogue import ModelInfo, lookup
from ..core.classify import classify, fingerprint
from ..core.history import Message
from ..core.wording import empty_stream, stream_ended_early
from ..errors import ChatError, ConfigError
from ..failures import LIKELY_PAYLOAD_MIN_BYTES, Failure, FailureKind
from ..settings import proxy_for, public_url
from ._guard import ReplyRefused, guarding
from ._replies import (
    check_stream,
    not_json_body,
    parse_failure,
    rejected_reply,
    reply_json,
)
from ._wire import (
    BULK,
    ENCODER,
    FastCall,
    JsonFloat,
    Template,
    build_template,
    encode_converted,
    encode_value,
    prove_call,
    shape_key,
)
from .base import Caching, Prepared, Request, Response, TextCallback
from .base_urls import query_problem

__all__ = [
    "BodyCapture",
    "SDKAdapter",
    "PrefixFold",
    "SizeMemo",
    "converted_size",
    "field",
    "json_size",
    "SingleShot",
    "StreamProgress",
    "chat_error",
    "cut_before_an_answer",
    "incomplete_reply",
    "malformed_reply",
    "openai_cache_parameters",
    "plain",
    "split_options",
]

log = logging.getLogger("ipy_ctxrecovery.providers")


class _Captured(Exception):
    """Raised by the capture transport: carries the request, stops it."""

    def __init__(self, request: httpx2.Request) -> None:
        super().__init__("request body captured")
        self.request = request


class BodyCapture:
    """Runs an SDK call on a private client copy whose transport records the request.

    ``endpoint`` is the path suffix of the API call (``/chat/completions``,
    ``/messages``); any POST to the client's API host counts too (Bedrock's
    ``/model/…/invoke``). Any other request the copy makes — e.g. a credential provider
    fetching a token through the SDK's HTTP client — is forwarded to the user's own HTTP
    client, so it keeps its proxies and CA settings.
    """

    def __init__(self, client: Any, endpoint: str, connection_error: type[BaseException]) -> None:
        self._source = client
        self._endpoint = endpoint
        self._connection_error = connection_error
        self._http: httpx2.Client | None = None
        self._copy: Any = None

    def client(self) -> Any:
        """The private copy of the user's client (built on first use)."""
        if self._copy is None:
            # trust_env=False: the capture transport never touches the network, so proxy
            # variables must not make httpx2 build real proxy transports for it.
            self._http = httpx2.Client(transport=httpx2.MockTransport(self._handle), trust_env=False)
            self._copy = self._source.with_options(http_client=self._http, max_retries=0)
        return self._copy

    def _is_api_call(self, request: httpx2.Request) -> bool:
        """The chat request itself: a POST to the API's host (Bedrock and Vertex use their
        own paths) or to the endpoint path — but not an OAuth/token exchange."""
        path = request.url.path
        if request.method != "POST" or "/oauth" in path or path.endswith("/token"):
            return False
        base = httpx2.URL(str(self._source.base_url))
        return path.endswith(self._endpoint) or (request.url.host, request.url.port) == (
            base.host, base.port)

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        if self._is_api_call(request):
            request.read()
            raise _Captured(request)
        forward = getattr(self._source, "_client", None)
        if isinstance(forward, httpx2.Client):
            return forward.send(request)
        raise RuntimeError(f"encode() cannot forward a side request to {request.url.path}")

    def request(self, call: Callable[[Any], object]) -> httpx2.Request:
        """Run ``call(client_copy)`` and return the API request it would have sent."""
        try:
            with warnings.catch_warnings():
                # The SDK's own warnings (deprecated model, …) belong to the real send.
                warnings.simplefilter("ignore")
                call(self.client())
        except _Captured as captured:
            return captured.request
        except self._connection_error as exc:
            # The Anthropic SDK wraps any transport exception in APIConnectionError.
            cause = exc.__cause__
            if isinstance(cause, _Captured):
                return cause.request
            raise
        raise RuntimeError("the SDK call returned without sending a request")

    def capture(self, call: Callable[[Any], object]) -> bytes:
        """Run ``call(client_copy)`` and return the body bytes it would have sent."""
        return self.request(call).content

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
            self._copy = None


def _keys(client: Any) -> tuple[str, ...]:
    """The client's key, to mask where a gateway takes it in the base URL's path."""
    key = getattr(client, "api_key", None)
    return (key,) if isinstance(key, str) else ()


def json_size(value: Any) -> int:
    """UTF-8 length of ``value`` encoded as both SDKs' ``openapi_dumps`` does."""
    text = ENCODER.encode(value)
    return len(text) if text.isascii() else len(text.encode())


def converted_size(value: Any) -> int:
    """:func:`json_size` of a value the adapters' converters built (``encode_converted``)."""
    return len(encode_converted(value))


_MISSING = object()


class SizeMemo:
    """Per-message memo of converted sizes, so the compactor's candidate histories — which
    share most of their messages — cost a dict lookup per message after the first.

    Keyed on the frozen ``Message`` itself (its hash leaves out ``meta``; conversion does
    not read ``meta`` either). The same message object asked for again is found by its
    ``id`` first, without hashing it (a message's hash is two Python-level ``__hash__``
    calls; a fit asks for each kept message several times). Bounded: cleared when full,
    which only costs speed.
    """

    _MAX_ENTRIES = 16_384

    def __init__(self) -> None:
        self._sizes: dict[Any, Any] = {}
        # id(message) -> (message, value): holding the message keeps its id from reuse.
        # Public so that a hot caller can look an object up inline: ``hit[0] is key``.
        self.seen: dict[int, tuple[Any, Any]] = {}

    def get(self, key: Any, compute: Callable[[Any], Any]) -> Any:
        hit = self.seen.get(id(key))
        if hit is not None and hit[0] is key:
            return hit[1]
        value = self._sizes.get(key, _MISSING)
        if value is _MISSING:
            value = compute(key)
            if len(self._sizes) >= self._MAX_ENTRIES:
                self._sizes.clear()
            self._sizes[key] = value
        if len(self.seen) >= self._MAX_ENTRIES:
            self.seen.clear()
        self.seen[id(key)] = (key, value)
        return value

    def get_many(self, keys: Sequence[Any], compute: Callable[[Any], Any]) -> list[Any]:
        """``[get(k, compute) for k in keys]``, the objects seen before found in C loops."""
        seen = self.seen.get
        hits = [seen(id(k), _NO_HIT) for k in keys]
        if all(map(is_, map(itemgetter(0), hits), keys)):
            return list(map(itemgetter(1), hits))
        get = self.get
        return [hit[1] if hit[0] is k else get(k, compute)
                for hit, k in zip(hits, keys, strict=True)]


_NO_HIT = (_MISSING, None)


class PrefixFold:
    """A fold over a history's per-message sizes that resumes where an earlier one ended.

    The last few message tuples measured are remembered with the fold's state after them:
    measuring a history that extends one of them (this turn's request over the history
    measured after the last turn, then the same with the answer) folds only the messages
    after it, so pre-flight on an unchanged prefix costs O(new messages) plus one C-level
    tuple comparison. Equal messages (``==`` leaves out ``meta``, which conversion does not
    read either) have equal sizes, so a prefix matched by equality is as exact as by
    identity.
    """

    _SLOTS = 4

    def __init__(self, memo: SizeMemo | None, item: Callable[[Any], Any], start: Any,
                 step: Callable[[Any, Any], Any],
                 steps: Callable[[Any, list[Any]], Any] | None = None) -> None:
        self._memo = memo
        self._item = item
        self._start = start
        self._step = step
        # ``steps(state, items)``: the same as ``step`` over each item in turn, in bulk.
        self._steps = steps
        self._recent: list[tuple[tuple[Any, ...], Any]] = []

    def __call__(self, messages: tuple[Any, ...]) -> Any:
        """The fold's state after ``messages``."""
        done, state, slot = 0, self._start, None
        for i, (old, old_state) in enumerate(self._recent):
            n = len(old)
            if done < n <= len(messages) and messages[:n] == old:
                done, state, slot = n, old_state, i
        if slot is not None and done == len(messages):
            return state
        item, step = self._item, self._step
        if self._memo is None:            # an item cheaper than a memo lookup
            for m in messages[done:]:
                state = step(state, item(m))
        elif self._steps is not None:
            state = self._steps(state, self._memo.get_many(messages[done:], item))
        else:
            get = self._memo.get
            for m in messages[done:]:
                state = step(state, get(m, item))
        self._recent.insert(0, (messages, state))
        del self._recent[self._SLOTS:]
        return state


@functools.lru_cache(maxsize=32)
def _parameter_names(function: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters) - {"self"}


def _named_parameters(create: Callable[..., Any]) -> frozenset[str]:
    # inspect.signature is slow next to a small body's json.dumps; the underlying
    # function of a bound ``create`` is the same for every client of a class.
    function = getattr(create, "__func__", None)
    if function is None:
        return frozenset(inspect.signature(create).parameters)
    return _parameter_names(function)


def split_options(create: Callable[..., Any], options: Mapping[str, Any],
                  reserved: frozenset[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``Request.options`` into named SDK kwargs and ``extra_body`` entries.

    Options the SDK's ``create`` names (temperature, thinking, …) go as kwargs; others
    (``top_k`` for vLLM, new fields an older SDK lacks) go in ``extra_body`` so they reach
    the server instead of raising ``TypeError``. ``reserved`` keys are the adapter's own.
    """
    named = _named_parameters(create)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in options.items():
        if key in reserved:
            continue
        if key == "extra_body" and isinstance(value, Mapping):
            extra.update(value)
        elif key in named:
            kwargs[key] = value
        else:
            extra[key] = value
    return kwargs, extra


_LEAVES = frozenset({str, int, float, bool, type(None)})


def plain(value: Any) -> Any:
    """Mappings → dicts and tuples → lists, recursively (JSON-ready copies of tool schemas)."""
    kind = type(value)
    if kind in _LEAVES:               # the usual leaves, without the ABC checks below
        return value
    if kind is dict or isinstance(value, Mapping):    # a plain dict skips the ABC check
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class SingleShot:
    """The client to send a body of a given size with.

    A connection dropped while sending a body over 500 KB is most likely a proxy's size
    limit (SPEC §1, "likely payload problem"): the SDK's own retries would only send the
    same doomed body again, counting as more rejections. Such bodies go through a copy of
    the client with ``max_retries=0`` and the recovery ladder takes over; smaller bodies
    keep the SDK's retries for genuinely transient errors.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._single: Any = None

    def for_size(self, body_bytes: int, *, retries: bool = True) -> Any:
        """The client for a body of ``body_bytes``; ``retries`` False: never the SDK's
        retries (the request's own ``Request.retries``)."""
        if retries and body_bytes <= LIKELY_PAYLOAD_MIN_BYTES:
            return self._client
        if self._single is None:
            self._single = self._client.with_options(max_retries=0)
        return self._single


def chat_error(exc: BaseException, body_bytes: int | None) -> ChatError:
    """The ChatError for an SDK/transport exception, classified with the request size.

    A failure with no HTTP answer at all (refused, timed out, dropped) names where the
    request went and any proxy the environment put in between: that is what to check.
    """
    failure = classify(exc, request_bytes=body_bytes)
    url = getattr(getattr(exc, "request", None), "url", None)
    if failure.status is None and url is not None and getattr(exc, "response", None) is None:
        from ..core.wording import endpoint_text

        proxy, var = proxy_for(str(url)) or (None, None)
        where = endpoint_text(public_url(url), proxy, proxy_var=var)
        failure = replace(failure, reason=f"{failure.reason.rstrip().rstrip('.')} "
                                          f"(endpoint {where}).")
    return ChatError(failure)


def malformed_reply(exc: BaseException, body_bytes: int, api: str) -> ChatError:
    """A reply that was cut off or is not the JSON the API promises."""
    failure = classify(exc, request_bytes=body_bytes)
    # The sentence is the failure's reason too: the session says the reason.
    reason = (f"The {api} reply was cut off or is not valid JSON ({type(exc).__name__}); "
              "retry, and if it repeats check the server or any proxy in between.")
    return ChatError(replace(failure, reason=reason))


class StreamProgress:
    """How far a streamed reply got: ``open`` once a 200 event stream is open, ``said``
    once any of an answer arrived — text, reasoning, a tool call, a stop reason or usage
    (a role-only chunk is not an answer)."""

    __slots__ = ("open", "said")

    def __init__(self) -> None:
        self.open = False
        self.said = False


def refused_error(exc: ReplyRefused, body_bytes: int) -> ChatError:
    """A reply refused unread for its size, or a send its caller gave up on."""
    return ChatError(Failure(FailureKind.OTHER, exc.sentence, request_bytes=body_bytes),
                     exc.sentence)


def incomplete_reply(body_bytes: int, api: str, detail: str, *, empty: bool = False
                     ) -> ChatError:
    """A stream that ended before the API said why the model stopped; ``empty``: before
    anything of an answer arrived at all (``Failure.empty_stream``)."""
    reason = empty_stream(api, cut=False) if empty else stream_ended_early(api, detail)
    return ChatError(Failure(FailureKind.TRANSIENT, reason, request_bytes=body_bytes,
                             empty_stream=empty,
                             fingerprint=fingerprint("empty stream" if empty else detail)))


def cut_before_an_answer(error: ChatError, api: str) -> ChatError:
    """``error`` (a transport error while reading a 200 event stream) for a stream cut off
    before anything of an answer arrived: ``Failure.empty_stream``, its kind unchanged."""
    failure = replace(error.failure, empty_stream=True, reason=empty_stream(api, cut=True))
    return ChatError(failure)


def field(obj: Any, name: str) -> Any:
    """A reply's field, from the SDK's model of it or from its parsed JSON (the fast
    send's); None when it is absent."""
    if type(obj) is dict:
        return obj.get(name)
    return getattr(obj, name, None)


def parse_arguments(arguments: str) -> dict[str, Any]:
    """Tool-call arguments as a JSON object for wire formats that need one (Anthropic).

    Blank → ``{}``. Text that is not a JSON object (e.g. cut off at max_tokens) is kept
    whole under ``_raw_arguments``, so the model still sees what it produced; the
    history itself is never changed.
    """
    if not arguments.strip():
        return {}
    try:
        # Floats as JsonFloat: the fast encoder leaves them to ``json`` (``_wire``).
        value = json.loads(arguments, parse_float=JsonFloat, parse_constant=JsonFloat)
    except (ValueError, RecursionError):    # RecursionError: nested too deeply to parse
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_raw_arguments": arguments}


class SDKAdapter:
    """The half of a provider that does not depend on the SDK: bodies built from a
    per-shape :class:`~._wire.Template` (the SDK pipeline runs once per shape, not per
    request), ``measure`` from memoized message sizes, ``send`` posting the encoded body
    through the SDK's own client when that is proven to send the same request, every SDK
    exception a ChatError with the body size, ``close`` releasing what the provider owns.
    A subclass builds its client, calls :meth:`_bind`, and fills in the hooks below (its
    kwargs, its SDK resource, its errors, its reply readers).
    """

    api: str = ""
    wire: str = ""
    emulator: Any = None
    """The Emulator behind an ``emulator*`` provider (set by ``make_provider``), else None."""
    plain_client: type | None = None
    """The SDK's own client class; only a client of exactly this class gets the fast send."""
    refusal: type[ReplyRefused] = ReplyRefused
    """What ``_guard`` raises inside the SDK: a subclass of its base error too, so that
    the SDK neither wraps nor retries it."""

    _MAX_SHAPES = 64

    def _bind(self, model_id: str, client: Any, *, prefix: str, endpoint: str,
              connection_error: type[BaseException], info: ModelInfo | None,
              spec: str | None, on_close: Callable[[], None] | None,
              owns_client: bool) -> None:
        # A client the provider built read its base URL from the SDK's variable.
        problem = query_problem(getattr(client, "base_url", None), wire=self.wire,
                                source=f"{self.wire.upper()}_BASE_URL" if owns_client else None)
        if problem is not None:
            if owns_client:
                client.close()
            raise ConfigError(problem)
        self._owns_client = owns_client
        self._closed = False
        self.model_id = model_id
        self.model = spec or f"{prefix}:{model_id}"
        self.info = info or lookup(model_id)
        self.client = client
        self._capture = BodyCapture(client, endpoint, connection_error)
        self._connection_error = connection_error
        self._senders = SingleShot(client)
        self._memo = SizeMemo()
        self._prefix_fold: PrefixFold | None = None
        self._templates: dict[str, Template | None] = {}
        self._on_close = on_close
        if type(client) is not self.plain_client:
            log.debug("fast send off: %s is not %s; requests go through the SDK method",
                      type(client).__name__, getattr(self.plain_client, "__name__", "?"))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model={self.model!r}, "
                f"base_url={public_url(getattr(self.client, 'base_url', '?'), _keys(self.client))!r})")

    # -- hooks ------------------------------------------------------------------------
    def _kwargs(self, request: Request, *, convert: bool = True) -> dict[str, Any]:
        """The SDK call's keyword arguments; ``convert=False`` leaves the messages empty."""
        raise NotImplementedError

    def _resource(self, client: Any) -> Any:
        """The SDK resource whose ``create`` is the one call (``client.chat.completions``)."""
        raise NotImplementedError

    def _sdk_errors(self) -> tuple[type[BaseException], ...]:
        raise NotImplementedError

    def _messages_size(self, messages: tuple[Message, ...]) -> int:
        """Encoded size of the body's messages array (TypeError/ValueError: not JSON-able)."""
        raise NotImplementedError

    def _fold_parts(self) -> tuple[Callable[[Message], Any], Any, Callable[[Any, Any], Any]]:
        """(one message's size item, the fold's start, its step) for :meth:`_folded`."""
        raise NotImplementedError

    def _marks_size(self, request: Request) -> int:
        """What the converter adds to the messages array beyond the messages themselves
        (the Anthropic adapter's cache breakpoints): 0 by default."""
        return 0

    def _fold_steps(self) -> Callable[[Any, list[Any]], Any] | None:
        """The fold's step over many items at once (None: one ``step`` per item)."""
        return None

    def _folded(self, messages: tuple[Message, ...]) -> Any:
        """The adapter's size fold over ``messages``, resumed after an earlier history it
        extends (``PrefixFold``)."""
        if self._prefix_fold is None:
            self._prefix_fold = PrefixFold(self._memo, *self._fold_parts(),
                                           steps=self._fold_steps())
        return self._prefix_fold(messages)

    def _read_reply(self, result: Any, size: int) -> Response:
        raise NotImplementedError

    def _read_stream(self, stream: Any, on_text: TextCallback | None, size: int,
                     progress: StreamProgress) -> Response:
        """The streamed reply; ``progress.said`` set as soon as any of an answer arrives."""
        raise NotImplementedError

    @property
    def default_max_tokens(self) -> int | None:
        """The max_tokens the body carries when a request sets none (None: not sent)."""
        return None

    # -- shared -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; make a new provider.")

    def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        return self._resource(client).create(**kwargs)

    def _template(self, kwargs: Mapping[str, Any]) -> Template | None:
        """The template of ``kwargs``' shape (learnt once per shape), None for the SDK path."""
        key = shape_key(kwargs)
        if key is None:
            return None
        if key in self._templates:
            return self._templates[key]
        template = build_template(self.wire, kwargs, self._capture_request, self._prove)
        if len(self._templates) >= self._MAX_SHAPES:
            self._templates.clear()
        self._templates[key] = template
        return template

    def _capture_request(self, kwargs: dict[str, Any]) -> httpx2.Request:
        try:
            return self._capture.request(lambda c: self._create(c, kwargs))
        except self._sdk_errors() as exc:
            # Only a side request (e.g. a credential provider's token fetch) can fail here.
            raise chat_error(exc, None) from exc

    def _prove(self, probe: dict[str, Any], sdk_request: httpx2.Request) -> FastCall | None:
        if type(self.client) is not self.plain_client:
            return None
        resource_type = type(self._resource(self.client))
        return prove_call(resource_type, self.client, probe, sdk_request,
                          lambda call, body: self._capture.request(lambda c: call.send(c, body)))

    def _bulk(self, kwargs: Mapping[str, Any]) -> dict[str, bytes]:
        # The tools' schemas are the user's values (floats and all): ``json`` encodes them.
        return {k: encode_value(kwargs[k]) if k == "tools" else encode_converted(kwargs[k])
                for k in BULK if k in kwargs}

    def encode(self, request: Request) -> bytes:
        """The exact body bytes ``send`` puts on the wire.

        The shape's template filled with the bulk's one ``json`` encoding; the SDK's own
        pipeline (``BodyCapture``) when there is no template or a value is not plain JSON.
        """
        kwargs = self._kwargs(request)
        template = self._template(kwargs)
        if template is not None:
            try:
                return template.fill(self._bulk(kwargs))
            except (TypeError, ValueError):
                pass
        return self._capture_request(kwargs).content

    def measure(self, request: Request) -> int:
        """``len(encode(request))`` without encoding the history (``base.Measurable``).

        Each message's encoded size is memoized (``SizeMemo``: candidate histories share
        most messages); the rest of the body is the shape's template, learnt once from the
        real pipeline. Exact: ``encode`` fills the same template.
        """
        kwargs = self._kwargs(request, convert=False)
        template = self._template(kwargs)
        if template is not None:
            try:
                sizes = {k: json_size(kwargs[k]) if k == "tools" else converted_size(kwargs[k])
                         for k in template.slots if k != "messages"}
                if "messages" in template.slots:
                    sizes["messages"] = self._messages_size(request.messages) \
                        + self._marks_size(request)
                return template.size(sizes)
            except (TypeError, ValueError):
                pass
        return len(self.encode(request))

    def prepare(self, request: Request) -> Prepared:
        """Pre-flight's view of ``request``: its exact body size and the max_tokens the
        body carries (the default when it sets none), without encoding it."""
        kwargs = self._kwargs(request, convert=False)
        sent = next((kwargs[k] for k in ("max_tokens", "max_completion_tokens")
                     if isinstance(kwargs.get(k), int)), None)
        return Prepared(request, self.measure(request), sent)

    def send(self, request: Request, on_text: TextCallback | None = None) -> Response:
        """Encode ``request`` once and send it.

        Fast path: the template's bytes posted through the SDK's own client (its HTTP
        layer, auth, headers, retries, base URL) with the call recorded for the shape, so
        the SDK's request transform runs zero times. Otherwise the SDK method sends (and
        a debug line says why). The body is not kept after the send.
        """
        kwargs: dict[str, Any] | None = self._kwargs(request)
        assert kwargs is not None
        template = self._template(kwargs)
        fast = template.call if template is not None else None
        body: bytes | None = None
        if template is not None and fast is not None:
            try:
                bulk = self._bulk(kwargs)
            except (TypeError, ValueError):
                log.debug("sending through the SDK method: a value is not plain JSON")
            else:
                # The converted history (and its text copies) goes before the body is
                # joined: the turn's peak is the encoded bulk and the body, no more.
                kwargs = None
                body = template.fill(bulk)
                del bulk
        elif template is None:
            log.debug("sending through the SDK method: no body template for this request")
        else:
            log.debug("sending through the SDK method: posting the body is not proven "
                      "to build the same request for this client")
        size = len(body) if body is not None else self.measure(request)
        progress = StreamProgress()
        try:
            client = self._senders.for_size(size, retries=request.retries)
            with guarding(client, limit=request.max_reply, cancel=request.cancel,
                          refusal=self.refusal, api=self.api):
                if fast is not None and body is not None:
                    # A whole reply is read from its JSON (``field``): the SDK's model of
                    # it costs more than the rest of the send's Python.
                    result = fast.send(client, body, raw=not request.stream)
                    del body
                    if not request.stream:
                        result = reply_json(result, size, self.api, _keys(self.client))
                else:
                    assert kwargs is not None
                    result = self._create(client, kwargs)
                    if not request.stream and isinstance(result, str):
                        # The SDK's method hands back the text of a body that is not JSON.
                        raise not_json_body(result, size, self.api)
                if request.stream:
                    progress.open = True
                    with result as stream:
                        check_stream(stream, size, self.api, _keys(self.client))
                        return self._read_stream(stream, on_text, size, progress)
                return self._read_reply(result, size)
        except ReplyRefused as exc:
            raise refused_error(exc, size) from None
        except self._sdk_errors() as exc:
            error = rejected_reply(exc, size, self.api, _keys(self.client)) \
                or chat_error(exc, size)
            if progress.open and not progress.said \
                    and isinstance(exc, (httpx2.TransportError, self._connection_error)):
                error = cut_before_an_answer(error, self.api)
            raise error from exc
        except (json.JSONDecodeError, RecursionError) as exc:
            # A 2xx reply (or an SSE event) that is not valid JSON: cut off, garbled, or
            # nested deeper than the parser goes — or not JSON at all (the SDK's method
            # parsed a page it was told is JSON).
            raise (parse_failure(exc, size, self.api)
                   or malformed_reply(exc, size, self.api)) from exc

    def close(self) -> None:
        """Release the capture client, and the SDK client and emulator if this provider made them."""
        self._closed = True
        self._capture.close()
        if self._owns_client:
            self.client.close()
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()


def openai_cache_parameters(caching: Caching | None, model: str) -> dict[str, str]:
    """OpenAI's caching parameters for a request (both its APIs): the conversation's
    ``prompt_cache_key`` (``Caching.key``) and, with a retention asked
    (``Caching.retention`` "long" or "short"), ``prompt_cache_retention`` "24h" or
    "in_memory" where the model takes it (``core.caching.openai_retentions``; "in_memory"
    only where it may choose). A caller's own option of the same name wins."""
    if caching is None:
        return {}
    found: dict[str, str] = {}
    if caching.key:
        found["prompt_cache_key"] = caching.key
    value = {"long": "24h", "short": "in_memory"}.get(caching.retention)
    if value is not None and value in openai_retentions(model):
        found["prompt_cache_retention"] = value
    return found
