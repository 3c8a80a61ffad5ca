#!/usr/bin/env python3
"""Diff two versions: what changed in the code, what it did to the time, and whether that is more than noise.

    python diff.py A B [--cases benchmarks] [--world-size N] [--backend nccl|gloo] [--rounds 8] [--steps 8]
                       [--alpha 0.05] [--out results]

A and B are version names as eval.py resolves them (v2, v3_fused_combine) or paths. The code delta is printed and
saved; the timing runs wherever both versions can run (GPUs for all, CPU/gloo for PyTorch-only ones). Saved under
results/<date>_<device>_ws<N>_diff_<A>_vs_<B>_<commit>/: diff.md, code.diff, timing.csv, timing.json, ratios.png.
How the interval and the verdict are made: a2a/diffing.py (and docs/timing.md, "Comparing two versions").
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import eval as core
from a2a import cli, clock, diffing
from a2a import plan as planning
from a2a import rows as result_rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    cli.add_options(parser, "cases", "world-size", "backend", "out")
    parser.add_argument("--rounds", type=int, default=diffing.ROUNDS, help="rounds, each with fresh processes")
    parser.add_argument("--steps", type=int, default=diffing.STEPS, help="steps of each kind per visit")
    parser.add_argument("--alpha", type=float, default=diffing.FAMILY_ALPHA,
                        help="family-wise error rate of the verdicts (Bonferroni over the run)")
    args = parser.parse_args(argv)
    cli.writable(args.out)
    if not (2 <= args.rounds <= diffing.ROUNDS_MAX and 1 <= args.steps <= clock.STEPS_MAX):
        raise core.UserError(f"--rounds must be from 2 to {diffing.ROUNDS_MAX} and --steps from 1 to {clock.STEPS_MAX} "
                             f"(got {args.rounds}, {args.steps})")
    if not 0 < args.alpha < 1:
        raise core.UserError(f"--alpha must be between 0 and 1, not {args.alpha}")
    plan = planning.make_plan([args.a, args.b], args.cases, args.world_size, args.backend, gpu_only="keep")
    cli.one_entry_per_writable(plan.versions)
    path_a, path_b = plan.versions
    diffs = diffing.code_diff_within(path_a, path_b)
    if diffs is None:
        print(f"code: {path_a.stem} -> {path_b.stem}: not computed within {diffing.CODE_DIFF_S:g} s (left out; the "
              f"timing goes on)\n")
        diffs = []
    else:
        print(f"code: {path_a.stem} -> {path_b.stem}\n{diffing.code_summary(diffs)}\n")
    code = "".join(d.unified for d in diffs)
    meta = {**plan.meta_for(f"diff_{path_a.stem}_vs_{path_b.stem}"), "a": path_a.stem, "b": path_b.stem,
            "commit_a": diffing.last_commit(path_a), "commit_b": diffing.last_commit(path_b),
            "timing": f"the judge's clock: {args.rounds} rounds of fresh processes, A and B in an order shuffled "
                      f"per round, one pool alive at a time, {args.steps} idle-stream and {args.steps} held steps per "
                      "visit on the same inputs; B/A = geometric mean over rounds of the per-round ratio, Student-t "
                      "interval over rounds"}
    rows, skipped = [], ""
    if plan.backend == "gloo" and any(planning.builds_device_code(p) for p in plan.versions):
        skipped = f"timing skipped: {path_a.stem} or {path_b.stem} builds GPU code and this machine runs CPU/gloo"
    else:
        print(f"timing {path_a.stem} and {path_b.stem}: {len(plan.cases)} shape(s), {args.rounds} rounds x "
              f"{args.steps} steps, {plan.meta['placement']}, {plan.backend}")
        rows = diffing.time_versions(plan, args.rounds, args.steps, args.alpha)
        meta["alpha"] = args.alpha
    report = render(meta, diffs, rows, skipped)
    print(report)
    def write(folder: Path) -> None:
        (folder / "diff.md").write_text(report + "\n")
        (folder / "code.diff").write_text(code)
        if rows:
            import pandas as pd

            pd.DataFrame(rows).assign(**meta).to_csv(folder / "timing.csv", index=False)
            diffing.ratio_png(rows, meta, folder / "ratios.png")
        (folder / "timing.json").write_text(json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=1))

    cli.save_run(args.out, meta, write)
    return cli.verdict(not any(r["verdict"].startswith("not timed") for r in rows))


def render(meta: dict, diffs: list, rows: list, skipped: str) -> str:
    lines = [f"# {meta['b']} against {meta['a']}", "",
             f"{meta['device']}, {meta['placement']}, {meta['backend']}, {meta['date']}; run at commit "
             f"{meta['commit']}; {meta['a']} last changed at {meta['commit_a']}, {meta['b']} at {meta['commit_b']}.",
             "", "## Code", "",
             diffing.code_summary(diffs) or f"not computed within {diffing.CODE_DIFF_S:g} s", "", "## Time", ""]
    if rows:
        lines += [f"Timing: {meta['timing']}. The interval shown is 95% per shape; a verdict needs the interval at a "
                  f"family-wise error rate of {meta['alpha']:g} over the run's verdicts to exclude 1, and a change of "
                  f"at least {diffing.MIN_EFFECT:.0%}.", "",
                  result_rows.github_table(rows, floatfmt=".3f")]
    lines += [skipped] if skipped else []
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
