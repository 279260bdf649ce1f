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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

RGBA = tuple[float, float, float, float]
"""Red, green and blue in 0..255, alpha in 0..1."""

WCAG_AA = 4.5
"""The minimum ratio for normal-size text (WCAG 2.x success criterion 1.4.3, level AA)."""

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?%?"


def parse_colour(text: str) -> RGBA:
    """A CSS colour as ``getComputedStyle`` gives it: ``rgb(…)``, ``rgba(…)``,
    ``color(srgb r g b / a)`` (Chromium's form for ``color-mix``), ``#rgb``/``#rrggbb``
    (with optional alpha) or ``transparent``."""
    s = text.strip().lower()
    if s == "transparent":
        return (0.0, 0.0, 0.0, 0.0)
    if s.startswith("#"):
        digits = s[1:]
        if len(digits) in (3, 4):
            digits = "".join(d * 2 for d in digits)
        if len(digits) not in (6, 8) or not re.fullmatch(r"[0-9a-f]+", digits):
            raise ValueError(f"not a hex colour: {text!r}")
        values = [int(digits[i:i + 2], 16) for i in range(0, len(digits), 2)]
        alpha = values[3] / 255 if len(values) == 4 else 1.0
        return (float(values[0]), float(values[1]), float(values[2]), alpha)
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
