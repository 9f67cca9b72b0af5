"""Tiny terminal visuals for grpo-status: durations, sparklines, step bars, a text plot.

All pure: values in, strings out; no dependency beyond the standard library.
"""

from __future__ import annotations

SPARKS = "▁▂▃▄▅▆▇█"


def fmt_age(seconds: float | None) -> str:
    """Compact duration: 45s, 12m, 3.5h, 2.0d."""
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def sparkline(values: list[float]) -> str:
    """▁▃▅█-style trend of a few values (flat series: lowest bar)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo
    return "".join(SPARKS[int((v - lo) / span * 7) if span > 0 else 0] for v in values)


def step_bar(step: int | None, max_steps: int | None, width: int = 8) -> str:
    """``40/100 ███░░░░░``."""
    if step is None:
        return "-"
    if not max_steps:
        return str(step)
    filled = min(width, round(width * step / max_steps))
    return f"{step}/{max_steps} " + "█" * filled + "░" * (width - filled)


def text_plot(points: list[tuple[int, float]], width: int = 60, height: int = 10) -> list[str]:
    """A small terminal plot of (step, value) points: one dot per column (pure)."""
    if not points:
        return ["(no metrics yet)"]
    cols: dict[int, list[float]] = {}
    first, last = points[0][0], points[-1][0]
    for step, value in points:
        col = 0 if last == first else round((step - first) / (last - first) * (width - 1))
        cols.setdefault(col, []).append(value)
    means = {c: sum(v) / len(v) for c, v in cols.items()}
    lo, hi = min(means.values()), max(means.values())
    span = hi - lo or 1.0
    grid = [[" "] * width for _ in range(height)]
    for c, v in means.items():
        grid[height - 1 - round((v - lo) / span * (height - 1))][c] = "•"
    lines = []
    for i, cells in enumerate(grid):
        label = f"{hi:8.3f}" if i == 0 else f"{lo:8.3f}" if i == height - 1 else " " * 8
        lines.append(f"{label} ┤{''.join(cells)}")
    lines.append(" " * 9 + "└" + "─" * width)
    lines.append(" " * 10 + f"step {first}".ljust(width - len(str(last))) + str(last))
    return lines


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, ``...`` marking a cut."""
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."
