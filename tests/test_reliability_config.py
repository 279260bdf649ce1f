"""Settings that pass validation are safe to compute with (issue 12 item 8), and the two
bounds on waiting (issue 12 item 1): ``max_retry_wait`` and ``turn_timeout``."""

from __future__ import annotations

import math

import pytest

from ipy_ctxrecovery import Settings
from ipy_ctxrecovery.errors import ConfigError


@pytest.mark.parametrize("changes, words", [
    ({"chars_per_token": math.nan}, "chars_per_token=nan is not a finite number"),
    ({"chars_per_token": 0}, "chars_per_token=0 must be between 1 and 10"),
    ({"chars_per_token": 0.0}, "chars_per_token=0.0 must be between 1 and 10"),
    ({"chars_per_token": math.inf}, "chars_per_token=inf is not a finite number"),
    ({"max_payload": 0}, "CHATCLI_MAX_PAYLOAD=0 is not a usable cap"),
    ({"max_payload": 2.5}, "CHATCLI_MAX_PAYLOAD=2.5 is not a usable cap"),
    ({"context_window": math.nan}, "CHATCLI_CONTEXT_WINDOW=nan is not a finite number"),
    ({"context_window": 1.5}, "CHATCLI_CONTEXT_WINDOW=1.5 is not a whole number"),
    ({"preflight_cap_fraction": math.nan}, "preflight_cap_fraction=nan is not a finite"),
    ({"summary_max_chars": 5.0}, "summary_max_chars=5.0 is not a whole number"),
    ({"summarizer_input_max_chars": 0}, "summarizer_input_max_chars=0 must be at least 1"),
    ({"summary_max_requests": 0}, "CHATCLI_SUMMARY_MAX_REQUESTS=0 allows no summary request; "
                                  "give at least 1 (the default is 8)."),
    ({"summary_max_requests": 2.5}, "CHATCLI_SUMMARY_MAX_REQUESTS=2.5 is not a whole number"),
    ({"exact_fit_margin": 1.0}, "exact_fit_margin=1.0 must be a fraction in [0, 1)"),
    ({"max_retry_wait": -1}, "max_retry_wait=-1 must not be negative"),
    ({"max_retry_wait": math.inf}, "max_retry_wait=inf is not a finite number"),
    ({"turn_timeout": 0}, "turn_timeout=0 must be at least 1 second"),
    ({"assumed_cap_bytes": 0}, "assumed_cap_bytes=0 must be a positive number"),
])
def test_values_that_would_crash_later_are_refused_when_built(changes: dict, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(**changes)
    assert words in str(caught.value)
    with pytest.raises(ConfigError):
        Settings().replace(**changes)


def test_the_wait_bounds_have_defaults_and_text_forms() -> None:
    s = Settings()
    assert s.max_retry_wait == 60.0 and s.turn_timeout == 900.0
    t = s.updated({"max_retry_wait": "5", "turn_timeout": "30"})
    assert (t.max_retry_wait, t.turn_timeout) == (5.0, 30.0)
    for off in ("none", "off", "0"):
        assert s.updated({"turn_timeout": off}).turn_timeout is None
    with pytest.raises(ConfigError, match=r"max_retry_wait='soon' is not a number"):
        s.updated({"max_retry_wait": "soon"})
