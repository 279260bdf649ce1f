"""The README's Python examples run as written (against the emulator, no network)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    # The corporate-gateway example builds a client only; it must not need a real key.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-example-not-a-real-key")
    namespace: dict[str, object] = {"__name__": f"readme_example_{index}"}
    exec(compile(BLOCKS[index], f"README.md[python block {index}]", "exec"), namespace)
    session = namespace.get("session") or namespace.get("s")
    if hasattr(session, "close"):
        session.close()  # type: ignore[union-attr]
    assert "sk-readme-example" not in capsys.readouterr().out
