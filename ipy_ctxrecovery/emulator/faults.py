"""Every failure the emulator can answer with, byte-for-byte like the real thing.

Two families:

* **middlebox answers** (a proxy/gateway in front of the provider, which never sees the
  request): the 413 pages of nginx, Cloudflare, AWS API Gateway and Envoy, Cloudflare's WAF
  block page, a bare HTML 403, and the silent drop;
* **provider errors** in each wire format: context window exceeded, ``max_tokens`` above the
  output limit, wrong key, and the one-off statuses of the fault queue (429, 500, 529, …).

:class:`Fault` is what tests queue with ``Emulator.script``; :class:`Answer` is a rendered
HTTP response (status line, headers, body) the server writes as is.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from email.utils import formatdate

from ..errors import ConfigError

__all__ = [
    "BODY_LIMIT_STYLES",
    "WAF_STYLES",
    "Answer",
    "Fault",
    "anthropic_error",
    "body_too_large",
    "drop",
    "http_error",
    "stream_cut",
    "stream_error",
    "openai_error",
    "parse_fault",
    "provider_error",
    "waf_block",
]

BODY_LIMIT_STYLES = ("nginx", "cloudflare", "aws", "envoy")
WAF_STYLES = ("cloudflare", "bare")

#: What nginx prints with ``server_tokens off`` (the usual hardening of corporate proxies).
NGINX_SERVER = "nginx"

REASONS = {
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
    413: "Request Entity Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests",
    500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
    504: "Gateway Timeout", 529: "Site is overloaded",
}


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete HTTP response; ``early`` = sent before the body is read (then drained)."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    close: bool = False
    early: bool = False

    @property
    def status_line_reason(self) -> str:
        return self.reason or REASONS.get(self.status, "Error")


@dataclass(frozen=True, slots=True)
class Fault:
    """One scripted failure: ``kind`` is ``status`` | ``body_limit`` | ``waf`` | ``drop`` |
    ``stream_error`` | ``stream_cut``."""

    kind: str
    status: int = 0
    style: str = ""
    retry_after: float | None = None
    message: str | None = None

    @property
    def label(self) -> str:
        """Short name recorded in ``emu.requests[i].fault``: ``429``, ``413:nginx``, …"""
        if self.kind == "status":
            return str(self.status)
        if self.kind == "body_limit":
            return f"413:{self.style}"
        if self.kind == "waf":
            return f"waf:{self.style}"
        if self.kind in ("stream_error", "stream_cut"):
            return self.kind.replace("_", "-")
        return "drop"


def http_error(status: int, *, retry_after: float | None = None,
               message: str | None = None) -> Fault:
    """A provider error with ``status`` in the wire format of the request that meets it."""
    if not 400 <= int(status) <= 599:
        raise ConfigError(f"fault status {status!r} is not an HTTP error; use 400–599.")
    return Fault("status", int(status), retry_after=retry_after, message=message)


def body_too_large(style: str = "nginx") -> Fault:
    """A 413 from a proxy/gateway in ``style``: nginx, cloudflare, aws or envoy."""
    return Fault("body_limit", 413, style=_check(style, BODY_LIMIT_STYLES, "body_limit_style"))


def waf_block(style: str = "cloudflare") -> Fault:
    """A WAF 403: ``cloudflare`` (block page, cf-ray) or ``bare`` (HTML, no signal words)."""
    return Fault("waf", 403, style=_check(style, WAF_STYLES, "waf_style"))


def drop() -> Fault:
    """Close the connection mid-request, without any response."""
    return Fault("drop")


def stream_error() -> Fault:
    """A 200 stream that breaks off halfway with the provider's error event (Anthropic
    ``event: error`` overloaded_error; OpenAI ``data: {"error": …}`` server_error). A
    non-streamed request gets the same error as a status (529 / 500)."""
    return Fault("stream_error")


def stream_cut() -> Fault:
    """A 200 answer whose connection is closed halfway (no terminating chunk, or fewer
    bytes than Content-Length): what an idle-timeout proxy does to a long answer."""
    return Fault("stream_cut")


def parse_fault(spec: Fault | int | str) -> Fault:
    """A :class:`Fault` from a short spec: ``429``, ``"500"``, ``"drop"``, ``"413:envoy"``,
    ``"nginx"``, ``"waf"``, ``"waf:bare"``, ``"stream-error"``, ``"stream-cut"``."""
    if isinstance(spec, Fault):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        return http_error(spec)
    text = str(spec).strip().lower()
    head, _, tail = text.partition(":")
    if head.isdigit():
        if head == "413" and tail:
            return body_too_large(tail)
        if head == "403" and tail:
            return waf_block(tail)
        return http_error(int(head))
    if head == "drop":
        return drop()
    if head.replace("_", "-") == "stream-error":
        return stream_error()
    if head.replace("_", "-") == "stream-cut":
        return stream_cut()
    if head == "waf":
        return waf_block(tail or "cloudflare")
    if head in BODY_LIMIT_STYLES:
        return body_too_large(head)
    raise ConfigError(
        f"fault {spec!r} is not known; use an HTTP status such as 429, 'drop', "
        f"'413:<{'|'.join(BODY_LIMIT_STYLES)}>', 'waf[:bare]', 'stream-error' or "
        "'stream-cut'."
    )


def _check(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not known; use one of {', '.join(allowed)}.")
    return value


def _date() -> str:
    return formatdate(usegmt=True)


def request_id() -> str:
    return "req_" + secrets.token_hex(12)


# --------------------------------------------------------------------------- middleboxes

def _nginx_style_page(code_line: str, server: str) -> bytes:
    # ngx_http_special_response.c: the status page plus ngx_http_error_tail, CRLF lines.
    return (
        "<html>\r\n"
        f"<head><title>{code_line}</title></head>\r\n"
        "<body>\r\n"
        f"<center><h1>{code_line}</h1></center>\r\n"
        f"<hr><center>{server}</center>\r\n"
        "</body>\r\n"
        "</html>\r\n"
    ).encode()


def ray_id() -> str:
    return secrets.token_hex(8)


def body_limit_answer(style: str) -> Answer:
    """The 413 a proxy sends for an oversized body, in ``style``."""
    if style == "nginx":
        # nginx answers from the Content-Length header, before reading the body, and
        # closes the connection (lingering close drains what the client still sends).
        return Answer(413, _nginx_style_page("413 Request Entity Too Large", NGINX_SERVER),
                      (("Server", NGINX_SERVER), ("Date", _date()),
                       ("Content-Type", "text/html")),
                      close=True, early=True)
    if style == "cloudflare":
        return Answer(413, _nginx_style_page("413 Request Entity Too Large", "cloudflare"),
                      (("Date", _date()), ("Content-Type", "text/html"),
                       ("Server", "cloudflare"), ("CF-RAY", f"{ray_id()}-FRA")),
                      close=True, early=True)
    if style == "aws":
        amzn = secrets.token_hex(16)
        return Answer(413, b'{"message":"Request Too Long"}',
                      (("Date", _date()), ("Content-Type", "application/json"),
                       ("x-amzn-RequestId", f"{amzn[:8]}-{amzn[8:12]}-{amzn[12:16]}-"
                                            f"{amzn[16:20]}-{amzn[20:]}"),
                       ("x-amzn-ErrorType", "RequestEntityTooLargeException"),
                       ("x-amz-apigw-id", secrets.token_urlsafe(12)[:16])),
                      reason="Request Entity Too Large", close=True, early=True)
    if style == "envoy":
        return Answer(413, b"payload too large",
                      (("content-type", "text/plain"), ("date", _date()),
                       ("server", "envoy")),
                      reason="Payload Too Large", close=True, early=True)
    raise ConfigError(f"body_limit_style={style!r} is not known; use one of "
                      f"{', '.join(BODY_LIMIT_STYLES)}.")


_CLOUDFLARE_BLOCK = """<!DOCTYPE html>
<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->
<!--[if IE 7]>    <html class="no-js ie7 oldie" lang="en-US"> <![endif]-->
<!--[if IE 8]>    <html class="no-js ie8 oldie" lang="en-US"> <![endif]-->
<!--[if gt IE 8]><!--> <html class="no-js" lang="en-US"> <!--<![endif]-->
<head>
<title>Attention Required! | Cloudflare</title>
<meta charset="UTF-8" />
<meta http-equiv="Content-Type" content="text/html; charset=UTF-8" />
<meta http-equiv="X-UA-Compatible" content="IE=Edge" />
<meta name="robots" content="noindex, nofollow" />
<meta name="viewport" content="width=device-width,initial-scale=1" />
<link rel="stylesheet" id="cf_styles-css" href="/cdn-cgi/styles/cf.errors.css" />
<!--[if lt IE 9]><link rel="stylesheet" id='cf_styles-ie-css' href="/cdn-cgi/styles/cf.errors.ie.css" /><![endif]-->
<style>body{margin:0;padding:0}</style>
</head>
<body>
  <div id="cf-wrapper">
    <div class="cf-alert cf-alert-error cf-cookie-error" id="cookie-alert" data-translate="enable_cookies">Please enable cookies.</div>
    <div id="cf-error-details" class="cf-error-details-wrapper">
      <div class="cf-wrapper cf-header cf-error-overview">
        <h1 data-translate="block_headline">Sorry, you have been blocked</h1>
        <h2 class="cf-subheadline"><span data-translate="unable_to_access">You are unable to access</span> {host}</h2>
      </div><!-- /.header -->

      <div class="cf-section cf-highlight">
        <div class="cf-wrapper">
          <div class="cf-screenshot-container cf-screenshot-full">
            <span class="cf-no-screenshot error"></span>
          </div>
        </div>
      </div><!-- /.captcha-container -->

      <div class="cf-section cf-wrapper">
        <div class="cf-columns two">
          <div class="cf-column">
            <h2 data-translate="blocked_why_headline">Why have I been blocked?</h2>

            <p data-translate="blocked_why_detail">This website is using a security service to protect itself from online attacks. The action you just performed triggered the security solution. There are several actions that could trigger this block including submitting a certain word or phrase, a SQL command or malformed data.</p>
          </div>

          <div class="cf-column">
            <h2 data-translate="blocked_resolve_headline">What can I do to resolve this?</h2>

            <p data-translate="blocked_resolve_detail">You can email the site owner to let them know you were blocked. Please include what you were doing when this page came up and the Cloudflare Ray ID found at the bottom of this page.</p>
          </div>
        </div>
      </div><!-- /.section -->

      <div class="cf-error-footer cf-wrapper w-240 lg:w-full py-10 sm:py-4 sm:px-8 mx-auto text-center sm:text-left border-solid border-0 border-t border-gray-300">
  <p class="text-13">
    <span class="cf-footer-item sm:block sm:mb-1">Cloudflare Ray ID: <strong class="font-semibold">{ray}</strong></span>
    <span class="cf-footer-separator sm:hidden">&bull;</span>
    <span id="cf-footer-item-ip" class="cf-footer-item hidden sm:block sm:mb-1">
      Your IP:
      <button type="button" id="cf-footer-ip-reveal" class="cf-footer-ip-reveal-btn">Click to reveal</button>
      <span class="hidden" id="cf-footer-ip">{client}</span>
      <span class="cf-footer-separator sm:hidden">&bull;</span>
    </span>
    <span class="cf-footer-item sm:block sm:mb-1"><span>Performance &amp; security by</span> <a rel="noopener noreferrer" href="https://www.cloudflare.com/5xx-error-landing" id="brand_link" target="_blank">Cloudflare</a></span>

  </p>
