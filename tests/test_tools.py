"""Tools: schemas from hints and docstrings, argument validation, errors as results, read_file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Optional

import pytest

from ipy_ctxrecovery.session.tools import (
    Tool,
    ToolError,
    as_tool,
    build_tool,
    chat_tool,
    make_read_file,
    parse_docstring,
    registered_tools,
)


def search(query: str, limit: int = 10, exact: bool = False, scale: float = 1.0,
           tags: list[str] | None = None, mode: Literal["fast", "full"] = "fast",
           extra: dict[str, int] | None = None, note: Optional[str] = None) -> str:  # noqa: UP045
    """Search the notes.

    Longer explanation that is part of the description.

    Args:
        query: what to look for.
        limit: how many hits
            at most.
        exact: match exactly.
    """
    return f"{query}:{limit}:{exact}:{scale}:{tags}:{mode}:{extra}:{note}"


def test_schema_from_hints_and_google_docstring() -> None:
    tool = build_tool(search)
    assert tool.name == "search"
    assert tool.description == "Search the notes.\n\nLonger explanation that is part of the description."
    p = tool.parameters
    assert p["type"] == "object" and p["required"] == ["query"]
    assert p["additionalProperties"] is False
    props = p["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for."}
    assert props["limit"] == {"type": "integer", "description": "how many hits at most.", "default": 10}
    assert props["exact"]["type"] == "boolean" and props["exact"]["default"] is False
    assert props["scale"] == {"type": "number", "default": 1.0}
    assert props["tags"] == {"type": ["array", "null"], "items": {"type": "string"}, "default": None}
    assert props["mode"] == {"enum": ["fast", "full"], "type": "string", "default": "fast"}
    assert props["extra"]["additionalProperties"] == {"type": "integer"}
    assert props["note"]["type"] == ["string", "null"]
    spec = tool.spec
    assert spec.name == "search" and spec.parameters is p
    json.dumps(p)  # a JSON schema, serializable as is


def test_numpy_and_sphinx_docstrings() -> None:
    _, numpy_params = parse_docstring("""Do it.

    Parameters
    ----------
    path : str
        where it is.
    count : int
        how many.

    Returns
    -------
    str
    """)
    assert numpy_params == {"path": "where it is.", "count": "how many."}
    desc, sphinx = parse_docstring("""Do it.

    :param path: where
        it is.
    :param int count: how many.
    :returns: something
    """)
    assert desc == "Do it."
    assert sphinx == {"path": "where it is.", "count": "how many."}


def test_unsupported_type_and_positional_only_are_refused_at_decoration() -> None:
    def bad(x: bytes) -> None:
        """Bad."""

    with pytest.raises(TypeError, match="parameter 'x'"):
        build_tool(bad)

    def pos(x: int, /) -> None:
        """Pos."""

    with pytest.raises(TypeError, match="positional-only"):
        build_tool(pos)
    with pytest.raises(ValueError, match="tool name"):
        build_tool(search, name="has space")


@pytest.mark.parametrize(("arguments", "expected"), [
    ('{"query": "x"}', "x:10:False:1.0:None:fast:None:None"),
    ('{"query": "x", "limit": 3, "scale": 2, "tags": ["a"], "mode": "full"}',
     "x:3:False:2:['a']:full:None:None"),
    ("", None),
])
def test_valid_arguments_run(arguments: str, expected: str | None) -> None:
    content, is_error = build_tool(search).run(arguments)
    if expected is None:
        assert is_error and "missing required argument" in content
    else:
        assert (content, is_error) == (expected, False)


@pytest.mark.parametrize(("arguments", "fragment"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"limit": 3}', "missing required argument(s) ['query']"),
    ('{"query": 5}', "'query' must be a string, not a number"),
    ('{"query": "x", "limit": "3"}', "'limit' must be an integer, not a string"),
    ('{"query": "x", "limit": true}', "'limit' must be an integer, not a boolean"),
    ('{"query": "x", "limit": 2.5}', "'limit' must be an integer"),
    ('{"query": "x", "exact": 1}', "'exact' must be a boolean"),
    ('{"query": "x", "tags": ["a", 1]}', "'tags'[1] must be a string"),
    ('{"query": "x", "mode": "slow"}', "must be one of ['fast', 'full']"),
    ('{"query": "x", "extra": {"a": "b"}}', "'extra'['a'] must be an integer"),
    ('{"query": "x", "bogus": 1}', "unknown argument 'bogus'"),
])
def test_bad_arguments_become_error_results(arguments: str, fragment: str) -> None:
    content, is_error = build_tool(search).run(arguments)
    assert is_error
    assert fragment in content
    assert content.startswith("Error:")


def test_exceptions_become_error_results_not_crashes() -> None:
    def boom(n: int) -> int:
        """Divide."""
        return 1 // n

    def refuse(path: str) -> str:
        """Refuse."""
        raise ToolError(f"{path} is not allowed here.")

    assert build_tool(boom).run('{"n": 0}') == (
        "Error: boom raised ZeroDivisionError: integer division or modulo by zero", True)
    assert build_tool(refuse).run('{"path": "/x"}') == ("Error: /x is not allowed here.", True)


def test_a_key_in_a_file_read_by_a_tool_is_masked(tmp_path: Path) -> None:
    # (.env itself is on read_file's deny list; a key may sit in any file.)
    (tmp_path / "setup.txt").write_text("OPENAI_API_KEY=sk-proj-abcdef0123456789abcdef\nDEBUG=1\n")
    read_file = make_read_file(tmp_path, tmp_path / "results")
    text, is_error = read_file.run(json.dumps({"path": str(tmp_path / "setup.txt")}))
    assert not is_error and "DEBUG=1" in text
    assert "abcdef0123456789abcdef" not in text and "REDACTED" in text


def test_a_key_quoted_by_a_failing_tool_is_masked() -> None:
    def call_api(q: str) -> str:
        """Call an internal API."""
        raise RuntimeError(f"401 for {q} with Authorization: Bearer sk-live0123456789abcdef")

    text, is_error = build_tool(call_api).run('{"q": "sales"}')
    assert is_error and "sk-live0123456789abcdef" not in text and "REDACTED" in text


def test_results_are_text() -> None:
    def data(n: int) -> Any:
        """Data."""
        return {"n": n, "list": [1, 2]} if n else None

    assert build_tool(data).run('{"n": 1}') == ('{"n": 1, "list": [1, 2]}', False)
    assert build_tool(data).run('{"n": 0}') == ("", False)


def test_chat_tool_decorator_keeps_the_function_and_registers_it() -> None:
    @chat_tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    @chat_tool(name="renamed_tool", description="Custom.")
    def other(x: int) -> int:
        return x

    assert shout("hi") == "HI"  # still a plain function
    assert isinstance(shout.chat_tool, Tool)  # type: ignore[attr-defined]
    tools = registered_tools()
    assert tools["shout"].description == "Upper-case a text."
    assert tools["renamed_tool"].description == "Custom."
    assert as_tool(shout) is tools["shout"]
    assert as_tool(tools["shout"]) is tools["shout"]
    assert as_tool(search).name == "search"


# -- read_file ---------------------------------------------------------------------------------

@pytest.fixture
def area(tmp_path: Path) -> tuple[Tool, Path, Path]:
    root = tmp_path / "project"
    results = tmp_path / "results"
    root.mkdir()
    results.mkdir()
    (root / "notes.txt").write_text("".join(f"line {i}\n" for i in range(500)), encoding="utf-8")
    (results / "abc.txt").write_text("persisted ü\nsecond\n", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return make_read_file(root, results), root, results


def test_read_file_schema(area: tuple[Tool, Path, Path]) -> None:
    tool = area[0]
    assert tool.name == "read_file"
    props = tool.parameters["properties"]
    assert set(props) == {"path", "offset", "limit"}
    assert tool.parameters["required"] == ["path"]
    assert "offset" in props["offset"]["description"] or "line" in props["offset"]["description"]


def test_read_file_ranges(area: tuple[Tool, Path, Path]) -> None:
    tool, root, results = area
    content, is_error = tool.run(json.dumps({"path": "notes.txt", "offset": 100, "limit": 3}))
    assert not is_error
    assert content == "[notes.txt: lines 100-102 of 500]\nline 100\nline 101\nline 102\n"
    default, _ = tool.run('{"path": "notes.txt"}')
    assert default.count("\n") == 201  # header + 200 lines
    persisted, is_error = tool.run(json.dumps({"path": str(results / "abc.txt")}))
    assert not is_error and "persisted ü" in persisted
    absolute, is_error = tool.run(json.dumps({"path": str(root / "notes.txt"), "offset": 499}))
    assert not is_error and absolute.endswith("line 499\n")
    past_end, is_error = tool.run('{"path": "notes.txt", "offset": 900}')
    assert not is_error and "no lines at offset 900" in past_end


def test_read_file_output_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 50 + "\n" + "y" * 100_000 + "\n")
    tool = make_read_file(tmp_path, tmp_path / "r", max_chars=1000)
    content, is_error = tool.run('{"path": "big.txt"}')
    assert not is_error and len(content) < 1200 and "cut at 1000 chars" in content


def test_read_file_refuses_paths_outside(area: tuple[Tool, Path, Path], tmp_path: Path) -> None:
    tool, root, _ = area
    os.symlink(tmp_path / "secret.txt", root / "escape.txt")
    os.symlink(tmp_path, root / "up")
    for path in ("../secret.txt", str(tmp_path / "secret.txt"), "escape.txt", "up/secret.txt",
                 "/etc/passwd", "~/whatever"):
        content, is_error = tool.run(json.dumps({"path": path}))
        assert is_error, path
        assert "outside the readable area" in content
        assert "top secret" not in content


def test_read_file_errors_are_results(area: tuple[Tool, Path, Path]) -> None:
    tool, root, _ = area
    (root / "sub").mkdir()
    for args, fragment in (({"path": "missing.txt"}, "does not exist"),
                           ({"path": "sub"}, "is a directory"),
                           ({"path": "notes.txt", "offset": -1}, "offset must be"),
                           ({"path": "notes.txt", "limit": 0}, "limit at least 1")):
        content, is_error = tool.run(json.dumps(args))
        assert is_error and fragment in content, (args, content)
