"""core/theme.py: every colour is a variable the installed JupyterLab themes define, and
text colours read at 4.5:1 on the notebook's background in the light, dark and
high-contrast themes, and, through their fallbacks, in a front end with no JupyterLab
variables (black on white; VS Code's dark and light defaults).

The page colours come from JupyterLab's own theme CSS (``jupyterlab/themes``), so a theme
that changes a colour fails here before a person sees it; ``paint`` computes
``var()``/``color-mix()`` as CSS does. The browser test measures the rendered page; the
last test here renders the fallbacks in Chromium."""

from __future__ import annotations

import pytest
from contrast import (
    RGBA,
    WCAG_AA,
    contrast_ratio,
    installed_themes,
    low_contrast,
    over,
    page_samples,
    paint,
    parse_colour,
    relative_luminance,
    theme_problems,
)

from ipy_ctxrecovery.core import theme

TEXT = {"TEXT_STRONG": theme.TEXT_STRONG, "TEXT_DIM": theme.TEXT_DIM,
        "TEXT_ERROR": theme.TEXT_ERROR, "TEXT_OK": theme.TEXT_OK,
        "TEXT_RUNNING": theme.TEXT_RUNNING}

PLAIN_PAGES = {"black on white": ("#000", "#fff"),
               "VS Code dark": ("#cccccc", "#1e1e1e"),
               "VS Code light": ("#3b3b3b", "#ffffff")}
"""Front ends with no ``--jp-*`` variables: (text colour, background)."""


@pytest.fixture(scope="module")
def pages() -> dict[str, tuple[dict[str, str], RGBA, RGBA]]:
    """Every page a colour must read on: (its variables, text colour, background)."""
    out = {}
    for name, variables in installed_themes().items():
        bg = parse_colour(variables["layout-color0"])   # what .jp-Notebook paints
        out[name] = (variables, over(parse_colour(variables["ui-font-color1"]), bg), bg)
    for name, (fg, bg) in PLAIN_PAGES.items():
        out[name] = ({}, parse_colour(fg), parse_colour(bg))
    return out


PAGE_NAMES = ["light", "dark", "high contrast", *PLAIN_PAGES]


def test_every_colour_is_a_variable_the_themes_define() -> None:
    values = [getattr(theme, name) for name in theme.__all__
              if name not in ("var", "mix", "tint")]
    assert all(v.startswith("var(--jp-") for v in values)
    assert theme_problems(" ".join(values), installed_themes()) == []


def test_the_check_catches_a_literal_and_an_unknown_variable() -> None:
    problems = theme_problems("color:#c62828;" + theme.var("error-color0", "#c62828")
                              + theme.var("no-such-color", "#000"), installed_themes())
    assert problems == ["hard-coded colour #c62828",
                        "--jp-no-such-color is not defined in the light, dark, high contrast "
                        "theme"]


@pytest.mark.parametrize("page", PAGE_NAMES)
@pytest.mark.parametrize("token", sorted(TEXT))
def test_text_reads_on_the_page(pages: dict[str, tuple[dict[str, str], RGBA, RGBA]],
                                page: str, token: str) -> None:
    variables, text, bg = pages[page]
    fg = over(paint(TEXT[token], variables, text), bg)
    assert contrast_ratio(fg, bg) >= WCAG_AA, (token, page, fg)


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_a_lit_chip_reads_on_its_surface_and_stands_off_the_page(
        pages: dict[str, tuple[dict[str, str], RGBA, RGBA]], page: str) -> None:
    variables, text, bg = pages[page]
    surface = over(paint(theme.SURFACE, variables, text), bg)
    fg = over(paint(theme.TEXT_STRONG, variables, text), surface)
    assert contrast_ratio(fg, surface) >= WCAG_AA
    assert contrast_ratio(surface, bg) > 1.1      # it was one light orange in every theme


@pytest.mark.parametrize("page", ["dark", "high contrast", "VS Code dark"])
def test_an_empty_track_does_not_glare_on_a_dark_page(
        pages: dict[str, tuple[dict[str, str], RGBA, RGBA]], page: str) -> None:
    """Issue 25: a light grey (#e0e0e0) track on the dark theme's page."""
    variables, text, bg = pages[page]
    track = over(paint(theme.TRACK, variables, text), bg)
    if page == "high contrast":    # its own choice: --jp-border-color2 is light there
        assert track == parse_colour(variables["border-color2"])
    else:
        assert relative_luminance(track) < relative_luminance("#808080")
    assert contrast_ratio(track, bg) > 1.2        # still seen as a track


def test_paint_computes_color_mix_as_css_does() -> None:
    assert paint("color-mix(in srgb, #ff0000 50%, currentColor)", {}, "#0000ff") == (
        127.5, 0, 127.5, 1)
    assert paint(theme.tint(50), {}, "#ffffff") == (255, 255, 255, 0.5)
    assert paint("var(--jp-x, currentColor)", {"x": "#010203"}, "#fff") == (1, 2, 3, 1)
    assert paint("var(--jp-x, currentColor)", {}, "#fff") == (255, 255, 255, 1)


PAGE = """<!doctype html><html><body style="margin:0;background:{bg};color:{fg};
font-family:sans-serif">{panel}</body></html>"""


@pytest.mark.browser
@pytest.mark.parametrize("page", list(PLAIN_PAGES))
def test_the_panel_snapshot_reads_in_chromium_without_jupyterlab(page: str) -> None:
    """The fallbacks as a browser computes them: the panel's snapshot mid-recovery on a
    page with no JupyterLab CSS, in a light and a dark editor theme."""
    from ipy_ctxrecovery.notebook.panel import _PANEL_CSS

    levels = "".join(f"<span class='ctxr-level {state}'>{name}</span>" for name, state in (
        ("shorter answer", ""), ("summarize to fit", "lit current")))
    steps = "".join(f"<div class='ctxr-step {status}'><span>•</span><span>{status}</span>"
                    f"<span>detail of {status}</span></div>"
                    for status in ("done", "skipped", "pending", "running", "failed"))
    panel = (f"{_PANEL_CSS}<div class='ctxr-panel'><div class='ctxr-steps'>{steps}</div>"
             f"<div class='ctxr-levels'>{levels}</div></div>")
    fg, bg = PLAIN_PAGES[page]
    samples = page_samples(PAGE.format(bg=bg, fg=fg, panel=panel), ".ctxr-panel",
                           "theme fallbacks")
    assert len(samples) == 2 + 5 * 3
    assert low_contrast(samples) == []
    colours = {s["text"]: parse_colour(s["color"]) for s in samples}
    assert colours["failed"] != colours["done"] != colours["running"]   # still told apart