</div><!-- /.error-footer -->

    </div><!-- /#cf-error-details -->
  </div><!-- /#cf-wrapper -->
</body>
</html>
"""

# A middlebox 403 with no signal words and no signal headers: only "it is HTML" tells.
_BARE_403 = (
    b"<html>\r\n<head><title>403 Forbidden</title></head>\r\n<body>\r\n"
    b"<h1>Forbidden</h1>\r\n<p>You don't have permission to access this resource.</p>\r\n"
    b"</body>\r\n</html>\r\n"
)


def waf_answer(style: str, *, host: str = "127.0.0.1", client: str = "127.0.0.1") -> Answer:
    """The 403 a WAF sends after inspecting the body, in ``style``."""
    if style == "cloudflare":
        ray = ray_id()
        page = _CLOUDFLARE_BLOCK.replace("{host}", host).replace("{ray}", ray)
        page = page.replace("{client}", client)
        return Answer(403, page.encode(),
                      (("Date", _date()), ("Content-Type", "text/html; charset=UTF-8"),
                       ("Cache-Control", "private, max-age=0, no-store, no-cache, "
                                         "must-revalidate, post-check=0, pre-check=0"),
                       ("Expires", "Thu, 01 Jan 1970 00:00:01 GMT"),
                       ("Referrer-Policy", "same-origin"),
                       ("X-Frame-Options", "SAMEORIGIN"),
                       ("Server", "cloudflare"), ("CF-RAY", f"{ray}-FRA")),
                      close=True)
    if style == "bare":
        return Answer(403, _BARE_403, (("Date", _date()), ("Content-Type", "text/html")))
    raise ConfigError(f"waf_style={style!r} is not known; use one of {', '.join(WAF_STYLES)}.")


# --------------------------------------------------------------------------- provider errors

def openai_error(status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    """OpenAI's error envelope (pretty-printed, 4-space indent, as api.openai.com sends)."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return Answer(status, (json.dumps(body, indent=4) + "\n").encode(),
                  (("Date", _date()), ("Content-Type", "application/json; charset=utf-8"),
                   ("x-request-id", request_id()), *headers))


