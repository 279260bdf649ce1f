"""Masking secrets in text: the well-known formats, and exact credentials a caller knows.

Two sources of secrets:

- **the session's own credentials**: the exact strings a session's SDK client sends
  (its ``api_key`` and credential headers), whatever their shape — a gateway or Azure key
  has no recognisable prefix, but the session knows it (:func:`mask_exact`; the session's
  :class:`~ipy_ctxrecovery.session.redactor.Redactor` collects them);
- **well-known formats**, found with the patterns of detect-secrets (Yelp): every regex
  plugin it ships (AWS, GitHub, GitLab, Slack, Stripe, JWT, private keys, URL passwords,
  npm, PyPI, SendGrid, …; not the entropy and public-IP ones, which flag ordinary words)
  and its keyword detector's assignment patterns (``PASSWORD=…``, ``api_key: "…"``) with
  its false-positive filters. detect-secrets' high-level scanner is not used: it costs
  ~3 ms a line and reports every word of prose as "high entropy".
  :data:`EXTRA_PATTERNS` adds the formats it has no plugin for (Anthropic and current
  OpenAI keys, Google ``AIza``, Hugging Face ``hf_``, bearer tokens, credential headers,
  unquoted AWS secret keys).

A URL carries credentials of its own (:func:`url_credentials`): its user info, which an
HTTP client sends as ``Authorization: Basic base64(user:password)``, and query parameters
such as ``?key=``. :func:`credential_param` alone decides which parameters those are, for
a base URL shown (``settings.public_url``), a client's credentials and a URL anywhere in a
text: a ``name=value`` is masked only in a URL's query (after ``/path?``), never in prose.

A private key is masked whole, from its ``-----BEGIN`` line to its ``-----END`` line.
Every secret becomes :data:`MASK`; masking is idempotent.

This module imports no SDK and no IPython; detect-secrets is loaded on first use.
"""

from __future__ import annotations

import base64
import bisect
import functools
import logging
import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

__all__ = [
    "EXTRA_PATTERNS",
    "MASK",
    "MIN_CREDENTIAL",
    "credential_param",
    "mask_exact",
    "mask_secrets",
    "path_credential",
    "url_credentials",
]

MASK = "[REDACTED]"

#: Formats detect-secrets has no plugin for. The secret is group 1 when there is one.
EXTRA_PATTERNS: tuple[re.Pattern[str], ...] = (
    # Credential headers, whatever the value's shape (the scheme word is kept).
    re.compile(r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
               r"(?:(?:bearer|basic|token|digest)\s+)?([^\s\"',;]+)"),
    re.compile(r"(?i)\b(?:x-api-key|x-goog-api-key|api[_-]?key|apikey|access[_-]?token|"
               r"auth[_-]?token|client[_-]?secret)[\"']?\s*[:=]\s*[\"']?([^\s\"',;&]+)"),
    re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{8,})"),
    # OpenAI (sk-proj-, sk-svcacct-, sk-admin-, legacy sk-) and Anthropic (sk-ant-) keys;
    # a bare sk- needs a digit or 32 letters, so words such as sk-learn-compatible stay.
    re.compile(r"\bsk-(?:(?:proj|ant|svcacct|admin)-[A-Za-z0-9_-]{8,}|"
               r"(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{16,}|[A-Za-z0-9]{32,})"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"),               # Google API keys
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),                   # Hugging Face tokens
    # detect-secrets' AWS secret-key pattern without its quotes (credentials files, env).
    re.compile(r"(?i)aws.{0,20}?(?:secret|key|token).{0,20}?(?<![A-Za-z0-9/+])"
               r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"),
)

MIN_CREDENTIAL = 8
"""Shorter client keys ("test", "x") are not masked verbatim: they would mask ordinary words."""
_TRIM = " \t\r\n\"'=:@/`"
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_-]*")
_JWT_TAIL = re.compile(r"[A-Za-z0-9_.+/=-]*")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*-----|\Z")
# Values that follow a secret-sounding word in code without being secrets (type hints,
# literals); detect-secrets leaves these to its per-language patterns.
_NOT_A_SECRET = re.compile(
    r"(?i)^(?:(?:str|string|int|bool|bytes|none|null|nil|true|false|any|optional|"
    r"secretstr)\b(?![-'])|\*+$|x+$|\.\.\.|<[^>]*>$|\[redacted\]$)")


