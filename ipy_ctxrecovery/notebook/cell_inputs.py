"""What a ``%%chat`` line and body may hold, checked before anything is sent.

A model word that is surely a mistake (part of the message, an unknown ``provider:``
prefix), ``-o`` options against the parameters of the provider's SDK call, ``{name}``
interpolation from the kernel's namespace with ``In``/``Out``/``Err``, and the traceback
text of a failed cell. Each refusal is one ``UsageError`` sentence naming the way out.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import string
import traceback
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError

from ..core.catalogue import lookup
from ..core.wording import first_line

__all__ = ["cell_error_text", "check_model_word", "check_options", "interpolate",
           "parse_options", "sdk_parameters", "whole_number"]


def whole_number(text: str) -> int:
    """An argparse ``type`` for a count flag (``--max-tokens N``): a word that is not a
    whole number is said so, as every flag of the magics says it."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


class _CellValues(string.Formatter):
    """``{name}`` in a ``%%chat -i`` body: the kernel's variables, ``In[n]``/``Out[n]``,
    and ``Err[n]`` (the traceback of cell ``n``)."""

    def __init__(self, namespace: Mapping[str, Any], errors_by_cell: Mapping[int, str]) -> None:
        super().__init__()
        self.namespace = namespace
        self.errors = errors_by_cell

    def get_value(self, key: Any, args: Any, kwargs: Any) -> Any:
        if key == "Err":
            return self.errors
        if isinstance(key, int):
            raise UsageError(f"%%chat -i: {{{key}}} is a position, not a name; write "
                             "{{ and }} for literal braces.")
        if isinstance(key, str) and not key.isidentifier():
            raise UsageError(f"%%chat -i: {{{key}}} is not a name: braces take a variable, "
                             "with attributes or indexes ({df.shape}, {In[3]}), not an "
                             "expression; write {{ and }} for literal braces.")
        if key not in self.namespace:
            raise UsageError(f"%%chat -i: {{{key}}} is not defined in this kernel; define it, "
                             "or write {{ and }} for literal braces.")
        return self.namespace[key]


def interpolate(text: str, namespace: Mapping[str, Any],
                errors_by_cell: Mapping[int, str] | None = None) -> str:
    """``text`` with ``{expr}`` fields filled from ``namespace`` (``str.format`` rules:
    ``{df.shape}``, ``{In[3]}``, ``{x:.2f}``; ``{{`` and ``}}`` are literal braces)."""
    try:
        return _CellValues(namespace, errors_by_cell or {}).format(text)
    except UsageError:
        raise
    except (KeyError, IndexError) as e:
        raise UsageError(f"%%chat -i: {first_line(str(e), 80)} is not there (In, Out and Err "
                         "are indexed by execution count); write {{ and }} for literal "
                         "braces.") from None
    except (ValueError, AttributeError, TypeError) as e:
        raise UsageError(f"%%chat -i: {_brace_problem(e)}; write {{{{ and }}}} for literal "
                         "braces.") from None


def _brace_problem(error: Exception) -> str:
    """What is wrong with a ``{…}`` field, in the package's words (not ``str.format``'s)."""
    said = str(error)
    if isinstance(error, ValueError):
        if "before end of string" in said or "unmatched '{'" in said or "Single '{'" in said:
            return "a { is not closed by a }"
        if "Single '}'" in said:
            return "a } has no { before it"
        conversion = re.search(r"Unknown conversion specifier (\S+)", said)
        if conversion:
            return f"!{conversion.group(1)} is not a conversion (use !r, !s or !a)"
        if "format" in said.lower():
            return f"a format after : does not suit its value ({first_line(said, 80)})"
    if isinstance(error, AttributeError):
        return f"an attribute is not there ({first_line(said, 80)})"
    return f"a field cannot be filled in ({type(error).__name__}: {first_line(said, 80)})"


def cell_error_text(error: BaseException, limit: int = 60) -> str:
    """A failed cell's traceback as plain text (the cell's own frames, not IPython's)."""
    summary = traceback.TracebackException.from_exception(error)
    summary.stack = traceback.StackSummary.from_list(
        [f for f in summary.stack if "IPython/core/" not in f.filename.replace("\\", "/")])
    lines = "".join(summary.format()).splitlines()
    return "\n".join(lines[-limit:])


_KNOWN_PREFIXES = ("openai", "anthropic", "emulator", "azure", "bedrock", "vertex", "ollama",
                   "vllm", "lmstudio")


def check_model_word(model: str, *, positional: bool, env: Mapping[str, str] | None = None
                     ) -> None:
    """Refuse, in one sentence, a model that is surely a mistake: a word meant as part of the
    message, an unknown ``provider:`` prefix, or a name no catalogue or server knows.

    With ``OPENAI_BASE_URL`` set any name may be a model of that server, so only braces and
    unknown prefixes are refused then.
    """
    source = os.environ if env is None else env
    text = model.strip()
    taken = "was taken as the model (the word after the flags on the %%chat line)" \
        if positional else "is not a model"
    if "{" in text or "}" in text:
        raise UsageError(f"%%chat: {text!r} {taken}; the message goes in the cell body, below "
                         "the %%chat line — add -i there to fill in {name} from your variables.")
    prefix, sep, rest = text.partition(":")
    if prefix.lower() in _KNOWN_PREFIXES:
        return                      # make_provider checks the rest, with its own hints
    custom_server = bool(source.get("OPENAI_BASE_URL", "").strip())
    if sep and not custom_server:
        raise UsageError(f"%%chat: unknown provider {prefix!r} in {text!r}; use openai:MODEL, "
                         "anthropic:MODEL, emulator or emulator:anthropic (%chat models lists "
                         "them; for another OpenAI-compatible server set OPENAI_BASE_URL).")
    if not sep and not custom_server and lookup(text).guessed:
        raise UsageError(f"%%chat: {text!r} {taken}, and no model by that name is known; write "
                         "the message in the cell body, or name the model as "
                         f"openai:{text} or anthropic:{text} (%chat models lists the known ones).")