def anthropic_error(status: int, type: str, message: str, *,
                    headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    """Anthropic's error envelope (compact JSON with ``request_id``)."""
    rid = request_id()
    body = {"type": "error", "error": {"type": type, "message": message}, "request_id": rid}
    return Answer(status, json.dumps(body, separators=(",", ":")).encode(),
                  (("Date", _date()), ("Content-Type", "application/json"),
                   ("request-id", rid), *headers))


_OPENAI_STATUS: dict[int, tuple[str, str, str | None]] = {
    400: ("invalid_request_error", "Invalid request.", None),
    401: ("invalid_request_error", "Incorrect API key provided. You can find your API key at "
                                   "https://platform.openai.com/account/api-keys.",
          "invalid_api_key"),
    403: ("invalid_request_error", "You are not allowed to sample from this model", None),
    404: ("invalid_request_error", "The model `emulator` does not exist or you do not have "
                                   "access to it.", "model_not_found"),
    429: ("requests", "Rate limit reached for emulator in organization org-emulator on "
                      "requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again "
                      "in 20s. Visit https://platform.openai.com/account/rate-limits to learn "
                      "more.", "rate_limit_exceeded"),
    500: ("server_error", "The server had an error while processing your request. "
                          "Sorry about that!", None),
    502: ("server_error", "Bad gateway.", None),
    503: ("server_error", "The engine is currently overloaded, please try again later.", None),
    529: ("server_error", "The engine is currently overloaded, please try again later.", None),
}

_ANTHROPIC_STATUS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the specified "
                              "resource."),
    404: ("not_found_error", "Not Found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate "
                              "limit (https://docs.anthropic.com/en/api/rate-limits); see the "
                              "response headers for current usage. Please reduce the prompt "
                              "length or the maximum tokens requested, or try again later."),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timeout"),
    529: ("overloaded_error", "Overloaded"),
}


