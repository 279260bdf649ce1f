"""tests/contrast.py: WCAG 2.x ratios against published pairs, the colour forms Chromium's
``getComputedStyle`` returns, and the composition of translucent layers and opacity. The
in-page snippet runs once against a small page in headless Chromium (browser mark)."""

from __future__ import annotations

import pytest
from contrast import (
    contrast_ratio,
    low_contrast,
    over,
    page_samples,
    pair,
    parse_colour,
    ratio,
    relative_luminance,
)


@pytest.mark.parametrize(("fg", "bg", "expected"), [
    ("#000", "#fff", 21.0),
    ("#fff", "#fff", 1.0),
    ("#767676", "#ffffff", 4.54),    # the lightest grey that passes AA on white
    ("#777777", "#ffffff", 4.48),    # one step lighter fails it
    ("#0000ff", "#ffffff", 8.59),
    ("#ff0000", "#ffffff", 4.00),
    ("#00ff00", "#000000", 15.30),
    ("#d32f2f", "#ffffff", 4.98),
])
def test_ratio_of_known_pairs(fg: str, bg: str, expected: float) -> None:
    assert contrast_ratio(fg, bg) == pytest.approx(expected, abs=0.01)


def test_ratio_ignores_order_and_luminance_spans_0_to_1() -> None:
    assert contrast_ratio("#1976d2", "#212121") == contrast_ratio("#212121", "#1976d2")
    assert relative_luminance("#000") == 0.0
    assert relative_luminance("#fff") == pytest.approx(1.0)
    # The piecewise sRGB curve: a dark channel is on the linear segment (c / 12.92).
    assert relative_luminance("rgb(10, 10, 10)") == pytest.approx(10 / 255 / 12.92)


@pytest.mark.parametrize(("text", "expected"), [
    ("rgb(33, 33, 33)", (33, 33, 33, 1.0)),
    ("rgba(255, 255, 255, 0.54)", (255, 255, 255, 0.54)),
    ("rgba(0, 0, 0, 0)", (0, 0, 0, 0.0)),
    ("transparent", (0, 0, 0, 0.0)),
    ("white", (255, 255, 255, 1.0)),
    ("#e0e0e0", (224, 224, 224, 1.0)),
    ("#abc", (170, 187, 204, 1.0)),
    ("#00000080", (0, 0, 0, 128 / 255)),
    ("color(srgb 1 0.5 0)", (255, 127.5, 0, 1.0)),
    ("color(srgb 0 0 1 / 0.25)", (0, 0, 255, 0.25)),
    ("rgb(100% 0% 50%)", (255, 0, 127.5, 1.0)),
])
def test_parses_the_forms_computed_styles_use(text: str, expected: tuple[float, ...]) -> None:
    assert parse_colour(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["papayawhip", "#12", "hsl(0, 50%, 50%)", "color(display-p3 1 0 0)"])
def test_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError):
        parse_colour(text)


def test_translucent_text_and_layers_compose_over_what_is_behind() -> None:
    assert over(parse_colour("rgba(0, 0, 0, 0.5)"), parse_colour("#fff")) == pytest.approx(
        (127.5, 127.5, 127.5, 1.0))
    # JupyterLab's secondary text (54 % black) on white just passes; faded to half, fails.
    secondary = {"text": "x", "where": "span", "color": "rgba(0, 0, 0, 0.54)",
                 "backgrounds": ["rgb(255, 255, 255)"], "opacity": 1.0}
    assert ratio(secondary) == pytest.approx(4.6, abs=0.05)
    assert ratio({**secondary, "opacity": 0.5}) < 2.5
    # No background anywhere: the canvas (white) shows through.
    assert pair({**secondary, "backgrounds": []})[1] == (255, 255, 255, 1.0)
    # A translucent tint over a dark page: the tint is composed onto the page first.
    tinted = {"text": "x", "where": "span", "color": "rgb(255, 255, 255)",
              "backgrounds": ["rgba(255, 152, 0, 0.5)", "rgb(17, 17, 17)"], "opacity": 1.0}
    fg, bg = pair(tinted)
    assert bg == pytest.approx((136, 84.5, 8.5, 1.0))
    assert fg == (255, 255, 255, 1.0)


def test_low_contrast_names_only_the_failing_samples() -> None:
    good = {"text": "readable", "where": "span.ok", "color": "rgb(0, 0, 0)",
            "backgrounds": ["rgb(255, 255, 255)"], "opacity": 1.0}
    bad = {"text": "white on light orange", "where": "span.ctxr-level.lit",
           "color": "rgb(255, 255, 255)", "backgrounds": ["rgb(255, 243, 224)"], "opacity": 1}
    lines = low_contrast([good, bad])
    assert len(lines) == 1
    assert "white on light orange" in lines[0] and "span.ctxr-level.lit" in lines[0]
    assert "#ffffff on #fff3e0" in lines[0]


PAGE = """<!doctype html><html><body style="background:#111;margin:0">
<div id="root" style="color:#fff">
  <p id="plain">white on the page</p>
  <div style="background:rgba(255,152,0,0.5)"><span>on a tint</span></div>
  <div style="opacity:0.5"><span>faded</span></div>
  <div style="background:#fff3e0"><b style="color:#fff">the old lit chip</b></div>
  <span style="display:none">hidden</span>
  <span>   </span>
</div></body></html>"""


@pytest.mark.browser
def test_the_snippet_reads_a_real_page_in_chromium() -> None:
    samples = {s["text"]: s
               for s in page_samples(PAGE, "#root", "contrast snippet")}
    assert set(samples) == {"white on the page", "on a tint", "faded", "the old lit chip"}
    assert ratio(samples["white on the page"]) == pytest.approx(contrast_ratio("#fff", "#111"))
    assert pair(samples["on a tint"])[1] == pytest.approx((136, 84.5, 8.5, 1.0), abs=0.6)
    assert samples["faded"]["opacity"] == pytest.approx(0.5)
    assert ratio(samples["faded"]) < ratio(samples["white on the page"]) / 2
    assert [line.split(" (")[0] for line in low_contrast(samples.values())] == [
        "'the old lit chip'"]
