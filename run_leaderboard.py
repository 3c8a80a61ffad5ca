#!/usr/bin/env python3
"""Versions x benchmark shapes, judged by the clock: rounds of fresh processes, one entry's pool at a time, every
figure with its 95% interval, a ranking that names its ties; with anchors and this machine's speed of light where
peers exist.

Timing is a2a/clock.py's: each round runs every entry (the versions; on GPUs the two floors, the empty submission
and the handshake; with peers on their own GPUs the NCCL and NVSHMEM anchors) in fresh rank processes on every
shape once, in an order shuffled with the round's recorded seed, until each entry's intervals meet their targets or
the time cap comes. Three figures per entry: the owner's step time, which ranks (the judge's clock from before it
places a fresh input to after it holds every rank's output: judge.py), and two of the rank's own figures, shown as
its word: the call time (events around the call on an idle stream) and the device time with the stream held (the
GPU's work alone). With peers, SOL here (a2a/sol.py) and the mark (SOL here + the handshake's call time) stand beside
each shape.

The problem is posed at 8 ranks. Where the timed run has fewer (a machine with fewer GPUs), the same run also passes
every version through the official tests at world size 8 with the ranks sharing the GPUs through MPS
(a2a/sharing.py): a check of the algorithm at the problem's size, never a timing (checks.csv).

    python run_leaderboard.py [--versions v1,v2] [--world-size N] [--no-anchors] [--no-problem-size]
                              [--time-cap S] [--min-rounds N] [--max-rounds N] [--steps N] [--seed S]
                              [--target held=0.02,call=0.05,owner=0.03] [--stability N] [--sol FILE] [--out results]
    python run_leaderboard.py --compare FOLDER FOLDER... [--out results]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

import eval as core
import wire
from births import OWNER_CPU_ENV, PIN_CPUS_ENV
from a2a import cli, clock, harness
from a2a import intervals as iv
from a2a import plan as planning
from a2a import rows as result_rows
from a2a import sharing

if TYPE_CHECKING:  # pandas at first use: its BLAS starts threads, and the judge covers before any (cli.run_cli)
    import pandas as pd

ROOT = planning.ROOT
PUBLISHED = ROOT / "reference" / "published.yml"
TIMING = ("clock: rounds of fresh processes per entry, one entry's pool alive at a time, entries and their shapes "
          "taken in orders shuffled per round (seeds in results.json), a fresh input in every step; the owner's step "
          "(ranks): the judge's clock from before it places the inputs to after it holds every rank's output (place, "
          "go, call, publish, done, copy out); call time (the rank's word): max over ranks of events around custom_kernel on an "
          "idle stream; held (the rank's word): the same events with the stream held by a sleep kernel until the call "
          "has queued its work; each figure the geometric mean over rounds of the round's step mean, 95% Student-t "
          "interval on logs over rounds; geomeans over shapes per round; SOL here: a2a/sol.py's model; mark: SOL here "
          "(dedup) + the handshake's call time")
# A version whose held device time is no more than the empty submission's plus this did no GPU work at all (one
# kernel of nothing adds 2.3-2.5 µs on an H100, issue #39): its time is void, whatever its origin.
KERNEL_FLOOR_US = 1.0


def speed_of_light_mi300x(task: dict) -> dict:
    """(num_experts, experts_per_token, hidden_dim, max_num_tokens) -> µs, from the table in task.yml."""
    table = {}
    for line in task.get("description", "").splitlines():
        numbers = line.split()
        if len(numbers) == 5 and all(re.fullmatch(r"[0-9.]+", n) for n in numbers):
            table[tuple(int(n) for n in numbers[:4])] = float(numbers[4])
    return table


def published_by_version() -> dict:
    """Version prefix (v1, v2, ...) -> (blog step, µs), published 8x MI300X leaderboard figures."""
    steps = yaml.safe_load(PUBLISHED.read_text())["blog_series"]["steps"]
    return {s["version"]: (s["step"], s["us"]) for s in steps if "version" in s}


def entries_of(plan: planning.RunPlan, anchors: bool) -> tuple[list, list]:
    """The entries a run times, and the lines saying what it skipped."""
    from a2a import anchors as anchor_runs

    entries = [clock.Entry(planning.label(path), "version", str(path)) for path in plan.versions]
    skipped = []
    with_peers = not plan.meta["shared_gpus"] and plan.world_size >= 2
    if plan.backend != "nccl":
        skipped.append("skipped the anchors, the floors (empty submission, handshake) and the SOL-here model: they "
                       f"time GPUs (this run is {plan.backend}, world size {plan.world_size})")
    else:
        names = tuple(anchor_runs.ANCHORS) if with_peers and anchors else anchor_runs.FLOORS
        entries += [clock.Entry(name, anchor_runs.KINDS.get(name, "anchor"), call=name) for name in names]
        if not with_peers:
            why = ("the ranks share GPUs, so no time here is the problem's and there is nothing to hold a version to"
                   if plan.meta["shared_gpus"] else f"they need peers on their own GPUs (world size {plan.world_size})")
            skipped.append(f"skipped the all-to-all anchors and the SOL-here model: {why}")
    return entries, skipped


def rows_of(run: clock.Run, plan: planning.RunPlan) -> list:
    """One row per (entry, case): the case, status, rounds and each metric's figure with its interval."""
    rows = []
    for entry in run.entries:
        for index, args in enumerate(plan.case_args):
            found = run.case_intervals(entry.name, index)
            failure = wire.as_text(run.failed.get(entry.name, ""))  # a rank's words: one escaped line in every file
            row = {"version": entry.name, "kind": entry.kind, **{k: args[k] for k in core.SPEC_KEYS},
                   "status": "fail" if failure else "pass" if found else "not run", "error": failure,
                   "rounds": max((i.rounds for i in found.values()), default=0), "stopped": run.stopped.get(entry.name, ""),
                   "hold": "sync fallback" if entry.name in run.sync_inside else "held"}
            for metric, columns in clock.COLUMNS.items():
                interval = found.get(metric)
                row.update(zip(columns, interval[:3] if interval else (None, None, None)))
            rows.append(row)
    return rows