def provider_error(wire: str, status: int, *, message: str | None = None,
                   retry_after: float | None = None) -> Answer:
    """A provider's own error answer for ``status`` in ``wire`` (``openai``/``anthropic``)."""
    extra: tuple[tuple[str, str], ...] = ()
    if retry_after is not None:
        shown = f"{retry_after:g}"
        extra = (("retry-after", shown), ("retry-after-ms", str(int(retry_after * 1000))))
    if wire == "anthropic":
        kind, default = _ANTHROPIC_STATUS.get(
            status, ("api_error" if status >= 500 else "invalid_request_error", "Error"))
        return anthropic_error(status, kind, message or default, headers=extra)
    kind, default, code = _OPENAI_STATUS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", "Error", None))
    return openai_error(status, message or default, type=kind, code=code, headers=extra)


def masked_key(key: str) -> str:
    """A key the way OpenAI echoes a wrong one: prefix and last 4 only (short keys: stars)."""
    if len(key) < 12:
        return "*" * len(key)
    return key[:3] + "*" * (len(key) - 7) + key[-4:]


def auth_error(wire: str, presented: str | None) -> Answer:
    """401 for a missing or wrong key, in each provider's real wording."""
    if wire == "anthropic":
        message = "x-api-key header is required" if not presented else "invalid x-api-key"
        return anthropic_error(401, "authentication_error", message)
    if not presented:
        return openai_error(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), "
            "or as the password field (with blank username) if you're accessing the API "
            "from your browser and are prompted for a username. You can obtain an API key "
            "from https://platform.openai.com/account/api-keys.",
        )
    return openai_error(
        401,
        f"Incorrect API key provided: {masked_key(presented)}. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        code="invalid_api_key",
    )


