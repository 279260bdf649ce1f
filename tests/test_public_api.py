"""The public surface is pinned, and importing it pulls in no UI or SDK module."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ipy_ctxrecovery

HEAVY = ("IPython", "ipywidgets", "openai", "anthropic")
CORE = ("settings", "errors", "failures", "redaction", "core", "core.history", "core.events",
        "core.wording", "core.prompts", "core.catalogue", "core.budget", "core.pairing",
        "core.microcompact", "core.compactor", "core.ladder", "core.preflight",
        "core.continuation", "core.classify", "core.exactfit", "core.retry",
        "core.recovery.evidence", "core.recovery.policy", "core.recovery.flow", "core.markers",
        "core.cuts", "core.caching")


def test_all_is_pinned() -> None:
    assert ipy_ctxrecovery.__all__ == [
        "ChatError",
        "ChatSession",
        "ConfigError",
        "CtxRecoveryError",
        "Emulator",
        "Failure",
        "FailureKind",
        "Message",
        "Reply",
        "Settings",
        "__version__",
        "chat_tool",
        "classify",
        "describe",
        "load_ipython_extension",
        "parse_size",
        "replay",
        "unload_ipython_extension",
    ]


@pytest.mark.parametrize("name", ipy_ctxrecovery.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(ipy_ctxrecovery, name) is not None


def _loaded_after(statement: str) -> list[str]:
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_package_imports_no_ui_or_sdk() -> None:
    assert _loaded_after("import ipy_ctxrecovery") == []


def test_core_modules_import_no_ui_or_sdk() -> None:
    imports = "\n".join(f"import ipy_ctxrecovery.{m}" for m in CORE)
    assert _loaded_after(imports) == []


def test_session_layer_imports_no_sdk_until_a_provider_is_made() -> None:
    statement = ("from ipy_ctxrecovery import ChatSession, Reply, chat_tool\n"
                 "import ipy_ctxrecovery.session.store, ipy_ctxrecovery.session.tools\n"
                 "import ipy_ctxrecovery.session.recovery, ipy_ctxrecovery.session.pipeline")
    assert _loaded_after(statement) == []


def test_the_session_values_have_one_public_home() -> None:
    from ipy_ctxrecovery import session

    assert session.Reply is ipy_ctxrecovery.Reply
    assert session.__all__ == ["KEEP", "ChatSession", "Reply", "SessionStatus"]


def test_loading_the_extension_imports_no_sdk() -> None:
    # The first %chat panel imports only its model's SDK (bench/panel.py); a notebook
    # module that imported a provider at load (the Responses API's, for a status line)
    # imported openai for every session, Anthropic's too.
    loaded = _loaded_after("import ipy_ctxrecovery.notebook")
    assert "openai" not in loaded and "anthropic" not in loaded, loaded
