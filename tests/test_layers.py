"""The import contracts in pyproject.toml hold, and they fail when a layer or a cycle breaks.

import-linter checks the layers (notebook → session → providers → emulator, the core
below them all) and that no two sibling modules import each other, directly or round
about. The checker is itself checked: on a copy of the package with a cycle or an upward
import added, it must fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    # --verbose: import-linter's spinner fails outside a terminal.
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", command, "--verbose", "--no-logo",
                           "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_import_contracts_hold() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and "0 broken" in result.stdout


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "ipy_ctxrecovery", tmp_path / "ipy_ctxrecovery",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


def test_a_cycle_between_siblings_breaks_the_contract(copy: Path) -> None:
    _append(copy / "ipy_ctxrecovery" / "core" / "events.py", "from . import wording  # noqa")
    result = lint(copy)
    assert result.returncode != 0
    assert "no cycles between siblings BROKEN" in result.stdout


def test_an_upward_import_breaks_the_layers(copy: Path) -> None:
    _append(copy / "ipy_ctxrecovery" / "session" / "values.py",
            "from ..notebook import display  # noqa")
    result = lint(copy)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and "notebook" in result.stdout


def test_the_core_imports_nothing_above_it(copy: Path) -> None:
    _append(copy / "ipy_ctxrecovery" / "core" / "compactor.py",
            "from ..session import values  # noqa")
    result = lint(copy)
    assert result.returncode != 0 and "BROKEN" in result.stdout
