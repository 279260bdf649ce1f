"""Failure classification: :func:`classify` turns an exception or a response into one :class:`Failure`.

Order of evidence: the HTTP status, then the structured error body (``error.code``,
``error.type``, ``param``, llama.cpp's ``n_prompt_tokens``), then the text. Bare substrings
never decide on their own where a status says otherwise.

Precedence rules (each is tested as a property in ``tests/test_errors.py``):

1. **Statuses that no text can change.** 401 is ``auth``; 414 is ``other`` (a long URL, not a
   payload or context problem); 431 is ``payload_too_large``. 413 is ``payload_too_large`` —
   except when the body itself states a token count over a token limit (Groq answers a
   per-request tokens-per-minute excess with 413): the limit is then in tokens, so it is a
   ``context_overflow`` carrying those numbers.
2. **403: block evidence, then auth evidence, then weak proxy evidence.** An HTML page is a
   middlebox block page (a provider's 403 is JSON). Block evidence — a firewall header
   (``x-amzn-waf-*``, ``cf-mitigated``, ``x-iinfo``, ``x-sucuri-*``, ``x-squid-error``) or words
   that say a firewall/proxy/policy stopped the request ("blocked", "firewall", "WAF",
   "security policy", "support ID", "administrative rules", …) — makes it ``waf_rejection``
   even when the body is a JSON error and even when it also speaks of credentials. Otherwise
   auth evidence (a structured auth type/code, or words about keys, tokens, permissions,
   RBAC, access to a model) makes it ``auth``. Otherwise weak proxy evidence (a CDN/WAF
   ``Server`` or ``cf-ray``/Akamai headers, "access denied") makes it ``waf_rejection`` — the
   real providers sit behind Cloudflare, so those headers alone never outweigh the provider's
   own words. With no evidence at all a 403 is ``auth`` (conservative: credentials are never
   discarded for a guess, SPEC §1).
3. **Output limit before overflow.** A text that names the output-token parameter and the
   bound it broke ("max_tokens is too large: N. This model supports at most M", "max_tokens:
   N > M", "The maximum tokens you requested exceeds the model limit of M", "max_tokens=N
   cannot be greater than max_model_len=M", "maxOutputTokens value of N … to M (exclusive)")
   is ``output_limit`` with ``limit_tokens``/``output_tokens``; an exclusive bound is one
   above the cap. A wording that also counts the prompt is an overflow, not an output limit.
4. **Context overflow, strongest evidence first:** structured counts (llama.cpp
   ``n_prompt_tokens``/``n_ctx``), then a numeric wording (prompt, limit and output read into
   the Failure; the most specific wording first, so "you requested 64 output tokens and your
   prompt contains 4097 input tokens" never reads 64 as the prompt; "maximum context length
   is N" alone still gives the limit), then a structured code (``context_length_exceeded``…),
   then wordings and shapes without numbers ("… too long", "exceeds … context length",
   "longer than the context length"). Those weak words are vetoed by a rate-limit marker
   ("per minute", "please wait", 429): "Too many tokens, please wait" is throttling. A
   request whose own size is over a per-minute budget ("Request too large … Limit L,
   Requested R") is an overflow whatever the status, because waiting never helps.
5. **Payload size in the text** (a relayed proxy page, a per-field byte limit, IIS's 404.13)
   is ``payload_too_large``; only as words, never as a bare number: a "413" inside a request
   id or any other token is not a 413.
6. Then credentials named in a structured body on another status (Gemini's 400
   ``API_KEY_INVALID``), out-of-quota codes (``other``), retryable structured types inside a
   2xx stream, retryable statuses (408/409/425/429/499/5xx), and for no status at all the
   exception's class names and connection-level words.

SDK exceptions are read by duck typing only (``status_code``, ``body``, ``response.headers``,
``response.text``, ``message``, the ``__cause__``/``__context__`` chain and class names);
no SDK is imported here. The evidence tables (wordings, error codes and types, header and
exception class names) live in ``_patterns``; the order of evidence and the decisions here.
"""

from __future__ import annotations

import email.utils
import hashlib
import html
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import redact
from ..failures import LIKELY_PAYLOAD_MIN_BYTES, Failure, FailureKind, Signature
from ..settings import format_size, public_url
from . import patterns as P