def summaries(run: clock.Run) -> dict:
    """Per entry and metric: the geomean interval; the ranks with their ties by the judge's own figure alone
    (clock.RANKING): a rank's call and held figures are its word (red team 51: a forged 1 µs ranked first in a
    `rank (call)` column)."""
    out = {entry.name: {"kind": entry.kind, "intervals": run.entry_intervals(entry.name)} for entry in run.entries}
    found = {name: s["intervals"][clock.RANKING] for name, s in out.items() if clock.RANKING in s["intervals"]
             and name not in run.failed}
    for name, (rank, ties) in iv.ranks_with_ties(found).items():
        out[name]["ranks"] = {clock.RANKING: {"rank": rank, "ties": ties}}
    return out


def void_below_floor(frame: pd.DataFrame, run: clock.Run) -> None:
    """A version row whose held device time is no more than the empty submission's plus one kernel of nothing is
    void (it did no GPU work): status fail, with the reason."""
    if "held_mean_us" not in frame or not (frame["kind"] == "empty").any():
        return
    empty = frame[frame["kind"] == "empty"].set_index("shape")["held_mean_us"]
    for i, row in frame.iterrows():
        floor = empty.get(row["shape"])
        if row["kind"] == "version" and floor == floor and floor is not None and row["held_mean_us"] is not None \
                and row["held_mean_us"] <= floor + KERNEL_FLOOR_US:
            why = (f"void: its held device time {row['held_mean_us']:.2f} µs is within {KERNEL_FLOOR_US} µs of the "
                   f"empty submission's {floor:.2f} µs: no GPU work could have made its output")
            frame.loc[i, ["status", "error"]] = ["fail", why]
            run.failed.setdefault(row["version"], why)


def run(plan: planning.RunPlan, settings: clock.Settings, anchors: bool = True,
        progress=print) -> tuple[pd.DataFrame, dict, clock.Run | None]:
    """Every entry of the plan timed by the clock: one row per (entry, case), the run's meta, the clock's run."""
    import pandas as pd
    entries, skipped = entries_of(plan, anchors)
    meta = {**plan.meta_for("benchmark"), "timing": TIMING, "skipped": list(plan.skipped) + skipped}
    for line in meta["skipped"]:
        progress(line)
    if not entries:
        return pd.DataFrame(), meta, None
    timed = clock.time_entries(plan, entries, settings, progress)
    phases = {name: statistics.median(p[name] for p in timed.phases) for name in timed.phases[0]
              if name != "ready_s"} if timed.phases else {}
    meta.update(clock_seed=timed.seed, round_seeds=timed.round_seeds, round_starts=timed.starts, rounds=timed.rounds,
                wall_s=timed.wall_s,
                round_phases_median_s=phases, round_ready_s=[p.get("ready_s", {}) for p in timed.phases],
                throttled_visits=timed.throttled, clocks=clock.clocks_locked(timed.clocks), guards=timed.guards,
                spread=clock.spread(timed),
                settings={"steps": settings.steps, "warmup": settings.warmup, "min_rounds": settings.min_rounds,
                          "max_rounds": settings.max_rounds, "time_cap_s": settings.time_cap_s,
                          "targets": {t.metric: t.half_width for t in settings.targets},
                          "pinned_cpus": core.pinned_cpus(), "owner_cpu": core.owner_cpu()})
    frame = pd.DataFrame(rows_of(timed, plan))
    frame["shape"] = [result_rows.shape_label(**r) for r in frame[list(core.SPEC_KEYS)].to_dict("records")]
    frame["placement"] = meta["placement"]
    void_below_floor(frame, timed)
    given = speed_of_light_mi300x(plan.task)
    frame["sol_mi300x_us"] = [given.get((r["num_experts"], r["experts_per_token"], r["hidden_dim"],
                                         r["max_num_tokens"])) for r in frame.to_dict("records")]
    return frame, meta, timed