@functools.cache
def _detectors() -> tuple[tuple[re.Pattern[str], ...], tuple[tuple[re.Pattern[str], int], ...],
                          re.Pattern[str], tuple[Callable[..., bool], ...],
                          tuple[re.Pattern[str], ...]]:
    """The detect-secrets patterns: regex plugins, keyword (pattern, group) pairs, the
    keyword prefilter, the filters for keyword hits, and the private-key headers."""
    shown_by = warnings.showwarning
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.filters import heuristic
    from detect_secrets.plugins import keyword
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.ip_public import IPPublicDetector
    from detect_secrets.plugins.private_key import PrivateKeyDetector

    if warnings.showwarning is not shown_by:
        # detect-secrets turns logging.captureWarnings on when it is imported: every
        # warning in the kernel would then go to a logger instead of being shown (and
        # warnings.catch_warnings(record=True) would record nothing). Put it back.
        logging.captureWarnings(False)

    regexes: list[re.Pattern[str]] = []
    plugins: list[Any] = list(get_mapping_from_secret_type_to_class().values())
    for plugin in plugins:
        patterns: Any = getattr(plugin, "denylist", None)  # compiled, a class attribute
        if (isinstance(plugin, type) and issubclass(plugin, RegexBasedDetector)
                and plugin not in (IPPublicDetector, PrivateKeyDetector)):
            regexes.extend(patterns)
    pairs: dict[re.Pattern[str], int] = {}
    for table in (keyword.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
                  keyword.CONFIG_DENYLIST_REGEX_TO_GROUP,
                  keyword.GOLANG_DENYLIST_REGEX_TO_GROUP):
        pairs.update(table)
    prefilter = re.compile("|".join(keyword.DENYLIST), re.IGNORECASE)
    filters = (heuristic.is_templated_secret, heuristic.is_prefixed_with_dollar_sign,
               heuristic.is_not_alphanumeric_string, heuristic.is_sequential_string,
               heuristic.is_potential_uuid)
    private = tuple(PrivateKeyDetector.denylist)
    return tuple(regexes), tuple(pairs.items()), prefilter, filters, private


def _pattern_spans(pattern: re.Pattern[str], text: str, *,
                   group_is_secret: bool = False) -> Iterable[tuple[int, int]]:
    """Where ``pattern`` finds secrets. detect-secrets' groups are not always the secret
    (GitHub's group is the ``ghp`` prefix): a group of 8+ chars is taken as the secret
    (a key after its name, a URL's password), else the whole match. Our own patterns'
    group 1 is always the secret (``group_is_secret``)."""
    least = 1 if group_is_secret else 8
    for match in pattern.finditer(text):
        groups = [(match.start(g), match.end(g)) for g in range(1, (pattern.groups or 0) + 1)
                  if match.start(g) >= 0 and match.end(g) - match.start(g) >= least]
        if groups:
            yield max(groups, key=lambda span: span[1] - span[0])
            continue
        start, end = match.span()
        while start < end and text[start] in _TRIM:
            start += 1
        while end > start and text[end - 1] in _TRIM:
            end -= 1
        # A pattern may stop short of the token's end (JWT's lazy signature, a prefix).
        tail = _JWT_TAIL if text.startswith("eyJ", start) else _TOKEN_TAIL
        extended = tail.match(text, end)
        if extended is not None:
            end = extended.end()
        if end > start:
            yield start, end


_WORD_END = re.compile(r"\s")


def _keyword_spans(line: str, offset: int, pairs: tuple[tuple[re.Pattern[str], int], ...],
                   filters: tuple[Callable[..., bool], ...]) -> Iterable[tuple[int, int]]:
    from detect_secrets.filters.heuristic import is_indirect_reference

    if is_indirect_reference(line):  # password = get_password(), key = headers["x"]
        return
    for pattern, group in pairs:
        for match in pattern.finditer(line):
            value = match.group(group)
            if not value or _NOT_A_SECRET.match(value.strip()) \
                    or any(f(value) for f in filters):
                continue
            start, end = match.span(group)
            if start == 0 or line[start - 1] not in "'\"`":
                # Unquoted, the value is one word: the words after it stay (the config
                # pattern reads to the end of the line: "password = x in the config").
                word = _WORD_END.search(line, start, end)
                if word is not None and word.start() > start:
                    end = word.start()
            while end > start and line[end - 1].isspace():  # the line's own end stays
                end -= 1
            yield offset + start, offset + end


