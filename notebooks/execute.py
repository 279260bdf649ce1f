"""Re-execute the tutorials and save them with the outputs of that real run.

    python notebooks/execute.py                 # every notebooks/NN_*.ipynb
    python notebooks/execute.py 08 10           # the ones whose names start so

Each notebook runs in a fresh kernel of this interpreter, with the repository root as its
working directory, a new private IPY_CTXRECOVERY_DIR and no API keys, base URLs, proxies
or CHATCLI_* settings — the conditions nbval runs them under. The saved file has no
execution timings and no widget state (a reader's kernel is not the one that ran them).
A notebook with a failing cell is not written; the command says which cell and exits 1.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from ipy_ctxrecovery.notebook.quickstart import clean_environment, execute  # noqa: E402

STATE_PREFIX = "ipy_ctxrecovery-nb-"
"""The temporary data directories' prefix, which nbval_sanitize.cfg recognises."""


def chosen(prefixes: list[str]) -> list[Path]:
    notebooks = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    if not prefixes:
        return notebooks
    picked = [p for p in notebooks if any(p.name.startswith(x) for x in prefixes)]
    missing = [x for x in prefixes if not any(p.name.startswith(x) for p in notebooks)]
    if missing:
        sys.exit(f"no notebook starts with {', '.join(missing)}")
    return picked


def main(argv: list[str]) -> int:
    for path in chosen(argv):
        state = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
        started = time.monotonic()
        try:
            nb, failed = execute(path, cwd=ROOT, env=clean_environment(state),
                                 kernel_log=state / "kernel.log")
        finally:
            shutil.rmtree(state, ignore_errors=True)
        if failed is not None:
            print(f"✗ {path.name}: {str(failed).strip().splitlines()[-1]}", file=sys.stderr)
            return 1
        for cell in nb.cells:
            cell.metadata.pop("execution", None)
        nbformat.write(nb, path)
        print(f"✓ {path.name} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
