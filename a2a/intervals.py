"""How sure a timing is: intervals over rounds, the ranking they support, and when to stop.

The unit is the round. Every round runs each entry in fresh processes, and the process is where the variance
lives: on one H100 (2026-11-25, WORKLOG "The judge's clock") v8's call time read 19.5-26.9 µs across fresh
processes and about ±1% within one, so per-step samples would understate the spread many times over (Kalibera and
Jones). Each round's value of an entry is the mean of its steps there; an entry's figure is the geometric mean of
its round values, with a Student-t interval on their logarithms. Why t on logs rather than a bootstrap: the values
are means of several steps (near normal on the log scale, where a ratio of times is a difference), rounds are few
(a bootstrap's percentile interval is too narrow below about 20 samples), and the geometric mean over shapes is a
mean of logs, so per-shape and geomean intervals come from one rule.
"""
from __future__ import annotations

import math
import statistics
from typing import NamedTuple, Optional, Sequence

CONFIDENCE = 0.95


class Interval(NamedTuple):
    center: float  # the geometric mean of the round values
    low: float
    high: float
    rounds: int

    @property
    def half_width(self) -> float:
        """Relative half-width: (high - low) / 2 / center (inf with fewer than two rounds)."""
        return (self.high - self.low) / 2 / self.center if self.rounds > 1 else math.inf

    def overlaps(self, other: "Interval") -> bool:
        return self.low <= other.high and other.low <= self.high


LOG_MAX = math.log(1e300)  # an interval's top past this is shown as 1e300: exp would overflow (red team 31)