def _private_key_spans(text: str, headers: tuple[re.Pattern[str], ...]) -> Iterable[tuple[int, int]]:
    for header in headers:
        for match in header.finditer(text):
            # From the dashes before BEGIN to the END line (or the end of the text).
            start = match.start()
            while start > 0 and text[start - 1] == "-":
                start -= 1
            end = _PEM_END.search(text, match.end())
            yield start, end.end() if end is not None else len(text)


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _apply(text: str, spans: Iterable[tuple[int, int]]) -> str:
    merged = _merge(spans)
    if not merged:
        return text
    parts, last = [], 0
    for start, end in merged:
        if text[start:end] == MASK:
            continue
        parts.append(text[last:start])
        parts.append(MASK)
        last = end
    parts.append(text[last:])
    return "".join(parts)


# Lines worth the patterns: one with a secret-sounding word, a credential marker or a
# format's prefix, or a run of 16+ base64 characters (snake_case and kebab-case names
# break at '_' and '-'). Ordinary prose and code are mostly none of these, which keeps
# masking a 1 MB tool result fast; a format with none of them is still found by the run.
_KEYWORD_TRIGGERS = ("key", "pw", "pass", "token", "secret", "contrase", "auth")
_TRIGGERS = (*_KEYWORD_TRIGGERS, "bearer", "://", "private", "putty", "sig", "sk-", "sk_",
             "rk_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "glpat", "gldt", "glft", "glsoat",
             "glrt", "glcbt", "glimt", "glptt", "glagent", "gloas", "gr1348941", "xox",
             "hf_", "aiza", "akia", "asia", "abia", "acca", "a3t", "eyj", "npm_", "pypi-",
             "sq0csp", "sg.", "akc", "accountkey")
_LONG_RUN = re.compile(r"[A-Za-z0-9+/=]{16}")


#: Texts up to this size are remembered (a history is re-saved after every turn, mostly
#: unchanged); a larger one (a full tool result) is masked once, when it is appended.
_CACHED_CHARS = 16 * 1024


def mask_secrets(text: str, *, check: Callable[[], None] | None = None) -> str:
    """``text`` with every well-known secret format replaced by :data:`MASK`.

    ``check`` is called now and then while a large text is masked (every few thousand
    lines and patterns): it raises to stop the work (a turn's deadline), which masking
    a many-MB text of secret-like lines could otherwise hold for minutes."""
    if not text or not isinstance(text, str):
        return text
    if len(text) <= _CACHED_CHARS:
        return _mask_cached(text)
    return _mask(text, check or _go_on)


def _go_on() -> None:
    return None


_CHECK_EVERY = 2048
"""Lines (or matches) between two calls of a masking's ``check``."""


@functools.lru_cache(maxsize=2048)
def _mask_cached(text: str) -> str:
    return _mask(text)


def _mask(text: str, check: Callable[[], None] = _go_on) -> str:
    regexes, pairs, prefilter, filters, private = _detectors()
    spans: list[tuple[int, int]] = []
    # The candidate lines, joined, with where each one starts in ``text``.
    chosen: list[str] = []
    starts: list[tuple[int, int]] = []  # (start in the joined text, start in text)
    joined_at = offset = 0
    for n, line in enumerate(text.splitlines(keepends=True)):
        if n % _CHECK_EVERY == 0:
            check()
        low = line.lower()
        if any(t in low for t in _TRIGGERS) or _LONG_RUN.search(line):
            chosen.append(line)
            starts.append((joined_at, offset))
            joined_at += len(line)
            if any(t in low for t in _KEYWORD_TRIGGERS) and prefilter.search(line):
                spans.extend(_keyword_spans(line, offset, pairs, filters))
        offset += len(line)
    if chosen:
        joined = "".join(chosen)
        found: list[tuple[int, int]] = []
        # A search first: most patterns find nothing, and a failed search costs less than
        # walking finditer through _pattern_spans (~40 % of a candidate line's scan).
        for pattern in regexes:
            check()
            if pattern.search(joined) is not None:
                found.extend(_pattern_spans(pattern, joined))
        for pattern in EXTRA_PATTERNS:
            check()
            if pattern.search(joined) is not None:
                found.extend(_pattern_spans(pattern, joined, group_is_secret=True))
        keys = [a for a, _ in starts]
        for n, (start, end) in enumerate(found):
            if n % _CHECK_EVERY == 0:
                check()
            i = bisect.bisect_right(keys, start) - 1
            line_start, original = starts[i]
            line_end = keys[i + 1] if i + 1 < len(keys) else len(joined)
            # A match never reaches into the next chosen line, which may be far away.
            shift = original - line_start
            spans.append((start + shift, min(end, line_end) + shift))
    check()
    if "?" in text:     # a URL's query needs no trigger word (?code=, ?X-Amz-Credential=)
        spans.extend(_query_spans(text))
    if "PRIVATE KEY" in text or "PuTTY" in text:
        spans.extend(_private_key_spans(text, private))
    return _apply(text, spans)


