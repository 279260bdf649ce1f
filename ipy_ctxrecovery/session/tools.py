"""Tools the model may call: schemas from type hints and docstrings, validated calls, read_file.

A tool is a plain Python function with type hints and a docstring::

    @chat_tool
    def word_count(text: str, unique: bool = False) -> int:
        '''Count the words in a text.

        Args:
            text: the text to count.
            unique: count distinct words only.
        '''

Supported parameter types: ``str``, ``int``, ``float``, ``bool``, ``list[...]``,
``tuple[X, ...]``, ``dict``/``dict[str, ...]``, ``Optional[X]``/``X | None``,
``Literal[...]`` (an enum) and ``Any``; a parameter with a default is optional.
The model's arguments are parsed from JSON and checked against the signature before the
function runs; bad arguments and exceptions become an error result for the model, never
a crash of the turn.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import json
import os
import re
import stat
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, Union, get_args, get_origin

from ..core.cuts import head_cut
from ..core.markers import join_cut
from ..errors import ChatError, ConfigError, ToolError, redact
from ..providers.base import ToolSpec

__all__ = [
    "READ_FILE_DENY",
    "Tool",
    "ToolError",
    "as_tool",
    "chat_tool",
    "make_read_file",
    "registered_tools",
]

READ_FILE_DEFAULT_LINES = 200
"""Lines returned by read_file when the model gives no ``limit``."""
READ_FILE_MAX_CHARS = 20_000
"""A read_file result never exceeds this, whatever ``limit`` says (the per-result budget)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable offered to the model, with its JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: Callable[..., Any]
    checked: Callable[..., Any] | None = None
    """``function`` taking a deadline check first (``checked(check, **arguments)``), for a
    tool whose work can be long (read_file's scan): it calls ``check`` now and then."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def run(self, arguments: str, check: Callable[[], None] | None = None) -> tuple[str, bool]:
        """Run with the model's JSON ``arguments``; returns ``(content, is_error)``.

        ``check`` (the turn's deadline) is handed to a tool that takes one; what it raises
        (:class:`~ipy_ctxrecovery.errors.ChatError`) ends the turn, it is no tool error."""
        try:
            raw = json.loads(arguments) if arguments and arguments.strip() else {}
        except json.JSONDecodeError as e:
            return f"Error: the arguments for {self.name} are not valid JSON ({e.msg}).", True
        except RecursionError:
            return f"Error: the arguments for {self.name} are nested too deeply to read.", True
        if not isinstance(raw, dict):
            return f"Error: the arguments for {self.name} must be a JSON object.", True
        try:
            problem = validate_arguments(self.function, raw)
        except RecursionError:
            return f"Error: the arguments for {self.name} are nested too deeply to check.", True
        if problem:
            return f"Error: {problem} (tool {self.name}).", True
        try:
            if check is not None and self.checked is not None:
                result = self.checked(check, **raw)
            else:
                result = self.function(**raw)
        except ChatError:
            raise
        except ToolError as e:
            return redact(f"Error: {_describe(e, with_type=False)}"), True
        except Exception as e:  # a tool's bug must not end the conversation
            # Error text goes to the model and the transcript: mask any key it quotes.
            return redact(f"Error: {self.name} raised {_describe(e)}"), True
        try:
            text = _to_text(result)
        except Exception as e:  # a result whose __str__ (or JSON form) raises, or too deep
            return (f"Error: the result of {self.name} (a {type(result).__name__}) could not be "
                    f"turned into text ({type(e).__name__}).", True)
        # A tool may read a file that holds a key (an .env, a config): results go to the
        # model, the transcript and the history files, where keys must never appear.
        return redact(text), False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def _describe(error: BaseException, *, with_type: bool = True) -> str:
    """``Type: message`` of an exception, even one whose ``__str__`` raises."""
    try:
        text = str(error)
    except Exception:
        text = "(its message could not be shown)"
    return f"{type(error).__name__}: {text}" if with_type else text


def _to_text(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


# -- schema derivation ----------------------------------------------------------------------

_NONE = type(None)


def _schema_for(annotation: Any, where: str) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not _NONE]
        if len(members) == 1:
            inner = _schema_for(members[0], where)
            if _NONE in args and "type" in inner and isinstance(inner["type"], str):
                return {**inner, "type": [inner["type"], "null"]}
            return inner
        return {"anyOf": [_schema_for(a, where) for a in args]}
    if origin is Literal:
        values = list(args)
        kinds = {type(v) for v in values}
        schema: dict[str, Any] = {"enum": values}
        if len(kinds) == 1:
            kind = next(iter(kinds))
            basic = _BASIC.get(kind)
            if basic:
                schema["type"] = basic
        return schema
    if annotation in _BASIC:
        return {"type": _BASIC[annotation]}
    if annotation in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        out: dict[str, Any] = {"type": "array"}
        item_args = [a for a in args if a is not Ellipsis]
        if item_args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)):
            out["items"] = _schema_for(item_args[0], where)
        return out
    if annotation is dict or origin is dict or origin is Mapping:
        out = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            out["additionalProperties"] = _schema_for(args[1], where)
        return out
    raise TypeError(
        f"{where} has type {annotation!r}, which a tool cannot take; use str, int, float, "
        "bool, list[...], dict, Optional[...] or Literal[...]."
    )


_BASIC: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


_SECTION_RE = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:?\s*$", re.IGNORECASE)
_OTHER_SECTION_RE = re.compile(
    r"^\s*(Returns?|Raises|Yields|Examples?|Notes?|See Also)\s*:?\s*$", re.IGNORECASE)
_GOOGLE_PARAM_RE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM_RE = re.compile(r"^\s*:param\s+(?:[\w\[\], |.]+\s+)?(\w+)\s*:\s*(.*)$")
_NUMPY_PARAM_RE = re.compile(r"^\s*(\w+)\s+:\s+[\w\[\], |.]+$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (text before any section) and per-parameter descriptions.

    Understands Google style (``Args:`` then ``name (type): text``), numpy style
    (``Parameters`` / ``----------`` then ``name : type``) and Sphinx ``:param name: text``.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    section: str | None = None      # None (description), "params" or "other"
    param_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        sphinx = _SPHINX_PARAM_RE.match(line)
        if sphinx:
            section, current = "other", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif _SECTION_RE.match(line):
            section, current, param_indent = "params", None, None
            if i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}:
                i += 1  # numpy underline
        elif _OTHER_SECTION_RE.match(line) or stripped.startswith((":return", ":raises")):
            section, current = "other", None
            if i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}:
                i += 1
        elif section == "params" and stripped:
            if param_indent is None:
                param_indent = indent
            google = _GOOGLE_PARAM_RE.match(line)
            numpy = _NUMPY_PARAM_RE.match(line)
            if indent <= param_indent and numpy:
                current = numpy.group(1)
                params[current] = ""
            elif indent <= param_indent and google:
                current = google.group(1).lstrip("*")
                params[current] = google.group(3).strip()
            elif current:
                params[current] = (params[current] + " " + stripped).strip()
        elif section == "other" and current and stripped and indent > 0:
            params[current] = (params[current] + " " + stripped).strip()
        elif section is None:
            description.append(line)
        i += 1
    return "\n".join(description).strip(), params


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolved forward references: fall back to the raw annotations
        return dict(getattr(fn, "__annotations__", {}))


def build_tool(fn: Callable[..., Any], *, name: str | None = None,
               description: str | None = None) -> Tool:
    """Derive a :class:`Tool` from ``fn``'s signature, type hints and docstring."""
    if not callable(fn):
        raise TypeError(f"a tool must be a function, not {type(fn).__name__}")
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    if not re.match(r"^[A-Za-z0-9_-]{1,64}$", tool_name):
        raise ValueError(
            f"tool name {tool_name!r} is not valid; use 1-64 letters, digits, '_' or '-'.")
    doc_description, doc_params = parse_docstring(inspect.getdoc(fn))
    hints = _hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name}: parameter {pname!r} is positional-only; "
                            "tools are called with keyword arguments.")
        schema = _schema_for(hints.get(pname, param.annotation),
                             f"tool {tool_name}: parameter {pname!r}")
        if pname in doc_params and doc_params[pname]:
            schema = {**schema, "description": doc_params[pname]}
        if param.default is param.empty:
            required.append(pname)
        elif param.default is None or isinstance(param.default, str | int | float | bool):
            schema = {**schema, "default": param.default}
        properties[pname] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    parameters["additionalProperties"] = False
    text = description if description is not None else doc_description
    return Tool(tool_name, text or tool_name.replace("_", " "), parameters, fn)


