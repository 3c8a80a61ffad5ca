"""The leaderboard pictures.

leaderboard.png, read first: one panel, three bars per entry (versions, anchors, the empty submission, the
handshake): geometric means over the shapes of the call time (filled), the device time with the stream held
(light) and the owner's step time (hatched), each with its 95% interval over rounds as an error bar and its
value written on it; the mark (SOL here + the handshake's call time) and the harness floor (the empty submission's
owner's step time) as lines; the published MI300X figure of each version's blog step as a hollow marker.
Colours say the kind of entry, not the entry, so the legend stays short.

leaderboard_shapes.png, the detail: one small panel per shape, call-time bars per entry with their intervals and
that shape's mark and SOL here as lines.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False  # pyplot(): every text as written
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from a2a.rows import geomean  # noqa: E402


def pyplot():
    """matplotlib's pyplot as every picture of the toolkit uses it: drawn to a file (Agg), every text shown as written.
    A label holding `$` is an entry's name or a rank's word, not mathtext (red team 35: a file named `m$\\frac{$.py`
    ended the leaderboard's and diff.py's pictures, and the run, with 114)."""
    return plt


KIND_COLORS = {"version": "tab:blue", "anchor": "tab:gray", "empty": "tab:olive", "handshake": "tab:cyan"}
KIND_NAMES = {"version": "version", "anchor": "anchor (2 library all-to-alls)", "empty": "empty submission",
              "handshake": "handshake (one launch, a flag each way)"}


def _title(meta: dict) -> str:
    return (f"{meta['device']}, {meta['placement']}, {meta['backend']}, {meta['mode']} mode, "
            f"{meta['date']}, commit {meta['commit']}")


def _kinds(frame: pd.DataFrame, entries: list) -> list:
    kind_of = dict(zip(frame["version"], frame["kind"])) if "kind" in frame else {}
    return [kind_of.get(entry, "version") for entry in entries]


def _number(value) -> float:
    """A cell as a float; NaN for a missing one (a failed case has None)."""
    return float("nan") if value is None else float(value)


def _log_scale(ax, values: list) -> None:
    """Log scale where a bar was drawn (a run where every case failed draws none)."""
    if any(value > 0 for value in values if value == value):
        ax.set_yscale("log")


TICK_CHARS = 48  # an entry's name under its bars: a user's file is named by its path (red team 38: a 3236-character
# path made a picture of 23664 x 11095 pixels)


def _ticks(entries: list) -> list:
    """Each name as shown under its bars: its end (where a path names its file) within TICK_CHARS."""
    return [name if len(name) <= TICK_CHARS else "…" + name[-(TICK_CHARS - 1):] for name in entries]


def _line(ax, value, style: str, color: str, label: str) -> None:
    if value is not None and value == value:
        ax.axhline(value, linestyle=style, color=color, linewidth=1.4, label=label)


def leaderboard_png(frame: pd.DataFrame, meta: dict, summary: dict, path: Path, published: dict) -> Path:
    """`summary`: {entry: {"kind", "intervals": {metric: Interval}}} (run_leaderboard.summaries); `frame`: one row
    per (entry, shape), for the mark and the floor. `published`: version prefix -> µs."""
    entries = [e for e in dict.fromkeys(frame["version"]) if e in summary]
    kinds = _kinds(frame, entries)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.4 * len(entries) + 2), 5.2))
    width = 0.27
    drawn = []
    for i, (entry, kind) in enumerate(zip(entries, kinds)):
        color = KIND_COLORS.get(kind, "tab:purple")
        found = summary[entry]["intervals"]
        for offset, metric, style in ((-width, "call", {}), (0.0, "held", {"alpha": 0.55}),
                                      (width, "owner", {"alpha": 0.35, "hatch": "//"})):
            interval = found.get(metric)
            if interval is None or interval.center != interval.center:
                continue
            low = max(interval.low, 0) if interval.low == interval.low else interval.center
            high = interval.high if interval.high < math.inf else interval.center
            ax.bar(i + offset, interval.center, width, color=color, edgecolor=color,
                   yerr=[[interval.center - low], [high - interval.center]], capsize=2, ecolor="black", **style)
            ax.text(i + offset, high * 1.05, f"{interval.center:.0f}" if interval.center >= 10 else
                    f"{interval.center:.1f}", ha="center", va="bottom", fontsize=6)
            drawn.append(interval.center)
    per_shape = frame.groupby("shape", sort=False)
    if "mark_us" in frame:
        _line(ax, geomean(per_shape["mark_us"].median()), "-", "green", "mark: SOL here + handshake (call time)")
    elif "sol_dedup_us" in frame:
        _line(ax, geomean(per_shape["sol_dedup_us"].median()), "-", "green", "SOL here (dedup)")
    empty = frame[frame["kind"] == "empty"]
    if not empty.empty:
        _line(ax, geomean(empty["mean_us"]), "--", "black", "harness floor (empty submission, the owner's step)")
    labelled = False
    for i, entry in enumerate(entries):
        mark = published.get(entry.split("_")[0]) if kinds[i] == "version" else None
        if mark:
            ax.plot(i, mark, marker="o", markersize=9, markerfacecolor="none", markeredgecolor="red", linestyle="none",
                    label=None if labelled else "published MI300X (blog step)")
            labelled = True
    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(color=KIND_COLORS.get(kind, "tab:purple"), label=KIND_NAMES.get(kind, kind))
                for kind in dict.fromkeys(kinds)]
    handles.append(Patch(facecolor="white", edgecolor="black",
                         label="call time (filled) | held device (light) | the owner's step (hatched); bars: 95%"))
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels(_ticks(entries), rotation=25, ha="right", fontsize=8)
    _log_scale(ax, drawn)
    ax.set_ylabel("µs, geometric mean over the shapes")
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(_title(meta), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits right of the bars, outside the axes
    plt.close(fig)
    return path


def shapes_png(frame: pd.DataFrame, meta: dict, path: Path) -> Path:
    """Per shape: the owner's step per entry with its interval (the judge's figure: red team 52 had a rank's forged
    1 µs call time drawn 3600x faster), and the shape's mark and SOL here as lines."""
    entries = list(dict.fromkeys(frame["version"]))
    kinds = _kinds(frame, entries)
    shapes = list(dict.fromkeys(frame["shape"]))
    columns = min(3, len(shapes))
    rows_of_panels = math.ceil(len(shapes) / columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(4.4 * columns, 3.6 * rows_of_panels), squeeze=False)
    for ax, shape in zip(axes.flat, shapes):
        rows = frame[frame["shape"] == shape].set_index("version")
        values = [_number(rows["mean_us"].get(entry)) if "mean_us" in rows else float("nan") for entry in entries]
        for i, (entry, value, kind) in enumerate(zip(entries, values, kinds)):
            if value == value:
                low = _number(rows["low_us"].get(entry)) if "low_us" in rows else value
                high = _number(rows["high_us"].get(entry)) if "high_us" in rows else value
                low, high = (low if low == low and low > 0 else value), (high if high == high and high < math.inf
                                                                          else value)
                ax.bar(i, value, 0.7, color=KIND_COLORS.get(kind, "tab:purple"),
                       yerr=[[value - low], [high - value]], capsize=2, ecolor="black")
        for col, style, color, label in (("mark_us", "-", "green", "mark (SOL here + handshake)"),
                                         ("sol_dedup_us", ":", "green", "SOL here (dedup)")):
            if col in rows:
                _line(ax, rows[col].median(), style, color, label)
        ax.set_xticks(range(len(entries)))
        ax.set_xticklabels(_ticks(entries), rotation=35, ha="right", fontsize=6)
        _log_scale(ax, values)
        ax.set_title(shape, fontsize=8)
        ax.set_ylabel("the owner's step µs (95%)", fontsize=7)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle(_title(meta) + " - per shape", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
