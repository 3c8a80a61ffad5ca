#!/usr/bin/env python3
"""Sweep the launch shape of a version that has LAUNCH_SHAPE (v3 onward): grid (blocks per multiprocessor, scaled by
the device's count) x threads per block. v3 has a shape per kernel (one kernel varied at a time, the others at their
defaults); from v4 there is one kernel, swept with the graph path off and on where the version has one (its
`configure`), up to the version's MAX_THREADS. Each shape's output
must be bit-identical to the default shape's (else it is marked); time = the evaluator's timed step with its device
clock (CUDA events around the call, slowest rank per call, median over the calls); host µs = the host time inside
the call (median, slowest rank).

    python -m tools.sweep_launch VERSION [--cases benchmarks] [--world-size N] [--iterations 30] [--out results]

Saves sweep.csv, sweep.md (per kernel: geometric mean over the shapes, and the best shape) and sweep.png (one
heat map per kernel) under results/<date>_<device>_ws<N>_sweep-<version>_<commit>/, and prints the best
LAUNCH_SHAPE.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


import eval as core
from a2a import bench
from a2a import plan as planning
from a2a import cli
from a2a.plan import load_version
from a2a.rows import geomean, shape_label

PER_MULTIPROCESSOR = (0.5, 1, 2, 4)
THREADS = (128, 256, 512, 1024)


def shapes_to_try(module) -> list:
    """(label, apply) pairs: every launch shape the version can take, each with the function that applies it."""
    default = module.LAUNCH_SHAPE
    tries = []
    if hasattr(module, "configure"):  # one kernel (v4 on): shape, and the graph path where the version has one
        has_graph = hasattr(module, "USE_GRAPH")
        configure = module.configure if has_graph else (lambda shape, _use_graph: module.configure(shape))
        most = getattr(module, "MAX_THREADS", THREADS[-1])
        for use_graph in ((False, True) if has_graph else (False,)):
            for per_multiprocessor in PER_MULTIPROCESSOR:
                for threads in (t for t in THREADS[1:] if t <= most):
                    tries.append(("all2all graph" if use_graph else "all2all", per_multiprocessor, threads,
                                  lambda s=(per_multiprocessor, threads), g=use_graph: configure(s, g)))
        tries.append(("", 0, 0, lambda: configure(default, False)))  # back to the defaults
        return tries
    for kernel in default:  # v3: one kernel at a time
        for per_multiprocessor in PER_MULTIPROCESSOR:
            for threads in THREADS:
                shape = {**default, kernel: (per_multiprocessor, threads)}
                tries.append((kernel, per_multiprocessor, threads,
                              lambda shape=shape: setattr(module, "LAUNCH_SHAPE", shape)))
    tries.append(("", 0, 0, lambda: setattr(module, "LAUNCH_SHAPE", default)))
    return tries


def _sweep_rank(rank: int, world_size: int, path: str, cases: list, iterations: int):
    """Per case and launch shape: the evaluator's timed step (device clock on), with the host time inside the call
    taken between the step's boundaries."""
    import statistics

    import torch

    from reference import generate_input

    module = load_version(Path(path), f"swept_{Path(path).stem}")
    rows = []
    for args in cases:
        data = generate_input(**args, rank=rank)
        expected = module.custom_kernel(core.clone_data(data, rank)).clone()
        for kernel, per_multiprocessor, threads, apply in shapes_to_try(module):
            apply()
            if not kernel:
                continue
            same = torch.equal(module.custom_kernel(core.clone_data(data, rank)), expected)
            timed = bench.measure({"call": module.custom_kernel}, data, rank, ["call"] * iterations,
                                 device_clock=True, call_clock=True)["call"]
            rows.append({"shape": shape_label(**args), "kernel": kernel, "per_multiprocessor": per_multiprocessor,
                         "threads": threads, "device_us": statistics.median(timed.device_ns) / 1e3,
                         "host_us": statistics.median(timed.call_ns) / 1e3, "bit_identical": core.all_ok(same, rank)})
    return rows if rank == 0 else None


