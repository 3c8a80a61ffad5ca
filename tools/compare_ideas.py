#!/usr/bin/env python3
"""Each idea of a scratch copy measured alone, against the version it was copied from, in one run.

A scratch copy (submissions/all2all/ideas/) has a switch per idea: IDEAS (name -> bit), REQUIRES (what an idea
needs on with it) and configure_ideas(names). Every rank loads the baseline version and the scratch copy side by
side; per shape the variants - the baseline, the scratch copy with no idea on, each idea alone (with what it
requires), and the sets named with --sets - take turns call by call, so drift of the machine spreads over all of
them alike. Each variant's output is first checked against the reference on fresh seeds. Time = the evaluator's
timed step with its device clock (CUDA events around the call, slowest rank per call); host µs = host time inside
the call (slowest rank). Where the scratch copy has HOST_PROBES (the host path cut short at each step), those are
timed the same way.

    python -m tools.compare_ideas SCRATCH [--baseline v5] [--sets "dedup,index;dedup,index,pull"]
                                  [--cases benchmarks] [--world-size N] [--iterations 50] [--block 1]

Saves ideas.csv and ideas.md under results/<date>_<device>_ws<N>_ideas-<scratch>_<commit>/.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


import eval as core
from a2a import bench
from a2a import plan as planning
from a2a import cli
from a2a.rows import geomean, shape_label

CHECK_SEEDS = 3


def variants_of(module, sets: list) -> list:
    """(label, idea names or None for the baseline) in the order they are timed."""
    variants = [("baseline", None), ("none", ())]
    variants += [(name, tuple(module.REQUIRES.get(name, ())) + (name,)) for name in module.IDEAS]
    variants += [("+".join(names), tuple(names)) for names in sets]
    return variants


def _compare_rank(rank: int, world_size: int, scratch: str, baseline: str, sets: list, cases: list,
                  iterations: int, block: int):
    from reference import check_implementation, generate_input

    base = planning.load_version(Path(baseline), f"baseline_{Path(baseline).stem}")
    module = planning.load_version(Path(scratch), f"scratch_{Path(scratch).stem}")
    variants = variants_of(module, sets)
    probes = getattr(module, "HOST_PROBES", {})

    def select(ideas):
        """Switches the scratch copy's ideas (outside any timed window) and returns the call to time."""
        if ideas is None:
            return base.custom_kernel
        module.configure_ideas(ideas)
        return module.custom_kernel

    rows = []
    for args in cases:
        wrong = {}
        for label, ideas in variants:
            kernel = select(ideas)
            for i in range(CHECK_SEEDS):
                seed = args["seed"] + core.LEADERBOARD_SEED_STEP * (i + 1)  # fresh inputs, as leaderboard mode
                fresh = generate_input(**dict(args, seed=seed), rank=rank)
                ok, message = check_implementation(fresh, kernel(core.clone_data(fresh, rank)))
                if not ok:
                    wrong.setdefault(label, message.splitlines()[0][:200])
        data = generate_input(**args, rank=rank)
        timed = [(label, lambda i=ideas: select(i)) for label, ideas in variants]
        timed += [(f"host probe: {name}", lambda m=mode: (lambda d: module.host_probe(d, m)))
                  for name, mode in probes.items()]
        samples = {label: ([], []) for label, _ in timed}
        for turn in range(iterations // block):  # variants take turns, `block` steps each (select() in between)
            for label, prepare in timed:
                taken = bench.measure({label: prepare()}, data, rank, [label] * block, device_clock=True,
                                     call_clock=True, warmup=bench.WARMUP_CALLS if turn == 0 else 0)[label]
                samples[label][0].extend(ns / 1e3 for ns in taken.device_ns)
                samples[label][1].extend(ns / 1e3 for ns in taken.call_ns)
        for label, (device_us, host_us) in samples.items():
            device, host = core.calculate_extra_stats(device_us), core.calculate_extra_stats(host_us)
            correct = core.all_ok(label not in wrong, rank)
            rows.append({"shape": shape_label(**args), "variant": label, "device_mean_us": device.mean,
                         "device_p50_us": device.p50, "device_p90_us": device.p90, "host_p50_us": host.p50,
                         "correct": correct if not label.startswith("host probe") else None,
                         "error": wrong.get(label, "")})
    return rows if rank == 0 else None


def report(frame, meta: dict) -> str:
    from tabulate import tabulate

    lines = [f"# Ideas of {meta['scratch']} measured alone against {meta['baseline']}", "",
             f"{meta['device']}, {meta['placement']}, {meta['date']}, commit {meta['commit']}. "
             f"Device-side µs per call (CUDA events around the call, slowest rank per call), {meta['iterations']} "
             f"calls per variant and shape, variants taking turns every {meta['block']} call(s); host µs = host time "
             "inside the call (slowest rank, p50). Geometric mean over the shapes; delta against the baseline's.", ""]
    summary = []
    base = frame[frame.variant == "baseline"]
    for label in dict.fromkeys(frame.variant):
        rows = frame[frame.variant == label]
        entry = {"variant": label}
        for stat in ("device_mean_us", "device_p50_us", "host_p50_us"):
            entry[stat] = geomean(rows[stat])
        entry["vs baseline (mean)"] = f"{100 * (entry['device_mean_us'] / geomean(base['device_mean_us']) - 1):+.1f}%"
        entry["correct"] = "" if label.startswith("host probe") else ("yes" if rows.correct.all() else "NO")
        summary.append(entry)
    lines += [tabulate(summary, headers="keys", tablefmt="github", floatfmt=".1f"), ""]
    for stat, title in (("device_mean_us", "device-side mean"), ("device_p50_us", "device-side p50"),
                        ("host_p50_us", "host µs in the call, p50")):
        table = frame.pivot(index="variant", columns="shape", values=stat).reindex(list(dict.fromkeys(frame.variant)))
        lines += [f"## Per shape: {title}", "", tabulate(table.reset_index(), headers="keys", tablefmt="github",
                                                        floatfmt=".1f", showindex=False), ""]
    failed = frame[frame.error != ""]
    if len(failed):
        lines += ["## Wrong outputs", ""] + [f"- {r.variant}, {r.shape}: {r.error}" for r in failed.itertuples()]
    return "\n".join(lines)


def main(argv=None) -> int:
    import pandas as pd

    from a2a.launch import parallel_launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scratch", help="the scratch copy's file")
    parser.add_argument("--baseline", default="v5")
    parser.add_argument("--sets", default="", help="idea sets to time besides each idea alone: 'a,b;a,b,c'")
    cli.add_options(parser, "cases", "world-size", "out")
    parser.add_argument("--iterations", type=int, default=50, help="calls per variant and shape")
    parser.add_argument("--block", type=int, default=1,
                        help="calls in a row per variant before the next takes its turn (1: call by call; more "
                             "keeps the host's caches warm for the variant, as under the runner)")
    args = parser.parse_args(argv)
    cli.writable(args.out)
    plan = planning.make_plan([args.scratch, args.baseline], args.cases, args.world_size, gpu_only="keep")
    scratch, baseline = plan.versions
    if "configure_ideas" not in scratch.read_text():
        raise core.UserError(f"{scratch.name} has no configure_ideas: not a scratch copy with idea switches")
    if plan.backend != "nccl":
        print("skipped: comparing ideas needs GPUs (the scratch copies build GPU code)")
        return 0
    sets = [tuple(n.strip() for n in group.split(",") if n.strip()) for group in args.sets.split(";") if group.strip()]
    rows = parallel_launch(plan.world_size, _compare_rank, str(scratch), str(baseline), sets, plan.case_args,
                           args.iterations, args.block, backend="nccl", timeout_s=1500, reach=(scratch, baseline))[0]
    meta = {**plan.meta_for(f"ideas-{scratch.stem}"), "scratch": scratch.stem, "baseline": baseline.stem,
            "iterations": args.iterations, "block": args.block}
    frame = pd.DataFrame(rows)
    text = report(frame, meta)
    print(text)

    def write(folder: Path) -> None:
        frame.assign(**meta).to_csv(folder / "ideas.csv", index=False)
        (folder / "ideas.md").write_text(text + "\n")

    cli.save_run(args.out, meta, write)
    return cli.verdict(frame.correct.dropna().all())  # a wrong variant: 112


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