def sdk_parameters(provider: Any) -> tuple[str, Mapping[str, inspect.Parameter]] | None:
    """(name, parameters) of the SDK call behind ``provider``, or None when it has none
    that can be inspected (a fake, a third-party provider)."""
    client = getattr(provider, "client", None)
    chat = getattr(getattr(client, "chat", None), "completions", None)
    if chat is not None and hasattr(chat, "create"):
        name, create = "OpenAI chat.completions.create", chat.create
    elif client is not None and hasattr(getattr(client, "messages", None), "create"):
        name, create = "Anthropic messages.create", client.messages.create
    else:
        return None
    try:
        return name, inspect.signature(create).parameters
    except (TypeError, ValueError):
        return None


#: ``create`` parameters the adapters fill themselves (the request, not an option).
_OWN_PARAMETERS = frozenset({"messages", "model", "stream", "tools", "system", "extra_headers",
                             "extra_query", "extra_body", "timeout", "stream_options"})


def check_options(options: Mapping[str, Any], provider: Any) -> dict[str, Any]:
    """``-o`` options checked against the parameters of the provider's SDK call: an unknown
    name or a value of the wrong kind is one sentence; ``extra.KEY`` passes KEY as is."""
    checked: dict[str, Any] = {}
    found = sdk_parameters(provider)
    for key, value in options.items():
        if key.startswith("extra.") and key != "extra.":
            checked[key[len("extra."):]] = value
            continue
        if found is None:
            checked[key] = value
            continue
        call, parameters = found
        parameter = parameters.get(key)
        if parameter is None or key in _OWN_PARAMETERS:
            known = ", ".join(sorted(k for k in parameters if k not in _OWN_PARAMETERS))
            why = "is set by %%chat itself" if parameter is not None else \
                f"is not a parameter of {call}"
            raise UsageError(f"%%chat: -o {key} {why} (it takes: {known}); to send a field "
                             f"as is, write -o extra.{key} VALUE.")
        expected = _expected_kind(parameter.annotation)
        if expected is not None and not _fits(value, expected):
            raise UsageError(f"%%chat: -o {key} {json.dumps(value)} is not valid: {call} "
                             f"takes {_kind_words(expected)} for {key}.")
        checked[key] = value
    return checked


def _expected_kind(annotation: Any) -> tuple[str, ...] | None:
    """The scalar kinds a parameter annotation allows (``number``, ``integer``, ``boolean``,
    ``string``, ``'literal'``s), or None when it takes structured values (not checked)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = re.sub(r"\s+", "", text)
    parts: list[str] = []
    for part in _split_union(text):
        if part.startswith("Optional[") and part.endswith("]"):
            parts.extend(_split_union(part[len("Optional["):-1]))
        elif part.startswith("Union[") and part.endswith("]"):
            parts.extend(_split_comma(part[len("Union["):-1]))
        else:
            parts.append(part)
    kinds: list[str] = []
    for part in parts:
        if part in ("Omit", "NotGiven", "None"):
            continue
        if part == "float":
            kinds.append("number")
        elif part == "int":
            kinds.append("integer")
        elif part == "bool":
            kinds.append("boolean")
        elif part == "str":
            kinds.append("string")
        elif part.startswith("Literal[") and part.endswith("]"):
            kinds.extend(f"'{v.strip(chr(39) + chr(34))}'"
                         for v in _split_comma(part[len("Literal["):-1]))
        else:
            return None
    return tuple(kinds) or None


def _split_union(text: str) -> list[str]:
    return _split_top(text, "|")


def _split_comma(text: str) -> list[str]:
    return _split_top(text, ",")


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in (*parts, current) if p]


def _fits(value: Any, kinds: tuple[str, ...]) -> bool:
    for kind in kinds:
        if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return True
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "boolean" and isinstance(value, bool):
            return True
        if kind == "string" and isinstance(value, str):
            return True
        if kind.startswith("'") and value == kind.strip("'"):
            return True
    return value is None


def _kind_words(kinds: tuple[str, ...]) -> str:
    words = {"number": "a number (e.g. 0.2)", "integer": "a whole number",
             "boolean": "true or false", "string": "a text"}
    literals = [k for k in kinds if k.startswith("'")]
    shown = [words[k] for k in kinds if k in words]
    if literals:
        shown.append("one of " + ", ".join(literals))
    return " or ".join(shown)


def parse_options(pairs: list[list[str]]) -> dict[str, Any]:
    """``-o KEY VALUE`` pairs; a VALUE that parses as JSON (0.2, true, [1]) is used as such."""
    options: dict[str, Any] = {}
    for key, raw in pairs:
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options