def speed_of_light_here(plan: planning.RunPlan, frame: pd.DataFrame, saved: dict | None = None,
                        progress=print) -> dict | None:
    """On GPUs with peers, this machine's speed of light (measured, or `saved`: sol.load's, read before the run),
    and the frame's columns that hold each shape to it (SOL here, the mark)."""
    from a2a import sol

    figures = None
    if not frame.empty and plan.backend == "nccl" and not plan.meta["shared_gpus"] and plan.world_size >= 2:
        progress("speed of light of this machine: " + ("a saved one (--sol)" if saved else "measuring"))
        figures = saved or sol.measure(plan.world_size, plan.meta_for("sol"))
        for args in plan.case_args:
            modelled = sol.model(sol.routing_of_case(args), args["hidden_dim"], figures)
            same = frame["shape"] == result_rows.shape_label(**args)
            frame.loc[same, "sol_routed_us"] = modelled["routed"]["total_us"]
            frame.loc[same, "sol_dedup_us"] = modelled["dedup"]["total_us"]
        frame["device_over_sol"] = frame["device_mean_us"] / frame["sol_dedup_us"]
        handshake = frame[(frame["kind"] == "handshake") & (frame["status"] == "pass")].set_index("shape")
        if not handshake.empty:
            frame["mark_us"] = frame["sol_dedup_us"] + frame["shape"].map(handshake["device_mean_us"])
            frame["device_over_mark"] = frame["device_mean_us"] / frame["mark_us"]
    return figures


def _cell(center, low, high) -> str:
    if center is None or center != center:
        return ""
    return f"{center:.1f} [{low:.1f}, {high:.1f}]"


def _ties(rank: dict, names: dict) -> str:
    return f"{rank['rank']}" + (f" (tied: {', '.join(names.get(t, t) for t in rank['ties'])})" if rank["ties"] else "")


def problem_size_checks(plan: planning.RunPlan, selector: str = "tests", progress=print,
                        record=None) -> tuple[pd.DataFrame, list]:
    """Every version of the plan through the official tests at the problem's world size (8) when the timed run had
    fewer ranks: on GPUs the ranks share them, on a CPU run they are gloo processes. Returns one row per
    (version, test) and the lines saying what was skipped and why; `record(version, rows)` gets each version's rows
    as soon as it is done."""
    import pandas as pd
    world_size = max(case["world_size"] for case in plan.task["tests"])
    if plan.world_size >= world_size or not plan.versions:
        return pd.DataFrame(), []
    if plan.backend == "nccl" and 0 < planning.machine_gpus() < world_size and (why := sharing.obtain_nccl(progress)):
        return pd.DataFrame(), [f"skipped the official tests at world size {world_size}: {why}"]
    try:
        shared = planning.make_plan(plan.versions, selector, world_size, plan.backend, timeout_s=plan.timeout_s,
                                    task_path=plan.task_path)
    except core.UserError as why:
        return pd.DataFrame(), [f"skipped the official tests at world size {world_size}: {why}"]
    rows = []
    with sharing.shared_ranks(shared.placement):  # one MPS daemon for every version (none on a CPU run)
        for path in shared.versions:
            result = harness.evaluate(shared, "test", version=path, progress=progress)
            found = [{"version": planning.label(path), "placement": result.placement, "world_size": world_size,
                      "test": case["index"], "spec": case["spec"], "status": case["status"], "error": case["error"]}
                     for case in result.cases]
            if not result.cases:
                found.append({"version": planning.label(path), "placement": result.placement, "world_size": world_size,
                              "test": None, "spec": "", "status": "not run",
                              "error": f"evaluation failed (exit {result.exit_code})"})
            if record:
                record(planning.label(path), pd.DataFrame(found))
            rows += found
    return pd.DataFrame(rows), []


def checks_table(checks: pd.DataFrame) -> str:
    """Per version: official tests passed at the problem's size on shared GPUs, and the first failure."""
    if checks.empty:
        return ""
    lines = []
    for version, rows in checks.groupby("version", sort=False):
        failed = rows[rows.status != "pass"]
        lines.append({"version": version, "tests passed": f"{(rows.status == 'pass').sum()} of {len(rows)}",
                      "first failure": "" if failed.empty else
                      f"test {failed.iloc[0]['test']}: {str(failed.iloc[0]['error'])[:100]}"})
    placement = checks["placement"].iloc[0]
    return "\n".join([f"World size {checks['world_size'].iloc[0]}, the problem's size: the official tests, {placement} "
                      "(a check of the algorithm at that size; no timing, nothing here is compared with the timed "
                      "rows above):", "", result_rows.github_table(lines), ""])


def _spread_line(meta: dict) -> list:
    """Where the rounds' spread is (clock.spread): the part the round's machine shares across entries, the part of
    each entry's own pool, born anew each round, and each visit's own (runs saved before it was kept show two); for
    the owner's step, how much of a visit's own its steps' noise explains (where kept)."""
    titles = (("owner", "owner's step"), ("call", "call"), ("held", "held"))
    parts = [(f"{title} {found['round']:.3f}, {found['pool']:.3f} and {found['visit']:.3f}"
              if found.get("visit") is not None else f"{title} {found['round']:.3f} and {found['pool']:.3f}")
             + (f" (its steps' own {found['steps']:.3f})" if found.get("steps") is not None else "")
             for metric, title in titles if (found := meta.get("spread", {}).get(metric))]
    settings = meta.get("settings", {})
    pinned = settings.get("pinned_cpus")  # absent in runs saved before it was recorded
    notes = [] if pinned is None else ["no rank pinned" if not pinned else f"ranks pinned, {PIN_CPUS_ENV}="
                                       f"{','.join(map(str, pinned))}: rank i of every pool on the i-th CPU"]
    if (owner := settings.get("owner_cpu")) is not None:
        notes.append(f"the owner on CPU {owner} while it visits, {OWNER_CPU_ENV}={owner}")
    where = f" ({'; '.join(notes)})" if notes else ""
    return [f"Spread of the entries' figures (SD of the log: the round's shared part, each pool's own in its geomean "
            f"over the shapes, and each visit's own): "
            f"{'; '.join(parts)}{where}"] if parts else []


