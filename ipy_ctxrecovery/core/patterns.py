"""The evidence tables behind :mod:`._classify`: wordings, error codes and types, header
names and exception class names that mark each failure kind.

Data only (compiled regexes, tuples, frozensets), so a provider's new wording is a one-line
change here; the order of evidence and the decisions stay in ``_classify``.
"""

from __future__ import annotations

import re

from ..failures import FailureKind

_I = re.IGNORECASE
_S = re.IGNORECASE | re.DOTALL

# Output limit: the max_tokens parameter itself is above the model's output cap.
# (requested, model max) groups named.
OUTPUT_LIMIT_PATTERNS = [
    # OpenAI: "max_tokens is too large: 200000. This model supports at most 16384
    # completion tokens, whereas you provided 200000."
    re.compile(r"(?:max_tokens|max_completion_tokens|max_output_tokens)'?\s+is too large:\s*"
               r"(?P<req>\d+)\.\s*This model supports at most (?P<max>\d+)", _I),
    # Anthropic: "max_tokens: 100000 > 64000, which is the maximum allowed number of output
    # tokens for claude-…"
    re.compile(r"max_tokens:\s*(?P<req>\d+)\s*>\s*(?P<max>\d+),\s*which is the maximum "
               r"allowed number of output tokens", _I),
    # Bedrock: "The maximum tokens you requested exceeds the model limit of 4096."
    re.compile(r"maximum tokens you requested exceeds the model limit of (?P<max>\d+)", _I),
    # vLLM >= 0.18: "max_completion_tokens=131072 cannot be greater than
    # max_model_len=max_total_tokens=65536"
    re.compile(r"(?:max_tokens|max_completion_tokens)\s*=\s*(?P<req>\d+)\s*cannot be greater than "
               r"max_model_len\s*=\s*(?:max_total_tokens\s*=\s*)?(?P<max>\d+)", _I),
    # Vertex/Gemini: "it has a maxOutputTokens value of 1048576 but the supported range is from
    # 1 (inclusive) to 8193 (exclusive)"; an exclusive bound is one above the cap.
    re.compile(r"maxOutputTokens value of (?P<req>\d+) but the supported range is from \d+ "
               r"\((?:in|ex)clusive\) to (?P<max>\d+) \((?P<excl>exclusive|inclusive)\)", _I),
]

