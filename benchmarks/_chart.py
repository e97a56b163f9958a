"""The chart of the benchmark ratios: one horizontal bar per figure and implementation, from 1.0 (as fast or as
small as raw PyTorch) to the ratio, on a log scale, with the interquartile range of the per-round ratios as a
whisker. Drawn with matplotlib when it is importable, otherwise with the built-in PNG canvas (``_png``)."""

from __future__ import annotations

import math
from pathlib import Path

from _png import GLYPH_HEIGHT, Canvas, text_width

COLORS = {"fabric_lite": (31, 119, 180), "lightning": (148, 103, 189), "accelerate": (255, 127, 14)}
OTHER = (127, 127, 127)
NOTE = "bar: median of the per-round ratios to raw PyTorch (log scale; lower is better); whisker: quartiles"


def _axis(rows: list[dict]) -> tuple[float, float, list[float]]:
    """The ratio range shown, symmetric on the log scale around 1.0, and its ticks; ratios beyond are clipped."""
    largest = max(max(row["ratio"], row["high"], 1 / min(row["ratio"], row["low"])) for row in rows)
    if largest <= 1.25:
        return 0.8, 1.25, [0.8, 0.9, 1.0, 1.1, 1.25]
    if largest <= 2:
        return 0.5, 2.0, [0.5, 0.75, 1.0, 1.5, 2.0]
    return 0.25, 4.0, [0.25, 0.5, 1.0, 2.0, 4.0]


def write_chart(path: str | Path, table: list[dict], title: str, subtitle: list[str]) -> str:
    """Write the chart of every row of ``table`` that has a ratio to ``path`` (PNG); return what drew it."""
    rows = [row for row in table if row.get("ratio") is not None]
    if not rows:
        raise ValueError("no figure with a ratio to chart")
    try:
        import matplotlib
    except ImportError:
        _draw_canvas(Path(path), rows, title, subtitle)
        return "the built-in PNG writer"
    matplotlib.use("Agg")
    _draw_matplotlib(Path(path), rows, title, subtitle)
    return "matplotlib"


def _label(row: dict, lo: float, hi: float) -> str:
    clipped = " (off the scale)" if not lo <= row["ratio"] <= hi else ""
    return f"{row['ratio']:.3f}x{clipped}"


def _draw_matplotlib(path: Path, rows: list[dict], title: str, subtitle: list[str]) -> None:
    import matplotlib.pyplot as plt

    lo, hi, ticks = _axis(rows)
    figure, axes = plt.subplots(figsize=(11, 0.32 * len(rows) + 2.2))
    labels = []
    for y, row in enumerate(rows):
        color = [c / 255 for c in COLORS.get(row["impl"], OTHER)]
        ratio = min(max(row["ratio"], lo), hi)
        axes.barh(y, ratio - 1.0, left=1.0, height=0.7, color=color)
        axes.plot([ratio], [y], marker="|", markersize=12, markeredgewidth=3, color=color)  # visible at 1.0 too
        low, high = min(max(row["low"], lo), hi), min(max(row["high"], lo), hi)
        axes.plot([low, high], [y, y], color="black", linewidth=1)
        end = max(ratio, high, 1.0)
        axes.annotate(_label(row, lo, hi), (end, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        labels.append(f"{row['measure']}  {row['impl']}")
    axes.axvline(1.0, color="black", linewidth=1.5)
    axes.set_xscale("log")
    axes.set_xlim(lo, hi)
    axes.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    axes.minorticks_off()
    axes.set_yticks(range(len(rows)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.grid(axis="x", color="0.85")
    axes.set_title(title + "\n" + "\n".join(subtitle), fontsize=9, loc="left")
    axes.set_xlabel(NOTE, fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _draw_canvas(path: Path, rows: list[dict], title: str, subtitle: list[str]) -> None:
    scale, pad, bar, gap, group_gap = 2, 20, 16, 4, 10
    line = (GLYPH_HEIGHT + 3) * scale
    lo, hi, ticks = _axis(rows)
    impls = list(dict.fromkeys(row["impl"] for row in rows))
    groups = list(dict.fromkeys(row["measure"] for row in rows))
    label_width = max(text_width(measure, scale) for measure in groups) + 2 * pad
    plot_width = 640
    value_width = text_width("47.488x (off the scale)", scale) + pad
    width = max(
        label_width + plot_width + value_width,
        *(text_width(text, scale) + 2 * pad for text in [title, *subtitle, NOTE]),
    )
    top = pad + line * (len(subtitle) + 1) + pad // 2 + line + pad  # title, subtitle, legend
    plot_height = len(rows) * (bar + gap) + len(groups) * group_gap
    height = top + plot_height + line * 2 + pad
    canvas = Canvas(width, height)

    y = pad
    canvas.text(pad, y, title, scale=scale)
    for text in subtitle:
        y += line
        canvas.text(pad, y, text, (80, 80, 80), scale=scale)
    y += line + pad // 2
    x = pad
    for impl in impls:  # legend
        canvas.rect(x, y, x + 14, y + 14, COLORS.get(impl, OTHER))
        x = canvas.text(x + 20, y, impl, scale=scale) + 2 * pad

    left = label_width

    def to_x(ratio: float) -> int:
        ratio = min(max(ratio, lo), hi)
        return left + round((math.log(ratio) - math.log(lo)) / (math.log(hi) - math.log(lo)) * plot_width)

    bottom = top + plot_height
    for tick in ticks:  # grid and tick labels
        canvas.rect(to_x(tick), top - 4, to_x(tick) + 1, bottom, (220, 220, 220))
        text = f"{tick:g}x"
        canvas.text(to_x(tick) - text_width(text, scale) // 2, bottom + 6, text, scale=scale)
    y = top
    for measure in groups:
        canvas.text(pad, y + 1, measure, scale=scale)
        for row in (r for r in rows if r["measure"] == measure):
            start, end = sorted((to_x(1.0), to_x(row["ratio"])))
            if end - start < 6:  # about 1.0: a mark wide enough to show its colour either side of the line
                start, end = to_x(row["ratio"]) - 3, to_x(row["ratio"]) + 3
            canvas.rect(start, y, end, y + bar, COLORS.get(row["impl"], OTHER))
            low, high, middle = to_x(row["low"]), to_x(row["high"]), y + bar // 2
            canvas.rect(low, middle, high + 1, middle + 1, (0, 0, 0))  # whisker: the interquartile range
            canvas.rect(low, middle - 3, low + 1, middle + 4, (0, 0, 0))
            canvas.rect(high, middle - 3, high + 1, middle + 4, (0, 0, 0))
            canvas.text(max(end, high) + 8, y + 1, _label(row, lo, hi), scale=scale)
            y += bar + gap
        y += group_gap
    canvas.rect(to_x(1.0) - 1, top - 8, to_x(1.0) + 1, bottom, (0, 0, 0))  # the line at 1.0: raw PyTorch
    canvas.text(to_x(1.0) + 6, top - 8 - line // 2, "raw PyTorch", scale=1)
    canvas.text(pad, bottom + 6 + line, NOTE, (80, 80, 80), scale=scale)
    canvas.save(path)
