"""core/theme.py: every colour is a variable the installed JupyterLab themes define, falls
back to the light theme's value, and text colours read at 4.5:1 on the notebook's
background in the light, dark and high-contrast themes (and, with no theme, on white).

The page colours come from JupyterLab's own theme CSS (``jupyterlab/themes``), so a theme
that changes a colour fails here before a person sees it; the browser test measures the
rendered page."""

from __future__ import annotations

from typing import Any

import pytest
from contrast import (
    WCAG_AA,
    contrast_ratio,
    installed_themes,
    jp_vars,
    over,
    parse_colour,
    relative_luminance,
    theme_problems,
    themed,
)

from ipy_ctxrecovery.core import theme

TEXT = {"TEXT_STRONG": theme.TEXT_STRONG, "TEXT_DIM": theme.TEXT_DIM,
        "TEXT_ERROR": theme.TEXT_ERROR, "TEXT_OK": theme.TEXT_OK,
        "TEXT_RUNNING": theme.TEXT_RUNNING}


@pytest.fixture(scope="module")
def themes() -> dict[str, dict[str, str]]:
    return installed_themes()


def _painted(value: str, variables: dict[str, str], page: str) -> Any:
    """``value`` in one theme, composed over ``page`` (text colours can be translucent)."""
    return over(parse_colour(themed(value, variables)), parse_colour(page))


def test_every_colour_is_a_theme_variable_with_the_light_value_as_fallback(
        themes: dict[str, dict[str, str]]) -> None:
    values = [getattr(theme, name) for name in theme.__all__ if name != "var"]
    assert all(v.startswith("var(--jp-") for v in values)
    assert theme_problems(" ".join(values), themes) == []


def test_the_check_catches_a_literal_a_wrong_fallback_and_an_unknown_variable(
        themes: dict[str, dict[str, str]]) -> None:
    problems = theme_problems("color:#c62828;" + theme.var("error-color0", "#c62828")
                              + theme.var("no-such-color", "#000"), themes)
    assert problems == ["hard-coded colour #c62828",
                        "--jp-error-color0 falls back to #c62828, not the light theme's #b71c1c",
                        "--jp-no-such-color is not defined in the light, dark, high contrast "
                        "theme"]


@pytest.mark.parametrize("theme_name", ["light", "dark", "high contrast"])
@pytest.mark.parametrize("token", sorted(TEXT))
def test_text_reads_on_the_notebook_page(themes: dict[str, dict[str, str]], theme_name: str,
                                         token: str) -> None:
    variables = themes[theme_name]
    page = parse_colour(variables["layout-color0"])   # what .jp-Notebook paints
    fg = _painted(TEXT[token], variables, variables["layout-color0"])
    assert contrast_ratio(fg, page) >= WCAG_AA, (token, theme_name)


@pytest.mark.parametrize("theme_name", ["light", "dark", "high contrast"])
def test_a_lit_chip_reads_on_its_surface(themes: dict[str, dict[str, str]],
                                         theme_name: str) -> None:
    variables = themes[theme_name]
    surface = _painted(theme.SURFACE, variables, variables["layout-color0"])
    fg = over(parse_colour(themed(theme.TEXT_STRONG, variables)), surface)
    assert contrast_ratio(fg, surface) >= WCAG_AA
    # The chip stands off the page (it was the same light orange in every theme).
    assert surface != parse_colour(variables["layout-color0"])


@pytest.mark.parametrize("token", sorted(TEXT))
def test_with_no_theme_the_fallbacks_read_on_white(token: str) -> None:
    [(_name, fallback)] = jp_vars(TEXT[token])
    fg = over(parse_colour(fallback), parse_colour("#fff"))
    assert contrast_ratio(fg, "#fff") >= WCAG_AA


def test_an_empty_track_is_dark_on_a_dark_page(themes: dict[str, dict[str, str]]) -> None:
    """The glare of issue 25: a light grey track on the dark theme's page."""
    mid = relative_luminance("#808080")
    assert relative_luminance(themed(theme.TRACK, themes["dark"])) < mid
    assert relative_luminance(themed(theme.TRACK, themes["light"])) > mid