def tables(frame: pd.DataFrame, meta: dict, summary: dict) -> str:
    published = published_by_version()
    cpu = meta["backend"] == "gloo"
    unit = "CPU µs" if cpu else "µs"
    out = [f"device: {meta['device']}, {meta['placement']}, backend {meta['backend']}, {meta['date']}, commit "
           f"{meta['commit']}",
           f"{meta.get('clocks', '')}; throttled visits left out: {meta.get('throttled_visits', 0)}; "
           f"{meta.get('rounds', 0)} rounds in {meta.get('wall_s', 0):.0f} s; run seed {meta.get('clock_seed')} "
           f"(each round's in results.json); boundary: {meta.get('guards', '')}", *_spread_line(meta), ""]
    names = {name: name for name in summary}
    order = sorted(summary, key=lambda n: (summary[n]["intervals"].get(clock.RANKING, iv.Interval(math.inf, 0, 0, 0)).center
                                           if summary[n]["intervals"] else math.inf))
    lines = []
    for name in order:
        found = summary[name]["intervals"]
        rows = frame[frame.version == name]
        ok = (rows.status == "pass").all()
        line = {"entry": name, "kind": summary[name]["kind"]}
        for metric, title in (("owner", f"owner's step {unit} [95%]"), ("call", f"call time {unit} [95%], the rank's"),
                              ("held", f"held device {unit} [95%], the rank's")):
            interval = found.get(metric)
            line[title] = _cell(*interval[:3]) if interval else ""
            if metric == clock.RANKING:  # a rank's own figures are shown, never ranked (red team 51)
                rank = summary[name].get("ranks", {}).get(metric)
                line[f"rank ({metric})"] = _ties(rank, names) if rank and ok else ""
            if metric == "owner" and any(clock.FLOOR_RATIO in s["intervals"] for s in summary.values()):
                ratio = found.get(clock.FLOOR_RATIO)
                line["owner's step / its round's floor [95%]"] = \
                    f"{ratio.center:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]" if ratio else ""
        line["rounds"] = int(rows["rounds"].max()) if "rounds" in rows else 0
        line["stopped"] = rows["stopped"].iloc[0] if "stopped" in rows else ""
        if (rows["hold"] == "sync fallback").any():
            line[f"held device {unit} [95%], the rank's"] += " (sync fallback: call time)"
        if "mark_us" in frame and found.get("call"):
            line["call / mark"] = f"{found['call'].center / result_rows.geomean(rows.mark_us):.1f}"
        step, pub = published.get(name.split("_")[0], ("", None)) if summary[name]["kind"] == "version" else ("", None)
        line["published MI300X µs (blog step)"] = f"{pub} ({step})" if pub else ""
        errors = "; ".join(sorted(set(rows.error.dropna().astype(str)) - {""}))
        line["all pass"] = "yes" if ok else "no: " + errors[:160]
        lines.append(line)
    out += ["Per entry, geometric means over the shapes with 95% intervals over rounds; entries whose intervals "
            "overlap are tied (rank: 1 + the entries whose geomean is lower):", "",
            result_rows.github_table(lines), ""]
    for metric, (column, low, high) in clock.COLUMNS.items():
        if column not in frame or frame[column].isna().all():
            continue
        cells = frame.assign(cell=[_cell(r[column], r[low], r[high]) for r in frame.to_dict("records")])
        detail = cells.pivot(index="shape", columns="version", values="cell")
        detail = detail.reindex(index=list(dict.fromkeys(frame["shape"])), columns=order)
        for extra, title in (("sol_dedup_us", "SOL here µs (dedup)"), ("mark_us", "mark µs"),
                             ("sol_mi300x_us", "SOL MI300X µs (given)")):
            if extra in frame:
                detail[title] = frame.groupby("shape", sort=False)[extra].median().map(
                    lambda v: "" if v != v else f"{v:.1f}")
        out += [f"{clock.METRIC_NAMES[metric]} per shape ({unit}, [95%]):", "",
                result_rows.github_table(detail.reset_index()), ""]
    given = frame.groupby("shape", sort=False)["sol_mi300x_us"].median().dropna()
    out += [f"SOL MI300X geomean (given with the task): {result_rows.geomean(given):.1f} µs. Published figures are "
            "8x MI300X leaderboard numbers, not measured here. Anchors move the routed volume twice and nothing else; "
            "the empty submission returns a preallocated output (the floor of a call); the handshake launches once, "
            "raises a flag at every peer and waits for every peer's (the floor of a correct call)."]
    if "mark_us" in frame:
        mark_gm = result_rows.geomean(frame.groupby("shape", sort=False)["mark_us"].median())
        out += [f"Mark geomean (SOL here, dedup, plus the handshake's call time, per shape): {mark_gm:.1f} µs."]
    out += meta["skipped"]
    return "\n".join(out)


def save_rows(files: cli.RunFiles, frame: pd.DataFrame, meta: dict) -> None:
    """results.csv, one entry at a time: the frame's rows with the run's meta."""
    if frame.empty:
        return
    plain = {k: str(v) for k, v in meta.items() if k not in ("skipped", "settings", "round_seeds", "round_starts")}
    for name, rows in frame.assign(**plain).groupby("version", sort=False):
        files.append_rows("results.csv", name, rows)


