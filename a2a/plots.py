"""The leaderboard picture: per shape, a group of bars per version and anchor (device-side filled, leaderboard-style
hatched), the harness floor and this machine's speed of light as lines, log scale; a last panel with the geometric
means, where the published MI300X figure of each version's blog step is a hollow marker."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _bars(ax, entries: list, device: list, leaderboard: list) -> None:
    width = 0.38
    for i, name in enumerate(entries):
        color = COLORS[i % len(COLORS)]
        if device[i] == device[i]:
            ax.bar(i - width / 2, device[i], width, color=color, label=f"{name} device-side")
        if leaderboard[i] == leaderboard[i]:
            ax.bar(i + width / 2, leaderboard[i], width, color=color, alpha=0.45, hatch="//",
                   label=f"{name} leaderboard-style")
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels(entries, rotation=35, ha="right", fontsize=7)
    ax.set_yscale("log")


def _line(ax, value, style: str, color: str, label: str) -> None:
    if value is not None and value == value:
        ax.axhline(value, linestyle=style, color=color, linewidth=1.2, label=label)


def leaderboard_png(frame: pd.DataFrame, meta: dict, path: Path, published: dict, geomean) -> Path:
    """`frame`: one row per (entry, shape) with version, shape, status, mean_us, device_mean_us, floor_mean_us and,
    where measured, sol_dedup_us, sol_routed_us and sol_mi300x_us. `published`: version prefix -> µs."""
    entries = list(dict.fromkeys(frame["version"]))
    shapes = list(dict.fromkeys(frame["shape"]))
    fig, axes = plt.subplots(1, len(shapes) + 1, figsize=(3.6 * (len(shapes) + 1), 4.8), squeeze=False)
    axes = axes[0]
    for ax, shape in zip(axes, shapes):
        rows = frame[frame["shape"] == shape].set_index("version")
        value = lambda col, e: float(rows.at[e, col]) if e in rows.index and col in rows and pd.notna(rows.at[e, col]) \
            else float("nan")  # noqa: E731
        _bars(ax, entries, [value("device_mean_us", e) for e in entries],
              [value("mean_us", e) for e in entries])
        _line(ax, rows["floor_mean_us"].median(), "--", "black", "harness floor")
        for col, style, color, label in (("sol_dedup_us", ":", "green", "SOL here (dedup)"),
                                         ("sol_routed_us", ":", "olive", "SOL here (routed)"),
                                         ("sol_mi300x_us", "-.", "red", "SOL MI300X (given)")):
            if col in rows:
                _line(ax, rows[col].median(), style, color, label)
        ax.set_title(shape, fontsize=8)
        ax.set_ylabel("µs")
    ax = axes[-1]
    means = {col: [geomean(frame[frame.version == e][col]) for e in entries] for col in ("device_mean_us", "mean_us")}
    _bars(ax, entries, means["device_mean_us"], means["mean_us"])
    labelled = False
    for i, entry in enumerate(entries):
        mark = published.get(entry.split("_")[0])
        if mark:
            ax.plot(i, mark, marker="o", markersize=9, markerfacecolor="none", markeredgecolor="red",
                    linestyle="none", label=None if labelled else "published MI300X (blog step)")
            labelled = True
    ax.set_title("geometric mean over the shapes", fontsize=8)
    handles, labels = [], []
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            if label and label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"{meta['device']}, world size {meta['world_size']}, {meta['backend']}, {meta['mode']} mode, "
                 f"{meta['date']}, commit {meta['commit']}", fontsize=9)
    fig.tight_layout(rect=(0, 0.12 + 0.025 * (len(labels) // 4), 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
