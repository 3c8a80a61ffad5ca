"""Would another statistic of a visit's steps make the owner's step steadier between runs? (issue #49: one GPU,
world size 1, the ranking figure moved up to ±6.8% between back-to-back runs while held time moved ±0.4%.)

Reads saved clock runs (results.json, with each visit's `owner_steps_us`, kept since 609a6fb) and gives, per entry,
each run's geomean over the shapes and rounds of a visit's mean (the ranking figure), median, mean less its slowest
fifth and fastest step, and the spread of the first two runs around their middle (`--compare`'s "spread around
median" for two runs). Where every statistic spreads alike, the drift is in whole visits and pools, not in the
steps' tails, and the mean (the runner's statistic) stays.

    python -m a2a.cli visit-statistics RUN_FOLDER RUN_FOLDER [...]
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pandas as pd

import wire
from a2a import clock, rows

SLOWEST_LEFT_OUT = 0.2


def _less_slowest(steps: list) -> float:
    kept = sorted(steps)[:len(steps) - int(len(steps) * SLOWEST_LEFT_OUT)]
    return statistics.fmean(kept)


STATISTICS = {"mean (ranks)": statistics.fmean, "median": statistics.median,
              f"mean less slowest {SLOWEST_LEFT_OUT:.0%}": _less_slowest, "fastest": min}


class BadRun(Exception):
    """A folder that holds no saved run with its visits' steps."""


def _steps(sample) -> bool:
    """Whether a saved sample is a visit with its steps: entry, case, round and positive finite step times."""
    if not isinstance(sample, dict):
        return False
    steps = sample.get("owner_steps_us")
    return (isinstance(sample.get("entry"), str) and type(sample.get("case")) is int
            and type(sample.get("round")) is int and isinstance(steps, list) and len(steps) > 0
            and all(type(v) in (int, float) and 0 < v < math.inf for v in steps))


def run_figures(folder: Path) -> pd.DataFrame:
    """One row per (entry, statistic): the run's geomean of that statistic over shapes and rounds (rounds where an
    entry has every shape)."""
    try:  # bounded as --compare reads a saved run: the folder may come from elsewhere
        saved = json.loads(wire.read_regular_file(folder / "results.json", clock.SAVED_RUN_BYTES))
    except (OSError, ValueError, RecursionError) as error:
        raise BadRun(f"{wire.as_text(str(folder), 300)}: no readable results.json ({wire.as_text(error, 200)})")
    samples = saved.get("samples") if isinstance(saved, dict) else None
    visits = pd.DataFrame([s for s in samples if _steps(s)] if isinstance(samples, list) else [])
    if visits.empty:
        raise BadRun(f"{wire.as_text(str(folder), 300)}: no visit keeps its steps (owner_steps_us; kept since "
                     "609a6fb)")
    out = []
    shapes = visits["case"].nunique()
    for name, statistic in STATISTICS.items():
        visits["log"] = [math.log(statistic(steps)) for steps in visits["owner_steps_us"]]
        per_round = visits.groupby(["entry", "round"])["log"].agg(["mean", "count"])
        whole = per_round[per_round["count"] == shapes]
        for entry, logs in whole.groupby("entry")["mean"]:
            out.append({"entry": entry, "statistic": name, "µs": math.exp(logs.mean())})
    return pd.DataFrame(out)


def main(argv: list) -> int:
    if len(argv) < 2:
        print("usage: python -m a2a.cli visit-statistics RUN_FOLDER RUN_FOLDER [...] (two saved clock runs at least)",
              file=sys.stderr)
        return 113
    try:
        runs = [run_figures(Path(folder)).assign(run=i + 1) for i, folder in enumerate(argv)]
    except BadRun as error:
        print(f"visit-statistics: {error}", file=sys.stderr)
        return 113
    found = pd.concat(runs)
    found["statistic"] = pd.Categorical(found["statistic"], categories=list(STATISTICS))  # the ranking one first
    table = found.pivot_table(index=["entry", "statistic"], columns="run", values="µs", observed=True)
    table["spread of runs 1 and 2"] = [f"±{abs(a - b) / (a + b):.1%}" for a, b in zip(table[1], table[2])]
    table.columns = [f"run {c} µs" if isinstance(c, int) else c for c in table.columns]
    print(rows.github_table(table.reset_index().round(1).to_dict(orient="records")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
