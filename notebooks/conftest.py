"""Notebooks run under nbval (``python -m pytest``) in a private, throwaway data directory.

The kernel nbval starts inherits this process's environment, so the transcripts the
notebooks write go to a temporary directory, not ``~/.local/state``. No key is needed:
the notebooks use the built-in emulator.
"""

from __future__ import annotations

import os
import tempfile

_STATE = tempfile.TemporaryDirectory(prefix="ipy_ctxrecovery-notebooks-")
os.environ["IPY_CTXRECOVERY_DIR"] = _STATE.name
for _var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "CHATCLI_MAX_PAYLOAD",
             "CHATCLI_CONTEXT_WINDOW"):
    os.environ.pop(_var, None)