def results_json(meta: dict, figures, frame: pd.DataFrame, timed, summary: dict, checks: pd.DataFrame,
                 partial: str = "") -> str:
    """results.json's text; `partial`: why this is not yet the run's final one (a key the final one lacks)."""
    samples = timed.sample_rows() if timed else []
    entries = {name: {"kind": s["kind"], "ranks": s.get("ranks", {}),
                      **{m: i._asdict() for m, i in s["intervals"].items()}} for name, s in summary.items()}
    return json.dumps({**({"partial": partial} if partial else {}), "meta": meta, "sol": figures, "entries": entries,
                       "rows": frame.to_dict(orient="records"), "samples": samples,
                       "problem_size_checks": checks.to_dict(orient="records")}, indent=1, default=str)


def save_whole(files: cli.RunFiles, frame: pd.DataFrame, meta: dict, figures, timed, summary: dict,
               checks: pd.DataFrame) -> str:
    """The files made of every entry at once, each a step of its own: results.json (over the partial one), table.md
    (the report, returned; empty where it could not be made), sol.json and the pictures."""
    from a2a import plots, sol

    files.attempt("results.json", lambda: files.write_text("results.json", results_json(
        meta, figures, frame, timed, summary, checks)))

    def table_md() -> str:
        timed_part = tables(frame, meta, summary) if not frame.empty else "\n".join(meta["skipped"])
        report = "\n".join(filter(None, [timed_part, checks_table(checks)]))
        files.write_text("table.md", report + "\n")
        return report
    report = files.attempt("table.md", table_md) or ""
    if figures:
        files.attempt("sol.json", lambda: sol.save(figures, files.folder))
    if not frame.empty:
        published = {prefix: us for prefix, (_, us) in published_by_version().items()}
        files.attempt("leaderboard.png", lambda: plots.leaderboard_png(frame, meta, summary,
                                                                       files.folder / "leaderboard.png", published))
        files.attempt("leaderboard_shapes.png", lambda: plots.shapes_png(frame, meta,
                                                                         files.folder / "leaderboard_shapes.png"))
    return report


# What --compare and --stability set side by side: the clock's metrics, and the owner's step over its round's floor
AGREED = {**clock.METRIC_NAMES, clock.FLOOR_RATIO: "the owner's step over its round's empty submission (a ratio)"}


def agreement(header: list, results: list, names: list, last_reversed: bool) -> str:
    """How well runs agree: per metric and entry, the geomeans run by run, their spread around the median and the
    widest interval; per metric, Kendall's tau between every two runs' orders and the pairs more than 10% apart that
    every run orders alike. `results`: each run's {"entries": {name: {metric: interval}}}; `last_reversed`: the last
    run had the entries in reverse order (stability), and its geomean is set against the others' median."""
    report, table_rows = list(header) + [""], []
    for metric in AGREED:
        per_run = [{n: r["entries"][n][metric]["center"] for n in names if metric in r["entries"].get(n, {})}
                   for r in results]
        for name in names:
            values = [run[name] for run in per_run if name in run]
            if len(values) < 2:
                continue
            median = statistics.median(values)
            widths = [r["entries"][name][metric] for r in results if metric in r["entries"].get(name, {})]
            row = {"metric": AGREED[metric], "entry": name,
                   "geomeans (µs, or the ratio)": " / ".join(f"{v:.2f}" if metric != clock.FLOOR_RATIO else f"{v:.3f}"
                                                           for v in values),
                   "spread around median": f"-{100 * (1 - min(values) / median):.1f}% / "
                                           f"+{100 * (max(values) / median - 1):.1f}%"}
            if last_reversed:
                row["reverse run vs forward median"] = \
                    f"{100 * (values[-1] / statistics.median(values[:-1]) - 1):+.1f}%"
            row["widest ±"] = f"{100 * max((w['high'] - w['low']) / 2 / w['center'] for w in widths):.1f}%"
            table_rows.append(row)
        orders = [sorted(run, key=run.get) for run in per_run]
        taus = [iv.kendall_tau(orders[i], orders[j]) for i in range(len(orders)) for j in range(i + 1, len(orders))]
        agree, total = iv.pairwise_agreement([{n: run[n] for n in run if n in names} for run in per_run])
        if taus:
            report.append(f"{AGREED[metric]}: Kendall's tau between runs {min(taus):.2f}-{max(taus):.2f}; "
                          f"pairs more than 10% apart in the same order in every run: {agree} of {total}")
    return "\n".join(report + ["", result_rows.github_table(table_rows)])


SHOWN_META = ("device", "placement", "world_size", "commit")
SAVED_RUN_ENTRIES = 500  # entries --compare sets side by side: its agreement pairs every two (red team 32: 100 000
# entries, 17 MB, ran past 280 s); a run of every version, both floors and both anchors has 17
SAVED_RUN_CASES = 100  # shapes in a saved run's samples (red team 38: 8000 ran 312 s); a run of every test has 10
SAVED_RUN_ROUNDS = 10_000  # rounds of one entry in a saved run's samples, and --max-rounds' most (red team 39: 300 000)


