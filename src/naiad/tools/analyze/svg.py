"""Inline SVG charts (no plotting library): line charts with markers and horizontal bar charts."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
MUTED = "#b0b0b0"


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    color: str = ""
    emphasis: bool = True


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    ticks, value = [], start
    for _ in range(count * 3):
        ticks.append(round(value, 10))
        if value >= high - step * 1e-9:
            break
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def line_chart(title: str, x_label: str, y_label: str, series: list[Series], vline: float | None = None,
               vline_label: str = "", width: int = 820, height: int = 420) -> str:
    """Points are joined in the order given (e.g. by rising concurrency)."""
    left, right, top, bottom = 70, 270, 40, 55
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points] + ([vline] if vline else [])
    ys = [y for s in series for _, y in s.points]
    x_ticks = _nice_ticks(0.0, max(xs or [1.0]) * 1.05)
    y_ticks = _nice_ticks(0.0, max(ys or [1.0]) * 1.05)
    x_max, y_max = x_ticks[-1] or 1.0, y_ticks[-1] or 1.0

    def px(x: float) -> float:
        return left + plot_w * x / x_max

    def py(y: float) -> float:
        return top + plot_h * (1 - y / y_max)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="22" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    for t in x_ticks:
        out.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{px(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for t in y_ticks:
        out.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{left + plot_w}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#555"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">{html.escape(x_label)}</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + plot_h / 2})">{html.escape(y_label)}</text>')
    if vline:
        out.append(f'<line x1="{px(vline):.1f}" y1="{top}" x2="{px(vline):.1f}" y2="{top + plot_h}" '
                   f'stroke="#d62728" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{px(vline) - 4:.1f}" y="{top + plot_h - 8}" text-anchor="end" fill="#d62728">'
                   f'{html.escape(vline_label)}</text>')
    legend_y = top
    for index, s in enumerate(sorted(series, key=lambda s: s.emphasis)):
        color = s.color or (PALETTE[index % len(PALETTE)] if s.emphasis else MUTED)
        points = list(s.points)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        stroke = 2.5 if s.emphasis else 1.2
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{stroke}"/>')
        for x, y in points:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{3.5 if s.emphasis else 2}" fill="{color}">'
                       f'<title>{html.escape(s.label)}: {_fmt(x)}, {_fmt(y)}</title></circle>')
        if s.emphasis:
            out.append(f'<rect x="{left + plot_w + 12}" y="{legend_y}" width="12" height="12" fill="{color}"/>')
            out.append(f'<text x="{left + plot_w + 30}" y="{legend_y + 10}">{html.escape(s.label)}</text>')
            legend_y += 18
    if any(not s.emphasis for s in series):
        out.append(f'<rect x="{left + plot_w + 12}" y="{legend_y}" width="12" height="12" fill="{MUTED}"/>')
        out.append(f'<text x="{left + plot_w + 30}" y="{legend_y + 10}">other configs</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(title: str, unit: str, bars: list[tuple[str, float, str]], width: int = 720) -> str:
    """Horizontal bars: (label, value, color)."""
    row, left, right, top = 26, 230, 90, 40
    height = top + row * max(1, len(bars)) + 20
    top_value = max([v for _, v, _ in bars] + [1e-9])
    plot_w = width - left - right
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="22" font-size="15" font-weight="bold">{html.escape(title)}</text>']
    for index, (label, value, color) in enumerate(bars):
        y = top + index * row
        w = plot_w * value / top_value
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{html.escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" fill="{color or PALETTE[0]}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}">{_fmt(value)} {html.escape(unit)}</text>')
    out.append("</svg>")
    return "\n".join(out)