def report(frame, meta: dict, folder: Path) -> str:
    import numpy as np
    from tabulate import tabulate

    from a2a.plots import pyplot

    plt = pyplot()

    lines = [f"# Launch-shape sweep of {meta['version']}", "",
             f"{meta['device']} ({meta['multiprocessors']} multiprocessors), {meta['placement']}, "
             f"{meta['date']}, commit {meta['commit']}. Device-side µs per call (CUDA events, slowest rank, median of "
             f"{meta['iterations']}), geometric mean over {frame['shape'].nunique()} shapes; one kernel varied at a "
             "time, the others at the version's defaults. Rows: threads per block; columns: blocks per "
             "multiprocessor.", ""]
    kernels = list(dict.fromkeys(frame["kernel"]))
    fig, axes = plt.subplots(1, len(kernels), figsize=(4 * len(kernels), 3.6), squeeze=False)
    best = {}
    for ax, kernel in zip(axes[0], kernels):
        rows = frame[frame.kernel == kernel]
        table = rows.groupby(["threads", "per_multiprocessor"])["device_us"].apply(geomean).unstack()
        broken = rows[~rows.bit_identical]
        sound = table.stack().drop(index=list(zip(broken.threads, broken.per_multiprocessor)), errors="ignore")
        threads, per_multiprocessor = sound.idxmin()  # only shapes whose output stayed bit-identical
        per_multiprocessor = float(per_multiprocessor)
        best[kernel] = (int(per_multiprocessor) if per_multiprocessor.is_integer() else per_multiprocessor,
                        int(threads))
        lines += [f"## {kernel}", "", tabulate(table.reset_index(), headers="keys", tablefmt="github", floatfmt=".1f",
                                               showindex=False), "",
                  f"best: {best[kernel][0]} blocks per multiprocessor x {int(threads)} threads"
                  + (f"; NOT bit-identical at {len(broken)} shape(s)" if len(broken) else ""), ""]
        if "host_us" in rows:
            host = rows.groupby(["threads", "per_multiprocessor"])["host_us"].apply(geomean).unstack()
            lines += [f"host µs inside the call ({kernel}):", "",
                      tabulate(host.reset_index(), headers="keys", tablefmt="github", floatfmt=".1f", showindex=False),
                      ""]
        image = ax.imshow(table.values, cmap="viridis_r", aspect="auto")
        ax.set_xticks(range(len(table.columns)))
        ax.set_xticklabels([f"{c:g}x" for c in table.columns])
        ax.set_yticks(range(len(table.index)))
        ax.set_yticklabels(table.index)
        ax.set_xlabel("blocks per multiprocessor")
        ax.set_ylabel("threads per block")
        ax.set_title(kernel, fontsize=9)
        for (i, j), value in np.ndenumerate(table.values):
            ax.text(j, i, f"{value:.0f}", ha="center", va="center", color="white", fontsize=7)
        fig.colorbar(image, ax=ax, label="µs (geomean)")
    fig.suptitle(f"{meta['version']} launch shapes, {meta['device']}, {meta['placement']}, "
                 f"{meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / "sweep.png", dpi=110)
    plt.close(fig)
    lines += ["Best per kernel (each chosen with the others at their defaults):", "",
              f"    LAUNCH_SHAPE = {best}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    import pandas as pd
    import torch

    from a2a.launch import parallel_launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version")
    cli.add_options(parser, "cases", "world-size", "out")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args(argv)
    cli.writable(args.out)
    plan = planning.make_plan(args.version, args.cases, args.world_size, gpu_only="keep")
    if "LAUNCH_SHAPE" not in plan.version.read_text():
        raise core.UserError(f"{plan.version.stem} has no LAUNCH_SHAPE to sweep")
    if plan.backend != "nccl":
        print("skipped: the launch-shape sweep needs GPUs")
        return 0
    rows = parallel_launch(plan.world_size, _sweep_rank, str(plan.version), plan.case_args, args.iterations,
                           backend="nccl", timeout_s=1200, reach=(plan.version,))[0]
    meta = {**plan.meta_for(f"sweep-{plan.version.stem}"), "version": plan.version.stem,
            "iterations": args.iterations, "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count}
    frame = pd.DataFrame(rows)

    def write(folder: Path) -> None:
        frame.assign(**meta).to_csv(folder / "sweep.csv", index=False)
        text = report(frame, meta, folder)
        (folder / "sweep.md").write_text(text + "\n")
        print(text)

    cli.save_run(args.out, meta, write)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
