"""Body templates: a request's exact bytes from one ``json`` encoding of the bulk, and the
SDK's own ``post`` call that sends those bytes — the SDK's request transform run zero times.

A request *shape* is every SDK keyword argument except the bulk (``messages``,
``system``, ``tools``), plus which bulk keys are present. For each shape, once:

1. the real SDK call runs on the capture client (``BodyCapture``) with a *sentinel* in
   place of each bulk value; the captured body is cut around the sentinels' encodings
   into a :class:`Template` — fixed byte runs with one slot per bulk key. Filling the
   slots with the bulk's own ``json`` encoding gives the SDK's bytes: the transforms and
   body rewrites (Bedrock's, Vertex's, ``extra_body`` merging) are in the fixed runs,
   and the bulk is plain JSON that the SDKs pass through unchanged (tests compare the
   two byte for byte over generated histories and every option the product sends);
2. when the client is the SDK's own plain class (``openai.OpenAI``,
   ``anthropic.Anthropic``), the arguments the SDK method hands to its client's
   ``post`` are recorded (a fresh resource whose ``_post`` records instead of sending),
   and the recorded call is replayed on the capture client with the template's bytes as
   ``content``. Only when that request equals the SDK's own — method, URL, every header,
   body — does the shape get a :class:`FastCall`. Otherwise (Azure's deployment URLs,
   Bedrock's and Vertex's signing and rewrites, a subclass, a future SDK that changes
   its pipeline) the shape is sent through the SDK method as before, and a debug log
   line says why.

A sentinel not found exactly once in the probe (an ``extra_body`` that replaces
``messages``, a transform that rewrites the bulk) means no template: the caller falls
back to the SDK pipeline for the bytes too.

The history's bulk (the adapters' converted messages and the system text) is encoded with
``orjson`` (:func:`encode_converted`), ~30× faster than ``json`` and byte for byte the
same for the values the converters build: text, ids, ints, booleans, nulls, dicts with
string keys and lists. Where the two differ — floats (``1e-07`` against ``1e-7``), ints
beyond 64 bits, non-string keys, subclasses — orjson refuses the value (tool arguments'
floats are parsed as :class:`JsonFloat` for this) and ``json`` encodes that message.
orjson keeps the UTF-8 form of any non-ASCII str it encodes inside that str, for as long
as the str lives — a hidden copy of the body — so the converters hand it a fresh copy of
such text (:func:`for_body`), which goes with the converted request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

__all__ = [
    "BULK",
    "ENCODER",
    "SENTINELS",
    "FastCall",
    "JsonFloat",
    "Template",
    "build_template",
    "encode_converted",
    "encode_value",
    "for_body",
    "prove_call",
    "shape_key",
]

log = logging.getLogger("ipy_ctxrecovery.providers")

BULK = ("messages", "system", "tools", "input")
"""The body fields that carry the history: encoded by us, spliced into the template
(``input``: the Responses API's items)."""

ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
"""The encoder both SDKs' ``openapi_dumps`` amounts to for plain JSON values."""

# Unique strings (NUL-framed, never in a real request) standing in for the bulk.
_MARK = "\x00ipy-ctxrecovery-slot-{}\x00"
SENTINELS: dict[str, Callable[[str], Any]] = {
    "messages": lambda wire: ([{"role": "user", "content": _MARK.format("messages")}]
                              if wire == "openai" else
                              [{"role": "user", "content": [{"type": "text",
                                                              "text": _MARK.format("messages")}]}]),
    "system": lambda wire: _MARK.format("system"),
    "input": lambda wire: [{"role": "user", "content": _MARK.format("input")}],
    "tools": lambda wire: ([{"type": "function", "function": {
        "name": "ipy_ctxrecovery_slot", "description": _MARK.format("tools"),
        "parameters": {"type": "object", "properties": {}}}}]
        if wire == "openai" else
        [{"name": "ipy_ctxrecovery_slot", "description": _MARK.format("tools"),
          "input_schema": {"type": "object", "properties": {}}}]),
}


def shape_key(kwargs: Mapping[str, Any]) -> str | None:
    """The shape of a request's kwargs (everything but the bulk), or None when an option
    is not plain JSON (a datetime, a pydantic model): such a request takes the SDK path."""
    try:
        return _SHAPE_ENCODER.encode(
            [sorted(k for k in kwargs if k in BULK),
             {k: v for k, v in kwargs.items() if k not in BULK and k != "timeout"},
             repr(kwargs.get("timeout"))])
    except (TypeError, ValueError):
        return None


# ``json.dumps`` with these options builds an encoder per call; a request measured per
# candidate of a fit asks for its shape each time.
_SHAPE_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, allow_nan=False)


def encode_value(value: Any) -> bytes:
    """``value`` as the SDKs encode plain JSON (TypeError/ValueError when it is not)."""
    text = ENCODER.encode(value)
    return text.encode() if not text.isascii() else text.encode("ascii")


def for_body(text: str) -> str:
    """``text`` as a converter puts it in a request: an ASCII str as it is; any other a new
    copy, so the UTF-8 form orjson caches inside it is freed with the request instead of
    staying in the history's own str (CPython's compact ASCII is UTF-8 already)."""
    return text if text.isascii() else "".join((text, ""))


class JsonFloat(float):
    """A float parsed from tool arguments: ``json`` encodes it as any float, ``orjson``
    refuses it — its float formatting differs from ``json``'s — so such a value is
    encoded by ``json`` (:func:`encode_converted`)."""

    __slots__ = ()


