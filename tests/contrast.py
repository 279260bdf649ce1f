"""Text contrast as a browser renders it: WCAG 2.x contrast ratios from computed styles.

``TEXT_SAMPLES_JS`` runs in the page (Selenium's ``execute_script(TEXT_SAMPLES_JS, selector)``)
and returns, for each element under ``selector`` that holds visible text of its own, its
computed colour, the stack of backgrounds behind it (its own first, up to the first opaque
one, ending with the canvas white when every ancestor is transparent) and the product of
the opacities of it and its ancestors. ``pair`` composes a sample into the opaque
foreground and background the eye sees, and ``low_contrast`` lists the samples below a
minimum ratio, one readable line each::

    samples = driver.execute_script(TEXT_SAMPLES_JS, ".ctxr-panel")
    assert not low_contrast(samples), low_contrast(samples)

The rest reads colours without a browser: ``theme_variables`` the installed JupyterLab
themes' ``--jp-*`` colours, ``paint`` a ``var()``/``color-mix()`` value as CSS computes it,
``theme_problems`` and ``vetted`` what in our HTML or CSS is not a checked theme colour,
``delta_e`` how far apart two data colours are.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from needs import unavailable

RGBA = tuple[float, float, float, float]
"""Red, green and blue in 0..255, alpha in 0..1."""

WCAG_AA = 4.5
"""The minimum ratio for normal-size text (WCAG 2.x success criterion 1.4.3, level AA)."""

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?%?"


def parse_colour(text: str) -> RGBA:
    """A CSS colour as ``getComputedStyle`` gives it: ``rgb(…)``, ``rgba(…)``,
    ``color(srgb r g b / a)`` (Chromium's form for ``color-mix``), ``#rgb``/``#rrggbb``
    (with optional alpha), ``transparent``, or the two names JupyterLab's theme files use
    (``white``, ``black``)."""
    s = {"white": "#fff", "black": "#000"}.get(text.strip().lower(), text.strip().lower())
    if s == "transparent":
        return (0.0, 0.0, 0.0, 0.0)
    if s.startswith("#"):
        digits = s[1:]
        if len(digits) in (3, 4):
            digits = "".join(d * 2 for d in digits)
        if len(digits) not in (6, 8) or not re.fullmatch(r"[0-9a-f]+", digits):
            raise ValueError(f"not a hex colour: {text!r}")
        values = [int(digits[i:i + 2], 16) for i in range(0, len(digits), 2)]
        opacity = values[3] / 255 if len(values) == 4 else 1.0
        return (float(values[0]), float(values[1]), float(values[2]), opacity)
    match = re.fullmatch(r"(rgba?|color)\((.*)\)", s)
    if not match:
        raise ValueError(f"not a colour this parser reads: {text!r}")
    kind, body = match.groups()
    if kind == "color":
        if not body.startswith("srgb "):
            raise ValueError(f"not an sRGB colour: {text!r}")
        body = body[len("srgb "):]
    numbers = re.findall(_NUMBER, body)
    if len(numbers) not in (3, 4):
        raise ValueError(f"not a colour this parser reads: {text!r}")

    def channel(token: str) -> float:
        if token.endswith("%"):
            return float(token[:-1]) * 255 / 100
        return float(token) * (255 if kind == "color" else 1)

    def alpha(token: str) -> float:
        return float(token[:-1]) / 100 if token.endswith("%") else float(token)

    r, g, b = (channel(n) for n in numbers[:3])
    return (r, g, b, alpha(numbers[3]) if len(numbers) == 4 else 1.0)


def over(top: RGBA, bottom: RGBA) -> RGBA:
    """``top`` painted over the opaque ``bottom`` (source-over, in sRGB as browsers do)."""
    a = top[3]
    return (top[0] * a + bottom[0] * (1 - a), top[1] * a + bottom[1] * (1 - a),
            top[2] * a + bottom[2] * (1 - a), 1.0)


def relative_luminance(colour: RGBA | str) -> float:
    """WCAG 2.x relative luminance of an opaque sRGB colour (0 black .. 1 white)."""
    rgba = parse_colour(colour) if isinstance(colour, str) else colour

    def linear(c8: float) -> float:
        c = c8 / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgba[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(foreground: RGBA | str, background: RGBA | str) -> float:
    """The WCAG 2.x contrast ratio of two opaque colours, 1 (none) to 21 (black on
    white); the order does not matter."""
    a, b = relative_luminance(foreground), relative_luminance(background)
    light, dark = max(a, b), min(a, b)
    return (light + 0.05) / (dark + 0.05)


CANVAS = "rgb(255, 255, 255)"
"""What shows through when nothing behind an element paints (the browser's canvas)."""


def pair(sample: dict[str, Any]) -> tuple[RGBA, RGBA]:
    """The opaque foreground and background of one ``TEXT_SAMPLES_JS`` sample: the
    background stack composed from the bottom up, then the text colour, faded by the
    opacity of the element and its ancestors, over it."""
    stack: Sequence[str] = sample["backgrounds"]
    background = parse_colour(CANVAS)
    for layer in reversed(list(stack)):
        background = over(parse_colour(layer), background)
    fg = parse_colour(sample["color"])
    fg = (fg[0], fg[1], fg[2], fg[3] * float(sample.get("opacity", 1.0)))
    return over(fg, background), background


def ratio(sample: dict[str, Any]) -> float:
    """The contrast ratio a reader sees for one sample."""
    fg, bg = pair(sample)
    return contrast_ratio(fg, bg)


def _hex(colour: RGBA) -> str:
    return "#" + "".join(f"{round(c):02x}" for c in colour[:3])


def low_contrast(samples: Iterable[dict[str, Any]], minimum: float = WCAG_AA) -> list[str]:
    """One line per sample below ``minimum``: its text, classes, colours and ratio."""
    lines = []
    for sample in samples:
        r = ratio(sample)
        if r < minimum:
            fg, bg = pair(sample)
            lines.append(f"{sample['text'][:40]!r} ({sample['where']}): {_hex(fg)} on "
                         f"{_hex(bg)} = {r:.2f}:1, under {minimum}:1")
    return lines


TEXT_SAMPLES_JS = r"""
const roots = document.querySelectorAll(arguments[0]);
const out = [];
const seen = new Set();
const transparent = (c) => c === "transparent" || /^rgba\(.*,\s*0\)$/.test(c)
  || /\/\s*0\)$/.test(c);
const opaque = (c) => /^rgb\(/.test(c) || (/^color\(/.test(c) && !/\//.test(c));
for (const root of roots) {
  for (const el of [root, ...root.querySelectorAll("*")]) {
    if (seen.has(el)) continue;
    seen.add(el);
    const own = Array.from(el.childNodes)
      .filter((n) => n.nodeType === Node.TEXT_NODE)
      .map((n) => n.textContent).join("").trim();
    const tag = el.tagName.toLowerCase();
    const value = (tag === "input" || tag === "textarea") ? (el.value || "").trim() : "";
    const text = own || value;
    if (!text) continue;
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none") continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    const backgrounds = [];
    let opacity = 1;
    // Up to the first opaque background: the opacities between fade the text over it
    // (an opacity above it fades text and background alike, so it is left out).
    for (let node = el; node && node.nodeType === Node.ELEMENT_NODE; node = node.parentElement) {
      const s = getComputedStyle(node);
      opacity *= parseFloat(s.opacity);
      const bg = s.backgroundColor;
      if (!transparent(bg)) backgrounds.push(bg);
      if (opaque(bg)) break;
    }
    const cls = (el.className && el.className.baseVal === undefined) ? el.className : "";
    out.push({text, color: style.color, backgrounds, opacity,
              where: tag + (cls ? "." + cls.trim().split(/\s+/).join(".") : "")});
  }
}
return out;
"""
"""JS for ``execute_script(TEXT_SAMPLES_JS, selector)``: a list of samples (``text``,
``color``, ``backgrounds`` top first, ``opacity``, ``where``) for ``pair``/``low_contrast``."""


# -- colours in our HTML and CSS, and JupyterLab's own theme variables ------------------------

_LITERAL = re.compile(r"#[0-9a-fA-F]{3,8}\b|\b(?:rgba?|hsla?)\(")


def _strip_vars(text: str) -> str:
    """``text`` with every ``var(...)`` (nested parentheses included) removed."""
    out: list[str] = []
    i = 0
    while True:
        start = text.find("var(", i)
        if start < 0:
            return "".join(out) + text[i:]
        out.append(text[i:start])
        depth, j = 0, start + 3
        while j < len(text):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
            if depth == 0:
                break
        i = j


def bare_colours(text: str, allowed: Iterable[str] = ()) -> list[str]:
    """The colour literals in ``text`` (``#hex``, ``rgb(``...) that are not a ``var()``
    fallback, leaving out those in ``allowed`` (data colours, compared case-insensitively)."""
    keep = {a.lower() for a in allowed}
    return [m.group(0) for m in _LITERAL.finditer(_strip_vars(text))
            if m.group(0).lower() not in keep]


def jp_vars(text: str) -> list[tuple[str, str]]:
    """Each ``var(--jp-NAME, FALLBACK)`` in ``text`` as ``(NAME, FALLBACK)``, in order."""
    found = []
    for match in re.finditer(r"var\(--jp-([a-z0-9-]+)\s*,\s*", text):
        depth, j = 1, match.end()
        while j < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        found.append((match.group(1), text[match.end():j - 1].strip()))
    return found


THEMES = {"light": "theme-light-extension", "dark": "theme-dark-extension",
          "high contrast": "theme-dark-high-contrast-extension"}
"""JupyterLab 4's bundled themes, by the folder of their CSS under ``jupyterlab/themes``."""


def theme_variables() -> dict[str, dict[str, str]]:
    """The installed JupyterLab themes' ``--jp-*`` colour variables, resolved to a colour
    string each (``{"dark": {"error-color1": "#f44336", ...}, ...}``). ``--md-*`` palette
    references are resolved from the fallbacks the theme files give them; raises
    ImportError without JupyterLab."""
    import jupyterlab  # only here: the pure ratio tests run without it

    folder = Path(jupyterlab.__file__).parent / "themes" / "@jupyterlab"
    texts = {theme: (folder / name / "index.css").read_text(encoding="utf-8")
             for theme, name in THEMES.items()}
    palette = dict(re.findall(r"var\(--(md-[a-z0-9-]+),\s*(#[0-9a-fA-F]{3,8})\)",
                              "".join(texts.values())))
    out: dict[str, dict[str, str]] = {}
    for theme, text in texts.items():
        raw = dict(re.findall(r"--jp-([a-z0-9-]+):\s*([^;}]+)", text))

        def resolve(value: str, depth: int = 0, raw: dict[str, str] = raw,
                    theme: str = theme) -> str:
            value = value.strip()
            match = re.fullmatch(r"var\(--(jp|md)-([a-z0-9-]+)\s*(?:,\s*(.+))?\)", value)
            if not match or depth > 10:
                return value
            kind, name, fallback = match.groups()
            if kind == "jp" and name in raw:
                return resolve(raw[name], depth + 1)
            if kind == "md" and f"md-{name}" in palette:
                return palette[f"md-{name}"]
            if fallback:
                return resolve(fallback, depth + 1)
            raise KeyError(f"{value} is not defined in the {theme} theme")

        out[theme] = {name: resolve(value) for name, value in raw.items()
                      if "color" in name or "background" in name}
    return out


@functools.cache
def _installed() -> dict[str, dict[str, str]] | None:
    try:
        return theme_variables()
    except ImportError:
        return None


def installed_themes() -> dict[str, dict[str, str]]:
    """:func:`theme_variables`, read once; the test skips (fails under ``CI=true``)
    without JupyterLab."""
    themes = _installed()
    if themes is None:
        unavailable("theme check: jupyterlab is not installed (pip install -e '.[browser]')")
    return themes


def vetted(text: str) -> list[str]:
    """The colour ``var()`` uses in ``text`` that are none of ``core/theme.py``'s values
    (whose contrast tests/test_theme.py checks in every theme)."""
    from ipy_ctxrecovery.core import theme

    known = {getattr(theme, name) for name in theme.__all__ if name != "var"}
    return [f"var(--jp-{name}, {fallback})" for name, fallback in jp_vars(text)
            if ("color" in name or "background" in name)
            and f"var(--jp-{name}, {fallback})" not in known]


def _split_args(body: str) -> list[str]:
    """``body`` split at its top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(body[start:i].strip())
            start = i + 1
    return [*parts, body[start:].strip()]


def paint(value: str, variables: dict[str, str], current: RGBA | str) -> RGBA:
    """The colour ``value`` computes to: ``var(--jp-…, fallback)`` from ``variables`` (a
    page with none: ``{}``), ``color-mix(in srgb, A p%, B)`` as CSS mixes (premultiplied
    alpha), ``currentColor`` as ``current`` (the inherited text colour)."""
    value = value.strip()
    here = parse_colour(current) if isinstance(current, str) else current
    if value.lower() == "currentcolor":
        return here
    if value.startswith("var("):
        [(name, fallback)] = jp_vars(value)
        return paint(variables.get(name, fallback), variables, here)
    if value.startswith("color-mix("):
        space, first, second = _split_args(value[len("color-mix("):-1])
        if space != "in srgb":
            raise ValueError(f"only srgb mixes are read: {value!r}")

        def part(arg: str) -> tuple[RGBA, float | None]:
            match = re.fullmatch(r"(.*?)\s+([\d.]+)%", arg)
            colour, share = (match.group(1), float(match.group(2)) / 100) if match else (arg, None)
            return paint(colour, variables, here), share

        (c1, p1), (c2, p2) = part(first), part(second)
        p1 = p1 if p1 is not None else 1 - (p2 or 0.5) if p2 is not None else 0.5
        p2 = p2 if p2 is not None else 1 - p1
        alpha = c1[3] * p1 + c2[3] * p2
        if alpha == 0:
            return (0.0, 0.0, 0.0, 0.0)
        rgb = [(c1[i] * c1[3] * p1 + c2[i] * c2[3] * p2) / alpha for i in range(3)]
        return (rgb[0], rgb[1], rgb[2], alpha)
    return parse_colour(value)


def delta_e(a: RGBA | str, b: RGBA | str) -> float:
    """CIE76 colour difference (Euclidean in CIELAB, D65): about 2.3 is just noticeable,
    over 20 reads as another colour at a glance."""

    def lab(colour: RGBA | str) -> tuple[float, float, float]:
        rgba = parse_colour(colour) if isinstance(colour, str) else colour

        def linear(c8: float) -> float:
            c = c8 / 255
            return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

        r, g, b = (linear(c) for c in rgba[:3])
        x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
        y = 0.2126 * r + 0.7152 * g + 0.0722 * b
        z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

        def f(t: float) -> float:
            return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

        return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))

    return sum((p - q) ** 2 for p, q in zip(lab(a), lab(b), strict=True)) ** 0.5


def theme_problems(text: str, themes: dict[str, dict[str, str]],
                   allowed: Iterable[str] = ()) -> list[str]:
    """What in ``text`` (HTML or CSS of ours) does not follow the theme: a colour literal
    outside a ``var()`` fallback (``allowed`` data colours aside), a ``--jp-*`` variable
    one of ``themes`` (:func:`theme_variables`) does not define."""
    problems = [f"hard-coded colour {c}" for c in bare_colours(text, allowed)]
    for name, _fallback in jp_vars(text):
        if "color" not in name and "background" not in name:
            continue  # a font, a size: not a colour
        missing = [theme for theme, variables in themes.items() if name not in variables]
        if missing:
            problems.append(f"--jp-{name} is not defined in the {', '.join(missing)} theme")
    return problems


def page_samples(page: str, root: str, what: str) -> list[dict[str, Any]]:
    """:data:`TEXT_SAMPLES_JS` run on the HTML ``page`` in headless Chromium (Debian's,
    through Selenium) for the texts under ``root``; skips (fails under CI) with one line
    naming ``what`` when Chromium, its driver or Selenium is missing."""
    import os
    import urllib.parse

    chromium, chromedriver = "/usr/bin/chromium", "/usr/bin/chromedriver"
    if not (os.access(chromium, os.X_OK) and os.access(chromedriver, os.X_OK)):
        unavailable(f"{what}: chromium or chromedriver is missing")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable(f"{what}: selenium is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        driver.get("data:text/html," + urllib.parse.quote(page))
        samples: list[dict[str, Any]] = driver.execute_script(TEXT_SAMPLES_JS, root)
    finally:
        driver.quit()
    return samples
