"""Charts as numbers for an inline SVG: scaled points and ticks, drawn by the templates.

Only coordinates are computed here; every label reaches the page through the template, which
escapes it, so a chart can never carry markup from an event. No chart library, no CDN: the page
works offline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["line_chart"]

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 36


def _ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    if high <= low:
        return [low]
    step = (high - low) / (count - 1)
    if integer:
        step = max(1.0, math.ceil(step))
        return [low + i * step for i in range(int((high - low) // step) + 1)]
    return [low + i * step for i in range(count)]


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    thresholds: Mapping[str, float] | None = None,
    integer_x: bool = True,
) -> dict[str, Any]:
    """Series of (x, y) points and horizontal threshold lines, scaled into one SVG viewport.

    Returns width, height, `series` (label, index for its colour, `points` as the SVG attribute
    and each point's coordinates with its values), `thresholds` (label, y) and the axes' ticks.
    Non-finite values are left out (an e-value past a float's range would have no place).
    """
    thresholds = dict(thresholds or {})
    xs = [x for points in series.values() for x, _ in points if math.isfinite(x)]
    ys = [y for points in series.values() for _, y in points if math.isfinite(y)]
    ys += [y for y in thresholds.values() if math.isfinite(y)]
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y_low, y_high = (min(*ys, 0.0), max(*ys, 0.0)) if ys else (0.0, 1.0)
    if y_high == y_low:
        y_high = y_low + 1.0
    if x_high == x_low:
        x_high = x_low + 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return round(LEFT + (x - x_low) / (x_high - x_low) * plot_w, 2)

    def py(y: float) -> float:
        return round(TOP + (y_high - y) / (y_high - y_low) * plot_h, 2)

    drawn = []
    for index, (label, points) in enumerate(series.items()):
        kept = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
        drawn.append(
            {
                "label": label,
                "index": index % 6,
                "points": " ".join(f"{px(x)},{py(y)}" for x, y in kept),
                "dots": [{"cx": px(x), "cy": py(y), "x": x, "y": y} for x, y in kept],
            }
        )
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "plot": {"left": LEFT, "right": WIDTH - RIGHT, "top": TOP, "bottom": HEIGHT - BOTTOM},
        "series": drawn,
        "thresholds": [
            {"label": label, "y": py(y), "index": index % 6}
            for index, (label, y) in enumerate(thresholds.items())
            if math.isfinite(y)
        ],
        "x_ticks": [
            {"x": px(t), "label": f"{t:g}"} for t in _ticks(x_low, x_high, integer=integer_x)
        ],
        "y_ticks": [{"y": py(t), "label": f"{t:.3g}"} for t in _ticks(y_low, y_high)],
    }
