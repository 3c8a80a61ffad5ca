#!/usr/bin/env python3
"""The SM share at which ranks sharing a GPU through MPS run every version cleanly (a2a/sharing.py).

For each share (percent of a GPU's SMs per rank, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), one process group of N ranks on
this machine's GPUs loads every version and calls it on every case, several times, with a short spin timeout. A
version whose grids are not all resident at once gives up waiting on a flag (its kernels say so) and returns wrong
rows; each output is compared with the closed form (no communication), with the official tolerance. Reported per
share and version: calls, wrong outputs, the slowest call; the same for the whole group when it cannot even form
(NCCL refusing, a rank dying). Nothing here is a timing of the problem: it finds the headroom sharing needs.

    python -m tools.sm_share [--world-size 8] [--percents 9,10,12] [--versions v2,v5] [--cases tests]
                             [--repeats 2] [--spin-timeout 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


import eval as core
from a2a import plan as planning
from a2a import sharing
from a2a import cli

FRACTIONS = (0.6, 0.72, 0.85, 1.0)  # default shares to try: these fractions of the GPU over its ranks


def _share_rank(rank: int, world_size: int, paths: list, cases: list, repeats: int) -> list:
    import torch
    import torch.distributed as dist

    from reference import closed_form_output, generate_input

    found = []
    for path in paths:
        module = planning.load_version(Path(path), f"share_{Path(path).stem}")
        calls = wrong = 0
        slowest_ms, first_wrong = 0.0, None
        for index, args in enumerate(cases):
            data = generate_input(**args, rank=rank)
            expected = closed_form_output(data)
            for _ in range(repeats):
                started = time.perf_counter()
                output = module.custom_kernel(core.clone_data(data, rank))
                torch.cuda.synchronize(output.device)
                slowest_ms = max(slowest_ms, (time.perf_counter() - started) * 1e3)
                calls += 1
                if not torch.allclose(output, expected, rtol=1e-2, atol=5e-3):
                    wrong += 1
                    first_wrong = index if first_wrong is None else first_wrong
        found.append({"version": Path(path).stem, "calls": calls, "wrong": wrong, "slowest_ms": slowest_ms,
                      "first_wrong_case": first_wrong})
        dist.barrier()
    gathered = [None] * world_size
    dist.all_gather_object(gathered, found)
    if rank:
        return []
    merged = []
    for per_version in zip(*gathered):
        merged.append({"version": per_version[0]["version"], "calls": sum(v["calls"] for v in per_version),
                       "wrong": sum(v["wrong"] for v in per_version),
                       "slowest_ms": max(v["slowest_ms"] for v in per_version),
                       "first_wrong_case": min((v["first_wrong_case"] for v in per_version
                                                if v["first_wrong_case"] is not None), default=None)})
    return merged


def sweep(plan: planning.RunPlan, percents: list, repeats: int, spin_timeout_s: float, progress=print) -> list:
    from a2a.launch import LaunchError, parallel_launch

    rows = []
    for percent in percents:
        # the share and the give-up time reach the ranks through the environment they start with
        with core.environment_with({"A2A_SM_PERCENT": str(percent), "A2A_SPIN_TIMEOUT_S": str(spin_timeout_s)}):
            where = sharing.placement(plan.world_size, planning.machine_gpus(), "nccl")
            progress(f"{where.describe()}: {len(plan.versions)} version(s) x {len(plan.cases)} case(s) x {repeats}")
            started = time.monotonic()
            try:
                found = parallel_launch(plan.world_size, _share_rank, [str(p) for p in plan.versions],
                                        plan.case_args, repeats, backend="nccl", timeout_s=1200,
                                        reach=tuple(plan.versions))[0]
                rows += [{"percent": percent, **row} for row in found]
            except LaunchError as error:
                rows.append({"percent": percent, "version": "(the group)", "calls": 0, "wrong": None,
                             "slowest_ms": None, "first_wrong_case": None, "error": str(error)[:300]})
            progress(f"  {time.monotonic() - started:.0f} s")
    return rows


def main(argv=None) -> int:
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_options(parser, "world-size", "versions", "cases", "out", world_size={"type": int, "default": 8},
                    cases={"default": "tests"})
    parser.add_argument("--percents", help="comma-separated shares in percent (default: "
                                           f"{', '.join(map(str, FRACTIONS))} of the GPU over its ranks)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--spin-timeout", type=float, default=2.0, help="seconds a version waits on a flag")
    args = parser.parse_args(argv)
    cli.writable(args.out)
    versions = [v for v in (args.versions or "").split(",") if v.strip()] or planning.list_versions()
    gpus = planning.machine_gpus()
    if not gpus:
        raise core.UserError("the SM share is a GPU matter: this machine has no GPU")
    if args.world_size <= gpus:
        raise core.UserError(f"--world-size {args.world_size} does not exceed this machine's {gpus} GPU(s): no "
                             "rank would share one")
    if args.repeats < 1 or not args.spin_timeout > 0:
        raise core.UserError("--repeats must be at least 1 and --spin-timeout positive")
    ranks_per_gpu = sharing.Placement(args.world_size, gpus).ranks_per_gpu
    try:
        percents = ([int(p) for p in args.percents.split(",")] if args.percents else
                    sorted({sharing.sm_share_percent(ranks_per_gpu, f) for f in FRACTIONS}))
    except ValueError:
        raise core.UserError(f"--percents {args.percents}: give whole percents separated by commas") from None
    if not all(1 <= p <= 100 // ranks_per_gpu for p in percents):
        raise core.UserError(f"--percents {args.percents}: each must be from 1 to {100 // ranks_per_gpu} "
                             f"({ranks_per_gpu} ranks share each GPU)")
    plan = planning.make_plan(versions, args.cases, args.world_size, "nccl", gpu_only="keep")
    rows = sweep(plan, percents, args.repeats, args.spin_timeout)
    meta = {**plan.meta_for("sm-share"), "repeats": args.repeats, "spin_timeout_s": args.spin_timeout,
            "default_percent": sharing.sm_share_percent(ranks_per_gpu)}
    report = (f"# SM share per rank, {args.world_size} ranks on {min(gpus, args.world_size)} GPU(s)\n\n"
              f"{meta['device']}, {meta['date']}, commit {meta['commit']}; cases `{args.cases}`, each called "
              f"{args.repeats}x per version, spin timeout {args.spin_timeout:g} s, outputs against the closed form. "
              f"The default share here is {meta['default_percent']}%.\n\n"
              + tabulate(rows, headers="keys", tablefmt="github", floatfmt=".1f"))
    print(report)
    def write(folder: Path) -> None:
        (folder / "sm_share.md").write_text(report + "\n")
        (folder / "sm_share.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    cli.save_run(args.out, meta, write)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
