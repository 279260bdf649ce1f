"""The colours of the panel, the turn cards and the explorer, from JupyterLab's theme.

Every colour our HTML paints with is a CSS variable of the JupyterLab theme
(``--jp-ui-font-color2``, ``--jp-error-color1``, ...), so the light, dark and high-contrast
themes each supply their own. Where no theme defines them (VS Code, a plain HTML page) the
fallbacks follow the page too: text colours are a hue blended with the surrounding text
colour (``color-mix(..., currentColor)``), surfaces and tracks a tint of it, so a dark
editor gets light text and dark tracks. (An nbconvert export defines the variables.) The choices keep text
at a contrast of at least 4.5:1 on the notebook's background in all three themes (the
browser test measures them); where a theme's colour falls short (``--jp-error-color0`` on
the dark theme's ``#111``), a shade that passes in all of them is used instead.

The fate colours of the what-if strip (:data:`.what_if.FATE_COLOURS`) are data colours, not
theme colours: one fixed palette of mid-luminance shades, at least 3:1 against both a white
and a near-black page, so the same fate reads as the same colour in every theme.

The live panel's stylesheet (``notebook/panel.py``) writes the same ``var()`` values out;
the snapshot and card HTML use these inline (a saved notebook keeps no stylesheet of ours).
Pure constants; no I/O.
"""

from __future__ import annotations

__all__ = [
    "BORDER", "BORDER_ERROR", "BORDER_OK", "BORDER_WARN", "FILL_ERROR", "FILL_OK", "FILL_WARN",
    "SURFACE", "TEXT_DIM", "TEXT_ERROR", "TEXT_OK", "TEXT_RUNNING", "TEXT_STRONG", "TRACK",
    "TRACK_STRIPE", "mix", "tint", "var",
]


def var(name: str, fallback: str) -> str:
    """``var(--jp-NAME, FALLBACK)``: a JupyterLab theme colour, with a fallback for pages
    that define none."""
    return f"var(--jp-{name}, {fallback})"


def mix(colour: str, percent: int) -> str:
    """``colour`` blended with the text colour around it (CSS ``color-mix``): darker on a
    light page, lighter on a dark one, so a hue stays readable in a front end with no
    JupyterLab variables (VS Code, a plain HTML page) whatever its theme."""
    return f"color-mix(in srgb, {colour} {percent}%, currentColor)"


def tint(percent: int) -> str:
    """The surrounding text colour at ``percent`` opacity: a dim text or a faint surface
    that follows any theme."""
    return f"color-mix(in srgb, currentColor {percent}%, transparent)"


# -- text: 4.5:1 on the page in the light, dark and high-contrast themes, and with no theme
# variables on black-on-white and on VS Code's #ccc on #1e1e1e (tests/test_theme.py) ---------
TEXT_STRONG = var("ui-font-color0", "currentColor")
"""The most prominent text: a lit recovery chip."""
TEXT_DIM = var("ui-font-color2", tint(75))
"""Secondary text (a pending step, an unlit chip): 4.6:1 in light, 6.0:1 in dark."""
TEXT_ERROR = var("error-color1", mix("#e53935", 75))
"""A failure, a refused value: 5.0:1 in light, 5.1:1 in dark, 4.7:1 in VS Code dark.
(``--jp-error-color0`` would be 3.8:1 on the dark theme's ``#111``.)"""
TEXT_OK = var("success-color0", mix("#43a047", 60))
"""A value taken: 7.9:1 in light, 4.6:1 in dark (``--jp-success-color1``: 4.1:1 in light)."""
TEXT_RUNNING = var("brand-color1", mix("#1e88e5", 70))
"""The step that runs now: 4.6:1 in light, 6.0:1 in dark."""

# -- surfaces, borders and bars (not text) -----------------------------------------------------
SURFACE = var("layout-color2", tint(12))
"""Behind a lit chip: a step off the page in every theme (its text: 18:1 light, 10:1 dark)."""
BORDER = var("border-color1", tint(30))
BORDER_OK = var("success-color1", "#43a047")
BORDER_ERROR = var("error-color1", "#e53935")
BORDER_WARN = var("warn-color1", "#fb8c00")
TRACK = var("border-color2", tint(15))
"""An empty bar's track: light grey on white, dark grey on a dark page (no glare)."""
TRACK_STRIPE = var("layout-color3", tint(30))
"""The second stripe of a bar with no limit (the first is :data:`SURFACE`)."""
FILL_OK = var("success-color1", "#43a047")
FILL_WARN = var("warn-color1", "#fb8c00")
FILL_ERROR = var("error-color1", "#e53935")