# Context overflow with numbers. Named groups: p = prompt, o = output, lim = window.
OVERFLOW_NUMERIC = [
    # vLLM 0.18-0.30: "maximum context length is 8192 tokens. However, you requested 4096 output
    # tokens and your prompt contains at least 4097 input tokens, for a total of ..." (before the
    # generic "you requested N tokens" forms, which would read the output count as the prompt).
    re.compile(r"maximum context length is (?P<lim>\d+) tokens[.,;]?\s*however,? you requested "
               r"(?P<o>\d+) output tokens and your prompt contains (?:at least )?(?P<p>\d+) input "
               r"tokens", _I),
    # ... and its character pre-check: "your prompt contains 100000 characters (more than ...)"
    re.compile(r"maximum context length is (?P<lim>\d+) tokens[.,;]?\s*however,? you requested "
               r"(?P<o>\d+) output tokens and your prompt contains \d+ characters", _I),
    # vLLM main: "You passed 9000 input tokens and requested 64 output tokens. However, the
    # model's context length is only 8192 tokens" (and "... input characters ...")
    re.compile(r"you passed (?:(?P<p>\d+) input tokens|\d+ input characters) and requested "
               r"(?P<o>\d+) output tokens\.\s*however, the model's context length is only "
               r"(?P<lim>\d+) tokens", _I),
    # vLLM 0.10.2-0.17: "maximum context length is 32768 tokens. However, your request has 40000
    # input tokens."
    re.compile(r"maximum context length is (?P<lim>\d+) tokens[.,;]?\s*however,? your request has "
               r"(?P<p>\d+) input tokens", _I),
    # LM Studio: "(n_keep: 13055>= n_ctx: 4096)" and "Trying to keep the first 14538 tokens when
    # context the overflows. However, the model is loaded with context length of only 2048 tokens"
    re.compile(r"n_keep:\s*(?P<p>\d+)\s*>=?\s*n_ctx:\s*(?P<lim>\d+)", _I),
    re.compile(r"keep the first (?P<p>\d+) tokens when context the overflows.{0,80}?context "
               r"length of only (?P<lim>\d+) tokens", _S),
    # Together: "The input (516368 tokens) is longer than the model's context length (262144
    # tokens)."
    re.compile(r"input \((?P<p>\d+) tokens\) is longer than the model's context length "
               r"\((?P<lim>\d+) tokens\)", _I),
    # GitHub Copilot API: "prompt token count of 93854 exceeds the limit of 90000"
    re.compile(r"prompt token count of (?P<p>\d+) exceeds the limit of (?P<lim>\d+)", _I),
    # OpenAI embeddings: "Requested 319487 tokens, max 300000 tokens per request"
    re.compile(r"requested (?P<p>\d+) tokens, max (?P<lim>\d+) tokens per request", _I),
    # Cohere: "total number of tokens (prompt and prediction) cannot exceed 2048 - received 6354"
    # (the received count includes the prediction, so it is not the prompt).
    re.compile(r"total number of tokens.{0,40}?cannot exceed (?P<lim>\d+)", _S),
    # Anthropic: "input length and `max_tokens` exceed context limit: 143653 + 64000 > 200000"
    re.compile(r"exceed context limit:\s*(?P<p>\d+)\s*\+\s*(?P<o>\d+)\s*>\s*(?P<lim>\d+)", _I),
    # Anthropic: "prompt is too long: 219898 tokens > 200000 maximum"
    re.compile(r"prompt is too long:\s*(?P<p>\d+)\s*tokens\s*>\s*(?P<lim>\d+)", _I),
    # vLLM: "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum
    # context length is 4096 tokens and your request has 3500 input tokens (…)"
    re.compile(r"is too large:\s*(?P<o>\d+)\.\s*This model's maximum context length is "
               r"(?P<lim>\d+) tokens and your request has (?P<p>\d+) input tokens", _I),
    # OpenAI/vLLM/DeepSeek/OpenRouter/Azure: "maximum context length is 4097 tokens, however
    # you requested 4927 tokens (3927 in your prompt; 1000 for the completion)" and
    # "(677 in the messages, 8000 in the completion)", "(10535 of text input, 131072 in the
    # output)".
    # llama-cpp-python's server says "None in the completion" when max_tokens was not sent.
    re.compile(r"maximum context length is (?P<lim>\d+) tokens[.,;]?\s*however,? you requested "
               r"(?:about )?\d+ tokens\s*\((?P<p>\d+) (?:in the messages|in your prompt|of text "
               r"input)[;,]\s*(?P<o>\d+|None) (?:in the completion|for the completion|in the "
               r"output)", _I),
    # OpenAI: "maximum context length is 128000 tokens. However, your messages resulted in
    # 192041 tokens."
    re.compile(r"maximum context length is (?P<lim>\d+) tokens[.,;]?\s*however,? your messages "
               r"resulted in (?P<p>\d+) tokens", _I),
    re.compile(r"maximum context length is (?P<lim>\d+) tokens[.,;]?\s*however,? you requested "
               r"(?:about )?(?P<p>\d+) tokens", _I),
    # Gemini: "The input token count (1200293) exceeds the maximum number of tokens allowed
    # (1048576)."
    re.compile(r"input token count \((?P<p>\d+)\) exceeds the maximum number of tokens "
               r"allowed \((?P<lim>\d+)\)", _I),
    # xAI: "This model's maximum prompt length is 131072 but the request contains 136973
    # tokens."
    re.compile(r"maximum prompt length is (?P<lim>\d+) but the request contains (?P<p>\d+)", _I),
    # Mistral: "Prompt contains 40005 tokens and 0 draft tokens, too large for model with
    # 32768 maximum context length"
    re.compile(r"prompt contains (?P<p>\d+) tokens.{0,80}?too large for model with "
               r"(?P<lim>\d+) maximum context length", _S),
    # llama.cpp (text form): "request (5000 tokens) exceeds the available context size
    # (4096 tokens)"
    re.compile(r"request \((?P<p>\d+) tokens\) exceeds the available context size "
               r"\((?P<lim>\d+) tokens\)", _I),
    # Hugging Face TGI: "`inputs` tokens + `max_new_tokens` must be <= 8192. Given: 6204
    # `inputs` tokens and 2047 `max_new_tokens`"
    re.compile(r"`inputs` tokens \+ `max_new_tokens` must be <= (?P<lim>\d+)\.\s*Given: "
               r"(?P<p>\d+) `inputs` tokens and (?P<o>\d+) `max_new_tokens`", _I),
    # Bedrock Titan: "Too many input tokens. Max input tokens: 8192, request input token
    # count: 9279"
    re.compile(r"max input tokens:\s*(?P<lim>\d+),\s*request input token count:\s*(?P<p>\d+)", _I),
    # vLLM (offline/older): "The prompt (total length 25938) is too long to fit into the model
    # (context length 4096)"
    re.compile(r"prompt \(total length (?P<p>\d+)\) is too long to fit into the model "
               r"\(context length (?P<lim>\d+)\)", _I),
    # vLLM V1 engine: "The decoder prompt (length 15983) is longer than the maximum model
    # length of 8192." (0.9 and later) and "Prompt length of 5016 is longer than the maximum
    # model length of 4096." (0.8)
    re.compile(r"prompt \(length (?P<p>\d+)\) is longer than the maximum model length of "
               r"(?P<lim>\d+)", _I),
    re.compile(r"prompt length of (?P<p>\d+) is longer than the maximum model length of "
               r"(?P<lim>\d+)", _I),
    # SGLang: "Requested token count exceeds the model's maximum context length of 32768
    # tokens. You requested a total of 70000 tokens: 6000 tokens from the input messages and
    # 64000 tokens for the completion."
    re.compile(r"maximum context length of (?P<lim>\d+) tokens\.\s*you requested a total of "
               r"\d+ tokens:\s*(?P<p>\d+) tokens from the input messages and (?P<o>\d+) tokens "
               r"for the completion", _I),
    # Hugging Face TGI: "Input validation error: `inputs` must have less than 4096 tokens.
    # Given: 4545"
    re.compile(r"`inputs` must have less than (?P<lim>\d+) tokens\.\s*given: (?P<p>\d+)", _I),
    # Last: any other wording that states the window ("This model's maximum context length is
    # 8192 tokens. Please reduce the length of the prompt") gives at least the limit.
    re.compile(r"maximum context length (?:is|of) (?P<lim>\d+)", _I),
]

