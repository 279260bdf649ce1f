"""The colours of the panel, the turn cards and the explorer, from JupyterLab's theme.

Every colour our HTML paints with is a CSS variable of the JupyterLab theme
(``--jp-ui-font-color2``, ``--jp-error-color1``, ...), so the light, dark and high-contrast
themes each supply their own, with a fallback (the light theme's value) where no theme
defines them: a saved notebook opened elsewhere, a plain HTML export. The choices keep text
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
    "TRACK_STRIPE", "var",
]


def var(name: str, fallback: str) -> str:
    """``var(--jp-NAME, FALLBACK)``: a JupyterLab theme colour with the light theme's value
    for pages that define none."""
    return f"var(--jp-{name}, {fallback})"


# -- text (4.5:1 on the page in the light, dark and high-contrast themes) ---------------------
TEXT_STRONG = var("ui-font-color0", "#000")
"""The most prominent text: a lit recovery chip."""
TEXT_DIM = var("ui-font-color2", "rgba(0,0,0,.54)")
"""Secondary text (a pending step, an unlit chip): 4.6:1 on white, 6:1 on ``#111``."""
TEXT_ERROR = var("error-color1", "#d32f2f")
"""A failure, a refused value: 5.0:1 on white, 5.1:1 on ``#111``."""
TEXT_OK = var("success-color0", "#1b5e20")
"""A value taken: 7.9:1 on white, 4.6:1 on ``#111``."""
TEXT_RUNNING = var("brand-color1", "#1976d2")
"""The step that runs now: 4.6:1 on white, 6.0:1 on ``#111``."""

# -- surfaces, borders and bars (not text) -----------------------------------------------------
SURFACE = var("layout-color2", "#eee")
"""Behind a lit chip: a step off the page in every theme (text on it: 18:1 light, 10:1 dark)."""
BORDER = var("border-color1", "#bdbdbd")
BORDER_OK = var("success-color1", "#388e3c")
BORDER_ERROR = var("error-color1", "#d32f2f")
BORDER_WARN = var("warn-color1", "#f57c00")
TRACK = var("border-color2", "#e0e0e0")
"""An empty bar's track: light grey on white, dark grey on a dark page (no glare)."""
TRACK_STRIPE = var("layout-color3", "#bdbdbd")
"""The second stripe of a bar with no limit (the first is :data:`SURFACE`)."""
FILL_OK = var("success-color1", "#388e3c")
FILL_WARN = var("warn-color1", "#f57c00")
FILL_ERROR = var("error-color1", "#d32f2f")