def context_error(wire: str, *, window: int, prompt: int, max_tokens: int | None,
                  max_tokens_param: str = "max_tokens") -> Answer | None:
    """400 for a prompt (or prompt + max_tokens) over the window; None when it fits."""
    if prompt > window:
        if wire == "anthropic":
            return anthropic_error(400, "invalid_request_error",
                                   f"prompt is too long: {prompt} tokens > {window} maximum")
        return openai_error(
            400,
            f"This model's maximum context length is {window} tokens. However, your "
            f"messages resulted in {prompt} tokens. Please reduce the length of the messages.",
            param="messages", code="context_length_exceeded")
    if max_tokens is not None and prompt + max_tokens > window:
        if wire == "anthropic":
            return anthropic_error(
                400, "invalid_request_error",
                f"input length and `max_tokens` exceed context limit: {prompt} + "
                f"{max_tokens} > {window}, decrease input length or `max_tokens` and try again")
        return openai_error(
            400,
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="messages", code="context_length_exceeded")
    return None


def output_limit_error(wire: str, *, requested: int, cap: int, model: str,
                       param: str = "max_tokens") -> Answer:
    """400 for ``max_tokens`` above the model's output limit."""
    if wire == "anthropic":
        return anthropic_error(
            400, "invalid_request_error",
            f"max_tokens: {requested} > {cap}, which is the maximum allowed number of output "
            f"tokens for {model}")
    return openai_error(
        400,
        f"{param} is too large: {requested}. This model supports at most {cap} completion "
        f"tokens, whereas you provided {requested}.",
        param=param)


def bad_request(wire: str, message: str, *, param: str | None = None) -> Answer:
    if wire == "anthropic":
        return anthropic_error(400, "invalid_request_error", message)
    return openai_error(400, message, param=param)


def not_found(wire: str, method: str, path: str) -> Answer:
    if wire == "anthropic":
        return anthropic_error(404, "not_found_error", "Not Found")
    return openai_error(404, f"Invalid URL ({method} {path})")



def stream_error_event(wire: str) -> bytes:
    """The error event a provider sends inside a 200 stream when it fails mid-answer."""
    if wire == "anthropic":
        body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
                "request_id": request_id()}
        return f"event: error\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()
    body = {"error": {"message": "The server had an error while processing your request. "
                                 "Sorry about that!", "type": "server_error", "param": None,
                      "code": None}}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()