# OpenAI/Groq per-request TPM rejection: the single request is bigger than the per-minute
# token budget, so waiting never helps; shrinking the prompt does. "Request too large for
# gpt-4o in organization org-… on tokens per min (TPM): Limit 30000, Requested 50000."
REQUEST_TOO_LARGE_TPM = re.compile(
    r"request too large for .{0,200}?limit (?P<lim>\d+),\s*requested (?P<p>\d+)", _S)

# Overflow wordings without numbers (lower-case substrings). These are "weak": a rate
# limit marker in the same text vetoes them ("Too many tokens, please wait" is Bedrock
# throttling, not an overflow).
OVERFLOW_WORDS = (
    "context_length_exceeded", "context length exceeded", "exceed_context_size_error",
    "exceeds the available context size", "maximum context length", "exceeds the context window",
    "exceeds the maximum number of tokens", "input token count", "maximum prompt length",
    "prompt is too long", "input is too long", "input too long", "exceed context limit",
    "max_tokens exceed", "input length exceeds the context length",
    "input length exceeds context length", "reduce the length of the messages",
    "too many input tokens", "too many tokens", "token limit", "context length of only",
    "model_context_window_exceeded", "context size has been exceeded", "context window exceeded",
    "request too large",  # SPEC §1 seed list; the OpenAI/Groq TPM form is matched with numbers
)
# Overflow by shape rather than by exact wording: "<prompt|input|request> ... too long",
# "exceed(s|ed) ... <max> context length|window|size", "longer/greater than the context length",
# "input tokens exceeded". Weak like OVERFLOW_WORDS (a rate-limit marker vetoes them).
OVERFLOW_SHAPES = re.compile(
    r"\b(?:prompt|input|request|messages?|conversation)\b(?: is)? too long\b"
    r"|\bexceed(?:s|ed)?\b[^.;]{0,30}?\b(?:max(?:imum)?\s+)?context\s+(?:length|window|size)\b"
    r"|\b(?:longer|greater|larger) than the (?:model'?s )?(?:maximum )?context\s+(?:length|window|size)"
    r"|\binput tokens? (?:exceeded|limit exceeded)\b|\bnumber of input tokens exceeds\b", _I)
OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error",
                             "model_context_window_exceeded"})
RATE_MARKERS = ("rate limit", "rate_limit", "per minute", "per min", "throttl", "please wait",
                 "try again in", "tokens per day", "(tpm)", "(rpm)", "quota")

# Payload size in the text (status not 413/431, e.g. a proxy page relayed as 400/502).
# (Covers SPEC's "413 payload too large" and "431 request header fields too large" too.)
PAYLOAD_WORDS = (
    "request entity too large", "payload too large", "payloadtoolargeerror", "body too large",
    "maximum request size", "request_too_large", "request header fields too large",
    "failed to buffer the request body", "request or reply is too large",
    "request entity is too large", "exceeds the request content length",
    "request that was too large",
)
# OpenAI per-field byte limit: "Invalid 'messages[1].content': string too long. Expected a
# string with maximum length 10485760, but got a string with length 12000000 instead."
STRING_TOO_LONG = re.compile(r"string too long\. expected a string with maximum length", _I)

# 403 evidence, in two strengths (see the precedence rules in ``_classify``).
# Block evidence: words that say a firewall, proxy or policy engine stopped the request. They win
# over auth evidence and over "the body is a JSON error".
BLOCK_WORDS = (
    "firewall", "waf", "security policy", "blocked", "mod_security", "modsecurity",
    "proxy denied", "policy violation", "request rejected", "the requested url was rejected",
    "support id", "incident id", "forbidden by administrative rules", "attention required",
    "cloudflare", "cf-ray", "ray id", "incapsula", "imperva", "sucuri",
    "the request could not be satisfied", "zscaler", "netskope", "squid", "barracuda",
    "fortiguard", "blocked url", "web filter", "access control configuration",
    "security service",
)
BLOCK_WORD_RE = re.compile(
    r"(?<![a-z0-9_])(?:" + "|".join(re.escape(w) for w in BLOCK_WORDS) + r")(?![a-z0-9_])", _I)
# Block headers: set only by a firewall (AWS WAF, Cloudflare challenges, Imperva, Sucuri).
BLOCK_HEADER_PREFIXES = ("x-amzn-waf", "cf-mitigated", "x-iinfo", "x-sucuri", "x-squid-error")
# Weak proxy evidence: a middlebox is on the path (it may only be carrying the provider's answer).
# It decides a 403 only when nothing in the answer speaks of credentials.
WEAK_PROXY_WORDS = re.compile(r"(?<![a-z0-9_])(?:access denied|akamai|edgesuite)(?![a-z0-9_])", _I)
WAF_HEADER_NAMES = ("cf-ray", "cf-mitigated", "x-amzn-waf-action", "x-iinfo", "x-sucuri-id",
                     "x-akamai-request-id", "akamai-grn", "x-azure-ref", "x-cdn")
WAF_SERVER_WORDS = ("cloudflare", "akamaighost", "akamai", "awselb", "cloudfront",
                     "incapsula", "imperva", "sucuri", "bigip", "big-ip", "barracuda",
                     "microsoft-azure-application-gateway", "zscaler", "fortiweb",
                     "mod_security", "squid")
# Auth evidence in a 403's words (credentials, identity, entitlement).
AUTH_EVIDENCE_RE = re.compile(
    r"api[ _-]?key|credential|\btoken\b|unauthori[sz]ed|not authori[sz]ed|permission|\brbac\b"
    r"|subscription key|does not have access|do not have access|don't have access|not allowed to"
    r"|not supported in your|country, region|identity|iam\b", _I)

AUTH_TYPES = frozenset({"authentication_error", "permission_error", "invalid_api_key",
                         "unauthenticated", "permission_denied", "forbidden",
                         "request_forbidden", "oauth_error"})
AUTH_CODES = frozenset({"invalid_api_key", "api_key_invalid", "unauthenticated",
                         "permission_denied", "invalid_authentication", "401", "403",
                         "unsupported_country_region_territory", "missing_api_key"})
AUTH_WORDS = ("incorrect api key", "invalid api key", "api key not valid", "invalid x-api-key",
               "no auth credentials", "invalid authentication", "invalid subscription key",
               "authentication_error", "permission_error", "unauthorized")

