"""One row per (entry, case) in every table and file: the fields, written once.

The protocol face writes `benchmark.N.<stat>` (the official Stats) and, with the human face's extras, the quantiles
of that time (`benchmark.N.p50`, `.p90`) and `benchmark.N.<kind>_<stat>` for each kind in eval.EXTRA_STATS. A row
holds them in µs as `<stat>_us` and `<kind>_<stat>_us`. Tools that time in-process (anchors, the empty submission) build the same row from their samples.
"""
from __future__ import annotations

import base64
import math
import re

import eval as core

TIMED_STATS = tuple(stat for stat in core.EXTRA_STAT_FIELDS if stat != "runs")  # mean, best, p50, p90
TIMING_FIELDS = tuple(f"{kind + '_' if kind else ''}{stat}_us" for kind in ("",) + core.EXTRA_STATS
                      for stat in TIMED_STATS)
ROW_FIELDS = ("status", "runs") + TIMING_FIELDS


# A result line. Lines end at "\n" alone: str.splitlines would also end one at \r, \x0b, \x85, U+2028 and the like,
# which a value may hold (a rank's words), and a value must stay on its line.
KEY_LINE = re.compile(r"([\w.-]+): (.*)")


def parse_popcorn(text: str) -> dict:
    """`key: value` lines -> dict; a line that is not `key: value` is ignored (stray_lines counts them). A key written
    again keeps its first value (the evaluator writes each key once: a second one is forged; repeated_keys)."""
    keys = {}
    for line in text.split("\n"):
        matched = KEY_LINE.fullmatch(line)
        if matched and matched[1] not in keys:
            keys[matched[1]] = matched[2]
    return keys


def stray_lines(text: str) -> int:
    """Lines that are not `key: value` (blank ones aside): the evaluator writes none, so each is a value that broke
    its line or something else writing into the result channel."""
    return sum(1 for line in text.split("\n") if line.strip() and not KEY_LINE.fullmatch(line))


def repeated_keys(text: str) -> list[str]:
    """Keys written more than once, in order: the evaluator writes each key once, so each is evidence that
    something else wrote into the result channel. (The runner's own reader keeps the last value: docs/judge.md.)"""
    seen, repeated = set(), []
    for line in text.split("\n"):
        matched = KEY_LINE.fullmatch(line)
        if matched:
            if matched[1] in seen and matched[1] not in repeated:
                repeated.append(matched[1])
            seen.add(matched[1])
    return repeated


def rows_from_keys(keys: dict, mode: str) -> list[dict]:
    """One dict per case the protocol output names: index, spec, status, error, runs and TIMING_FIELDS (µs)."""
    prefix = "test" if mode == "test" else "benchmark"
    rows = []
    for idx in range(int(keys.get(f"{prefix}-count", 0))):
        if f"{prefix}.{idx}.spec" not in keys:
            break
        row = {"index": idx, "spec": keys[f"{prefix}.{idx}.spec"]}
        status = keys.get(f"{prefix}.{idx}.status")
        # The runner logs no status for a timed or profiled case: its figures or its report are its pass.
        if mode != "test" and status is None and ({f"{prefix}.{idx}.mean", f"{prefix}.{idx}.report"} & keys.keys()):
            status = "pass"
        row["status"] = status or "not run"
        row["error"] = keys.get(f"{prefix}.{idx}.error", "")
        for field in TIMING_FIELDS:
            key = f"{prefix}.{idx}.{field[:-3]}"
            if key in keys:
                row[field] = float(keys[key]) / 1e3
        if f"{prefix}.{idx}.runs" in keys:
            row["runs"] = int(keys[f"{prefix}.{idx}.runs"])
        if f"{prefix}.{idx}.report" in keys:
            row["report"] = base64.b64decode(keys[f"{prefix}.{idx}.report"], b"+*").decode("utf-8")
        rows.append(row)
    return rows


def row_from_samples(host_ns: list, device_ns: list, floor_ns: list) -> dict:
    """The row fields from in-process samples: leaderboard-style host ns (rank 0), device ns (slowest rank per
    step) and floor ns."""
    row = {"status": "pass", "runs": len(host_ns), "error": ""}
    for kind, samples in (("", host_ns), ("device", device_ns), ("floor", floor_ns)):
        stats = core.calculate_extra_stats(samples)
        for stat in TIMED_STATS:
            row[f"{kind + '_' if kind else ''}{stat}_us"] = getattr(stats, stat) / 1e3
    return row


def geomean(values) -> float:
    """Geometric mean of the positive values (NaN when there are none)."""
    values = [v for v in values if v and v > 0 and not math.isnan(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def shape_label(num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int, **_) -> str:
    return f"E={num_experts} k={experts_per_token} H={hidden_dim} T={max_num_tokens}"


def case_slug(num_experts: int, experts_per_token: int, hidden_dim: int, max_num_tokens: int, seed: int, **_) -> str:
    """shape_label's words for a folder name, with the seed (a trace is of one case)."""
    return f"E{num_experts}_k{experts_per_token}_H{hidden_dim}_T{max_num_tokens}_s{seed}"


def markdown_cell(text: str) -> str:
    """Any text (an entry's name, a rank's words, already one escaped line) as one GitHub table cell: its `\\` and
    `|` are shown, never read (red teams 23 and 35: a `|` in an error or a file name opened cells of its own, and a
    `\\|` ended its cell early)."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def github_table(rows, **options) -> str:
    """tabulate's GitHub table of `rows` (dicts, or a DataFrame's records) with every header and every text cell
    through markdown_cell."""
    from tabulate import tabulate

    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    rows = [{markdown_cell(str(key)): markdown_cell(value) if isinstance(value, str) else value
             for key, value in row.items()} for row in rows]
    return tabulate(rows, headers="keys", tablefmt="github", **options)

