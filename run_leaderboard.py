#!/usr/bin/env python3
"""Versions x benchmark shapes, with anchors and this machine's speed of light, in one run on one machine.

Runs the evaluator on each version; on GPUs also times the two floors at every world size (the empty submission
and the handshake: one launch, a flag to and from every peer), and with peers on their own GPUs the anchors (NCCL
and NVSHMEM all-to-alls of each case's routed volume; a2a/anchors.py) and this machine's speed-of-light figures
(a2a/sol.py), which the model turns into a per-case "SOL here" from the case's own routing; SOL here plus the
handshake's device-side time is the case's mark (SOL here plus the empty submission's, the mark before it, stays
beside it for one release). Prints markdown tables (per entry: geomeans of mean, p50 and p90,
device-side and leaderboard-style, floor, device / SOL here, device / mark, the published MI300X figure of each blog
step; per shape: means with floor, SOL here, mark and the MI300X speed of light given with the task, then mean / p50 /
p90) and saves them with CSV, JSON, sol.json and two PNGs (leaderboard.png at a glance, leaderboard_shapes.png per
shape) under results/<date>_<device>_ws<N>_<mode>_<commit>/.

The problem is posed at 8 ranks. Where the timed run has fewer (a machine with fewer GPUs), the same run also passes
every version through the official tests at world size 8 with the ranks sharing the GPUs through MPS
(a2a/sharing.py): a check of the algorithm at the problem's size, never a timing. Its table stands apart and its
rows are saved beside the timed ones (checks.csv).

    python run_leaderboard.py [--versions v1,v2] [--mode benchmark|leaderboard] [--world-size N] [--no-anchors]
                              [--no-problem-size] [--sol results/.../sol.json] [--out results]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd
import yaml
from tabulate import tabulate

import eval as core
from a2a import cli, harness
from a2a import plan as planning
from a2a import rows as result_rows
from a2a import sharing

ROOT = planning.ROOT
PUBLISHED = ROOT / "reference" / "published.yml"
TIMING = ("leaderboard-style: rank-0 host clock around clone+custom_kernel+sync+barrier, L2 cleared before each run; "
          "device: max over ranks of per-rank CUDA events around custom_kernel; floor: the same step with no "
          "custom_kernel; SOL here: a2a/sol.py's model on the case's routing with this machine's measured figures; "
          "mark: SOL here (dedup) + the handshake's device-side mean (old mark: + the empty submission's); "
          "p50/p90: quantiles of the per-run times")


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


def run(plan: planning.RunPlan, mode: str, anchors: bool = True, sol_path: Path | None = None,
        progress=print) -> tuple[pd.DataFrame, dict, dict | None]:
    """Every version of the plan on its cases; on GPUs the anchors and this machine's speed of light as well."""
    from a2a import anchors as anchor_runs
    from a2a import sol

    meta = {**plan.meta_for(mode), "timing": TIMING, "skipped": list(plan.skipped)}
    for line in plan.skipped:
        progress(line)
    rows = []
    for path in plan.versions:
        result = harness.evaluate(plan, mode, version=path, progress=progress)
        for case in result.cases:
            args = case["args"]
            rows.append({"version": planning.label(path), "kind": "version", **{k: args[k] for k in core.SPEC_KEYS},
                         **{k: case.get(k) for k in result_rows.ROW_FIELDS}, "error": case.get("error", "")})
    figures = None
    with_peers = not plan.meta["shared_gpus"] and plan.world_size >= 2  # each rank on a GPU of its own
    if plan.backend != "nccl":
        meta["skipped"].append("skipped the anchors, the floors (empty submission, handshake) and the SOL-here "
                               f"model: they time GPUs (this run is {plan.backend}, world size {plan.world_size})")
        progress(meta["skipped"][-1])
    else:
        # The floors need no peer on its own GPU: they run at every world size (apart, like the run, when shared).
        entries = tuple(anchor_runs.ANCHORS) if with_peers and anchors else anchor_runs.FLOORS
        rows += anchor_runs.run(plan.case_args, plan.world_size, progress=progress, entries=entries)
        if with_peers:
            progress("speed of light of this machine: " + (f"from {sol_path}" if sol_path else "measuring"))
            figures = sol.load(sol_path) if sol_path else sol.measure(plan.world_size, plan.meta_for("sol"))
        else:
            why = ("the ranks share GPUs, so no time here is the problem's and there is nothing to hold a version to"
                   if plan.meta["shared_gpus"] else f"they need peers on their own GPUs (world size {plan.world_size})")
            meta["skipped"].append(f"skipped the all-to-all anchors and the SOL-here model: {why}")
            progress(meta["skipped"][-1])
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, meta, figures
    frame["shape"] = [result_rows.shape_label(**r) for r in frame[list(core.SPEC_KEYS)].to_dict("records")]
    frame["placement"] = meta["placement"]  # one placement per timed run: every row says where it ran
    given = speed_of_light_mi300x(plan.task)
    frame["sol_mi300x_us"] = [given.get((r["num_experts"], r["experts_per_token"], r["hidden_dim"],
                                         r["max_num_tokens"])) for r in frame.to_dict("records")]
    if figures:
        for args in plan.case_args:
            modelled = sol.model(sol.routing_of_case(args), args["hidden_dim"], figures)
            same = frame["shape"] == result_rows.shape_label(**args)
            frame.loc[same, "sol_routed_us"] = modelled["routed"]["total_us"]
            frame.loc[same, "sol_dedup_us"] = modelled["dedup"]["total_us"]
        frame["device_over_sol"] = frame["device_mean_us"] / frame["sol_dedup_us"]
        floor = {kind: frame[(frame["kind"] == kind) & (frame["status"] == "pass")].set_index("shape")["device_mean_us"]
                 for kind in ("handshake", "empty")}
        if not floor["handshake"].empty:
            frame["mark_us"] = frame["sol_dedup_us"] + frame["shape"].map(floor["handshake"])
            frame["device_over_mark"] = frame["device_mean_us"] / frame["mark_us"]
        if not floor["empty"].empty:  # the mark before the handshake row, kept beside it for one release
            frame["mark_empty_us"] = frame["sol_dedup_us"] + frame["shape"].map(floor["empty"])
    return frame, meta, figures