# Subclasses, dataclasses and datetimes refused too: json would not encode them so.
_ORJSON = (orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
           | orjson.OPT_PASSTHROUGH_DATETIME)


def encode_converted(value: Any) -> bytes:
    """:func:`encode_value` of a value the adapters' converters built (messages, blocks,
    text), at orjson's speed where that gives the same bytes.

    Preconditions: numbers in ``value`` are ints, booleans or :class:`JsonFloat` (the
    converters put no other float in a message), and non-ASCII text inside it is the
    request's own (:func:`for_body`; a bare str is copied here). orjson refuses everything
    it would encode differently from ``json`` (a JsonFloat, an int beyond 64 bits, a
    non-string key, a subclass, nesting past 254 levels): then a list is encoded item by
    item, so only the items orjson refused take the slower way, and anything else by
    ``json``.
    """
    if type(value) is str:              # the system text: the history's own str
        value = for_body(value)
    try:
        return orjson.dumps(value, option=_ORJSON)
    except TypeError:                   # orjson.JSONEncodeError is a TypeError
        if type(value) is list and value:
            return b"[" + b",".join(map(_encode_item, value)) + b"]"
        return encode_value(value)


def _encode_item(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=_ORJSON)
    except TypeError:
        return encode_value(value)


@dataclass(frozen=True, slots=True)
class FastCall:
    """The SDK's ``post`` arguments for one shape, ``content`` left for the body."""

    path: str
    arguments: Mapping[str, Any]

    def send(self, client: Any, body: bytes, *, raw: bool = False) -> Any:
        """The SDK's ``post`` of ``body``. ``raw``: the reply's ``httpx2.Response``, read
        (a non-streaming call), which the adapter parses itself — its content type and
        body told when it is not JSON — instead of the SDK's model built from it."""
        if raw:
            return client.post(self.path, content=body,
                               **{**self.arguments, "cast_to": httpx2.Response})
        return client.post(self.path, content=body, **self.arguments)


@dataclass(frozen=True, slots=True)
class Template:
    """A shape's body as fixed byte runs around one slot per bulk key (in body order)."""

    runs: tuple[bytes, ...]          # len(slots) + 1 runs
    slots: tuple[str, ...]
    fixed: int                       # total length of the runs
    call: FastCall | None            # None: send through the SDK method

    def size(self, bulk_sizes: Mapping[str, int]) -> int:
        return self.fixed + sum(bulk_sizes[k] for k in self.slots)

    def fill(self, bulk: Mapping[str, bytes]) -> bytes:
        parts = [self.runs[0]]
        for key, run in zip(self.slots, self.runs[1:], strict=True):
            parts.append(bulk[key])
            parts.append(run)
        return b"".join(parts)


def build_template(wire: str, kwargs: Mapping[str, Any],
                   capture: Callable[[dict[str, Any]], httpx2.Request],
                   prove: Callable[[dict[str, Any], httpx2.Request], FastCall | None],
                   ) -> Template | None:
    """The template of ``kwargs``' shape from one probe through the real SDK call."""
    probe = dict(kwargs)
    marks: dict[str, bytes] = {}
    for key in BULK:
        if key in probe:
            probe[key] = SENTINELS[key](wire)
            marks[key] = encode_value(probe[key])
    request = capture(probe)
    body = request.content
    found: list[tuple[int, str]] = []
    for key, mark in marks.items():
        if body.count(mark) != 1:
            log.debug("no body template: the %s slot is not passed through as is", key)
            return None
        found.append((body.index(mark), key))
    found.sort()
    runs: list[bytes] = []
    at = 0
    for start, key in found:
        runs.append(body[at:start])
        at = start + len(marks[key])
    runs.append(body[at:])
    return Template(tuple(runs), tuple(k for _, k in found), sum(map(len, runs)),
                    prove(probe, request))


_NOT_SENT = object()


def prove_call(resource_type: type, client: Any, probe: Mapping[str, Any],
               sdk_request: httpx2.Request,
               replay: Callable[[FastCall, bytes], httpx2.Request]) -> FastCall | None:
    """Record what ``resource_type(client).create(**probe)`` hands to ``post``; keep it only
    if replaying it with the captured body as ``content`` builds the SDK's own request."""
    recorded: dict[str, Any] = {}

    def record(path: str, **arguments: Any) -> object:
        recorded["path"] = path
        recorded["arguments"] = arguments
        return _NOT_SENT

    resource = resource_type(client)
    resource._post = record         # SyncAPIResource binds client.post here
    if resource.create(**probe) is not _NOT_SENT or "path" not in recorded:
        log.debug("fast send off: %s.create did not call post", resource_type.__name__)
        return None
    arguments = dict(recorded["arguments"])
    if "content" in arguments or "files" in arguments:
        log.debug("fast send off: the SDK call sends content or files itself")
        return None
    arguments.pop("body", None)
    options = dict(arguments.get("options") or {})
    # The body already holds extra_body, merged where the SDK merges it.
    options.pop("extra_json", None)
    arguments["options"] = options
    call = FastCall(recorded["path"], arguments)
    ours = replay(call, sdk_request.content)
    same = (ours.method == sdk_request.method and ours.url == sdk_request.url
            and list(ours.headers.multi_items()) == list(sdk_request.headers.multi_items())
            and ours.content == sdk_request.content)
    if not same:
        log.debug("fast send off: posting the encoded body would not build the SDK's request "
                  "(%s %s)", type(client).__name__, recorded["path"])
        return None
    return call
