"""What a test needs from the machine: skipped with one line locally, a failure under CI.

``.ci/run`` installs every program and package the tests use, so on CI (``CI=true``) a
missing one is a broken install, never a reason to skip.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(reason: str) -> NoReturn:
    """Skip the test with ``reason`` (printed on one line), or fail it under ``CI=true``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, and CI=true requires it.")
    print(f"SKIP: {reason}")
    pytest.skip(reason)