def problem_size_checks(plan: planning.RunPlan, selector: str = "tests", progress=print) -> tuple[pd.DataFrame, list]:
    """Every version of the plan through the official tests at the problem's world size (8) when the timed run had
    fewer ranks: on GPUs the ranks share them, on a CPU run they are gloo processes. Returns one row per
    (version, test) and the lines saying what was skipped and why."""
    world_size = max(case["world_size"] for case in plan.task["tests"])
    if plan.world_size >= world_size or not plan.versions:
        return pd.DataFrame(), []
    try:
        shared = planning.make_plan(plan.versions, selector, world_size, plan.backend, timeout_s=plan.timeout_s,
                                    task_path=plan.task_path)
    except core.UserError as why:
        return pd.DataFrame(), [f"skipped the official tests at world size {world_size}: {why}"]
    rows = []
    with sharing.shared_ranks(shared.placement):  # one MPS daemon for every version (none on a CPU run)
        for path in shared.versions:
            result = harness.evaluate(shared, "test", version=path, progress=progress)
            rows += [{"version": planning.label(path), "placement": result.placement, "world_size": world_size,
                      "test": case["index"], "spec": case["spec"], "status": case["status"], "error": case["error"]}
                     for case in result.cases]
            if not result.cases:
                rows.append({"version": planning.label(path), "placement": result.placement, "world_size": world_size,
                             "test": None, "spec": "", "status": "not run",
                             "error": f"evaluation failed (exit {result.exit_code})"})
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
                      "rows above):", "", tabulate(lines, headers="keys", tablefmt="github"), ""])


def _quantiles(frame: pd.DataFrame, prefix: str) -> pd.Series:
    """Per row "mean / p50 / p90" of one timing (prefix "" or "device_"), as text."""
    def cell(row) -> str:
        values = [row.get(f"{prefix}{stat}_us") for stat in ("mean", "p50", "p90")]
        if all(v is None or v != v for v in values):
            return ""
        return " / ".join("" if v is None or v != v else f"{v:.1f}" for v in values)
    return frame.apply(cell, axis=1)