def bounded_exp(x: float) -> float:
    """exp, with the log held within ±LOG_MAX: a rank's figures feed these logs (red teams 31, 32: a 1 ns figure
    beside an honest one overflowed an interval's and diff.py's ratio's exp, exit 114)."""
    return math.exp(max(-LOG_MAX, min(x, LOG_MAX)))


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The geometric mean of positive `values` and its Student-t interval on the log scale (NaNs dropped), each
    bound within bounded_exp's."""
    from scipy import stats

    logs = [math.log(v) for v in values if v == v and v > 0]
    n = len(logs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = sum(logs) / n
    if n == 1:
        return Interval(math.exp(mean), -math.inf, math.inf, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return Interval(bounded_exp(mean), bounded_exp(mean - half), bounded_exp(mean + half), n)


def geomean_by_round(per_shape: dict) -> dict:
    """{round: the geometric mean over shapes of an entry's values that round} from {shape: {round: value}}; only
    rounds in which every shape has a value."""
    shapes = list(per_shape)
    if not shapes:
        return {}
    rounds = set.intersection(*(set(k for k, v in per_shape[s].items() if v == v and v > 0) for s in shapes))
    # bounded: the mean of many logs of the largest double rounds past its log (red team 39: 114)
    return {r: bounded_exp(sum(math.log(per_shape[s][r]) for s in shapes) / len(shapes)) for r in sorted(rounds)}


def geomean_rounds(per_shape: dict) -> list:
    """Per round, in round order, the geometric mean over shapes (geomean_by_round)."""
    return list(geomean_by_round(per_shape).values())


def spread_parts(per_entry: dict) -> Optional[dict]:
    """Where the rounds' spread is, from {entry: {round: value}} (each entry's per-round geomean): the log of a value
    less its entry's mean is a part every entry of the round shares (the round's mean of them: the machine that
    round) plus a part of the entry's own pool (the rest). {"round": SD, "pool": SD, "entries": n, "rounds": n} over
    the rounds every entry has; None with fewer than two entries or rounds."""
    rounds = sorted(set.intersection(*(set(v) for v in per_entry.values()))) if per_entry else []
    if len(per_entry) < 2 or len(rounds) < 2:
        return None
    centred = []
    for values in per_entry.values():
        logs = [math.log(values[r]) for r in rounds]
        centred.append([x - statistics.fmean(logs) for x in logs])
    shared = [statistics.fmean(row[j] for row in centred) for j in range(len(rounds))]
    own = [row[j] - shared[j] for row in centred for j in range(len(rounds))]
    return {"round": statistics.stdev(shared), "pool": statistics.stdev(own), "entries": len(per_entry),
            "rounds": len(rounds)}


def visit_spread(per_entry: dict) -> Optional[float]:
    """The part of the spread that is each visit's own, from {entry: {case: {round: value}}}: the log of a visit's
    value less its (entry, case) mean and less its pool's mean over the shapes (the pool: an entry's round). Where it
    outweighs the pool's part, more visits per pool narrow a figure more than more pools do. None with no pool of two
    shapes."""
    own = []
    for per_case in per_entry.values():
        centred: dict = {}
        for values in per_case.values():
            logs = {r: math.log(v) for r, v in values.items() if v == v and v > 0}
            if len(logs) < 2:
                continue
            mean = statistics.fmean(logs.values())
            for r, x in logs.items():
                centred.setdefault(r, []).append(x - mean)
        for pool in centred.values():
            if len(pool) >= 2:
                own += [x - statistics.fmean(pool) for x in pool]
    return statistics.stdev(own) if len(own) >= 2 else None


def steps_spread(visits: list) -> Optional[float]:
    """The part of a visit's figure (the mean of its steps) that its own steps' noise explains, from each visit's
    step values: the median over visits of the SD of a visit's log steps over the root of their count. Set beside
    visit_spread: where it is the smaller by far, more steps per visit narrow nothing (one H200, world size 1,
    thirtieth session: 0.03 against 0.07). None without a visit of two steps."""
    own = []
    for steps in visits:
        logs = [math.log(v) for v in steps if v == v and v > 0]
        if len(logs) >= 2:
            own.append(statistics.stdev(logs) / math.sqrt(len(logs)))
    return statistics.median(own) if own else None


def ranks_with_ties(intervals: dict) -> dict:
    """{entry: (rank, [entries tied with it])}: an entry's rank is one more than the number of entries whose center
    lies below its own; entries whose intervals overlap are named as tied. NOTES: by center, not by how far an
    interval reaches down: one slow round widens an entry's interval both ways, and ranking by interval let it tie
    with the fastest entry, ahead of a steady one faster than it (red team 24)."""
    known = {name: iv for name, iv in intervals.items() if iv.center == iv.center}
    out = {}
    for name, iv in known.items():
        below = sum(1 for other, o in known.items() if other != name and o.center < iv.center)
        ties = sorted(other for other, o in known.items() if other != name and o.overlaps(iv))
        out[name] = (below + 1, ties)
    return out


class Target(NamedTuple):
    metric: str
    half_width: float  # the relative half-width at which this metric's interval is sure enough


def rounds_to_meet(found: Interval, target: float, confidence: float = CONFIDENCE, most: int = 10_000) -> Optional[int]:
    """How many rounds an interval like `found` (the same spread of round values) would take to reach a relative
    half-width of `target`: what a run's time cap would have to allow. None where `found` has no spread to go by."""
    from scipy import stats

    n = found.rounds
    if n < 2 or not math.isfinite(found.half_width):
        return None
    sd = math.asinh(found.half_width) * math.sqrt(n) / stats.t.ppf(0.5 + confidence / 2, n - 1)
    goal = math.asinh(target)
    # t's quantile exceeds the normal's, so no count below the normal's answer can do: start the search there
    first = max(2, math.ceil((stats.norm.ppf(0.5 + confidence / 2) * sd / goal) ** 2))
    return next((k for k in range(first, most + 1)
                 if stats.t.ppf(0.5 + confidence / 2, k - 1) * sd / math.sqrt(k) <= goal), None)


def unmet(intervals: dict, targets: Sequence[Target]) -> list:
    """The targets an entry's intervals ({metric: Interval}) do not meet yet, as (metric, half-width, target)."""
    return [(t.metric, intervals[t.metric].half_width, t.half_width) for t in targets
            if t.metric in intervals and not intervals[t.metric].half_width <= t.half_width]


def kendall_tau(first: Sequence[str], second: Sequence[str]) -> float:
    """Kendall's tau between two orders of the same entries (1: the same order, -1: reversed)."""
    from scipy import stats

    common = [name for name in first if name in second]
    if len(common) < 2:
        return math.nan
    return float(stats.kendalltau([first.index(n) for n in common], [second.index(n) for n in common]).statistic)


def pairwise_agreement(runs: Sequence[dict], min_gap: float = 0.10) -> tuple[int, int]:
    """Over pairs of entries whose medians across runs ({entry: value} per run) are more than `min_gap` apart:
    how many pairs every run puts in the same order, out of how many such pairs."""
    import statistics

    names = sorted(set.intersection(*(set(run) for run in runs))) if runs else []
    median = {name: statistics.median(run[name] for run in runs) for name in names}
    agree = total = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if abs(median[a] / median[b] - 1) <= min_gap:
                continue
            total += 1
            agree += all(run[a] > run[b] for run in runs) or all(run[a] < run[b] for run in runs)
    return agree, total
