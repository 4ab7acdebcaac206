"""Line plots as SVG text: the figures of `report.html` and `compare.html`.

    svg = line_plot("KL to reference", "nats / token", [Line("kl/mean", [(0, 0.01), (1, 0.03)])],
                    [VLine(1, "#e69f00", "alert (warn)")])

Every run writes its report when it ends, so drawing has to cost nothing next to training: a plot
here is a few hundred bytes of markup built in well under a millisecond, where matplotlib took a
tenth of a second or more per figure. What is drawn: the series as polylines (points marked when
there are at most 30; a non-finite value breaks the line, as a gap), vertical dashed lines for
alerts, a grid at round tick values (whole steps on x), the title, the axis labels and a legend
under the plot, where it cannot hide a curve. Each curve and alert line carries a `<title>`: a
browser shows it on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442")
"""Okabe-Ito colours: told apart with the common colour-vision deficiencies."""
WIDTH, PLOT_HEIGHT = 512, 272
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 30, 42
"""Margins around the plot area, in pixels: tick labels and the y label, title, ticks and the x label."""
FONT = 11
LEGEND_ROW = 15


@dataclass(frozen=True)
class Line:
    label: str
    points: list[tuple[float, float]]
    colour: str = ""
    """"" takes the next colour of PALETTE."""
    dash: str = ""
    """An SVG stroke-dasharray ("6 3", "2 3", ...); "" is solid."""


@dataclass(frozen=True)
class VLine:
    x: float
    colour: str
    label: str
    """Its legend entry; lines that share a label share one entry."""


def ticks(lo: float, hi: float, count: int = 5, whole: bool = False) -> list[float]:
    """Round values (1, 2 or 5 x 10^k apart) covering [lo, hi], about `count` of them; the axis
    runs from the first to the last.

        >>> ticks(0.0, 1.0)
        [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        >>> ticks(0, 3, whole=True)
        [0, 1, 2, 3]
    """
    if whole and hi - lo < 1:
        hi = lo + 1
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(1, round(step))
        return list(range(math.floor(lo / step) * step, math.ceil(hi / step) * step + 1, step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def tick_label(value: float, step: float) -> str:
    """A tick's text with as many decimals as the spacing needs (3 significant digits when tiny or huge).

        >>> tick_label(0.6, 0.2), tick_label(1e-4, 2e-5), tick_label(1200.0, 200.0)
        ('0.6', '0.0001', '1200')
    """
    if value == 0:
        return "0"
    if step < 1e-4 or abs(value) >= 1e6:
        return f"{value:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def text_width(text: str, size: int = FONT) -> float:
    """A rough width of `text` in a sans-serif font: enough to lay out legend entries."""
    return 0.6 * size * len(text)


def legend_width(label: str) -> float:
    """A legend entry's width: its line sample, the gaps, its text."""
    return 30 + text_width(label)


def line_plot(title: str, ylabel: str, lines: list[Line], vlines: Sequence[VLine] = (), xlabel: str = "step") -> str:
    """One SVG line plot of `lines` (x: whole steps) with `vlines` across it."""
    lines = [line if line.colour else Line(line.label, line.points, PALETTE[i % len(PALETTE)], line.dash)
             for i, line in enumerate(lines)]
    finite = [(x, y) for line in lines for x, y in line.points if math.isfinite(x) and math.isfinite(y)]
    xs = [x for x, _ in finite] + [v.x for v in vlines]
    ys = [y for _, y in finite]
    xt = ticks(min(xs, default=0), max(xs, default=1), 6, whole=True)
    yt = ticks(min(ys, default=0.0), max(ys, default=1.0))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    right, bottom = WIDTH - RIGHT, PLOT_HEIGHT - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (right - LEFT)

    def py(y: float) -> float:
        return bottom - (y - y0) / (y1 - y0) * (bottom - TOP)

    legend = [(line.label, line.colour, line.dash) for line in lines]
    for v in vlines:
        if all(v.label != entry[0] for entry in legend):
            legend.append((v.label, v.colour, "4 3"))
    rows = legend_rows([entry[0] for entry in legend])
    height = PLOT_HEIGHT + LEGEND_ROW * len(rows) + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="{FONT}">',
           f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
           f'<text x="{(LEFT + right) / 2:.1f}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>']
    for x in xt:
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{bottom}" stroke="#000" stroke-opacity=".1"/>'
                   f'<text x="{px(x):.1f}" y="{bottom + 14}" text-anchor="middle">{x}</text>')
    for y in yt:
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{right}" y2="{py(y):.1f}" stroke="#000" stroke-opacity=".1"/>'
                   f'<text x="{LEFT - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{tick_label(y, yt[1] - yt[0])}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" fill="none" stroke="#444"/>')
    out.append(f'<text x="{(LEFT + right) / 2:.1f}" y="{bottom + 32}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14 {(TOP + bottom) / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'{escape(ylabel)}</text>')
    for v in vlines:
        out.append(f'<line class="alert" x1="{px(v.x):.1f}" y1="{TOP}" x2="{px(v.x):.1f}" y2="{bottom}" '
                   f'stroke="{v.colour}" stroke-dasharray="4 3"><title>step {v.x:g}: {escape(v.label)}</title></line>')
    for line in lines:
        out.append(curve(line, px, py))
    y = PLOT_HEIGHT + LEGEND_ROW - 4
    for row in rows:
        x = LEFT
        for i in row:
            label, colour, dash = legend[i]
            out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 18}" y2="{y - 4}" stroke="{colour}" stroke-width="2"'
                       + (f' stroke-dasharray="{dash}"' if dash else "") + "/>"
                       f'<text class="legend" x="{x + 22}" y="{y}">{escape(label)}</text>')
            x += legend_width(label)
        y += LEGEND_ROW
    out.append("</svg>")
    return "".join(out)


def curve(line: Line, px, py) -> str:
    """A polyline through the finite points, broken where a value is not finite, with markers
    when there are few points."""
    parts, pen_down, marks = [], False, []
    for x, y in line.points:
        if not (math.isfinite(x) and math.isfinite(y)):
            pen_down = False
            continue
        marks.append((px(x), py(y)))
        parts.append(f"{'L' if pen_down else 'M'}{marks[-1][0]:.1f} {marks[-1][1]:.1f}")
        pen_down = True
    dash = f' stroke-dasharray="{line.dash}"' if line.dash else ""
    svg = (f'<g class="series"><title>{escape(line.label)}</title>'
           f'<path d="{"".join(parts)}" fill="none" stroke="{line.colour}" stroke-width="1.6"{dash}/>')
    if len(line.points) <= 30:
        svg += "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.4" fill="{line.colour}"/>' for x, y in marks)
    return svg + "</g>"


def legend_rows(labels: list[str]) -> list[list[int]]:
    """Legend entries (indices) packed into rows that fit the plot's width."""
    rows: list[list[int]] = [[]]
    used = 0.0
    for i, label in enumerate(labels):
        width = legend_width(label)
        if rows[-1] and used + width > WIDTH - LEFT - RIGHT:
            rows.append([])
            used = 0.0
        rows[-1].append(i)
        used += width
    return [row for row in rows if row]