def tables(frame: pd.DataFrame, meta: dict) -> str:
    published = published_by_version()
    entries = list(dict.fromkeys(frame["version"]))
    cpu = meta["backend"] == "gloo"
    unit = "CPU µs" if cpu else "µs"
    header = (f"device: {meta['device']}, {meta['placement']}, backend {meta['backend']}, mode {meta['mode']}, "
              f"{meta['date']}, commit {meta['commit']}")
    out = [header, ""]
    summary, first = [], None
    for entry in entries:
        rows = frame[frame.version == entry]
        kind = rows["kind"].iloc[0]
        ok = (rows.status == "pass").all()
        gm = {col: result_rows.geomean(rows[col]) if ok and col in rows else float("nan")
              for col in ("mean_us", "p50_us", "p90_us", "device_mean_us", "device_p50_us", "device_p90_us")}
        if first is None and kind == "version":
            first = gm["device_mean_us"]
        step, pub = published.get(entry.split("_")[0], ("", None)) if kind == "version" else ("", None)
        line = {"entry": entry, "kind": kind,
                f"device {unit} mean": gm["device_mean_us"], "device p50": gm["device_p50_us"],
                "device p90": gm["device_p90_us"], f"leaderboard-style {unit} mean": gm["mean_us"],
                "leaderboard-style p50": gm["p50_us"], "leaderboard-style p90": gm["p90_us"],
                f"floor {unit}": result_rows.geomean(rows.floor_mean_us)}
        if "sol_dedup_us" in frame:
            line["device / SOL here"] = gm["device_mean_us"] / result_rows.geomean(rows.sol_dedup_us)
        if "mark_us" in frame:
            line["device / mark"] = gm["device_mean_us"] / result_rows.geomean(rows.mark_us)
        if "mark_empty_us" in frame:
            line["device / old mark"] = gm["device_mean_us"] / result_rows.geomean(rows.mark_empty_us)
        if first:
            line["device speedup vs first"] = first / gm["device_mean_us"]
        line["published MI300X µs (blog step)"] = f"{pub} ({step})" if pub else ""
        line["all pass"] = "yes" if ok else "no: " + "; ".join(sorted(set(rows.error.dropna().astype(str)) - {""}))[:120]
        summary.append(line)
    out += ["Per entry, geometric means over the shapes run (mean, p50, p90 of the per-shape statistics):", "",
            tabulate(summary, headers="keys", tablefmt="github", floatfmt=".1f"), ""]

    extra_cols = [c for c in ("floor_mean_us", "sol_routed_us", "sol_dedup_us", "mark_us", "mark_empty_us",
                              "sol_mi300x_us") if c in frame]
    names = {"floor_mean_us": "floor µs", "sol_routed_us": "SOL here µs (routed)", "sol_dedup_us": "SOL here µs (dedup)",
             "mark_us": "mark µs (SOL here + handshake)", "mark_empty_us": "old mark µs (SOL here + empty)",
             "sol_mi300x_us": "SOL MI300X µs (given)"}
    for column, title in (("device_mean_us", f"Device-side mean per shape ({unit})"),
                          ("mean_us", f"Leaderboard-style mean per shape ({unit})")):
        per_shape = frame.pivot_table(index="shape", columns="version", values=column, sort=False)
        per_shape = per_shape.reindex(columns=[e for e in entries if e in per_shape.columns])
        for col in extra_cols:
            per_shape[names[col]] = frame.groupby("shape", sort=False)[col].median()
        out += [f"{title}:", "", tabulate(per_shape.reset_index(), headers="keys", tablefmt="github", floatfmt=".1f",
                                          showindex=False), ""]
    for prefix, title in (("device_", "Device-side"), ("", "Leaderboard-style")):
        detail = frame.assign(cell=_quantiles(frame, prefix)).pivot(index="shape", columns="version", values="cell")
        detail = detail.reindex(index=list(dict.fromkeys(frame["shape"])), columns=entries)
        out += [f"{title} mean / p50 / p90 per shape ({unit}):", "",
                tabulate(detail.reset_index(), headers="keys", tablefmt="github", showindex=False), ""]
    given = frame.groupby("shape", sort=False)["sol_mi300x_us"].median().dropna()
    out += [f"SOL MI300X geomean (given with the task): {result_rows.geomean(given):.1f} µs. Published figures are "
            "8x MI300X leaderboard numbers, not measured here. Anchors move the routed volume twice and nothing else; "
            "the empty submission returns a preallocated output (the floor of a call); the handshake launches once, "
            "raises a flag at every peer and waits for every peer's (the floor of a correct call)."]
    if "sol_dedup_us" in frame:
        sol_gm = result_rows.geomean(frame.groupby("shape", sort=False)["sol_dedup_us"].median())
        out += [f"SOL here geomean (dedup): {sol_gm:.1f} µs."]
    if "mark_us" in frame:
        mark_gm = result_rows.geomean(frame.groupby("shape", sort=False)["mark_us"].median())
        out += [f"Mark geomean (SOL here, dedup, plus the handshake's device-side time, per shape): {mark_gm:.1f} µs."]
    if "mark_empty_us" in frame:
        old_gm = result_rows.geomean(frame.groupby("shape", sort=False)["mark_empty_us"].median())
        out += [f"Old mark geomean (SOL here, dedup, plus the empty submission's device-side time; kept beside the "
                f"mark for one release): {old_gm:.1f} µs."]
    out += meta["skipped"]
    return "\n".join(out)