def mask_exact(text: str, credentials: tuple[str, ...]) -> str:
    """``text`` with each of ``credentials`` (longest first) replaced by :data:`MASK`."""
    for secret in credentials:  # longest first, so a key inside a longer one goes whole
        if secret in text:
            text = text.replace(secret, MASK)
    return text


# Words of a query parameter's name that make its value a credential (``key``, ``api_key``,
# ``access_token``, ``X-Amz-Signature``, Azure SAS ``sig``, OAuth ``code`` and
# ``client_assertion``); a word ending in one of the suffixes counts too (``apikey``,
# ``accesstoken``). The one list: base URLs and texts are masked by it (credential_param).
_PARAM_WORDS = frozenset({"key", "token", "secret", "password", "passwd", "pwd", "pass", "sig",
                          "signature", "auth", "authorization", "credential", "credentials",
                          "code", "session", "sessionid", "jwt", "assertion", "passphrase"})
_PARAM_SUFFIXES = ("key", "token", "secret", "password", "signature", "credential")
_PARAM_WORD = re.compile(r"[a-z0-9]+")


@functools.lru_cache(maxsize=256)
def credential_param(name: str) -> bool:
    """Whether a URL query parameter called ``name`` carries a credential (``key``,
    ``api_key``, ``token``, ``sig``, ``X-Amz-Credential``, ``code``…); ``api-version`` does not."""
    words = _PARAM_WORD.findall(unquote_plus(name).lower())
    return any(w in _PARAM_WORDS or w.endswith(_PARAM_SUFFIXES) for w in words)


# A URL's query in a text: after a path segment ("https://h/v1?", "/callback?", "h/v1?"),
# so "a?code=1" in code is not one; it ends at a space, a quote, a bracket or "#".
_URL_QUERY = re.compile(r"/[^\s\"'<>`?#/]*\?([^\s\"'<>`#]+)")
_QUERY_PAIR = re.compile(r"([^&;=]+)=([^&;]+)")


def _query_spans(text: str) -> Iterable[tuple[int, int]]:
    """The values of credential parameters (:func:`credential_param`) in the URL queries
    of ``text``."""
    for query in _URL_QUERY.finditer(text):
        at = query.start(1)
        for pair in _QUERY_PAIR.finditer(query.group(1)):
            # A pair starts the query or follows a separator ("a=b=c" is one pair).
            if (pair.start() == 0 or query.group(1)[pair.start() - 1] in "&;") \
                    and credential_param(pair.group(1)):
                yield at + pair.start(2), at + pair.end(2)


def path_credential(segment: str, secrets: frozenset[str] = frozenset()) -> bool:
    """Whether one segment of a URL's path is a credential: one of ``secrets`` (a
    session's own key, whatever its shape), or a key in a well-known format
    (``sk-proj-…``, ``AIza…``: :func:`mask_secrets` masks it), as written or
    percent-decoded. A gateway may take its key in the path (``/key/sk-…/v1``)."""
    if len(segment) < MIN_CREDENTIAL:
        return False
    for form in {segment, unquote(segment)}:
        if form in secrets or mask_secrets(form) != form:
            return True
    return False


@functools.lru_cache(maxsize=64)   # asked each time text is stored, for the same client
def url_credentials(url: str) -> frozenset[str]:
    """The credentials ``url`` carries, in each form they may be echoed back: the user-info
    password (the user name when it has none: a token), ``user:password``, the
    ``Basic base64(user:password)`` value an HTTP client sends for it (httpx2's
    ``BasicAuth``, built from the URL's user info), and the values of credential query
    parameters and path segments in a key's format (:func:`path_credential`) — each as
    written and percent-decoded. Values shorter than
    :data:`MIN_CREDENTIAL` are left out."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL (an unclosed IPv6 bracket): nothing to take from it
        return frozenset()
    found: set[str] = set()
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        for raw in (userinfo, password if colon else user):
            found.update((raw, unquote(raw)))
        pair = f"{unquote(user)}:{unquote(password)}".encode()
        token = base64.b64encode(pair).decode("ascii")
        found.update((token, f"Basic {token}"))
    for segment in parts.path.split("/"):
        if path_credential(segment):
            found.update((segment, unquote(segment)))
    for item in re.split(r"[&;]", parts.query):
        name, equals, raw = item.partition("=")
        if equals and credential_param(name):
            found.update((raw, unquote(raw), unquote_plus(raw)))
    return frozenset(v for v in found if len(v) >= MIN_CREDENTIAL)