def _floor_ratios(saved: dict) -> dict:
    """{entry: its owner's step over the floor's in the same round, as clock.floor_ratio gives it} from a saved
    run's samples, for the entries of a run saved before results.json kept the ratio; {} where it has no empty
    submission or its samples are not a run's (saved_run then checks what it reads). ValueError for samples of more
    shapes, entries or rounds than a compare takes (SAVED_RUN_CASES, SAVED_RUN_ENTRIES, SAVED_RUN_ROUNDS) or an
    owner's figure out of clock.SAVED_FIGURE_RANGE."""
    floors = [n for n, e in saved["entries"].items() if isinstance(e, dict) and e.get("kind") == "empty"]
    samples = saved.get("samples")
    if len(floors) != 1 or not isinstance(samples, list):
        return {}
    per_entry: dict = {}  # {entry: {case: {round: the owner's step}}}
    for sample in samples:
        if not (isinstance(sample, dict) and isinstance(sample.get("entry"), str)
                and all(type(sample.get(k)) is int and sample[k] >= 0 for k in ("case", "round"))):
            return {}
        owner = sample.get("owner")
        if owner is None:
            continue
        if not clock.saved_figure(owner):
            raise ValueError(f"a sample's owner figure {wire.as_text(owner, 40)} is not a number from "
                             f"{clock.SAVED_FIGURE_RANGE[0]:g} to {clock.SAVED_FIGURE_RANGE[1]:g}")
        per_entry.setdefault(sample["entry"], {}).setdefault(sample["case"], {})[sample["round"]] = float(owner)
    cases = sorted({case for per_case in per_entry.values() for case in per_case})
    rounds = max((len({r for values in per_case.values() for r in values}) for per_case in per_entry.values()),
                 default=0)
    for what, count, most in (("shapes", len(cases), SAVED_RUN_CASES), ("entries", len(per_entry), SAVED_RUN_ENTRIES),
                              ("rounds of one entry", rounds, SAVED_RUN_ROUNDS)):
        if count > most:
            raise ValueError(f"samples of {count} {what}, more than the {most} a compare takes")

    def by_round(name: str) -> dict:
        return iv.geomean_by_round({case: per_entry.get(name, {}).get(case, {}) for case in cases})
    # the floor's rounds once for every entry (red team 39: once per entry, 300 000 entries ran for a day)
    base = by_round(floors[0])
    found = {name: clock.ratio_by_round(by_round(name), base) for name in saved["entries"] if name != floors[0]}
    return {name: ratio for name, ratio in found.items() if ratio is not None}