__all__ = ["LIKELY_PAYLOAD_MIN_BYTES", "classify", "fingerprint"]


#: How much of a provider message goes into ``Failure.reason``.
_REASON_MAX_CHARS = 300


# --------------------------------------------------------------------------- evidence
@dataclass
class _Evidence:
    """Everything known about one failure, normalised from an exception or a triple."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""
    """The raw response body as text ('' when there was none)."""
    err: dict[str, Any] = field(default_factory=dict)
    """The structured error object (the ``error`` member, or the body itself)."""
    message: str = ""
    """The best human message: structured ``message`` or the exception's message."""
    exc_message: str = ""
    chain: list[BaseException] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    """Class names in the MRO of every exception in the cause chain."""

    @property
    def is_html(self) -> bool:
        ctype = self.headers.get("content-type", "").lower()
        if "html" in ctype:
            return True
        return bool(re.search(r"<\s*(?:!doctype\s+html|html|head|body|title)\b", self.text[:4000], re.IGNORECASE))

    def field_str(self, name: str) -> str:
        value = self.err.get(name)
        return str(value) if value is not None and not isinstance(value, dict | list) else ""

    @property
    def haystack(self) -> str:
        """All text that may carry a wording, lower-cased (body, structured message, exc)."""
        parts = [self.message, self.text, self.exc_message]
        return "\n".join(p for p in parts if p).lower()


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _chain(error: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    todo = [error] if error is not None else []
    while todo and len(seen) < 12:
        exc = todo.pop(0)
        if exc is None or any(exc is s for s in seen):
            continue
        seen.append(exc)
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    return seen


def _error_object(parsed: object) -> tuple[dict[str, Any], str]:
    """Find the error object in a parsed body; return it and any bare string error."""
    if isinstance(parsed, list) and parsed:
        parsed = parsed[0]  # Gemini's OpenAI-compatible endpoint answers with a list
    if not isinstance(parsed, dict):
        return {}, parsed if isinstance(parsed, str) else ""
    inner = parsed.get("error")
    if isinstance(inner, dict):
        merged = dict(inner)
        # llama.cpp puts counts inside "error"; keep outer fields that the inner lacks.
        for key, value in parsed.items():
            if key != "error":
                merged.setdefault(key, value)
        return merged, ""
    if isinstance(inner, str):
        merged = dict(parsed)
        merged.setdefault("message", inner)
        return merged, inner
    return dict(parsed), ""


def _gather(error: BaseException | None, status: int | None, body: str | bytes | None,
            headers: Mapping[str, str] | None) -> _Evidence:
    ev = _Evidence()
    ev.chain = _chain(error)
    for exc in ev.chain:
        ev.names.update(cls.__name__ for cls in type(exc).__mro__)

    response = getattr(error, "response", None) if error is not None else None

    # Status: explicit, else the exception's, else its response's.
    if status is None and error is not None:
        for candidate in (getattr(error, "status_code", None),
                          getattr(response, "status_code", None)):
            if isinstance(candidate, int) and not isinstance(candidate, bool):
                status = candidate
                break
    ev.status = status

    # Headers: explicit, else the response's (httpx2.Headers is a case-insensitive Mapping).
    raw_headers: Any = headers if headers is not None else getattr(response, "headers", None)
    if raw_headers is not None:
        try:
            ev.headers = {str(k).lower(): str(v) for k, v in raw_headers.items()}
        except (AttributeError, TypeError):
            ev.headers = {}

    # Body: explicit, else the raw response text (it keeps the outer "error" wrapper the
    # openai SDK strips from exc.body), else exc.body.
    text = _as_text(body) if body is not None else ""
    structured: object = None
    if body is None and error is not None:
        try:
            text = _as_text(getattr(response, "text", None)) if response is not None else ""
        except Exception:  # noqa: BLE001 - a streamed, unread response raises on .text
            text = ""
        exc_body = getattr(error, "body", None)
        if isinstance(exc_body, dict | list):
            structured = exc_body
        elif not text and isinstance(exc_body, str | bytes):
            text = _as_text(exc_body)
    ev.text = text.strip()

    parsed: object = None
    if ev.text[:1] in ("{", "["):
        try:
            parsed = json.loads(ev.text)
        except ValueError:
            parsed = None
    ev.err, bare = _error_object(parsed if parsed is not None else structured)
    if not ev.err and structured is not None and parsed is not None:
        ev.err, bare = _error_object(structured)

    if error is not None:
        msg = getattr(error, "message", None)
        ev.exc_message = msg if isinstance(msg, str) and msg else str(error)
        if not ev.exc_message:
            ev.exc_message = type(error).__name__
    structured_msg = ev.err.get("message") or bare
    if isinstance(structured_msg, str) and structured_msg:
        ev.message = structured_msg
    elif ev.text and not ev.is_html:
        ev.message = ev.text
    else:
        ev.message = ev.exc_message
    return ev


# --------------------------------------------------------------------------- helpers
def _clean(text: str, limit: int = _REASON_MAX_CHARS) -> str:
    one_line = " ".join(text.split())
    if len(one_line) > limit:
        one_line = one_line[: limit - 1].rstrip() + "…"
    return redact(one_line)


def page_title(text: str, tags: tuple[str, ...] = ("title", "h1")) -> str:
    """An HTML page's title as text, on one line: the first of ``tags`` that has words."""
    for tag in tags:
        m = re.search(rf"<{tag}[^>]*>(.*?)</{tag}\s*>", text, re.IGNORECASE | re.DOTALL)
        if m:
            title = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", m.group(1))).split())
            if title:
                return title
    return ""


def _html_summary(ev: _Evidence) -> str:
    """Describe an HTML page without dumping it: title/h1, vendor, ray/reference id."""
    title = page_title(ev.text)
    vendor = _proxy_vendor(ev)
    bits = [b for b in (vendor, f'"{title}"' if title else "") if b]
    ray = ev.headers.get("cf-ray", "")
    cf_id = ev.headers.get("x-amz-cf-id", "")
    ref = re.search(r"Reference\s*(?:&#32;|\s)?(?:#|&#35;)\s*([0-9a-f.]+|[0-9a-f&#;]+)", ev.text, re.IGNORECASE)
    if ray:
        bits.append(f"ray {ray}")
    elif cf_id:
        bits.append(f"request id {cf_id}")
    elif ref:
        bits.append(f"reference {ref.group(1)}")
    return ", ".join(bits)


def _proxy_vendor(ev: _Evidence) -> str:
    server = ev.headers.get("server", "").lower()
    low = ev.text[:20000].lower()
    checks = (
        ("Cloudflare", "cloudflare" in server or "cf-ray" in ev.headers or "cloudflare" in low),
        ("AWS CloudFront", "cloudfront" in server or "x-amz-cf-id" in ev.headers
         or "cloudfront" in low),
        ("AWS WAF", any(k.startswith("x-amzn-waf") for k in ev.headers)),
        ("AWS ELB", "awselb" in server),
        ("Akamai", "akamai" in server or "akamai" in low or "edgesuite" in low),
        ("Imperva Incapsula", "incapsula" in low or "x-iinfo" in ev.headers),
        ("Azure Application Gateway", "azure-application-gateway" in server
         or "azure-application-gateway" in low),
        ("openresty", "openresty" in server or "openresty" in low),
        ("nginx", "nginx" in server or "<center>nginx" in low),
        ("Envoy", "envoy" in server),
    )
    return next((name for name, hit in checks if hit), "")


def _has_proxy_signal(ev: _Evidence) -> bool:
    if any(name in ev.headers for name in P.WAF_HEADER_NAMES):
        return True
    if any(k.startswith("x-amzn-waf") for k in ev.headers):
        return True
    server = ev.headers.get("server", "").lower()
    return any(word in server for word in P.WAF_SERVER_WORDS)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _overflow_numbers(text: str, err: Mapping[str, Any]) -> tuple[bool, int | None, int | None,
                                                                  int | None]:
    """(matched, prompt, limit, output) from the strong numeric overflow wordings."""
    n_prompt, n_ctx = _int(err.get("n_prompt_tokens")), _int(err.get("n_ctx"))
    if n_prompt is not None or n_ctx is not None:
        return True, n_prompt, n_ctx, None
    for pattern in P.OVERFLOW_NUMERIC:
        m = pattern.search(text)
        if m:
            groups = m.groupdict()
            return (True, _int(groups.get("p")), _int(groups.get("lim")), _int(groups.get("o")))
    return False, None, None, None


def _token_excess(text: str, err: Mapping[str, Any]) -> tuple[int, int, int | None] | None:
    """(prompt, limit, output) when the text states a token count over a token limit."""
    tpm = P.REQUEST_TOO_LARGE_TPM.search(text)
    if tpm:
        return int(tpm.group("p")), int(tpm.group("lim")), None
    matched, prompt, limit, output = _overflow_numbers(text, err)
    if matched and prompt is not None and limit is not None:
        return prompt, limit, output
    return None


# --------------------------------------------------------------------------- decision
def classify(
    error: BaseException | None = None,
    *,
    status: int | None = None,
    body: str | bytes | None = None,
    headers: Mapping[str, str] | None = None,
    request_bytes: int | None = None,
) -> Failure:
    """Classify a failed request into exactly one :class:`FailureKind` (SPEC §1).

    Accepts the real exceptions of the openai/anthropic SDKs, httpx/httpx2 and OS
    connection errors, or a bare status/body/headers triple. Decides from the status code
    and the structured error body first, text second (the rules: the module docstring).
    """
    failure = getattr(error, "failure", None)
    if isinstance(failure, Failure) and status is None and body is None:
        # An already-classified ChatError: keep the verdict, add the size if now known.
        if failure.request_bytes is None and request_bytes is not None:
            return replace(failure, request_bytes=request_bytes)
        return failure
    try:
        ev = _gather(error, status, body, headers)
    except Exception as exc:  # noqa: BLE001 - classification must never raise
        return Failure(FailureKind.OTHER, _clean(f"Request failed ({type(exc).__name__})."),
                       status=status, request_bytes=request_bytes)
    failure = _decide(ev, request_bytes)
    said = ev.text or (_root_cause(ev) if ev.chain and failure.status is None
                       and not ev.err else ev.message)
    return replace(failure, fingerprint=fingerprint(said),
                   signature=_signature(ev, failure) or failure.signature)


def _signature(ev: _Evidence, failure: Failure) -> Signature | None:
    """How the path refused the body (``Failure.signature``), apart from the kind: a
    proxy's empty 502 and a 400 about a cut JSON body are transient or other by kind, but
    evidence about size all the same when they repeat on the larger bodies only."""
    kind, status = failure.kind, failure.status
    if kind is FailureKind.PAYLOAD_TOO_LARGE:
        return Signature.SIZE
    if kind is FailureKind.WAF_REJECTION:
        return Signature.BLOCK
    if status is not None and 500 <= status <= 599 and not ev.err:
        return Signature.BARE_5XX
    if status == 400 and P.BAD_BODY_RE.search(ev.haystack):
        return Signature.BAD_BODY
    return None


def fingerprint(text: str) -> str:
    """``text`` (what a server or the connection said; empty for a body-less answer) with
    what differs between two identical errors taken out (``patterns.VOLATILE``),
    space-normalized, lower-cased and hashed: equal for the same error on the same body."""
    normal = " ".join(P.VOLATILE.sub("#", text.lower()).split())
    return hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _decide(ev: _Evidence, request_bytes: int | None) -> Failure:
    in_stream = ev.status is not None and ev.status < 400
    if in_stream:
        # An error event inside a 2xx stream: the status only says the stream started.
        ev.status = None
    status = ev.status
    if status is None:
        connection = _connection_failure(ev, request_bytes)
        if connection is not None:
            return connection

    def make(kind: FailureKind, reason: str, **numbers: Any) -> Failure:
        retry = _retry_after(ev.headers) if kind is FailureKind.TRANSIENT else None
        return Failure(kind, redact(reason), status=status, request_bytes=request_bytes,
                       retry_after=retry, **numbers)

    where = f"HTTP {status}" if status is not None else (
        "The response stream" if in_stream else "The request")
    detail = _html_summary(ev) if ev.is_html else _clean(ev.message)
    detail = detail.rstrip(" .")
    said = f": {detail}" if detail else ""

    # 1. Statuses whose meaning no body text can change.
    if status == 414:
        return make(FailureKind.OTHER, f"{where} (URI too long) — the request URL is too long; "
                    f"this is not a payload or context problem{said}.")
    if status == 413:
        tokens = _token_excess(ev.haystack, ev.err)
        if tokens is not None:
            return make(FailureKind.CONTEXT_OVERFLOW,
                        f"{where}: the request is over a token limit ({tokens[0]} tokens > "
                        f"{tokens[1]}){said}.", prompt_tokens=tokens[0], limit_tokens=tokens[1],
                        output_tokens=tokens[2])
    if status in (413, 431):
        what = "request headers" if status == 431 else "request body"
        return make(FailureKind.PAYLOAD_TOO_LARGE,
                    f"{where}: the server or a proxy refused the {what} as too large{said}.")
    if status == 401:
        return make(FailureKind.AUTH, f"{where}: authentication failed — check the API key"
                    f"{said}.")
    if status == 403:
        return _classify_403(ev, make, where)

    text = ev.haystack
    code = ev.field_str("code").lower()
    etype = ev.field_str("type").lower()
    param = ev.field_str("param").lower()

    # 2. Output limit: the max_tokens parameter itself is over the model's cap.
    for pattern in P.OUTPUT_LIMIT_PATTERNS:
        m = pattern.search(text)
        if m:
            groups = m.groupdict()
            requested = _int(groups.get("req"))
            model_max = int(groups["max"]) - (1 if groups.get("excl") == "exclusive" else 0)
            # The parameter the answer names (the Responses API's is max_output_tokens).
            name = next((n for n in ("max_output_tokens", "max_completion_tokens")
                         if n in m.group(0).lower()), "max_tokens")
            asked = f"{name}={requested}" if requested is not None else name
            return make(FailureKind.OUTPUT_LIMIT,
                        f"{where}: {asked} is above this model's output limit "
                        f"of {model_max} tokens{said}.",
                        limit_tokens=model_max, output_tokens=requested)

    # 3. Context overflow, strongest evidence first.
    matched, prompt, limit, output = _overflow_numbers(text, ev.err)
    if not matched:
        tpm = P.REQUEST_TOO_LARGE_TPM.search(text)
        if tpm:
            matched, prompt, limit = True, int(tpm.group("p")), int(tpm.group("lim"))
    if not matched and (code in P.OVERFLOW_CODES or etype in P.OVERFLOW_CODES):
        matched = True
    if not matched and param in ("max_tokens", "max_completion_tokens") and "too large" in text \
            and code in ("invalid_value", ""):
        return make(FailureKind.OUTPUT_LIMIT,
                    f"{where}: max_tokens is above this model's output limit{said}.")
    rate_limited = status == 429 or any(marker in text for marker in P.RATE_MARKERS)
    if not matched and not rate_limited and (any(word in text for word in P.OVERFLOW_WORDS)
                                             or P.OVERFLOW_SHAPES.search(text)):
        matched = True
    if matched:
        numbers = ""
        if prompt is not None and limit is not None and output is not None:
            numbers = f" ({prompt} + {output} max_tokens > {limit} tokens)"
        elif prompt is not None and limit is not None:
            numbers = f" ({prompt} tokens > {limit} limit)"
        return make(FailureKind.CONTEXT_OVERFLOW,
                    f"{where}: the request does not fit the model's context window{numbers}"
                    f"{said}.",
                    prompt_tokens=prompt, limit_tokens=limit, output_tokens=output)

    # 4. Payload size named in the text (a relayed proxy page, a per-field byte limit).
    if any(word in text for word in P.PAYLOAD_WORDS) or P.STRING_TOO_LONG.search(text):
        return make(FailureKind.PAYLOAD_TOO_LARGE,
                    f"{where}: the request body is too large for the server or a proxy{said}.")

    # 5. Credentials named in a structured body on another status (Gemini answers a bad
    # key with 400 API_KEY_INVALID).
    reasons = {str(d.get("reason", "")).lower() for d in ev.err.get("details", []) or []
               if isinstance(d, dict)}
    if (etype in P.AUTH_TYPES or code in P.AUTH_CODES - {"401", "403"}
            or "api_key_invalid" in reasons
            or any(word in text for word in P.AUTH_WORDS[:6])):
        return make(FailureKind.AUTH, f"{where}: the provider rejected the credentials{said}.")

    # 6. Out of quota/billing: retrying does not help.
    if code in P.QUOTA_CODES or etype in P.QUOTA_CODES:
        return make(FailureKind.OTHER, f"{where}: the account is out of quota or credit{said}.")

    # 7. Retryable structured types when no status speaks (a stream error), then retryable
    # statuses.
    gstatus = ev.field_str("status").lower()
    xtype = ev.headers.get("x-amzn-errortype", "").split(":")[0].lower()
    if etype in P.PAYLOAD_TYPES or code in P.PAYLOAD_TYPES:
        return make(FailureKind.PAYLOAD_TOO_LARGE,
                    f"{where}: the request body is too large{said}.")
    if status is None and {etype, code, gstatus, xtype} & P.TRANSIENT_TYPES:
        return make(FailureKind.TRANSIENT, f"{where} failed with a temporary error, worth "
                    f"retrying{said}.")
    if status is not None and (status in (408, 409, 425, 429, 499) or 500 <= status <= 599):
        kind_word = {429: "rate limited", 529: "overloaded", 503: "unavailable",
                     408: "request timeout"}.get(status, "server error")
        return make(FailureKind.TRANSIENT, f"{where} ({kind_word}), worth retrying{said}.")

    # 8. No status: the exception type and message decide.
    if status is None:
        for fragments, kind in P.NAME_KINDS:
            if any(fragment in name for name in ev.names for fragment in fragments):
                culprit = type(ev.chain[0]).__name__ if ev.chain else "error"
                return make(kind, f"{where} failed ({culprit}){said}.")
        if any(word in text for word in ("overloaded", "rate limit", "temporarily unavailable")):
            return make(FailureKind.TRANSIENT, f"{where} failed, worth retrying{said}.")
    return make(FailureKind.OTHER, f"{where} failed{said}.")


def _classify_403(ev: _Evidence, make: Any, where: str) -> Failure:
    """403: block evidence, then auth evidence, then weak proxy evidence (rule 2 above)."""
    if ev.is_html:
        return make(FailureKind.WAF_REJECTION,
                    f"A proxy returned {where} with an HTML block page"
                    f"{' (' + _html_summary(ev) + ')' if _html_summary(ev) else ''}; "
                    "the request body likely tripped a firewall rule.")
    shown = _clean(ev.message, 200) if ev.message else ""
    if _has_block_evidence(ev):
        vendor = _proxy_vendor(ev)
        extra = ", ".join(b for b in (vendor, shown) if b)
        return make(FailureKind.WAF_REJECTION,
                    f"A firewall or proxy blocked the request with {where}"
                    f"{' (' + extra + ')' if extra else ''}; the request body likely tripped a "
                    "security rule.")
    if _has_auth_evidence(ev):
        return make(FailureKind.AUTH, f"{where}: permission denied — check the API key and its "
                    f"access{': ' + shown.rstrip(' .') if shown else ''}.")
    if _has_proxy_signal(ev) or P.WEAK_PROXY_WORDS.search(ev.haystack):
        vendor = _proxy_vendor(ev)
        extra = ", ".join(b for b in (vendor, shown) if b)
        return make(FailureKind.WAF_REJECTION,
                    f"A proxy or firewall returned {where}{' (' + extra + ')' if extra else ''}; "
                    "the request body likely tripped a security rule.")
    return make(FailureKind.AUTH, f"{where}: permission denied — check the API key and its access"
                f"{': ' + shown.rstrip(' .') if shown else ''}.")


def _has_block_evidence(ev: _Evidence) -> bool:
    """A firewall header, or words saying a firewall/proxy/policy stopped the request."""
    if any(k.startswith(P.BLOCK_HEADER_PREFIXES) for k in ev.headers):
        return True
    return bool(P.BLOCK_WORD_RE.search(ev.haystack))


def _has_auth_evidence(ev: _Evidence) -> bool:
    """A structured auth type/code, or words about keys, tokens, permissions or access."""
    etype = ev.field_str("type").lower()
    code = ev.field_str("code").lower()
    if etype in P.AUTH_TYPES or code in P.AUTH_CODES - {"401", "403"}:
        return True
    return bool(P.AUTH_EVIDENCE_RE.search(ev.haystack))


def _connection_failure(ev: _Evidence, request_bytes: int | None) -> Failure | None:
    """Timeouts, refused connections and mid-request drops (no HTTP status at all)."""
    names = ev.names
    messages = " ".join(str(e) for e in ev.chain).lower()
    culprit = _root_cause(ev)

    def make(kind: FailureKind, reason: str, signature: Signature | None = None) -> Failure:
        return Failure(kind, redact(reason), request_bytes=request_bytes, signature=signature)

    if "TooManyRedirects" in names:
        return make(FailureKind.OTHER, _redirect_loop(ev))

    if names & P.TIMEOUT_NAMES:
        return make(FailureKind.TRANSIENT, f"The request timed out ({culprit}); worth retrying.")
    if names & P.CONNECT_NAMES and not names & {"RemoteProtocolError", "ReadError", "WriteError"}:
        return make(FailureKind.TRANSIENT,
                    f"Could not connect to the server ({culprit}); worth retrying.")
    dropped = bool(names & P.DROP_NAMES) or any(word in messages for word in P.DROP_WORDS)
    if not dropped and not ev.chain:
        # A bare text triple (no exception, no status): the words alone decide.
        low = ev.haystack
        dropped = any(word in low for word in P.DROP_WORDS)
        if not dropped and any(word in low for word in P.TIMEOUT_WORDS):
            return make(FailureKind.TRANSIENT, f"The request timed out ({_clean(low, 120)}).")
        culprit = _clean(ev.text or ev.message, 160)
    if not dropped:
        return None
    if any(word in messages or word in ev.haystack for word in P.RESPONSE_STARTED_WORDS):
        return make(FailureKind.TRANSIENT,
                    f"The response was cut off mid-stream ({culprit}); the request itself was "
                    "accepted, so this is retried as a network failure.")
    if request_bytes is not None and request_bytes > LIKELY_PAYLOAD_MIN_BYTES:
        size = format_size(request_bytes)
        return make(FailureKind.LIKELY_PAYLOAD,
                    f"The connection dropped while sending a {size} request ({culprit}); a "
                    "proxy body-size limit is the likely cause.", Signature.DROP)
    if request_bytes is not None:
        # The size and the way out, for when the blip keeps coming back at this size.
        size = format_size(request_bytes)
        return make(FailureKind.TRANSIENT,
                    f"The connection dropped while sending a {size} request ({culprit}); "
                    f"under {format_size(LIKELY_PAYLOAD_MIN_BYTES)} a drop is taken for a "
                    "network blip and retried — if it keeps happening at this size, a "
                    f"proxy body-size limit is the likely cause: set CHATCLI_MAX_PAYLOAD "
                    f"below {size}.", Signature.DROP)
    return make(FailureKind.TRANSIENT,
                f"The connection dropped ({culprit}); taken for a network blip and retried.",
                Signature.DROP)


def _redirect_loop(ev: _Evidence) -> str:
    """A redirect loop (httpx2's ``TooManyRedirects``), named with where it went last:
    the request the client would have sent next (credentials masked)."""
    loop = next(e for e in ev.chain if "TooManyRedirects" in {c.__name__ for c in type(e).__mro__})
    try:
        url = getattr(loop, "request", None)
        url = getattr(url, "url", None)
    except RuntimeError:                    # httpx2: an exception raised without a request
        url = None
    # The URL goes before a ';': a masked query value would swallow a ',' after it.
    last = f", last to {public_url(url)}" if url is not None else ""
    return ("The request ran into a redirect loop: the server kept redirecting it until "
            f"the client gave up{last}; check the base URL — a proxy or a login page that "
            "redirects every request is answering for the API.")


def _root_cause(ev: _Evidence) -> str:
    """The most specific exception in the chain: 'RemoteProtocolError: Server disconnected …'."""
    if not ev.chain:
        return "no response"
    best = ev.chain[-1]
    for exc in ev.chain:
        if type(exc).__name__ in P.DROP_NAMES - {"APIConnectionError"} or \
                type(exc).__name__ in P.TIMEOUT_NAMES | P.CONNECT_NAMES:
            best = exc
    text = str(best).strip()
    name = type(best).__name__
    return _clean(f"{name}: {text}" if text else name, 200)

