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
from typing import TYPE_CHECKING

import wire
from a2a import cli, clock, rows
from eval import UserError

if TYPE_CHECKING:  # pandas at first use: its BLAS starts threads, and the judge covers before any (cli.run_cli)
    import pandas as pd

SLOWEST_LEFT_OUT = 0.2
SKIPPED_SHOWN = 10  # names of the entries left out, on their line


def _less_slowest(steps: list) -> float:
    kept = sorted(steps)[:len(steps) - int(len(steps) * SLOWEST_LEFT_OUT)]
    return statistics.fmean(kept)


STATISTICS = {"mean (ranks)": statistics.fmean, "median": statistics.median,
              f"mean less slowest {SLOWEST_LEFT_OUT:.0%}": _less_slowest, "fastest": min}


def _steps(sample, where: str) -> bool:
    """Whether a saved sample is a visit with its steps (entry, case, round and a list of step times); UserError
    for steps out of clock.SAVED_FIGURE_RANGE (red team 39: two of the largest double overflowed a mean, a
    traceback)."""
    if not isinstance(sample, dict):
        return False
    steps = sample.get("owner_steps_us")
    if not (isinstance(sample.get("entry"), str) and type(sample.get("case")) is int
            and type(sample.get("round")) is int and isinstance(steps, list) and len(steps) > 0):
        return False
    if bad := [v for v in steps if not clock.saved_figure(v)]:
        low, high = clock.SAVED_FIGURE_RANGE
        raise UserError(f"{where}: a visit's step {wire.as_text(bad[0], 40)} is not a time from {low:g} to {high:g} µs")
    return True


def run_figures(folder: Path) -> pd.DataFrame:
    """One row per (entry, statistic): the run's geomean of that statistic over shapes and rounds (rounds where an
    entry has every shape); UserError for a folder with no such round of any entry."""
    import pandas as pd
    where = wire.as_text(str(folder), 300)
    try:  # bounded as --compare reads a saved run: the folder may come from elsewhere
        saved = json.loads(wire.read_regular_file(folder / "results.json", clock.SAVED_RUN_BYTES))
    except (OSError, ValueError, RecursionError) as error:
        raise UserError(f"{where}: no readable results.json ({wire.as_text(error, 200)})") from None
    samples = saved.get("samples") if isinstance(saved, dict) else None
    visits = pd.DataFrame([s for s in samples if _steps(s, where)] if isinstance(samples, list) else [])
    if visits.empty:
        raise UserError(f"{where}: no visit keeps its steps (owner_steps_us; kept since 609a6fb)")
    out = []
    shapes = visits["case"].nunique()
    for name, statistic in STATISTICS.items():
        visits["log"] = [math.log(statistic(steps)) for steps in visits["owner_steps_us"]]
        per_round = visits.groupby(["entry", "round"]).agg(mean=("log", "mean"), count=("log", "count"),
                                                           cases=("case", "nunique"))
        whole = per_round[(per_round["count"] == shapes) & (per_round["cases"] == shapes)]  # red team 53: a case twice
        for entry, logs in whole.groupby("entry")["mean"]:
            out.append({"entry": entry, "statistic": name, "µs": math.exp(logs.mean())})
    if not out:
        raise UserError(f"{where}: no entry has a round with a visit of each of its {shapes} shapes")
    return pd.DataFrame(out)


def main(argv=None) -> int:
    import pandas as pd
    folders = sys.argv[1:] if argv is None else argv
    if len(folders) < 2:
        raise UserError("usage: python -m a2a.cli visit-statistics RUN_FOLDER RUN_FOLDER [...] (two saved clock runs "
                        "at least)")
    runs = [run_figures(Path(folder)).assign(run=i + 1) for i, folder in enumerate(folders)]
    every = set.intersection(*(set(run["entry"]) for run in runs))
    if not every:
        raise UserError("no entry has a round of every shape in every run")
    found = pd.concat(runs)
    skipped = sorted(set(found["entry"]) - every)
    found = found[found["entry"].isin(every)].copy()
    found["statistic"] = pd.Categorical(found["statistic"], categories=list(STATISTICS))  # the ranking one first
    table = found.pivot_table(index=["entry", "statistic"], columns="run", values="µs", observed=True)
    table["spread of runs 1 and 2"] = [f"±{abs(a - b) / (a + b):.1%}" for a, b in zip(table[1], table[2])]
    table.columns = [f"run {c} µs" if isinstance(c, int) else c for c in table.columns]
    shown = table.reset_index().round(1)
    shown["entry"] = [wire.as_text(name, 200) for name in shown["entry"]]  # a file's words, escaped (red team 39)
    print(rows.github_table(shown.to_dict(orient="records")))
    if skipped:
        more = f" and {len(skipped) - SKIPPED_SHOWN} more" if len(skipped) > SKIPPED_SHOWN else ""
        print(f"left out, without a round of every shape in every run: "
              f"{', '.join(wire.as_text(name, 100) for name in skipped[:SKIPPED_SHOWN])}{more}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
