"""Settings, parse_size and CHATCLI_* parsing (SPEC §8, issue 2)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipy_ctxrecovery.errors import ConfigError, CtxRecoveryError
from ipy_ctxrecovery.settings import ENV_VARS, Settings, format_size, parse_size, public_url

MB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5MB", 5 * MB),
        ("5", 5 * MB),
        ("2.5", int(2.5 * MB)),
        ("512KB", 512 * 1024),
        ("512K", 512 * 1024),
        ("2.5MB", int(2.5 * MB)),
        ("1GB", 1024 * MB),
        ("1024B", 1024),
        ("5 mb", 5 * MB),
        ("5MiB", 5 * MB),
        (" 5MB ", 5 * MB),
        ("0", 0),
    ],
)
def test_parse_size_accepts_the_documented_forms(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "abc", "-5MB", "-1", "5XB", "1,5MB", "nan", "inf", "MB",
                                  # humanfriendly alone reads each of these as 5 MB
                                  "5MBB", "5 MB MB", "5MB;rm", "5MB 6", "5 MB extra"])
def test_parse_size_rejects_garbage_with_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text, name="CHATCLI_MAX_PAYLOAD")
    message = str(info.value)
    assert "CHATCLI_MAX_PAYLOAD" in message
    assert "5MB" in message and "512KB" in message  # the accepted forms


@pytest.mark.parametrize("text", ["0.0000001", "512B", "1KB", "0.001", "0.3B"])
def test_a_cap_under_the_smallest_proxy_limit_is_refused_not_read_as_none(text: str) -> None:
    with pytest.raises(ConfigError, match=r"CHATCLI_MAX_PAYLOAD=.*(under|outside).*0 for no cap"):
        Settings.from_env({"CHATCLI_MAX_PAYLOAD": text})


@pytest.mark.parametrize("text", ["0", "0.0", "0KB", " 0 "])
def test_a_zero_written_as_one_is_no_cap(text: str) -> None:
    assert Settings.from_env({"CHATCLI_MAX_PAYLOAD": text}).max_payload is None


def test_defaults_are_the_specs() -> None:
    s = Settings()
    assert (s.max_recovery_attempts, s.max_token_escalations, s.emergency_keep_messages) == (3, 2, 10)
    assert s.max_payload is None and s.context_window is None
    assert (s.microcompact_truncate_turns, s.microcompact_summarize_turns) == (2, 4)
    assert (s.turn_budget_chars, s.per_result_max_chars) == (200_000, 20_000)
    assert s.preflight_cap_fraction == 0.85 and s.preflight_budget_ratio == 0.40
    assert s.no_cap_warn_bytes == int(2.5 * MB)
    assert s.likely_payload_min_bytes == 500 * 1024
    assert s.assumed_cap_bytes == 4 * MB
    assert s.aggressive_assistant_max_chars == 5_000
    assert s.nuclear_keep_messages == 4
    s.validate()


def test_from_env_reads_every_variable() -> None:
    env = {
        "CHATCLI_CONTEXT_WINDOW": "32000",
        "CHATCLI_MAX_RECOVERY_ATTEMPTS": "5",
        "CHATCLI_MAX_TOKEN_ESCALATIONS": "1",
        "CHATCLI_EMERGENCY_KEEP_MESSAGES": "6",
        "CHATCLI_MAX_PAYLOAD": "512KB",
        "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "3",
        "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "6",
        "CHATCLI_SUMMARY_MAX_REQUESTS": "3",
        "CHATCLI_PRICES": "gpt-4o=1/0.5/0/2",
        "CHATCLI_BACKGROUND_COMPACTION": "off",
        "CHATCLI_PROMPT_CACHING": "off",
        "CHATCLI_CACHE_RETENTION": "Long",
        "CHATCLI_SERVER_COMPACTION": "On",
        "CHATCLI_OPENAI_API": "responses",
        "CHATCLI_OPENAI_STORE": "yes",
        "UNRELATED": "x",
    }
    s = Settings.from_env(env)
    assert s.background_compaction is False
    assert s.context_window == 32000
    assert s.max_recovery_attempts == 5
    assert s.max_token_escalations == 1
    assert s.emergency_keep_messages == 6
    assert s.max_payload == 512 * 1024
    assert (s.microcompact_truncate_turns, s.microcompact_summarize_turns) == (3, 6)
    assert s.summary_max_requests == 3
    assert s.prices == "gpt-4o=1/0.5/0/2"
    assert s.prompt_caching is False and Settings().prompt_caching is True
    assert (s.cache_retention, Settings().cache_retention) == ("long", "auto")
    assert (s.server_compaction, s.openai_api, s.openai_store) == ("on", "responses", True)
    assert (Settings().server_compaction, Settings().openai_api) == ("auto", "auto")
    assert Settings().openai_store is False
    assert set(ENV_VARS) == {k for k in env if k.startswith("CHATCLI_")}


def test_unset_or_empty_keeps_defaults_and_zero_payload_means_no_cap() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({name: "" for name in ENV_VARS}) == Settings()
    assert Settings.from_env({"CHATCLI_MAX_PAYLOAD": "0"}).max_payload is None
    assert Settings.from_env({"CHATCLI_MAX_PAYLOAD": "5"}).max_payload == 5 * MB


def test_from_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATCLI_MAX_PAYLOAD", "2MB")
    assert Settings.from_env().max_payload == 2 * MB


BAD_VALUES = {
    "CHATCLI_CONTEXT_WINDOW": ["abc", "-5", "1.5", "12k"],
    "CHATCLI_MAX_RECOVERY_ATTEMPTS": ["three", "-1", "0", "2.5"],
    "CHATCLI_MAX_TOKEN_ESCALATIONS": ["x", "-2", "1e3"],
    "CHATCLI_EMERGENCY_KEEP_MESSAGES": ["ten", "0", "-3"],
    "CHATCLI_MAX_PAYLOAD": ["abc", "-5MB", "5XB", "1,5MB"],
    "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": ["two", "0", "-1", "9"],
    "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": ["four", "1", "-4"],
    "CHATCLI_PROMPT_CACHING": ["maybe", "2"],
}


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in BAD_VALUES.items() for v in values]
)
def test_each_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    assert name in str(info.value)
    assert "\n" not in str(info.value).strip()


def test_relation_error_names_both_variables() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(
            {"CHATCLI_MICROCOMPACT_TRUNCATE_TURNS": "5", "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS": "3"}
        )
    assert "CHATCLI_MICROCOMPACT_SUMMARIZE_TURNS" in str(info.value)
    assert "CHATCLI_MICROCOMPACT_TRUNCATE_TURNS" in str(info.value)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(ENV_VARS)),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
    )
)
def test_from_env_never_raises_anything_but_config_error(env: dict[str, str]) -> None:
    try:
        result = Settings.from_env(env)
    except ConfigError as e:
        assert isinstance(e, CtxRecoveryError) and isinstance(e, ValueError)
    else:
        result.validate()


def test_updated_accepts_field_and_env_names_and_rejects_unknown_keys() -> None:
    s = Settings().updated({"max_payload": "64KB", "CHATCLI_MAX_RECOVERY_ATTEMPTS": "4"})
    assert s.max_payload == 64 * 1024 and s.max_recovery_attempts == 4
    with pytest.raises(ConfigError, match="CHATCLI_NOPE is not a known"):
        Settings().updated({"CHATCLI_NOPE": "1"})


def test_a_refusal_is_one_sentence_naming_the_key_as_typed_once() -> None:
    with pytest.raises(ConfigError) as info:
        Settings().updated({"chat_budget_ratio": "1.5"})
    assert str(info.value) == "chat_budget_ratio=1.5 must be a fraction in (0, 1]."
    # Typed under another name than the sentence uses: said inside the same sentence.
    with pytest.raises(ConfigError) as info:
        Settings().updated({"max_payload": "1KB"})
    said = str(info.value)
    assert said.startswith("CHATCLI_MAX_PAYLOAD=1 KB is outside what a proxy's body limit")
    assert said.endswith(", or 0 for no cap (from max_payload).") and ". (" not in said


def test_settings_are_frozen_values() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_payload = 5  # type: ignore[misc]
    assert s.replace(max_payload=10 * 1024).max_payload == 10 * 1024
    assert s.max_payload is None


def test_format_size_matches_the_spec_wording() -> None:
    assert format_size(int(4.2 * MB)) == "4.2 MB"
    assert format_size(5 * MB) == "5 MB"
    assert format_size(512 * 1024) == "512 KB"
    assert format_size(900) == "900 B"


def test_public_url_masks_user_info_and_credential_query_values() -> None:
    cases = {
        "http://bob:hunter2@host:8/v1": "http://[REDACTED]@host:8/v1",
        "http://bob:p@ss@host/v1?x=a@b": "http://[REDACTED]@host/v1?x=a@b",  # an unencoded '@'
        "http://ghp_tok1234567890@host": "http://[REDACTED]@host",
        "http://h/v1?key=qs-secret-77": "http://h/v1?key=[REDACTED]",
        "http://h/v1/?api-version=2024-10-21&api_key=k1&X-Amz-Signature=s2&code=c3#top":
            "http://h/v1/?api-version=2024-10-21&api_key=[REDACTED]&X-Amz-Signature=[REDACTED]"
            "&code=[REDACTED]#top",
        # Not credentials, or nothing to mask: shown as they are.
        "http://h/v1?deployment=gpt&key=": "http://h/v1?deployment=gpt&key=",
        "https://api.openai.com/v1": "https://api.openai.com/v1",
    }
    assert {url: public_url(url) for url in cases} == cases
    assert all(public_url(shown) == shown for shown in cases.values())


def test_max_reply_is_a_size_with_a_floor() -> None:
    assert Settings().max_reply == 32 * MB
    assert Settings().updated({"max_reply": "128MB"}).max_reply == 128 * MB
    with pytest.raises(ConfigError, match=r"max_reply=1 KB is below 64 KB") as caught:
        Settings().updated({"max_reply": "1KB"})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("key", "raw"), [("CHATCLI_SERVER_COMPACTION", "sometimes"),
                                          ("CHATCLI_OPENAI_API", "completions")])
def test_a_choice_outside_its_words_is_one_sentence_naming_them(key: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({key: raw})
    said = str(info.value)
    assert said.startswith(f"{key}={raw!r} is not one of ") and said.count(".") == 1
    with pytest.raises(ConfigError, match="is not one of auto, on, off"):
        Settings(server_compaction="maybe")