# Structured error types/codes that name a retryable condition. They matter most for errors
# that arrive inside a 200 stream (Anthropic "event: error", OpenAI "data: {"error": …}"),
# where the HTTP status says nothing.
TRANSIENT_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error",
                              "server_error", "rate_limit_exceeded", "timeout_error",
                              "service_unavailable", "unavailable", "resource_exhausted",
                              "deadline_exceeded", "internal", "internal_error",
                              "throttlingexception", "serviceunavailableexception",
                              "modelnotreadyexception"})
PAYLOAD_TYPES = frozenset({"request_too_large", "request_body_too_large_after_decoding"})

# Non-retryable 429: out of money, not out of time.
QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached",
                          "billing_not_active"})

# Connection-level failures, by exception class name anywhere in the MRO of any exception
# in the cause chain.
TIMEOUT_NAMES = frozenset({"TimeoutException", "ReadTimeout", "WriteTimeout", "ConnectTimeout",
                            "PoolTimeout", "TimeoutError", "APITimeoutError", "timeout",
                            "DeadlineExceeded"})
CONNECT_NAMES = frozenset({"ConnectError", "ConnectionRefusedError", "gaierror",
                            "UnsupportedProtocol", "InvalidURL", "ProxyError"})
DROP_NAMES = frozenset({"RemoteProtocolError", "ReadError", "WriteError", "NetworkError",
                         "CloseError", "ProtocolError", "ConnectionResetError",
                         "BrokenPipeError", "ConnectionAbortedError", "ConnectionError",
                         "EndOfStream", "BrokenResourceError", "ClosedResourceError",
                         "IncompleteRead", "SSLEOFError", "RemoteDisconnected",
                         "ServerDisconnectedError", "ClientPayloadError",
                         "APIConnectionError", "StreamError", "LocalProtocolError"})
DROP_WORDS = ("server disconnected", "unexpected eof", "connection reset", "broken pipe",
               "stream error", "peer closed connection", "connection aborted",
               "incomplete chunked read", "eof occurred in violation of protocol",
               "connection closed", "remote end closed connection", "connection was closed")
TIMEOUT_WORDS = ("timed out", "timeout")
# A drop after the response had started (the request was accepted, the answer was cut):
# never a request-size problem.
RESPONSE_STARTED_WORDS = ("incomplete chunked read", "without sending complete message body",
                           "response ended prematurely", "incomplete message body")

# Class-name fallbacks for SDK exceptions that carry no status (or for a class whose name
# says more than its status).
NAME_KINDS: tuple[tuple[tuple[str, ...], FailureKind], ...] = (
    (("ContentTooLarge", "RequestTooLarge", "RequestHeaderFieldsTooLarge"),
     FailureKind.PAYLOAD_TOO_LARGE),
    (("Authentication", "PermissionDenied", "Credentials", "OAuth", "IdentityToken",
      "WorkloadIdentity", "SubjectTokenProvider"), FailureKind.AUTH),
    (("RateLimit", "Overloaded", "ServiceUnavailable", "InternalServer", "GatewayTimeout",
      "RequestTimeout", "Retryable"), FailureKind.TRANSIENT),
)


#: A 400 that says the JSON body could not be read: what an API answers when a proxy cut
#: the body on its way (Caddy's ``request_body max_size`` passes the first bytes on).
BAD_BODY_RE = re.compile(
    r"could not parse the json body|invalid json|malformed json|unexpected end of (?:json|data"
    r"|input)|unterminated string|expecting (?:value|',' delimiter)|json decode|"
    r"request body is not valid json|failed to parse (?:the )?(?:request )?body",
    re.IGNORECASE)

# What differs between two answers that are the same error, left out of a failure's
# fingerprint: ids (UUIDs; tokens of 12+ letters and digits such as req_…, chatcmpl-…, a
# Cloudflare ray id), timestamps (ISO, HTTP dates, clock times) and waits ("in 1.5s").
# Token counts and sizes stay: on the same body they are the same.
VOLATILE = re.compile(
    r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
    r"|\b\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:z|[+-]\d{2}:?\d{2})?"
    r"|\b(?:mon|tue|wed|thu|fri|sat|sun), \d{1,2} [a-z]{3} \d{4} \d{2}:\d{2}:\d{2} gmt\b"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"
    r"|\b(?=[a-z_-]*\d)(?=[0-9_-]*[a-z])[a-z0-9_-]{12,}\b"
    r"|\b\d+(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds?)\b", _I)
