#!/usr/bin/env python3
"""Versions x benchmark shapes: runs the evaluator on each version, gathers the stats in a DataFrame and prints
markdown tables (per-shape means, geomean, speedup against the first version, harness floor, device-side time,
speed of light and the published MI300X figure of the matching blog step). Saves CSV, JSON and the tables, with
device, world size, date and commit, under --out.

    python run_leaderboard.py [--versions v1,v2] [--mode benchmark|leaderboard] [--world-size N] [--out results]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from tabulate import tabulate

import eval as harness

ROOT = Path(__file__).resolve().parent
PUBLISHED = ROOT / "reference" / "published.yml"


def speed_of_light(task: dict) -> dict:
    """(num_experts, experts_per_token, hidden_dim, max_num_tokens) -> µs, from the table in task.yml."""
    table = {}
    for line in task.get("description", "").splitlines():
        numbers = line.split()
        if len(numbers) == 5 and all(re.fullmatch(r"[0-9.]+", n) for n in numbers):
            table[tuple(int(n) for n in numbers[:4])] = float(numbers[4])
    return table


def published_by_version() -> dict:
    steps = yaml.safe_load(PUBLISHED.read_text())["blog_series"]["steps"]
    return {s["version"]: (s["step"], s["us"]) for s in steps if "version" in s}


def commit() -> str:
    """The commit measured; A2A_COMMIT names it where the tree travels without .git (the device machine)."""
    if os.environ.get("A2A_COMMIT"):
        return os.environ["A2A_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(backend: str) -> str:
    import torch

    if backend == "nccl":
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def run(versions: list[str], mode: str, cases: str, world_size, backend, timeout_s) -> tuple[pd.DataFrame, dict]:
    world_size, backend = harness.plan_run(world_size, backend)
    rows, skipped = [], []
    for name in versions:
        path = harness.resolve_version(name)
        if backend == "gloo" and harness.needs_gpu(path):
            line = f"skipped {path.stem}: it builds GPU code (load_inline) and this run is on CPU/gloo"
            print(line, flush=True)
            skipped.append(line)
            continue
        result = harness.evaluate(path.stem, mode, cases, world_size, backend, timeout_s=timeout_s)
        for case in result.cases:
            args = harness.parse_test_line(case["spec"])
            rows.append({"version": path.stem, **{k: args[k] for k in harness.SPEC_KEYS},
                         **{k: case.get(k) for k in ("status", "runs", "mean_us", "best_us", "device_mean_us",
                                                     "device_best_us", "floor_mean_us", "floor_best_us")},
                         "error": case.get("error", "")})
    meta = {"device": device_name(backend), "world_size": world_size, "backend": backend, "mode": mode,
            "date": datetime.date.today().isoformat(), "commit": commit(),
            "timing": "leaderboard-style: rank-0 host clock around clone+custom_kernel+sync+barrier, L2 cleared "
                      "before each run; device: max over ranks of per-rank events around custom_kernel; floor: "
                      "the same step with no custom_kernel",
            "skipped": skipped}
    return pd.DataFrame(rows), meta


def tables(df: pd.DataFrame, meta: dict, task: dict) -> str:
    sol = speed_of_light(task)
    published = published_by_version()
    versions = list(dict.fromkeys(df["version"]))
    cpu = meta["backend"] == "gloo"
    df = df.assign(shape=[harness.shape_label(**row) for row in df[list(harness.SPEC_KEYS)].to_dict("records")])
    shape_sol = {harness.shape_label(*dims): us for dims, us in sol.items()}
    per_shape = df.pivot_table(index="shape", columns="version", values="mean_us", sort=False)[versions]
    per_shape["floor µs"] = df.groupby("shape", sort=False)["floor_mean_us"].median()
    per_shape["SoL MI300X µs (given)"] = [shape_sol.get(s) for s in per_shape.index]
    unit = "CPU µs" if cpu else "µs"
    header = (f"device: {meta['device']}, world size {meta['world_size']}, backend {meta['backend']}, "
              f"mode {meta['mode']}, {meta['date']}, commit {meta['commit']}")
    out = [header, "", f"Leaderboard-style mean per shape ({unit}):", "",
           tabulate(per_shape.reset_index(), headers="keys", tablefmt="github", floatfmt=".1f", showindex=False)]
    summary = []
    first = None
    for version in versions:
        rows = df[df.version == version]
        ok = (rows.status == "pass").all()
        gm = harness.geomean(rows.mean_us) if ok else float("nan")
        first = gm if first is None else first
        step, pub = published.get(version.split("_")[0], ("", None))
        summary.append({"version": version, f"geomean {unit}": gm, f"device geomean {unit}": harness.geomean(rows.device_mean_us),
                        f"floor geomean {unit}": harness.geomean(rows.floor_mean_us), "speedup vs first": first / gm,
                        "published MI300X µs (blog step)": f"{pub} ({step})" if pub else "",
                        "all pass": "yes" if ok else "no"})
    out += ["", "Per version (geometric means over the shapes run):", "",
            tabulate(summary, headers="keys", tablefmt="github", floatfmt=".2f")]
    out += ["", f"SoL geomean (MI300X, given with the task): {harness.geomean(sol.values()):.1f} µs. Published figures are "
            "8x MI300X leaderboard numbers, not measured here."]
    out += meta["skipped"]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default="", help="comma-separated (default: every version)")
    parser.add_argument("--mode", default="benchmark", choices=("benchmark", "leaderboard"))
    parser.add_argument("--cases", default="benchmarks")
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--backend")
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args(argv)
    versions = args.versions.split(",") if args.versions else [p.stem for p in harness.list_versions()]
    df, meta = run(versions, args.mode, args.cases, args.world_size, args.backend, args.timeout)
    if df.empty:
        print("nothing ran on this machine")
        return 0
    report = tables(df, meta, harness.load_task())
    print(report)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", meta["device"]).strip("-").lower()
    folder = args.out / f"{meta['date']}_{slug}_ws{meta['world_size']}_{meta['mode']}_{meta['commit']}"
    folder.mkdir(parents=True, exist_ok=True)
    df.assign(**{k: v for k, v in meta.items() if k != "skipped"}).to_csv(folder / "results.csv", index=False)
    (folder / "results.json").write_text(json.dumps({"meta": meta, "rows": df.to_dict(orient="records")}, indent=1))
    (folder / "table.md").write_text(report + "\n")
    print(f"\nsaved {folder}")
    return 0 if (df.status == "pass").all() else harness.EXIT_CHECK_FAILED


if __name__ == "__main__":
    try:
        sys.exit(main())
    except harness.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(harness.EXIT_USAGE)
