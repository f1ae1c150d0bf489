"""Line charts drawn with Pillow (no matplotlib): stacked panels, one or more series each."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127)]


@dataclass
class Series:
    label: str
    xs: list[float]
    ys: list[float]


@dataclass
class Panel:
    title: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    zero: bool = True  # the y axis starts at 0 (else at the data's minimum)


def draw(path: Path, title: str, panels: list[Panel], x_label: str = "seconds",
         width: int = 960, panel_height: int = 280) -> None:
    """Write a PNG with ``panels`` stacked under ``title``."""
    font = ImageFont.load_default()
    top = 28
    img = Image.new("RGB", (width, top + panel_height * len(panels)), "white")
    d = ImageDraw.Draw(img)
    d.text((10, 8), title, fill="black", font=font)
    for i, panel in enumerate(panels):
        _panel(d, font, panel, x_label, (0, top + i * panel_height, width, panel_height))
    img.save(path, "PNG")


def _panel(d: ImageDraw.ImageDraw, font: ImageFont.ImageFont | ImageFont.FreeTypeFont,
           panel: Panel, x_label: str, box: tuple[int, int, int, int]) -> None:
    x0, y0, w, h = box
    left, right, up, down = 70, 170, 22, 34
    px0, py0, px1, py1 = x0 + left, y0 + up, x0 + w - right, y0 + h - down
    d.text((px0, y0 + 4), panel.title, fill="black", font=font)
    pts = [(x, y) for s in panel.series for x, y in zip(s.xs, s.ys, strict=True) if math.isfinite(y)]
    d.rectangle((px0, py0, px1, py1), outline=(120, 120, 120))
    if not pts:
        d.text((px0 + 10, py0 + 10), "no data", fill="gray", font=font)
        return
    xmin, xmax = min(p[0] for p in pts), max(p[0] for p in pts)
    ymin, ymax = min(p[1] for p in pts), max(p[1] for p in pts)
    if panel.zero:
        ymin = min(0.0, ymin)
    if xmax == xmin:
        xmax = xmin + 1
    if ymax == ymin:
        ymax = ymin + 1
    ymax += (ymax - ymin) * 0.05

    def sx(x: float) -> float:
        return px0 + (x - xmin) / (xmax - xmin) * (px1 - px0)

    def sy(y: float) -> float:
        return py1 - (y - ymin) / (ymax - ymin) * (py1 - py0)

    for k in range(5):  # grid and tick labels
        yv = ymin + (ymax - ymin) * k / 4
        d.line((px0, sy(yv), px1, sy(yv)), fill=(230, 230, 230))
        d.text((x0 + 4, sy(yv) - 6), f"{yv:.4g}", fill="black", font=font)
        xv = xmin + (xmax - xmin) * k / 4
        d.text((sx(xv) - 10, py1 + 4), f"{xv:.0f}" if xmax - xmin >= 10 else f"{xv:.2g}",
               fill="black", font=font)
    d.text((px1 - 60, py1 + 18), x_label, fill="black", font=font)
    d.text((x0 + 4, py0 - 18), panel.y_label, fill="black", font=font)
    for j, s in enumerate(panel.series):
        colour = COLOURS[j % len(COLOURS)]
        line = [(sx(x), sy(y)) for x, y in zip(s.xs, s.ys, strict=True) if math.isfinite(y)]
        if len(line) > 1:
            d.line(line, fill=colour, width=2)
        elif line:
            d.ellipse((line[0][0] - 2, line[0][1] - 2, line[0][0] + 2, line[0][1] + 2), fill=colour)
        d.line((px1 + 10, py0 + 8 + 14 * j, px1 + 30, py0 + 8 + 14 * j), fill=colour, width=3)
        d.text((px1 + 34, py0 + 2 + 14 * j), s.label[:22], fill="black", font=font)