def main(argv=None) -> int:
    from a2a import plots, sol

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", help="comma-separated names or files (default: every version)")
    parser.add_argument("--mode", default="benchmark", choices=("benchmark", "leaderboard"))
    parser.add_argument("--cases", default="benchmarks")
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--backend")
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--no-anchors", action="store_true", help="skip the NCCL/NVSHMEM anchors")
    parser.add_argument("--no-problem-size", action="store_true",
                        help="skip the official tests at world size 8 on shared GPUs (run when the timed run has "
                             "fewer ranks)")
    parser.add_argument("--problem-size-cases", default="tests", help=argparse.SUPPRESS)  # tests: a shorter check
    parser.add_argument("--sol", type=Path, help="reuse a saved sol.json instead of measuring")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args(argv)
    if args.versions is None:
        versions = planning.list_versions()
    else:
        versions = [name.strip() for name in args.versions.split(",") if name.strip()]
        if not versions:
            raise core.UserError(f"--versions '{args.versions}' names no version")
    plan = planning.make_plan(versions, args.cases, args.world_size, args.backend, timeout_s=args.timeout,
                              gpu_only="skip", distinct=True)
    cli.writable(args.out)
    frame, meta, figures = run(plan, args.mode, anchors=not args.no_anchors, sol_path=args.sol)
    checks, skipped = (pd.DataFrame(), []) if args.no_problem_size else \
        problem_size_checks(plan, args.problem_size_cases)
    meta["skipped"] += skipped
    if frame.empty and checks.empty:
        print("\n".join(["nothing ran on this machine"] + meta["skipped"]))
        return 0
    report = "\n".join(filter(None, [tables(frame, meta) if not frame.empty else "\n".join(meta["skipped"]),
                                     checks_table(checks)]))
    print(report)
    def write(folder: Path) -> None:
        if not checks.empty:
            checks.to_csv(folder / "checks.csv", index=False)
        frame.assign(**{k: v for k, v in meta.items() if k != "skipped"}).to_csv(folder / "results.csv",
                                                                                index=False)
        (folder / "results.json").write_text(json.dumps({"meta": meta, "sol": figures,
                                                         "rows": frame.to_dict(orient="records"),
                                                         "problem_size_checks": checks.to_dict(orient="records")},
                                                        indent=1))
        (folder / "table.md").write_text(report + "\n")
        if figures:
            sol.save(figures, folder)
        published = {prefix: us for prefix, (_, us) in published_by_version().items()}
        if not frame.empty:
            plots.leaderboard_png(frame, meta, folder / "leaderboard.png", published, result_rows.geomean)
            plots.shapes_png(frame, meta, folder / "leaderboard_shapes.png")

    cli.save_run(args.out, meta, write)
    versions_ok = frame.empty or frame[frame.kind == "version"].status.eq("pass").all()
    checks_ok = checks.empty or checks.status.eq("pass").all()
    return 0 if versions_ok and checks_ok else core.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