# -- argument validation ----------------------------------------------------------------------

def _check(value: Any, annotation: Any, where: str) -> str | None:
    """A sentence saying why ``value`` does not fit ``annotation``, or None."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return None
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        if any(_check(value, a, where) is None for a in args):
            return None
        members = [a for a in args if a is not _NONE]
        if len(members) == 1:
            return _check(value, members[0], where)
        return f"{where} has the wrong type ({_json_type(value)})"
    if annotation is _NONE:
        return None if value is None else f"{where} must be null"
    if origin is Literal:
        return None if value in args and not (isinstance(value, bool) and
                                              not any(isinstance(a, bool) for a in args)) \
            else f"{where} must be one of {list(args)!r}, not {value!r}"
    if annotation is bool:
        return None if isinstance(value, bool) else f"{where} must be a boolean"
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{where} must be an integer, not {_json_type(value)}"
    if annotation is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"{where} must be a number, not {_json_type(value)}"
    if annotation is str:
        return None if isinstance(value, str) else f"{where} must be a string, not {_json_type(value)}"
    if annotation in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        if not isinstance(value, list):
            return f"{where} must be an array, not {_json_type(value)}"
        item_args = [a for a in args if a is not Ellipsis]
        if item_args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)):
            for k, item in enumerate(value):
                problem = _check(item, item_args[0], f"{where}[{k}]")
                if problem:
                    return problem
        return None
    if annotation is dict or origin in (dict, Mapping):
        if not isinstance(value, dict):
            return f"{where} must be an object, not {_json_type(value)}"
        if len(args) == 2:
            for key, item in value.items():
                problem = _check(item, args[1], f"{where}[{key!r}]")
                if problem:
                    return problem
        return None
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def validate_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` cannot be passed to ``fn``, or None when they can."""
    signature = inspect.signature(fn)
    hints = _hints(fn)
    params = signature.parameters
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key in arguments:
        named = key in params and params[key].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                           inspect.Parameter.VAR_KEYWORD)
        if not named and not accepts_kwargs:
            return f"unknown argument {key!r}; expected {sorted(_named(params))}"
    missing = [n for n, p in params.items()
               if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               and n not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    for key, value in arguments.items():
        if key in params:
            problem = _check(value, hints.get(key, params[key].annotation), f"argument {key!r}")
            if problem:
                return problem
    return None


def _named(params: Mapping[str, inspect.Parameter]) -> list[str]:
    return [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


# -- the decorator and the registry --------------------------------------------------------------

_REGISTRY: dict[str, Tool] = {}


def chat_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
              description: str | None = None) -> Any:
    """Mark a function as a chat tool (``@chat_tool`` or ``@chat_tool(name=...)``).

    The function is returned unchanged apart from a ``chat_tool`` attribute holding its
    :class:`Tool`, and is registered by name so ``%chat tools`` / ``--tools`` can find it.
    """

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        tool = build_tool(f, name=name, description=description)
        f.chat_tool = tool  # type: ignore[attr-defined]
        _REGISTRY[tool.name] = tool
        return f

    return decorate(fn) if fn is not None else decorate


def registered_tools() -> dict[str, Tool]:
    """Tools registered with ``@chat_tool``, by name (a copy)."""
    return dict(_REGISTRY)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """A :class:`Tool` for a Tool, a ``@chat_tool`` function, or any plain function."""
    if isinstance(obj, Tool):
        return obj
    attached = getattr(obj, "chat_tool", None)
    if isinstance(attached, Tool):
        return attached
    return build_tool(obj)


# -- the built-in read_file ------------------------------------------------------------------

#: Names read_file never reads, as fnmatch patterns matched (lower-cased) against every
#: part of the path under its root: a denied directory denies what is inside it. The
#: working directory is often $HOME, so keys and credentials sit right there.
READ_FILE_DENY: tuple[str, ...] = (
    ".*",                                   # dotfiles and dot-directories: .ssh .aws .env .git
    ".netrc", "_netrc", ".git-credentials", ".pgpass", ".pypirc", ".npmrc", ".env",
    "*.env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk",
    "*.kdbx", "*.gpg", "*.pgp", "*.keytab", "*.ovpn", "*.tfstate", "*.tfstate.*", "*.tfvars",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "credentials", "credentials.*",
    "*credentials*.json", "secrets.*", "*.secret", "*.secrets", "htpasswd", "*.htpasswd",
    "service-account*.json", "known_hosts", "authorized_keys",
)
#: Bytes read at a time while skipping to ``offset`` or counting lines: memory stays flat
#: whatever the file's size.
_READ_CHUNK = 256 * 1024
#: After the range, read_file counts the file's lines only this far: a total past it is
#: reported as "at least" (a 5 GB file was counted whole on every call, 30-52 s each).
READ_FILE_COUNT_BYTES = 4 * 1024 * 1024


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _denied(parts: Iterable[str], deny: tuple[str, ...]) -> tuple[str, str] | None:
    """The first (part, pattern) of ``parts`` the deny list matches, or None."""
    for part in parts:
        for pattern in deny:
            if fnmatch.fnmatchcase(part.lower(), pattern):
                return part, pattern
    return None


def _count_on(f: BinaryIO, budget: int, check: Callable[[], None]) -> tuple[int, bool]:
    """Lines from where ``f`` stands, reading at most ``budget`` bytes: (count, whether
    the end of the file was reached). A last line without a newline counts."""
    count, last, read = 0, b"\n", 0
    while read < budget:
        check()
        chunk = f.read(min(_READ_CHUNK, budget - read))
        if not chunk:
            return count + (last != b"\n"), True
        read += len(chunk)
        count += chunk.count(b"\n")
        last = chunk[-1:]
    # The budget ran out: the end is further on (or exactly here, which one byte tells).
    if not f.read(1):
        return count + (last != b"\n"), True
    return count, False


def _read_range(f: BinaryIO, offset: int, limit: int, max_bytes: int,
                check: Callable[[], None]) -> tuple[bytes, int, bool, int]:
    """Lines ``offset``.. of ``f``, at most ``limit`` of them and ``max_bytes`` in all.

    Returns the bytes, the number of whole or partial lines they hold, whether the byte
    bound cut them, and how many lines were skipped (fewer than ``offset``: the file
    ended first). Nothing beyond ``max_bytes`` (plus one chunk while skipping) is ever
    held in memory, even for a file that is one huge line; nothing after the range is
    read. ``check`` is called every chunk skipped (the turn's deadline).
    """
    line, partial = 0, False
    while line < offset:
        check()
        piece = f.readline(_READ_CHUNK)
        if not piece:
            return b"", 0, False, line + partial      # a last line without a newline
        partial = not piece.endswith(b"\n")
        if not partial:
            line += 1
    out: list[bytes] = []
    size = lines = 0
    while lines < limit and size < max_bytes:
        piece = f.readline(max_bytes - size)
        if not piece:
            break
        out.append(piece)
        size += len(piece)
        if piece.endswith(b"\n"):
            lines += 1
        elif size < max_bytes:   # the last line, without a newline
            lines += 1
            break
    cut = size >= max_bytes and not (out[-1].endswith(b"\n") and lines == limit)
    return b"".join(out), lines, cut, offset


def make_read_file(root: str | os.PathLike[str], results_dir: str | os.PathLike[str], *,
                   max_chars: int = READ_FILE_MAX_CHARS,
                   deny: tuple[str, ...] = READ_FILE_DENY,
                   count_bytes: int = READ_FILE_COUNT_BYTES) -> Tool:
    """The built-in ``read_file`` tool, confined to ``root`` and the session's results.

    Paths are resolved (``..`` and symlinks followed) before the check, so nothing
    outside the two directories can be read; a path with a part matching ``deny``
    (:data:`READ_FILE_DENY`: dotfiles, keys, credential files), given or resolved, is
    refused; only regular files are opened (never a FIFO or a device, which could block
    the turn), and only the lines asked for are read: the file's total is counted only
    ``count_bytes`` past them (further, it is "at least"), and the turn's deadline check
    (``Tool.run``'s ``check``) is called every chunk, so no file holds the turn.
    """
    if not os.path.isdir(root):
        raise ConfigError(f"read_file's root {os.fspath(root)!r} is not a directory; set "
                          "read_file_root to an existing directory.")
    roots = [os.path.realpath(root), os.path.realpath(results_dir)]

    def read_file(path: str, offset: int = 0, limit: int = READ_FILE_DEFAULT_LINES) -> str:
        """Read lines of a text file: a persisted tool result (the path shown in a
        tool-result preview) or a file under the working directory.

        Args:
            path: the file to read, absolute or relative to the working directory.
            offset: the first line to return, counting from 0.
            limit: how many lines to return at most.
        """
        return checked(_go_on, path, offset, limit)

    def checked(check: Callable[[], None], path: str, offset: int = 0,
                limit: int = READ_FILE_DEFAULT_LINES) -> str:
        if offset < 0 or limit < 1:
            raise ToolError("offset must be 0 or more and limit at least 1.")
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = Path(roots[0]) / candidate
        real = os.path.realpath(candidate)
        base = next((r for r in roots if _inside(real, r)), None)
        if base is None:
            raise ToolError(
                f"{path} is outside the readable area; read_file can only read files under "
                f"{roots[0]} and the session's persisted tool results.")
        # Both the path as given and where it leads: a link named notes.txt to .ssh/id_rsa
        # is refused, and so is a link named .env to anything.
        given = os.path.normpath(candidate)
        parts = [*Path(os.path.relpath(real, base)).parts,
                 *(Path(os.path.relpath(given, base)).parts if _inside(given, base)
                   else (Path(given).name,))]
        hit = _denied([p for p in parts if p not in (".", "..")], deny)
        if hit is not None:
            raise ToolError(f"{path} is not readable: {hit[0]!r} matches {hit[1]!r} in "
                            "read_file's deny list (dotfiles, keys and credential files).")
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise ToolError(f"{path} does not exist.") from None
        except OSError as e:
            raise ToolError(f"{path} could not be read ({e.strerror}).") from None
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{path} is a directory, not a file.")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path} is not a regular file (a pipe, socket or device); "
                            "read_file reads regular files only.")
        try:
            # O_NONBLOCK: if the path was swapped for a FIFO since the check, opening it
            # returns at once instead of waiting for a writer; fstat then refuses it.
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise ToolError(f"{path} could not be read ({e.strerror}).") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ToolError(f"{path} is not a regular file; read_file reads regular "
                                "files only.")
            # 4 bytes per char at most in UTF-8: enough bytes for max_chars characters.
            data, shown, cut, skipped = _read_range(f, offset, limit, max_chars * 4 + 4,
                                                    check)
            if not data:
                total, whole = skipped, True
            else:
                more, whole = _count_on(f, count_bytes, check)
                total = offset + shown + more
        if b"\0" in data:
            raise ToolError(f"{path} looks like a binary file (it contains NUL bytes); "
                            "read_file reads text.")
        body = data.decode("utf-8", errors="replace")
        end = offset + shown
        if len(body) > max_chars or cut:
            # Whole lines only: the line cut short would be read again from ``end``, and a
            # line ended mid-word can read as an attack to a firewall (``core/cuts.py``); the
            # marker is bracket-free for the same reason (``core/markers.py``).
            body = body[:max_chars]
            end = offset + body.count("\n")
            if end == offset:  # one line longer than the bound: move on past it
                end += 1
                at = head_cut(body, len(body) - 1)     # inside the line, at a word end
                body = join_cut(body[:at.at], f"… line {offset} is longer than {max_chars} "
                                f"chars and was cut; continue with offset={end} …", "",
                                head_line=at.line, tail_line=True)
            else:
                body = (body[:body.rindex("\n")] +
                        f"\n… cut at {max_chars} chars; continue with offset={end} …")
        if not data:
            return f"[{path}: no lines at offset {offset}; the file has {total} lines]"
        of = f"{total}" if whole else f"at least {total}"
        header = f"[{path}: lines {offset}-{max(end - 1, offset)} of {of}]\n"
        return header + body

    return dataclasses.replace(build_tool(read_file), checked=checked)


def _go_on() -> None:
    return None