def saved_run(folder) -> dict:
    """A saved run's figures for --compare, from its results.json: {"entries": {name: {metric: {"center", "low",
    "high"}}}, "meta": {SHOWN_META: text}}, every name and text escaped. A figure without a positive center (an entry
    that gave none) is left out; one whose center is out of clock.SAVED_FIGURE_RANGE, and anything else not of a run's
    shape, is bad input. NOTES: the folder may come from elsewhere (red team 31: a FIFO hung the read, a link to
    /dev/zero ran memory out, a zero or string center, deep nesting or a 400-digit number ended it with 114)."""
    def refused(why: str) -> core.UserError:
        return core.UserError(f"--compare {wire.as_text(str(folder), 300)}: {why}")

    try:
        saved = json.loads(wire.read_regular_file(Path(folder) / "results.json", clock.SAVED_RUN_BYTES))
    except (OSError, ValueError, RecursionError) as error:  # NotRegular and JSON's errors are ValueErrors
        raise refused(f"no readable results.json ({wire.as_text(error, 200)})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("entries"), dict) \
            or not isinstance(saved.get("meta"), dict):
        raise refused("not a leaderboard run's results.json")
    if saved.get("partial"):
        raise refused(f"a partial results.json ({wire.as_text(saved['partial'])})")
    if len(saved["entries"]) > SAVED_RUN_ENTRIES:
        raise refused(f"{len(saved['entries'])} entries, more than the {SAVED_RUN_ENTRIES} a compare takes")

    def real(value) -> bool:
        try:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == float(value)
        except OverflowError:
            return False

    try:
        derived = _floor_ratios(saved)
    except ValueError as error:
        raise refused(str(error)) from None
    entries = {}
    for name, metrics in saved["entries"].items():
        if not isinstance(metrics, dict):
            raise refused(f"entry {wire.as_text(name, 100)} is not a run's entry")
        metrics = {clock.FLOOR_RATIO: derived[name]._asdict()} | metrics if name in derived else metrics
        kept = {}
        for metric in AGREED:
            figure = metrics.get(metric)
            if figure is None:
                continue
            if not isinstance(figure, dict) or not all(real(figure.get(k)) and math.isfinite(figure[k])
                                                       for k in ("center", "low", "high")):  # red team 53: inf%
                raise refused(f"entry {wire.as_text(name, 100)}'s {metric} is not an interval of numbers")
            if float(figure["center"]) <= 0:  # no figure
                continue
            if not clock.saved_figure(figure["center"]):
                raise refused(f"entry {wire.as_text(name, 100)}'s {metric} center {wire.as_text(figure['center'], 40)} "
                              f"is not from {clock.SAVED_FIGURE_RANGE[0]:g} to {clock.SAVED_FIGURE_RANGE[1]:g}")
            kept[metric] = {k: float(figure[k]) for k in ("center", "low", "high")}
        if kept:
            if (shown := wire.as_text(name, 200)) in entries:  # red team 53: "v1\n" and "v1\\n", merged silently
                raise refused(f"two entries shown as {shown}: name them apart")
            entries[shown] = kept
    return {"entries": entries, "meta": {key: wire.as_text(saved["meta"].get(key), 200) for key in SHOWN_META}}


def compare(folders: list, out: Path) -> int:
    """Saved runs set side by side (e.g. two back-to-back `make leaderboard`s): `agreement` over the entries every
    run timed, from each folder's results.json (saved_run). Bad input (a folder without a final results.json, fewer
    than two) is refused before anything is written. The compare's own folder is named from this machine's date and
    checkout, not from what it read."""
    if len(folders) < 2:
        raise core.UserError(f"--compare needs at least two saved runs, not {len(folders)}")
    runs = [saved_run(folder) for folder in folders]
    names = [n for n in runs[0]["entries"] if all(n in r["entries"] for r in runs)]
    if not names:
        raise core.UserError("--compare: no entry was timed in every run")
    differ = [key for key in SHOWN_META if len({r["meta"][key] for r in runs}) > 1]
    header = [f"{len(runs)} saved runs compared: " + "; ".join(
        f"{wire.as_text(Path(f).name, 200)} ({r['meta']['device']}, {r['meta']['placement']}, commit "
        f"{r['meta']['commit']})" for f, r in zip(folders, runs))]
    if differ:
        header.append(f"the runs differ in {', '.join(differ)}: their figures are not one machine's run to run")
    text = agreement(header, runs, names, False)
    print(text)
    devices, worlds = {r["meta"]["device"] for r in runs}, {r["meta"]["world_size"] for r in runs}
    meta = {"date": datetime.date.today().isoformat(), "device": devices.pop() if len(devices) == 1 else "several",
            "ranks": "ws-mixed" if len(worlds) > 1 else f"ws{w}" if (w := worlds.pop()).isdigit() else "ws-unknown",
            "mode": "compare", "commit": planning.commit(),
            "compared": [wire.as_text(str(f), 300) for f in folders], "runs_meta": [r["meta"] for r in runs]}

    def write(folder: Path) -> None:
        (folder / "table.md").write_text(text + "\n")
        (folder / "results.json").write_text(json.dumps({"meta": meta, "runs": meta["compared"]}, indent=1))

    cli.save_run(out, meta, write)
    return 0


def stability(plan: planning.RunPlan, settings: clock.Settings, runs: int, anchors: bool, out: Path,
              progress=print) -> int:
    """`runs` back-to-back clock runs and one more with the entries in reverse order: each entry's spread of
    geomeans across them, and how well they agree on the order (Kendall's tau per pair of runs, and the pairs more
    than 10% apart that every run orders alike)."""
    import dataclasses

    entries, _ = entries_of(plan, anchors)
    names = [e.name for e in entries]
    results = []
    for number in range(runs + 1):
        reverse = number == runs
        order = tuple(reversed(names)) if reverse else tuple(names)
        progress(f"stability run {number + 1} of {runs + 1}" + (" (entries in reverse order)" if reverse else ""))
        timed = clock.time_entries(plan, entries, dataclasses.replace(settings, order=order, seed=None), progress)
        results.append({"reverse": reverse, "seed": timed.seed, "rounds": timed.rounds, "wall_s": timed.wall_s,
                        "failed": timed.failed, "throttled": timed.throttled,
                        "clocks": clock.clocks_locked(timed.clocks), "spread": clock.spread(timed),
                        "entries": {n: {m: i._asdict() for m, i in timed.entry_intervals(n).items()} for n in names},
                        "samples": timed.sample_rows()})
    meta = {**plan.meta_for("stability"), "runs": runs, "timing": TIMING}
    text = agreement([f"device: {meta['device']}, {meta['placement']}, {meta['date']}, commit {meta['commit']}; {runs} "
                      f"back-to-back clock runs and one with the entries in reverse order"], results, names, True)
    print(text)

    def write(folder: Path) -> None:
        (folder / "table.md").write_text(text + "\n")
        (folder / "results.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1, default=str))

    cli.save_run(out, meta, write)
    return cli.verdict(not any(r["failed"] for r in results))


TIME_CAP_MAX_S = 7 * 86400.0  # a week of timing: past it a cap is none (inf is the clock's own "no cap")
TARGET_MIN = 1e-4  # a half-width of 0.01%: millions of rounds at the spreads measured here


def _settings(args) -> clock.Settings:
    targets = list(clock.DEFAULT_TARGETS)
    if args.target:
        asked = {}
        for part in args.target.split(","):
            name, _, value = part.partition("=")
            if name.strip() in asked:  # red team 69: the last of two took effect unsaid
                raise core.UserError(f"--target '{args.target}': {name.strip()} is given twice")
            try:
                asked[name.strip()] = float(value)
            except ValueError:
                raise core.UserError(f"--target '{part}': expected METRIC=FRACTION, e.g. held=0.02") from None
            # a fraction under TARGET_MIN asks rounds past any count (red team 40: 1e-320, an infinite count, 114)
            if name.strip() not in clock.METRICS or not TARGET_MIN <= asked[name.strip()] < 1:
                raise core.UserError(f"--target '{part}': the metric is one of {', '.join(clock.METRICS)} and the "
                                     f"fraction from {TARGET_MIN:g} to below 1")
        targets = [iv.Target(t.metric, asked.get(t.metric, t.half_width)) for t in targets]
    for name, value, low in (("--steps", args.steps, 1), ("--min-rounds", args.min_rounds, 2),
                             ("--max-rounds", args.max_rounds, args.min_rounds)):
        if value < low:
            raise core.UserError(f"{name} must be at least {low}, not {value}")
    if args.steps > clock.STEPS_MAX:  # every step's inputs are made before a round (red team 40: 1e23 filled memory)
        raise core.UserError(f"--steps must be at most {clock.STEPS_MAX}, not {args.steps}")
    if args.max_rounds > SAVED_RUN_ROUNDS:  # a run --compare could not read back
        raise core.UserError(f"--max-rounds must be at most {SAVED_RUN_ROUNDS}, not {args.max_rounds}")
    if not 0 < args.time_cap <= TIME_CAP_MAX_S:  # NaN too (red team 39: 114 after the first round, nothing saved)
        raise core.UserError(f"--time-cap must be above 0 and at most {TIME_CAP_MAX_S:g} s, not {args.time_cap:g}")
    if args.seed is not None and not 0 <= args.seed <= core.SEED_MAX:
        raise core.UserError(f"--seed must be from 0 to {core.SEED_MAX}, not {args.seed}")
    return clock.Settings(steps=args.steps, min_rounds=args.min_rounds, max_rounds=args.max_rounds,
                          time_cap_s=args.time_cap, targets=tuple(targets), seed=args.seed)


def main(argv=None) -> int:
    import pandas as pd
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_options(parser, "versions", "cases", "world-size", "backend", "timeout", "seed", "out",
                    seed={"help": "the run's seed for the rounds' orders (default: drawn, recorded)"})
    parser.add_argument("--no-anchors", action="store_true", help="skip the NCCL/NVSHMEM anchors")
    parser.add_argument("--no-problem-size", action="store_true",
                        help="skip the official tests at world size 8 on shared GPUs (run when the timed run has "
                             "fewer ranks)")
    parser.add_argument("--problem-size-cases", default="tests", help=argparse.SUPPRESS)  # tests: a shorter check
    parser.add_argument("--time-cap", type=float, default=clock.Settings.time_cap_s,
                        help="seconds of timing after the first round, shared out evenly: an entry stops once its "
                        "own time would pass its share")
    parser.add_argument("--min-rounds", type=int, default=clock.Settings.min_rounds)
    parser.add_argument("--max-rounds", type=int, default=clock.Settings.max_rounds)
    parser.add_argument("--steps", type=int, default=clock.Settings.steps, help="steps per visit and kind")
    parser.add_argument("--target", help="relative half-widths at which an entry stops, e.g. held=0.02,owner=0.03")
    parser.add_argument("--stability", type=int, metavar="N",
                        help="N back-to-back runs plus one in reverse order, and how well they agree")
    parser.add_argument("--sol", type=Path, help="reuse a saved sol.json instead of measuring")
    parser.add_argument("--compare", nargs="+", metavar="FOLDER",
                        help="set two or more saved runs side by side (their results.json), time nothing")
    args = parser.parse_args(argv)
    if args.compare:
        cli.writable(args.out)
        return compare(args.compare, args.out)
    if args.versions is None:
        versions = planning.list_versions()
    else:
        versions = [name.strip() for name in args.versions.split(",") if name.strip()]
        if not versions:
            raise core.UserError(f"--versions '{args.versions}' names no version")
    settings = _settings(args)
    if args.stability is not None and args.stability < 2:
        raise core.UserError(f"--stability needs at least 2 runs, not {args.stability}")
    plan = planning.make_plan(versions, args.cases, args.world_size, args.backend, timeout_s=args.timeout,
                              gpu_only="skip", distinct=True)
    cli.one_entry_per_writable(plan.versions)
    cli.writable(args.out)
    from a2a import sol

    saved_sol = sol.load(args.sol, plan.world_size) if args.sol else None  # bad input before any work
    if args.stability:
        return stability(plan, settings, args.stability, not args.no_anchors, args.out)
    frame, meta, timed = run(plan, settings, anchors=not args.no_anchors)
    files = cli.RunFiles(args.out, meta)
    summary = summaries(timed) if timed else {}
    if timed:  # the clock's measurements, saved before anything else runs
        files.attempt("the partial results.json", lambda: files.write_text("results.json", results_json(
            meta, None, frame, timed, summary, pd.DataFrame(), partial="saved when the clock ended; the speed of "
            "light, the world-size-8 checks and the tables were still to come")))
    figures = speed_of_light_here(plan, frame, saved_sol)
    save_rows(files, frame, meta)
    checks, skipped = (pd.DataFrame(), []) if args.no_problem_size else problem_size_checks(
        plan, args.problem_size_cases, record=lambda version, rows: files.append_rows("checks.csv", version, rows))
    meta["skipped"] += skipped
    if frame.empty and checks.empty:
        print("\n".join(["nothing ran on this machine"] + meta["skipped"]))
        return 0
    print(save_whole(files, frame, meta, figures, timed, summary, checks))
    print(f"\nsaved {files.folder}")
    for problem in files.problems:
        print(f"run_leaderboard.py: {problem}", file=sys.stderr)
    if files.problems:
        return core.EXIT_CRASH
    versions_ok = frame.empty or frame[frame.kind == "version"].status.eq("pass").all()
    checks_ok = checks.empty or checks.status.eq("pass").all()
    return 0 if versions_ok and checks_ok else core.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
