"""Plot a run's metrics.jsonl (written by ``controller.tracking``) to a PNG.

One subplot per requested key that appears in the file, x = step. Uses
matplotlib's object API with the Agg canvas directly, so it never touches
pyplot's global backend/state and works headless. If a step was logged twice
(a resumed run re-logging a step), the last value wins.

Not here: smoothing, comparing runs, interactive display.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

DEFAULT_KEYS = ("critic/score/mean", "response_length/mean", "val/accuracy")


def _read_rows(metrics_jsonl: str) -> list[dict]:
    if not os.path.isfile(metrics_jsonl):
        raise FileNotFoundError(f"metrics file not found: {metrics_jsonl}")
    with open(metrics_jsonl, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    rows = []
    for lineno, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if lineno == len(lines):  # a crash mid-write can truncate only the last line
                break
            raise ValueError(f"{metrics_jsonl}:{lineno}: not valid JSON: {e}") from None
    return rows


def plot_run(metrics_jsonl: str, out_png: str, keys: Sequence[str] = DEFAULT_KEYS) -> str:
    """Draw each of ``keys`` present in ``metrics_jsonl`` against step; save to ``out_png`` and return it.

    Raises FileNotFoundError if the file is missing, ValueError if none of ``keys`` occurs in it.
    """
    rows = _read_rows(metrics_jsonl)
    series: dict[str, dict[int, float]] = {}
    for row in rows:
        for key in keys:
            value = row.get(key)
            if isinstance(value, (int, float)) and "step" in row:
                series.setdefault(key, {})[row["step"]] = value
    present = [key for key in keys if key in series]
    if not present:
        available = sorted({k for row in rows for k in row} - {"step"})
        raise ValueError(f"none of {list(keys)} found in {metrics_jsonl}; keys present: {available}")

    fig = Figure(figsize=(5 * len(present), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    for i, key in enumerate(present, start=1):
        ax = fig.add_subplot(1, len(present), i)
        steps = sorted(series[key])
        values = [series[key][s] for s in steps]
        ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, markersize=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png
