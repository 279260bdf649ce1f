"""notebook/cell_inputs.interpolate: a ``%%chat -i`` body's ``{…}`` fields, and one sentence
in the package's words for each way a field can be wrong (never ``str.format``'s)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from ipy_ctxrecovery.notebook.cell_inputs import interpolate

NAMESPACE = {"x": 1, "name": "Ada"}


def test_fields_are_filled_and_double_braces_kept() -> None:
    assert interpolate("hi {name}, {x:03d} {{kept}}", NAMESPACE) == "hi Ada, 001 {kept}"


@pytest.mark.parametrize("text, said", [
    ("value {x", "a { is not closed by a }"),
    ("value x}", "a } has no { before it"),
    ("value {1/0}", "{1/0} is not a name"),
    ("value {x!q}", "!q is not a conversion (use !r, !s or !a)"),
    ("value {x:zz}", "a format after : does not suit its value"),
    ("value {x.nope}", "an attribute is not there"),
    ("value {missing}", "{missing} is not defined in this kernel"),
])
def test_a_bad_field_is_one_sentence_naming_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        interpolate(text, NAMESPACE)
    message = str(caught.value)
    assert message.startswith("%%chat -i: ") and said in message
    assert message.endswith("write {{ and }} for literal braces.") and "\n" not in message
    for python_words in ("before end of string", "Single '", "Unknown conversion specifier"):
        assert python_words not in message
