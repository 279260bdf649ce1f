"""Masking: detect-secrets' formats, the extra ones, a session's own credentials, speed."""

from __future__ import annotations

import base64
import bisect
import json
import subprocess
import sys

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from secrets_planted import PLANTED

from ipy_ctxrecovery import redaction
from ipy_ctxrecovery.core.history import Message, Reasoning, ToolCall
from ipy_ctxrecovery.errors import redact
from ipy_ctxrecovery.redaction import MASK, credential_param, mask_secrets, url_credentials
from ipy_ctxrecovery.session.redactor import Redactor, client_credentials
from ipy_ctxrecovery.settings import public_url


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_every_planted_kind_is_masked(kind: str) -> None:
    text, secret = PLANTED[kind]
    masked = mask_secrets(f"here it is: {text}\nand the next line stays")
    assert secret not in masked and MASK in masked
    assert masked.endswith("\nand the next line stays")
    assert mask_secrets(masked) == masked  # idempotent
    assert secret not in redact(text)       # errors use the same detector


@pytest.mark.parametrize("text", [
    "def login(user: str, password: str) -> bool:",
    "the password is in the vault; ask the admin for the API key",
    'password = os.environ["DB_PASSWORD"]',
    "use sk-learn-compatible estimators",
    "Emulator reply: you said \"hello\" (3 messages, 20 prompt tokens).",
    "[[tool read_file {\"path\": \"notes.txt\"}]]",
    "see https://example.com/docs?page=2&lang=en for details",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_a_line_is_kept_whole_around_a_masked_value() -> None:
    env = "OPENAI_BASE_URL=http://localhost\nDB_PASSWORD=hunter2-Xyzzy-42\nDEBUG=1\n"
    assert mask_secrets(env) == \
        f"OPENAI_BASE_URL=http://localhost\nDB_PASSWORD={MASK}\nDEBUG=1\n"


def test_a_private_key_is_masked_from_begin_to_end() -> None:
    pem, _ = PLANTED["pem"]
    assert mask_secrets(f"before\n{pem}\nafter") == f"before\n{MASK}\nafter"


def test_the_clients_own_key_is_masked_whatever_its_shape() -> None:
    key = "gw-team42-0f9e8d7c6b5a"           # a gateway key: no known format
    client = openai.OpenAI(api_key=key, base_url="http://127.0.0.1:9/v1",
                           default_headers={"X-Gateway-Token": "tok-abcdefgh"})
    found = client_credentials(client)
    assert {key, "tok-abcdefgh"} <= found
    assert mask_secrets(f"invalid key {key}") == f"invalid key {key}"  # not a known format
    redactor = Redactor(lambda: found)
    assert redactor.shown(f"invalid key {key}") == f"invalid key {MASK}"
    assert redactor.stored(f"my key is {key}") == f"my key is {MASK}"
    client.close()


def test_the_opt_out_keeps_formats_but_never_the_own_key() -> None:
    own = "gw-team42-0f9e8d7c6b5a"
    text, secret = PLANTED["ghp"]
    redactor = Redactor(lambda: {own}, formats=lambda: False)
    assert redactor.stored(f"{text} {own}") == f"{text} {MASK}"
    assert secret not in redactor.shown(text)  # errors and events: always masked


def test_a_replaced_key_is_still_masked() -> None:
    keys = ["gw-first-key-0001"]
    redactor = Redactor(lambda: keys)
    redactor.credentials()
    keys[:] = ["gw-second-key-0002"]
    assert redactor.shown("gw-first-key-0001 gw-second-key-0002") == f"{MASK} {MASK}"


def test_a_key_changed_on_the_same_client_is_found_at_once() -> None:
    # client_credentials remembers what a client's values gave: a key set in place on the
    # same object must still be found (and masked longest first) the next time it is asked.
    client = openai.OpenAI(api_key="gw-first-key-0001", base_url="http://127.0.0.1:9/v1")
    redactor = Redactor(lambda: client_credentials(client))
    assert redactor.shown("gw-first-key-0001") == MASK
    client.api_key = "gw-first-key-0001-and-longer"
    assert "gw-first-key-0001-and-longer" in client_credentials(client)
    assert redactor.shown("x gw-first-key-0001-and-longer y") == f"x {MASK} y"
    client.close()


def test_a_url_gives_its_credentials_in_the_forms_they_are_echoed() -> None:
    url = "http://bob:hunter%40pass@gw.example/v1?api-version=2024-10-21&key=qs-secret-77"
    token = base64.b64encode(b"bob:hunter@pass").decode()
    assert url_credentials(url) == {
        "hunter%40pass", "hunter@pass", "bob:hunter%40pass", "bob:hunter@pass", token,
        f"Basic {token}", "qs-secret-77"}
    # A user name alone is a token; a credential shorter than MIN_CREDENTIAL is left out
    # (its Basic form is long enough to keep).
    assert url_credentials("https://ghp_tok1234567890@h/") >= {"ghp_tok1234567890"}
    assert url_credentials("http://bob:pw12@h/?sig=abc") == {
        base64.b64encode(b"bob:pw12").decode(), "Basic " + base64.b64encode(b"bob:pw12").decode(),
        "bob:pw12"}
    assert url_credentials("http://[::1/v1") == frozenset()   # not a URL: nothing
    assert url_credentials("https://api.openai.com/v1") == frozenset()


@pytest.mark.parametrize("userinfo", ["bob:hunter2pass", "b%C3%B6b:p%40ss%3Aw%C3%B6rd99",
                                      "tok-only-1234567890"])
def test_the_basic_form_is_the_header_httpx2_sends(userinfo: str) -> None:
    sent: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request.headers["Authorization"])
        return httpx2.Response(401)

    url = f"http://{userinfo}@gw.example/v1"
    with httpx2.Client(transport=httpx2.MockTransport(answer)) as http:
        http.post(f"{url}/chat/completions")
    assert sent[0].startswith("Basic ") and sent[0] in url_credentials(url)


def test_the_clients_base_url_credentials_are_its_own() -> None:
    client = openai.OpenAI(api_key="sk-unused-0000",
                           base_url="http://bob:hunter2pass@127.0.0.1:9/v1?key=qs-secret-77")
    token = base64.b64encode(b"bob:hunter2pass").decode()
    found = client_credentials(client)
    assert {"hunter2pass", "bob:hunter2pass", token, f"Basic {token}", "qs-secret-77"} <= found
    redactor = Redactor(lambda: found)
    assert redactor.shown(f"Incorrect API key provided: Basic {token}.") == (
        f"Incorrect API key provided: {MASK}.")
    assert redactor.stored(f"the token {token} and qs-secret-77") == f"the token {MASK} and {MASK}"
    client.close()


QUERY_PARAMETERS = [
    ("key", True), ("api_key", True), ("apiKey", True), ("access_token", True), ("sig", True),
    ("X-Amz-Signature", True), ("X-Amz-Credential", True), ("X-Amz-Security-Token", True),
    ("code", True), ("password", True), ("client_secret", True), ("session", True),
    ("client_assertion", True), ("signature", True), ("auth", True),
    ("api-version", False), ("deployment", False), ("author", False), ("sv", False),
    ("X-Amz-Date", False), ("state", False), ("max_tokens", False), ("page", False),
]


@pytest.mark.parametrize(("name", "is_credential"), QUERY_PARAMETERS)
def test_credential_query_parameters(name: str, is_credential: bool) -> None:
    assert credential_param(name) is is_credential


@pytest.mark.parametrize(("name", "is_credential"), QUERY_PARAMETERS)
def test_text_and_base_urls_mask_the_same_query_parameters(name: str,
                                                           is_credential: bool) -> None:
    # One list decides: a value masked in a base URL is masked in any text, and only then.
    value = "v4lue-0123456789"
    url = f"https://gw.example/v1?api-version=2024-10-21&{name}={value}&page=2"
    for text in (url, f"GET {url} HTTP/1.1 -> 401", f'"{url}"'):
        assert (value not in mask_secrets(text)) is is_credential, text
    assert (value not in public_url(url)) is is_credential
    assert (value in url_credentials(url)) is is_credential


@pytest.mark.parametrize(("text", "masked"), [
    ("GET https://gw.example/v1?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
     "AKIAIOSFODNN7EXAMPLE%2F20240101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date="
     "20240101T000000Z&X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc9631"
     "76630326f1024 HTTP/1.1",
     f"GET https://gw.example/v1?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={MASK}"
     f"&X-Amz-Date=20240101T000000Z&X-Amz-Signature={MASK} HTTP/1.1"),
    ("redirected to /callback?code=4/0AY0e-g7xQzW9xyz&state=af0ifjsldkj",
     f"redirected to /callback?code={MASK}&state=af0ifjsldkj"),
    ("open `https://gw.example/v1?session=Zx81kdf00aa1#top` in a browser",
     f"open `https://gw.example/v1?session={MASK}#top` in a browser"),
])
def test_credential_query_parameters_are_masked_in_any_text(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked
    assert mask_secrets(masked) == masked


@pytest.mark.parametrize("text", [
    "set code=42 and key=value in the form",
    "if (flags&&code==0) return;",
    "x = a?code=1:code=2",
    "the session=3 token=abc words are prose here",
])
def test_name_value_outside_a_url_query_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_short_client_keys_are_not_masked_verbatim() -> None:
    assert Redactor(lambda: {"test"}).stored("a test of the test") == "a test of the test"


def test_messages_keep_their_shape() -> None:
    text, secret = PLANTED["PASSWORD="]
    call = ToolCall("c1", "save", json.dumps({"env": text, "n": 1}))
    message = Message.assistant("ok", [call], reasoning=f"found {text}")
    message = message.with_blocks(
        [Reasoning(f"found {text}", "sig"), *message.blocks[1:]])
    stored = Redactor().message(message)
    assert secret not in json.dumps(stored.to_dict())
    arguments = json.loads(stored.tool_calls[0].arguments)  # still the same JSON
    assert arguments["n"] == 1 and MASK in arguments["env"]
    assert stored.blocks[0] == Reasoning(f"found DB_PASSWORD={MASK}", None)  # signature dropped
    plain = Message.user("nothing secret here")
    assert Redactor().message(plain) is plain


def test_masking_is_linear_on_ordinary_text() -> None:
    # Only candidate lines reach the patterns: a 1 MB tool result of prose and code is
    # scanned in one pass (the timing is in bench/, here only the result).
    lines = [f"line {i}: x = compute(y) + {i} # a note about the weather" for i in range(20_000)]
    lines[12_345] = PLANTED["ghp"][0]
    masked = mask_secrets("\n".join(lines))
    assert PLANTED["ghp"][1] not in masked
    assert masked.count("\n") == 19_999


def test_loading_the_detector_leaves_warnings_shown_as_python_shows_them() -> None:
    # detect-secrets turns logging.captureWarnings on when imported; a kernel's warnings
    # (ours included: "nothing is being saved") must still be shown and recordable.
    code = ("import warnings\n"
            "from ipy_ctxrecovery.redaction import mask_secrets\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    mask_secrets('password = hunter22222')\n"
            "    warnings.warn('still shown', RuntimeWarning)\n"
            "print(len(caught))\n"
            "warnings.warn('to stderr', RuntimeWarning)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "1"
    assert "RuntimeWarning: to stderr" in out.stderr


def _reference_mask(text: str) -> str:
    """``redaction._mask`` as it was before each pattern got a search first (the same
    candidate lines, every pattern walked with finditer): what the faster one must equal."""
    regexes, pairs, prefilter, filters, private = redaction._detectors()
    spans: list[tuple[int, int]] = []
    chosen: list[str] = []
    starts: list[tuple[int, int]] = []
    joined_at = offset = 0
    for line in text.splitlines(keepends=True):
        low = line.lower()
        if any(t in low for t in redaction._TRIGGERS) or redaction._LONG_RUN.search(line):
            chosen.append(line)
            starts.append((joined_at, offset))
            joined_at += len(line)
            if any(t in low for t in redaction._KEYWORD_TRIGGERS) and prefilter.search(line):
                spans.extend(redaction._keyword_spans(line, offset, pairs, filters))
        offset += len(line)
    if chosen:
        joined = "".join(chosen)
        found: list[tuple[int, int]] = []
        for pattern in regexes:
            found.extend(redaction._pattern_spans(pattern, joined))
        for pattern in redaction.EXTRA_PATTERNS:
            found.extend(redaction._pattern_spans(pattern, joined, group_is_secret=True))
        keys = [a for a, _ in starts]
        for start, end in found:
            i = bisect.bisect_right(keys, start) - 1
            line_start, original = starts[i]
            line_end = keys[i + 1] if i + 1 < len(keys) else len(joined)
            shift = original - line_start
            spans.append((start + shift, min(end, line_end) + shift))
    spans.extend(redaction._query_spans(text))
    if "PRIVATE KEY" in text or "PuTTY" in text:
        spans.extend(redaction._private_key_spans(text, private))
    return redaction._apply(text, spans)


_FRAGMENTS = st.one_of(
    st.sampled_from([text for text, _ in PLANTED.values()]),
    st.sampled_from(["token", "tokens", "api_key=", "Authorization: Bearer ", "aws ",
                     "password: ", "key", "secret=", "https://", "?key=", "&sig=", "sk-",
                     "ghp_", "eyJ", "AKIA", "xoxb-", "-----BEGIN RSA PRIVATE KEY-----",
                     "-----END RSA PRIVATE KEY-----", "PuTTY", '"', "'", "=", ":", " ",
                     "\n", "\r\n", "\t", "(52 messages, 26626 prompt tokens)."]),
    st.text(alphabet="ABCDEFabcdef0123456789+/=_-", min_size=1, max_size=60),
    st.text(min_size=1, max_size=30),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=25))
def test_masking_equals_the_full_scan_on_random_text_with_planted_secrets(
        parts: list[str]) -> None:
    # Every planted secret is masked by the full scan (test_every_planted_kind_is_masked);
    # the faster scan must give exactly the same text, whatever surrounds them.
    for text in ("".join(parts), "\n".join(parts)):
        assert redaction._mask(text) == _reference_mask(text)


@pytest.mark.parametrize("text, masked", [
    ("Set password = hunter2hunter2 in the config, then restart the server.",
     "Set password = [REDACTED] in the config, then restart the server."),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY tail",
     "aws_secret_access_key = [REDACTED] tail"),
    ('password = "my pass phrase here" and more', 'password = "[REDACTED]" and more'),
])
def test_an_unquoted_keyword_value_is_one_word_and_the_rest_of_the_line_stays(
        text: str, masked: str) -> None:
    # QA: the words after an unquoted value were masked with it, and so lost from the
    # transcript; a quoted value may hold spaces and is masked whole.
    assert mask_secrets(text) == masked
