#!/usr/bin/env python3
"""Anatomy of the leaderboard-style step: where a timed step's µs go besides custom_kernel, per rank.

Case steps and floor steps (the same step without the call) alternate; every rank stamps the host clock (shared by
all processes of the machine) at each boundary of a2a.bench.timed_step (a2a.bench.STEP_BOUNDARIES): start (after the barrier),
input cloned, call returned, synchronized, final barrier passed. Device-side time comes from CUDA events around the call,
as in the evaluator. Reported per shape (medians): rank 0's leaderboard-style step and floor step, their difference,
the device-side time (slowest rank), how late the last rank started, how long each rank's host spent in the call,
waited in synchronize and in the final barrier.

    python -m tools.step_anatomy VERSION [--cases benchmarks:0,4] [--world-size N] [--iterations 50]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import eval as core
from a2a import bench
from a2a import plan as planning
from a2a import cli
from a2a.launch import SubmissionFailed
from a2a.rows import shape_label


def _anatomy_rank(rank: int, world_size: int, path: str, cases: list, iterations: int):
    import torch.distributed as dist

    from reference import generate_input

    module = planning.load_version(Path(path), f"anatomy_{Path(path).stem}")
    results = []
    for args in cases:
        data = generate_input(**args, rank=rank)
        steps: list = []

        def new_step(label) -> None:
            steps.append({"call": label == "call", "stamps": [], "device_ns": 0.0})

        def device_time(step) -> bool:
            steps[-1]["device_ns"] = step.device_ns or 0.0
            return False

        bench.measure({"call": module.custom_kernel, "floor": None}, data, rank, ["call", "floor"] * iterations,
                     device_clock=True, probe=lambda _boundary: steps[-1]["stamps"].append(time.time_ns()),
                     before_step=new_step, after_step=device_time)
        gathered = [None] * world_size
        with core.own_device(rank):  # the gather is this tool's own GPU work (NCCL objects go through the device)
            dist.all_gather_object(gathered, steps)
        results.append(gathered)
    return results if rank == 0 else None


def _step_fits(step) -> bool:
    """One step as _anatomy_rank records it: a bool `call`, 5 integer stamps, a number of device ns."""
    return (isinstance(step, dict) and isinstance(step.get("call"), bool) and isinstance(step.get("stamps"), list)
            and len(step["stamps"]) == len(bench.STEP_BOUNDARIES) and all(type(t) is int for t in step["stamps"])
            and type(step.get("device_ns")) in (int, float) and 0 <= step["device_ns"] < 1e12)


def _fits(per_rank_steps) -> bool:
    """Whether rank 0's return for one shape has the shape _anatomy_rank gives it: every rank the same steps, each
    fitting _step_fits, a call step and a floor step among them."""
    if not (isinstance(per_rank_steps, list) and per_rank_steps
            and all(isinstance(steps, list) for steps in per_rank_steps)):
        return False
    steps = per_rank_steps[0]
    return (all(len(other) == len(steps) and all(map(_step_fits, other)) for other in per_rank_steps)
            and all(len({other[i]["call"] for other in per_rank_steps}) == 1 for i in range(len(steps)))
            and {step["call"] for step in steps} == {True, False})


def summarise(per_rank_steps: list) -> dict:
    """Medians (µs) over the steps of one shape; per_rank_steps[rank][step] as _anatomy_rank records them, checked
    first: they come from the ranks, where the submission runs (red team 33: emptied, they ended the tool with 114)."""
    if not _fits(per_rank_steps):
        raise SubmissionFailed("the ranks returned steps that do not fit the anatomy's shape (each rank the same "
                               "call and floor steps, 5 integer stamps each): the submission changed them")
    world = len(per_rank_steps)
    case, floor = {}, []
    rows = {k: [] for k in ("step", "device", "start_lag", "call_host", "sync_wait", "barrier_wait", "clone")}
    for index, step0 in enumerate(per_rank_steps[0]):
        stamps = [per_rank_steps[r][index]["stamps"] for r in range(world)]
        total = (stamps[0][4] - stamps[0][0]) / 1e3
        if not step0["call"]:
            floor.append(total)
            continue
        rows["step"].append(total)
        rows["device"].append(max(per_rank_steps[r][index]["device_ns"] for r in range(world)) / 1e3)
        rows["start_lag"].append((max(s[0] for s in stamps) - stamps[0][0]) / 1e3)
        rows["clone"].append(max(s[1] - s[0] for s in stamps) / 1e3)
        rows["call_host"].append(max(s[2] - s[1] for s in stamps) / 1e3)
        rows["sync_wait"].append(max(s[3] - s[2] for s in stamps) / 1e3)
        rows["barrier_wait"].append((stamps[0][4] - stamps[0][3]) / 1e3)
    for key, values in rows.items():
        case[key] = statistics.median(values)
    case["floor"] = statistics.median(floor)
    case["step - floor - device"] = case["step"] - case["floor"] - case["device"]
    return case


def main(argv=None) -> int:
    from tabulate import tabulate

    from a2a.launch import submission_launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version")
    cli.add_options(parser, "cases", "world-size", "backend", "out", cases={"default": "benchmarks:0,4"})
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args(argv)
    cli.writable(args.out)
    if args.iterations < 1:
        raise core.UserError(f"--iterations must be at least 1, not {args.iterations}")
    plan = planning.make_plan(args.version, args.cases, args.world_size, args.backend)
    results = submission_launch(plan.world_size, _anatomy_rank, str(plan.version), plan.case_args, args.iterations,
                                backend=plan.backend, timeout_s=900, reach=(plan.version,))[0]
    if not isinstance(results, list) or len(results) != len(plan.case_args):
        raise SubmissionFailed(f"rank 0 returned no anatomy of each of the {len(plan.case_args)} shapes")
    meta = plan.meta_for(f"anatomy-{plan.version.stem}")
    rows = [{"shape": shape_label(**c), **summarise(r)} for c, r in zip(plan.case_args, results)]
    text = (f"# Anatomy of the timed step: {plan.version.stem}\n\n{meta['device']}, {meta['placement']}, "
            f"{plan.backend}, {meta['date']}, commit {meta['commit']}; {args.iterations} case steps interleaved with "
            "as many floor steps; medians, µs. step = rank 0's leaderboard-style step; device = slowest rank's CUDA "
            "events around the call; start_lag = how late the last rank left the first barrier; clone, call_host, "
            "sync_wait = the slowest rank's; barrier_wait = rank 0's wait in the final barrier. Every figure is the "
            "ranks' own stamps and events, taken where the submission runs: its word, which it can write (red team 36); "
            "the judge's figure is the clock's owner's step.\n\n"
            + tabulate(rows, headers="keys", tablefmt="github", floatfmt=".1f"))
    print(text)
    cli.save_run(args.out, meta, lambda folder: (folder / "anatomy.md").write_text(text + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
