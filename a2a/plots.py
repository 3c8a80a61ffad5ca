"""The leaderboard pictures.

leaderboard.png, read first: one panel, one pair of bars per entry (versions, anchors, the empty submission, the
handshake): geometric mean over the shapes, device-side filled and leaderboard-style hatched, the value written on
each bar; the mark (SOL here + the handshake, device-side) and the harness floor (leaderboard-style) as lines; the
published MI300X figure of each version's blog step as a hollow marker. Colours say the kind of entry, not the
entry, so the legend stays short.

leaderboard_shapes.png, the detail: one small panel per shape, device-side bars per entry with that shape's mark,
SOL here and floor as lines.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

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


def _line(ax, value, style: str, color: str, label: str) -> None:
    if value is not None and value == value:
        ax.axhline(value, linestyle=style, color=color, linewidth=1.4, label=label)


def leaderboard_png(frame: pd.DataFrame, meta: dict, path: Path, published: dict, geomean) -> Path:
    """`frame`: one row per (entry, shape) with version, kind, shape, status, mean_us, device_mean_us, floor_mean_us
    and, where measured, sol_dedup_us and mark_us. `published`: version prefix -> µs."""
    entries = list(dict.fromkeys(frame["version"]))
    kinds = _kinds(frame, entries)
    device = [geomean(frame[frame.version == e]["device_mean_us"]) for e in entries]
    leaderboard = [geomean(frame[frame.version == e]["mean_us"]) for e in entries]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(entries) + 2), 5.2))
    width = 0.4
    for i, (kind, dev, lb) in enumerate(zip(kinds, device, leaderboard)):
        color = KIND_COLORS.get(kind, "tab:purple")
        for x, value, style in ((i - width / 2, dev, {}), (i + width / 2, lb, {"alpha": 0.4, "hatch": "//"})):
            if value == value:
                ax.bar(x, value, width, color=color, edgecolor=color, **style)
                ax.text(x, value * 1.04, f"{value:.0f}", ha="center", va="bottom", fontsize=7)
    per_shape = frame.groupby("shape", sort=False)
    if "mark_us" in frame:
        _line(ax, geomean(per_shape["mark_us"].median()), "-", "green", "mark: SOL here + handshake (device-side)")
    elif "sol_dedup_us" in frame:
        _line(ax, geomean(per_shape["sol_dedup_us"].median()), "-", "green", "SOL here (dedup)")
    _line(ax, geomean(per_shape["floor_mean_us"].median()), "--", "black", "harness floor (leaderboard-style)")
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
    handles.append(Patch(facecolor="white", edgecolor="black", label="device-side (filled) | leaderboard-style (hatched)"))
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels(entries, rotation=25, ha="right", fontsize=8)
    _log_scale(ax, device + leaderboard)
    ax.set_ylabel("µs, geometric mean over the shapes")
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(_title(meta), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits right of the bars, outside the axes
    plt.close(fig)
    return path


def shapes_png(frame: pd.DataFrame, meta: dict, path: Path) -> Path:
    """Per shape: device-side mean per entry, with the shape's mark, SOL here and floor as lines."""
    entries = list(dict.fromkeys(frame["version"]))
    kinds = _kinds(frame, entries)
    shapes = list(dict.fromkeys(frame["shape"]))
    columns = min(3, len(shapes))
    rows_of_panels = math.ceil(len(shapes) / columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(4.4 * columns, 3.6 * rows_of_panels), squeeze=False)
    for ax, shape in zip(axes.flat, shapes):
        rows = frame[frame["shape"] == shape].set_index("version")
        values = [_number(rows["device_mean_us"].get(entry)) if "device_mean_us" in rows else float("nan")
                  for entry in entries]
        for i, (value, kind) in enumerate(zip(values, kinds)):
            if value == value:
                ax.bar(i, value, 0.7, color=KIND_COLORS.get(kind, "tab:purple"))
        for col, style, color, label in (("mark_us", "-", "green", "mark (SOL here + handshake)"),
                                         ("sol_dedup_us", ":", "green", "SOL here (dedup)"),
                                         ("floor_mean_us", "--", "black", "harness floor (leaderboard-style)")):
            if col in rows:
                _line(ax, rows[col].median(), style, color, label)
        ax.set_xticks(range(len(entries)))
        ax.set_xticklabels(entries, rotation=35, ha="right", fontsize=6)
        _log_scale(ax, values)
        ax.set_title(shape, fontsize=8)
        ax.set_ylabel("device-side µs", fontsize=7)
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
